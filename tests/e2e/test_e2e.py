"""End to end: the real tool, real kubectl binaries, the emulator, and the real worker in a sandbox.

Each kubectl version (1.27, 1.33, 1.35) runs the guide's two batches — 10 in
parallel and 10 one at a time — and the results are held against the files,
the emulator's objects and the emulator's own record of when things happened.
"""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

import pytest

from e2e_support import (
    assert_cleanup_twice,
    assert_run_agrees_with_cluster,
    load,
    most_at_once,
    run_namespaces,
    run_tool,
    tool,
)
from kube_emulator import Emulator

import all_names as rl_batch_demo

pytestmark = pytest.mark.e2e

KUBECTL_VERSIONS = ("1.27", "1.33", "1.35")
# The guide's results.json fields.
GUIDE_RESULT_FIELDS = {
    "episodes",
    "successful_episodes",
    "reward_sum",
    "batch_to_all_ready_seconds",
    "batch_to_all_rewards_seconds",
    "pod_to_ready_p50_seconds",
    "pod_to_ready_p95_seconds",
    "pod_to_ready_max_seconds",
    "pods",
    "context",
    "namespace",
    "image",
    "runtime",
    "parallelism",
    "cache_state",
    "client_job_complete_seconds",
}
ROW_FIELDS = {
    "pod",
    "node",
    "image_id",
    "reward",
    "pod_to_ready_seconds",
    "batch_to_ready_seconds",
    "batch_to_reward_seconds",
}


@pytest.fixture(params=KUBECTL_VERSIONS)
def kubectl_and_cluster(request, tmp_path, require_e2e):
    kubectl = require_e2e(request.param)
    # A sandbox that takes seconds to start, as a VM-based runtime can: what
    # parallelism saves is then clearly larger than the machine's own noise.
    emulator = Emulator(tmp_path / "emulator", faults={"sandbox_delay": 3.0, "sandbox_jitter": 0.2})
    emulator.start()
    yield kubectl, emulator
    emulator.stop()


