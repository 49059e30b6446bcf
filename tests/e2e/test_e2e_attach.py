"""End to end, a trainer that crashes picks its batch up again: one follower per run (a lock
file in its directory, a lease on its namespace, shown by `list`), `run --detach`, and `attach`
after the client was killed with SIGKILL at each point of a run, compared episode for episode
with an uninterrupted run of the same tasks. Real kubectl against the emulator.

The held episodes (HELD_EPISODE) wait after `ready` until the test writes a file named `release`
into their workspace on the node, so the test chooses when each ends.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import all_names as rl_batch
from conftest import on_tiers
from e2e_support import (
    PRODUCT,
    TASK_EPISODE_HEAD,
    documentation,
    load,
    run_tool,
    tool,
    start_tool,
    wait_for,
    write_script,
)

pytestmark = pytest.mark.e2e

HELD_EPISODE = (
    TASK_EPISODE_HEAD
    + """\
while task.get("hold") and not os.path.exists("/workspace/release"):
    time.sleep(0.05)
if task.get("fail"):
    sys.exit("the agent gave up")
emit("reward", reward=task["x"])
"""
)

FOLLOWER = "rl-batch-demo.agc/follower"


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any):
    from e2e_support import emulators

    kubectl = require_e2e("1.35")
    with emulators(tmp_path, timing={"job_backoff_base": 0.5}) as make:
        yield kubectl, make()


def held_flags(tmp_path: Path, name: str, tasks: list[dict], **flags: Any) -> dict[str, Any]:
    """A `run` of `tasks` by the held episode into tmp_path/name."""
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return {
        "output": tmp_path / name,
        "quiet": True,
        "tasks": tmp_path / f"{name}.jsonl",
        "episode_script": write_script(tmp_path, HELD_EPISODE),
        **flags,
    }


def namespace_of(output: Path) -> str:
    return load(output / "receipt.json")["namespace"]


def lease_on(emulator: Any, namespace: str) -> dict | None:
    for item in emulator.list("namespaces"):
        if item["metadata"]["name"] == namespace:
            text = (item["metadata"].get("annotations") or {}).get(FOLLOWER)
            return json.loads(text) if text else None
    return None


def release_all(cluster: Any, namespace: str, tier_name: str = "emulator") -> None:
    """Let every held episode of the namespace that is running now end: the file it waits for,
    in its pod's emptyDir on the node (the emulator's kubelets and the node agent keep them alike)."""
    for pod in cluster.list("pods", namespace):
        uid = pod["metadata"]["uid"]
        if tier_name == "real_node":  # the kubelet's own emptyDir
            volumes = cluster.node_dir / "kubelet" / "pods" / uid / "volumes"
            workspace = volumes / "kubernetes.io~empty-dir" / "workspace"
        else:
            node = cluster if tier_name == "emulator" else cluster.agent
            workspace = node.workdir / "pods" / uid / "volumes" / "workspace"
        if workspace.is_dir():
            (workspace / "release").write_text("go")


def test_the_run_is_its_one_follower_holding_a_lock_and_a_lease_list_shows(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    flags = held_flags(tmp_path, "out", [{"id": "a", "x": 1, "hold": True}, {"id": "b", "x": 2}])
    output = flags["output"]
    process = start_tool(emulator, kubectl, "run", **flags)
    try:
        wait_for(lambda: (output / "receipt.json").exists(), what="the receipt")
        namespace = namespace_of(output)
        held = wait_for(lambda: lease_on(emulator, namespace), what="the lease")
        assert (held["host"], held["pid"]) == (socket.gethostname(), process.pid)
        assert held["leaseDurationSeconds"] == 30 and held["renewPeriodSeconds"] == 10
        lock = load(output / "follower.lock")
        assert (lock["host"], lock["pid"]) == (socket.gethostname(), process.pid)
        listed = tool(emulator, kubectl, "list", "-o", "json")
        (record,) = [r for r in json.loads(listed.stdout) if r["namespace"] == namespace]
        assert record["follower"]["pid"] == process.pid and not record["follower"]["stale"]
        wait_for(lambda: emulator.list("pods", namespace), what="the pods")
        wait_for(lambda: (release_all(emulator, namespace), process.poll() is not None)[1], 60)
        assert process.returncode == 0, process.communicate()[1]
    finally:
        if process.poll() is None:
            process.kill()
    # Done following: the lease is given up and the lock file removed.
    assert lease_on(emulator, namespace) is None
    assert not (output / "follower.lock").exists()


TASKS = [
    {"id": "slow", "x": 1, "hold": True},
    {"id": "fast", "x": 2},
    {"id": "bad", "x": 3, "fail": True},
    {"id": "late", "x": 4, "hold": True},
]


def lines_of(output: Path) -> list[dict]:
    path = output / "rewards.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def outcomes(lines: list[dict]) -> list[tuple]:
    """What must be the same episode for episode, whoever followed the run."""
    return [
        (r["index"], r["task_id"], r["reward"], r["failure_class"], r["valid"], r["attempts"])
        for r in lines
    ]


def uninterrupted(emulator: Any, kubectl: str, tmp_path: Path) -> list[tuple]:
    """The same tasks run to the end by one client, none of them held."""
    tasks = [{key: value for key, value in task.items() if key != "hold"} for task in TASKS]
    flags = held_flags(tmp_path, "whole", tasks)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    return outcomes(lines_of(flags["output"]))


def killed_run(emulator: Any, kubectl: str, tmp_path: Path) -> Path:
    """A run of TASKS killed with SIGKILL once the two unheld episodes have their lines."""
    flags = held_flags(tmp_path, "out", TASKS)
    process = start_tool(emulator, kubectl, "run", **flags)
    try:
        wait_for(lambda: len(lines_of(flags["output"])) >= 2, what="the first two lines")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    return flags["output"]


@pytest.fixture
def emulator_tier(cluster: Any) -> Any:
    """(kubectl 1.35, an emulator whose Job back-off is short): this module's emulator tier."""
    return cluster


