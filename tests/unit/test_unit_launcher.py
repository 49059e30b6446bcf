"""The launcher a rollout's pods run their episode through (EPISODE_LAUNCHER), run for real with
this Python: the episode's own end recorded and the process ended 0, whatever that end; and the
outcome of a launched pod, which fails only when something outside its episode ends it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import all_names as demo
from test_unit import T0, log_text, make_job, ready_event
from test_unit_rollouts import honest_log, indexed_pod


def launch(tmp_path: Path, program: str, **env: str) -> subprocess.CompletedProcess:
    """Run `program` as the episode under the launcher (its /demo made tmp_path)."""
    (tmp_path / "episode.py").write_text(program)
    launcher = demo.EPISODE_LAUNCHER.replace(
        '"/demo/episode.py"', repr(str(tmp_path / "episode.py"))
    )
    return subprocess.run(
        [sys.executable, "-B", "-c", launcher],
        env=dict(os.environ, EPISODE_ID="pod-a", **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def exit_events(stdout: str) -> list[dict]:
    return [e for e in demo.parse_events(stdout.splitlines()) if e["event"] == "episode_exit"]


@pytest.mark.parametrize(
    "program, exit_code, stderr",
    [
        ("import sys\nprint('done')\n", None, ""),
        ("import sys\nprint('done')\nsys.exit(0)\n", None, ""),
        ("import sys\nprint('done')\nsys.exit(3)\n", 3, ""),
        ("import sys\nsys.exit('the agent gave up')\n", 1, "the agent gave up"),
        ("raise ValueError('bad patch')\n", 1, "ValueError: bad patch"),
        ("import os, sys\nprint('done', flush=True)\nos._exit(5)\n", 5, ""),
    ],
)
def test_the_programs_own_end_is_recorded_and_the_process_ends_0(
    tmp_path: Path, program: str, exit_code: Any, stderr: str
) -> None:
    ended = launch(tmp_path, program)
    assert ended.returncode == 0, ended.stderr
    assert stderr in ended.stderr
    events = exit_events(ended.stdout)
    if exit_code is None:
        assert events == [] and ended.stdout.startswith("done")
        return
    assert [(e["exit_code"], e["episode_id"]) for e in events] == [(exit_code, "pod-a")]
    # After everything the program printed.
    assert ended.stdout.splitlines()[-1].startswith('{"event": "episode_exit"')


def test_the_programs_own_time_is_kept_and_a_hang_ends_0(tmp_path: Path) -> None:
    started = time.monotonic()
    ended = launch(
        tmp_path,
        "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
        EPISODE_TIMEOUT_SECONDS="1",
    )
    assert ended.returncode == 0 and time.monotonic() - started < 30
    [event] = exit_events(ended.stdout)
    assert (event["timed_out"], event["timeout_seconds"]) == (True, 1)
    # In time, nothing is recorded.
    assert (
        exit_events(launch(tmp_path, "print('quick')\n", EPISODE_TIMEOUT_SECONDS="30").stdout) == []
    )


def test_a_child_process_ends_as_it_says_only_the_episodes_own_process_is_recorded(
    tmp_path: Path,
) -> None:
    program = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "print('child', os.WEXITSTATUS(os.waitpid(pid, 0)[1]), flush=True)\n"
    )
    ended = launch(tmp_path, program)
    assert ended.returncode == 0 and exit_events(ended.stdout) == []
    assert ended.stdout.strip() == "child 7"


def test_killed_from_outside_the_process_ends_as_killed(tmp_path: Path) -> None:
    ended = launch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert ended.returncode == -9 and exit_events(ended.stdout) == []


def test_the_launcher_is_written_for_the_oldest_python_an_episode_image_may_hold() -> None:
    """An episode image brings its own Python (a SWE-bench image's may be old): no f-strings, no
    variable annotations, as far as the parser can tell."""
    import ast

    ast.parse(demo.EPISODE_LAUNCHER, feature_version=(3, 5))


def test_in_a_job_of_several_the_run_wide_index_names_the_task(tmp_path: Path) -> None:
    program = "import os, sys\nprint(os.environ['EPISODE_INDEX'], os.environ['TASK_FILE'], sys.argv[0], __name__)\n"
    ended = launch(tmp_path, program, EPISODE_INDEXES="0-1,4-5", JOB_COMPLETION_INDEX="2")
    assert ended.stdout.split() == ["4", "/tasks/4.json", str(tmp_path / "episode.py"), "__main__"]


# --------------------------------------------------------------------------
# A launched pod's outcome: its own end from its log; a failed pod is the infrastructure's.


def launched(pod: dict) -> dict:
    pod["metadata"]["annotations"][demo.EPISODE_EXIT_ANNOTATION] = "recorded"
    return pod


def exit_line(name: str, **fields: Any) -> str:
    return json.dumps(dict({"event": "episode_exit", "at": T0 + 6, "episode_id": name}, **fields))


@pytest.mark.parametrize(
    "pod, log, builtin, failure_class, failure",
    [
        (launched(indexed_pod("p", 0)), honest_log("p"), False, None, None),
        (
            launched(indexed_pod("p", 0)),
            log_text(ready_event("p", T0 + 3)) + "Traceback (most recent call last):\n"
            "  File \"/demo/episode.py\", line 3, in <module>\nKeyError: 'answer'\n"
            + exit_line("p", exit_code=1),
            False,
            "episode",
            "exited 1: KeyError: 'answer'",
        ),
        (
            # A reward, then a crash: the episode's own failure all the same.
            launched(indexed_pod("p", 0)),
            honest_log("p") + exit_line("p", exit_code=2) + "\n",
            False,
            "episode",
            "exited 2",
        ),
        (
            launched(indexed_pod("p", 0)),
            log_text(ready_event("p", T0 + 3)) + exit_line("p", timed_out=True, timeout_seconds=4),
            False,
            "episode",
            "ran out of time: still running 4 s after it started (--episode-timeout), stopped by "
            "its launcher",
        ),
        (
            launched(indexed_pod("p", 0)),
            log_text(ready_event("p", T0 + 3))
            + "baseline must fail the boundary test\n"
            + exit_line("p", exit_code=1),
            True,
            "verifier",
            "exited 1: baseline must fail the boundary test",
        ),
        (
            launched(indexed_pod("p", 0, phase="Failed", exit_code=137)),
            "",
            False,
            "infrastructure",
            "container Error with exit code 137",
        ),
        (
            launched(indexed_pod("p", 0, phase="Failed", exit_code=1)),
            '  File "<string>", line 1\nSyntaxError: invalid syntax\n',
            False,
            "infrastructure",
            "the episode launcher exited 1 (it records the episode's own end and exits 0: this "
            "is its own failure, e.g. a Python it cannot run on): SyntaxError: invalid syntax",
        ),
    ],
)
def test_a_launched_pods_outcome(
    pod: dict, log: str, builtin: bool, failure_class: Any, failure: Any
) -> None:
    row = demo.episode_row(0, [pod], make_job(), {"p": log}, builtin, None, 1)
    assert (row["failure_class"], row["failure"]) == (failure_class, failure)
    assert row["valid"] is (failure_class in (None, "episode"))


def test_a_launched_pod_stopped_at_its_deadline_is_the_infrastructures() -> None:
    """Its launcher stops the episode at --episode-timeout: the pod's own deadline is a backstop,
    and the Job retries a pod stopped there, so its class says infrastructure too."""
    pod = launched(indexed_pod("p", 0, phase="Failed", exit_code=137))
    pod["status"].update(reason="DeadlineExceeded", message="Pod was active on the node longer")
    pod["spec"]["activeDeadlineSeconds"] = 34
    row = demo.episode_row(0, [pod], make_job(), {"p": ""}, False, None, 1)
    assert row["failure_class"] == "infrastructure"
    assert row["failure"].startswith("stopped at its pod's deadline of 34 s from its start")
    # The same pod without the launcher: its episode ran out of its time.
    del pod["metadata"]["annotations"][demo.EPISODE_EXIT_ANNOTATION]
    assert demo.episode_row(0, [pod], make_job(), {"p": ""}, False, None, 1)["failure_class"] == (
        "episode"
    )


def deadline_message(pod: dict, parts: str | None, builtin: bool = False) -> str:
    """The failure of `pod` stopped at its deadline of 34 s, made of `parts` as the run recorded it."""
    pod["status"].update(reason="DeadlineExceeded", message="Pod was active on the node longer")
    pod["spec"]["activeDeadlineSeconds"] = 34
    if parts is not None:
        pod["metadata"].setdefault("annotations", {})[demo.DEADLINE_ANNOTATION] = parts
    return demo.episode_row(0, [pod], make_job(), {"p": ""}, builtin, None, 1)["failure"]


@pytest.mark.parametrize(
    "given, parts",
    [
        ({"episode_timeout": 4}, "--episode-timeout 4 + 30 s for the pod to start"),
        ({"pull_timeout": 60}, "--pull-timeout 60"),
        (
            {"pull_timeout": 60, "episode_timeout": 4},
            "--pull-timeout 60 + --episode-timeout 4 + 30 s for the pod to start",
        ),
        ({}, None),
    ],
)
def test_a_time_out_names_only_the_flags_given(given: dict, parts: str | None) -> None:
    settings = demo.Settings(count=2, parallelism=2, rollout=True, **given)
    (job,) = demo.batch_jobs("ns", settings, "rollout", [], [demo.ImageGroup("img", (0, 1))])
    annotations = job["spec"]["template"]["metadata"].get("annotations") or {}
    assert annotations.get(demo.DEADLINE_ANNOTATION) == parts
    if parts is None:
        return
    # Several images: each Job's pods say the same.
    groups = [demo.ImageGroup("a", (0,)), demo.ImageGroup("b", (1,))]
    for each in demo.batch_jobs("ns", settings, "rollout", [], groups):
        assert (
            each["spec"]["template"]["metadata"]["annotations"][demo.DEADLINE_ANNOTATION] == parts
        )
    stopped = deadline_message(launched(indexed_pod("p", 0, phase="Failed", exit_code=137)), parts)
    started = deadline_message(indexed_pod("p", 0, phase="Failed", exit_code=137), parts, True)
    never = indexed_pod("p", 0, phase="Failed", exit_code=None)
    never["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ErrImagePull"}}
    unstarted = deadline_message(never, parts)
    for message in (stopped, started, unstarted):
        assert f"({parts})" in message or f"(its deadline: {parts})" in message, message
        for flag in ("--pull-timeout", "--episode-timeout"):
            assert (flag in message) is (flag in parts), message
    assert stopped.startswith("stopped at its pod's deadline of 34 s from its start on the node")
    assert started.startswith("ran out of time: still running 34 s after its pod started")
    assert unstarted.startswith("container never started within its pod's deadline of 34 s")


SIGTERM_HANDLED = (
    "import os, signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    print('stopping', flush=True)\n"
    "    {end}\n"
    "assert signal.signal(signal.SIGTERM, stop) == signal.SIG_DFL\n"
    "assert signal.getsignal(signal.SIGTERM) is stop\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize(
    "end", ["sys.exit(1)", "sys.exit(0)", "raise RuntimeError('interrupted')", "os._exit(0)"]
)
def test_a_program_that_handles_sigterm_and_ends_ends_as_stopped_from_outside(
    tmp_path: Path, end: str
) -> None:
    """The kubelet's SIGTERM (a suspended Job's pod deleted: --need-groups, Ctrl-C) ends a program
    that handles it: that end is not the episode's own, so the pod fails (143), nothing recorded;
    never an episode_exit that would count the stop as the episode's failure, a valid sample."""
    (tmp_path / "episode.py").write_text(SIGTERM_HANDLED.format(end=end))
    launcher = demo.EPISODE_LAUNCHER.replace(
        '"/demo/episode.py"', repr(str(tmp_path / "episode.py"))
    )
    process = subprocess.Popen(
        [sys.executable, "-B", "-c", launcher],
        env=dict(os.environ, EPISODE_ID="pod-a"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    process.send_signal(15)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    assert stdout.startswith("stopping") and exit_events(stdout) == []
    assert 143 in demo.INFRASTRUCTURE_EXIT_CODES  # the pod's end: the infrastructure's
