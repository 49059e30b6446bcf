"""On a real node (kubelet 1.35, containerd, runc: see test_real_node.py): a live sandbox
reached through `kubectl proxy --unix-socket` and the real API server's pods/proxy, on the
IP the node's CNI bridge gives the pod -- the API server shares the node's network namespace,
so it reaches the pod subnet as a control plane reaches its nodes' pods."""

from __future__ import annotations

import ipaddress

import pytest

from e2e_support import live_sandbox_on_a_real_api_server

pytestmark = [pytest.mark.e2e, pytest.mark.real_node, pytest.mark.xdist_group("real-node")]


def test_a_live_sandbox_on_a_real_node(real_node, tmp_path):
    from real_node import POD_SUBNET

    kubectl, cluster = real_node
    ip = live_sandbox_on_a_real_api_server(cluster, kubectl, tmp_path / "proxy.sock")
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(POD_SUBNET), ip
