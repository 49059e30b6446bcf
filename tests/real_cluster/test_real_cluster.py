"""End to end on a real control plane: the real tool, kubectl 1.35, kube-apiserver,
kube-controller-manager, kube-scheduler and etcd, with tests/support/node_agent.py doing
the kubelet's part (the worker runs under bubblewrap).

One cluster serves every test of a pytest process (the `real_cluster` fixture);
each run makes its own namespace, so the tests do not see each other. Run with
`python3 tests/run_tests.py --python 3.13 -- tests/real_cluster/test_real_cluster.py`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import (
    PRODUCT,
    assert_cleanup_twice,
    assert_kubelet_135_messages,
    assert_run_agrees_with_cluster,
    interrupt,
    load,
    most_at_once,
    run_tool,
    running_pods,
    start_tool,
    wait_for,
    write_script,
)

# One control plane for the whole tier: under pytest-xdist (--dist loadgroup) every test of
# this module runs in the same worker, so one cluster is started, not one per worker.
pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]


def kubectl_run(
    cluster, kubectl: str, *args: str, kubeconfig: Path = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [kubectl, *args], env=cluster.env(kubeconfig), capture_output=True, text=True, timeout=120
    )


def check_run(cluster, output: Path, count: int, parallelism: int) -> dict:
    """The run's files agree with each other, with the API server and with what the node agent ran."""
    results = assert_run_agrees_with_cluster(cluster, output, count, parallelism)
    namespace = load(output / "receipt.json")["namespace"]
    for row in results["pods"]:
        ran = cluster.agent.truth[(namespace, row["pod"])]
        assert ran["node"] == row["node"] and ran["exit_code"] == 0
    events = (output / "events.txt").read_text()
    # Not the Job's Completed event: the Job controller records it after it sets the Job's Complete
    # condition, so on a loaded control plane it can come after the run's last read of the events.
    for reason in ("Scheduled", "Pulled", "Created", "Started", "SuccessfulCreate"):
        assert reason in events, f"no {reason} event in events.txt"
    assert_kubelet_135_messages(load(output / "events.json")["items"])
    return results


def container_runs(cluster, namespace: str) -> list[dict]:
    """The node agent's record of each container run in `namespace` (pods whose container started)."""
    return [
        r
        for (ns, _), r in list(cluster.agent.truth.items())
        if ns == namespace and "container_started" in r
    ]


