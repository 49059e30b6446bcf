"""End to end: a pod watch that runs late or stalls, and slow lists, never decide
an episode's fate. The run still passes with every record saved, because the
pods it verifies are listed from a revision not older than the Job's end (in
pages); a pod that is genuinely unfinished when the Job says Complete still
fails the run, by name. Real kubectl against the emulator, real worker; the scenarios marked
on_tiers run on the real control plane too (kube-apiserver 1.35 and etcd)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from e2e_support import (
    SLOW_SECOND_EPISODE,
    assert_refused_a_running_pod,
    load,
    run_tool,
    start_tool,
    wait_for,
)
from conftest import on_tiers
from kube_emulator import Emulator

pytestmark = pytest.mark.e2e

# Long enough for a loaded machine; never a measure of speed.
WAIT = 120
# The longest a run of the tool can go on: the Job's default activeDeadlineSeconds, then the
# client's 30 s after it.
TOOL_DEADLINE = 240 + 30


def pod_lists(emulator: Emulator, namespace: str) -> list[dict]:
    """The list requests (not watches) for the namespace's pods, in order."""
    return [
        r
        for r in emulator.requests
        if r["path"] == f"/api/v1/namespaces/{namespace}/pods"
        and not r["watch"]
        and r["method"] == "GET"
    ]


def assert_every_record_saved(output: Path, count: int) -> dict:
    for name in (
        "receipt.json",
        "job-submitted.json",
        "job.json",
        "pods.json",
        "events.txt",
        "events.json",
        "client.json",
        "results.json",
    ):
        assert (output / name).is_file(), (
            f"{name} missing from {sorted(p.name for p in output.iterdir())}"
        )
    pods = load(output / "pods.json")["items"]
    assert len(pods) == count
    assert all(pod["status"]["phase"] == "Succeeded" for pod in pods)
    for pod in pods:
        log = (output / f"{pod['metadata']['name']}.log").read_text()
        assert '"event": "reward"' in log
    results = load(output / "results.json")
    assert results["episodes"] == results["successful_episodes"] == count
    return load(output / "client.json")


def assert_listed_from_the_jobs_end(emulator: Emulator, namespace: str, client: dict) -> None:
    """The verified pods came from a list not older than the Job's end as the client saw it."""
    read = client["pods_read"]
    assert read["source"] == "list"
    job_rv = read["not_older_than"]
    assert job_rv and int(read["resource_version"]) >= int(job_rv)
    firsts = [
        r
        for r in pod_lists(emulator, namespace)
        if r["query"].get("resourceVersionMatch") == "NotOlderThan"
    ]
    assert firsts and all(r["query"]["resourceVersion"] == job_rv for r in firsts)
    assert firsts[-1]["status"] == 200


def assert_read_as_of_the_jobs_end(emulator: Emulator, output: Path, client: dict) -> None:
    """The verified pods were listed not older than the Job's end, or are the pod watch's
    view once it had seen each pod's last change: then each is the pod as it is now."""
    namespace = load(output / "receipt.json")["namespace"]
    if client["pods_read"]["source"] == "list":
        assert_listed_from_the_jobs_end(emulator, namespace, client)
        return
    assert client["pods_read"]["source"] == "final watch"
    now = {
        pod["metadata"]["name"]: pod["metadata"]["resourceVersion"]
        for pod in emulator.list("pods", namespace)
    }
    saved = {
        pod["metadata"]["name"]: pod["metadata"]["resourceVersion"]
        for pod in load(output / "pods.json")["items"]
    }
    assert saved == now


def test_a_late_pod_watch_and_slow_lists_still_pass_with_every_record_saved(make_cluster, tmp_path):
    kubectl, make = make_cluster
    # The pod watch runs 4 s behind the Job watch; every pod list takes 2 s.
    emulator = make(watch_delay={"pods": 4.0}, list_latency={"pods": 2.0})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=4, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "Traceback" not in result.stderr
    client = assert_every_record_saved(output, 4)
    assert_read_as_of_the_jobs_end(emulator, output, client)


