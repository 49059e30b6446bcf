"""End to end, the unhappy paths: a Job that fails, episodes that do not verify, and the reliability cases, provoked
through the emulator's fault knobs. Each run must fail with its message, keep every
record, write no results.json, and leave cleanup possible."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e_support import (
    assert_cleanup_works,
    assert_evidence_saved,
    interrupt,
    load,
    pods_of,
    receipt_of,
    run_namespaces,
    run_tool,
    start_tool,
    wait_for,
)
from conftest import on_tiers
from kube_emulator import Emulator

pytestmark = pytest.mark.e2e


def failed_run(emulator: Emulator, kubectl: str, output: Path, *, message: str, **flags: Any):
    """A run of 4 episodes (more `flags` added) that fails with `message`, and says how to clean up."""
    result = run_tool(emulator, kubectl, "run", count=4, output=output, quiet=True, **flags)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert f"cleanup --output {output}" in result.stderr
    return result


def test_pod_exiting_nonzero_fails_the_job(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(fail_pods=[1])
    output = tmp_path / "out"
    result = failed_run(
        emulator,
        kubectl,
        output,
        message="Job failed or timed out; inspect saved status/events/logs, then cleanup",
    )
    assert "BackoffLimitExceeded" in result.stderr
    assert "container exited 3" in result.stderr
    assert_evidence_saved(output, pods_of(output))
    assert_cleanup_works(emulator, kubectl, output)


def test_image_pull_backoff_hits_the_deadline(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(image_pull_backoff=True)
    output = tmp_path / "out"
    result = failed_run(emulator, kubectl, output, timeout=3, message="Job failed or timed out")
    assert "DeadlineExceeded" in result.stderr
    # It says which evidence exists, not only where to look.
    assert re.search(
        r"saved: job\.json, pods\.json \(\d+ pods\), events\.txt \(\d+ events\), "
        r"\d+ of \d+ pod logs with content",
        result.stderr,
    ), result.stderr
    assert_evidence_saved(output, pods_of(output))
    assert (
        "ImagePullBackOff" in (output / "events.txt").read_text()
        or "ErrImagePull" in (output / "events.txt").read_text()
    )
    assert_cleanup_works(emulator, kubectl, output)


def test_missing_runtime_class_fails_before_any_namespace(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(missing_runtimeclass=True)
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", output=output, quiet=True)
    assert result.returncode == 1
    assert "RuntimeClass 'cube' not found" in result.stderr
    assert run_namespaces(emulator) == []
    assert not any(r["method"] == "POST" for r in emulator.requests)
    # Nothing was created, so nothing needs tracing: the directory is gone and its name free.
    assert "was removed again, so the same --output can be reused" in result.stderr
    assert not output.exists()
    emulator.set_faults(missing_runtimeclass=None)
    again = run_tool(emulator, kubectl, "run", count=1, output=output, quiet=True, cleanup=True)
    assert again.returncode == 0, again.stderr


def test_namespace_recreated_under_the_same_name_is_not_deleted(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    assert run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True).returncode == 0
    receipt = load(output / "receipt.json")
    namespace = receipt["namespace"]
    assert run_tool(emulator, kubectl, "cleanup", output=output).returncode == 0
    # Someone else creates a namespace with the same name, even the same label.
    impostor = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {"agc-demo-run": receipt["run_id"]}},
    }
    import subprocess

    subprocess.run(
        [kubectl, "create", "-f", "-"],
        input=json.dumps(impostor),
        env=emulator.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    refused = run_tool(emulator, kubectl, "cleanup", output=output)
    assert refused.returncode == 1
    assert f"refusing to delete namespace {namespace}" in refused.stderr
    assert emulator.get("namespaces", None, namespace) is not None
    assert not any(
        r["method"] == "DELETE" and r["path"].endswith(namespace) for r in emulator.requests[-5:]
    )


@pytest.mark.parametrize(
    "faults, message",
    [
        ({"restart_container": [0]}, "container restarted 1 time(s)"),
        ({"replace_pod": [0]}, "expected 4 pods for 4 episodes, found 5"),
        ({"api_clock_skew": 5.0}, "times out of order"),
        ({"log_tamper": {"0": "duplicate_ready"}}, "expected exactly one ready event, found 2"),
        ({"log_tamper": {"0": "drop_reward"}}, "expected exactly one reward event, found 0"),
        ({"log_tamper": {"0": "wrong_id"}}, "not the pod name"),
        ({"unreadable_logs": [0]}, "expected exactly one ready event, found 0"),
    ],
)
def test_verification_failures_name_the_pod(make_cluster, tmp_path, faults, message):
    kubectl, make = make_cluster
    emulator = make(**faults)
    output = tmp_path / "out"
    result = failed_run(emulator, kubectl, output, message=message)
    assert "pod rollout-" in result.stderr or "pods for" in result.stderr
    assert_evidence_saved(output, pods_of(output))
    assert_cleanup_works(emulator, kubectl, output)


def test_a_kubelet_notice_that_the_log_is_gone_is_not_saved_as_the_log(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(log_gone=[0])
    output = tmp_path / "out"
    result = failed_run(
        emulator, kubectl, output, message="expected exactly one ready event, found 0"
    )
    assert (
        "the kubelet no longer has the log (unable to retrieve container logs for " in result.stderr
    )
    logs = {p.name: p.read_text() for p in output.glob("rollout-*.log")}
    assert len(logs) == 4 and sorted(map(len, logs.values()))[0] == 0, logs
    assert not any("unable to retrieve" in text for text in logs.values())
    assert_cleanup_works(emulator, kubectl, output)


def test_junk_lines_in_logs_are_kept_and_ignored(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(log_tamper={"0": "junk_lines"})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    logs = [p.read_text() for p in output.glob("rollout-*.log")]
    assert any(not line.startswith("{") for log in logs for line in log.splitlines())
    assert load(output / "results.json")["reward_sum"] == 2


def test_transient_api_errors_are_retried(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(api_errors={"count": 4, "match": "/pods", "status": 503})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=3, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    client = load(output / "results.json")["client"]
    assert (
        client["api_retries"] + load(output / "results.json")["client_wait"]["watch_restarts"] >= 1
    )


def test_api_server_restart_while_waiting(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(
        sandbox_delay=1.5, sandbox_after_watch=True
    )  # still running when the API restarts
    output = tmp_path / "out"
    process = start_tool(emulator, kubectl, "run", count=3, output=output, quiet=True)
    # Restarted only once both watches are open, so the restart really breaks them.
    wait_for(
        lambda: (
            (output / "job-submitted.json").exists()
            and emulator.list("pods")
            and {"/pods", "/jobs"} <= {r["path"][-5:] for r in emulator.requests if r["watch"]}
        ),
        120,
        "the pods and the tool's two watches",
    )
    emulator.restart_api(down_seconds=1.0)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 3
    assert results["client_wait"]["watch_restarts"] >= 1


def test_a_job_watch_that_keeps_breaking_gives_way_to_polling(make_cluster, tmp_path):
    kubectl, make = make_cluster
    # Each list and watch of the Job by its name's field selector fails; reading the Job by name does not.
    emulator = make(api_errors={"count": 10000, "match": "/jobs?fieldSelector=", "status": 503})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 2
    wait = results["client_wait"]
    assert wait["wait_mode"] == "poll" and wait["watch_restarts"] == 3, wait
    assert wait["end"] == "Complete" and wait["client_job_complete_seconds"] is not None


def interrupted_while_waiting(emulator: Emulator, kubectl: str, output: Path, *extra: str):
    """A run of two slow episodes, interrupted once it waits: the Job's UID in its receipt and its
    watch on the pods open (a fixed pause could end before either on a loaded machine)."""
    process = start_tool(
        emulator, kubectl, "run", "--count", "2", "--output", str(output), "--quiet", *extra
    )
    wait_for(lambda: emulator.list("pods"), 120, "pods to exist")  # a bound, not a measurement
    name = wait_for(
        lambda: receipt_of(output).get("job_uid") and receipt_of(output)["namespace"],
        120,
        "the Job's UID in the receipt",
    )
    wait_for(
        lambda: any(
            r["watch"] and r["path"] == f"/api/v1/namespaces/{name}/pods" for r in emulator.requests
        ),
        120,
        "the tool to watch the pods",
    )
    return process, name


def job_pods_stopped(emulator: Emulator, namespace: str) -> bool:
    """The run's Job is suspended and none of its pods runs any more."""
    job = emulator.get("jobs", namespace, "rollout")
    pods = [pod for pod in emulator.list("pods") if pod["metadata"]["namespace"] == namespace]
    return bool(job and job["spec"].get("suspend")) and all(
        pod["status"].get("phase") in ("Succeeded", "Failed") for pod in pods
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_waiting_stops_the_pods_and_keeps_the_receipt(
    make_cluster, tmp_path, signum
):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=30)
    output = tmp_path / "out"
    process, namespace = interrupted_while_waiting(emulator, kubectl, output)
    result = interrupt(process, signum)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert "Suspended Job rollout: its running pods were stopped" in result.stderr
    assert f"cleanup --output {output}" in result.stderr
    # Stopped by the tool, not by the test's signal: the episodes would run another 30 s.
    wait_for(lambda: job_pods_stopped(emulator, namespace), 20, "the Job's pods to stop")
    receipt = load(output / "receipt.json")
    assert {"namespace_uid", "job_uid"} <= set(receipt)
    assert (output / "pods.json").exists() and (output / "run.json").exists()
    assert_cleanup_works(emulator, kubectl, output)


