"""Watching a batch: its Jobs as one, its watches and their queue, polling when they break, the
progress line, and its episode logs read as its pods end.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import dataclasses
import functools
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from .constants import (
    BATCH_LABEL,
    CALL_TIMEOUT_SECONDS,
    CLIENT_GRACE_SECONDS,
    COLLECT_RETRY_SECONDS,
    POLL_INTERVAL_SECONDS,
    WATCH_EVENTS_WAITING_MOST,
    WATCH_RESTARTS_BEFORE_POLLING,
)
from .model import DemoError
from .files import write_text
from .parse import condition, container_terminated, iter_json_stream, merged_job, pod_name
from .manifests import list_manifest
from .kube import INTERRUPTS, ApiProxy, Kubectl, log_gone, read_log, refusal


class BatchJobs:
    """The Jobs of one batch as they were last seen: its one Job, or one per image, which the
    follower and the evidence read as one (merged_job). `names`: in creation order."""

    def __init__(self, batch: str, names: Sequence[str]) -> None:
        self.batch = batch
        self.names = list(names)
        self.seen: dict[str, dict] = {}

    @property
    def several(self) -> bool:
        return len(self.names) > 1

    def see(self, job: dict) -> dict | None:
        """Take one Job as read; the batch's Job as it now stands (None: not one of the batch's)."""
        name = (job.get("metadata") or {}).get("name")
        if name not in self.names:
            return None
        self.seen[name] = job
        return self.view()

    def view(self) -> dict | None:
        """The batch's Job: the one Job as read, or the merge of those seen so far."""
        jobs = [self.seen[name] for name in self.names if name in self.seen]
        if not jobs:
            return None
        return merged_job(self.batch, jobs, len(self.names)) if self.several else jobs[0]

    def saved(self) -> dict | None:
        """job.json: the one Job, or every Job seen as a v1 List."""
        if not self.several:
            return self.view()
        return (
            list_manifest([self.seen[name] for name in self.names if name in self.seen])
            if self.seen
            else None
        )

    def job_selector(self) -> list[str]:
        """kubectl's arguments that list (or watch) the batch's Jobs and no other."""
        if self.several:
            return ["-l", f"{BATCH_LABEL}={self.batch}"]
        # A list watch, not `get job NAME -w`: for one named object kubectl drops its
        # watch's first event, losing any change made between its GET and its watch.
        return ["--field-selector", f"metadata.name={self.names[0]}"]

    def pod_selector(self) -> str:
        """The label selector of the batch's pods."""
        return f"{BATCH_LABEL}={self.batch}" if self.several else f"job-name={self.names[0]}"


def saved_batch_job(saved: dict, batch: str) -> dict:
    """The batch's Job from job.json as saved: the one Job, or the merge of a List of them."""
    if saved.get("kind") != "List":
        return saved
    jobs = BatchJobs(batch, [job["metadata"]["name"] for job in saved.get("items") or []])
    for job in saved.get("items") or []:
        jobs.see(job)
    return jobs.view() or {"metadata": {"name": batch}}


class LogRead(NamedTuple):
    """A pod's log was read after its container ended: its episode may be settled now."""

    pod: str


class WatchEvent(NamedTuple):
    """What a watch printed: of the Job, the pods or the events (`kind`), and when it arrived."""

    kind: str
    event: dict
    arrived: float


class WatchEnded(NamedTuple):
    """A watch's process ended; `refusal`: the API's refusal it printed, if it was one."""

    kind: str
    refusal: str | None