def test_a_stalled_pod_watch_still_passes_once_the_api_catches_up(make_cluster, tmp_path):
    kubectl, make = make_cluster
    # The pods' watch cache takes in nothing from the start: the pod watch delivers
    # nothing and a list not older than the Job's end cannot be answered yet. No sandbox starts
    # before the tool's pod watch is there: kubectl lists (from etcd) before it watches, and a
    # watch that starts after the episodes ended (a loaded machine, three quick episodes) would
    # have the final pods from that list.
    emulator = make(
        watch_stall={"pods": 3600}, list_latency={"pods": 1.0}, sandbox_after_watch=True
    )
    output = tmp_path / "out"
    process = start_tool(emulator, kubectl, "run", count=3, output=output, quiet=True)

    def answered_too_large() -> bool:
        return any(
            r["status"] == 504
            and r["query"].get("resourceVersionMatch") == "NotOlderThan"
            and r["path"].endswith("/pods")
            for r in emulator.requests
        )

    # The state waited for, not a speed: the Job's end is three real episodes away, which on a
    # loaded machine can take longer than WAIT (it did at CI's load), so the wait is bounded by
    # the tool's own deadline (the Job's 240 s and the client's 30 s after it) and stops early
    # if the run ends, whose stderr then says why.
    wait_for(
        lambda: answered_too_large() or process.poll() is not None,
        TOOL_DEADLINE + WAIT,
        "a pod list answered 'Too large resource version', or the run's end",
    )
    if process.poll() is not None:
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"the run ended (exit {process.returncode}) while the pod watch was stalled: "
            f"{stderr[-2000:]}"
        )
    emulator.set_faults(watch_stall=None)  # the cache catches up at once
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "Warning" not in stderr and "Traceback" not in stderr
    client = assert_every_record_saved(output, 3)
    assert_listed_from_the_jobs_end(emulator, load(output / "receipt.json")["namespace"], client)
    assert load(output / "results.json")["reward_sum"] == 3
    assert load(output / "results.json")["client"]["api_retries"] >= 1  # the page asked again


@pytest.mark.parametrize("continue_ttl", [None, 0], ids=["tokens-live", "tokens-expire"])
def test_the_pods_are_listed_in_pages(make_cluster, tmp_path, continue_ttl):
    kubectl, make = make_cluster
    # A pod watch far behind: its view is not final when the Job ends, so the pods are listed.
    emulator = make(continue_ttl=continue_ttl, watch_delay={"pods": 6.0})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=7, chunk_size=3, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    client = assert_every_record_saved(output, 7)
    namespace = load(output / "receipt.json")["namespace"]
    lists = [
        r
        for r in pod_lists(emulator, namespace)
        if r["query"].get("labelSelector") == "job-name=rollout" and r["query"].get("limit") == "3"
    ]
    # 7 pods in pages of 3: the first page from the Job's end (asked again while the
    # watch cache catches up with it), then two continued pages.
    firsts = [r for r in lists if not r["query"].get("continue")]
    continued = lists[len(firsts) :]
    assert firsts and all(r["query"]["resourceVersionMatch"] == "NotOlderThan" for r in firsts)
    assert firsts[-1]["status"] == 200 and len(continued) >= 2
    assert all(
        r["query"].get("continue") and "resourceVersion" not in r["query"] for r in continued
    )
    statuses = [r["status"] for r in continued]
    if continue_ttl is None:
        assert statuses == [200, 200] and client["pods_read"]["continue_expiries"] == 0
        assert client["pods_read"]["pages"] == 3
    else:
        # Each continue token has expired: the API's token to go on is used instead.
        assert 410 in statuses and client["pods_read"]["continue_expiries"] >= 1
    # The events were followed while waiting, not read in pages after the end.
    events = [r for r in emulator.requests if r["path"] == f"/api/v1/namespaces/{namespace}/events"]
    assert any(r["watch"] for r in events) and not any(
        r["query"].get("limit") == "3" for r in events
    )
    scheduled = [e for e in load(output / "events.json")["items"] if e["reason"] == "Scheduled"]
    assert len(scheduled) == 7


