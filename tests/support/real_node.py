"""A real node beside the real control plane: containerd, runc and the kubelet, run as root.

The kubelet refuses a loopback node IP, and nothing a test starts may listen
anywhere but on loopback or inside network namespaces the tests made, so the
whole cluster -- etcd, the API server, the controllers, the scheduler, a local
image registry, containerd and the kubelet -- runs in a network namespace of
its own (`rldemo-<pid>-<n>`) whose only interfaces are its loopback, a dummy
interface holding the node IP and the pods' bridge. The API server is reached
from here through a relay: it listens on 127.0.0.1 in this namespace and opens
each upstream connection from a thread that entered the cluster's namespace
(setns), so no packet crosses a real interface.

What this machine needs (see the README's "A real node"): cgroup v1 is allowed
(failCgroupV1: false) with the cgroupfs driver and swap tolerated; there is no
CAP_SYS_RESOURCE, so containerd must not set a pod's oom_score_adj below ours
(restrict_oom_score_adj); containerd's root needs a filesystem overlayfs can
stack on (a loop-mounted ext4 image when the workdir's own is overlayfs); no
image can come from the internet, so the sandbox image and the guide's
`python:3.12-alpine` are made here from this machine's files and served by the
local registry, which containerd uses for docker.io and registry.k8s.io.

Every piece of system state (the network namespace, mounts, cgroups, a loop
device) is recorded under /run/rldemo-node/<name>/ and torn down by stop() --
or by the next start, when the process that made it is gone. The node agent's pod
network (tests/support/pod_network.py) records its own there, torn down the same way.

    with RealNodeCluster(workdir, control_plane_bin, node_bin) as cluster:
        cluster.env()   # KUBECONFIG for kubectl and the tool
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

SUPPORT_DIR = Path(__file__).resolve().parent
TESTS_DIR = SUPPORT_DIR.parent  # local_cluster.py
for _path in (str(TESTS_DIR), str(SUPPORT_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import build_node  # noqa: E402
from control_plane import ControlPlane, _tail, _terminate, free_port, make_cert  # noqa: E402
from local_cluster import LocalCluster  # noqa: E402

NODE_NAME = "rldemo-node"
NODE_IP = "10.250.0.1"
POD_SUBNET = "10.88.0.0/16"
REGISTRY_PORT = 5000
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
PYTHON_IMAGE = "docker.io/library/python:3.12-alpine"
RECORDS = Path("/run/rldemo-node")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CLONE_NEWNET = 0x40000000
START_TIMEOUT_SECONDS = 180
# The pods' cgroup's CPU weight against the machine's other processes (1024 each): ten of them.
NODE_CPU_SHARES = 10 * 1024
IMAGE_CACHE = build_node.CACHE_DIR / "node-images"
PAUSE_SOURCE = """package main

import (
	"os"
	"os/signal"
	"syscall"
)

