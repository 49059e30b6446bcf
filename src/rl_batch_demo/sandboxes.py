"""Live sandboxes over the API server's pod proxy: the pool's pods as the watch tells them, and
each sandbox's requests on kept-alive connections through the tool's one `kubectl proxy`."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from .constants import ANSWER_HEADER, SANDBOX_PORT
from .model import DemoError
from .parse import parse_time
from .kube import UnixHTTPConnection

# How long a request to the proxy waits for its connection and its answer, beyond a command's own
# timeout; a command without one is bounded by this alone.
REQUEST_GRACE_SECONDS = 30.0
# A request that may be sent again (a file's read or write; a command with retry=True) is, while
# the pod still runs, for this long: an API server restarting is back within it.
RETRY_SECONDS = 30.0
# A pod's server is asked whether it listens this often, from its Running until it answers.
PROBE_INTERVAL_SECONDS = 0.02
PROBE_MOST_SECONDS = 120.0
# The pod watch asks the API server to end each watch after this long, and starts another.
WATCH_SECONDS = 240


class SandboxLost(DemoError):
    """The sandbox's pod went away (deleted, evicted, failed, or the API server could not reach
    it) while it was asked something. An infrastructure failure: the episode is not the agent's."""

    failure_class = "infrastructure"

    def __init__(self, pod: str, reason: str) -> None:
        super().__init__(f"sandbox {pod} lost: {reason}")
        self.pod = pod
        self.reason = reason


class CommandResult(NamedTuple):
    """A command's outcome: its exit code (None if it was killed at its timeout before it could
    give one), its output (each stream capped; `truncated` then), the seconds it took in the
    sandbox, and the request's round trip as this client timed it."""

    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    truncated: bool
    timed_out: bool = False
    round_trip_seconds: float = 0.0


class CommandTimeout(DemoError, TimeoutError):
    """A command ran past its timeout and was killed, with everything it started; `result` holds
    what it printed until then."""

    def __init__(self, message: str, result: CommandResult) -> None:
        super().__init__(message)
        self.result = result


class ProxyAnswer(NamedTuple):
    status: int
    body: bytes
    # Not the sandbox's answer: a Kubernetes Status, or an error of `kubectl proxy` (its 500 when
    # the API server cannot be reached), neither of which carries the sandbox's ANSWER_HEADER.
    from_api_server: bool


class OneWriteConnection(UnixHTTPConnection):
    """A request's head and body in one write. http.client sends them in two, and behind
    `kubectl proxy` and the API server the second part of a small request waited: a command's
    round trip through a real API server was 45 ms that way and 3 ms this way."""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if not isinstance(message_body, bytes) or encode_chunked:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        self._buffer.extend((b"", b""))  # type: ignore[attr-defined]
        head = b"\r\n".join(self._buffer)  # type: ignore[attr-defined]
        del self._buffer[:]  # type: ignore[attr-defined]
        self.send(head + message_body)


