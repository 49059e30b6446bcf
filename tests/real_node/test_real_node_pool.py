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
