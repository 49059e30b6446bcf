"""End to end, the reliability cases not covered by test_e2e_failures.py:
an unreachable cluster, interruptions while creating and while collecting, a Job
that is not the run's, cleanup after a partial run, a full disk, transient API
errors and latency during creation, and a noisy episode worker.

Every case runs the real tool with real kubectl against the emulator and asserts
on messages and files; no case may print a traceback."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from conftest import skip_or_fail
from e2e_support import (
    PRODUCT,
    assert_cleanup_works,
    interrupt,
    load,
    receipt_of,
    run_namespaces,
    run_tool,
    start_tool,
    wait_for,
)
from kube_emulator import Emulator

pytestmark = pytest.mark.e2e

# Long enough for a loaded machine; never a measure of speed.
WAIT = 120


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs to fill up, so that writes fail with ENOSPC (needs mount rights, i.e. root)."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        skip_or_fail(f"cannot mount a small tmpfs to fill up: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=True)


def fill(directory: Path) -> None:
    """Write zeros until the filesystem holding `directory` has no block left."""
    descriptor = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(descriptor, b"\0" * 4096)
    except OSError as error:
        assert error.errno == errno.ENOSPC, error
    finally:
        os.close(descriptor)


def assert_clean_failure(result: Any, returncode: int = 1) -> None:
    assert result.returncode == returncode, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr


def uid(obj: Optional[dict]) -> Optional[str]:
    return (obj or {}).get("metadata", {}).get("uid")


def assert_cleanup_finds_nothing(emulator: Emulator, kubectl: str, output: Path) -> None:
    requests_before = len(emulator.requests)
    again = run_tool(emulator, kubectl, "cleanup", output=output)
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    assert again.stdout.strip() == "Namespace already absent"
    assert not any(r["method"] == "DELETE" for r in emulator.requests[requests_before:])
    receipt = load(output / "receipt.json")
    assert (
        f"({receipt['namespace']} in context {receipt['context']}: nothing to delete)"
        in again.stderr
    )


# --------------------------------------------------------------------------
# Cluster unreachable


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unreachable_env(emulator: Emulator, directory: Path) -> dict:
    """The emulator's environment with its context pointing at a closed local port."""
    config = json.loads(emulator.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{closed_port()}"
    path = directory / "unreachable-kubeconfig"
    path.write_text(json.dumps(config))
    return {**emulator.env(), "KUBECONFIG": str(path)}


def tool_in(env: dict, kubectl: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PRODUCT), *args, "--kubectl", kubectl],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_unreachable_cluster_fails_before_any_change_and_cleanup_says_so(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    dead = unreachable_env(emulator, tmp_path)
    output = tmp_path / "out"
    result = tool_in(dead, kubectl, "run", "--count", "2", "--output", str(output), "--quiet")
    assert_clean_failure(result)
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("Error: cannot reach the cluster of context 'kube-emulator': "), (
        result.stderr
    )
    assert "refused" in first_line and first_line.endswith("nothing was created"), first_line
    assert len(result.stderr.splitlines()) <= 3, result.stderr
    assert "Test namespace" not in result.stdout
    # Nothing was created, so nothing to trace: the directory is removed and its name free.
    assert "was removed again, so the same --output can be reused" in result.stderr
    assert not output.exists()

    # A receipt of a run the cluster never saw, as one left by an interrupted run.
    output.mkdir()
    receipt = {
        "context": "kube-emulator",
        "namespace": "agc-rl-0123456789ab",
        "run_id": "0123456789ab",
    }
    (output / "receipt.json").write_text(json.dumps(receipt))

    # cleanup names the cluster problem and deletes nothing...
    unreachable = tool_in(dead, kubectl, "cleanup", "--output", str(output))
    assert_clean_failure(unreachable)
    assert len(unreachable.stderr.strip().splitlines()) == 1, unreachable.stderr
    assert unreachable.stderr.startswith("Error: ")
    assert "refused" in unreachable.stderr and receipt["namespace"] in unreachable.stderr
    assert unreachable.stdout == ""
    # ...and once the context reaches a live cluster, finds nothing to delete.
    assert_cleanup_finds_nothing(emulator, kubectl, output)
    assert run_namespaces(emulator) == []


def test_cleanup_with_a_kubeconfig_lacking_the_runs_context_names_the_one_the_run_used(
    make_cluster, tmp_path
):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=1, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert load(output / "receipt.json")["kubeconfig"] == str(emulator.kubeconfig)
    config = json.loads(emulator.kubeconfig.read_text())
    config["contexts"][0]["name"] = config["current-context"] = "another-cluster"
    other = tmp_path / "other-kubeconfig"
    other.write_text(json.dumps(config))
    refused = tool_in(
        {**emulator.env(), "KUBECONFIG": str(other)}, kubectl, "cleanup", "--output", str(output)
    )
    assert_clean_failure(refused)
    assert refused.stderr == (
        f"Error: kube context 'kube-emulator' of {output / 'receipt.json'} is not in the kubeconfig kubectl reads "
        f"now ({other}); the run used {emulator.kubeconfig}: clean up with KUBECONFIG={emulator.kubeconfig}; "
        f"nothing was deleted\n"
    )
    assert len(run_namespaces(emulator)) == 1
    assert_cleanup_works(emulator, kubectl, output)


# --------------------------------------------------------------------------
# Interrupted while creating and while collecting


def assert_interrupted(result: Any, output: Path) -> None:
    assert_clean_failure(result, 130)
    assert "Clean up with: " in result.stderr, result.stderr
    assert f"cleanup --output {output}" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_while_creating_keeps_a_receipt_that_cleans_up(make_cluster, tmp_path, signum):
    kubectl, make = make_cluster
    emulator = make(api_latency=0.7)  # every request is slow: creation takes seconds
    output = tmp_path / "out"
    process = start_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    namespace = wait_for(lambda: run_namespaces(emulator), WAIT, "the run's namespace")[0]
    assert emulator.list("jobs") == [], (
        "the Job exists already: the interruption would not be while creating"
    )
    result = interrupt(process, signum)
    assert_interrupted(result, output)
    name = namespace["metadata"]["name"]
    assert f"receipt.json names namespace {name}" in result.stderr
    receipt = load(output / "receipt.json")
    assert receipt["namespace"] == name
    assert receipt["namespace_uid"] == uid(emulator.get("namespaces", None, name))
    live_jobs = emulator.list("jobs", name)
    assert sorted(uid(job) for job in live_jobs) == sorted((receipt.get("jobs") or {}).values())
    assert receipt.get("job_uid") == (uid(live_jobs[0]) if live_jobs else None)
    emulator.set_faults(api_latency=None)
    # A partial run cleans up, and a second cleanup finds nothing left.
    assert_cleanup_works(emulator, kubectl, output)
    assert_cleanup_finds_nothing(emulator, kubectl, output)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupt_while_collecting_keeps_the_receipt_and_evidence(make_cluster, tmp_path, signum):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=2.0)
    output = tmp_path / "out"
    process = start_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    name = wait_for(
        lambda: receipt_of(output).get("job_uid") and receipt_of(output)["namespace"],
        WAIT,
        "the Job's UID in the receipt",
    )

    def watching(resource: str) -> bool:
        return any(r["watch"] and r["path"] == f"{resource}" for r in emulator.requests)

    wait_for(
        lambda: (
            watching(f"/apis/batch/v1/namespaces/{name}/jobs")
            and watching(f"/api/v1/namespaces/{name}/pods")
        ),
        WAIT,
        "the tool to watch the Job and pods",
    )
    # From now on every new request is slow, so collecting the evidence takes seconds.
    emulator.set_faults(api_latency=1.5)
    events_path = f"/api/v1/namespaces/{name}/events"
    # The events are watched from the start; after the end a list of one counts them.
    wait_for(
        lambda: any(
            r["path"] == events_path and r["query"].get("limit") == "1" for r in emulator.requests
        ),
        WAIT,
        "the tool to start collecting (counting the namespace's events)",
    )
    assert process.poll() is None, "the run ended before it could be interrupted while collecting"
    job = emulator.get("jobs", name, "rollout")
    assert any(
        c["type"] == "Complete" and c["status"] == "True" for c in job["status"]["conditions"]
    )
    result = interrupt(process, signum)
    assert_interrupted(result, output)
    receipt = load(output / "receipt.json")
    assert receipt["namespace_uid"] == uid(emulator.get("namespaces", None, name))
    assert receipt["job_uid"] == receipt["jobs"]["rollout"] == uid(job)
    # The Job had ended: nothing to stop, and nothing said of stopping it.
    assert "Suspended Job" not in result.stderr and "not stopped" not in result.stderr
    assert not emulator.get("jobs", name, "rollout")["spec"].get("suspend")
    assert not (output / "results.json").exists()
    emulator.set_faults(api_latency=None)
    assert_cleanup_works(emulator, kubectl, output)


