"""On a real control plane (kube-apiserver 1.35 and etcd, see test_real_cluster.py):
the pods verified after a Job's end are listed in pages from a revision not
older than the one at which the end was seen, and a pod still running when the
Job's status says Complete fails the run by name."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from e2e_support import (
    SLOW_SECOND_EPISODE,
    assert_refused_a_running_pod,
    load,
    run_tool,
    start_tool,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster]

WAIT = 180


def test_pods_and_events_are_as_of_the_jobs_end(real_cluster, tmp_path):
    """The pods verified are listed in pages not older than the Job's end, or are the pod
    watch's view once it saw each pod's last change (then each is the pod as it is now); the
    events were followed while waiting, or listed after the end, and are all there."""
    kubectl, cluster = real_cluster
    output = tmp_path / "rl-paged"
    result = run_tool(cluster, kubectl, "run", count=5, chunk_size=2, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr
    client = load(output / "client.json")
    read = client["pods_read"]
    pods = load(output / "pods.json")["items"]
    assert len(pods) == 5 and all(pod["status"]["phase"] == "Succeeded" for pod in pods)
    if read["source"] == "list":
        # 5 pods in pages of 2; etcd's revisions are numbers, so "not older" can be checked.
        assert read["pages"] == 3 and read["continue_expiries"] == 0
        assert int(read["resource_version"]) >= int(read["not_older_than"])
    else:
        assert read["source"] == "final watch"
        namespace = load(output / "receipt.json")["namespace"]
        now = {
            pod["metadata"]["name"]: pod["metadata"]["resourceVersion"]
            for pod in cluster.list("pods", namespace)
        }
        assert {pod["metadata"]["name"]: pod["metadata"]["resourceVersion"] for pod in pods} == now
    # A real API server counts a list's remaining items: the events need no list after the end.
    assert client["events_read"] == "watch"
    events = load(output / "events.json")["items"]
    for reason in ("Scheduled", "Started"):
        assert len([e for e in events if e["reason"] == reason]) == 5, reason
    assert load(output / "results.json")["reward_sum"] == 5


def test_a_pod_running_when_the_job_says_complete_fails_the_run_by_name(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    script = tmp_path / "slow_second.py"
    script.write_text(SLOW_SECOND_EPISODE)
    output = tmp_path / "rl-unfinished"
    process = start_tool(
        cluster, kubectl, "run", count=2, episode_script=script, output=output, quiet=True
    )
    namespace = wait_for(
        lambda: (
            (output / "receipt.json").is_file()
            and load(output / "receipt.json").get("job_uid")
            and load(output / "receipt.json")["namespace"]
        ),
        WAIT,
        "the Job's UID in the receipt",
    )

    def phases() -> dict:
        return {
            pod["metadata"]["name"]: pod["status"].get("phase")
            for pod in cluster.list("pods", namespace)
        }

    wait_for(
        lambda: sorted(phases().values()) == ["Running", "Succeeded"],
        WAIT,
        "one pod succeeded and the other still running",
    )
    running = next(name for name, phase in phases().items() if phase == "Running")
    # Someone else writes the Job's status (a controller of its own, by hand): Complete
    # while one pod is still running. The Job controller may write the Job between our read
    # and our replace (409 Conflict on the resourceVersion); read it again and retry, as any
    # client of optimistic concurrency does.
    for _ in range(10):
        job = cluster.get("jobs", namespace, "rollout")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastProbeTime": now,
                "lastTransitionTime": now,
            }
            for kind in ("SuccessCriteriaMet", "Complete")
        ]
        status = dict(
            job["status"],
            conditions=conditions,
            succeeded=2,
            active=0,
            completionTime=now,
            completedIndexes="0,1",
            uncountedTerminatedPods={},
        )
        status.pop("ready", None)
        patched = subprocess.run(
            [kubectl, "replace", "--subresource=status", "-f", "-"],
            input=json.dumps(dict(job, status=status)),
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        if patched.returncode == 0 or "(Conflict)" not in patched.stderr:
            break
    if patched.returncode != 0:
        process.kill()
        process.communicate()
        pytest.fail(f"the API server refused the Complete status: {patched.stderr}")
    assert_refused_a_running_pod(process, output, running)
    run_tool(cluster, kubectl, "cleanup", output=output)
