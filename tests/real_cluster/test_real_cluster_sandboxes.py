"""On a real control plane (kube-apiserver 1.35, see test_real_cluster.py): a live sandbox
reached as the tool will reach it, through `kubectl proxy --unix-socket` and the real API
server's pods/proxy, on the address the node agent's pod network gives a pod that declares
ports (tests/support/pod_network.py, as root). The API server's answers when it cannot relay
are held to the same expectations as the emulator's (tests/support/e2e_support.py)."""

from __future__ import annotations

import ipaddress
import os

import pytest
from conftest import skip_or_fail

from e2e_support import live_sandbox_on_a_real_api_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]


def test_a_live_sandbox_through_the_real_api_server(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    if os.geteuid() != 0:
        skip_or_fail("root (the node agent's pod network is a network namespace of its own)")
    ip = live_sandbox_on_a_real_api_server(cluster, kubectl, tmp_path / "proxy.sock")
    network = cluster.agent.pod_network
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(network.subnet), (ip, network.subnet)
    # The pod's end gave its address back: it has left the pod network's namespace.
    wait_for(lambda: ip not in network.given, 30, "the address to be released")


def test_the_pod_network_takes_a_block_more_once_its_first_is_full():
    """More than 253 serving pods on the node agents (a pool of 256): a second 10.246.B.0/24, on
    a veth pair of its own, routed from the host; its addresses given back on release."""
    import subprocess

    from pod_network import HOSTS, PodNetwork

    if os.geteuid() != 0:
        skip_or_fail("root (the node agent's pod network is a network namespace of its own)")
    network = PodNetwork()
    try:
        taken = [network.take() for _ in range(len(HOSTS) + 3)]
        blocks = sorted({int(address.split(".")[2]) for address in taken})
        assert len(blocks) == 2 and len(set(taken)) == len(taken), blocks
        last = taken[-1]
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        assert f"10.246.{blocks[1]}.0/24" in routes
        shown = subprocess.run(
            network.enter(["ip", "-4", "addr"]), capture_output=True, text=True, check=True
        ).stdout
        assert f"{last}/32" in shown
        network.release(last)
        assert last not in network.given
    finally:
        network.stop()
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    assert f"10.246.{blocks[1]}.0/24" not in routes
