"""Rollouts on a real control plane: the real kube-apiserver validates the per-index Job and
its podFailurePolicy, and the real Job controller retries an episode the node evicted. (The
scenarios the emulator shares with it are in tests/e2e/: an episode's own failure ending a
partial batch with FailedIndexes in test_e2e_rollouts.py; --need and --episode-timeout in
test_e2e_streaming.py.)"""

from __future__ import annotations

import json

import pytest

from e2e_support import load, run_tool, start_tool, wait_for
from test_e2e_rollouts import TASK_EPISODE, rewards_of, tasks_run

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster]

# Reads its task; a task asking for a pause holds the episode long enough to be evicted.
PAUSING_EPISODE = TASK_EPISODE.replace(
    'emit("ready")\n', 'emit("ready")\ntime.sleep(task.get("pause", 0))\n'
)


def test_an_evicted_episode_is_retried_by_the_job_controller(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    flags, output = tasks_run(
        tmp_path,
        '{"id": "slow", "x": 2, "pause": 8}\n{"id": "quick", "x": 2}\n',
        retries=1,
        episode=PAUSING_EPISODE,
    )
    process = start_tool(cluster, kubectl, "run", **flags)

    def slow_pod_running():
        if not (output / "receipt.json").exists():
            return None
        namespace = load(output / "receipt.json")["namespace"]
        return next(
            (
                p
                for p in cluster.list("pods", namespace)
                if (p["metadata"].get("annotations") or {}).get(
                    "batch.kubernetes.io/job-completion-index"
                )
                == "0"
                and (p.get("status") or {}).get("phase") == "Running"
            ),
            None,
        )

    victim = wait_for(slow_pod_running, 120, "the slow episode running")
    cluster.agent.evict(victim["metadata"]["namespace"], victim["metadata"]["name"])
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    rows = rewards_of(output)
    assert [(r["task_id"], r["failure_class"], r["attempts"]) for r in rows] == [
        ("slow", None, 2),
        ("quick", None, 1),
    ]
    assert rows[0]["earlier_attempts"][0]["pod"] == victim["metadata"]["name"]
    assert rows[0]["earlier_attempts"][0]["failure_class"] == "infrastructure"
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert (
        pods[rows[0]["pod"]]["metadata"]["annotations"][
            "batch.kubernetes.io/job-index-failure-count"
        ]
        == "1"
    )
    results = load(output / "results.json")
    assert results["attempts"]["first_attempt"]["failed"]["infrastructure"] == 1
    assert results["attempts"]["final"]["succeeded"] == 2
    assert json.loads((output / "run.json").read_text())["retries"] == 1
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0