# --------------------------------------------------------------------------
# A Job that is not the run's


def kubectl_call(
    emulator: Emulator, kubectl: str, *args: str, input_text: Optional[str] = None
) -> str:
    return subprocess.run(
        [kubectl, *args],
        input=input_text,
        env=emulator.env(),
        check=True,
        capture_output=True,
        text=True,
        timeout=WAIT,
    ).stdout


def test_cleanup_refuses_a_job_with_another_uid(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    finished = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    assert finished.returncode == 0, finished.stderr
    receipt = load(output / "receipt.json")
    name = receipt["namespace"]
    # Someone replaces the run's Job with their own of the same name.
    kubectl_call(emulator, kubectl, "delete", "job", "rollout", "-n", name, "--wait=false")
    wait_for(
        lambda: emulator.get("jobs", name, "rollout") is None, WAIT, "the run's Job to be gone"
    )
    impostor = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout", "namespace": name},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "other",
                            "image": "python:3.12-alpine",
                            "command": ["python", "-c", "pass"],
                        }
                    ],
                }
            },
        },
    }
    kubectl_call(emulator, kubectl, "create", "-f", "-", input_text=json.dumps(impostor))
    other_uid = uid(emulator.get("jobs", name, "rollout"))
    assert other_uid and other_uid != receipt["job_uid"]

    requests_before = len(emulator.requests)
    refused = run_tool(emulator, kubectl, "cleanup", output=output)
    assert_clean_failure(refused)
    assert f"refusing to delete Job rollout in {name}" in refused.stderr, refused.stderr
    assert other_uid in refused.stderr and receipt["job_uid"] in refused.stderr
    assert "nothing was deleted" in refused.stderr
    assert refused.stdout == ""
    assert not any(r["method"] == "DELETE" for r in emulator.requests[requests_before:])
    namespace = emulator.get("namespaces", None, name)
    assert namespace is not None and not namespace["metadata"].get("deletionTimestamp")
    job = emulator.get("jobs", name, "rollout")
    assert uid(job) == other_uid and not job["metadata"].get("deletionTimestamp")