@on_tiers("emulator", "real_cluster", "real_node")
def test_a_run_killed_while_its_pods_run_is_attached_and_ends_as_an_uninterrupted_one(
    tier: Any, tier_name: str, tmp_path: Path
) -> None:
    kubectl, emulator = tier
    expected = uninterrupted(emulator, kubectl, tmp_path)
    output = killed_run(emulator, kubectl, tmp_path)
    namespace = namespace_of(output)
    before = lines_of(output)
    # Nobody follows, and the held episodes' pods keep running (on the real node, containers).
    time.sleep(3)
    still = [p for p in emulator.list("pods", namespace) if p["status"].get("phase") == "Running"]
    assert len(still) == 2, [p["status"].get("phase") for p in emulator.list("pods", namespace)]
    assert (output / "follower.lock").exists() and lease_on(emulator, namespace) is not None
    process = start_tool(emulator, kubectl, "attach", output=output, quiet=True)
    try:
        held = wait_for(
            lambda: (lease_on(emulator, namespace) or {}).get("pid") == process.pid,
            what="the attach's lease",
        )
        assert held
        # A second follower is refused, naming the first.
        second = run_tool(emulator, kubectl, "attach", output=output, quiet=True)
        assert second.returncode == 1
        assert f"host {socket.gethostname()} PID {process.pid}" in second.stderr
        wait_for(
            lambda: (release_all(emulator, namespace, tier_name), process.poll() is not None)[1],
            180,
        )
        stdout, stderr = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    after = lines_of(output)
    assert outcomes(after) == expected
    # The lines written before the crash are kept as they were.
    assert all(after[line["index"]] == line for line in before)
    results = load(output / "results.json")
    assert results["episodes"] == 4 and results["failed_episodes"] == 1
    assert results["attach"]["batches_attached"] == 1
    assert results["attach"]["first_follower_alive_at"] <= results["attach"]["attach_began_at"]
    client = load(output / "client.json")
    assert client["submitted_at"] is None and "submitted_at" in client["unknown"]
    assert client["attached"]["replayed_lines"] == len(before)
    attached = client["attached"]
    assert attached["first_follower_alive_at"] <= attached["attach_began_at"]
    assert attached["first_follower_evidence"].startswith(("its lease", "its lock file", "a line"))
    assert results["reward_delivery_lag_p50_seconds"] is None
    # `report` recomputes an attached run from its files alone, the unknowns unknown.
    report = run_tool(emulator, kubectl, "report", output, quiet=True)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["successful_episodes"] == results["successful_episodes"]
    assert lease_on(emulator, namespace) is None and not (output / "follower.lock").exists()


