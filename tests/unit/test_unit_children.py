"""The kubectl children die with the tool, whatever kubectl is: each in a process group of its
own, named to the guardian, which kills the groups still named once the tool is gone. No
cluster: a stand-in "kubectl" that starts a child of its own, as a dispatcher does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import all_names as demo

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads processes from /proc"
)

PACKAGE_DIR = Path(demo.__file__).resolve().parent.parent.parent / "src"

# A dispatcher: starts the "real" kubectl (a sleeper) as its child, prints that child's pid, and
# waits for it. A signal to the dispatcher alone leaves the sleeper running.
DISPATCHER = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    child.wait()
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_the_guardian_kills_the_groups_still_named_when_its_stream_ends() -> None:
    chunks = iter([b"+10\n+2", b"0\n-10\n+30\nnoise\n+x\n", b"-31\n+40", b""])
    assert demo.MODULES["kube"].GUARDIAN_SOURCE  # shipped as text
    namespace: dict = {"__name__": "guardian"}
    exec(demo.GUARDIAN_SOURCE, namespace)
    # The last line, unended, was cut off with the tool: it names nothing.
    assert namespace["named_groups"](lambda: next(chunks)) == {20, 30}


def test_stopping_a_kubectl_stops_what_it_started() -> None:
    dispatcher = demo.start_kubectl(
        [sys.executable, "-c", DISPATCHER], stdout=subprocess.PIPE, text=True
    )
    real = int(dispatcher.stdout.readline())
    assert os.getpgid(real) == dispatcher.pid  # its group, not this process's
    dispatcher.kill()
    dispatcher.wait(timeout=30)
    dispatcher.stdout.close()
    assert wait_until(lambda: not alive(real)), "the dispatcher's child outlived its stop"


# A tool that starts a dispatcher through start_kubectl, forks a child of its own that lives on
# (multiprocessing's way), prints the pids, and waits to be killed.
KILLED_TOOL = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from rl_batch_demo import kube
dispatcher = kube.start_kubectl([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True)
real = int(dispatcher.stdout.readline())
forked = os.fork()
if forked == 0:
    time.sleep(60)
    os._exit(0)
print(dispatcher.pid, real, forked, kube.GUARDIAN._pid, flush=True)
time.sleep(120)
"""


def test_a_killed_tool_leaves_no_kubectl_even_one_that_started_its_own() -> None:
    tool = subprocess.Popen(
        [sys.executable, "-c", KILLED_TOOL, str(PACKAGE_DIR), DISPATCHER],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        dispatcher, real, forked, guardian = map(int, tool.stdout.readline().split())
        assert alive(real) and alive(guardian)
    finally:
        tool.send_signal(signal.SIGKILL)
        tool.wait(timeout=30)
        tool.stdout.close()
    try:
        # The forked child still lives, and holds no copy of the guardian's socket: the tool's end
        # is seen all the same.
        assert alive(forked)
        assert wait_until(lambda: not alive(real)), "the real kubectl outlived the killed tool"
        assert wait_until(lambda: not alive(dispatcher)), "the dispatcher outlived the killed tool"
        assert wait_until(lambda: not alive(guardian)), "the guardian outlived its work"
    finally:
        os.kill(forked, signal.SIGKILL)