class WatchRoom:
    """Room for at most `most` watch events waiting in the queue: a watch's reader waits for room
    before it puts the next (and so stops reading its pipe), until its watch is stopped. The
    other items (a watch's end, a log read) take no room, so that no reader of logs ever waits."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.waiting = 0
        self._changed = threading.Condition()

    def enter(self, stopped: threading.Event) -> None:
        """Wait for room for one more event, or for this watch to be stopped (then its last
        events, at most what its pipe held, are taken in without waiting)."""
        with self._changed:
            while self.waiting >= self.most and not stopped.is_set():
                self._changed.wait()
            self.waiting += 1

    def leave(self) -> None:
        """One event was taken from the queue."""
        with self._changed:
            self.waiting = max(0, self.waiting - 1)
            self._changed.notify()

    def wake(self) -> None:
        """A watch was stopped: its reader, if waiting for room, waits no more."""
        with self._changed:
            self._changed.notify_all()


class WatchStream:
    """One batch's watches (`kubectl get -w` of its Job, its pods, the namespace's events): each
    process's output turned by a thread into queue items, a WatchEvent for each event and a
    WatchEnded at its end; and how often each broke in a row, for the restarts. At most `most`
    events wait in the queue (WatchRoom): `get` is how they are taken out."""

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        job_name: str,
        jobs: BatchJobs | None = None,
        most: int = WATCH_EVENTS_WAITING_MOST,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.job_name = job_name
        self.jobs = jobs or BatchJobs(job_name, [job_name])
        self.queue: queue.Queue[WatchEvent | WatchEnded | LogRead] = queue.Queue()
        self.room = WatchRoom(most)
        self.processes: dict[str, subprocess.Popen] = {}
        self._stopped: dict[str, threading.Event] = {}
        self.failures = {"job": 0, "pods": 0, "events": 0}

    def get(self, timeout: float | None) -> WatchEvent | WatchEnded | LogRead:
        """The next item, waiting up to `timeout` seconds (None: not at all); queue.Empty if none."""
        item = self.queue.get_nowait() if timeout is None else self.queue.get(timeout=timeout)
        if isinstance(item, WatchEvent):
            self.room.leave()
        return item

    def log_read(self, pod: str) -> None:
        """From a log reader's thread: a pod's log was read after its end. Its item, which takes no
        room, wakes the follower to settle the pod's episode."""
        self.queue.put(LogRead(pod))

    def __contains__(self, kind: str) -> bool:
        return kind in self.processes

    def __len__(self) -> int:
        return len(self.processes)

    def start(self, kind: str, client_deadline: float) -> None:
        seconds = math.ceil(client_deadline - time.monotonic())
        if kind == "job":
            args = ["get", "jobs", *self.jobs.job_selector()]
        elif kind == "events":
            args = ["get", "events"]
        else:
            args = ["get", "pods", "-l", self.jobs.pod_selector()]
        args += ["-n", self.namespace, "-o", "json", "--watch", "--output-watch-events"]
        errors = tempfile.TemporaryFile()
        # An interrupt comes once the watch is whole: its process, known to be stopped, and its reader.
        with INTERRUPTS.holding():
            try:
                process: Any = (
                    self.kubectl.stream(args, seconds, stderr=errors)
                    if self.kubectl.api is None
                    else self.kubectl.api.watch(self.api_path(kind), seconds, errors)
                )
            except OSError as error:
                errors.close()
                raise DemoError(f"cannot run kubectl {self.kubectl.binary!r}: {error}") from None
            self.processes[kind] = process
            stopped = self._stopped[kind] = threading.Event()
            threading.Thread(
                target=self._pump, args=(kind, process, errors, stopped), daemon=True
            ).start()

    def api_path(self, kind: str) -> str:
        """The API path that watches what `start` would have kubectl watch: from the objects there
        now (each an ADDED event first, as kubectl lists them) onwards."""
        if kind == "job":
            resource = f"/apis/batch/v1/namespaces/{self.namespace}/jobs"
            query = (
                {"labelSelector": f"{BATCH_LABEL}={self.jobs.batch}"}
                if self.jobs.several
                else {"fieldSelector": f"metadata.name={self.jobs.names[0]}"}
            )
        elif kind == "events":
            resource, query = f"/api/v1/namespaces/{self.namespace}/events", {}
        else:
            resource = f"/api/v1/namespaces/{self.namespace}/pods"
            query = {"labelSelector": self.jobs.pod_selector()}
        return f"{resource}?{urllib.parse.urlencode(dict(query, watch='1'))}"

    def _pump(
        self, kind: str, process: subprocess.Popen, errors: Any, stopped: threading.Event
    ) -> None:
        """Turn a watch's output into queue items, each once there is room; say when it ends."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def chunks() -> Iterator[str]:
            while True:
                data = process.stdout.read(65536)  # type: ignore[union-attr]
                if not data:
                    return
                yield decoder.decode(data)

        try:
            for value in iter_json_stream(chunks()):
                self.room.enter(stopped)
                self.queue.put(WatchEvent(kind, value, time.time()))
        except (OSError, ValueError):
            pass  # the pipe closed under us: reported as the watch's end below
        process.wait()
        self.queue.put(WatchEnded(kind, refusal(errors)))

    def restart(self, kind: str, client_deadline: float) -> None:
        """Start a broken watch again, after a pause that grows with its breaks in a row."""
        time.sleep(min(2.0, 0.2 * 2 ** self.failures[kind]))
        self.start(kind, client_deadline)

    def stop(self, keep: Sequence[str] = ()) -> None:
        stopping = {kind: process for kind, process in self.processes.items() if kind not in keep}
        for kind, process in stopping.items():
            if kind in self._stopped:
                self._stopped[kind].set()
            if process.poll() is None:
                process.terminate()
        self.room.wake()
        for kind, process in stopping.items():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
            del self.processes[kind]


class PollFallback:
    """Once the watches broke too often in a row to be worth restarting: the Job and its pods,
    read every POLL_INTERVAL_SECONDS instead."""

    def __init__(
        self, kubectl: Kubectl, namespace: str, job_name: str, jobs: BatchJobs | None = None
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.job_name = job_name
        self.jobs = jobs or BatchJobs(job_name, [job_name])
        self.active = False
        self.next_read = 0.0

    def start(self) -> None:
        """Poll from now on, the first read at once."""
        self.active = True
        self.next_read = time.monotonic()

    def due(self, now: float) -> bool:
        return self.active and now >= self.next_read

    def read(self, client_deadline: float) -> tuple[list[dict], list[dict], float]:
        """The batch's Jobs and its pods as read now, and when (the client's wall clock)."""
        retry_until = min(client_deadline, time.monotonic() + CALL_TIMEOUT_SECONDS)
        if self.jobs.several:
            jobs = (
                self.kubectl.get_list(
                    "jobs", self.namespace, *self.jobs.job_selector(), retry_until=retry_until
                )
                or {}
            ).get("items", [])
        else:
            jobs = [self.kubectl.get("job", self.job_name, self.namespace, retry_until=retry_until)]
        pods = self.kubectl.get_list(
            "pods", self.namespace, "-l", self.jobs.pod_selector(), retry_until=retry_until
        )
        return jobs, (pods or {}).get("items", []), time.time()

    def poll(self, client_deadline: float, apply: Callable[[str, str, dict, float], Any]) -> None:
        """Read the batch's Jobs and its pods now, and hand each to `apply` as a watch would have
        (kind, change, object, when it arrived); the next read follows once they are taken in."""
        jobs, pods, seen = self.read(client_deadline)
        for pod in pods:
            apply("pods", "ADDED", pod, seen)
        for job in jobs:
            apply("job", "MODIFIED", job, seen)
        self.taken_in()

    def taken_in(self) -> None:
        """The last read is taken in: the next one follows a whole interval later, however long
        thousands of pods took to apply."""
        self.next_read = time.monotonic() + POLL_INTERVAL_SECONDS


@dataclasses.dataclass
class WaitCost:
    """What following a Job cost the client: the kubectl processes it started while waiting, the
    watches it restarted, and the most watch items ever waiting to be handled (a client that
    keeps up keeps that small)."""

    processes: int = 0
    restarts: int = 0
    queue_peak: int = 0

    def took(self, waiting: int) -> None:
        """One watch item taken, with `waiting` more behind it."""
        self.queue_peak = max(self.queue_peak, waiting + 1)


class BatchWatching:
    """How one batch is watched: its watches (WatchStream) started, and one that broke restarted;
    after repeated breaks in a row, the Job and its pods polled instead (PollFallback), or the
    events, which can be listed after the end, given up; and what the waiting cost (WaitCost)."""

    def __init__(self, watches: WatchStream, poller: PollFallback, cost: WaitCost) -> None:
        self.watches = watches
        self.poller = poller
        self.cost = cost
        # The namespace's events are followed while waiting so that little is left to read at the
        # end; not watched (then listed at the end) when the watch is refused or broke for good.
        self.events_watched = True

    @property
    def polling(self) -> bool:
        """The watches gave up for good: the Job and its pods are read every POLL_INTERVAL_SECONDS."""
        return self.poller.active

    def start(self, client_deadline: float) -> None:
        """Start each watch not running yet (one may be, started before the proxy was opened),
        none of them broken yet."""
        self.watches.failures = {"job": 0, "pods": 0, "events": 0}
        for kind in ("job", "pods", "events"):
            if kind not in self.watches:
                self.watches.start(kind, client_deadline)

    def next_item(self, client_deadline: float) -> WatchEvent | WatchEnded | LogRead | None:
        """The watches' next item, should one come before the next poll; else (None) within a
        second, so that the progress is shown again even when nothing arrives."""
        wake = self.poller.next_read if self.polling else time.monotonic() + 1.0
        wait = min(client_deadline, wake) - time.monotonic()
        try:
            item = self.watches.get(timeout=max(0.01, wait))
        except queue.Empty:
            return None
        self.cost.took(self.watches.queue.qsize())
        return item

    def ended(
        self, kind: str, refusal: str | None, batch_ended: bool, client_deadline: float
    ) -> None:
        """A watch ended: restarted, or after repeated breaks polled instead (the events, which
        can be listed after the end, are given up instead). `batch_ended`: the Job's end was seen."""
        self.watches.processes.pop(kind, None)
        if kind == "events" and (
            refusal or self.watches.failures[kind] >= WATCH_RESTARTS_BEFORE_POLLING
        ):
            self._unwatch_events(refusal)
            return
        if batch_ended or self.polling:
            return
        if refusal:
            # Refused for good, unlike a broken connection: each restart would list and be
            # refused again, so say what is missing instead of looping.
            raise DemoError(f"cannot watch the {kind}: {refusal}")
        self.watches.failures[kind] += 1
        if self.watches.failures[kind] > WATCH_RESTARTS_BEFORE_POLLING:
            self.poller.start()
            self.watches.stop()
            return
        self.cost.restarts += 1
        self.watches.restart(kind, client_deadline)

    def _unwatch_events(self, refusal: str | None) -> None:
        """The events are listed after the end instead, as they can be without a watch; said
        once, since for thousands of pods that list is the slow part of the end."""
        if self.events_watched:
            why = refusal or f"it broke {self.watches.failures['events'] + 1} times in a row"
            print(
                f"Warning: cannot watch the events ({why}); they are listed after the Job "
                f"ends instead (grant watch on events to follow them)",
                file=sys.stderr,
                flush=True,
            )
        self.events_watched = False

    def followed(self, kind: str) -> bool:
        """The watch of `kind` runs and is what the follower goes by."""
        return (
            kind in self.watches and not self.polling and (kind != "events" or self.events_watched)
        )


