"""A live sandbox: runs the trainer's commands and file operations in its pod, over HTTP.

Shipped in the run's ConfigMap and run as the pod's one process. It listens on the pod's own
IP (POD_IP, from the downward API) and answers only requests that carry the run's token (the
X-Sandbox-Token header; the token is a file mounted from the run's Secret). Standard library
only: it runs on whatever Python the image has (3.8 or newer).

    GET  /ready             {"ready_at": when it began to listen, this pod's clock}
    POST /run               {"argv": [...]} or {"shell": "..."}, with "timeout", "cwd", "env",
                            "stdin" (base64): {"exit_code", "stdout", "stderr", "truncated",
                            "timed_out", "seconds"}
    PUT  /file?path=P       the body is the file's bytes; GET /file?path=P reads them back
    POST /reset             every process it started is killed, the workspace made pristine
    POST /finish            every process it started is killed, and it exits 0

A sandbox left alone for SANDBOX_IDLE_SECONDS exits with IDLE_EXIT_CODE, which the pool's Job
counts as its end (podFailurePolicy FailJob): a trainer that died leaks no pod past that.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import shutil
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

STARTED_AT = time.time()  # once the modules it needs are imported
PORT = int(os.environ.get("SANDBOX_PORT", "8377"))
TOKEN_FILE = os.environ.get("SANDBOX_TOKEN_FILE", "/sandbox-token/token")
WORKSPACE = os.environ.get("SANDBOX_WORKSPACE", "/workspace")
PRISTINE = os.environ.get("SANDBOX_PRISTINE", "/sandbox-pristine/workspace")
IDLE_SECONDS = float(os.environ.get("SANDBOX_IDLE_SECONDS", "600"))
IDLE_EXIT_CODE = 75  # EX_TEMPFAIL: the pool was left idle; its Job ends on it
OUTPUT_CAP_BYTES = int(os.environ.get("SANDBOX_OUTPUT_CAP_BYTES", str(1 << 20)))
CHUNK_BYTES = 1 << 16
OUTPUT_GRACE_SECONDS = 0.5
POLL_SECONDS = 0.01  # how often a command's end is asked for where no pidfd tells it
BODY_MOST_BYTES = 64 << 20  # a file written or a command's stdin
NOT_FOUND_EXIT_CODE = 127  # what a shell answers for a command it cannot find


class Sandbox:
    """What the server holds between requests: the token, the clock of the last request, and
    the process groups of the commands it started (each command leads a group of its own)."""

    def __init__(self, token: bytes) -> None:
        self.token = token
        self.last_request = time.monotonic()
        self.ready_at = 0.0  # when it began to listen, this pod's clock
        self.pristine = False  # a copy of the starting workspace is kept for /reset
        self.stopping = False  # SIGTERM: its pod is going; nothing more is answered
        self.in_flight = 0  # commands running: a sandbox running one is not idle
        self.groups: set[int] = set()
        self.lock = threading.Lock()
        # Set when a command ended: its orphans are reaped by the idle watcher's thread, off the
        # next request's way (a /proc scan took 3 ms where a host shows 160 processes).
        self.reap_wanted = threading.Event()

    def authorised(self, given: Optional[str]) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    def kill_everything(self) -> None:
        """Every process the sandbox's commands started, daemons among them: the server is
        their subreaper, so a daemon that left its command's group is still its descendant."""
        with self.lock:
            groups = set(self.groups)  # each stays listed until its request has reaped it
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass  # the group ended with its command
        for _round in range(50):
            left = descendants(os.getpid())
            if not left:
                reap_orphans(self)
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
            reap_orphans(self)


