"""On the real control plane with the real Kueue (v0.17.0, built from the Go module proxy by
tests/support/build_kueue.py, run by tests/support/kueue_manager.py): queued runs admitted,
refused over quota, and their admission measured from the Workloads' own conditions.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import discovered_kueue, skip_or_fail
from e2e_support import TASK_EPISODE_HEAD, load, run_tool, start_tool, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]

# Ten episodes' worth: each asks 100m / 64Mi, and RuntimeClass cube adds 250m / 768Mi per pod,
# which Kueue counts too (350m / 832Mi).
QUOTA = {"cpu": "3500m", "memory": "10Gi"}

SLOW_SCRIPT = """\
import json, os, time

def emit(event, **fields):
    print(json.dumps({"event": event, "at": time.time(), "episode_id": os.environ["EPISODE_ID"], **fields}),
          flush=True)

emit("ready")
time.sleep(%s)
emit("reward", reward=1)
"""


@pytest.fixture(scope="module")
def kueue(real_cluster, tmp_path_factory):
    """The real Kueue manager on the tier's control plane, its CRDs and loopback webhooks."""
    from kueue_manager import KueueError, KueueManager

    kubectl, cluster = real_cluster
    bin_dir = discovered_kueue()
    if bin_dir is None:
        skip_or_fail(
            "missing prerequisite: the Kueue manager (python3 tests/support/build_kueue.py)"
        )
    manager = KueueManager(Path(bin_dir), tmp_path_factory.mktemp("kueue"), kubectl, cluster.env())
    try:
        manager.install()
    except KueueError as error:
        manager.stop()
        skip_or_fail(f"cannot run Kueue here: {error}")
    yield manager
    manager.stop()


def condition_time(obj: dict, kind: str) -> float:
    from all_names import parse_time

    found = [c for c in obj["status"]["conditions"] if c["type"] == kind and c["status"] == "True"]
    return parse_time(found[0]["lastTransitionTime"])


