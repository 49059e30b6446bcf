"""End to end, streaming rollouts: each rewards.jsonl line written as its episode ends (seen by
a reader while held episodes still run, released by the test, never by a timer), the first K of
N (--need: the Job's successPolicy, the rest cancelled), a deadline per episode
(--episode-timeout: the pod's activeDeadlineSeconds), and `valid` on every line. Real kubectl
against the emulator, whose Job controller and kubelet follow successPolicy and
activeDeadlineSeconds as the real ones do; the scenarios marked on_tiers run on the real control
plane and on a real node (kubelet, containerd, runc) too.

The held episodes (HELD_EPISODE) wait for a file that never comes unless the test writes it: only
the pod's deadline or the Job's successPolicy ends them otherwise. Each is PID 1 of its container
and installs no SIGTERM handler, so the kernel never delivers the kubelet's SIGTERM to it: it is
killed at its grace period's end (30 s), exit code 137. The real node's runs (as root):
`flock /tmp/real-node.lock python -m pytest -n 0 -m real_node tests/e2e/test_e2e_streaming.py`.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from xml.etree import ElementTree
from typing import Any

import pytest

import all_names as rl_batch
from conftest import on_tiers
from e2e_support import (
    PRODUCT,
    REPO_ROOT,
    TASK_EPISODE_HEAD,
    assert_cleanup_works,
    documentation,
    emulators,
    load,
    run_namespaces,
    run_tool,
    running_pods,
    start_tool,
    wait_for,
    write_script,
)

pytestmark = pytest.mark.e2e

# An episode whose task says "hold" waits, after `ready`, until a file named `release` appears in
# its workspace (the test writes it into the pod's emptyDir on the node); the others end at once.
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

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any):
    kubectl = require_e2e("1.35")
    with emulators(tmp_path, timing={"job_backoff_base": 0.5}) as make:
        yield kubectl, make


def held_run(tmp_path: Path, tasks: list[dict], **flags: Any) -> tuple[dict[str, Any], Path]:
    """The flags of a `run` of `tasks` by the held episode (more `flags` added or replacing these),
    and its output directory."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    output = tmp_path / "out"
    return {
        "output": output,
        "quiet": True,
        "tasks": tmp_path / "tasks.jsonl",
        "episode_script": write_script(tmp_path, HELD_EPISODE),
        **flags,
    }, output


def lines_of(output: Path) -> list[dict]:
    path = output / "rewards.jsonl"
    text = path.read_text() if path.exists() else ""
    # A reader tailing the file sees whole lines only: each is written and flushed at once.
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def pod_of_index(emulator: Any, index: int) -> dict | None:
    for pod in emulator.list("pods"):
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get("batch.kubernetes.io/job-completion-index") == str(index):
            return pod
    return None


def release(emulator: Any, index: int) -> None:
    """Let the held episode of this index end, on the emulator."""
    pod = wait_for(lambda: pod_of_index(emulator, index), what=f"the pod of episode {index}")
    release_pod(emulator, "emulator", pod)


def release_pod(cluster: Any, tier_name: str, pod: dict) -> None:
    """Let a held episode end: the file its script waits for, in its pod's emptyDir on the node
    (the emulator's kubelets and the node agent keep their pods' volumes alike; a real kubelet
    keeps them by their plugin's name)."""
    uid = pod["metadata"]["uid"]
    if tier_name == "real_node":
        volumes = (
            cluster.node_dir / "kubelet" / "pods" / uid / "volumes" / "kubernetes.io~empty-dir"
        )
    else:
        node = cluster if tier_name == "emulator" else cluster.agent
        volumes = node.workdir / "pods" / uid / "volumes"
    wait_for((volumes / "workspace").is_dir, what=f"the workspace of {pod['metadata']['name']}")
    (volumes / "workspace" / "release").write_text("go")


DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def events_about(output: Path, pod: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of each event about this pod, as events.json saved them."""
    return [
        (event.get("type"), event.get("reason"), event.get("message"))
        for event in load(output / "events.json")["items"]
        if (event.get("involvedObject") or event.get("regarding") or {}).get("name") == pod
    ]


def terminated(pod: dict) -> dict:
    """The state of the pod's one container, once it ended."""
    (status,) = pod["status"]["containerStatuses"]
    return status["state"]["terminated"]


@pytest.fixture
def emulator_tier(cluster: Any) -> tuple[str, Any]:
    """(kubectl 1.35, an emulator whose Job back-off is short): this module's emulator tier."""
    kubectl, make = cluster
    return kubectl, make()


def test_each_line_lands_as_its_episode_ends_and_the_file_ends_in_index_order(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    emulator = make()
    tasks = [
        {"id": "slow", "x": 1, "hold": True},
        {"id": "fast", "x": 2},
        {"id": "late", "x": 3, "hold": True},
        {"id": "bad", "x": 4, "fail": True},
    ]
    # No --allow-failures: the agent that gives up (episode 3) is a sample, which ends nothing.
    flags, output = held_run(tmp_path, tasks)
    process = start_tool(emulator, kubectl, "run", **flags)
    try:
        # Episodes 1 and 3 end at once and their lines land while 0 and 2 are still held.
        early = wait_for(
            lambda: len(lines_of(output)) >= 2 and lines_of(output), what="the first two lines"
        )
        assert sorted(line["index"] for line in early) == [1, 3]
        assert process.poll() is None
        release(emulator, 2)
        wait_for(lambda: len(lines_of(output)) >= 3, what="episode 2's line")
        streamed = lines_of(output)
        assert streamed[:2] == early  # written once, never rewritten
        assert streamed[2]["index"] == 2 and process.poll() is None
        release(emulator, 0)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    final = lines_of(output)
    assert [line["index"] for line in final] == [0, 1, 2, 3]
    # The same lines as written while the batch ran, now in index order.
    by_index = {line["index"]: line for line in streamed}
    assert all(final[index] == by_index[index] for index in by_index)
    assert [(line["reward"], line["failure_class"], line["valid"]) for line in final] == [
        (1, None, True),
        (2, None, True),
        (3, None, True),
        (None, "episode", True),
    ]
    results = load(output / "results.json")
    delivery = results["reward_delivery"]
    # Three lines were read above while the run went on. The last episode's may come from the
    # evidence read after the end instead: the Job completes as its pod ends, and on a loaded
    # machine the tool can see that before it has read the pod's log (it is then written at once).
    assert delivery["lines"] == 4 and delivery["streamed"] >= 3
    assert delivery["streamed"] + delivery["written_after_the_end"] == 4
    assert 0 < results["first_reward_seconds"] <= results["batch_to_all_rewards_seconds"] + 1
    assert (
        results["reward_delivery_lag_p50_seconds"]
        <= results["reward_delivery_lag_p99_seconds"]
        <= results["reward_delivery_lag_max_seconds"]
    )
    assert results["reward_delivery_lag_p50_seconds"] >= 0
    assert "need" not in results and "kth_reward_seconds" not in results
    assert results["cancelled_episodes"] == 0  # in every rollout's results.json
    assert load(output / "client.json")["reward_deliveries"]
    assert "rewards delivered: 3 lines" in (output / "ramp.svg").read_text()
    # `report` recomputes the same delivery figures from the saved files.
    report = run_tool(emulator, kubectl, "report", output, quiet=True)
    assert report.returncode == 0, report.stderr
    printed = json.loads(report.stdout)
    assert printed["first_reward_seconds"] == results["first_reward_seconds"]
    assert printed["reward_delivery_lag_p99_seconds"] == results["reward_delivery_lag_p99_seconds"]


@on_tiers("emulator", "real_cluster", "real_node")
def test_need_ends_the_batch_at_k_successes_and_cancels_the_stragglers(
    tier: Any, tier_name: str, tmp_path: Path
) -> None:
    kubectl, cluster = tier
    # Every episode held until all four run; then 1 and 2 are let go, and 0 and 3 never are: only
    # the Job's successPolicy can end them.
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
                release_pod(cluster, tier_name, pod)
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "--need 2 met: 2 of 4 episodes succeeded, 2 cancelled, 0 failed" in stderr
    submitted = load(output / "job-submitted.json")["spec"]
    assert submitted["successPolicy"] == {"rules": [{"succeededCount": 2}]}
    assert submitted["completionMode"] == "Indexed" and submitted["maxFailedIndexes"] == 2
    lines = lines_of(output)
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
    assert results["accepted_partial"] is False and results["successful_episodes"] == 2
    assert results["job_end"] == {"condition": "Complete", "reason": "SuccessPolicy"}
    assert 0 < results["first_reward_seconds"] <= results["kth_reward_seconds"]

    # The stragglers as a real kubelet leaves them: deleted by the Job controller, stopped
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
    # The timeline draws all 4 episodes, each cancelled one marked as such, as far as it got.
    timeline = ElementTree.fromstring((output / "timeline.svg").read_text())
    marks = sorted(
        text.findtext(f"{SVG}title")
        for text in timeline.iter(f"{SVG}text")
        if text.findtext(f"{SVG}title")
    )
    cancelled = sorted(line["pod"] for line in lines if line["failure_class"] == "cancelled")
    assert [mark.split(" ", 2)[:2] for mark in marks] == [[pod, "cancelled:"] for pod in cancelled]
    rows = {
        rect.findtext(f"{SVG}title").split()[0]
        for rect in timeline.iter(f"{SVG}rect")
        if rect.findtext(f"{SVG}title")
    }
    assert rows == {line["pod"] for line in lines}
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


def test_need_missed_fails_the_run_with_every_episode_in_rewards_jsonl(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    # --need 2 of 3 absorbs one lost episode (maxFailedIndexes 1); two are lost (the fault ends
    # their containers with 3: the launcher's own failure, the infrastructure's), so the Job fails
    # with only 1 valid line.
    emulator = make(fail_pods=[1, 2])
    tasks = [{"id": "ok", "x": 1}] + [{"id": n, "x": 1} for n in (1, 2)]
    flags, output = held_run(tmp_path, tasks, need=2)
    result = run_tool(emulator, kubectl, "run", **flags, process_timeout=120)
    # Not met: the run fails as a batch past its allowance does, every episode in rewards.jsonl.
    assert result.returncode == 1, result.stderr
    assert (
        "Error: 1 of 3 episodes have a valid line, fewer than --need 2 (2 lost: 2 infrastructure "
        "failures)" in result.stderr
    )
    assert "rewards.jsonl lists every episode with its class" in result.stderr
    assert " met:" not in result.stderr
    assert [(line["failure_class"], line["valid"]) for line in lines_of(output)] == [
        (None, True),
        ("infrastructure", False),
        ("infrastructure", False),
    ]
    conditions = load(output / "job.json")["status"]["conditions"]
    assert [(c["type"], c.get("reason")) for c in conditions][-1] == (
        "Failed",
        "MaxFailedIndexesExceeded",
    )
    assert not (output / "results.json").exists()


def test_need_counts_an_episodes_own_failure_as_a_valid_line(cluster: Any, tmp_path: Path) -> None:
    """The agent that gives up ends its pod 0 (its launcher records why): the Job's successPolicy
    counts it, as the tool does, among the K valid lines --need asks for."""
    kubectl, make = cluster
    emulator = make()
    tasks = [
        {"id": "gives-up", "x": 1, "fail": True},
        {"id": "ok", "x": 2},
        {"id": "held", "x": 3, "hold": True},
    ]
    flags, output = held_run(tmp_path, tasks, need=2)
    result = run_tool(emulator, kubectl, "run", **flags, process_timeout=120)
    assert result.returncode == 0, result.stderr
    assert (
        "--need 2 met: 1 of 3 episodes succeeded, 1 failed on their own (valid), 1 cancelled, "
        "0 failed" in result.stderr
    )
    assert [(line["failure_class"], line["valid"]) for line in lines_of(output)] == [
        ("episode", True),
        (None, True),
        ("cancelled", False),
    ]
    results = load(output / "results.json")
    assert results["job_end"] == {"condition": "Complete", "reason": "SuccessPolicy"}
    assert (results["failed_episodes"], results["lost_episodes"]) == (1, 0)


def test_an_episode_past_its_timeout_is_a_sample_never_retried_while_a_loss_is(
    cluster: Any, tmp_path: Path
) -> None:
    """--episode-timeout with --retries: the hung agent's launcher stops it at its own time and ends
    its pod 0, an `episode` failure (valid) the Job never retries; the episode evicted from its node
    is the infrastructure's loss, which the Job retries."""
    kubectl, make = cluster
    emulator = make(replace_pod=[1])  # the first pod of episode 1 is evicted while it runs
    tasks = [{"id": "stuck", "x": 1, "hold": True}, {"id": "evicted", "x": 2}]
    flags, output = held_run(tmp_path, tasks, episode_timeout=3, retries=1)
    result = run_tool(emulator, kubectl, "run", **flags, process_timeout=120)
    assert result.returncode == 0, result.stderr
    spec = load(output / "job-submitted.json")["spec"]
    assert spec["backoffLimitPerIndex"] == 1
    # The launcher keeps the episode's 3 s; the pod's own deadline is a backstop past them.
    assert spec["template"]["spec"]["activeDeadlineSeconds"] == 3 + 30
    annotations = spec["template"]["metadata"]["annotations"]
    assert (
        annotations[rl_batch.DEADLINE_ANNOTATION]
        == "--episode-timeout 3 + 30 s for the pod to start"
    )
    stuck, evicted = lines_of(output)
    assert (stuck["failure_class"], stuck["valid"], stuck["attempts"]) == ("episode", True, 1)
    assert stuck["failure"] == (
        "ran out of time: still running 3 s after it started (--episode-timeout), stopped by its "
        "launcher"
    )
    assert (evicted["failure_class"], evicted["attempts"], evicted["reward"]) == (None, 2, 2)
    assert evicted["earlier_attempts"][0]["failure_class"] == "infrastructure"
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert len(pods) == 3  # the hung one once, the evicted one twice
    status = pods[stuck["pod"]]["status"]
    assert status["phase"] == "Succeeded" and "reason" not in status
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    log = (output / f"{stuck['pod']}.log").read_text()
    assert '"timed_out": true' in log and '"timeout_seconds": 3' in log
    results = load(output / "results.json")
    assert results["accepted_partial"] is False and results["lost_episodes"] == 0
    assert results["job_end"] == {"condition": "Complete", "reason": None}
    # The hung episode's running time is drawn, up to its launcher's stop (about its 3 s).
    timeline = ElementTree.parse(output / "timeline.svg").getroot()
    (hung,) = [
        title.text
        for title in timeline.iter("{http://www.w3.org/2000/svg}title")
        if (title.text or "").startswith(f"{stuck['pod']} ran with no reward: ")
    ]
    assert 2.5 <= float(hung.split(": ")[1].split()[0]) <= 6, hung


def test_need_refused_before_anything_is_created_on_a_cluster_older_than_1_33(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    emulator = make(server_version="1.32")
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", output=output, quiet=True, count=3, need=2)
    assert result.returncode == 1
    assert (
        "--need needs Kubernetes >= 1.33" in result.stderr
        and "serves 1.32; nothing was created" in result.stderr
    )
    assert run_namespaces(emulator) == []


def readme_trainer_loop() -> tuple[str, list[list[str]]]:
    """README's trainer loop: its trainer_loop.py, and the two command lines shown under it
    (the batch started in the background, then the trainer), each split as the shell would."""
    readme = (REPO_ROOT / "README.md").read_text()
    found = re.search(r"```python\n(# trainer_loop\.py.*?)```\n\n((?:    [^\n]*\n)+)", readme, re.S)
    assert found, "README's trainer loop and the command lines under it"
    return found[1], [shlex.split(line) for line in found[2].splitlines()]


def test_readme_trainer_loop_masks_what_it_must_not_learn_from(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    emulator = make()
    source, (run_line, trainer_line) = readme_trainer_loop()
    assert run_line[:3] == ["python3", "rl_batch_demo.py", "run"] and run_line[-1] == "&"
    assert trainer_line[:2] == ["python3", "trainer_loop.py"]
    argv = run_line[2:-1]
    count, need = (int(argv[argv.index(flag) + 1]) for flag in ("--count", "--need"))
    write_script(tmp_path, source, "trainer_loop.py")
    # The README's command lines as written, in a directory where their relative paths (--output
    # rl-step-18, the trainer's rl-step-18/rewards.jsonl) hold, `python3` being the Python under
    # test and `kubectl` on PATH the emulator's. Added only what must be: --tasks and
    # --episode-script in place of the built-in episode, one task per episode (so --count still
    # agrees), count - need of them held and never released. Every built-in episode ends at once,
    # so how many the successPolicy would cut is a race; the held ones are stragglers that only
    # the Job's successPolicy can end.
    (tmp_path / "tasks.jsonl").write_text(
        "".join(json.dumps({"id": n, "x": 1, "hold": n >= need}) + "\n" for n in range(count))
    )
    write_script(tmp_path, HELD_EPISODE)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kubectl").symlink_to(kubectl)
    env = dict(emulator.env(), PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    batch = subprocess.Popen(
        [
            sys.executable,
            str(PRODUCT),
            *argv,
            "--tasks",
            "tasks.jsonl",
            "--episode-script",
            "episode.py",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    trainer = subprocess.Popen(
        [sys.executable, *trainer_line[1:]], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        _, err = batch.communicate(timeout=300)
        assert batch.returncode == 0, err
        printed, _ = trainer.communicate(timeout=60)
    finally:
        for process in (batch, trainer):
            if process.poll() is None:
                process.kill()
    assert f"--need {need} met: {need} of {count} episodes succeeded" in err
    # The K successes are learnt from; the cancelled stragglers are masked, never a fake zero.
    assert printed.strip() == f"{need} samples, {count - need} masked"


# --------------------------------------------------------------------------
# From Python: on_reward and stream_batch see each line before the run ends.


@pytest.fixture
def python_cluster(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(kubectl, emulator) with the emulator's environment set for an in-process run."""
    kubectl, make = cluster
    emulator = make()
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    return kubectl, emulator


HELD_AND_FAST = [{"id": "held", "x": 1, "hold": True}, {"id": "fast", "x": 2}]


def python_run(kubectl: str, tmp_path: Path) -> dict:
    return dict(
        output=str(tmp_path / "out"),
        kubectl=kubectl,
        episode_script=write_script(tmp_path, HELD_EPISODE),
    )


def test_on_reward_is_told_each_line_while_the_batch_runs(
    python_cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = python_cluster
    told: list[dict] = []
    threads: list[int] = []

    def on_reward(line: dict) -> None:
        told.append(line)
        threads.append(threading.get_ident())
        if line["index"] == 1:
            # Episode 0 is still held: its line can only come once this test releases it.
            assert [row["index"] for row in lines_of(tmp_path / "out")] == [1]
            release(emulator, 0)
            # Its pod ends while this callback has not returned: its line waits for the callback,
            # which runs in the thread that follows the batch.
            wait_for(
                lambda: (
                    (pod_of_index(emulator, 0) or {}).get("status", {}).get("phase") == "Succeeded"
                ),
                what="episode 0's pod to succeed",
            )
            assert [row["index"] for row in lines_of(tmp_path / "out")] == [1]

    results = rl_batch.run_batch(
        HELD_AND_FAST, on_reward=on_reward, **python_run(kubectl, tmp_path)
    )
    assert [line["index"] for line in told] == [1, 0]
    # Called from the caller's own thread, the one that called run_batch().
    assert threads == [threading.get_ident()] * 2
    assert results["rewards"] == sorted(told, key=lambda line: line["index"])
    assert [line["valid"] for line in told] == [True, True]


def test_stream_batch_yields_lines_as_they_land_and_returns_the_results(
    python_cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = python_cluster
    seen: list[dict] = []

    def trainer() -> Any:
        results = yield from rl_batch.stream_batch(HELD_AND_FAST, **python_run(kubectl, tmp_path))
        return results

    stream = trainer()
    for line in stream:
        seen.append(line)
        if len(seen) == 1:
            assert line["index"] == 1
            release(emulator, 0)
    assert [line["index"] for line in seen] == [1, 0]
    # A plain for loop reads the results back from the run's directory.
    saved = rl_batch.batch_results(tmp_path / "out")
    assert saved["rewards"] == sorted(seen, key=lambda line: line["index"])
    assert saved["first_reward_seconds"] > 0
    # `yield from` hands the generator's return value on.
    gen = rl_batch.stream_batch(
        HELD_AND_FAST, **dict(python_run(kubectl, tmp_path), output=str(tmp_path / "o2"))
    )
    first = next(gen)
    release(emulator, 0)  # the second run's held episode
    rest = []
    with pytest.raises(StopIteration) as stopped:
        while True:
            rest.append(next(gen))
    assert stopped.value.value["rewards"] == sorted([first, *rest], key=lambda line: line["index"])


def job_stopped(emulator: Any, namespace: str) -> bool:
    """The run's Job is suspended and none of its pods runs any more."""
    jobs = [job for job in emulator.list("jobs") if job["metadata"]["namespace"] == namespace]
    pods = [pod for pod in emulator.list("pods") if pod["metadata"]["namespace"] == namespace]
    return (
        bool(jobs)
        and all(job["spec"].get("suspend") for job in jobs)
        and all(pod["status"].get("phase") in ("Succeeded", "Failed") for pod in pods)
    )


def assert_stopped_and_kept(emulator: Any, output: Path, err: str) -> str:
    """The run stopped its pods and kept what an attach would need; its namespace is there,
    named on stderr with the cleanup command. The namespace."""
    namespace = load(output / "receipt.json")["namespace"]
    assert [ns["metadata"]["name"] for ns in run_namespaces(emulator)] == [namespace]
    assert "Suspended Job rollout: its running pods were stopped" in err, err
    assert f"receipt.json names namespace {namespace}" in err and "Clean up with:" in err, err
    wait_for(lambda: job_stopped(emulator, namespace), what="the suspended Job's pods to stop")
    assert (output / "run.json").exists() and (output / "pods.json").exists()
    assert [line["index"] for line in lines_of(output)] == [1]
    return namespace


def assert_stopped_and_cleaned(emulator: Any, output: Path, err: str) -> None:
    """The run stopped its pods, saved its evidence, and deleted its namespace (cleanup)."""
    namespace = load(output / "receipt.json")["namespace"]
    assert run_namespaces(emulator) == []
    assert f"Deleted test namespace: {namespace} (cleanup=True)." in err, err
    assert "Clean up with:" not in err and "Traceback" not in err, err
    assert (output / "run.json").exists() and (output / "pods.json").exists()
    assert [line["index"] for line in lines_of(output)] == [1]


def test_a_callback_that_raises_stops_the_run_as_ctrl_c_does(
    python_cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    kubectl, emulator = python_cluster

    def on_reward(line: dict) -> None:
        raise ValueError("the trainer's buffer is full")

    with pytest.raises(ValueError, match="the trainer's buffer is full"):
        rl_batch.run_batch(
            HELD_AND_FAST, on_reward=on_reward, cleanup=False, **python_run(kubectl, tmp_path)
        )
    output = tmp_path / "out"
    err = capfd.readouterr().err
    assert "on_reward raised ValueError: the trainer's buffer is full; the run stopped." in err
    assert_stopped_and_kept(emulator, output, err)
    assert not (output / "results.json").exists()
    assert_cleanup_works(emulator, kubectl, output)


def test_a_keyboard_interrupt_with_cleanup_leaves_no_namespace(
    python_cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    kubectl, emulator = python_cluster

    def on_reward(line: dict) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the trainer's own code runs

    with pytest.raises(KeyboardInterrupt):
        rl_batch.run_batch(HELD_AND_FAST, on_reward=on_reward, **python_run(kubectl, tmp_path))
    err = capfd.readouterr().err
    assert err.startswith("Interrupted."), err
    assert_stopped_and_cleaned(emulator, tmp_path / "out", err)


def test_a_break_out_of_the_stream_stops_the_run_and_cleans_up(
    python_cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    kubectl, emulator = python_cluster
    for line in rl_batch.stream_batch(HELD_AND_FAST, **python_run(kubectl, tmp_path)):
        assert line["index"] == 1
        break  # the held episode is never released: only the stop ends the run
    err = capfd.readouterr().err
    assert "stream_batch() was closed before the batch ended." in err, err
    assert "on_reward" not in err and "StreamClosed" not in err, err
    assert_stopped_and_cleaned(emulator, tmp_path / "out", err)


def test_a_dropped_stream_leaks_nothing(
    python_cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    kubectl, emulator = python_cluster
    stream = rl_batch.stream_batch(HELD_AND_FAST, **python_run(kubectl, tmp_path))
    assert next(stream)["index"] == 1
    del stream  # held in a variable, then dropped: collecting it closes it
    gc.collect()
    assert_stopped_and_cleaned(emulator, tmp_path / "out", capfd.readouterr().err)
    assert not [t for t in threading.enumerate() if t.name == "rl-batch-demo stream_batch"]


# A trainer whose loop waits on stream_batch() for its next line when Ctrl-C comes.
TRAINER = """
import sys
sys.path.insert(0, sys.argv[1])
import rl_batch_demo
try:
    for line in rl_batch_demo.stream_batch(
        [{"id": "held", "x": 1, "hold": True}, {"id": "fast", "x": 2}],
        output=sys.argv[2], kubectl=sys.argv[3], episode_script=sys.argv[4],
    ):
        print("line", line["index"], flush=True)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_ctrl_c_while_a_trainer_waits_on_the_stream_stops_the_run_and_cleans_up(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    emulator = make()
    output = tmp_path / "out"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(REPO_ROOT / "src"), str(output), kubectl]
        + [str(write_script(tmp_path, HELD_EPISODE))],
        env=emulator.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert trainer.stdout.readline() == "line 1\n"
        trainer.send_signal(signal.SIGINT)
        out, err = trainer.communicate(timeout=120)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 130, err
    # In next() the interrupt stops the run ("Interrupted."); in the loop's body it closes the
    # generator on its way out: either way the run stops.
    assert err.startswith(("Interrupted. ", "stream_batch() was closed before")), err
    assert_stopped_and_cleaned(emulator, output, err)


def test_a_closed_stream_without_cleanup_keeps_what_an_attach_needs(
    python_cluster: Any, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    kubectl, emulator = python_cluster
    stream = rl_batch.stream_batch(HELD_AND_FAST, cleanup=False, **python_run(kubectl, tmp_path))
    assert next(stream)["index"] == 1
    stream.close()
    output = tmp_path / "out"
    err = capfd.readouterr().err
    assert "stream_batch() was closed before the batch ended." in err, err
    assert_stopped_and_kept(emulator, output, err)
    assert load(output / "receipt.json")["job_uid"]
    assert_cleanup_works(emulator, kubectl, output)


def test_readme_stream_example_runs_as_written(
    python_cluster: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    kubectl, emulator = python_cluster
    blocks = re.findall(r"```python\n(.*?)```", documentation(), flags=re.S)
    example = next(block for block in blocks if block.startswith("# stream.py"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kubectl").symlink_to(kubectl)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr()
    assert printed.err == ""  # quiet: `need=3 met` is in the results
    learnt, need, settled = printed.out.split()
    lines = [
        (line["failure_class"], line["failure"]) for line in lines_of(tmp_path / "runs" / "step-18")
    ]
    # Every episode of the built-in demo succeeds, unless the Job cancelled it once 3 had.
    assert need == "3" and settled == "4" and 3 <= int(learnt) <= 4, lines
