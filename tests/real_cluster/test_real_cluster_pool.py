"""A pool on a real control plane (kube-apiserver 1.35 and its Job controller) with the node
agent's pod network: the sandboxes' requests through the real API server's pods/proxy."""

from __future__ import annotations

import os

import pytest
from conftest import skip_or_fail

from e2e_support import assert_a_pool_serves_its_episodes

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]


def test_a_pool_on_the_real_api_server(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    if os.geteuid() != 0:
        skip_or_fail("root (the node agent's pod network is a network namespace of its own)")
    results = assert_a_pool_serves_its_episodes(cluster, kubectl, tmp_path / "pool")
    assert results["pool"]["round_trip_seconds"]["p50"] > 0
