"""The one edge to the cluster: `Kubectl` runs every kubectl; `ApiProxy`; reads through them, lists
in pages.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from .constants import (
    CALL_TIMEOUT_SECONDS,
    GUARDIAN_SOURCE,
    GUARDIAN_VARIABLE,
    CONTAINER_NAME,
    CREDENTIALS_PROMPT,
    JOB_TRACKING_FINALIZER,
    KUBELET_LOG_GONE,
    LIST_EXPIRIES,
    LIST_PAGE_SIZE,
    PROXY_DIRECTORY_PREFIX,
    PROXY_START_SECONDS,
    PR_SET_PDEATHSIG,
    REQUEST_TIMEOUT_SECONDS,
    TRANSIENT_ERROR_MARKERS,
    UNSERVED_PATH_MESSAGE,
)
from .model import DemoError
from .parse import job_finished, pod_name


def list_path(
    resource_path: str,
    limit: int,
    selector: str | None = None,
    not_older_than: str | None = None,
    continue_token: str | None = None,
) -> str:
    """The API path of one page of a list.

    A continue token carries its list's revision and the API refuses a
    resourceVersion beside it, so only the first page names the oldest revision
    its answer may come from.
    """
    query = {"limit": str(limit)}
    if selector:
        query["labelSelector"] = selector
    if continue_token:
        query["continue"] = continue_token
    elif not_older_than:
        query["resourceVersion"] = not_older_than
        query["resourceVersionMatch"] = "NotOlderThan"
    return f"{resource_path}?{urllib.parse.urlencode(query)}"


def expired_continue(answer: str) -> str | None:
    """For an answer saying a list's continue token expired: the token the API offers to go on
    from its newest revision ("" when it offers none). None for any other answer."""
    try:
        status = json.loads(answer)
    except ValueError:
        return "" if "(Expired)" in answer else None
    if not isinstance(status, dict) or status.get("reason") != "Expired":
        return None
    return (status.get("metadata") or {}).get("continue") or ""


class PagedList:
    """One list read page by page: a pure reducer of the API's answers."""

    def __init__(
        self,
        resource_path: str,
        selector: str | None = None,
        not_older_than: str | None = None,
        limit: int = LIST_PAGE_SIZE,
    ) -> None:
        self.resource_path = resource_path
        self.selector = selector
        self.not_older_than = not_older_than
        self.limit = limit
        self.items: list[dict] = []
        self.resource_version: str | None = None
        self.continue_token: str | None = None
        self.done = False
        self.pages = 0
        self.expiries = 0

    def next_path(self) -> str:
        return list_path(
            self.resource_path, self.limit, self.selector, self.not_older_than, self.continue_token
        )

    def apply(self, page: dict) -> None:
        """One page: keep its items; its continue token asks for the next, none means it was the last."""
        self.pages += 1
        metadata = page.get("metadata") or {}
        if self.resource_version is None:
            self.resource_version = metadata.get("resourceVersion")
        self.items.extend(page.get("items") or [])
        self.continue_token = metadata.get("continue") or None
        self.done = self.continue_token is None

    def expired(self, token_to_go_on: str) -> None:
        """The continue token expired. Go on with the API's own token when it offers one (the
        rest then comes from a newer revision, still not older than asked), else start again."""
        self.expiries += 1
        if token_to_go_on:
            self.continue_token = token_to_go_on
        else:
            self.items, self.resource_version, self.continue_token = [], None, None


def unfinished_pods(pods: Iterable[dict]) -> list[str]:
    """Names of the pods that have not ended (phase neither Succeeded nor Failed), sorted."""
    return sorted(
        pod_name(pod)
        for pod in pods
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )


def with_fresh_pods(pods: Iterable[dict], fresh: dict[str, dict]) -> list[dict]:
    """The pods sorted by name, each replaced by its later reading where there is one."""
    return sorted((fresh.get(pod_name(pod), pod) for pod in pods), key=pod_name)


def with_vanished(listed: Iterable[dict], watched: Iterable[dict]) -> list[dict]:
    """The listed pods plus, as last seen, each pod the watch saw that the list no longer has:
    a pod deleted before the list was read is still part of the evidence."""
    pods = {pod_name(pod): pod for pod in watched}
    pods.update((pod_name(pod), pod) for pod in listed)
    return sorted(pods.values(), key=pod_name)


class PodReading(NamedTuple):
    """A Job's pods as read after its end, and how they were read."""

    pods: list[dict]
    # "list" (not older than the Job's end), "final watch" (the pod watch saw each pod's last
    # change), or "watch" when no list could be read
    source: str
    resource_version: str | None
    pages: int
    continue_expiries: int
    reread: list[str]  # pods read again on their own because they still looked unfinished