# A kubectl that stops where the test wants the client killed: it blocks (until killed) on a
# create whose manifest holds BLOCK_CREATE, or on a list of the events after the end (the proxy
# refused, so the events are read by kubectl) once BLOCK_EVENTS exists; else it runs kubectl.
BLOCKING_KUBECTL = """\
import os, subprocess, sys, time
real, args = {real!r}, sys.argv[1:]
def block():
    open({reached!r}, "w").close()
    time.sleep(600)
if "proxy" in args:
    sys.exit("proxy refused by the test")
if "create" in args:
    text = sys.stdin.read()
    if {block_create!r} and {block_create!r} in text:
        block()
    done = subprocess.run([real, *args], input=text, text=True)
    sys.exit(done.returncode)
if any("events" in a for a in args) and "--watch" not in args and "-w" not in args and os.path.exists({block_events!r}):
    block()
os.execv(real, [real, *args])
"""


def blocking_kubectl(
    tmp_path: Path, kubectl: str, block_create: str = "", block_events: bool = False
) -> tuple[Path, Path]:
    """The blocking kubectl (see BLOCKING_KUBECTL) and the file it writes once it blocks."""
    reached, events = tmp_path / "blocked", tmp_path / "block-events"
    if block_events:
        events.write_text("")
    script = tmp_path / "kubectl-blocking"
    script.write_text(
        f"#!{sys.executable}\n"
        + BLOCKING_KUBECTL.format(
            real=kubectl, reached=str(reached), block_create=block_create, block_events=str(events)
        )
    )
    script.chmod(0o755)
    return script, reached


def kill_when(process: subprocess.Popen, reached: Path) -> None:
    try:
        wait_for(reached.exists, what="the kill point")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def attach(emulator: Any, kubectl: str, output: Path, **flags: Any) -> subprocess.CompletedProcess:
    return run_tool(emulator, kubectl, "attach", output=output, quiet=True, **flags)


@on_tiers("emulator", "real_cluster")
def test_a_run_killed_before_its_job_existed_never_started_and_attach_cleans_up(
    tier: Any, tier_name: str, tmp_path: Path
) -> None:
    kubectl, emulator = tier
    wrapper, reached = blocking_kubectl(tmp_path, kubectl, block_create='"kind": "Job"')
    flags = held_flags(tmp_path, "out", TASKS)
    process = start_tool(emulator, str(wrapper), "run", **flags)
    output = flags["output"]
    try:
        wait_for(reached.exists, what="the kill point")
        # The lease is claimed by a thread of its own once the namespace exists: held, then killed.
        wait_for(lambda: lease_on(emulator, namespace_of(output)), what="the lease")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    namespace = namespace_of(output)
    assert lease_on(emulator, namespace) is not None  # the namespace is there, held by the dead
    result = attach(emulator, kubectl, output)
    assert result.returncode == 1
    assert "the run never started" in result.stderr and "was deleted" in result.stderr
    assert "Traceback" not in result.stderr
    wait_for(
        lambda: namespace not in [n["metadata"]["name"] for n in emulator.list("namespaces")],
        what="the namespace deleted",
    )
    assert not (output / "results.json").exists() and not (output / "follower.lock").exists()


@on_tiers("emulator", "real_cluster")
def test_a_run_killed_between_two_rounds_is_attached_and_runs_its_second(
    tier: Any, tier_name: str, tmp_path: Path
) -> None:
    kubectl, emulator = tier
    whole = run_tool(
        emulator, kubectl, "run", output=tmp_path / "whole", count=2, rounds=2, quiet=True
    )
    assert whole.returncode == 0, whole.stderr
    wrapper, reached = blocking_kubectl(tmp_path, kubectl, block_create='"name": "rollout-2"')
    output = tmp_path / "out"
    process = start_tool(
        emulator, str(wrapper), "run", output=output, count=2, rounds=2, quiet=True
    )
    kill_when(process, reached)
    assert (output / "rollout-1" / "client.json").exists()
    assert not (output / "rollout-2" / "client.json").exists()
    result = attach(emulator, kubectl, output)
    assert result.returncode == 0, result.stderr
    results, expected = load(output / "results.json"), load(tmp_path / "whole" / "results.json")
    for key in ("episodes", "successful_episodes", "reward_sum", "rounds_measured"):
        assert results[key] == expected[key], key
    assert [r["successful_episodes"] for r in results["rounds"]] == [2, 2]
    # The second round was submitted by the attach: nothing of it is unknown.
    assert results["attach"]["batches_attached"] == 0
    assert load(output / "rollout-2" / "client.json")["submitted_at"] is not None