def test_guide_batches_then_cleanup_twice(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    parallel_dir, sequential_dir = tmp_path / "rl-parallel-10", tmp_path / "rl-sequential-10"

    parallel = run_tool(cluster, kubectl, "run", count=10, output=parallel_dir, quiet=True)
    assert parallel.returncode == 0, parallel.stderr
    parallel_results = check_run(cluster, parallel_dir, 10, 10)
    sequential = run_tool(
        cluster, kubectl, "run", count=10, parallelism=1, output=sequential_dir, quiet=True
    )
    assert sequential.returncode == 0, sequential.stderr
    sequential_results = check_run(cluster, sequential_dir, 10, 1)
    assert most_at_once(container_runs(cluster, parallel_results["namespace"])) >= 5
    assert most_at_once(container_runs(cluster, sequential_results["namespace"])) == 1

    # The logs the tool saved are the ones the real API server serves from the node agent.
    pod = parallel_results["pods"][0]["pod"]
    logs = kubectl_run(cluster, kubectl, "logs", pod, "-n", parallel_results["namespace"])
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == (parallel_dir / f"{pod}.log").read_text()

    for output in (parallel_dir, sequential_dir):
        assert_cleanup_twice(cluster, kubectl, output)


def test_rounds_with_warmup_then_foreground_cleanup(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    output = tmp_path / "rl-rounds"
    result = run_tool(
        cluster, kubectl, "run", count=3, rounds=2, warmup=True, output=output, quiet=True
    )
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["cache_state"] == "warmed" and results["rounds_measured"] == 2
    assert results["episodes"] == results["reward_sum"] == 6 and results["warmup"]["episodes"] == 3
    namespace = results["namespace"]
    assert sorted(j["metadata"]["name"] for j in cluster.list("jobs", namespace)) == [
        "rollout-1",
        "rollout-2",
        "rollout-warmup",
    ]
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip().endswith(f"Deleted test namespace: {namespace}")
    assert cluster.get("namespaces", None, namespace) is None


# Says ready, then works long enough for something to happen to it meanwhile.
SLOW_SCRIPT = """\
import json, os, time

def emit(event, **fields):
    print(json.dumps({"event": event, "at": time.time(), "episode_id": os.environ["EPISODE_ID"], **fields}),
          flush=True)

emit("ready")
time.sleep(float(os.environ.get("SLOW_SECONDS", "%s")))
emit("reward", reward=1)
"""


def slow_script(tmp_path: Path, seconds: float) -> Path:
    return write_script(tmp_path, SLOW_SCRIPT % seconds, "slow.py")


def start_two_slow_episodes(cluster, kubectl: str, tmp_path: Path, output: Path, seconds: float):
    """A run of two episodes that each take `seconds`, returned once both pods run: (process, pods)."""
    script = slow_script(tmp_path, seconds)
    process = start_tool(
        cluster, kubectl, "run", count=2, episode_script=script, output=output, quiet=True
    )
    pods = wait_for(
        lambda: len(running_pods(cluster, output)) == 2 and running_pods(cluster, output),
        120,
        "two running pods",
    )
    return process, pods


def test_api_server_killed_and_restarted_mid_run(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    output = tmp_path / "out"
    process = start_tool(
        cluster,
        kubectl,
        "run",
        count=3,
        episode_script=slow_script(tmp_path, 8),
        output=output,
        quiet=True,
    )
    wait_for(lambda: len(running_pods(cluster, output)) == 3, 120, "three running pods")
    cluster.control_plane.restart_apiserver(down_seconds=2.0)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 3
    assert results["client_wait"]["watch_restarts"] >= 1
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


def test_a_pod_status_the_api_server_did_not_take_is_sent_again(
    real_cluster, tmp_path, monkeypatch
):
    """As kubelet's status manager: the terminal status whose write was cut (an API server
    restarting mid-answer) is sent again at the next sync, so the run ends, not waits forever."""
    kubectl, cluster = real_cluster
    api = cluster.agent.api
    send = api.strategic_patch
    dropped: list[str] = []

    def cut_once(path: str, patch: dict):
        if "/pods/" in path and patch.get("status", {}).get("phase") == "Succeeded" and not dropped:
            dropped.append(path)
            raise ConnectionError(f"PATCH {path}: IncompleteRead(0 bytes read)")
        return send(path, patch)

    monkeypatch.setattr(api, "strategic_patch", cut_once)
    output = tmp_path / "out"
    run = run_tool(cluster, kubectl, "run", count=1, output=output, quiet=True)
    assert run.returncode == 0, run.stderr
    assert len(dropped) == 1
    assert load(output / "results.json")["reward_sum"] == 1
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


@pytest.mark.parametrize("signum", [signal.SIGINT], ids=["SIGINT"])
def test_interrupt_while_episodes_run_then_cleanup_stops_them(real_cluster, tmp_path, signum):
    kubectl, cluster = real_cluster
    output = tmp_path / "out"
    process, pods = start_two_slow_episodes(cluster, kubectl, tmp_path, output, 600)
    result = interrupt(process, signum)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and f"cleanup --output {output}" in result.stderr
    assert {"namespace_uid", "job_uid"} <= set(load(output / "receipt.json"))
    namespace = load(output / "receipt.json")["namespace"]
    assert "Suspended Job rollout: its running pods were stopped" in result.stderr
    # The run suspended its Job: the real Job controller, not cleanup, stops the episodes (it
    # deletes a suspended Job's running pods), and the Job stays for cleanup to prove.
    job = cluster.get("jobs", namespace, "rollout")
    assert job["spec"]["suspend"] is True

    def stopped() -> bool:
        left = [cluster.get("pods", namespace, pod["metadata"]["name"]) for pod in pods]
        return all(pod is None or pod["metadata"].get("deletionTimestamp") for pod in left)

    wait_for(stopped, 60, "the suspended Job's controller to delete its running pods")
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cluster.get("namespaces", None, namespace) is None
    for pod in pods:
        ran = cluster.agent.truth[(namespace, pod["metadata"]["name"])]
        # The episode is its container's first process and has no SIGTERM handler: as a real
        # container's PID 1 it ignores the stop signal and is killed at the grace period's end.
        assert ran["exit_code"] == 137


def test_a_pod_evicted_by_its_node_fails_the_run_clearly(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    output = tmp_path / "out"
    process, pods = start_two_slow_episodes(cluster, kubectl, tmp_path, output, 20)
    victim = pods[0]["metadata"]["name"]
    cluster.agent.evict(pods[0]["metadata"]["namespace"], victim)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 1, (stdout, stderr)
    assert "Traceback" not in stderr and f"cleanup --output {output}" in stderr
    assert victim in stderr or "Evicted" in stderr or "BackoffLimitExceeded" in stderr, stderr
    evicted = cluster.get("pods", pods[0]["metadata"]["namespace"], victim)
    assert evicted["status"]["phase"] == "Failed" and evicted["status"]["reason"] == "Evicted"
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


# --------------------------------------------------------------------------
# The README's permissions, as a user that has only them.


def readme_rbac() -> str:
    text = (Path(__file__).resolve().parent.parent.parent / "docs" / "operations.md").read_text()
    section = text.split("## Permissions", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def user_with(cluster, kubectl: str, user: str, rbac: str) -> Path:
    """A kubeconfig for `user`, bound to the ClusterRole in `rbac` (renamed after the user)."""
    manifest = rbac.replace("rl-bench@example.com", user).replace(
        "name: rl-batch-demo", f"name: rl-batch-demo-{user}"
    )
    applied = subprocess.run(
        [kubectl, "apply", "-f", "-"],
        input=manifest,
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    return cluster.control_plane.user_kubeconfig(user)


def test_the_readme_role_is_enough(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    kubeconfig = user_with(cluster, kubectl, "rl-bench", readme_rbac())
    denied = kubectl_run(cluster, kubectl, "get", "secrets", "-A", kubeconfig=kubeconfig)
    assert (
        denied.returncode == 1 and "forbidden" in denied.stderr
    )  # the user really is not an admin
    for name, extra in (
        ("plain", {}),
        ("harden", {"harden": True}),
        ("rounds", {"rounds": 2, "warmup": True}),
    ):
        output = tmp_path / name
        result = run_tool(
            cluster,
            kubectl,
            "run",
            count=2,
            **extra,
            output=output,
            quiet=True,
            kubeconfig=kubeconfig,
        )
        assert result.returncode == 0, (name, result.stderr)
        results = load(output / "results.json")
        assert results["reward_sum"] == 2 * extra.get("rounds", 1)
        if name != "rounds":  # (each round's client.json is in its own folder)
            # The events followed while waiting, not listed again after the end: the role lets them be watched.
            assert load(output / "client.json")["events_read"] == "watch", name
        cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
        assert cleaned.returncode == 0, (name, cleaned.stderr)
        assert cluster.get("namespaces", None, results["namespace"]) is None


def test_a_role_that_may_only_list_events_reads_them_after_the_end(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    events_rule = """    resources: ["events"]
    verbs: ["list", "watch"]"""
    assert events_rule in readme_rbac()
    rbac = readme_rbac().replace(events_rule, events_rule.replace('["list", "watch"]', '["list"]'))
    kubeconfig = user_with(cluster, kubectl, "list-events", rbac)
    output = tmp_path / "out"
    result = run_tool(
        cluster, kubectl, "run", count=2, output=output, quiet=True, kubeconfig=kubeconfig
    )
    assert result.returncode == 0, result.stderr
    # The events watch was refused: the events are listed after the end instead, all of them.
    assert load(output / "client.json")["events_read"] == "list"
    assert (
        "Warning: cannot watch the events" in result.stderr
        and "grant watch on events" in result.stderr
    )
    scheduled = [e for e in load(output / "events.json")["items"] if e["reason"] == "Scheduled"]
    assert len(scheduled) == 2
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr


def test_a_role_without_pod_logs_fails_clearly(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    rbac = readme_rbac().replace(
        """  - apiGroups: [""]
    resources: ["pods/log"]
    verbs: ["get"]
""",
        "",
    )
    kubeconfig = user_with(cluster, kubectl, "no-logs", rbac)
    output = tmp_path / "out"
    result = run_tool(
        cluster, kubectl, "run", count=2, output=output, quiet=True, kubeconfig=kubeconfig
    )
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    # Each log read refused is named with the API server's reason, then the verdict on the episodes.
    for pod in [p["metadata"]["name"] for p in load(output / "pods.json")["items"]]:
        assert re.search(
            rf'Warning: could not save {pod}.log: .*User "no-logs" cannot get resource "pods/log"',
            result.stderr,
        ), result.stderr
    assert "expected exactly one ready event, found 0" in result.stderr
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr


def test_a_role_without_watch_fails_clearly(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    rbac = readme_rbac().replace('"watch", ', "").replace(', "watch"', "")  # every grant of it
    assert "watch" not in rbac
    kubeconfig = user_with(cluster, kubectl, "no-watch", rbac)
    output = tmp_path / "out"
    result = run_tool(
        cluster, kubectl, "run", count=2, output=output, quiet=True, kubeconfig=kubeconfig
    )
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr and f"cleanup --output {output}" in result.stderr
    assert re.search(
        r"Error: cannot watch the (job|pods): Error from server \(Forbidden\): .*"
        r'User "no-watch" cannot watch resource "(jobs|pods)"',
        result.stderr,
    ), result.stderr
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr


# --------------------------------------------------------------------------
# tests/local_cluster.py, as a newcomer runs it.


@pytest.mark.parametrize("mode", ["real", "emulator"])
def test_local_cluster_says_ready_then_stops_on_a_signal(real_cluster, tmp_path, mode):
    kubectl, _ = real_cluster
    argv = [
        sys.executable,
        str(Path(__file__).resolve().parent.parent / "local_cluster.py"),
        "--workdir",
        str(tmp_path),
        "--kubectl",
        kubectl,
    ] + (["--emulator"] if mode == "emulator" else [])
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("READY "), (
            line,
            process.stderr.read() if process.poll() is not None else "",
        )
        kubeconfig = line.split(" ", 1)[1].strip()
        env = dict(os.environ, KUBECONFIG=kubeconfig, HOME=str(tmp_path))
        nodes = subprocess.run(
            [kubectl, "get", "nodes", "-o", "name"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert nodes.returncode == 0 and nodes.stdout.count("node/") == 3, nodes.stderr
        output = tmp_path / "out"
        run = subprocess.run(
            [
                sys.executable,
                str(PRODUCT),
                "run",
                "--count",
                "2",
                "--output",
                str(output),
                "--quiet",
                "--kubectl",
                kubectl,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        # Its nodes hold the guide's image alone: a typo fails to pull, and the run fails.
        typo = subprocess.run(
            [sys.executable, str(PRODUCT), "run", "--count", "1", "--output", str(tmp_path / "t")]
            + ["--image", "pyton:3.12-alpine", "--timeout", "8", "--quiet", "--kubectl", kubectl],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert typo.returncode == 1, typo.stderr
        assert "Error: ErrImagePull" in (tmp_path / "t" / "events.txt").read_text()
        process.send_signal(signal.SIGTERM if mode == "real" else signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    gone = subprocess.run(
        [kubectl, "get", "nodes", "--request-timeout=5s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode != 0


def test_pod_lifecycles_as_kubelet_135_shows_them(real_cluster, tmp_path):
    """The node agent against what kubelet v1.35.4 showed of the same pods (tests/support/compare_nodes.py):
    ended, failed, deleted, evicted through the Eviction API, past their deadline (running, and
    after succeeding), an image no registry has, a Job's pod."""
    import compare_nodes

    kubectl, cluster = real_cluster
    absent = "docker.io/library/" + compare_nodes.MISSING_IMAGE
    cluster.agent.absent_images.add(absent)
    try:
        record = compare_nodes.scenarios(kubectl, cluster.env(), tmp_path, "kubelet-lifecycles")
    finally:
        cluster.agent.absent_images.discard(absent)
    (tmp_path / "record.json").write_text(json.dumps(record, indent=1))
    differences = compare_nodes.kubelet_135_differences(record, deadline_flip=True)
    assert differences == [], "\n".join(differences)
