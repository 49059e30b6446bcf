"""End to end: a run killed with SIGKILL (a CI timeout, the OOM killer) leaves nothing
running and nothing it cannot clean up: its kubectl children die with it, whatever kubectl
is (a dispatcher that starts or execs the real one from a thread of its own included), the
receipt stays, the next run removes the proxy's socket directory, and cleanup still works."""

from __future__ import annotations

import os
import signal
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from e2e_support import (
    PRODUCT,
    assert_cleanup_works,
    load,
    run_namespaces,
    run_tool,
    wait_for,
)

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


def descendants_of(pid: int) -> list[int]:
    """Every process below `pid`: its children, theirs, and so on."""
    found, frontier = [], [pid]
    while frontier:
        children = [child for parent in frontier for child in children_of(parent)]
        found += children
        frontier = children
    return found


def processes_naming(text: str) -> list[int]:
    """The live processes whose command line holds `text`."""
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and alive(int(entry)) and text in " ".join(command_line(int(entry)))
    ]


def executable(pid: int) -> str | None:
    """The program the process runs (None once it has ended)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


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


# A kubectl that starts the real one as its child and waits: a signal to it (PR_SET_PDEATHSIG's
# SIGKILL included) ends it alone, and the real kubectl goes on.
FAKE_DISPATCHER = """#!{python}
import subprocess, sys
sys.exit(subprocess.call([{real!r}, *sys.argv[1:]]))
"""

# The Google Cloud SDK's kubectl: a dispatcher that execs the versioned kubectl from a Go thread
# of its own, which loses PR_SET_PDEATHSIG on the way.
CLOUD_SDK_KUBECTL = "/usr/bin/kubectl"


def cloud_sdk_kubectl() -> str | None:
    """/usr/bin/kubectl when it is the Google Cloud SDK's dispatcher, else None."""
    try:
        real = os.path.realpath(CLOUD_SDK_KUBECTL)
        version = subprocess.run(
            [CLOUD_SDK_KUBECTL, "version", "--client"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return CLOUD_SDK_KUBECTL if "google-cloud-sdk" in real and "dispatcher" in version else None


@pytest.mark.parametrize("dispatcher", ["fake", "cloud-sdk"])
def test_a_killed_run_leaves_no_kubectl_whatever_kubectl_is(make_cluster, tmp_path, dispatcher):
    real_kubectl, make = make_cluster
    if dispatcher == "fake":
        kubectl = tmp_path / "kubectl"
        kubectl.write_text(FAKE_DISPATCHER.format(python=sys.executable, real=real_kubectl))
        kubectl.chmod(0o755)
        dispatcher_exe = os.path.realpath(sys.executable)
    else:
        found = cloud_sdk_kubectl()
        if found is None:
            pytest.skip(f"{CLOUD_SDK_KUBECTL} is not the Google Cloud SDK's kubectl dispatcher")
        kubectl = Path(found)
        dispatcher_exe = os.path.realpath(found)
    emulator = make(sandbox_delay=30)  # the batch is still running when the tool is killed
    output = tmp_path / "out"
    temporary = Path(tempfile.mkdtemp(prefix="rlk-"))
    env = {**emulator.env(), "TMPDIR": str(temporary)}
    process = subprocess.Popen(
        [sys.executable, str(PRODUCT), "run", "--count", "2", "--output", str(output)]
        + ["--quiet", "--kubectl", str(kubectl)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # The three watches and the proxy, each as the process that runs the real kubectl's code
        # (the dispatcher's child, or what the dispatcher exec'd), wherever it is below the tool.
        def long_lived() -> list[int] | None:
            below = descendants_of(process.pid)
            real = [
                pid
                for pid in below
                if executable(pid) not in (dispatcher_exe, None)
                and ("--watch" in command_line(pid) or "proxy" in command_line(pid))
            ]
            return below if len(real) == 4 else None

        below = wait_for(long_lived, WAIT, "the tool's three watches and its proxy")
        namespace = load(output / "receipt.json")["namespace"]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=WAIT)
    wait_for(
        lambda: (
            not any(alive(pid) for pid in below)
            and not processes_naming(namespace)
            and not processes_naming(str(temporary))
        ),
        60,
        "every kubectl below the killed tool to end",
    )
    assert_cleanup_works(emulator, real_kubectl, output)
    shutil.rmtree(temporary)