def waiting_note(job: dict | None, elapsed: float) -> str:
    """What the client is waiting for once the Job has stopped running pods, else nothing."""
    job = job or {}
    failure = condition(job, "FailureTarget")
    if failure and failure.get("status") == "True":
        return (
            f"  ({failure.get('reason', 'failing')}: waiting for the pods to stop before Kubernetes "
            f"marks the Job Failed)"
        )
    success = condition(job, "SuccessCriteriaMet")
    if success and success.get("status") == "True":
        return "  (all succeeded: waiting for the pods to stop before Kubernetes marks the Job Complete)"
    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(deadline, int) and elapsed > deadline:
        return (
            f"  (past the Job's {deadline} s deadline: waiting up to {CLIENT_GRACE_SECONDS} s more for "
            f"the Job controller to end it)"
        )
    return ""


def status_line(job_name: str, count: int, job: dict | None, elapsed: float, polling: bool) -> str:
    """The progress shown while a Job is followed: its pods by state, the time since it was submitted,
    and what the client is waiting for once no pod runs."""
    status = (job or {}).get("status") or {}
    return (
        f"{job_name}: {elapsed:6.1f}s  "
        f"active {status.get('active', 0)}  ready {status.get('ready', 0)}  "
        f"succeeded {status.get('succeeded', 0)}/{count}  failed {status.get('failed', 0)}"
        + ("  (polling)" if polling else "")
        + waiting_note(job, elapsed)
    )