// The sandbox's first process: it holds the pod's namespaces until it is told to stop.
func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
"""


class RealNodeError(Exception):
    """The real node cannot run here (the reason says which piece and why)."""


def run(
    argv: List[str],
    *,
    netns: Optional[str] = None,
    check: bool = True,
    timeout: float = 120,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    prefix = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    completed = subprocess.run(
        [*prefix, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and completed.returncode != 0:
        raise RealNodeError(
            f"`{' '.join(argv)}` failed (exit {completed.returncode}): "
            f"{(completed.stderr or completed.stdout).strip()[-2000:]}"
        )
    return completed


# --- images made here ------------------------------------------------------------


def _python_files(python: str) -> Dict[str, str]:
    """{path in the image: path here} for a CPython: its executable, its standard library, the
    shared libraries ldd lists for them, and nothing the episodes cannot use (tests, Tk, IDLE)."""
    probe = run(
        [
            python,
            "-c",
            "import sys, sysconfig; print(sys.executable); print(sysconfig.get_paths()['stdlib']);"
            "print(sysconfig.get_config_var('VERSION'))",
        ]
    )
    executable, stdlib, version = probe.stdout.split()
    files = {f"/usr/local/bin/python{version}": os.path.realpath(executable)}
    skip = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages"}
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith("config-")]
        for name in names:
            # The compiled modules stay (the episodes run `python -B` under a CPU limit: compiling
            # unittest's imports from source took seconds), the optimised variants go.
            if ".opt-" in name:
                continue
            source = os.path.join(root, name)
            files[f"/usr/local/lib/python{version}/{os.path.relpath(source, stdlib)}"] = source
    # The shell and `true`, as the guide's Alpine image has them (busybox there, Debian's dash and
    # coreutils here): a shell-string command, and an empty command that starts no Python.
    files["/bin/sh"] = os.path.realpath(shutil.which("sh") or "/bin/sh")
    files["/bin/true"] = os.path.realpath(shutil.which("true") or "/bin/true")
    libraries: Dict[str, str] = {}
    for target, source in list(files.items()):
        if target.startswith(("/usr/local/bin/", "/bin/")) or source.endswith(".so"):
            for line in run(["ldd", source], check=False).stdout.splitlines():
                parts = line.split()
                path = (
                    parts[2]
                    if len(parts) >= 4 and parts[1] == "=>"
                    else (parts[0] if parts and parts[0].startswith("/") else "")
                )
                if path.startswith("/"):
                    # libpython from a pyenv prefix goes where the loader looks without a cache.
                    where = (
                        path
                        if path.startswith(("/lib", "/usr/lib"))
                        else f"/usr/lib/{os.path.basename(path)}"
                    )
                    libraries[where] = path
    files.update(libraries)
    return files


def _write_layer(
    path: Path,
    files: Dict[str, str],
    symlinks: Dict[str, str],
    directories: List[str],
    texts: Dict[str, str],
) -> None:
    partial = path.with_suffix(".partial")
    with tarfile.open(partial, "w") as tar:
        made = set()

        def parents(target: str) -> None:
            parts = target.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                directory = "/".join(parts[:i])
                if directory not in made:
                    made.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)

        for directory in directories:
            parents(directory + "/x")
            if directory.strip("/") == "tmp":
                info = tarfile.TarInfo("tmp")
                info.type, info.mode = tarfile.DIRTYPE, 0o1777
                tar.addfile(info)
        for target, source in sorted(files.items()):
            parents(target)
            # Dereferenced: the loader's and the libraries' symlinks become the files they name.
            source = os.path.realpath(source)
            info = tar.gettarinfo(source, arcname=target.strip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = (info.mode | 0o444) & 0o755 if not info.isdir() else 0o755
            if info.isfile():
                with open(source, "rb") as handle:
                    tar.addfile(info, handle)
        for target, link in symlinks.items():
            parents(target)
            info = tarfile.TarInfo(target.strip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        for target, text in texts.items():
            parents(target)
            data = text.encode()
            info = tarfile.TarInfo(target.strip("/"))
            info.size, info.mode = len(data), 0o644
            import io

            tar.addfile(info, io.BytesIO(data))
    partial.rename(path)


def python_for_image() -> str:
    """A CPython 3.12 here (the guide's image is Python 3.12), else 3.13, else this one."""
    import prereqs

    found = prereqs.find_pythons(("3.12", "3.13"))
    return found.get("3.12") or found.get("3.13") or sys.executable


def ensure_image_layers(node_bin: Path, log: Any = print) -> Dict[str, Path]:
    """{"python": layer tar, "pause": layer tar}, made once under the build cache."""
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    python = python_for_image()
    python_layer = (
        IMAGE_CACHE / f"python-{Path(os.path.realpath(python)).parent.parent.name}-pyc-sh.tar"
    )
    if not python_layer.exists():
        started = time.monotonic()
        files = _python_files(python)
        version = next(t for t in files if t.startswith("/usr/local/bin/python")).rsplit(
            "python", 1
        )[1]
        _write_layer(
            python_layer,
            files,
            {
                "/usr/local/bin/python": f"python{version}",
                "/usr/local/bin/python3": f"python{version}",
            },
            ["/tmp", "/workspace", "/etc"],
            {
                "/etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\n"
                "episode:x:1000:1000:episode:/workspace:/sbin/nologin\n",
                "/etc/group": "root:x:0:\nepisode:x:1000:\n",
            },
        )
        log(
            f"made the Python image's layer from {python} ({python_layer.stat().st_size >> 20} MiB, "
            f"{time.monotonic() - started:.0f}s)",
            flush=True,
        )
    pause_layer = IMAGE_CACHE / "pause.tar"
    if not pause_layer.exists():
        build = IMAGE_CACHE / "pause-build"
        build.mkdir(exist_ok=True)
        (build / "go.mod").write_text("module rldemo.test/pause\n\ngo 1.25\n")
        (build / "main.go").write_text(PAUSE_SOURCE)
        import build_control_plane

        env = build_control_plane._go_env()
        build_control_plane._run(
            [build_control_plane._go(), "build", "-ldflags=-s -w", "-o", "pause", "."], build, env
        )
        _write_layer(pause_layer, {"/pause": str(build / "pause")}, {}, [], {})
    return {"python": python_layer, "pause": pause_layer}


# --- the relay ---------------------------------------------------------------------


class NetnsRelay:
    """127.0.0.1:<port> here -> 127.0.0.1:<target> in network namespace `netns`."""

    def __init__(self, netns: str, target_port: int):
        self.netns_path = f"/run/netns/{netns}"
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.libc = ctypes.CDLL(None, use_errno=True)
        threading.Thread(target=self._accept, name="netns-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        # setns moves only this thread; the socket it opens stays in the cluster's namespace.
        fd = os.open(self.netns_path, os.O_RDONLY)
        try:
            if self.libc.setns(fd, CLONE_NEWNET) != 0:
                client.close()
                return
        finally:
            os.close(fd)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        # Bytes are passed on as they come, as a kernel's forwarding would: with Nagle's algorithm
        # a small write behind one in flight waited for its ACK (40 ms a request, delayed ACKs).
        for end in (client, upstream):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            source.close()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


# --- system state: made, recorded, torn down ------------------------------------------


def event_time(value: Any) -> Optional[float]:
    """A timestamp inside a containerd event as `ctr events` prints it ({"seconds", "nanos"}), in
    Unix seconds; None if absent."""
    if not isinstance(value, dict) or "seconds" not in value:
        return None
    return int(value["seconds"]) + int(value.get("nanos") or 0) / 1e9


def rfc3339_nano(value: Any) -> Optional[float]:
    """The CRI's times as crictl prints them ("2026-12-06T11:44:17.522392452Z"), in Unix seconds."""
    if not isinstance(value, str) or not value.endswith("Z") or value.startswith("0001-"):
        return None
    whole, _, fraction = value[:-1].partition(".")
    try:
        at = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return at.replace(tzinfo=datetime.timezone.utc).timestamp() + float(f"0.{fraction or 0}")


def _mounts_under(prefixes: List[str]) -> List[str]:
    mounts = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
                mounts.append(point)
    return sorted(set(mounts), key=len, reverse=True)


def _remove_cgroups(name: str) -> None:
    for controller in CGROUP_ROOT.iterdir():
        top = controller / name
        if not top.is_dir():
            continue
        for root, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
            for _ in range(20):
                try:
                    os.rmdir(root)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # Processes still in it: kill them and retry.
                    try:
                        for pid in (Path(root) / "cgroup.procs").read_text().split():
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except OSError:
                                pass
                    except OSError:
                        pass
                    time.sleep(0.1)


def teardown(record: Path) -> List[str]:
    """Undo what the run recorded in `record`: kill its processes, delete the host's links it
    made (a veth's host end; its peer and routes go with it), unmount, delete the netns, remove
    its cgroups and the record. Returns what could not be undone."""
    problems = []
    try:
        state = json.loads((record / "state.json").read_text())
    except (OSError, ValueError):
        state = {}
    name, netns, workdir = state.get("name", record.name), state.get("netns"), state.get("workdir")
    if netns and os.path.exists(f"/run/netns/{netns}"):
        pids = run(["ip", "netns", "pids", netns], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    for pid in state.get("pids", []):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for link in state.get("links", []):
        if os.path.exists(f"/sys/class/net/{link}"):
            deleted = run(["ip", "link", "delete", link], check=False)
            if deleted.returncode != 0:
                problems.append(f"ip link delete {link}: {deleted.stderr.strip()}")
    _remove_cgroups(name)
    if workdir:
        for point in _mounts_under([workdir]):
            if run(["umount", point], check=False).returncode != 0:
                if run(["umount", "-l", point], check=False).returncode != 0:
                    problems.append(f"cannot unmount {point}")
    if netns and os.path.exists(f"/run/netns/{netns}"):
        deleted = run(["ip", "netns", "delete", netns], check=False)
        if deleted.returncode != 0:
            problems.append(f"ip netns delete {netns}: {deleted.stderr.strip()}")
    _remove_cgroups(name)
    for point in state.get("cgroup_mounts", []):
        if os.path.ismount(point) and run(["umount", point], check=False).returncode != 0:
            problems.append(f"cannot unmount {point}")
            continue
        with contextlib.suppress(OSError):
            os.rmdir(point)
    if not problems:
        shutil.rmtree(record, ignore_errors=True)
    return problems


def cleanup_leftovers() -> None:
    """Tear down what earlier runs left when the process that made it is gone (a crash, a kill)."""
    if not RECORDS.is_dir():
        return
    for record in RECORDS.iterdir():
        try:
            owner = int((record / "owner").read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            continue
        teardown(record)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie -- killed, not yet reaped -- does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- the cluster ---------------------------------------------------------------------


class RealNodeCluster(LocalCluster):
    """The real control plane and one real node (containerd + kubelet), in a network namespace."""

    def __init__(self, workdir: Path, bin_dir: Path, node_bin: Path, log: Any = None):
        self.workdir = Path(workdir).resolve()
        self.node_bin = Path(node_bin)
        self.log = log or (lambda *a, **k: None)
        self.name = f"rldemo-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.netns = self.name
        self.record = RECORDS / self.name
        self.node_dir = self.workdir / "node"
        self.processes: Dict[str, subprocess.Popen] = {}
        self.relay: Optional[NetnsRelay] = None
        self.agent = None
        self.nodes = 1
        self.control_plane_bin = Path(bin_dir)
        self.control_plane: Any = None
        self.kubelet_port = 10250
        self.containerd_socket = self.node_dir / "containerd" / "containerd.sock"
        self.node_name = NODE_NAME
        self.kubelet_argv: List[str] = []
        # v1 hierarchies mounted for the node's life (see _move_controllers_off_cgroup2).
        self.cgroup_mounts: List[str] = []

    # -- LocalCluster's interface ------------------------------------------------
    def start(self) -> "RealNodeCluster":
        if os.geteuid() != 0:
            raise RealNodeError(
                f"a real node runs containerd and the kubelet as root; this is uid {os.geteuid()}"
            )
        cleanup_leftovers()
        try:
            self._make_netns()
            api_port = free_port()
            self.relay = NetnsRelay(self.netns, api_port)
            self.control_plane = ControlPlane(
                self.workdir / "control-plane",
                self.control_plane_bin,
                netns=self.netns,
                client_port=self.relay.port,
                runtime_overhead=False,
            )
            self.control_plane.api_port = api_port
            self.control_plane.start()
            self._start_registry()
            self._push_images()
            self._start_containerd()
            self._record_containerd_events()
            self._start_kubelet()
            self.wait_node_ready()
            self._make_second_runtime_class()
            self.wait_default_service_account()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._delete_pods()
        for name in ("kubelet", "containerd-events", "containerd", "registry"):
            process = self.processes.pop(name, None)
            if process is not None:
                _terminate(process)
        if self.control_plane is not None:
            self.control_plane.stop()
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.record.exists():
            problems = teardown(self.record)
            if problems:
                raise RealNodeError("teardown left: " + "; ".join(problems))

    # -- system state ---------------------------------------------------------------
    def _save_state(self) -> None:
        state = {
            "name": self.name,
            "netns": self.netns,
            "workdir": str(self.workdir),
            "pids": [p.pid for p in self.processes.values()],
            "cgroup_mounts": self.cgroup_mounts,
        }
        (self.record / "state.json").write_text(json.dumps(state))

    def _make_netns(self) -> None:
        self.record.mkdir(parents=True, exist_ok=True)
        (self.record / "owner").write_text(str(os.getpid()))
        self._save_state()
        run(["ip", "netns", "add", self.netns])
        run(["ip", "link", "set", "lo", "up"], netns=self.netns)
        # The node IP: on a dummy interface, else on loopback (the kubelet only refuses 127/8).
        if (
            run(
                ["ip", "link", "add", "rldemo0", "type", "dummy"], netns=self.netns, check=False
            ).returncode
            == 0
        ):
            run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", "rldemo0"], netns=self.netns)
            run(["ip", "link", "set", "rldemo0", "up"], netns=self.netns)
        else:
            run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo"], netns=self.netns)
        self._move_controllers_off_cgroup2()
        # The kubelet's cgroupRoot: ours in every hierarchy, so teardown removes exactly what the pods used.
        for controller in CGROUP_ROOT.iterdir():
            if (controller / "cgroup.procs").exists():
                (controller / self.name).mkdir(exist_ok=True)
        # Every pod's CPU weight is shared out inside this cgroup, which competes with each of the
        # machine's other processes as one of them: at its default 1024 shares, all the pods together
        # weighed as much as one process, and a loaded machine (20 runnable processes on 2 cores) left
        # ten episodes a twentieth of a core, past the guide's 20 s test timeout. On a node of its
        # own the pods' cgroup (kubepods, weighted by the node's CPUs) competes only with the
        # system's few services; NODE_CPU_SHARES gives it the weight of that many busy processes.
        shares = CGROUP_ROOT / "cpu" / self.name / "cpu.shares"
        if shares.exists():
            shares.write_text(str(NODE_CPU_SHARES))

    def _move_controllers_off_cgroup2(self) -> None:
        """Give every controller the cgroup v2 mount holds a v1 hierarchy of its own, for the node's life.

        This machine's cgroups are v1 with a cgroup2 mount beside them (hybrid) that holds the one
        controller no v1 hierarchy has (hugetlb). crun refuses that layout ("cgroups in hybrid mode
        not supported, drop all controllers from cgroupv2"); runc and the kubelet ignore it. A v1
        host that mounts every controller has none there: a controller no v2 cgroup uses moves to
        the v1 hierarchy mounted for it, and back when teardown unmounts it."""
        unified = CGROUP_ROOT / "unified" / "cgroup.controllers"
        try:
            controllers = unified.read_text().split()
        except OSError:
            return  # no cgroup2 mount beside v1 (or cgroup v2 alone): nothing to move
        mounted: List[str] = []
        for controller in controllers:
            point = CGROUP_ROOT / controller
            if os.path.ismount(point):
                continue
            point.mkdir(exist_ok=True)
            moved = run(
                ["mount", "-t", "cgroup", "-o", controller, "cgroup", str(point)], check=False
            )
            if moved.returncode != 0:
                point.rmdir()
                self.log(
                    f"real node: cgroup controller {controller} stays on cgroup2 "
                    f"({moved.stderr.strip()}); the crun runtime class will refuse to run"
                )
                continue
            mounted.append(str(point))
        self.cgroup_mounts = mounted
        self._save_state()

    def _start(
        self, name: str, argv: List[str], env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen:
        logs = self.node_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.netns}", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self.processes[name] = process
        self._save_state()
        return process

    def _check_alive(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is not None:
            log = self.node_dir / "logs" / f"{name}.log"
            raise RealNodeError(f"{name} exited with {process.returncode}; {log}:\n" + _tail(log))

    # -- the registry and the images ---------------------------------------------------
    def _start_registry(self) -> None:
        config = self.node_dir / "registry.yml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            json.dumps(
                {
                    "version": 0.1,
                    "log": {"level": "warn"},
                    "storage": {"filesystem": {"rootdirectory": str(self.node_dir / "registry")}},
                    "http": {"addr": f"127.0.0.1:{REGISTRY_PORT}"},
                }
            )
        )
        self._start(
            "registry",
            [str(self.node_bin / "registry"), "serve", str(config)],
            env=dict(os.environ, OTEL_TRACES_EXPORTER="none"),
        )
        deadline = time.monotonic() + 30
        while (
            run(
                [
                    "python3",
                    "-c",
                    f"import socket; socket.create_connection(('127.0.0.1', {REGISTRY_PORT}), 1)",
                ],
                netns=self.netns,
                check=False,
            ).returncode
            != 0
        ):
            self._check_alive("registry")
            if time.monotonic() > deadline:
                raise RealNodeError("the registry never listened")
            time.sleep(0.2)

    def crane(self, *args: str) -> str:
        return run(
            [str(self.node_bin / "crane"), *args, "--insecure"], netns=self.netns, timeout=300
        ).stdout.strip()

    def _push_images(self) -> None:
        layers = ensure_image_layers(self.node_bin, self.log)
        local = f"127.0.0.1:{REGISTRY_PORT}"
        python = f"{local}/library/python:3.12-alpine"
        self.crane("append", "--platform", "linux/amd64", "-f", str(layers["python"]), "-t", python)
        self.crane(
            "mutate",
            python,
            "--set-platform",
            "linux/amd64",
            "-e",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "-e",
            "LANG=C.UTF-8",
            "--entrypoint",
            "python3",
        )
        pause = f"{local}/pause:3.10.1"
        self.crane("append", "--platform", "linux/amd64", "-f", str(layers["pause"]), "-t", pause)
        self.crane("mutate", pause, "--set-platform", "linux/amd64", "--entrypoint", "/pause")

    def push_image_as(self, reference: str) -> str:
        """The guide's Python image put into the local registry as `reference` (`docker.io/<repo>:<tag>`,
        as a pod names it: containerd resolves docker.io through this registry), for the tests of an
        image per task. A label naming it gives it a config of its own, so on the node it is an image
        of its own (its own ID: `crictl rmi` of another name leaves it), sharing the guide's layer.
        Returns the reference."""
        prefix = "docker.io/"
        if not reference.startswith(prefix) or ":" not in reference[len(prefix) :]:
            raise ValueError(f"not a docker.io/<repo>:<tag> reference: {reference!r}")
        local = f"127.0.0.1:{REGISTRY_PORT}"
        self.crane(
            "mutate",
            f"{local}/library/python:3.12-alpine",
            "--label",
            f"rldemo.image={reference}",
            "-t",
            f"{local}/{reference[len(prefix) :]}",
        )
        return reference

    def _make_second_runtime_class(self) -> None:
        """RuntimeClass crun: a second real runtime (containerd's handler `crun`), to compare with cube's runc."""
        api = self.control_plane.api
        if api.get_or_none("/apis/node.k8s.io/v1/runtimeclasses/crun") is None:
            api.create(
                "/apis/node.k8s.io/v1/runtimeclasses",
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "crun"},
                    "handler": "crun",
                },
            )

    # -- containerd -------------------------------------------------------------------
    def _containerd_root(self) -> Path:
        """containerd's root, on a loop-mounted ext4 image when the workdir's filesystem is overlayfs."""
        root = self.node_dir / "containerd" / "root"
        root.mkdir(parents=True, exist_ok=True)
        fstype = run(["stat", "-f", "-c", "%T", str(root)]).stdout.strip()
        if fstype == "overlayfs":
            image = self.node_dir / "containerd-root.ext4"
            run(["truncate", "-s", "20G", str(image)])
            run(["mkfs.ext4", "-q", "-F", str(image)])
            run(["mount", "-o", "loop", str(image), str(root)])
        return root

    def _start_containerd(self) -> None:
        base = self.node_dir / "containerd"
        root = self._containerd_root()
        certs = base / "certs.d"
        local = f"http://127.0.0.1:{REGISTRY_PORT}"
        for registry in ("docker.io", "registry.k8s.io"):
            (certs / registry).mkdir(parents=True, exist_ok=True)
            # The local registry is the only host: containerd never tries the real one.
            (certs / registry / "hosts.toml").write_text(
                f'server = "{local}"\n\n[host."{local}"]\n  capabilities = ["pull", "resolve"]\n'
            )
        cni_conf = self.node_dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-rldemo.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "rldemo-pods",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "rldemo-br0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            # Routes to the pod subnet only: nothing routes anywhere else.
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_SUBNET}]],
                                "routes": [{"dst": POD_SUBNET}],
                                "dataDir": str(self.node_dir / "cni" / "ipam"),
                            },
                        }
                    ],
                }
            )
        )
        runtimes = ""
        for handler, binary, runc_root in (
            ("runc", "/usr/sbin/runc", base / "runc"),
            ("cube", "/usr/sbin/runc", base / "runc-cube"),
            ("crun", str(build_node.CRUN), base / "crun"),
        ):
            runtimes += (
                f"\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{handler}]\n"
                f"  runtime_type = 'io.containerd.runc.v2'\n"
                f"  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{handler}.options]\n"
                f"    BinaryName = '{binary}'\n    Root = '{runc_root}'\n    SystemdCgroup = false\n"
            )
        config = base / "config.toml"
        config.write_text(f"""version = 3
root = '{root}'
state = '{base / "state"}'

[grpc]
  address = '{self.containerd_socket}'

[ttrpc]
  address = '{base / "containerd.sock.ttrpc"}'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{PAUSE_IMAGE}'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '{certs}'

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: a sandbox may not get an oom_score_adj below containerd's.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{build_node.CNI_BIN_DIR}']
    conf_dir = '{cni_conf}'
{runtimes}""")
        self._start(
            "containerd",
            [str(self.node_bin / "containerd"), "--config", str(config)],
            env=dict(os.environ, PATH=f"{self.node_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"),
        )
        deadline = time.monotonic() + 60
        while (
            run(
                [
                    str(self.node_bin / "crictl"),
                    "--runtime-endpoint",
                    f"unix://{self.containerd_socket}",
                    "info",
                ],
                check=False,
                timeout=30,
            ).returncode
            != 0
        ):
            self._check_alive("containerd")
            if time.monotonic() > deadline:
                raise RealNodeError("containerd's CRI never answered")
            time.sleep(0.3)

    def _record_containerd_events(self) -> None:
        """containerd's own record of the node: every event it publishes (task create, start and
        exit, the sandboxes' and containers' lifecycle), stamped in nanoseconds, in a log."""
        self._start(
            "containerd-events",
            [str(self.node_bin / "ctr"), "--address", str(self.containerd_socket), "events"],
        )

    def containerd_events(self) -> List[Dict[str, Any]]:
        """The events containerd published so far: {"at": Unix seconds, "namespace", "topic", "event"}."""
        found = []
        for line in (
            (self.node_dir / "logs" / "containerd-events.log")
            .read_text(errors="replace")
            .splitlines()
        ):
            # <date> <time.nanoseconds> <zone offset> <zone> <namespace> <topic> <event as JSON>
            parts = line.split(" ", 6)
            if len(parts) < 7 or not parts[5].startswith("/"):
                continue
            whole, _, fraction = parts[1].partition(".")
            try:
                at = datetime.datetime.strptime(
                    f"{parts[0]} {whole} {parts[2]}", "%Y-%m-%d %H:%M:%S %z"
                ).timestamp()
                event = json.loads(parts[6])
            except ValueError:
                continue
            found.append(
                {
                    "at": at + float(f"0.{fraction or 0}"),
                    "namespace": parts[4],
                    "topic": parts[5],
                    "event": event,
                }
            )
        return found

    def truth(self, namespace: str) -> Dict[str, Any]:
        """The node's record of each pod of `namespace`, in the emulator's truth shape
        ({"pods": {"ns/pod": {field: Unix seconds}}}), in nanoseconds: sandbox_ready when the
        sandbox's task started (the pause process, the pod's network already set up; containerd's
        event), task_created and task_started when the episode's task was created (its process
        forked) and started (let go to exec; containerd's events, published a moment after),
        container_started when containerd recorded the start, as its start call returned (the
        startedAt the kubelet reports in whole seconds), container_finished when the shim reaped
        the process (the exit's own exited_at; the finishedAt the kubelet reports)."""
        sandboxes = {
            item["id"]: item["metadata"]
            for item in json.loads(
                self.crictl("pods", "--namespace", namespace, "-o", "json").stdout
            )["items"]
        }
        containers = {
            item["id"]: sandboxes[item["podSandboxId"]]
            for item in json.loads(self.crictl("ps", "-a", "-o", "json").stdout)["containers"]
            if item["podSandboxId"] in sandboxes
        }
        pods: Dict[str, Dict[str, float]] = {}

        def note(task: str, field: str, at: Optional[float], first: bool = True) -> None:
            names = containers if task in containers else sandboxes
            record = pods.setdefault(f"{namespace}/{names[task]['name']}", {})
            if at is not None and (field not in record or not first):
                record[field] = at

        for record in self.containerd_events():
            event = record["event"]
            task = event.get("container_id")
            if record["topic"] == "/tasks/start" and task in sandboxes:
                note(task, "sandbox_ready", record["at"])
            elif record["topic"] == "/tasks/create" and task in containers:
                note(task, "task_created", record["at"])
            elif record["topic"] == "/tasks/start" and task in containers:
                note(task, "task_started", record["at"])
            elif (
                record["topic"] == "/tasks/exit" and task in containers and event.get("id") == task
            ):
                # The shim's own record of the exit, taken as it reaped the process: its event is
                # published later, once the shim is done with the exit (up to 0.3 s later, past the
                # second's end for two of twelve crun containers at load 5).
                note(task, "container_finished", event_time(event.get("exited_at")), first=False)
        for task in containers:
            status = json.loads(self.crictl("inspect", task).stdout)["status"]
            note(task, "container_started", rfc3339_nano(status.get("startedAt")))
        return {"pods": pods}

    def crictl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(
            [
                str(self.node_bin / "crictl"),
                "--runtime-endpoint",
                f"unix://{self.containerd_socket}",
                "--image-endpoint",
                f"unix://{self.containerd_socket}",
                *args,
            ],
            check=check,
            timeout=120,
        )

    # -- the kubelet --------------------------------------------------------------------
    def _start_kubelet(self) -> None:
        cp = self.control_plane
        pki = cp.pki
        make_cert(pki, "node-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}")
        make_cert(
            pki,
            "node-serving",
            f"/CN={NODE_NAME}",
            server_names=(NODE_NAME,),
            server_ips=(NODE_IP,),
        )
        from control_plane import write_kubeconfig

        kubeconfig = write_kubeconfig(
            self.node_dir / "kubelet.kubeconfig",
            cp.internal_server,
            pki / "ca.crt",
            pki / "node-client.crt",
            pki / "node-client.key",
            f"system:node:{NODE_NAME}",
            context="kubelet",
        )
        resolv = self.node_dir / "resolv.conf"
        resolv.write_text("")
        kubelet_root = self.node_dir / "kubelet"
        kubelet_root.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine: cgroup v1 (cgroupfs), swap on, no systemd managing cgroups.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "cgroupRoot": f"/{self.name}",
            "cgroupsPerQOS": True,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": NODE_IP,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(pki / "node-serving.crt"),
            "tlsPrivateKeyFile": str(pki / "node-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": ["10.96.0.10"],
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "registerNode": True,
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "shutdownGracePeriod": "0s",
        }
        (self.node_dir / "kubelet-config.json").write_text(json.dumps(config, indent=1))
        self.kubelet_argv = [
            str(self.node_bin / "kubelet"),
            f"--config={self.node_dir / 'kubelet-config.json'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={kubelet_root}",
            f"--node-ip={NODE_IP}",
            f"--hostname-override={NODE_NAME}",
            f"--cert-dir={self.node_dir / 'kubelet-pki'}",
            "--v=1",
        ]
        self._start(
            "kubelet",
            self.kubelet_argv,
            env=dict(os.environ, PATH=f"{self.node_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"),
        )

    @contextlib.contextmanager
    def kubelet_configured(self, **changes: Any) -> Iterator[Dict[str, Any]]:
        """The kubelet restarted with `changes` to its KubeletConfiguration (e.g.
        serializeImagePulls=True, the kubelet's default) for the block, then restarted as it was.
        The node's pods and images stay; yields the configuration it ran with."""
        path = self.node_dir / "kubelet-config.json"
        original = json.loads(path.read_text())
        changed = dict(original, **changes)
        self._restart_kubelet(changed)
        try:
            yield changed
        finally:
            self._restart_kubelet(original)

    def _restart_kubelet(self, config: Dict[str, Any]) -> None:
        """The kubelet stopped, its configuration rewritten, started again, and back: Ready, with a
        heartbeat the new process posted."""
        if "kubelet" in self.processes:
            _terminate(self.processes.pop("kubelet"))
        (self.node_dir / "kubelet-config.json").write_text(json.dumps(config, indent=1))
        # lastHeartbeatTime has whole seconds: one stamped after this second is the new process's.
        after = int(time.time()) + 1
        self._start(
            "kubelet",
            self.kubelet_argv,
            env=dict(os.environ, PATH=f"{self.node_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"),
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            self._check_alive("kubelet")
            node = self.control_plane.api.get_or_none(f"/api/v1/nodes/{NODE_NAME}") or {}
            ready = [
                c
                for c in (node.get("status") or {}).get("conditions", [])
                if c["type"] == "Ready" and c["status"] == "True"
            ]
            if (
                ready
                and (
                    datetime.datetime.strptime(
                        ready[0]["lastHeartbeatTime"], "%Y-%m-%dT%H:%M:%SZ"
                    ).replace(tzinfo=datetime.timezone.utc)
                ).timestamp()
                >= after
            ):
                return
            if time.monotonic() > deadline:
                raise RealNodeError(
                    "the restarted kubelet posted no Ready heartbeat; its log:\n"
                    + _tail(self.node_dir / "logs" / "kubelet.log", 40)
                )
            time.sleep(0.5)

    def wait_node_ready(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.processes:
                self._check_alive(name)
            node = self.control_plane.api.get_or_none(f"/api/v1/nodes/{NODE_NAME}")
            conditions = {
                c["type"]: c["status"]
                for c in ((node or {}).get("status") or {}).get("conditions", [])
            }
            if conditions.get("Ready") == "True" and not (node.get("spec") or {}).get("taints"):
                return
            time.sleep(0.5)
        raise RealNodeError(
            f"node {NODE_NAME} not Ready after {timeout:.0f}s; kubelet log:\n"
            + _tail(self.node_dir / "logs" / "kubelet.log", 40)
        )

    def _delete_pods(self) -> None:
        """Stop every pod sandbox first, so runc's containers and their mounts go with containerd."""
        if "containerd" in self.processes and self.processes["containerd"].poll() is None:
            if "kubelet" in self.processes:
                _terminate(self.processes.pop("kubelet"))
            self.crictl("rmp", "--all", "--force", check=False)