class ProxyClient:
    """Requests through the tool's `kubectl proxy`: one kept-alive connection per thread, so many
    trainer threads drive many sandboxes with no kubectl process of their own."""

    def __init__(self, socket_path: str, echo: Callable[[str], None]) -> None:
        self.socket_path = socket_path
        self.echo = echo
        self._local = threading.local()

    def _connection(self, timeout: float) -> UnixHTTPConnection:
        connection: UnixHTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = OneWriteConnection(self.socket_path, timeout)
            self._local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection

    def forget(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> ProxyAnswer:
        """One request on this thread's connection; OSError or HTTPException when it broke."""
        self.echo(f"{method} {path}")
        connection = self._connection(timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            # Broken, or left mid-request (Ctrl-C): the next request needs a fresh connection.
            self.forget()
            raise
        if (response.getheader("Connection") or "").lower() == "close":
            self.forget()
        on_the_way = is_status(data) or response.getheader(ANSWER_HEADER) is None
        return ProxyAnswer(response.status, data, response.status != 200 and on_the_way)


def is_status(data: bytes) -> bool:
    """Whether an answer is a Kubernetes Status: the API server's own word, not the sandbox's."""
    try:
        return bool(json.loads(data).get("kind") == "Status")
    except (ValueError, AttributeError):
        return False


@dataclasses.dataclass
class PodView:
    """What the pool knows of one pod: from the watch, and from its server's own answers."""

    name: str
    job: str
    created: str = ""
    phase: str = "Pending"
    ip: str = ""
    node: str = ""
    reason: str = ""  # why it is not (or no longer) usable, in the cluster's words
    deleted: bool = False
    probing: bool = False
    started_at: float | None = None  # its container started: the kubelet's status, whole seconds
    ready_at: float | None = None  # its server began to listen, its own clock
    warm_since: float | None = None  # this client's monotonic clock, when it answered
    claimed: bool = False
    ended_at: float | None = None  # this client's monotonic clock, when it finished or was lost
    traced: int = 0  # its episodes finished: the first one's spans carry its start

    @property
    def usable(self) -> bool:
        return not self.deleted and self.phase == "Running" and bool(self.ip)


def pod_view_update(view: PodView, pod: dict, deleted: bool) -> None:
    """Fold one watched state of a pod into its view."""
    status = pod.get("status") or {}
    view.created = (pod.get("metadata") or {}).get("creationTimestamp") or view.created
    view.phase = status.get("phase") or view.phase
    view.ip = status.get("podIP") or view.ip
    view.node = (pod.get("spec") or {}).get("nodeName") or view.node
    view.deleted = (
        view.deleted or deleted or bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    )
    view.reason = pod_reason(pod, view.deleted)
    view.started_at = container_started(pod) or view.started_at


def container_started(pod: dict) -> float | None:
    """When the pod's container started, as the kubelet's status says (running or ended)."""
    started = None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        stamp = (state.get("running") or state.get("terminated") or {}).get("startedAt")
        started = parse_time(stamp) if stamp else started
    return started


def pod_reason(pod: dict, deleted: bool) -> str:
    """Why a pod is not running, from its status: a waiting or terminated reason, or its phase."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        for kind in ("waiting", "terminated"):
            if state.get(kind):
                detail = state[kind]
                said = detail.get("reason") or kind
                code = detail.get("exitCode")
                return said + (f" (exit code {code})" if code is not None else "")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason')}: {condition.get('message', '')}".strip()
    if deleted:
        return "deleted"
    return status.get("reason") or status.get("phase") or "Pending"


class PoolState:
    """The pool's pods, told by the watch and the probes: which are warm (their server answers
    and nobody holds them), which are starting, which are lost. One lock, one condition."""

    def __init__(self) -> None:
        self.pods: dict[str, PodView] = {}
        self.condition = threading.Condition()
        self.closed = False
        self.warm_order: list[str] = []  # the oldest warm sandbox is claimed first

    def apply(self, pod: dict, deleted: bool, job: str) -> PodView | None:
        """One watched change; the pod's view when it became usable and wants a probe."""
        name = (pod.get("metadata") or {}).get("name") or ""
        with self.condition:
            view = self.pods.setdefault(name, PodView(name, job))
            pod_view_update(view, pod, deleted)
            if not view.usable and name in self.warm_order:
                self.warm_order.remove(name)
            probe = view.usable and view.ready_at is None and not view.probing
            if probe:
                view.probing = True
            self.condition.notify_all()
            return view if probe else None

    def forget_missing(self, listed: set) -> None:
        """A fresh list of the pods: any the pool knew that it lacks went while the watch was
        away (deleted, as a watch would have said)."""
        with self.condition:
            for name, view in self.pods.items():
                if name not in listed and not view.deleted:
                    view.deleted, view.reason = True, "deleted"
                    if name in self.warm_order:
                        self.warm_order.remove(name)
            self.condition.notify_all()

    def warmed(self, name: str, ready_at: float) -> None:
        with self.condition:
            view = self.pods[name]
            view.probing, view.ready_at, view.warm_since = False, ready_at, time.monotonic()
            if view.usable and not view.claimed:
                self.warm_order.append(name)
            self.condition.notify_all()

    def take(self, job: str) -> PodView | None:
        """The oldest warm sandbox of `job`'s pods, now held; None if none is warm."""
        for name in self.warm_order:
            view = self.pods[name]
            if view.job == job:
                self.warm_order.remove(name)
                view.claimed = True
                return view
        return None

    def give_back(self, name: str) -> None:
        """A reused sandbox, made pristine: warm again."""
        with self.condition:
            view = self.pods[name]
            view.claimed, view.warm_since = False, time.monotonic()
            if view.usable:
                self.warm_order.append(name)
            self.condition.notify_all()

    def counts(self, job: str) -> dict[str, int]:
        """How many of `job`'s pods are warm, held, starting, pending or gone."""
        counted = {"warm": 0, "held": 0, "starting": 0, "pending": 0, "gone": 0}
        for view in self.pods.values():
            if view.job != job:
                continue
            if view.deleted or view.phase in ("Succeeded", "Failed"):
                counted["gone"] += 1
            elif view.claimed:
                counted["held"] += 1
            elif view.name in self.warm_order:
                counted["warm"] += 1
            elif view.phase == "Running":
                counted["starting"] += 1
            else:
                counted["pending"] += 1
        return counted

    def waiting_reasons(self, job: str) -> list[str]:
        """The reasons the pods not yet warm give, most common first."""
        reasons: dict[str, int] = {}
        for view in self.pods.values():
            if view.job == job and not view.claimed and view.name not in self.warm_order:
                if not view.deleted and view.phase not in ("Succeeded", "Failed"):
                    reasons[view.reason] = reasons.get(view.reason, 0) + 1
        return [
            f"{count} x {reason}" for reason, count in sorted(reasons.items(), key=lambda r: -r[1])
        ]


def pods_path(namespace: str, query: dict[str, str]) -> str:
    return f"/api/v1/namespaces/{namespace}/pods?{urllib.parse.urlencode(query)}"


def sandbox_path(namespace: str, pod: str, action: str, query: str = "") -> str:
    """The pod proxy's path to one of a sandbox's requests."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{SANDBOX_PORT}/proxy/{action}"
    return path + (f"?{query}" if query else "")


def watch_lines(connection: UnixHTTPConnection, path: str) -> Iterator[dict]:
    """A watch's events, one JSON object a line, as the API server streams them."""
    connection.request("GET", path)
    response = connection.getresponse()
    if response.status != 200:
        raise DemoError(
            f"watch of the pool's pods answered {response.status}: {response.read()[:200]!r}"
        )
    for line in response:
        if line.strip():
            yield json.loads(line)


class PodWatch:
    """The pool's pods, listed then watched through the proxy (no kubectl process of its own),
    each change told to the state; a watch that ends is started again from where it was."""

    def __init__(
        self,
        socket_path: str,
        namespace: str,
        jobs: list[str],
        state: PoolState,
        probe: Callable[[PodView], None],
    ) -> None:
        self.socket_path, self.namespace, self.jobs = socket_path, namespace, jobs
        self.state, self.probe = state, probe
        self.stopped = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(
            target=self._follow, name="rl-batch-demo pool watch", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _tell(self, pod: dict, deleted: bool) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name") or ""
        if job in self.jobs:
            view = self.state.apply(pod, deleted, job)
            if view is not None:
                self.probe(view)

    def _follow(self) -> None:
        version = ""
        while not self.stopped.is_set():
            connection = UnixHTTPConnection(self.socket_path, WATCH_SECONDS + REQUEST_GRACE_SECONDS)
            try:
                if not version:
                    version = self._list(connection)
                query = {
                    "watch": "1",
                    "resourceVersion": version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": str(WATCH_SECONDS),
                }
                for event in watch_lines(connection, pods_path(self.namespace, query)):
                    if self.stopped.is_set():
                        return
                    version = self._event(event, version)
            except (OSError, http.client.HTTPException, ValueError, DemoError) as error:
                self.error = str(error)
                if self.stopped.wait(0.2):
                    return
            finally:
                connection.close()

    def _list(self, connection: UnixHTTPConnection) -> str:
        connection.request("GET", pods_path(self.namespace, {}))
        response = connection.getresponse()
        listed = json.loads(response.read())
        if response.status != 200:
            raise DemoError(f"listing the pool's pods answered {response.status}")
        items = listed.get("items") or []
        for pod in items:
            self._tell(pod, False)
        self.state.forget_missing({(p.get("metadata") or {}).get("name") for p in items})
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _event(self, event: dict, version: str) -> str:
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            return ""  # expired (410 Gone): list again
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._tell(pod, kind == "DELETED")
        return str((pod.get("metadata") or {}).get("resourceVersion") or version)


def encoded_stdin(stdin: str | bytes | None) -> str:
    if stdin is None:
        return ""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return base64.b64encode(data).decode("ascii")


def command_text(command: str | Sequence[str]) -> str:
    """A command as one line, for commands.jsonl and errors."""
    if isinstance(command, str):
        return command
    return " ".join(part if part and " " not in part else json.dumps(part) for part in command)