@on_tiers("emulator", "real_cluster")
def test_a_run_killed_after_its_job_ended_and_before_results_is_attached(
    tier: Any, tier_name: str, tmp_path: Path
) -> None:
    kubectl, emulator = tier
    expected = uninterrupted(emulator, kubectl, tmp_path)
    tasks = [{key: value for key, value in task.items() if key != "hold"} for task in TASKS]
    wrapper, reached = blocking_kubectl(tmp_path, kubectl, block_events=True)
    flags = held_flags(tmp_path, "out", tasks)
    process = start_tool(emulator, str(wrapper), "run", **flags)
    kill_when(process, reached)
    output = flags["output"]
    assert not (output / "results.json").exists()
    namespace = namespace_of(output)
    (job,) = emulator.list("jobs", namespace)
    assert any(c["type"] == "Complete" for c in job["status"].get("conditions") or [])
    result = attach(emulator, kubectl, output)
    assert result.returncode == 0, result.stderr
    assert outcomes(lines_of(output)) == expected
    client = load(output / "client.json")
    assert client["attached"]["job_ended_before_attach"] is True
    assert client["observed_at"] is None and "observed_at" in client["unknown"]


@on_tiers("emulator", "real_cluster")
def test_a_run_that_finished_while_nobody_watched_is_attached(
    tier: Any, tier_name: str, tmp_path: Path
) -> None:
    kubectl, emulator = tier
    expected = uninterrupted(emulator, kubectl, tmp_path)
    output = killed_run(emulator, kubectl, tmp_path)
    namespace = namespace_of(output)
    wait_for(
        lambda: (
            release_all(emulator, namespace, tier_name),
            any(
                c["type"] == "Complete"
                for job in emulator.list("jobs", namespace)
                for c in job["status"].get("conditions") or []
            ),
        )[1],
        what="the Job to end with nobody following",
    )
    result = attach(emulator, kubectl, output)
    assert result.returncode == 0, result.stderr
    assert outcomes(lines_of(output)) == expected
    assert load(output / "client.json")["attached"]["job_ended_before_attach"] is True
    # Attached again once results.json is there: the results as they are, nothing followed.
    again = attach(emulator, kubectl, output)
    assert again.returncode == 0, again.stderr


