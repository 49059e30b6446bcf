"""End to end: a trainer's steps, stream_batch() after stream_batch() in one process. After the
first, a step starts no kubectl process: its reads, creations, deletions and watches go through
the process's one `kubectl proxy`, started by the first step and kept. Each step saves what the
command line's run of the same batch saves, with the same verdicts, and leaves no namespace.
Real kubectl against the emulator, and the first test on the real control plane too."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import all_names as rl_batch
from conftest import on_tiers
from e2e_support import (
    REPO_ROOT,
    TASK_EPISODE_HEAD,
    load,
    run_namespaces,
    run_tool,
    wait_for,
    write_script,
)

pytestmark = pytest.mark.e2e

TASKS = [{"id": "right", "x": 1}, {"id": "wrong", "x": 0}, {"id": "crash", "x": 2, "fail": True}]
EPISODE = (
    TASK_EPISODE_HEAD
    + """\
if task.get("fail"):
    raise SystemExit("the agent gave up")
emit("reward", reward=task["x"])
"""
)
# A kubectl that counts its starts, one line each, in the file KUBECTL_STARTS names.
COUNTING_KUBECTL = '#!/bin/sh\necho "$*" >> "$KUBECTL_STARTS"\nexec "{kubectl}" "$@"\n'

# What a step saves that may differ from the command line's run of the same batch: nothing
# else may (the run's settings and client records name the run, not the verdicts).
VERDICT_FIELDS = ("task_id", "group", "member", "reward", "valid", "class", "failure")


def counting_kubectl(tmp_path: Path, kubectl: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A wrapper that counts each kubectl started through it in tmp_path/starts."""
    starts = tmp_path / "starts"
    starts.write_text("")
    monkeypatch.setenv("KUBECTL_STARTS", str(starts))
    wrapper = tmp_path / "kubectl-counting"
    wrapper.write_text(COUNTING_KUBECTL.format(kubectl=kubectl))
    wrapper.chmod(0o755)
    return wrapper


def started(tmp_path: Path) -> list[str]:
    return (tmp_path / "starts").read_text().splitlines()


def saved_files(output: Path) -> list[str]:
    """The files a run saved, each pod's log named by its index (the pod's own suffix is random)."""
    return sorted(re.sub(r"-[a-z0-9]{5}\.log$", ".log", name) for name in os.listdir(output))


def without_pods(failures: list[dict] | None) -> list[dict]:
    """The failures, without the names of their pods (random) and of their logs (named by them)."""
    return [{k: v for k, v in f.items() if k not in ("pod", "evidence")} for f in failures or []]


def verdicts(output: Path) -> list[dict]:
    lines = (output / "rewards.jsonl").read_text().splitlines()
    return [{key: json.loads(line).get(key) for key in VERDICT_FIELDS} for line in lines]


@on_tiers("emulator", "real_cluster")
def test_steps_after_the_first_start_no_kubectl_and_save_what_the_command_line_saves(
    tier: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubectl, emulator = tier
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    wrapper = counting_kubectl(tmp_path, kubectl, monkeypatch)
    script = write_script(tmp_path, EPISODE)
    per_step = []
    for step in range(3):
        before = len(started(tmp_path))
        lines = list(
            rl_batch.stream_batch(
                TASKS,
                output=str(tmp_path / f"step-{step}"),
                kubectl=str(wrapper),
                group_size=2,
                episode_script=str(script),
            )
        )
        assert sorted(line["index"] for line in lines) == list(range(6))
        per_step.append(started(tmp_path)[before:])
        assert run_namespaces(emulator) == []  # cleanup=True: deleted before the call returned
    # The first step resolves the context and starts the proxy; the others start nothing.
    assert any("proxy" in argv for argv in per_step[0]), per_step[0]
    assert len(per_step[0]) <= 2, per_step[0]
    assert per_step[1:] == [[], []], per_step
    cli_output = tmp_path / "cli"
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    result = run_tool(
        emulator,
        kubectl,
        "run",
        output=cli_output,
        tasks=tasks_file,
        group_size=2,
        episode_script=script,
        cleanup=True,
    )
    assert result.returncode == 0, result.stderr
    for step in range(3):
        output = tmp_path / f"step-{step}"
        assert saved_files(output) == saved_files(cli_output), step
        assert verdicts(output) == verdicts(cli_output)
        mine, theirs = load(output / "results.json"), load(cli_output / "results.json")
        for key in ("valid", "invalid", "rewarded", "accepted_partial"):
            assert mine.get(key) == theirs.get(key), key
        assert without_pods(mine.get("failures")) == without_pods(theirs.get("failures"))


IMAGE_TASKS = [
    {"id": "a", "x": 1, "image": "docker.io/swebench/one:1"},
    {"id": "b", "x": 1},
]


def test_a_refusal_through_the_proxy_says_what_kubectls_would(
    make_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server refuses the batch's Jobs (the server-side dry run before any is created): a
    Python caller, whose requests go through the proxy, gets the words the command line's kubectl
    prints, and the same run left behind."""
    kubectl, make = make_cluster
    emulator = make(api_errors={"count": 2, "match": "dryRun=All", "status": 403})
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    script = write_script(tmp_path, EPISODE)
    with pytest.raises(rl_batch.DemoError) as raised:
        rl_batch.run_batch(
            IMAGE_TASKS,
            output=str(tmp_path / "python"),
            kubectl=kubectl,
            group_size=2,
            episode_script=str(script),
            cleanup=False,
        )
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(task) + "\n" for task in IMAGE_TASKS))
    result = run_tool(
        emulator,
        kubectl,
        "run",
        output=tmp_path / "cli",
        tasks=tasks_file,
        group_size=2,
        episode_script=script,
        quiet=True,
    )
    assert result.returncode == 1, result.stderr
    said = str(raised.value).splitlines()[0]
    assert "refuses Job rollout-image-1 (image docker.io/swebench/one:1)" in said, said
    namespaces = [load(tmp_path / out / "receipt.json")["namespace"] for out in ("python", "cli")]
    printed = result.stderr.splitlines()[0].replace(*namespaces)
    assert printed == f"Error: {said}".replace(*namespaces)
    for namespace in namespaces:
        assert not emulator.list("jobs", namespace)


# A trainer that makes one step, says so, and waits to be killed.
TRAINER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import rl_batch_demo
lines = list(rl_batch_demo.stream_batch(
    [{"id": "a", "x": 1}], output=sys.argv[2], kubectl=sys.argv[3], episode_script=sys.argv[4]))
print("stepped", len(lines), flush=True)
time.sleep(300)
"""


def proxies_of(pid: int) -> list[int]:
    """The `kubectl proxy` processes serving the process `pid` (their socket's directory names it)."""
    mark = f"rl-batch-demo-{pid}-".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        if b"proxy" in argv and any(mark in arg for arg in argv):
            found.append(int(entry))
    return found


def test_the_kept_proxy_outlives_each_step_and_dies_with_a_killed_trainer(
    make_cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = make_cluster
    emulator = make()
    script = write_script(tmp_path, EPISODE)
    argv = [sys.executable, "-c", TRAINER, str(REPO_ROOT / "src"), str(tmp_path / "out")]
    trainer = subprocess.Popen(
        argv + [kubectl, str(script)], env=emulator.env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline() == "stepped 1\n"
        # The step's thread has ended; the proxy it started is kept for the next step.
        assert len(proxies_of(trainer.pid)) == 1
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    wait_for(lambda: not proxies_of(trainer.pid), 30, "the killed trainer's proxy to die")
