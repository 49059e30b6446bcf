"""A pool on a real node (kubelet, containerd, runc): the sandbox server in real containers,
reached through the real API server's pods/proxy over the node's pod network."""

from __future__ import annotations

import pytest

from e2e_support import assert_a_pool_serves_its_episodes

pytestmark = [pytest.mark.e2e, pytest.mark.real_node, pytest.mark.xdist_group("real-node")]


def test_a_pool_on_a_real_node(real_node, tmp_path):
    kubectl, cluster = real_node
    results = assert_a_pool_serves_its_episodes(cluster, kubectl, tmp_path / "pool")
    assert results["pool"]["round_trip_seconds"]["p50"] > 0


def test_a_hardened_pool_on_a_real_node(real_node, tmp_path):
    """--harden: Pod Security 'restricted' enforced by the real API server on the sandboxes' pods, a
    read-only root filesystem under containerd, and the NetworkPolicy (no egress; in, the sandbox
    port alone) leave the pod proxy working. This node's bridge CNI enforces no NetworkPolicy:
    the policy's effect on the proxy is argued in docs/sandboxes.md, not shown here."""
    import json

    from e2e_support import load, tool

    kubectl, cluster = real_node
    output = tmp_path / "hardened"
    result = tool(
        cluster, kubectl, "pool", "--output", str(output), "--size", "1", "--episodes", "2",
        "--harden", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert load(output / "results.json")["successful_episodes"] == 2
    namespace = load(output / "receipt.json")["namespace"]
    labels = cluster.get("namespaces", None, namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    policy = cluster.get("networkpolicies", namespace, "deny-all-but-sandbox-port")
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8377}]}]
    pods = load(output / "pods.json")["items"]
    security = pods[0]["spec"]["containers"][0]["securityContext"]
    assert security["readOnlyRootFilesystem"] is True, json.dumps(security)
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0