@pytest.fixture
def python_cluster(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(kubectl, emulator) with the emulator's environment set for an in-process run."""
    kubectl, emulator = cluster
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    return kubectl, emulator


def test_detach_returns_at_once_and_attach_batch_yields_every_line_once(
    python_cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = python_cluster
    output = tmp_path / "out"
    script = write_script(tmp_path, HELD_EPISODE)
    detached = rl_batch.run_batch(
        TASKS, output=output, kubectl=kubectl, episode_script=str(script), detach=True
    )
    namespace = detached["namespace"]
    assert detached["detached"] and f"attach --output {output}" in detached["attach"]
    assert namespace == namespace_of(output) and len(emulator.list("jobs", namespace)) == 1
    # Nobody follows a detached run: no lease, no lock.
    assert lease_on(emulator, namespace) is None and not (output / "follower.lock").exists()
    seen: list[dict] = []
    stream = rl_batch.attach_batch(output, kubectl=kubectl)
    for line in stream:
        seen.append(line)
        if len(seen) == 2:  # the two unheld episodes: now let the held ones end
            wait_for(lambda: (release_all(emulator, namespace), len(seen) >= 2)[1])
            release_all(emulator, namespace)
        if len(seen) >= 2:
            release_all(emulator, namespace)
    assert sorted(line["index"] for line in seen) == [0, 1, 2, 3]
    assert [line["replayed"] for line in seen] == [False] * 4
    saved = rl_batch.batch_results(output)
    assert outcomes(saved["rewards"]) == outcomes(sorted(seen, key=lambda line: line["index"]))
    # cleanup=True, as run_batch(): the namespace is deleted once every file is saved.
    assert namespace not in [n["metadata"]["name"] for n in emulator.list("namespaces")]
    # Attached again, a finished run replays every line, marked, and returns its results.
    again = rl_batch.attach_batch(output, kubectl=kubectl)
    replayed = []
    while True:
        try:
            replayed.append(next(again))
        except StopIteration as done:
            results = done.value
            break
    assert [line["index"] for line in replayed] == [0, 1, 2, 3]
    assert all(line["replayed"] for line in replayed)
    assert results["episodes"] == 4 and results["rewards"] == saved["rewards"]


def test_a_run_stopped_by_ctrl_c_says_how_to_attach_and_attach_resumes_it(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    expected = [line[:5] for line in uninterrupted(emulator, kubectl, tmp_path)]
    # Suspending a Job fails its running pods (the Job controller counts them, as the real one
    # does): without a retry for them a Job of the guide's backoffLimit 0 fails, resumed or not.
    flags = held_flags(tmp_path, "out", TASKS, retries=1)
    output = flags["output"]
    process = start_tool(emulator, kubectl, "run", **flags)
    try:
        wait_for(lambda: len(lines_of(output)) >= 2, what="the first two lines")
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert f"Attach with: {PRODUCT.name} attach --output {output}" in stderr or (
        f"attach --output {output}" in stderr
    )
    namespace = namespace_of(output)
    (job,) = emulator.list("jobs", namespace)
    assert job["spec"]["suspend"] is True
    process = start_tool(emulator, kubectl, "attach", output=output, quiet=True)
    try:
        wait_for(lambda: (release_all(emulator, namespace), process.poll() is not None)[1], 120)
        _, stderr = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
    after = lines_of(output)
    assert [line[:5] for line in outcomes(after)][1:3] == expected[1:3]
    if process.returncode == 0:  # the stopped pods counted failed: resumed, they ran again
        assert [line[:5] for line in outcomes(after)] == expected
        assert load(output / "client.json")["attached"]["resumed_jobs"] == ["rollout"]
    else:
        # The emulator's kubelet can end a pod stopped by the suspension 0 (its SIGTERM and the
        # sandbox's exit race): the Job counts it succeeded with its pod deleted. What it did is
        # unknowable, and said so; never "never started", never a reward made up.
        assert process.returncode == 1 and "cannot verify" in stderr, stderr
        for line in (after[0], after[3]):
            assert line["failure"].startswith("cannot verify: the Job counts this episode")
            assert (line["valid"], line["reward"]) == (False, None)


def test_a_run_whose_job_or_namespace_is_gone_cannot_be_verified_and_is_not_run_again(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    output = killed_run(emulator, kubectl, tmp_path)
    namespace = namespace_of(output)
    kept = lines_of(output)
    deleted = subprocess.run(
        [kubectl, "delete", "job", "rollout", "-n", namespace, "--wait=true"],
        env=emulator.env(),
        capture_output=True,
        text=True,
    )
    assert deleted.returncode == 0, deleted.stderr
    result = attach(emulator, kubectl, output)
    assert result.returncode == 1 and "cannot verify batch rollout" in result.stderr
    assert "Job rollout of the receipt is gone" in result.stderr
    # Never submitted again: its episodes would run twice.
    assert emulator.list("jobs", namespace) == []
    said = load(output / "attach.json")
    assert said["verdict"] == "cannot verify" and said["lines_kept"] == len(kept)
    assert said["episodes_unknown"] == sorted({0, 1, 2, 3} - {line["index"] for line in kept})
    assert lines_of(output) == kept and not (output / "results.json").exists()
    emulator_namespace_deleted = subprocess.run(
        [kubectl, "delete", "namespace", namespace, "--wait=true"],
        env=emulator.env(),
        capture_output=True,
        text=True,
    )
    assert emulator_namespace_deleted.returncode == 0
    result = attach(emulator, kubectl, output)
    assert result.returncode == 1 and f"namespace {namespace} is gone" in result.stderr
    assert "never started" not in result.stderr


def test_the_documented_trainer_killed_at_a_random_step_learns_each_reward_once(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    blocks = re.findall(r"```python\n(.*?)```", documentation(), flags=re.S)
    trainer = write_script(
        tmp_path, next(b for b in blocks if b.startswith("# trainer.py")), "trainer.py"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(kubectl)
    env = dict(emulator.env(), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = str(PRODUCT.parent)
    flags = held_flags(tmp_path, "step", TASKS)
    output = flags["output"]
    argv = [
        sys.executable,
        str(trainer),
        str(output),
        str(flags["tasks"]),
        str(flags["episode_script"]),
    ]
    learnt = Path(f"{output}.learnt.jsonl")
    crash_after = random.randint(1, 2)  # of the two episodes that end at once
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(
            lambda: learnt.exists() and len(learnt.read_text().splitlines()) >= crash_after,
            what=f"the trainer to learn from {crash_after} lines",
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    namespace = namespace_of(output)
    second = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: (release_all(emulator, namespace), second.poll() is not None)[1], 120)
        stdout, stderr = second.communicate()
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0, stderr
    indexes = [json.loads(line) for line in learnt.read_text().splitlines()]
    # Each reward learnt from once: none lost, none twice, across the crash.
    assert sorted(indexes) == [0, 1, 2, 3], (crash_after, indexes)
    # No episode ran twice: one pod per episode, each line its first attempt.
    lines = lines_of(output)
    assert [line["attempts"] for line in lines] == [1, 1, 1, 1]
    assert len(load(output / "pods.json")["items"]) == 4


def test_attach_batch_after_sigkill_yields_the_lines_before_replayed_then_the_rest_once(
    python_cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = python_cluster
    output = killed_run(emulator, kubectl, tmp_path)
    namespace = namespace_of(output)
    before = {line["index"] for line in lines_of(output)}
    assert len(before) >= 2
    seen = []
    for line in rl_batch.attach_batch(output, kubectl=kubectl):
        seen.append(line)
        release_all(emulator, namespace)
    assert sorted(line["index"] for line in seen) == [0, 1, 2, 3]
    # The lines written before come first, marked; every other once, as it lands.
    assert {line["index"] for line in seen if line["replayed"]} == before
    assert [line["replayed"] for line in seen] == [True] * len(before) + [False] * (4 - len(before))


def fake_lease(cluster: Any, kubectl: str, namespace: str, renewed_ago: float) -> None:
    """A lease on the namespace held by a client of another host, renewed `renewed_ago` s ago."""
    now = time.time() - renewed_ago
    record = rl_batch.lease_record(rl_batch.Holder("bastion-9", 4242), now, now, "/runs/x")
    patch = json.dumps({"metadata": {"annotations": {FOLLOWER: json.dumps(record)}}})
    patched = subprocess.run(
        [kubectl, "patch", "namespace", namespace, "--type=merge", "-p", patch],
        env=cluster.env(),
        capture_output=True,
        text=True,
    )
    assert patched.returncode == 0, patched.stderr


def test_a_lease_of_another_host_is_taken_over_only_by_force_and_only_once_stale(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    output = killed_run(emulator, kubectl, tmp_path)
    namespace = namespace_of(output)
    fake_lease(emulator, kubectl, namespace, 5)
    for force in (False, True):  # renewed 5 s ago: a live follower, force or not
        refused = attach(emulator, kubectl, output, force=force)
        assert refused.returncode == 1 and "host bastion-9 PID 4242" in refused.stderr
        assert re.search(
            r"last renewed \d s ago, every 10 s\); one follower per run", refused.stderr
        )
    fake_lease(emulator, kubectl, namespace, 40)  # more than 3 periods of 10 s
    refused = attach(emulator, kubectl, output)
    assert refused.returncode == 1 and "attach --force takes the lease over" in refused.stderr
    release_all(emulator, namespace)
    taken = start_tool(emulator, kubectl, "attach", output=output, quiet=True, force=True)
    try:
        wait_for(lambda: (lease_on(emulator, namespace) or {}).get("pid") == taken.pid)
        wait_for(lambda: (release_all(emulator, namespace), taken.poll() is not None)[1], 120)
        _, stderr = taken.communicate()
    finally:
        if taken.poll() is None:
            taken.kill()
    assert taken.returncode == 0, stderr
    assert load(output / "results.json")["episodes"] == 4
