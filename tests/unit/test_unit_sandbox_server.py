"""Unit tests of the sandbox server's command runner (src/rl_batch_demo/sandbox_server.py), the
program each pool pod runs: real commands in a temporary workspace, no cluster."""

from __future__ import annotations

import base64
import importlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    module = importlib.import_module("rl_batch_demo.sandbox_server")
    monkeypatch.setattr(module, "WORKSPACE", str(tmp_path))
    return module


def run(server: Any, **request: Any) -> dict:
    return server.run_command(server.Sandbox(b"token"), request)


def test_a_command_runs_in_the_requests_thread_alone(server: Any, monkeypatch) -> None:
    # Each thread a command starts is a wakeup more on the round trip of every empty command;
    # its output is read by the request's own thread.
    def no_thread(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a thread was started for a command without stdin")

    monkeypatch.setattr(threading, "Thread", no_thread)
    result = run(server, shell="echo out; echo err >&2; exit 3")
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (3, "out\n", "err\n")
    assert not result["truncated"] and not result["timed_out"]


def test_stdin_is_fed_and_a_missing_command_is_exit_127(server: Any) -> None:
    fed = run(server, argv=["cat"], stdin=base64.b64encode(b"given").decode())
    assert (fed["exit_code"], fed["stdout"]) == (0, "given")
    assert run(server, argv=["no-such-command-here"])["exit_code"] == 127


def test_output_past_the_cap_is_read_to_its_end_and_cut(server: Any, monkeypatch) -> None:
    monkeypatch.setattr(server, "OUTPUT_CAP_BYTES", 1000)
    result = run(server, shell="head -c 300000 /dev/zero | tr '\\0' a; echo e >&2")
    assert result["exit_code"] == 0 and result["truncated"]
    assert result["stdout"] == "a" * 1000 and result["stderr"] == "e\n"


def test_a_command_past_its_timeout_is_killed_with_its_group(server: Any, tmp_path: Path) -> None:
    started = time.monotonic()
    result = run(server, shell="sleep 30 & echo $! > child; sleep 30", timeout=0.5)
    assert result["timed_out"] and result["exit_code"] == -9
    assert time.monotonic() - started < 5
    child = int((tmp_path / "child").read_text())
    time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or b") Z" in Path(f"/proc/{child}/stat").read_bytes()


def test_a_daemon_holding_the_pipes_delays_the_answer_by_the_grace_alone(server: Any) -> None:
    started = time.monotonic()
    result = run(server, shell="sleep 5 & echo started")
    elapsed = time.monotonic() - started
    assert (result["exit_code"], result["stdout"], result["timed_out"]) == (0, "started\n", False)
    assert server.OUTPUT_GRACE_SECONDS <= elapsed < 3
    os.killpg(os.getpgid(os.getpid()), 0)  # this process is untouched


def test_a_command_that_closes_its_output_is_still_held_to_its_timeout(server: Any) -> None:
    result = run(server, shell="exec >&- 2>&-; sleep 30", timeout=0.5)
    assert result["timed_out"] and result["seconds"] < 5
