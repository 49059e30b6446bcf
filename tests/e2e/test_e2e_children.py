"""End to end: a run killed with SIGKILL (a CI timeout, the OOM killer) leaves nothing
running and nothing it cannot clean up: its kubectl children die with it, the receipt
stays, the next run removes the proxy's socket directory, and cleanup still works."""

from __future__ import annotations

import os
import signal
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from e2e_support import PRODUCT, load, run_namespaces, run_tool, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads children from /proc"),
]

WAIT = 60


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid`, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def command_line(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return [part.decode() for part in cmdline.read().split(b"\0") if part]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killed_run_leaves_no_process_and_stays_cleanable(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=30)  # the batch is still running when the tool is killed
    output = tmp_path / "out"
    # A short directory of its own: a Unix socket's path must stay under ~100 bytes.
    temporary = Path(tempfile.mkdtemp(prefix="rlk-"))
    env = {**emulator.env(), "TMPDIR": str(temporary)}
    process = subprocess.Popen(
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Both watches and the proxy: the long-lived children a killed run would leak.
        def long_lived_children() -> list[int] | None:
            pids = [pid for pid in children_of(process.pid) if command_line(pid)[:1] == [kubectl]]
            watches = [pid for pid in pids if "--watch" in command_line(pid)]
            proxies = [pid for pid in pids if "proxy" in command_line(pid)]
            return watches + proxies if len(watches) == 3 and len(proxies) == 1 else None

        kubectl_children = wait_for(
            long_lived_children, WAIT, "the tool's three watches and its proxy"
        )
        socket_directories = list(temporary.glob(f"rl-batch-demo-{process.pid}-*"))
        assert len(socket_directories) == 1, list(temporary.iterdir())
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=WAIT)

    wait_for(
        lambda: not any(alive(pid) for pid in kubectl_children),
        120,
        "the killed tool's kubectl children to end",
    )
    receipt = load(output / "receipt.json")
    assert receipt["namespace"].startswith("agc-rl-")

    # The next run, whatever it does, removes the dead run's socket directory (and no other).
    other = temporary / "rl-batch-demo-unrelated"
    other.mkdir()
    second = subprocess.run(
        [
            sys.executable,
            str(PRODUCT),
            "run",
            "--count",
            "1",
            "--output",
            str(tmp_path / "second"),
            "--quiet",
            "--kubectl",
            kubectl,
            "--cleanup",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr
    assert not socket_directories[0].exists()
    assert other.is_dir()
    assert list(temporary.glob("rl-batch-demo-*-*")) == []

    cleaned = run_tool(emulator, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert run_namespaces(emulator) == []
    shutil.rmtree(temporary)
