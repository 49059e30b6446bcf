"""Streaming rollouts on a real node (tests/support/real_node.py): an episode's launcher stops it at
--episode-timeout and ends its pod 0, which the real Job controller never retries, and the real
Job controller's successPolicy ends a --need batch while the real kubelet stops its stragglers.

The held episodes (test_e2e_streaming's HELD_EPISODE) wait for a file that never comes: only their
--episode-timeout or the Job's successPolicy ends them. Each is PID 1 of its container and installs
no SIGTERM handler, so the kernel never delivers the kubelet's SIGTERM to it: it is killed at its
grace period's end (30 s), exit code 137. Run (as root) with
`flock /tmp/real-node.lock python -m pytest -n 0 -m real_node tests/real_node/test_real_node_streaming.py`.
"""

from __future__ import annotations

import pytest

from e2e_support import load, run_tool, start_tool, tool, wait_for
from test_e2e_rollouts import rewards_of
from test_e2e_streaming import held_run
from test_real_cluster import running_pods

pytestmark = [pytest.mark.e2e, pytest.mark.real_node, pytest.mark.xdist_group("real-node")]


def events_about(output, pod: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of each event about this pod, as events.json saved them."""
    return [
        (event.get("type"), event.get("reason"), event.get("message"))
        for event in load(output / "events.json")["items"]
        if (event.get("involvedObject") or event.get("regarding") or {}).get("name") == pod
    ]


def release(cluster, pod: dict) -> None:
    """Let a held episode end: the file its script waits for, in its emptyDir on the real node."""
    volumes = cluster.node_dir / "kubelet" / "pods" / pod["metadata"]["uid"] / "volumes"
    (volumes / "kubernetes.io~empty-dir" / "workspace" / "release").write_text("go")


def terminated(pod: dict) -> dict:
    (status,) = pod["status"]["containerStatuses"]
    return status["state"]["terminated"]


def test_an_episode_past_its_timeout_is_stopped_by_its_launcher_and_never_retried(
    real_node, tmp_path
):
    kubectl, cluster = real_node
    tasks = [{"id": "stuck", "x": 1, "hold": True}, {"id": "quick", "x": 2}]
    # With --retries: the launcher keeps the episode's own time, stops the hung one and ends its pod
    # 0, which the real Job controller neither retries nor counts as a failed index.
    flags, output = held_run(tmp_path, tasks, episode_timeout=6, retries=1)
    result = run_tool(cluster, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    stuck, quick = rewards_of(output)
    assert (stuck["task_id"], stuck["failure_class"], stuck["valid"], stuck["attempts"]) == (
        "stuck",
        "episode",
        True,
        1,
    )
    assert stuck["failure"] == (
        "ran out of time: still running 6 s after it started (--episode-timeout), stopped by its "
        "launcher"
    )
    assert stuck["earlier_attempts"] == [] and stuck["reward"] is None
    assert (quick["task_id"], quick["failure_class"], quick["valid"], quick["reward"]) == (
        "quick",
        None,
        True,
        2,
    )
    # One pod per episode: the stopped one was not retried. Its container ended 0 (its launcher
    # recorded the episode's time out), long before its pod's own deadline, a backstop.
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert len(pods) == 2
    assert pods[stuck["pod"]]["spec"]["activeDeadlineSeconds"] == 6 + 30
    assert pods[stuck["pod"]]["status"]["phase"] == "Succeeded"
    assert (
        terminated(pods[stuck["pod"]])["exitCode"],
        terminated(pods[stuck["pod"]])["reason"],
    ) == (
        0,
        "Completed",
    )
    assert terminated(pods[quick["pod"]])["exitCode"] == 0
    job = load(output / "job.json")["status"]
    # Two indexes are listed, not made a range (the Job controller's own spelling).
    assert (job.get("failedIndexes", ""), job["completedIndexes"]) == ("", "0,1")
    assert [c["type"] for c in job["conditions"]][-1] == "Complete"
    results = load(output / "results.json")
    assert (results["successful_episodes"], results["failed_episodes"]) == (1, 1)
    assert (results["lost_episodes"], results["accepted_partial"]) == (0, False)
    assert results["failures_by_class"]["episode"] == 1
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0


def test_need_is_met_by_the_real_job_controller_and_the_kubelet_stops_the_stragglers(
    real_node, tmp_path
):
    kubectl, cluster = real_node
    # Every episode held until all four run; then 1 and 2 are let go, and 0 and 3 never are.
    tasks = [{"id": n, "x": 1, "hold": True} for n in range(4)]
    flags, output = held_run(tmp_path, tasks, need=2)
    process = start_tool(cluster, kubectl, "run", **flags)
    try:
        pods = wait_for(
            lambda: len(running_pods(cluster, output)) == 4 and running_pods(cluster, output),
            180,
            "four running episodes",
        )
        for pod in pods:
            index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            if index in ("1", "2"):
                release(cluster, pod)
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "--need 2 met: 2 of 4 episodes succeeded, 2 cancelled, 0 failed" in stderr
    lines = rewards_of(output)
    assert [(line["index"], line["failure_class"], line["valid"]) for line in lines] == [
        (0, "cancelled", False),
        (1, None, True),
        (2, None, True),
        (3, "cancelled", False),
    ]
    assert all(
        line["failure"] == "cancelled: --need was met while it ran"
        for line in lines
        if line["failure_class"] == "cancelled"
    )
    job = load(output / "job.json")
    conditions = [(c["type"], c.get("reason")) for c in job["status"]["conditions"]]
    assert conditions == [("SuccessCriteriaMet", "SuccessPolicy"), ("Complete", "SuccessPolicy")]
    assert all(c["message"] == "Matched rules at index 0" for c in job["status"]["conditions"])
    assert (job["status"]["succeeded"], job["status"]["completedIndexes"]) == (2, "1,2")
    assert job["status"].get("failed", 0) == 0 and job["status"]["terminating"] == 0
    results = load(output / "results.json")
    assert (results["need"], results["cancelled_episodes"], results["failed_episodes"]) == (2, 2, 0)
    assert results["job_end"] == {"condition": "Complete", "reason": "SuccessPolicy"}
    assert 0 < results["first_reward_seconds"] <= results["kth_reward_seconds"]

    # The stragglers as the real kubelet leaves them: deleted by the Job controller, stopped
    # (SIGTERM ignored by PID 1, then SIGKILL: 137), Failed with no reason of the pod's own and no
    # DisruptionTarget; the Job Complete only once they had ended.
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert len(pods) == 4
    complete = next(c for c in job["status"]["conditions"] if c["type"] == "Complete")
    for line in lines:
        pod = pods[line["pod"]]
        status = pod["status"]
        if line["failure_class"] is None:
            assert status["phase"] == "Succeeded" and terminated(pod)["exitCode"] == 0
            assert not pod["metadata"].get("deletionTimestamp")
            continue
        assert pod["metadata"]["deletionTimestamp"]
        assert (status["phase"], status.get("reason")) == ("Failed", None)
        assert (terminated(pod)["exitCode"], terminated(pod)["reason"]) == (137, "Error")
        assert terminated(pod)["finishedAt"] <= complete["lastTransitionTime"]
        types = {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}
        assert "DisruptionTarget" not in types
        assert types["Ready"] == types["ContainersReady"] == ("False", "PodFailed")
        about = events_about(output, line["pod"])
        assert ("Normal", "Killing", "Stopping container episode") in about
        assert not any(reason == "DeadlineExceeded" for _, reason, _ in about)
    job_events = events_about(output, "rollout")
    for line in lines:
        if line["failure_class"] == "cancelled":
            assert ("Normal", "SuccessfulDelete", f"Deleted pod: {line['pod']}") in job_events
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0