def pods_final(job: dict | None, pods: Iterable[dict]) -> bool:
    """Whether these pods, as a watch last saw them, are the Complete Job's pods for good, so
    that a list read now would show the same: each ended and was counted by the Job controller
    (which then removes its tracking finalizer, the pod's last change), and the Job counted
    no more pods than these."""
    if not job_counted(job, 0, whole=False):
        return False
    ended = 0
    for pod in pods:
        if not pods_final_one(pod):
            return False
        ended += 1
    return job_counted(job, ended)


def job_counted(job: dict | None, ended: int, whole: bool = True) -> bool:
    """The Job is Complete, with nothing active or uncounted, and (`whole`) it counted no more
    pods than the `ended` ones a watch saw final: what pods_final asks of the Job."""
    status = (job or {}).get("status") or {}
    uncounted = status.get("uncountedTerminatedPods") or {}
    if (
        job_finished(job or {}) != "Complete"
        or status.get("active")
        or uncounted.get("succeeded")
        or uncounted.get("failed")
    ):
        return False
    return not whole or ended >= (status.get("succeeded") or 0) + (status.get("failed") or 0)


def pods_final_one(pod: dict) -> bool:
    """The pod ended, the Job controller counted it, and it is not being deleted: no change is to come."""
    metadata = pod.get("metadata") or {}
    return (
        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        and JOB_TRACKING_FINALIZER not in (metadata.get("finalizers") or [])
        and not metadata.get("deletionTimestamp")
    )


class LogGone(DemoError):
    """A kubelet's answer that it no longer has a container's log (the container removed)."""


class KubectlError(DemoError):
    """A kubectl call that failed: its verb, exit code and stderr."""

    def __init__(self, verb: str, returncode: int | None, stderr: str) -> None:
        self.verb = verb
        self.returncode = returncode
        self.stderr = stderr
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else "no error message"
        try:
            # An API answer read through the proxy is a Status object; its message says it all.
            detail = str(json.loads(stderr)["message"])
        except (ValueError, KeyError, TypeError):
            pass
        status = "no answer" if returncode is None else f"exit {returncode}"
        super().__init__(f"kubectl {verb} failed ({status}): {detail}")

    @property
    def not_found(self) -> bool:
        return "(NotFound)" in self.stderr or " not found" in self.stderr

    @property
    def already_exists(self) -> bool:
        return "(AlreadyExists)" in self.stderr or "already exists" in self.stderr

    @property
    def transient(self) -> bool:
        """True when the same request may well succeed if asked again."""
        if self.returncode is None:
            return True
        text = self.stderr.lower()
        return any(marker in text for marker in TRANSIENT_ERROR_MARKERS)


@functools.lru_cache(maxsize=None)
def linux_prctl() -> Callable[..., int] | None:
    """libc's prctl(2) on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None


class Guardian:
    """One small process per tool process that kills the tool's kubectl process groups once the
    tool is gone, however it ends (a CI timeout's SIGKILL, the OOM killer run no cleanup code).

    PR_SET_PDEATHSIG alone does not do it: it reaches only the process the tool started, and not
    even that once it execs from a thread of its own. The Google Cloud SDK's kubectl is a
    dispatcher that execs the versioned kubectl from a Go thread, and the signal is lost with it:
    a killed tool left its watches and proxy running. So each kubectl starts in a session (and
    process group) of its own, which whatever it starts inherits, and names that group to the
    guardian before it execs (child_setup); the guardian (guardian.py) kills every group still
    named once the last writer of its socket, this process, is gone. Started once, on the first
    kubectl; it costs one Python start-up (about 20 ms) per tool process and one small write per
    kubectl.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._pid: int | None = None  # the guardian's
        self._owner: int | None = None  # the process it guards

    def socket(self) -> socket.socket | None:
        """The socket to name groups on, the guardian started (again) if this process has none
        alive; None where there can be none (then PR_SET_PDEATHSIG alone guards the children)."""
        with self._lock:
            if self._socket is not None and self._owner == os.getpid() and self._alive():
                return self._socket
            self._drop()
            if not guardian_possible():
                return None
            mine, theirs = socket.socketpair()
            try:
                self._pid = os.posix_spawn(
                    sys.executable,
                    [sys.executable, "-I", "-S", "-c", guardian_command(os.getpid())],
                    {**os.environ, GUARDIAN_VARIABLE: GUARDIAN_SOURCE},
                    file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), 0)],
                    setsid=True,
                )
            except OSError:
                mine.close()
                return None
            finally:
                theirs.close()
            self._socket, self._owner = mine, os.getpid()
            return mine

    def _alive(self) -> bool:
        try:
            return self._pid is not None and os.waitpid(self._pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def _drop(self) -> None:
        """Forget the guardian: this process's copy of its socket closed (it ends once no other
        process holds one)."""
        if self._socket is not None:
            self._socket.close()
        self._socket = self._pid = self._owner = None

    def forget(self, group: int) -> None:
        """A group this process has stopped and waited for: the guardian leaves it alone."""
        guard = self._socket
        if guard is not None and self._owner == os.getpid():
            name_group(guard, b"-", group)

    def after_fork_in_child(self) -> None:
        """A child process forked otherwise than to exec a kubectl (multiprocessing, say) lets go of
        the socket, so that the guardian still sees this process's end; it starts a guardian of its
        own should it run kubectl."""
        self._lock = threading.Lock()  # another thread may have held it across the fork
        if getattr(SPAWNING, "kubectl", False):
            return  # a kubectl about to exec: its setup names its group on the socket first
        if self._socket is not None:
            self._socket.close()
        self._socket = self._pid = self._owner = None


def guardian_command(tool: int) -> str:
    """The guardian's `python -c` text: short, and saying what it is to whoever lists processes."""
    return f"import os; exec(os.environ[{GUARDIAN_VARIABLE!r}])  # rl-batch-demo guardian of {tool}"


def guardian_possible() -> bool:
    """A guardian can run here: POSIX process groups, a Python to run it with, and a socket that
    writes without SIGPIPE."""
    return (
        hasattr(os, "posix_spawn")
        and hasattr(os, "killpg")
        and hasattr(socket, "MSG_NOSIGNAL")
        and bool(sys.executable)
        and not getattr(sys, "frozen", False)
    )


def name_group(guard: socket.socket, sign: bytes, group: int) -> None:
    """Tell the guardian of a group ("+": to kill should this process end; "-": to leave alone)."""
    try:
        guard.send(sign + str(group).encode() + b"\n", socket.MSG_NOSIGNAL)
    except OSError:
        pass  # the guardian is gone: PR_SET_PDEATHSIG still stops the group's first process


GUARDIAN = Guardian()
# Set in the thread that is starting a kubectl, so that the fork handlers in its child know it.
SPAWNING = threading.local()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GUARDIAN.after_fork_in_child)


