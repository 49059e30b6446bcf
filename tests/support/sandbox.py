"""Run a container the way the tests' kubelets do: a local process inside bubblewrap.

Shared by the Kubernetes API emulator (tests/support/kube_emulator.py) and the node agent
that does the kubelet's part for the real control plane (tests/support/node_agent.py):
the bubblewrap command line (read-only host root, volumes at their mount paths,
uid/gid from the securityContext, no network unless the pod declares ports), a
followable container log, signalling a container's process tree, and Kubernetes'
$(VAR) and fieldRef expansion.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

BIN_MOUNT = "/opt/emulator/bin"
SANDBOX_PATH = BIN_MOUNT + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SKIP_TOP = {"proc", "dev", "sys", "tmp", "run", "lost+found"}


class ContainerLog:
    """Log of one container run: timestamped raw lines, followable."""

    def __init__(self, path: Optional[Path] = None):
        self.lines: List[Tuple[float, bytes]] = []
        self.cond = threading.Condition()
        self.closed = False
        self.path = path
        self._fh = open(path, "ab") if path else None

    def append(self, line: bytes, t: Optional[float] = None) -> None:
        with self.cond:
            self.lines.append((time.time() if t is None else t, line))
            if self._fh:
                self._fh.write(line)
                self._fh.flush()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            if self._fh:
                self._fh.close()
                self._fh = None
            self.cond.notify_all()

    def text(self) -> str:
        with self.cond:
            return b"".join(line for _, line in self.lines).decode("utf-8", "replace")


def build_bwrap_argv(
    uid: int,
    gid: int,
    hostname: str,
    mounts: List[Tuple[str, str, bool]],
    read_only_root: bool,
    workdir: str,
    argv: List[str],
    bindir: str,
    share_net: bool = False,
) -> List[str]:
    """bubblewrap command: read-only host root, volumes, own pid/uts/ipc/user ns, and a network
    namespace of its own with nothing in it -- unless `share_net`: a pod that declares ports
    keeps the network namespace it is started in, where its pod IP is (see the kubelets)."""
    args = [
        "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--unshare-ipc",
        "--unshare-pid",
        *([] if share_net else ["--unshare-net"]),
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        hostname[:63],
    ]
    targets = [dst.rstrip("/") for _, dst, _ in mounts] + [BIN_MOUNT]
    expand: Set[str] = set()
    for t in targets:
        p = os.path.dirname(t)
        while p and p != "/":
            if p.split("/")[1] not in _SKIP_TOP:
                expand.add(p)
            p = os.path.dirname(p)
    target_set = set(targets)

    def join(parent: str, entry: str) -> str:
        return "/" + entry if parent == "/" else parent + "/" + entry

    def emit(path: str) -> None:
        if path != "/":
            args.extend(["--dir", path])
        try:
            entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
        except OSError:
            entries = []
        for entry in entries:
            child = join(path, entry)
            if path == "/" and entry in _SKIP_TOP:
                continue
            if child in expand:
                emit(child)
            elif child in target_set:
                continue
            elif os.path.islink(child):
                args.extend(["--symlink", os.readlink(child), child])
            else:
                args.extend(["--ro-bind-try", child, child])
        for e in sorted(expand):
            if os.path.dirname(e) == path and os.path.basename(e) not in entries:
                emit(e)

    emit("/")
    args.extend(["--proc", "/proc", "--dev", "/dev"])
    if read_only_root:
        args.extend(["--dir", "/tmp"])
    else:
        args.extend(["--tmpfs", "/tmp"])
    for src, dst, ro in mounts:
        args.extend(["--ro-bind" if ro else "--bind", src, dst])
    args.extend(
        ["--ro-bind", bindir, BIN_MOUNT, "--remount-ro", "/", "--chdir", workdir or "/", "--"]
    )
    return args + list(argv)


def _descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                data = f.read()
            ppid = int(data.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def signal_tree(proc: subprocess.Popen, sig: int) -> None:
    for p in [proc.pid] + _descendants(proc.pid):
        try:
            os.kill(p, sig)
        except OSError:
            pass


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler of its own for `sig` (its SigCgt mask)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except (OSError, ValueError):
        pass
    return False


def signal_container(proc: subprocess.Popen, sig: int) -> None:
    """A runtime's stop signal (SIGTERM): to the container's first process alone, which in a real
    container is PID 1 of its PID namespace, so the kernel delivers it only if that process
    handles it (a Python program that installs no handler ignores it, and the kubelet kills it
    with SIGKILL at its grace period's end: exit code 137). bwrap runs the command under an init
    of its own, so the command is found as the first process in the tree that is not bwrap."""
    for pid in _descendants(proc.pid):
        try:
            with open("/proc/%d/comm" % pid) as f:
                if f.read().strip() == "bwrap":
                    continue
        except OSError:
            continue
        if _catches(pid, sig):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return


class MountError(Exception):
    pass


def expand_vars(text: str, env: Dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion ($$ escapes)."""

    def rep(m: "re.Match[str]") -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", rep, text)


def resolve_field_ref(pod: dict, path: str) -> Optional[str]:
    md, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    m = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": md.get("name"),
        "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs") or []),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs") or []),
    }
    if path == "metadata.labels":
        return "\n".join('%s="%s"' % kv for kv in sorted((md.get("labels") or {}).items()))
    if path == "metadata.annotations":
        return "\n".join('%s="%s"' % kv for kv in sorted((md.get("annotations") or {}).items()))
    if path not in simple:
        return None
    return simple[path] or ""