def workload_exists(cluster, kubectl: str, name: str) -> bool:
    found = subprocess.run(
        [kubectl, "get", "workloads.kueue.x-k8s.io", name, "-n", "kq-admit", "--ignore-not-found"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    return bool(found.stdout.strip())


def run_labelled(cluster, namespace: str, kind: str) -> list[str]:
    return [
        item["metadata"]["name"]
        for item in cluster.list(kind, namespace)
        if "agc-demo-run" in (item["metadata"].get("labels") or {})
    ]


def test_a_queued_run_is_admitted_and_its_admission_is_the_workloads(real_cluster, kueue, tmp_path):
    kubectl, cluster = real_cluster
    kueue.queue("kq-admit", "lq", "cq-admit", QUOTA)
    output = tmp_path / "out"
    result = run_tool(
        cluster, kubectl, "run", count=2, namespace="kq-admit", queue="lq", output=output
    )
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 2
    run_id = load(output / "receipt.json")["run_id"]
    job = cluster.get("jobs", "kq-admit", f"rollout-{run_id}")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
    (workload,) = load(output / "workloads.json")["items"]
    assert workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == job["metadata"]["uid"]
    admission = results["admission"]
    assert admission["quota_reserved_at"] == condition_time(workload, "QuotaReserved")
    assert admission["admitted_at"] == condition_time(workload, "Admitted")
    assert admission["queued_at"] <= admission["quota_reserved_at"] <= admission["admitted_at"]
    assert admission["resumed_at"] >= admission["admitted_at"]
    assert admission["precision_seconds"] == 1.0 and admission["queue_wait_seconds"] is not None
    assert load(output / "run.json")["capacity"]["fits_at_once"] == 10
    from all_names import recompute

    # `report` makes the same figures from the saved Workloads and Job alone.
    assert recompute(str(output)).figures["admission"] == admission
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cluster.get("jobs", "kq-admit", f"rollout-{run_id}") is None
    name = workload["metadata"]["name"]
    deadline = time.monotonic() + 60  # the Workload goes with its Job (owner reference)
    while workload_exists(cluster, kubectl, name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not workload_exists(cluster, kubectl, name)


def test_a_batch_over_the_quota_is_refused_before_anything_is_made(real_cluster, kueue, tmp_path):
    kubectl, cluster = real_cluster
    kueue.queue("kq-over", "lq", "cq-over", QUOTA)
    result = run_tool(
        cluster,
        kubectl,
        "run",
        count=12,
        namespace="kq-over",
        queue="lq",
        output=tmp_path / "out",
        quiet=True,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "can never be admitted by queue lq (ClusterQueue cq-over)" in result.stderr
    assert (
        "runs 12 pods at once, 4200m of cpu (350m each), and the quota is 3500m (10 pods' worth)"
        in result.stderr
    ), result.stderr
    assert "nothing was created" in result.stderr
    assert run_labelled(cluster, "kq-over", "jobs") == []
    assert run_labelled(cluster, "kq-over", "configmaps") == []


def test_a_local_queue_that_does_not_exist_is_said_and_nothing_is_left(
    real_cluster, kueue, tmp_path
):
    kubectl, cluster = real_cluster
    kueue.queue("kq-none", "lq", "cq-none", QUOTA)
    result = run_tool(
        cluster, kubectl, "run", count=1, namespace="kq-none", queue="nope", output=tmp_path / "o"
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "localqueue 'nope' not found in namespace kq-none" in result.stderr, result.stderr
    assert '"kind": "LocalQueue"' in result.stderr  # how to make one
    assert run_labelled(cluster, "kq-none", "jobs") == []
    assert run_labelled(cluster, "kq-none", "configmaps") == []


def test_two_runs_compete_for_one_queue_and_the_second_waits_its_turn(
    real_cluster, kueue, tmp_path
):
    kubectl, cluster = real_cluster
    kueue.queue("kq-two", "lq", "cq-two", {"cpu": "700m", "memory": "2Gi"})  # one run at a time
    script = write_script(tmp_path, SLOW_SCRIPT % 8, "slow.py")
    flags = dict(count=2, namespace="kq-two", queue="lq", episode_script=script)
    first = start_tool(cluster, kubectl, "run", output=tmp_path / "first", **flags)
    time.sleep(3)
    second = start_tool(cluster, kubectl, "run", output=tmp_path / "second", **flags)
    receipt = tmp_path / "second" / "receipt.json"
    deadline = time.monotonic() + 60
    while not (receipt.exists() and load(receipt).get("jobs")) and time.monotonic() < deadline:
        time.sleep(0.5)
    listed = json.loads(run_tool(cluster, kubectl, "list", "-o", "json").stdout)
    states = {item["run_id"]: item["state"] for item in listed if item["namespace"] == "kq-two"}
    assert states[load(receipt)["run_id"]] == "queued", states
    outputs = {}
    for name, process in (("first", first), ("second", second)):
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, (name, stderr)
        outputs[name] = stderr
    assert "queued: couldn't assign flavors" in outputs["second"], outputs["second"]
    ended = load(tmp_path / "first" / "results.json")
    waited = load(tmp_path / "second" / "results.json")["admission"]
    (first_job,) = load(tmp_path / "first" / "job.json")["status"]["conditions"][-1:]
    from all_names import parse_time

    first_end = parse_time(first_job["lastTransitionTime"])
    assert ended["reward_sum"] == 2
    # Admitted only once the first run's Job ended and gave its quota back: the wait covers it.
    assert waited["quota_reserved_at"] >= first_end - 1
    assert waited["queue_wait_seconds"] >= first_end - waited["queued_at"] - 1
    assert waited["queue_wait_seconds"] >= 4
    for picture in ("timeline.svg", "ramp.svg"):  # the wait, shaded behind the batch
        assert "<title>queue_wait: " in (tmp_path / "second" / picture).read_text(), picture


def test_need_under_a_queue_ends_at_its_kth_reward(real_cluster, kueue, tmp_path):
    kubectl, cluster = real_cluster
    kueue.queue("kq-need", "lq", "cq-need", QUOTA)
    output = tmp_path / "out"
    result = run_tool(
        cluster,
        kubectl,
        "run",
        count=3,
        need=2,
        namespace="kq-need",
        queue="lq",
        output=output,
        quiet=True,
    )
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["need"] == 2 and results["admission"]["admitted_at"] is not None
    rewards = [json.loads(line) for line in (output / "rewards.jsonl").read_text().splitlines()]
    assert sum(1 for row in rewards if row["valid"]) >= 2


def test_the_namespaced_role_runs_a_queued_batch_and_says_what_it_could_not_read(
    real_cluster, kueue, tmp_path
):
    from test_real_cluster_queue import namespaced_role

    kubectl, cluster = real_cluster
    kueue.queue("kq-role", "lq", "cq-role", QUOTA)
    role = (
        namespaced_role().replace("rl-bench@example.com", "rl-queued").replace("team-a", "kq-role")
    )
    applied = subprocess.run(
        [kubectl, "apply", "-f", "-"],
        input=role,
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    kubeconfig = cluster.control_plane.user_kubeconfig("rl-queued")
    output = tmp_path / "out"
    result = run_tool(
        cluster,
        kubectl,
        "run",
        count=2,
        namespace="kq-role",
        queue="lq",
        output=output,
        quiet=True,
        kubeconfig=kubeconfig,
    )
    assert result.returncode == 0, result.stderr
    # A Role reads the LocalQueue and the Workloads, not the cluster-wide ClusterQueue.
    assert "queue quota check skipped (reading ClusterQueue cq-role is not permitted)" in (
        result.stderr
    )
    capacity = load(output / "run.json")["capacity"]
    assert capacity["checked"] is False and capacity["cluster_queue"] == "cq-role"
    admission = load(output / "results.json")["admission"]
    assert admission["admitted_at"] is not None and "unavailable" not in admission
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr


def test_a_held_queue_is_said_and_a_restarted_manager_admits_the_waiting_run(
    real_cluster, kueue, tmp_path
):
    kubectl, cluster = real_cluster
    kueue.queue("kq-hold", "lq", "cq-hold", QUOTA)
    kueue.call("patch", "localqueue", "lq", "-n", "kq-hold", "--type=merge", "-p", HOLD)
    output = tmp_path / "out"
    process = start_tool(
        cluster, kubectl, "run", count=2, namespace="kq-hold", queue="lq", output=output
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((output).glob("job-submitted.json")):
            time.sleep(0.5)
        time.sleep(5)  # Kueue has looked at the Workload: Inadmissible while the queue holds
        kueue.stop()  # the manager dies while the run waits
        kueue.call("patch", "localqueue", "lq", "-n", "kq-hold", "--type=merge", "-p", RELEASE)
        time.sleep(3)
        assert process.poll() is None  # still waiting, not failed
        kueue.start()
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "Inadmissible, Kueue will not admit it as things are" in stderr, stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 2 and results["admission"]["queue_wait_seconds"] >= 8
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


HOLD = '{"spec": {"stopPolicy": "Hold"}}'
RELEASE = '{"spec": {"stopPolicy": "None"}}'


def test_queued_pools_share_a_namespace_the_second_waits_for_the_quota_then_serves(
    real_cluster, kueue, tmp_path, monkeypatch
):
    """Two pools in one namespace through one queue whose quota holds two sandboxes: the first
    (two) is admitted and serves; the second's claim times out saying its Job is queued (Kueue's
    word), not blaming pods; once the first closes (its objects deleted by UID, the namespace
    staying) the second is admitted and serves a command."""
    import os

    import rl_batch_demo

    kubectl, cluster = real_cluster
    if os.geteuid() != 0:
        skip_or_fail("root (the node agent's pod network is a network namespace of its own)")
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)
    kueue.queue("kq-pool", "lq", "cq-pool", {"cpu": "700m", "memory": "2Gi"})  # 2 sandboxes
    flags = dict(kubectl=kubectl, namespace="kq-pool", queue="lq", env={"MODE": "queued"})
    first = rl_batch_demo.open_pool(output=str(tmp_path / "a"), size=2, episodes=2, **flags)
    with first:
        run_a = load(tmp_path / "a" / "receipt.json")["run_id"]
        job = cluster.get("jobs", "kq-pool", f"pool-{run_a}")
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
        with first.claim(timeout=180) as sandbox:
            assert sandbox.run("echo $MODE").stdout == "queued\n"
            # Both of the first pool's sandboxes hold the quota (one claimed, one warm). Once a
            # sandbox finishes, Kueue reclaims its pod's share (the Job's reclaimablePods), so the
            # second pool is asked for while both still run.
            second = rl_batch_demo.open_pool(
                output=str(tmp_path / "b"), size=1, episodes=1, **flags
            )
            with pytest.raises(rl_batch_demo.DemoError) as waiting:
                second.claim(timeout=15)
            said = str(waiting.value)
            assert "is queued, not yet admitted by Kueue" in said, said
            assert "insufficient" in said or "couldn't assign flavors" in said, said
            sandbox.finish(reward=1.0)
    assert cluster.get("jobs", "kq-pool", f"pool-{run_a}") is None
    assert cluster.get("namespaces", None, "kq-pool") is not None
    with second:
        with second.claim(timeout=180) as sandbox:
            assert sandbox.run(["echo", "admitted"]).stdout == "admitted\n"
            sandbox.finish(reward=1.0)
    assert run_labelled(cluster, "kq-pool", "jobs") == []
    assert run_labelled(cluster, "kq-pool", "secrets") == []
    assert cluster.get("namespaces", None, "kq-pool") is not None


def test_a_pool_over_the_quota_is_refused_before_anything_is_made(real_cluster, kueue, tmp_path):
    kubectl, cluster = real_cluster
    kueue.queue("kq-pool-over", "lq", "cq-pool-over", QUOTA)
    result = run_tool(
        cluster,
        kubectl,
        "pool",
        size=12,
        episodes=12,
        namespace="kq-pool-over",
        queue="lq",
        output=tmp_path / "out",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "can never be admitted by queue lq (ClusterQueue cq-pool-over)" in result.stderr
    assert "runs 12 pods at once" in result.stderr and "nothing was created" in result.stderr
    assert "lower --size or ask for more quota" in result.stderr
    assert run_labelled(cluster, "kq-pool-over", "jobs") == []
    assert run_labelled(cluster, "kq-pool-over", "secrets") == []


def test_a_detached_queued_run_is_attached_and_its_admission_measured(
    real_cluster, kueue, tmp_path
):
    kubectl, cluster = real_cluster
    kueue.queue("kq-detach", "lq", "cq-detach", QUOTA)
    output = tmp_path / "out"
    flags = dict(count=2, namespace="kq-detach", queue="lq", output=output, quiet=True)
    submitted = run_tool(cluster, kubectl, "run", detach=True, **flags)
    assert submitted.returncode == 0, submitted.stderr
    assert "attach --output" in submitted.stdout + submitted.stderr
    assert not (output / "results.json").exists()
    run_id = load(output / "receipt.json")["run_id"]
    job = cluster.get("jobs", "kq-detach", f"rollout-{run_id}")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
    attached = run_tool(cluster, kubectl, "attach", output=output, quiet=True)
    assert attached.returncode == 0, attached.stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == 2 and results["attach"]["batches_attached"] == 1
    (workload,) = load(output / "workloads.json")["items"]
    admission = results["admission"]
    assert admission["quota_reserved_at"] == condition_time(workload, "QuotaReserved")
    assert admission["admitted_at"] == condition_time(workload, "Admitted")
    assert admission["queued_at"] <= admission["quota_reserved_at"] <= admission["admitted_at"]
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert run_labelled(cluster, "kq-detach", "jobs") == []


def test_a_queued_pool_closed_early_stays_stopped(real_cluster, kueue, tmp_path, monkeypatch):
    """Kueue resumes a suspended Job whose Workload is admitted: a queued pool closed before its
    episodes were all served (and not cleaned up) deactivates its Workload, so no sandbox starts
    again and the quota is given back."""
    import rl_batch_demo

    kubectl, cluster = real_cluster
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)
    kueue.queue("kq-stop", "lq", "cq-stop", {"cpu": "700m", "memory": "2Gi"})
    output = tmp_path / "p"
    flags = dict(kubectl=kubectl, namespace="kq-stop", queue="lq", cleanup=False)
    with rl_batch_demo.open_pool(output=str(output), size=2, episodes=6, **flags) as pool:
        with pool.claim(timeout=180) as sandbox:
            assert sandbox.run(["echo", "one"]).stdout == "one\n"
            sandbox.finish(reward=1.0)
    run_id = load(output / "receipt.json")["run_id"]
    time.sleep(15)  # Kueue reconciles a resumed Job within a second or two
    job = cluster.get("jobs", "kq-stop", f"pool-{run_id}")
    assert job["spec"]["suspend"] is True
    live = [
        pod["metadata"]["name"]
        for pod in cluster.list("pods", "kq-stop")
        if not pod["metadata"].get("deletionTimestamp")
        and pod["status"].get("phase") in ("Pending", "Running")
    ]
    assert live == []
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert run_labelled(cluster, "kq-stop", "jobs") == []


HELD_TASK_SCRIPT = TASK_EPISODE_HEAD + "time.sleep(6)\nemit('reward', reward=task['x'])\n"


def test_a_queued_run_stopped_by_ctrl_c_stays_stopped_and_attach_lets_kueue_resume_it(
    real_cluster, kueue, tmp_path
):
    kubectl, cluster = real_cluster
    kueue.queue("kq-int", "lq", "cq-int", QUOTA)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{x}", "x": x}) + "\n" for x in (1, 2)))
    output = tmp_path / "out"
    process = start_tool(
        cluster,
        kubectl,
        "run",
        namespace="kq-int",
        queue="lq",
        tasks=tasks,
        episode_script=write_script(tmp_path, HELD_TASK_SCRIPT),
        retries=1,
        output=output,
        quiet=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(
            pod["status"].get("phase") == "Running" for pod in cluster.list("pods", "kq-int")
        ):
            assert time.monotonic() < deadline and process.poll() is None, "no pod ran"
            time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    run_id = load(output / "receipt.json")["run_id"]
    time.sleep(12)  # Kueue would have resumed the Job by now, its Workload admitted
    job = cluster.get("jobs", "kq-int", f"rollout-{run_id}")
    assert job["spec"]["suspend"] is True, stderr
    assert [
        pod["metadata"]["name"]
        for pod in cluster.list("pods", "kq-int")
        if not pod["metadata"].get("deletionTimestamp")
        and pod["status"].get("phase") in ("Pending", "Running")
    ] == []
    attached = run_tool(cluster, kubectl, "attach", output=output, quiet=True)
    assert attached.returncode == 0, attached.stderr
    results = load(output / "results.json")
    lines = [json.loads(line) for line in (output / "rewards.jsonl").read_text().splitlines()]
    assert sorted(line["reward"] for line in lines if line["valid"]) == [1, 2], lines
    assert load(output / "client.json")["attached"]["resumed_jobs"] == [f"rollout-{run_id}"]
    assert results["admission"]["admitted_at"] is not None
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