def child_setup(guard: socket.socket | None) -> Callable[[], None]:
    """A kubectl's pre-exec step: a session (and process group) of its own, named to the guardian,
    and killed by the kernel when this process dies (the group, should the guardian be gone)."""
    prctl = linux_prctl()
    parent = os.getpid()

    def setup() -> None:
        os.setsid()
        if guard is not None:
            name_group(guard, b"+", os.getpid())
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)

    return setup


def signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group has ended


class GroupedChild(subprocess.Popen[Any]):
    """A kubectl in a process group of its own: a signal goes to the group (to whatever kubectl
    started too); once it has been waited for, what is left of the group is killed and the
    guardian told to forget it."""

    _released = False

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            signal_group(self.pid, sig)

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None:
            self._release()
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._release()
        return code

    def _release(self) -> None:
        if not self._released:
            self._released = True
            # Its number stays the group's until no member is left, so it names no other group.
            signal_group(self.pid, signal.SIGKILL)
            GUARDIAN.forget(self.pid)


def start_kubectl(argv: list[str], **options: Any) -> GroupedChild:
    """Start one kubectl in a group of its own that dies with this process (Guardian)."""
    guard = GUARDIAN.socket()
    SPAWNING.kubectl = True
    try:
        return GroupedChild(argv, preexec_fn=child_setup(guard), **options)
    finally:
        SPAWNING.kubectl = False