def processes() -> Dict[int, Tuple[int, bytes]]:
    """Every process this container sees: pid -> (parent pid, state), from /proc."""
    found: Dict[int, Tuple[int, bytes]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        found[int(entry)] = (int(fields[1]), fields[0])
    return found


def descendants(root: int) -> List[int]:
    """The live processes below `root`, from /proc's parent links."""
    children: Dict[int, List[int]] = {}
    for pid, (parent, state) in processes().items():
        if state != b"Z":
            children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap_orphans(sandbox: Sandbox) -> None:
    """Collect the ends of orphans handed to this subreaper, so none lingers as a zombie that still
    answers `kill -0`; never a command's own process (its request reaps it, for its exit code):
    the lock keeps a command from starting between the scan and the reaping."""
    me = os.getpid()
    with sandbox.lock:
        for pid, (parent, state) in processes().items():
            if parent == me and state == b"Z" and pid not in sandbox.groups:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass  # reaped meanwhile


def become_subreaper() -> None:
    """Orphans of the commands' processes come to this server, not to the node's init."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # not Linux: a daemon that left its group outlives finish until the pod ends


class Output:
    """A command's stdout and stderr as they are read: each stream's first OUTPUT_CAP_BYTES kept, the
    rest read and dropped (a command that prints 100 MB costs the sandbox no memory past the cap,
    and is never blocked on a full pipe)."""

    def __init__(self) -> None:
        self.kept: Dict[int, List[bytes]] = {}
        self.sizes: Dict[int, int] = {}
        self.truncated = False

    def take(self, fd: int, chunk: bytes) -> None:
        size = self.sizes.get(fd, 0)
        if size < OUTPUT_CAP_BYTES:
            self.kept.setdefault(fd, []).append(chunk[: OUTPUT_CAP_BYTES - size])
        self.truncated = self.truncated or size + len(chunk) > OUTPUT_CAP_BYTES
        self.sizes[fd] = size + len(chunk)

    def text(self, fd: int) -> bytes:
        return b"".join(self.kept.get(fd, []))


def process_handle(pid: int) -> Optional[int]:
    """A file descriptor readable once the process ends (Linux 5.3+), or None: then its end is
    asked for every POLL_SECONDS."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def collect_output(
    process: "subprocess.Popen[bytes]", deadline: Optional[float], output: Output
) -> bool:
    """Read the command's stdout and stderr to their ends in this one thread (no reader threads:
    each thread a command starts is a wakeup more on its round trip), killing its group at the
    deadline. A daemon the command left with its pipes keeps them open: once the command has
    ended, its output is waited for OUTPUT_GRACE_SECONDS more, no longer (the daemon lives on
    until reset or finish). Whether the command was killed at its deadline."""
    pipes = [process.stdout.fileno(), process.stderr.fileno()]  # type: ignore[union-attr]
    handle = process_handle(process.pid)
    ended_at: Optional[float] = None
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in pipes:
            selector.register(fd, selectors.EVENT_READ)
        if handle is not None:
            selector.register(handle, selectors.EVENT_READ)
        while any(fd in selector.get_map() for fd in pipes):
            now = time.monotonic()
            if ended_at is None and (handle is None and process.poll() is not None):
                ended_at = now
            if deadline is not None and not timed_out and ended_at is None and now >= deadline:
                kill_group(process.pid)
                timed_out = True
            if ended_at is not None and now >= ended_at + OUTPUT_GRACE_SECONDS:
                break
            waits = [ended_at + OUTPUT_GRACE_SECONDS - now] if ended_at is not None else []
            waits += [deadline - now] if deadline is not None and not timed_out else []
            waits += [POLL_SECONDS] if handle is None and ended_at is None else []
            for key, _mask in selector.select(max(0.0, min(waits)) if waits else None):
                if key.fd == handle:
                    selector.unregister(handle)
                    ended_at = time.monotonic()
                    continue
                chunk = os.read(key.fd, CHUNK_BYTES)
                if chunk:
                    output.take(key.fd, chunk)
                else:
                    selector.unregister(key.fd)
    if handle is not None:
        os.close(handle)
    return timed_out


def kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass  # the group ended meanwhile


def command_argv(request: Dict[str, Any]) -> Any:
    """The command a /run request names: a shell string, or a non-empty argv list."""
    shell = request.get("shell")
    argv: Any = shell if isinstance(shell, str) else request.get("argv")
    if isinstance(argv, str):
        return argv
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("give argv, a non-empty list of strings, or shell, a string")
    return argv