# --------------------------------------------------------------------------
# Disk full


def test_disk_full_before_the_receipt_changes_nothing(make_cluster, small_disk):
    kubectl, make = make_cluster
    emulator = make()
    fill(small_disk)
    output = small_disk / "out"
    result = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    assert_clean_failure(result)
    assert result.stderr.startswith(
        f"Error: cannot write {output / 'receipt.json'}: No space left on device"
    ), result.stderr
    assert len(result.stderr.splitlines()) <= 3, result.stderr
    assert not (output / "receipt.json").exists()
    assert run_namespaces(emulator) == []
    assert not any(r["method"] in ("POST", "PUT", "PATCH", "DELETE") for r in emulator.requests)


def test_disk_full_while_waiting_names_the_file_and_keeps_the_receipt(make_cluster, small_disk):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=2.0)
    output = small_disk / "out"
    process = start_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    wait_for(lambda: receipt_of(output).get("job_uid"), WAIT, "the Job's UID in the receipt")
    fill(small_disk)
    stdout, stderr = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert_clean_failure(result)
    failed = re.search(r"^Error: cannot write (\S+): No space left on device$", stderr, re.M)
    assert failed, stderr
    unwritten = Path(failed.group(1))
    assert unwritten.parent == output and not unwritten.exists()
    assert f"cleanup --output {output}" in stderr
    assert not (output / "results.json").exists()
    receipt = load(output / "receipt.json")
    assert receipt["namespace_uid"] == uid(emulator.get("namespaces", None, receipt["namespace"]))
    assert receipt["job_uid"] == uid(emulator.get("jobs", receipt["namespace"], "rollout"))
    # cleanup only reads the directory: it works on the full disk as it is.
    assert_cleanup_works(emulator, kubectl, output)


# --------------------------------------------------------------------------
# Transient errors and a slow API server while creating


@pytest.mark.parametrize(
    "path, status",
    [
        ("/api/v1/namespaces", 503),
        ("/apis/batch/v1/namespaces/{namespace}/jobs", 504),
    ],
    ids=["namespace-503", "job-504"],
)
def test_transient_errors_while_creating_are_retried(make_cluster, tmp_path, path, status):
    kubectl, make = make_cluster
    # "?fieldManager" is only in kubectl create's POST, never in a GET or a watch.
    match = path.split("/{namespace}")[-1] + "?fieldManager"
    emulator = make(api_errors={"count": 2, "match": match, "status": status})
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 2
    assert results["client"]["api_retries"] >= 2
    expected_path = path.format(namespace=results["namespace"])
    posts = [
        r["status"]
        for r in emulator.requests
        if r["method"] == "POST" and r["path"] == expected_path
    ]
    assert posts == [status, status, 201]