class InterruptsAcrossForks:
    """Holds a Ctrl-C or SIGTERM back while the main thread starts a child, and raises it after.

    A pre-exec step (child_setup) makes the interpreter run its fork handlers in this
    process around the fork. A KeyboardInterrupt raised inside one is printed ("Exception
    ignored in ... _afterFork") and dropped, so the run went on as if never interrupted, and
    it leaves the lock that logging's handler holds over the fork taken, so the next child
    any other thread starts waits for it forever. On a loaded machine the main thread spends
    long enough in fork for both to happen. So while it starts a child, the handler only
    notes the signal; the start then stops that child and raises the interrupt.
    """

    def __init__(self) -> None:
        self.starting = False  # the main thread is starting a child
        self.held = False  # a signal came meanwhile

    def handle(self, signum: int, frame: Any) -> None:
        if self.starting:
            self.held = True
            return
        raise KeyboardInterrupt

    def start(self, starter: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        """The child `starter` starts, with any interrupt held back until it has (inside `holding`,
        until that block ends: whoever holds it stops the child)."""
        if threading.current_thread() is not threading.main_thread():
            return starter()  # signal handlers run in the main thread alone
        if self.starting:
            return starter()
        self.starting, self.held = True, False
        try:
            child = starter()
        except BaseException:
            self.starting = False
            if self.held:
                raise KeyboardInterrupt from None
            raise
        self.starting = False
        if self.held:
            child.kill()
            child.wait()
            raise KeyboardInterrupt
        return child

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """An interrupt held back while the block runs, and raised when it ends. A thread's start
        waits on a lock of the threading module's: an interrupt raised inside that wait leaves the
        lock released twice (RuntimeError) instead of stopping the run as Ctrl-C should."""
        if threading.current_thread() is not threading.main_thread() or self.starting:
            yield
            return
        self.starting, self.held = True, False
        try:
            yield
        except BaseException:
            self.starting = False
            if self.held:
                raise KeyboardInterrupt from None
            raise
        self.starting = False
        if self.held:
            raise KeyboardInterrupt


INTERRUPTS = InterruptsAcrossForks()


class Kubectl:
    """Runs kubectl against one context with bounded requests; counts what it started.

    With `verbose`, every command line (and every request through the proxy) is
    echoed on stderr before it is sent, for a user debugging on a bastion. Only
    argv is echoed, never what kubectl is given on stdin.
    """

    api: ApiProxy | None = None  # a ProxiedKubectl's proxy (watches go through it too)

    def __init__(self, binary: str, context: str | None = None, verbose: bool = False) -> None:
        self.binary = binary
        self.context = context
        self.verbose = verbose
        self.processes = 0
        self.retries = 0
        self._lock = threading.Lock()

    def echo(self, line: str) -> None:
        """Show what is about to be sent, when verbose; one whole line even from many threads."""
        if self.verbose:
            # On a terminal, first erase the progress line being updated there; it is redrawn below.
            erase = "\r\x1b[K" if sys.stderr.isatty() else ""
            with self._lock:
                sys.stderr.write(f"{erase}+ {line}\n")
                sys.stderr.flush()

    def echo_argv(self, argv: Sequence[str]) -> None:
        if self.verbose:
            self.echo(" ".join(shlex.quote(arg) for arg in argv))

    def argv(
        self, args: Sequence[str], request_timeout: str | None = f"{REQUEST_TIMEOUT_SECONDS}s"
    ) -> list[str]:
        argv = [self.binary]
        if self.context:
            argv += ["--context", self.context]
        if request_timeout:
            argv.append(f"--request-timeout={request_timeout}")
        return argv + list(args)

    def run(
        self,
        args: Sequence[str],
        input_text: str | None = None,
        retry_until: float | None = None,
        request_timeout: str | None = f"{REQUEST_TIMEOUT_SECONDS}s",
    ) -> str:
        """Run one request-and-answer call; retry transient failures until `retry_until` (monotonic)."""
        return self.retrying(lambda: self._run_once(args, input_text, request_timeout), retry_until)

    def retrying(self, call: Callable[[], str], retry_until: float | None) -> str:
        """Call, and on a transient failure call again with backoff until `retry_until`; count retries."""
        delay = 0.25
        while True:
            try:
                return call()
            except KubectlError as error:
                if (
                    retry_until is None
                    or not error.transient
                    or time.monotonic() + delay > retry_until
                ):
                    raise
            with self._lock:
                self.retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 4.0)

    def _run_once(
        self, args: Sequence[str], input_text: str | None, request_timeout: str | None
    ) -> str:
        verb = " ".join(a for a in args[:3] if not a.startswith("-"))
        with self._lock:
            self.processes += 1
        argv = self.argv(args, request_timeout)
        self.echo_argv(argv)
        completed = run_to_end(argv, verb, input_text)
        if completed.returncode != 0:
            raise failed_call(verb, completed, self.context)
        return completed.stdout

    def get_json(self, args: Sequence[str], **options: Any) -> Any:
        """Run a call with `-o json`; None when kubectl printed nothing (--ignore-not-found)."""
        text = self.run(list(args) + ["-o", "json"], **options)
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise DemoError(
                f"kubectl {' '.join(args[:2])} printed something that is not JSON"
            ) from None

    def get(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        missing_ok: bool = False,
        retry_until: float | None = None,
    ) -> dict | None:
        """One object; None if it does not exist and `missing_ok` (else that is a KubectlError)."""
        args = ["get", kind, name] + (["-n", namespace] if namespace else [])
        return self.get_json(
            args + (["--ignore-not-found"] if missing_ok else []), retry_until=retry_until
        )

    def get_list(
        self, kind: str, namespace: str | None = None, *flags: str, retry_until: float | None = None
    ) -> dict | None:
        """Every object of a kind (that `flags` such as a label selector let through), as one List."""
        args = ["get", kind] + list(flags) + (["-n", namespace] if namespace else [])
        return self.get_json(args, retry_until=retry_until)

    def create(self, manifest: dict, retry_until: float | None = None) -> dict:
        """Create one object from its manifest; the object as the API server stored it."""
        return self.get_json(
            ["create", "-f", "-"], input_text=json.dumps(manifest), retry_until=retry_until
        )

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        *flags: str,
        retry_until: float | None = None,
    ) -> None:
        """Ask for one object's deletion; one already gone is no error."""
        args = ["delete", kind, name] + (["-n", namespace] if namespace else [])
        self.run(args + list(flags) + ["--ignore-not-found"], retry_until=retry_until)

    def stream(self, args: Sequence[str], seconds: int, stderr: Any = None) -> subprocess.Popen:
        """Start a long-lived call (a watch, the proxy) with requests bounded by `seconds`.

        Like every kubectl this tool starts, it is out of the terminal's reach (a session of its
        own), so Ctrl-C leaves it to this tool to stop, and it dies with this process.
        Its stderr goes to `stderr` (a file) when given, else nowhere anyone reads.
        """
        with self._lock:
            self.processes += 1
        argv = self.argv(args, f"{max(1, seconds)}s")
        self.echo_argv(argv)
        return start_child(argv, stderr or tempfile.TemporaryFile())