def test_interrupt_with_cleanup_leaves_no_namespace(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=30)
    output = tmp_path / "out"
    process, namespace = interrupted_while_waiting(emulator, kubectl, output, "--cleanup")
    result = interrupt(process, signal.SIGINT)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and "Clean up with" not in result.stderr
    assert f"Deleted test namespace: {namespace} (--cleanup)." in result.stderr
    assert run_namespaces(emulator) == [] and emulator.list("jobs") == []
    assert (output / "pods.json").exists() and (output / "receipt.json").exists()


def finalize(cluster, kubectl: str, namespace: str, finalizers: list | None) -> None:
    """Set the namespace's metadata.finalizers (None: none), as another controller would."""
    patch = json.dumps({"metadata": {"finalizers": finalizers}})
    patched = subprocess.run(
        [kubectl, "patch", "namespace", namespace, "--type", "merge", "-p", patch],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert patched.returncode == 0, patched.stderr


@on_tiers("emulator", "real_cluster")
def test_namespace_held_by_a_finalizer_is_named_and_never_stripped(tier, tmp_path):
    kubectl, cluster = tier
    output = tmp_path / "out"
    assert run_tool(cluster, kubectl, "run", count=2, output=output, quiet=True).returncode == 0
    namespace = load(output / "receipt.json")["namespace"]
    finalize(cluster, kubectl, namespace, ["example.com/stuck"])
    stuck = run_tool(cluster, kubectl, "cleanup", output=output, wait=5)
    assert stuck.returncode == 1, stuck.stdout
    assert "example.com/stuck" in stuck.stderr and "never stripped" in stuck.stderr, stuck.stderr
    held = cluster.get("namespaces", None, namespace)
    assert held["metadata"]["finalizers"] == ["example.com/stuck"]
    assert held["status"]["phase"] == "Terminating"
    finalize(cluster, kubectl, namespace, None)
    wait_for(lambda: cluster.get("namespaces", None, namespace) is None, 120, "the namespace to go")
    again = run_tool(cluster, kubectl, "cleanup", output=output)
    assert again.returncode == 0 and again.stdout.strip() == "Namespace already absent", (
        again.stderr
    )