def start_command(request: Dict[str, Any], stdin: bytes) -> "subprocess.Popen[bytes]":
    """The command started, leading a process group (and session) of its own."""
    argv = command_argv(request)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    return subprocess.Popen(
        argv,
        shell=isinstance(argv, str),
        cwd=os.path.join(WORKSPACE, request.get("cwd") or ""),
        env=env,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def run_command(sandbox: Sandbox, request: Dict[str, Any]) -> Dict[str, Any]:
    """Run one command to its end, or to its timeout (then its whole group is killed). The orphans
    it left are reaped once its answer has gone (`reap_wanted`), off its round trip."""
    started = time.monotonic()
    cwd = os.path.join(WORKSPACE, request.get("cwd") or "")
    if not os.path.isdir(cwd):
        return outcome(126, b"", f"no directory {cwd}\n".encode(), False, False, started)
    stdin = base64.b64decode(request.get("stdin") or "")
    try:
        with sandbox.lock:  # listed before the reaper can see it end
            process = start_command(request, stdin)
            sandbox.groups.add(process.pid)
            sandbox.in_flight += 1
    except (FileNotFoundError, PermissionError, NotADirectoryError) as error:
        code = NOT_FOUND_EXIT_CODE if isinstance(error, FileNotFoundError) else 126
        return outcome(code, b"", f"{error}\n".encode(), False, False, started)
    if stdin:
        threading.Thread(target=feed, args=(process.stdin, stdin), daemon=True).start()
    timeout = request.get("timeout")
    output = Output()
    out, err = process.stdout.fileno(), process.stderr.fileno()  # type: ignore[union-attr]
    try:
        deadline = started + float(timeout) if timeout is not None else None
        timed_out = collect_output(process, deadline, output)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        timed_out = wait_command(process, None if timed_out else left) or timed_out
    finally:
        for pipe in (process.stdout, process.stderr):
            pipe.close()  # type: ignore[union-attr]
        with sandbox.lock:
            sandbox.groups.discard(process.pid)
            sandbox.in_flight -= 1
    return outcome(
        process.returncode, output.text(out), output.text(err), output.truncated, timed_out, started
    )


def wait_command(process: "subprocess.Popen[bytes]", timeout: Optional[float]) -> bool:
    """Wait for the command; past its timeout, kill its group (what it left running in the
    background after an ordinary end lives on for later turns). Whether it timed out."""
    try:
        process.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()
        return True


def feed(pipe: Any, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
        pipe.close()
    except OSError:
        pass  # the command ended without reading it all


def outcome(
    code: Optional[int], out: bytes, err: bytes, truncated: bool, timed_out: bool, started: float
) -> Dict[str, Any]:
    return {
        "exit_code": code,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "truncated": truncated,
        "timed_out": timed_out,
        "seconds": time.monotonic() - started,
    }


def reset_workspace() -> None:
    """The workspace as it was when the sandbox started."""
    for entry in os.listdir(WORKSPACE):
        path = os.path.join(WORKSPACE, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    for entry in os.listdir(PRISTINE):
        source, target = os.path.join(PRISTINE, entry), os.path.join(WORKSPACE, entry)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)


def workspace_path(query: str) -> str:
    """The file a request names (`path`), relative to the workspace unless absolute."""
    path = urllib.parse.parse_qs(query).get("path", [""])[0]
    if not path:
        raise ValueError("give ?path=")
    return os.path.join(WORKSPACE, path)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive: one connection serves a trainer's turns
    timeout = 300  # a connection silent this long mid-request is dropped
    # An answer's headers and body leave in one segment, at once: with Nagle's algorithm, a
    # body written after its headers waited for the client's delayed ACK (40 ms a request).
    disable_nagle_algorithm = True
    wbufsize = 1 << 16
    sandbox: Sandbox

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the pod's log is for what the sandbox says of itself

    def answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("X-Sandbox-Answer", "1")  # the way there (a proxy) answers without it
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def reply(self, status: int, value: Any) -> None:
        if self.sandbox.stopping:  # its pod is going: a command it killed is no outcome
            self.close_connection = True
            return
        self.answer(status, json.dumps(value).encode())

    def handle_one(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        if not self.sandbox.authorised(self.headers.get("X-Sandbox-Token")):
            self.close_connection = True  # its body is not read: nobody else's bytes are waited on
            self.reply(403, {"error": "forbidden"})
            return
        self.sandbox.last_request = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding") or length > BODY_MOST_BYTES:
            self.close_connection = True
            self.reply(413, {"error": f"a body of at most {BODY_MOST_BYTES} bytes, with a length"})
            return
        body = self.rfile.read(length)
        try:
            self.route(method, path, query, body)
        except (ValueError, TypeError) as error:
            self.reply(400, {"error": str(error)})
        except OSError as error:
            self.reply(
                404 if isinstance(error, FileNotFoundError) else 500,
                {"error": f"{type(error).__name__}: {error}"},
            )
        self.sandbox.last_request = time.monotonic()

    def route(self, method: str, path: str, query: str, body: bytes) -> None:
        if (method, path) == ("GET", "/ready"):
            self.reply(200, {"ready_at": self.sandbox.ready_at, "started_at": STARTED_AT})
        elif (method, path) == ("POST", "/run"):
            self.reply(200, run_command(self.sandbox, json.loads(body or b"{}")))
            self.sandbox.reap_wanted.set()
        elif (method, path) == ("PUT", "/file"):
            target = workspace_path(query)
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            with open(target, "wb") as file:
                file.write(body)
            self.reply(200, {"bytes": len(body)})
        elif (method, path) == ("GET", "/file"):
            with open(workspace_path(query), "rb") as file:
                self.answer(200, file.read(), "application/octet-stream")
        elif (method, path) == ("POST", "/reset") and not self.sandbox.pristine:
            self.reply(409, {"error": "no pristine copy of the workspace was kept"})
        elif (method, path) == ("POST", "/reset"):
            self.sandbox.kill_everything()
            reset_workspace()
            self.reply(200, {"reset": True})
        elif (method, path) == ("POST", "/finish"):
            self.sandbox.kill_everything()
            self.reply(200, {"finished": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()
        else:
            self.reply(404, {"error": f"no {method} {path}"})

    def do_GET(self) -> None:
        self.handle_one("GET")

    def do_POST(self) -> None:
        self.handle_one("POST")

    def do_PUT(self) -> None:
        self.handle_one("PUT")


def watch_idle(sandbox: Sandbox) -> None:
    """End the sandbox, and with it the pool's Job, once nobody has asked anything for so long."""
    while True:
        sandbox.reap_wanted.wait(min(IDLE_SECONDS, 1.0))
        sandbox.reap_wanted.clear()
        reap_orphans(sandbox)
        if sandbox.in_flight == 0 and time.monotonic() - sandbox.last_request > IDLE_SECONDS:
            sandbox.kill_everything()
            print(json.dumps({"event": "idle", "at": time.time()}), flush=True)
            os._exit(IDLE_EXIT_CODE)


def keep_pristine() -> bool:
    """The workspace as it starts, copied aside for /reset; False where it cannot be."""
    try:
        if os.path.isdir(PRISTINE):
            shutil.rmtree(PRISTINE)
        os.makedirs(os.path.dirname(PRISTINE), exist_ok=True)
        shutil.copytree(WORKSPACE, PRISTINE, symlinks=True)
        return True
    except OSError as error:
        print(json.dumps({"event": "no_pristine_copy", "error": str(error)}), flush=True)
        return False


def main() -> None:
    with open(TOKEN_FILE, "rb") as file:
        token = file.read().strip()
    pristine = keep_pristine()
    become_subreaper()
    sandbox = Sandbox(token)
    sandbox.pristine = pristine
    Handler.sandbox = sandbox
    server = ThreadingHTTPServer((os.environ.get("POD_IP") or "127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    sandbox.ready_at = time.time()

    def stopped(number: int, frame: Any) -> None:
        """SIGTERM (the pod deleted, its Job suspended): nothing it started outlives it."""
        sandbox.stopping = True
        sandbox.kill_everything()
        os._exit(128 + number)

    signal.signal(signal.SIGTERM, stopped)
    threading.Thread(target=watch_idle, args=(sandbox,), daemon=True).start()
    event = {"event": "server_ready", "at": sandbox.ready_at, "started_at": STARTED_AT}
    print(json.dumps(event), flush=True)
    server.serve_forever()
    # Finished: out at once. An interpreter's ordinary exit ends its daemon threads with
    # pthread_exit, which a minimal image without libgcc_s turns into a crash (exit 139): the
    # pod would fail where its sandbox finished well.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
