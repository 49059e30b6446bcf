"""A pool on a real control plane (kube-apiserver 1.35 and its Job controller) with the node
agent's pod network: the sandboxes' requests through the real API server's pods/proxy."""

from __future__ import annotations

import json
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


def test_an_api_server_restarted_under_a_pool(real_cluster, tmp_path, monkeypatch):
    """The real API server killed while a command runs and brought back: the command in flight and
    one sent while it is down (no retry asked) are lost (SandboxLost, infrastructure); a file's
    write and read, and a command sent with retry=True, are sent again until it is back."""
    import threading
    import time

    import rl_batch_demo

    kubectl, cluster = real_cluster
    if os.geteuid() != 0:
        skip_or_fail("root (the node agent's pod network is a network namespace of its own)")
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)
    output = tmp_path / "pool"
    with rl_batch_demo.open_pool(output=str(output), size=3, episodes=3, kubectl=kubectl) as pool:
        in_flight, down, kept = (pool.claim(timeout=180) for _ in range(3))
        kept.write_file("before.txt", b"1")
        outcome: list = []

        def run_in_flight() -> None:
            try:
                outcome.append(in_flight.run(["sleep", "6"], timeout=60))
            except rl_batch_demo.SandboxLost as error:
                outcome.append(error)

        running = threading.Thread(target=run_in_flight)
        running.start()
        time.sleep(1.5)
        cluster.control_plane.kill_apiserver()
        try:
            with pytest.raises(rl_batch_demo.SandboxLost) as lost:
                down.run(["true"])
            assert lost.value.failure_class == "infrastructure"
            running.join(timeout=60)
            restart = threading.Timer(1.0, cluster.control_plane.start_apiserver)
            restart.start()
            # Sent while the API server is down, answered once it is back.
            kept.write_file("after.txt", b"\x00\xff binary")
            restart.join()
        finally:
            if "kube-apiserver" not in cluster.control_plane.processes:
                cluster.control_plane.start_apiserver()
        assert isinstance(outcome[0], rl_batch_demo.SandboxLost), outcome
        assert kept.read_file("after.txt") == b"\x00\xff binary"
        assert kept.run(["true"], retry=True).exit_code == 0
        for sandbox in (in_flight, down, kept):
            sandbox.finish(reward=1.0)
    rewards = {
        line["sandbox"]: line
        for line in map(json.loads, (output / "rewards.jsonl").read_text().splitlines())
    }
    assert [rewards[s.pod]["failure_class"] for s in (in_flight, down, kept)] == [
        "infrastructure",
        "infrastructure",
        None,
    ]
    assert rewards[kept.pod]["valid"] and not rewards[down.pod]["valid"]