def test_slow_api_server_below_the_request_timeout_still_succeeds(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(api_latency=1.0)
    output = tmp_path / "out"
    # --timeout only bounds how long a wrong answer would take to show.
    result = run_tool(emulator, kubectl, "run", count=2, timeout=60, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 2 and results["successful_episodes"] == 2
    assert all(r["status"] != 504 for r in emulator.requests)


def test_job_completing_while_a_slow_watch_restarts_is_seen(make_cluster, tmp_path):
    """`kubectl get job NAME -w` drops the first event of its watch (a copy of what it just
    got); on a slow API server a Job that completes between that GET and the watch's
    start is only in that first event. The tool must still see the Job end."""
    kubectl, make = make_cluster
    # The Job controller stalls once it has made both pods: they run on, the Job stays unfinished.
    emulator = make(job_controller_stalled=2)
    output = tmp_path / "out"
    process = start_tool(emulator, kubectl, "run", count=2, timeout=20, output=output, quiet=True)
    name = wait_for(
        lambda: receipt_of(output).get("job_uid") and receipt_of(output)["namespace"],
        WAIT,
        "the Job's UID in the receipt",
    )
    wait_for(lambda: len(emulator.list("pods", name)) == 2, WAIT, "the Job's pods")
    wait_for(
        lambda: all(p["status"].get("phase") == "Succeeded" for p in emulator.list("pods", name)),
        WAIT,
        "both pods to succeed",
    )
    job = emulator.get("jobs", name, "rollout")
    assert not any(c["type"] == "Complete" for c in job["status"].get("conditions") or []), (
        "the Job completed before the controller was stalled"
    )
    requests_before = len(emulator.requests)
    emulator.set_faults(api_latency=2.0)
    emulator.restart_api(down_seconds=0.5)  # the tool's watches break and start again, slowly
    job_path = f"/apis/batch/v1/namespaces/{name}/jobs"
    wait_for(
        lambda: any(
            r["watch"] and r["path"] == job_path for r in emulator.requests[requests_before:]
        ),
        WAIT,
        "the tool to watch the Job again",
    )
    # The watch request now waits out its latency; the Job completes meanwhile.
    emulator.set_faults(job_controller_stalled=None)
    wait_for(
        lambda: any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in emulator.get("jobs", name, "rollout")["status"].get("conditions") or []
        ),
        WAIT,
        "the Job to complete",
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert load(output / "results.json")["reward_sum"] == 2


# --------------------------------------------------------------------------
# A noisy worker


NOISY_SCRIPT = '''"""An episode whose agent prints a traceback and chatter besides its events."""
import json
import os
import sys
import time
import traceback


def emit(event, **fields):
    record = {"event": event, "at": time.time(), "episode_id": os.environ["EPISODE_ID"]}
    record.update(fields)
    print(json.dumps(record), flush=True)


print("agent: starting", flush=True)
try:
    raise ConnectionError("model endpoint went away")
except ConnectionError:
    traceback.print_exc()
    sys.stderr.flush()
emit("ready")
print('{"event": "ready", "at": ', flush=True)
print(json.dumps({"event": 7, "note": "not an event"}), flush=True)
sys.stderr.write("Traceback (most recent call last):\\n  File \\"agent.py\\", line 3\\nValueError: retrying\\n")
sys.stderr.flush()
emit("reward", reward=0.5)
print("agent: done", flush=True)
'''


def test_worker_tracebacks_and_chatter_are_kept_and_ignored(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    script = tmp_path / "noisy.py"
    script.write_text(NOISY_SCRIPT)
    result = run_tool(
        emulator, kubectl, "run", count=2, episode_script=script, output=output, quiet=True
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    results = load(output / "results.json")
    assert results["episodes"] == results["successful_episodes"] == 2
    assert results["reward_sum"] == 1.0
    logs = sorted(output.glob("rollout-*.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text()
        assert "ConnectionError: model endpoint went away" in text
        assert "ValueError: retrying" in text
        assert text.count("Traceback (most recent call last):") == 2
        assert '{"event": "ready", "at": \n' in text and '"not an event"' in text
        assert "agent: starting" in text and "agent: done" in text