def complete_while_a_pod_runs(cluster, kubectl: str, namespace: str) -> None:
    """Someone else writes the Job's status (a controller of its own, by hand): Complete while one
    pod still runs. The Job controller may write the Job between our read and our replace (409
    Conflict on the resourceVersion): it is read again and replaced again, as any client of
    optimistic concurrency does."""
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
        replaced = subprocess.run(
            [kubectl, "replace", "--subresource=status", "-f", "-"],
            input=json.dumps(dict(job, status=status)),
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        if replaced.returncode == 0 or "(Conflict)" not in replaced.stderr:
            break
    assert replaced.returncode == 0, (
        f"the API server refused the Complete status: {replaced.stderr}"
    )


@on_tiers("emulator", "real_cluster")
def test_a_genuinely_unfinished_pod_still_fails_the_run_by_name(tier, tier_name, tmp_path):
    kubectl, cluster = tier
    script = tmp_path / "slow_second.py"
    script.write_text(SLOW_SECOND_EPISODE)
    output = tmp_path / "out"
    process = start_tool(
        cluster, kubectl, "run", count=2, episode_script=script, output=output, quiet=True
    )
    try:
        namespace = wait_for(
            lambda: (
                (output / "receipt.json").is_file()
                and load(output / "receipt.json").get("job_uid")
                and load(output / "receipt.json")["namespace"]
            ),
            WAIT,
            "the Job's UID in the receipt",
        )

        def phases() -> dict[str, str]:
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
        if tier_name == "emulator":
            # The emulator's Job controller stands still: only the test writes the Job meanwhile.
            cluster.set_faults(job_controller_stalled=True)
        complete_while_a_pod_runs(cluster, kubectl, namespace)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    assert_refused_a_running_pod(process, output, running)
    for name in ("job.json", "events.txt", f"{running}.log"):
        assert (output / name).is_file(), name
    if tier_name == "emulator":
        # It was read again on its own before the run concluded anything from it (the emulator
        # records every request).
        assert any(
            r["path"] == f"/api/v1/namespaces/{namespace}/pods/{quote(running)}"
            and r["method"] == "GET"
            for r in cluster.requests
        )
    run_tool(cluster, kubectl, "cleanup", output=output)


@pytest.mark.slow
def test_a_pod_list_slower_than_the_request_timeout_falls_back_to_pods_read_one_by_one(
    make_cluster, tmp_path
):
    """A small batch whose pod watch runs behind and no pod list can answer within
    the request timeout. The pods the watch saw are each read again on their own."""
    kubectl, make = make_cluster
    emulator = make(watch_delay={"pods": 3.0}, list_latency={"pods": 35.0})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=8, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "Warning: could not list the pods" in result.stderr
    assert "pods.json holds what the pod watch saw" in result.stderr
    client = assert_every_record_saved(output, 8)
    assert client["pods_read"]["source"] == "watch"
    namespace = load(output / "receipt.json")["namespace"]
    statuses = [
        r["status"]
        for r in pod_lists(emulator, namespace)
        if r["query"].get("resourceVersionMatch") == "NotOlderThan"
    ]
    # The client gave up on each as the server's own timeout came: none was ever answered in time.
    assert statuses and 200 not in statuses


def test_without_the_proxy_the_pages_are_read_with_kubectl_get_raw(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(watch_delay={"pods": 6.0})
    # A kubectl that may not run `kubectl proxy` (as where policy forbids it).
    wrapper = tmp_path / "kubectl-no-proxy"
    wrapper.write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = proxy ] && exit 1; done\nexec {kubectl} "$@"\n'
    )
    wrapper.chmod(0o755)
    output = tmp_path / "out"
    result = run_tool(
        emulator, str(wrapper), "run", count=5, chunk_size=2, output=output, quiet=True
    )
    assert result.returncode == 0, result.stderr
    assert "Warning: kubectl proxy did not start" in result.stderr
    client = assert_every_record_saved(output, 5)
    namespace = load(output / "receipt.json")["namespace"]
    assert_listed_from_the_jobs_end(emulator, namespace, client)
    lists = [r for r in pod_lists(emulator, namespace) if r["query"].get("limit") == "2"]
    # The first page asked again while the watch cache catches up with the Job's end, then two more.
    assert len([r for r in lists if r["query"].get("continue")]) == 2
    assert client["pods_read"]["pages"] == 3
