"""Rollouts on a real control plane: the real kube-apiserver validates the per-index Job and
its podFailurePolicy, and the real Job controller retries an evicted episode (also under
--episode-timeout), never retries an episode's own failure nor counts it among its failed
indexes (the launcher ends its pod 0, a hang past --episode-timeout included), and its
successPolicy ends a --need batch."""

from __future__ import annotations

import json

import pytest

from e2e_support import load, run_tool, start_tool, tool, wait_for
from test_e2e_rollouts import TASK_EPISODE, rewards_of, tasks_run
from test_e2e_streaming import held_run

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster]

# Reads its task; a task asking for a pause holds the episode long enough to be evicted.
PAUSING_EPISODE = TASK_EPISODE.replace(
    'emit("ready")\n', 'emit("ready")\ntime.sleep(task.get("pause", 0))\n'
)


def test_tasks_an_episodes_own_failure_is_a_sample_the_job_completes(real_cluster, tmp_path):
    """Without --allow-failures: the agents that give up are samples, which end nothing; the real
    Job controller sees their pods succeed (the launcher records their exits) and completes."""
    kubectl, cluster = real_cluster
    args, output = tasks_run(
        tmp_path,
        '{"id": "ok", "x": 2}\n{"id": "bad", "x": 2, "fail": true}\n',
        "--group-size",
        "2",
        "--retries",
        "2",
    )
    result = tool(cluster, kubectl, *args)
    assert result.returncode == 0, result.stderr
    rows = rewards_of(output)
    assert [
        (r["task_id"], r["failure_class"], r["valid"], r["attempts"], r["reward"]) for r in rows
    ] == [
        ("ok", None, True, 1, 1.0),
        ("ok", None, True, 1, 1.0),
        ("bad", "episode", True, 1, None),
        ("bad", "episode", True, 1, None),
    ]
    job = load(output / "job.json")
    assert job["status"].get("failedIndexes", "") == ""
    ended = {c["type"] for c in job["status"]["conditions"] if c["status"] == "True"}
    assert "Complete" in ended and "Failed" not in ended
    assert len(load(output / "pods.json")["items"]) == 4  # never retried
    assert load(output / "results.json")["accepted_partial"] is False
    assert load(output / "results.json")["failures_by_class"] == {
        "infrastructure": 0,
        "episode": 2,
        "verifier": 0,
    }
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0


def test_an_evicted_episode_is_retried_by_the_job_controller(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    # With --episode-timeout (its launcher's clock, well past the pause): a loss is retried still.
    args, output = tasks_run(
        tmp_path,
        '{"id": "slow", "x": 2, "pause": 8}\n{"id": "quick", "x": 2}\n',
        "--retries",
        "1",
        "--episode-timeout",
        "60",
        episode=PAUSING_EPISODE,
    )
    process = start_tool(cluster, kubectl, *args)

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
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0


def test_need_is_met_by_the_real_job_controller_and_the_stragglers_cancelled(
    real_cluster, tmp_path
):
    kubectl, cluster = real_cluster
    # The held episodes wait for a file that never comes: only the successPolicy ends them.
    tasks = [{"id": n, "x": 1, "hold": n in (0, 3)} for n in range(4)]
    flags, output = held_run(tmp_path, tasks, need=2)
    result = run_tool(cluster, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    lines = rewards_of(output)
    assert [(line["index"], line["failure_class"], line["valid"]) for line in lines] == [
        (0, "cancelled", False),
        (1, None, True),
        (2, None, True),
        (3, "cancelled", False),
    ]
    job = load(output / "job.json")
    conditions = [(c["type"], c.get("reason")) for c in job["status"]["conditions"]]
    assert conditions == [("SuccessCriteriaMet", "SuccessPolicy"), ("Complete", "SuccessPolicy")]
    results = load(output / "results.json")
    assert (results["need"], results["cancelled_episodes"], results["failed_episodes"]) == (2, 2, 0)
    assert results["first_reward_seconds"] <= results["kth_reward_seconds"]
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0


def test_an_episode_past_its_timeout_is_a_sample_never_retried(real_cluster, tmp_path):
    """--episode-timeout with --retries: the launcher counts the episode's own time from its start
    (the pod's start-up is not the agent's), stops the hung one and ends its pod 0, which the real
    Job controller neither retries nor counts among its failed indexes."""
    kubectl, cluster = real_cluster
    tasks = [{"id": "stuck", "x": 1, "hold": True}, {"id": "quick", "x": 2}]
    flags, output = held_run(tmp_path, tasks, episode_timeout=4, retries=2)
    result = run_tool(cluster, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    stuck, quick = rewards_of(output)
    assert (stuck["failure_class"], stuck["valid"], stuck["attempts"]) == ("episode", True, 1), (
        stuck["failure"]
    )
    assert stuck["failure"].startswith("ran out of time: still running 4 s after it started")
    assert quick["failure_class"] is None
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert len(pods) == 2 and pods[stuck["pod"]]["status"]["phase"] == "Succeeded"
    assert pods[stuck["pod"]]["spec"]["activeDeadlineSeconds"] == 4 + 30
    job = load(output / "job.json")
    assert job["status"].get("failedIndexes", "") == "" and job["status"]["succeeded"] == 2
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0