def run_to_end(argv: list[str], verb: str, input_text: str | None) -> subprocess.CompletedProcess:
    """Run one request-and-answer kubectl to its end, within CALL_TIMEOUT_SECONDS; it dies with
    this process, and with the call when an interrupt ends it."""
    try:
        process = INTERRUPTS.start(
            lambda: start_kubectl(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    except OSError as error:
        raise DemoError(f"cannot run kubectl {argv[0]!r}: {error.strerror or error}") from None
    with process:
        try:
            # Always an input, if only an empty one: kubectl must never wait on the terminal.
            stdout, stderr = process.communicate(input_text or "", timeout=CALL_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise KubectlError(verb, None, f"no answer within {CALL_TIMEOUT_SECONDS} s") from None
        except BaseException:  # an interrupt: the call ends with it
            process.kill()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def failed_call(
    verb: str, completed: subprocess.CompletedProcess, context: str | None
) -> DemoError:
    """The error of a kubectl call that exited non-zero: a kubeconfig that gives no credentials
    (kubectl asked for a username), else the call's KubectlError."""
    if CREDENTIALS_PROMPT in completed.stdout + completed.stderr:
        return DemoError(
            f"kubectl {verb}: the kubeconfig gives no credentials for context "
            f"{context or '(current)'} and kubectl asked for a username; "
            "log in or fix the kubeconfig's user"
        )
    return KubectlError(verb, completed.returncode, completed.stderr)


def start_child(argv: list[str], errors: Any) -> subprocess.Popen:
    """Start a long-lived kubectl (a watch, the proxy), its stderr to the file `errors`; it dies
    with this process."""
    return INTERRUPTS.start(
        lambda: start_kubectl(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, bufsize=0
        )
    )


def refusal(errors: Any) -> str | None:
    """The API server's "Forbidden" answer in what a finished kubectl wrote to `errors`, if any."""
    try:
        with errors:
            errors.seek(0)
            text = errors.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    refused = [line.strip() for line in text.splitlines() if "(Forbidden)" in line]
    return refused[-1] if refused else None


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: how this tool talks to its own `kubectl proxy`."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def remove_stale_proxy_directories() -> None:
    """Remove the socket directories that killed runs of this tool left behind.

    Only a directory of ours whose run is gone and that holds nothing but the
    socket is removed.
    """
    if os.name != "posix":
        return
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid_text = name[len(PROXY_DIRECTORY_PREFIX) :].split("-", 1)[0]
        if not name.startswith(PROXY_DIRECTORY_PREFIX) or not pid_text.isdigit():
            continue
        path = os.path.join(base, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or set(os.listdir(path)) - {"api.sock"}:
                continue
            os.kill(int(pid_text), 0)
            continue  # that run is still alive
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)


def proxy_listens(path: str) -> bool:
    """Whether a Unix socket accepts connections."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class ApiResource(NamedTuple):
    """Where one kind lives in the API, for the requests the proxy carries in kubectl's stead."""

    prefix: str  # /api/v1, /apis/GROUP/VERSION
    plural: str
    kind: str  # the kind of its objects, which a list's items do not carry
    namespaced: bool


# The kinds a run reads, creates and deletes, by the names kubectl is given for them.
API_RESOURCES = {
    "namespace": ApiResource("/api/v1", "namespaces", "Namespace", False),
    "configmap": ApiResource("/api/v1", "configmaps", "ConfigMap", True),
    "pod": ApiResource("/api/v1", "pods", "Pod", True),
    "pods": ApiResource("/api/v1", "pods", "Pod", True),
    "events": ApiResource("/api/v1", "events", "Event", True),
    "nodes": ApiResource("/api/v1", "nodes", "Node", False),
    "job": ApiResource("/apis/batch/v1", "jobs", "Job", True),
    "jobs": ApiResource("/apis/batch/v1", "jobs", "Job", True),
    "runtimeclass": ApiResource("/apis/node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    "networkpolicy": ApiResource(
        "/apis/networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True
    ),
}
# The kinds of the manifests a run creates, by the name kubectl is given for them.
CREATED_KINDS = {
    "Namespace": "namespace",
    "ConfigMap": "configmap",
    "Job": "job",
    "NetworkPolicy": "networkpolicy",
    "Pod": "pod",
}
# kubectl's reason for an HTTP answer that carries no Status of its own.
HTTP_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def resource_path(kind: str, namespace: str | None, name: str | None = None) -> str:
    """The API path of a kind's collection in a namespace, or of one named object in it."""
    resource = API_RESOURCES[kind]
    path = resource.prefix
    if resource.namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{resource.plural}"
    return f"{path}/{name}" if name else path


def proxied_list_flags(flags: Sequence[str]) -> bool:
    """A list's kubectl flags the proxy can say: a label selector and a page size, no more."""
    rest = list(flags)
    if rest[:1] == ["-l"]:
        rest = rest[2:]
    return all(flag.startswith("--chunk-size=") for flag in rest)


def proxied_delete_flags(flags: Sequence[str]) -> bool:
    """A deletion the proxy can ask for as kubectl would: not waited for, cascading as said."""
    return "--wait=false" in flags and set(flags) <= {
        "--wait=false",
        "--cascade=foreground",
        "--cascade=background",
    }


def server_error(status: int, body: str, creating: bool = False) -> str:
    """What kubectl prints on stderr for an API server's answer `status` with `body`, so that an
    error read through the proxy reads (and is judged: not_found, transient) as kubectl's would."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("kind") != "Status":
        answer = {}
    message = str(answer.get("message") or "") or (
        UNSERVED_PATH_MESSAGE if status == 404 else body.strip() or f"HTTP {status}"
    )
    reason = str(answer.get("reason") or HTTP_REASONS.get(status, "Unknown"))
    if reason == "Invalid" and isinstance(answer.get("details"), dict):
        return invalid_message(answer["details"], message)
    where = 'error when creating "STDIN": ' if creating else ""
    return f"Error from server ({reason}): {where}{message}\n"


def invalid_message(details: dict, message: str) -> str:
    """kubectl's words for an object the API server found invalid: its kind and name, then each
    cause (one on the line, several each on a line of its own)."""
    causes = [
        f"{cause.get('field')}: {cause.get('message')}"
        if cause.get("field")
        else cause.get("message")
        for cause in details.get("causes") or []
        if isinstance(cause, dict)
    ]
    said = f"The {details.get('kind')} {json.dumps(details.get('name') or '')} is invalid"
    if not causes:
        return f"{said}: {message}\n"
    if len(causes) == 1:
        return f"{said}: {causes[0]}\n"
    return f"{said}: \n" + "".join(f"* {cause}\n" for cause in causes)


def status_reason(body: str) -> str | None:
    """The reason of an API answer that is a Status; None for any other answer."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("kind") == "Status":
        return str(answer.get("reason") or "")
    return None


class ApiProxy:
    """One `kubectl proxy` on a private Unix socket, for the many small reads of a batch.

    kubectl limits itself to 5 requests a second after a burst of 10 (so
    `kubectl logs -l` over 500 pods takes 100 s), and every kubectl process costs
    about 0.1 s of CPU. Through the proxy each log or list is one local HTTP
    request at the API server's own speed; authentication stays kubectl's.
    """

    owned = True  # False for a view of a shared proxy (shared_proxy): closing it closes nothing

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl
        remove_stale_proxy_directories()
        # mode 0700: ours alone
        self.directory = tempfile.mkdtemp(prefix=f"{PROXY_DIRECTORY_PREFIX}{os.getpid()}-")
        self.socket_path = os.path.join(self.directory, "api.sock")
        self.process = kubectl.stream(
            ["proxy", f"--unix-socket={self.socket_path}"], REQUEST_TIMEOUT_SECONDS
        )
        deadline = time.monotonic() + PROXY_START_SECONDS
        # The socket's file exists once it is bound, a moment before it listens: wait for both.
        while not proxy_listens(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise DemoError("kubectl proxy did not start")
            time.sleep(0.01)

    def get(self, path: str, retry_until: float | None = None) -> str:
        """GET one API path, retrying transient failures like any kubectl call."""
        return self.kubectl.retrying(lambda: self._get_once(path), retry_until)

    def _get_once(self, path: str) -> str:
        """GET one API path (bounded by the request timeout); KubectlError unless 200."""
        status, body = self.request("GET", path)
        if status is None:
            raise KubectlError(f"GET {path}", None, body)
        if status != 200:
            raise KubectlError(f"GET {path}", status, body)
        return body

    def request(
        self, method: str, path: str, body: str | None = None, content: str = "application/json"
    ) -> tuple[int | None, str]:
        """One request (bounded by the request timeout): its status and answer; status None and
        the error when no answer came (a timeout, or an answer cut off)."""
        separator = "&" if "?" in path else "?"
        target = f"{path}{separator}timeout={REQUEST_TIMEOUT_SECONDS}s"
        self.kubectl.echo(f"{method} {target}")
        connection = UnixHTTPConnection(self.socket_path, REQUEST_TIMEOUT_SECONDS)
        headers = {"Content-Type": content} if body is not None else {}
        try:
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            text = response.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException) as error:
            return None, str(error)
        finally:
            connection.close()
        return response.status, text

    def call(
        self,
        verb: str,
        method: str,
        path: str,
        retry_until: float | None,
        body: str | None = None,
        absent_ok: bool = False,
        content: str = "application/json",
    ) -> str | None:
        """A request in a kubectl call's stead: its answer, retried as that call would be, failing
        with the error that call would give (`verb` names it); None for an object not found when
        `absent_ok`."""

        def once() -> str | None:
            status, text = self.request(method, path, body, content)
            if status is None:
                raise KubectlError(verb, None, text)
            if absent_ok and status == 404 and status_reason(text) is not None:
                return None
            if not 200 <= status < 300:
                raise KubectlError(verb, 1, server_error(status, text, method == "POST"))
            return text

        return self.kubectl.retrying(once, retry_until)  # type: ignore[arg-type]

    def watch(self, path: str, seconds: int, errors: Any) -> ProxyWatch:
        """A watch of `path` for up to `seconds`, in the shape of the kubectl watch it replaces."""
        return ProxyWatch(self, path, seconds, errors)

    def alive(self) -> bool:
        """The proxy runs and listens."""
        return self.process.poll() is None and proxy_listens(self.socket_path)

    def view(self, kubectl: Kubectl) -> ApiProxy:
        """This proxy as `kubectl`'s calls use it (their echo, retries and counts); closing the
        view leaves the proxy running."""
        seen = copy.copy(self)
        seen.kubectl, seen.owned = kubectl, False
        return seen

    def close(self) -> None:
        if not self.owned:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class ProxyWatch:
    """A watch read through the proxy, in the shape of the `kubectl get -w` process it replaces
    (stdout, poll, wait, terminate, kill), so that the same reader takes its events. Its request
    is sent at the first read, in the reader's thread; an answer other than 200 is written to
    `errors` as kubectl would print it, and the watch ends."""

    def __init__(self, proxy: ApiProxy, path: str, seconds: int, errors: Any) -> None:
        self.proxy = proxy
        self.path = f"{path}&timeoutSeconds={max(1, seconds)}"
        self.errors = errors
        self.connection = UnixHTTPConnection(proxy.socket_path, seconds + REQUEST_TIMEOUT_SECONDS)
        self.response: http.client.HTTPResponse | None = None
        self.returncode: int | None = None
        self.stdout = self

    def read(self, size: int) -> bytes:
        """Up to `size` bytes of the watch's events as they come; b"" once it has ended."""
        try:
            if self.response is None:
                if self.returncode is not None:
                    return b""
                self.proxy.kubectl.echo(f"GET {self.path}")
                self.connection.request("GET", self.path)
                self.response = self.connection.getresponse()
                if self.response.status != 200:
                    body = self.response.read().decode("utf-8", errors="replace")
                    self.errors.write(server_error(self.response.status, body).encode())
                    self.errors.flush()
                    self.returncode = 1
                    return b""
            return self.response.read1(size) if self.returncode is None else b""
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            # Stopped (terminate: http.client then finds its socket gone under it), or the
            # connection broke: the watch's end either way.
            return b""

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = 0
        self.connection.close()
        return self.returncode

    def terminate(self) -> None:
        """Stop the watch: its connection shut, so that a read waiting on it returns."""
        if self.returncode is None:
            self.returncode = -signal.SIGTERM
        sock = self.connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    kill = terminate


def read_log(
    kubectl: Kubectl, proxy: ApiProxy | None, namespace: str, pod: str, retry_until: float | None
) -> str:
    """One pod's episode log: through the proxy when there is one, else with `kubectl logs`.
    A kubelet's notice that the log is gone is no log: DemoError, as for any log not read."""
    if proxy is not None:
        text = proxy.get(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log?container={CONTAINER_NAME}", retry_until
        )
    else:
        text = kubectl.run(
            ["logs", pod, "-c", CONTAINER_NAME, "-n", namespace], retry_until=retry_until
        )
    if KUBELET_LOG_GONE.fullmatch(text):
        raise LogGone(f"the kubelet no longer has the log ({text.strip()})")
    return text


def log_gone(error: DemoError) -> bool:
    """read_log failed because the cluster no longer has the log: the pod is gone (404), or its
    kubelet has removed the container."""
    return isinstance(error, LogGone) or (isinstance(error, KubectlError) and error.not_found)


def api_read(kubectl: Kubectl, proxy: ApiProxy | None, path: str, retry_until: float | None) -> str:
    """GET one API path: through the proxy when there is one, else with `kubectl get --raw`."""
    if proxy is not None:
        return proxy.get(path, retry_until)
    separator = "&" if "?" in path else "?"
    return kubectl.run(
        ["get", "--raw", f"{path}{separator}timeout={REQUEST_TIMEOUT_SECONDS}s"],
        retry_until=retry_until,
    )


def read_pages(
    kubectl: Kubectl, proxy: ApiProxy | None, listing: PagedList, retry_seconds: float | None
) -> PagedList:
    """Read a list to its last page; each page is one bounded call, asked again for up to retry_seconds."""
    while not listing.done:
        retry_until = None if retry_seconds is None else time.monotonic() + retry_seconds
        try:
            text = api_read(kubectl, proxy, listing.next_path(), retry_until)
        except KubectlError as error:
            token = expired_continue(error.stderr)
            if token is None or listing.continue_token is None or listing.expiries >= LIST_EXPIRIES:
                raise
            listing.expired(token)
            continue
        try:
            page = json.loads(text)
        except ValueError:
            raise DemoError(
                f"the list of {listing.resource_path} answered something that is not JSON"
            ) from None
        listing.apply(page)
    return listing


def reread_pods(
    kubectl: Kubectl,
    proxy: ApiProxy | None,
    namespace: str,
    names: Iterable[str],
    retry_seconds: float | None,
) -> dict[str, dict]:
    """Each named pod read again on its own (a GET reads the newest revision); unreadable ones are left out."""
    fresh = {}
    for name in names:
        retry_until = None if retry_seconds is None else time.monotonic() + retry_seconds
        try:
            pod = json.loads(
                api_read(kubectl, proxy, f"/api/v1/namespaces/{namespace}/pods/{name}", retry_until)
            )
        except (DemoError, ValueError):
            continue  # gone or unreadable: the earlier reading stays the evidence
        if isinstance(pod, dict) and pod.get("kind") == "Pod":
            fresh[name] = pod
    return fresh


def list_total(page: dict) -> int | None:
    """How many objects a list holds in all, from its first page: the page's items and, when
    more follow, the API's remainingItemCount (None when it does not say)."""
    items = len(page.get("items") or [])
    metadata = page.get("metadata") or {}
    if not metadata.get("continue"):
        return items
    remaining = metadata.get("remainingItemCount")
    return items + int(remaining) if isinstance(remaining, int) else None


def count_events(
    kubectl: Kubectl, proxy: ApiProxy | None, namespace: str, retry_until: float | None
) -> tuple[int | None, str | None]:
    """How many events the namespace holds now, and the revision that was: a list of one,
    read from the newest revision."""
    text = api_read(kubectl, proxy, f"/api/v1/namespaces/{namespace}/events?limit=1", retry_until)
    try:
        page = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(page, dict):
        return None, None
    return list_total(page), (page.get("metadata") or {}).get("resourceVersion")


def read_job_pods(
    kubectl: Kubectl,
    proxy: ApiProxy | None,
    namespace: str,
    job_name: str,
    not_older_than: str | None,
    retry_seconds: float | None,
    page_size: int = LIST_PAGE_SIZE,
    selector: str | None = None,
) -> PodReading:
    """The Job's pods (`selector`: a batch's pods, across its Jobs), listed in pages from a revision
    not older than `not_older_than` (the Job's end as this client saw it); a pod that still looks
    unfinished is read again on its own before anything is concluded from it."""
    listing = read_pages(
        kubectl,
        proxy,
        PagedList(
            f"/api/v1/namespaces/{namespace}/pods",
            selector or f"job-name={job_name}",
            not_older_than,
            page_size,
        ),
        retry_seconds,
    )
    # Items of a list carry no kind; give each the shape `kubectl get -o json` prints.
    pods = [{"apiVersion": "v1", "kind": "Pod", **pod} for pod in listing.items]
    fresh = reread_pods(kubectl, proxy, namespace, unfinished_pods(pods), retry_seconds)
    return PodReading(
        with_fresh_pods(pods, fresh),
        "list",
        listing.resource_version,
        listing.pages,
        listing.expiries,
        sorted(fresh),
    )


def read_events(
    kubectl: Kubectl,
    proxy: ApiProxy | None,
    namespace: str,
    page_size: int,
    retry_seconds: float | None,
) -> PagedList:
    """The namespace's events listed in pages: through the proxy when there is one, else (or
    should that fail) by kubectl."""
    path = f"/api/v1/namespaces/{namespace}/events"
    if proxy is not None:
        try:
            return read_pages(kubectl, proxy, PagedList(path, limit=page_size), retry_seconds)
        except DemoError:
            pass  # ask kubectl below
    return read_pages(kubectl, None, PagedList(path, limit=page_size), retry_seconds)
