"""On a real control plane (kube-apiserver 1.35 and etcd, see test_real_cluster.py):
the pods verified after a Job's end are listed in pages from a revision not
older than the one at which the end was seen. (A pod still running when the Job's
status says Complete fails the run by name: tests/e2e/test_e2e_lagging_watch.py, on
both tiers.)"""

from __future__ import annotations


import pytest

from e2e_support import (
    load,
    run_tool,
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