class LogReader:
    """The one place a batch's episode logs are read: each as its container ends (saved at once to
    the batch directory, so little is left to write at the end), and at collection whatever is missing."""

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        pool: concurrent.futures.ThreadPoolExecutor,
        proxy: ApiProxy | None = None,
        log_dir: str | None = None,
        on_read: Callable[[str], None] | None = None,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.pool = pool
        self.proxy = proxy
        self.log_dir = log_dir
        # Pod name -> (containerID, log) read after that container terminated: complete. Each is
        # saved as <pod>.log as it is read, but for the names in _unsaved (the disk refused it).
        self.early: dict[str, tuple[str, str]] = {}
        self._unsaved: set[str] = set()
        # Each pod's container whose log is read once (a restarted one's is read again), and the
        # reads not done yet: a done read's Future (a lock, a condition and their queue, a
        # kilobyte) is not kept.
        self._scheduled: dict[str, str] = {}
        self._reads: dict[tuple[str, str], concurrent.futures.Future] = {}
        # Told (from a reader's thread) the name of each pod whose log was read after its end.
        self.on_read = on_read

    def schedule(self, ended: Iterable[tuple[str, str]]) -> None:
        """Read the log of each ended container once; keyed by container, so a restarted one's is read again."""
        for key in ended:
            name, container_id = key
            if self._scheduled.get(name) != container_id:
                self._scheduled[name] = container_id
                self._reads[key] = read = self.pool.submit(self._read_early, *key)
                read.add_done_callback(functools.partial(self._read_done, key))

    def _read_done(self, key: tuple[str, str], read: concurrent.futures.Future) -> None:
        self._reads.pop(key, None)

    def _read_early(self, name: str, container_id: str) -> None:
        try:
            text = read_log(
                self.kubectl,
                self.proxy,
                self.namespace,
                name,
                time.monotonic() + COLLECT_RETRY_SECONDS,
            )
            # Unsaved before it is published: collect(), which may stop waiting for this read,
            # then saves the log itself rather than count on a write that may yet fail.
            self._unsaved.add(name)
            self.early[name] = (container_id, text)
            if self.log_dir is not None:
                write_text(os.path.join(self.log_dir, f"{name}.log"), text)
                self._unsaved.discard(name)
        except DemoError:
            return  # read again (and saved) when the batch's evidence is collected
        if self.on_read is not None:
            self.on_read(name)

    def collect(
        self, pods: Sequence[dict], batch_dir: str, retry_until: float | None, problems: list[str]
    ) -> dict[str, str]:
        """Each pod's episode log, read after its container ended (else read now) and saved in
        `batch_dir`; unreadable -> empty, and why goes to `problems`."""
        concurrent.futures.wait(list(self._reads.values()), timeout=CALL_TIMEOUT_SECONDS)
        logs: dict[str, str] = {}
        pending = {}
        for pod in pods:
            name = pod_name(pod)
            terminated = container_terminated(pod)
            read_early = self.early.get(name)
            if (
                terminated is not None
                and read_early
                and read_early[0] == terminated.get("containerID", "")
            ):
                logs[name] = read_early[1]
            else:
                pending[name] = self.pool.submit(
                    read_log, self.kubectl, self.proxy, self.namespace, name, retry_until
                )
        # A pod deleted (by the Job's end: a straggler --need cancelled, one cut short) takes its
        # log with it, sooner or later: that it is gone is no failure to save, and the episode's
        # row says how its pod ended.
        deleted = {pod_name(pod) for pod in pods if pod["metadata"].get("deletionTimestamp")}
        for name, future in pending.items():
            try:
                logs[name] = future.result()
            except DemoError as error:
                logs[name] = ""
                if name in deleted and log_gone(error):
                    continue
                problems.append(f"{name}.log: {error}")
        logs = dict(sorted(logs.items()))
        for name, text in logs.items():
            read_early = self.early.get(name)
            if read_early is None or read_early[1] is not text or name in self._unsaved:
                write_text(os.path.join(batch_dir, f"{name}.log"), text)
        return logs


def ended_logs(attempts: Sequence[dict], early: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The logs of these pods read after their container ended; an ended pod whose container never
    ran has none to read (empty)."""
    logs = {}
    for pod in attempts:
        name = pod_name(pod)
        terminated = container_terminated(pod)
        read = early.get(name)
        if terminated is not None and read and read[0] == terminated.get("containerID", ""):
            logs[name] = read[1]
        elif terminated is None and pod_terminal(pod):
            logs[name] = ""
    return logs


def pod_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