def check_run(emulator: Emulator, output: Path, count: int, parallelism: int) -> dict:
    """Every file a run saves, consistent with each other and with the cluster."""
    results = assert_run_agrees_with_cluster(emulator, output, count, parallelism)
    assert GUIDE_RESULT_FIELDS <= set(results)
    assert results["runtime"] == "cube" and results["image"] == "python:3.12-alpine"
    assert results["cache_state"] == "uncontrolled"

    receipt = load(output / "receipt.json")
    # The guide's keys with the guide's meaning (`uid` is the namespace's), ours beside them.
    assert set(receipt) >= {
        "context",
        "namespace",
        "run_id",
        "uid",
        "job_uid",
        "namespace_uid",
        "jobs",
    }
    assert receipt["uid"] == receipt["namespace_uid"]
    assert receipt["context"] == emulator.context
    assert receipt["namespace"] == results["namespace"] == f"agc-rl-{receipt['run_id']}"
    namespace = emulator.get("namespaces", None, receipt["namespace"])
    assert namespace["metadata"]["labels"]["agc-demo-run"] == receipt["run_id"]

    pods = load(output / "pods.json")
    assert pods["kind"] == "List"
    names = sorted(p["metadata"]["name"] for p in pods["items"])
    assert len(names) == count
    rows = results["pods"]
    assert sorted(r["pod"] for r in rows) == names
    for row in rows:
        assert set(row) == ROW_FIELDS
        assert row["image_id"].startswith("docker.io/library/python@sha256:")
        assert row["batch_to_ready_seconds"] <= row["batch_to_reward_seconds"]

    ready = [r["pod_to_ready_seconds"] for r in rows]
    assert results["pod_to_ready_p50_seconds"] == pytest.approx(
        rl_batch_demo.percentile(ready, 0.5), abs=0.002
    )
    assert results["pod_to_ready_p95_seconds"] == pytest.approx(
        rl_batch_demo.percentile(ready, 0.95), abs=0.002
    )
    assert results["pod_to_ready_max_seconds"] == max(ready)
    assert results["batch_to_all_ready_seconds"] == max(r["batch_to_ready_seconds"] for r in rows)
    assert results["batch_to_all_rewards_seconds"] == max(
        r["batch_to_reward_seconds"] for r in rows
    )

    # Held against the truth: the Job's creationTimestamp is the truth truncated to
    # whole seconds, so each batch figure is late by less than one second.
    truth = emulator.truth()
    job_truth = truth["jobs"][f"{receipt['namespace']}/rollout"]
    for row in rows:
        pod_truth = truth["pods"][f"{receipt['namespace']}/{row['pod']}"]
        assert pod_truth["node"] == row["node"]
        assert pod_truth["exit_code"] == 0
        ready_at = job_truth["created"] // 1 + row["batch_to_ready_seconds"]
        assert (
            pod_truth["container_started"] - 0.05
            <= ready_at
            <= pod_truth["container_finished"] + 0.05
        )
    # The client saw the Job complete after it did (the figure counts from the truncated
    # creationTimestamp; the truth's notes trail the stamp by up to 0.5 s); how long after is
    # the machine's load. It was the Complete condition that ended its wait, not its own limit.
    assert (
        results["client_job_complete_seconds"] >= job_truth["complete"] - job_truth["created"] - 0.5
    )
    assert results["client_wait"]["end"] == "Complete", results["client_wait"]

    header, *lines = (output / "events.txt").read_text().splitlines()
    assert header.split()[:4] == ["LAST", "SEEN", "(UTC)", "TYPE"]
    # Absolute times, as the events say them, never kubectl's ages ("5s"), which mean nothing later.
    created = {e["metadata"]["name"]: e for e in load(output / "events.json")["items"]}
    stamps = sorted(
        (e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"])[:19]
        + "Z"
        for e in created.values()
    )
    assert sorted(line.split()[0] for line in lines) == stamps and len(lines) == len(created) > 0
    with open(output / "episodes.csv", newline="") as handle:
        assert len(list(csv.DictReader(handle))) == count
    svg = ElementTree.parse(output / "timeline.svg").getroot()
    assert svg.tag.endswith("svg")
    return results


def pod_truths(emulator: Emulator, output: Path) -> list[dict]:
    """The emulator's record of each pod of the run in `output`."""
    namespace = load(output / "receipt.json")["namespace"]
    return [p for key, p in emulator.truth()["pods"].items() if key.startswith(namespace + "/")]


def test_parallel_then_sequential_then_cleanup(kubectl_and_cluster, tmp_path):
    kubectl, emulator = kubectl_and_cluster
    parallel_dir, sequential_dir = tmp_path / "rl-parallel-10", tmp_path / "rl-sequential-10"

    parallel = run_tool(emulator, kubectl, "run", count=10, output=parallel_dir, quiet=True)
    assert parallel.returncode == 0, parallel.stderr
    assert parallel.stdout.startswith("Test namespace: agc-rl-")
    printed = json.loads(parallel.stdout.split("\n", 1)[1])
    assert "pods" not in printed and printed["episodes"] == 10
    check_run(emulator, parallel_dir, 10, 10)

    sequential = run_tool(
        emulator, kubectl, "run", count=10, parallelism=1, output=sequential_dir, quiet=True
    )
    assert sequential.returncode == 0, sequential.stderr
    check_run(emulator, sequential_dir, 10, 1)
    # Ten at once really ran side by side, one at a time never overlapped (the emulator's
    # truth). How much sooner the parallel batch ended is the machine's load: not held.
    assert most_at_once(pod_truths(emulator, parallel_dir)) >= 5
    assert most_at_once(pod_truths(emulator, sequential_dir)) == 1

    compared = tool(emulator, kubectl, "compare", str(parallel_dir), str(sequential_dir))
    assert compared.returncode == 0 and "batch_to_all_rewards_seconds" in compared.stdout

    for output in (parallel_dir, sequential_dir):
        assert_cleanup_twice(emulator, kubectl, output)
    assert run_namespaces(emulator) == []

    # Every request-and-answer call carried the 30 s request timeout; a watch, and the list
    # its kubectl makes first, are bounded by the run's deadline instead. None met a server error.
    def bounds(requests: list[dict]) -> Counter:
        return Counter((r["method"], r["path"], r["query"].get("timeout")) for r in requests)

    calls = [r for r in emulator.requests if not r["watch"]]
    watches = [r for r in emulator.requests if r["watch"] and r["query"].get("timeout") != "30s"]
    longer = [r for r in calls if r["query"].get("timeout") != "30s"]
    assert watches and len(longer) < len(calls)
    # Each call without the 30 s bound is the list before a watch: same path, same bound.
    assert bounds(longer) == bounds(watches), sorted(bounds(longer).items())
    assert all(
        r["method"] == "GET"
        and r["path"].endswith(("/pods", "/jobs", "/events"))
        and r["query"].get("timeout", "").endswith("s")
        for r in watches
    ), bounds(watches)
    assert all(r["status"] < 500 for r in emulator.requests)
