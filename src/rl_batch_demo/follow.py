"""Following a batch: the state its watches feed, its rewards, the follower, its evidence."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import json
import os
import queue
import sys
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence, TextIO

from .constants import COLLECT_RETRY_SECONDS, PAGE_RETRY_SECONDS, SETTLE_SECONDS
from .model import COMMAND_LINE, DemoError, RunPlan, Settings, Spelling, StopRequest
from .files import EncodedItems, ONE_LINE_ITEMS_FROM, Receipt, pod_json, write_json, write_text
from .store import SharedStrings, Spool
from .parse import (
    EventRecord,
    batch_events,
    container_terminated,
    event_records,
    events_table_lines,
    job_finished,
    pod_name,
    pod_warnings,
)
from .manifests import list_manifest
from .timing import pod_observation, record_job_observation
from .outcomes import (
    Delivery,
    batch_job_whole,
    container_end_bounds,
    episode_row,
    group_images,
    pod_index,
    pods_by_index,
    rewards_jsonl,
    settled_attempt,
)
from .summary import EpisodeDrafts, EventIndex, EventStore, SPARE_HELD_SECONDS
from .kube import (
    ApiProxy,
    Kubectl,
    PagedList,
    PodReading,
    count_events,
    job_counted,
    pods_final_one,
    read_events,
    read_job_pods,
    reread_pods,
    unfinished_pods,
    with_fresh_pods,
    with_vanished,
)
from .watch import (
    BatchJobs,
    BatchWatching,
    LogRead,
    LogReader,
    PollFallback,
    WaitCost,
    WatchEnded,
    WatchEvent,
    WatchStream,
    ended_logs,
    pod_terminal,
    status_line,
)


class Progress:
    """Live progress on stderr: one updating line on a terminal, a line every few seconds otherwise."""

    def __init__(self, quiet: bool, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.2 if self.interactive else 5.0
        self._last = 0.0
        self._open_line = False

    def due(self) -> bool:
        """Whether an update now would be shown: the caller need not make the line otherwise."""
        return not self.quiet and time.monotonic() - self._last >= self.interval

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.quiet or (not force and now - self._last < self.interval):
            return
        self._last = now
        if self.interactive:
            self.stream.write("\r" + text + "\x1b[K")
            self._open_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def new_batch(self) -> None:
        """The next update is shown at once: each batch's progress starts with a line of its own."""
        self._last = 0.0

    def finish(self) -> None:
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False


class StateChange(NamedTuple):
    """What one change did to a batch's state, as BatchState.apply returns it."""

    kind: str  # "job", "pods" or "events"
    pod: str | None = None  # the pod it was about (also when deleted)
    ended: tuple[
        tuple[str, str], ...
    ] = ()  # (pod, containerID) of each episode container it shows ended
    job_ended: bool = False  # this is the change that showed the Job's end


class BatchState:
    """What the watches of one Job have said: a pure reducer of their changes, with no
    thread, process or clock of its own; `apply` is the one way a change comes in.

    It holds the Job and each pod as last seen (a pod once, its repeated texts and parts
    shared once it has ended), the namespace's events, and when (the client's wall clock, given
    with each change) each transition first arrived: an upper bound on when it happened,
    kept for `report` as observed.json.
    """

    def __init__(
        self,
        indented_pods: bool = False,
        spool_dir: str | None = None,
        shared: SharedStrings | None = None,
        index: EventIndex | None = None,
    ) -> None:
        self.job: dict | None = None
        self.pods: dict[str, dict] = {}
        self._not_final: set[str] = set()  # the pods held whose version is not final
        self.deleted: set[str] = set()
        # One table of shared texts for the pods and the events (and the drafts, given theirs,
        # and the index of the events they read).
        self._shared = shared or SharedStrings()
        self.events = EventStore(spool_dir, self._shared, index)
        # pod name -> transition -> time, and the stamps seen only while it ran
        self.observed: dict[str, dict[str, Any]] = {}
        self.job_observed: dict[
            str, float
        ] = {}  # "added" or a condition type that turned True -> time
        self.end: str | None = None
        # The Job's resourceVersion when its end was seen: the evidence read afterwards
        # must be at least this new, however far behind the pod watch is.
        self.end_resource_version: str | None = None
        # Each pod's text for pods.json, encoded as soon as the pod looks final (ended, counted,
        # not being deleted) rather than all at the end; name -> the resourceVersion encoded.
        self._final_texts = Spool(spool_dir, "pods.json")
        self._final_versions: dict[str, str] = {}
        # A small batch's pods.json is indented (see pod_text), in pure Python: made as each pod
        # ends, that costs nothing after the end.
        self.indented_pods = indented_pods

    def apply(self, kind: str, change: str, obj: dict, arrived: float) -> StateChange:
        """One change a watch (or a poll) delivered about the Job ("job"), a pod ("pods") or an
        event ("events"): `change` is the watch's type (ADDED, MODIFIED, DELETED), `arrived`
        when it reached the client."""
        if kind == "job":
            return StateChange(kind, job_ended=self._on_job(obj, arrived))
        if kind == "events":
            self.events.apply(change, obj)
            return StateChange(kind)
        return self._on_pod(obj, change == "DELETED", arrived)

    def submitted(self, at: float) -> None:
        """The client's create call for the Job starts now (its wall clock)."""
        self.job_observed["submitted"] = at

    def created(self, at: float) -> None:
        """The client's create call for the Job returned (its wall clock)."""
        self.job_observed["create_returned"] = at

    def _on_job(self, job: dict, arrived: float) -> bool:
        """Take the Job as last seen; True when this is the change that showed its end."""
        self.job = job
        record_job_observation(self.job_observed, job, arrived)
        end = job_finished(job)
        if not end or self.end is not None:
            return False
        self.end_resource_version = job.get("metadata", {}).get("resourceVersion") or None
        self.end = end
        return True

    def _on_pod(self, pod: dict, deleted: bool, arrived: float) -> StateChange:
        name = (pod.get("metadata") or {}).get("name")
        if not name:
            return StateChange("pods", name)
        # The one object for the name, whichever version (or event) told it first: every table
        # keyed by the pod (its version held, what was seen, its log read, its draft) shares it.
        name = self._shared.text(name)
        if deleted:
            # Keep the last state seen: a pod that vanished is still part of the evidence.
            self.deleted.add(name)
            self._hold(name, self.pods.get(name, pod))
            return StateChange("pods", name)
        if pods_final_one(pod):
            # Its state from now on is what is held to the end: worth holding small (an ended
            # pod the Job controller has yet to count changes once more, at once).
            pod = self._shared.share(pod)
            self._final_texts.put(name, pod_json(pod, self.indented_pods))
            self._final_versions[name] = pod["metadata"].get("resourceVersion")
        self._hold(name, pod)
        seen_before = self.observed.get(name)
        seen_now = pod_observation(seen_before, pod, arrived)
        if seen_now is not seen_before:
            # Its texts shared: a stamp of one second is every pod's of that second.
            self.observed[name] = self._shared.texts(seen_now)
        terminated = container_terminated(pod)
        if terminated is None:
            return StateChange("pods", name)
        # Shared too: the log reader keeps it, and the pod's final version has it again.
        return StateChange(
            "pods", name, ((name, self._shared.text(terminated.get("containerID", ""))),)
        )

    def _hold(self, name: str, pod: dict) -> None:
        """Hold this version of a pod, noting whether it is final (pods_final_one): the watch
        asks after each change whether every pod is, which must not read each of 100,000."""
        self.pods[name] = pod
        if pods_final_one(pod):
            self._not_final.discard(name)
        else:
            self._not_final.add(name)

    def pod_text(self, pod: dict, indented: bool = False) -> bytes:
        """A pod as pods.json holds it (see pod_json), UTF-8: the text encoded while waiting when
        it is of this very version and in this form."""
        name = pod_name(pod)
        version = pod["metadata"].get("resourceVersion")
        if (
            version is not None
            and self._final_versions.get(name) == version
            and self.pods.get(name) is pod
            and indented == self.indented_pods
        ):
            return self._final_texts.get_bytes(name)
        return pod_json(pod, indented).encode("utf-8")

    def forget_shared(self) -> None:
        """Once nothing more is watched: the tables of shared strings are of no more use."""
        self._shared.table.clear()
        self.events.forget_shared()

    def pods_are_final(self) -> bool:
        """Each pod of the Complete Job was seen to its final state (see pods_final)."""
        # As pods_final(self.job, self.pods.values()), from what _hold noted of each pod.
        return (
            self.end == "Complete"
            and not self.deleted
            and not self._not_final
            and job_counted(self.job, len(self.pods))
        )

    def observations(self) -> dict:
        """What the watches saw and when, as saved in observed.json."""
        return {"clock": "client (time.time())", "pods": self.observed, "job": self.job_observed}


class RewardCallbackError(Exception):
    """The caller's on_reward callback raised: the run stops as an interruption does, and the
    callback's own exception (`original`) is raised to the caller."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"on_reward raised {type(original).__name__}: {original}")
        self.original = original


def whole_group(rows: dict[int, dict], index: int, size: int) -> set[int]:
    """{the episode's group} once every member of it has a valid line, else {}."""
    members = range(index // size * size, index // size * size + size)
    return {index // size} if all(rows.get(m, {}).get("valid") for m in members) else set()


class RewardStream:
    """rewards.jsonl while the batch runs: each episode's line is appended (and flushed) the moment its
    outcome is final, and never changed; at the end the file is rewritten whole, in index order, with
    the very same lines and those of the episodes settled only by the evidence read after the end.

    `judge` is told which pods changed (or whose log was read) and settles their episodes;
    `on_reward`, if given, is called with each line's row as it is written, from the thread that
    follows the batch (the one that called `run`): the following waits until it returns.
    """

    def __init__(
        self,
        path: str,
        settings: Settings,
        on_reward: Callable[[dict], None] | None = None,
        stop: StopRequest | None = None,
        stop_rest: Callable[[], None] | None = None,
        kept: Sequence[dict] = (),
    ) -> None:
        self.path = path
        # --need-groups K: called once, as soon as K groups are whole, to stop the rest.
        self.stop_rest = stop_rest
        self.count = settings.count
        self.settings = settings
        self.images = group_images(settings)
        self.may_retry = bool(settings.retries)
        self.on_reward = on_reward
        self.rows: dict[int, dict] = {}
        self.deliveries: list[Delivery] = []
        self.pods_of: dict[int, set[str]] = {}
        # An attempt of theirs ended: settled once the log or the Job says so.
        self.waiting: set[int] = set()
        self._handle: TextIO | None = open(path, "w", encoding="utf-8")
        # An attach's: the lines a client that is gone wrote, written again and never redelivered.
        for row in kept:
            self._handle.write(json.dumps(row) + "\n")
            self.rows[row["index"]] = row
        self._handle.flush()
        # Set from another thread (stream_batch's reader gone): the run stops at its next turn.
        self.stop = stop
        self.whole_groups: set[int] = set()  # the groups whose every member has a valid line
        for row in kept:  # an attach's: groups made whole before count toward --need-groups
            self.whole_groups |= whole_group(self.rows, row["index"], settings.group_size)

    def check_stop(self) -> None:
        """Stop the run (StreamClosed), as Ctrl-C would, once asked to from another thread."""
        if self.stop is not None:
            self.stop.check()

    def judge(
        self, state: BatchState, early: dict[str, tuple[str, str]], names: Iterable[str] | None
    ) -> None:
        """Settle the episodes of these pods (None: every episode waiting on the Job's word)."""
        if self.stop_rest and state.job is not None and not job_finished(state.job):
            # An attach's: K met by the lines of a client gone before it could stop the rest.
            self._stop_if_met()
        if names is None:
            indexes = set(self.waiting)
        else:
            indexes = set()
            for name in names:
                pod = state.pods.get(name)
                index = None if pod is None else pod_index(pod)
                if index is not None and 0 <= index < self.count and index not in self.rows:
                    self.pods_of.setdefault(index, set()).add(name)
                    indexes.add(index)
        for index in sorted(indexes):
            self._settle(index, state, early)

    def _settle(self, index: int, state: BatchState, early: dict[str, tuple[str, str]]) -> None:
        attempts = pods_by_index(
            (state.pods[name] for name in self.pods_of.get(index, ())), self.count
        ).get(index, [])
        logs = ended_logs(attempts, early)
        if not batch_job_whole(state.job, self.count):
            # Its pods may be seen before the Jobs are: its line waits for them (judge(None)).
            self.waiting.add(index)
            return
        if not settled_attempt(attempts, state.job, index, logs, self.may_retry):
            if any(pod_terminal(p) for p in attempts):
                self.waiting.add(index)
            return
        row = settled_row(index, attempts, state, logs, self.settings, self.images)
        final = next((p for p in attempts if pod_name(p) == row["pod"]), None)
        seen = terminated_seen_at(state.observed, row["pod"] or "")
        self.deliver(row, final, logs.get(row["pod"] or "", ""), seen, streamed=True)

    def deliver(
        self,
        row: dict,
        pod: dict | None,
        log_text: str,
        seen_terminated: float | None,
        streamed: bool,
    ) -> None:
        """Append one episode's line, once; then hand it to on_reward."""
        index = row["index"]
        if index in self.rows or self._handle is None:
            return
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()
        written = time.time()
        self.rows[index] = row
        self.waiting.discard(index)
        self.whole_groups |= whole_group(self.rows, index, self.settings.group_size)
        if streamed:
            self._stop_if_met()
        after, before = container_end_bounds(pod, log_text, seen_terminated)
        ok = row["failure_class"] is None
        self.deliveries.append(
            Delivery(index, ok, written, after, before, streamed, seen_terminated)
        )
        if self.on_reward is not None:
            try:
                self.on_reward(dict(row))
            except Exception as error:
                # Told once: the lines saved while the run stops are not handed to it again.
                self.on_reward = None
                raise RewardCallbackError(error) from error

    def _stop_if_met(self) -> None:
        """Once K groups are whole while the batch runs, the rest are stopped (--need-groups K)."""
        wanted, stop_rest = self.settings.need_groups, self.stop_rest
        if stop_rest and wanted is not None and len(self.whole_groups) >= wanted:
            self.stop_rest = None
            stop_rest()

    def finish(
        self,
        rows: Sequence[dict],
        pods: Sequence[dict],
        logs: dict[str, str],
        observed: dict[str, dict],
    ) -> list[dict]:
        """The batch's rows: each line already written as it was, the rest (from the evidence read
        after the end) appended; then the file rewritten atomically in index order."""
        by_name = {pod_name(pod): pod for pod in pods}
        for row in rows:
            name = row.get("pod") or ""
            seen = terminated_seen_at(observed, name)
            self.deliver(row, by_name.get(name), logs.get(name, ""), seen, streamed=False)
        self.close()
        final = [self.rows[index] for index in sorted(self.rows)]
        write_text(self.path, rewards_jsonl(final))
        return final

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def settled_row(
    index: int,
    attempts: Sequence[dict],
    state: BatchState,
    logs: dict[str, str],
    settings: Settings,
    images: Sequence[str | None],
) -> dict:
    """The rewards.jsonl row of an episode its attempts settled (episode_row)."""
    job = state.job or {"metadata": {}}
    terms = (settings.builtin, settings.task_ids, settings.group_size)
    row = episode_row(index, attempts, job, logs, *terms, images=images)
    classes = [row["failure_class"]] + [a["failure_class"] for a in row.get("earlier_attempts", [])]
    if "infrastructure" not in classes:
        return row
    # Only an infrastructure failure names its pod's warnings: the events are read for those alone.
    return episode_row(
        index, attempts, job, logs, *terms, pod_warnings(state.events.events()), images
    )


def terminated_seen_at(observed: dict[str, dict], name: str) -> float | None:
    """When the pod watch first showed this pod's container terminated (observed.json), if it did."""
    return ((observed.get(name) or {}).get("seen") or {}).get("terminated")


def batch_state(count: int, spool_dir: str | None, drafts: EpisodeDrafts | None) -> BatchState:
    """The state of a batch of `count` episodes: its pods.json indented if the batch is small, the
    texts kept for pods.json and events.json waiting on disk beside them (`spool_dir`), and the
    drafts' shared texts and index of the events its own, when there are drafts."""
    return BatchState(
        count < ONE_LINE_ITEMS_FROM,
        spool_dir,
        drafts.shared if drafts is not None else None,
        drafts.index if drafts is not None else None,
    )


class BatchIntake:
    """What each change to one batch's state calls for: a Job taken in as the batch's Job
    (BatchJobs: one Job of several is read with the others), the logs of the containers it shows
    ended read, the moment the Job's end was seen noted, and the episodes it may settle judged
    and summarised. Called from the one thread that follows the batch: a log reader's thread
    only queues its LogRead (WatchStream.log_read)."""

    def __init__(
        self,
        state: BatchState,
        jobs: BatchJobs,
        log_reader: LogReader,
        rewards: RewardStream | None = None,
        drafts: EpisodeDrafts | None = None,
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.log_reader = log_reader
        # A rollout's rewards.jsonl, each line written as its episode settles (a log read wakes the loop).
        self.rewards = rewards
        # Each episode summarised as it ends, so that little is left to do after the Job's end.
        self.drafts = drafts
        # When this client saw the Job's end, on both clocks (observed.json is what the watches saw).
        self.end_seen_monotonic: float | None = None
        self.end_seen_wall: float | None = None

    def apply(self, kind: str, change: str, obj: dict, arrived: float) -> StateChange:
        """One change into the state (BatchState.apply), then what it calls for."""
        if kind == "job":
            batch_job = self.jobs.see(obj)
            if batch_job is None:
                return StateChange(kind)  # not one of the batch's Jobs
            obj = batch_job
        changed = self.state.apply(kind, change, obj, arrived)
        self.log_reader.schedule(changed.ended)
        if changed.job_ended:
            self.end_seen_monotonic = time.monotonic()
            self.end_seen_wall = time.time()
        if kind == "job":
            self.judge(None)
        elif kind == "pods":
            self.settle(changed.pod or "")
        return changed

    def settle(self, name: str) -> None:
        """Judge and summarise this pod's episode: the pod changed, or its log was read."""
        self.judge([name])
        self.draft(name)

    def judge(self, names: Iterable[str] | None) -> None:
        """Write the rewards.jsonl line of each episode these pods settle (None: those waiting on the Job)."""
        if self.rewards is not None:
            self.rewards.judge(self.state, self.log_reader.early, names)

    def draft(self, name: str) -> None:
        """Summarise this pod's episode now if it has ended and its log was read after its end."""
        state = self.state
        pod = state.pods.get(name)
        if self.drafts is not None and pod is not None:
            self.drafts.saw(pod, state.job, state.observed.get(name))
        if self.drafts is None or pod is None or name in state.deleted or not pod_terminal(pod):
            return
        terminated = container_terminated(pod)
        read = self.log_reader.early.get(name)
        if terminated is None or read is None or read[0] != terminated.get("containerID", ""):
            return
        self.drafts.draft(pod, read[1], state.job, state.job_observed, state.observed.get(name))


class Submission(NamedTuple):
    """The one moment a Job was submitted: just before the client's create call, on both clocks."""

    wall: float
    monotonic: float


class BatchFollower:
    """Follows one Job and its pods until the Job ends, reading each log as its pod finishes;
    after the end, its watches still deliver what happened up to it (settle_watches).

    Watches (`kubectl get -w`) tell the end at once with no polling delay; a broken
    watch is restarted, and after repeated breaks the follower polls instead (BatchWatching).
    Every change, watched or polled, reaches the state through BatchIntake.apply.
    """

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        job_name: str,
        count: int,
        progress: Progress,
        pool: concurrent.futures.ThreadPoolExecutor,
        proxy: ApiProxy | None = None,
        log_dir: str | None = None,
        rewards: RewardStream | None = None,
        watches: WatchStream | None = None,
        drafts: EpisodeDrafts | None = None,
        job_names: Sequence[str] | None = None,
        spare_held: bool = False,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.job_name = job_name
        self.count = count
        self.progress = progress
        self.proxy = proxy
        # The batch's Jobs (`job_names`: one per image, else the one named `job_name`), followed as one.
        self.jobs = BatchJobs(job_name, job_names or [job_name])
        # Given already started when its pod watch had to listen before the proxy was opened.
        self.watches = watches or WatchStream(kubectl, namespace, job_name, self.jobs)
        self.cost = WaitCost()
        poller = PollFallback(kubectl, namespace, job_name, self.jobs)
        self.watching = BatchWatching(self.watches, poller, self.cost)
        self.state = batch_state(count, log_dir, drafts)
        # A log read wakes the loop, when there is an episode to settle by it.
        on_read = self.watches.log_read if rewards is not None or drafts is not None else None
        self.log_reader = LogReader(kubectl, namespace, pool, proxy, log_dir, on_read)
        self.rewards, self.drafts = rewards, drafts
        self.intake = BatchIntake(self.state, self.jobs, self.log_reader, rewards, drafts)
        self.submission: Submission | None = None
        self._spared_at = 0.0  # when spare_held last froze what was held
        # The command line's process alone, if it froze nothing of its own (see held_objects_spared).
        self._may_freeze = spare_held and gc.get_freeze_count() == 0

    @property
    def polling(self) -> bool:
        """The watches gave up for good: the Job and its pods are read every POLL_INTERVAL_SECONDS."""
        return self.watching.polling

    @property
    def end_seen_monotonic(self) -> float | None:
        """When this client saw the Job's end (time.monotonic()), once it did."""
        return self.intake.end_seen_monotonic

    @property
    def end_seen_wall(self) -> float | None:
        """When this client saw the Job's end (time.time()), once it did."""
        return self.intake.end_seen_wall

    def observations(self) -> dict:
        return self.state.observations()

    def submit(self, create: Callable[[], dict]) -> dict:
        """Create the Job with `create`, the moment just before it taken as the submission's;
        the watches stop should it fail."""
        self.progress.new_batch()
        self.submission = Submission(time.time(), time.monotonic())
        self.state.submitted(self.submission.wall)
        try:
            created = create()
        except BaseException:
            self.stop_watches()
            raise
        self.state.created(time.time())
        return created

    def adopt(self) -> None:
        """Follow Jobs another client created (attach): the submission's moment is this
        client's start, and the state is told none (their creation call's moments are unknown)."""
        self.progress.new_batch()
        self.submission = Submission(time.time(), time.monotonic())

    def follow(self, client_deadline: float) -> str | None:
        """Wait until the Job is Complete or Failed ("Complete"/"Failed"), or None at the deadline."""
        # A watch started first is this wait's.
        processes_before = self.kubectl.processes - len(self.watches)
        try:
            self.watching.start(client_deadline)
            while self.state.end is None and time.monotonic() < client_deadline:
                if self.rewards is not None:
                    self.rewards.check_stop()
                if self.watching.poller.due(time.monotonic()):
                    self.watching.poller.poll(client_deadline, self.intake.apply)
                    if self.state.end is not None:
                        break
                item = self.watching.next_item(client_deadline)
                if item is not None:
                    self.take(item, client_deadline)
                self._show()
                self.spare_held()
        finally:
            # The pod and event watches go on while the evidence is read: they deliver what
            # happened up to the end, and should no pod list answer, what the pod watch saw
            # by then is all there is to go on.
            self.stop_watches(keep=("pods", "events") if self.state.end is not None else ())
            self.progress.finish()
            self.cost.processes = self.kubectl.processes - processes_before
        return self.state.end

    def spare_held(self) -> None:
        """What is held by now, out of the cycle collector's sight (see SPARE_HELD_SECONDS)."""
        now = time.monotonic()
        if self._may_freeze and now - self._spared_at >= SPARE_HELD_SECONDS:
            gc.freeze()
            self._spared_at = now

    def take(self, item: WatchEvent | WatchEnded | LogRead, client_deadline: float) -> None:
        """One queue item: a watch event, the end of a watch, or a log read."""
        if isinstance(item, WatchEnded):
            self.watching.ended(
                item.kind, item.refusal, self.state.end is not None, client_deadline
            )
            return
        if isinstance(item, LogRead):
            self.intake.settle(item.pod)
            return
        kind, event, arrived = item
        self.watches.failures[kind] = 0
        obj = event.get("object") if isinstance(event, dict) and "object" in event else event
        if not isinstance(obj, dict) or obj.get("kind") == "Status":
            return
        self.intake.apply(kind, event.get("type") or "ADDED", obj, arrived)

    def stop_watches(self, keep: Sequence[str] = ()) -> None:
        self.watches.stop(keep)

    def _show(self) -> None:
        if not self.progress.due():  # the line is made only when it is shown, not per change
            return
        elapsed = (
            time.monotonic() - self.submission.monotonic if self.submission is not None else 0.0
        )
        self.progress.update(
            status_line(self.job_name, self.count, self.state.job, elapsed, self.polling)
        )


# After the Job's end its pod and event watches still deliver what happened up to it.


def count_events_after_end(follower: BatchFollower, retry_until: float | None) -> int | None:
    """After the end: how many events the API holds (a list of one: its items and
    remainingItemCount), noting the revision that was. None when the events are not watched
    or could not be counted: then they are not waited for, but listed."""
    if not follower.watching.events_watched:
        return None
    try:
        events_expected, follower.state.events.resource_version = count_events(
            follower.kubectl, follower.proxy, follower.namespace, retry_until
        )
    except DemoError:
        return None
    return events_expected


def settle_watches(
    follower: BatchFollower, events_expected: int | None, seconds: float, pods: bool = True
) -> None:
    """After the end: take in what the watches still deliver until the pods are final (not
    `pods`: they are saved, or to be listed, already) and the events number
    `events_expected` (None: not waited for), for up to `seconds`. What the pod watch
    delivered before it was stopped is left untaken: pods.json is saved from it then."""
    watches = follower.watches
    deadline = time.monotonic() + seconds
    while not watches_settled(follower, events_expected, pods):
        try:
            item = watches.get(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() >= deadline:
                return
            continue
        while True:  # everything already delivered, before judging again
            if not (
                isinstance(item, (WatchEvent, WatchEnded))
                and item.kind == "pods"
                and "pods" not in watches
            ):
                follower.take(item, deadline)
            try:
                item = watches.get(None)
            except queue.Empty:
                break


def drain_pod_watch(follower: BatchFollower) -> None:
    """Stop the pod watch and take in everything it delivered since the Job ended."""
    watching = "pods" in follower.watches
    follower.stop_watches()
    deadline = time.monotonic() + 5
    while watching:
        try:
            item = follower.watches.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            return
        if isinstance(item, WatchEnded):
            if item.kind == "pods":
                return
            continue  # another watch's end: what follows the Job's end needs only the pods
        follower.take(item, deadline)


def watches_settled(
    follower: BatchFollower, events_expected: int | None, pods: bool = True
) -> bool:
    """Nothing more worth waiting for: each watch has delivered enough, or never will (not
    `pods`: the event watch alone)."""
    state = follower.state
    events_done = (
        events_expected is None
        or not follower.watching.followed("events")
        or events_caught_up(follower, events_expected)
    )
    pods_done = (
        not pods
        or not follower.watching.followed("pods")
        or state.end != "Complete"
        or bool(state.deleted)
        or watched_pods_final(follower)
    )
    return events_done and pods_done


def events_caught_up(follower: BatchFollower, events_expected: int | None) -> bool:
    """The event watch holds at least as many events as the API did after the end."""
    return (
        follower.watching.events_watched
        and not follower.polling
        and events_expected is not None
        and len(follower.state.events) >= events_expected
    )


def watched_pods_final(follower: BatchFollower) -> bool:
    """The pod watch saw each pod of the Complete Job to its final state (see pods_final)."""
    return not follower.polling and follower.state.pods_are_final()


class Evidence(NamedTuple):
    """What was saved of a finished batch, as its verification reads it."""

    job: dict | None  # None when the Job could not be read and the watch never saw it
    reading: PodReading
    logs: dict[str, str]  # pod name -> its log, empty when unreadable
    events: Sequence[EventRecord]  # this batch's events


class BatchEvidence:
    """The batch under way: its follower, and the saving of its evidence into its own directory.
    Each step that reads or saves a part of the evidence (read_batch_*, save_*) is given it."""

    def __init__(self, run: RunContext, follower: BatchFollower, batch_dir: str) -> None:
        self.follower = follower
        self.batch_dir = batch_dir
        self.kubectl = run.kubectl
        self.namespace = run.namespace
        self.settings = run.settings
        self.spelling = run.spelling
        self.silent = run.silent
        # How the events saved were read: "watch" (followed, as many as the API counted after
        # the end) or "list" (read in pages after the end).
        self.events_read = "list"

    @property
    def proxy(self) -> ApiProxy | None:
        """The run's proxy, as the follower reads through it."""
        return self.follower.proxy

    def event_index(self) -> EventIndex | None:
        """The watch's index of the events, when the events saved are the ones it followed."""
        return self.follower.state.events.index if self.events_read == "watch" else None

    def collect(self, job_name: str, retry: bool = True) -> Evidence:
        """Save job.json, pods.json, events.txt, events.json and one log per pod: the evidence of a batch.
        Without `retry`, each is read once, at once: no retries, no wait for the watches to settle."""
        follower = self.follower
        # Evidence is worth a few retries, not a long wait: a log that a kubelet
        # cannot serve now is saved empty and the episode fails verification.
        retry_until = time.monotonic() + COLLECT_RETRY_SECONDS if retry else None
        # Its own threads: the log readers' pool may still be busy with reads under way. Not
        # waited for on the way out: an interruption leaves a slow count to finish by itself.
        fetchers = concurrent.futures.ThreadPoolExecutor(4)
        try:
            # The events are counted while the pods settle and pods.json is written: an API
            # server busy with the Job's end may take a while to answer even a list of one.
            counting = (
                fetchers.submit(count_events_after_end, follower, retry_until)
                if retry and follower.watching.events_watched and not follower.polling
                else None
            )
            if retry:  # up to SETTLE_SECONDS for each pod's final state
                settle_watches(follower, None, SETTLE_SECONDS)
            watched_final = watched_pods_final(follower)
            pods_future = fetchers.submit(read_batch_pods, self, job_name, watched_final, retry)
            # Not counted: the events are listed, while the pods and logs are written.
            self.events_read = "list"
            if counting is None:
                events_future = fetchers.submit(read_batch_events, self, False, retry)
            problems: list[str] = []
            saved: tuple[PodReading, dict[str, str]] | None = None
            if watched_final:
                # Nothing the pod watch still delivers changes a final pod: pods.json and the
                # logs are saved now, and the event watch goes on.
                follower.stop_watches(keep=("events",))
                saved = save_pods_and_logs(self, pods_future, retry_until, problems)
            if counting is not None:
                # Then, once counted, up to SETTLE_SECONDS for as many events as the API held.
                events_expected = counting.result()
                settle_watches(follower, events_expected, SETTLE_SECONDS, pods=False)
                if events_caught_up(follower, events_expected):
                    self.events_read = "watch"
                events_future = fetchers.submit(
                    read_batch_events, self, self.events_read == "watch", retry
                )
            follower.stop_watches(keep=() if watched_final else ("pods",))
            if watched_final:
                follower.state.forget_shared()
            job_future = fetchers.submit(read_batch_job, self, job_name, retry_until)
            return save_evidence(
                self, job_future, saved or pods_future, events_future, retry_until, problems
            )
        finally:
            follower.stop_watches()  # already, unless something failed on the way
            fetchers.shutdown(wait=False)


def read_batch_job(batch: BatchEvidence, job_name: str, retry_until: float | None) -> dict | None:
    """The Job as its end was seen, else as read now, else as last watched."""
    state, jobs = batch.follower.state, batch.follower.jobs
    if state.end is not None and state.job is not None:
        return state.job
    if jobs.several:
        for name in jobs.names:
            try:
                job = batch.kubectl.get("job", name, batch.namespace, retry_until=retry_until)
                if job is not None:  # not missing_ok: a missing Job raised
                    jobs.see(job)
            except DemoError:
                pass  # as last watched, if it was
        return jobs.view() or state.job
    try:
        return batch.kubectl.get("job", job_name, batch.namespace, retry_until=retry_until)
    except DemoError:
        return state.job


def read_batch_pods(
    batch: BatchEvidence, job_name: str, watched_final: bool, retry: bool
) -> PodReading:
    """The Job's pods: as watched when each one's last change arrived, else listed."""
    state = batch.follower.state
    if watched_final:
        # Each pod's last change arrived: a list would show the very same pods.
        return PodReading(
            sorted(state.pods.values(), key=pod_name),
            "final watch",
            state.end_resource_version,
            0,
            0,
            [],
        )
    # Else never the watch's view: it may run behind. The list is at least as new as the
    # moment the Job's end was seen, and its pages are retried while a cache catches up.
    return read_job_pods(
        batch.kubectl,
        batch.proxy,
        batch.namespace,
        job_name,
        state.end_resource_version,
        PAGE_RETRY_SECONDS if retry else None,
        batch.settings.chunk_size,
        batch.follower.jobs.pod_selector(),
    )


def read_batch_events(
    batch: BatchEvidence, events_watched: bool, retry: bool
) -> PagedList | EventStore:
    """The namespace's events: as watched when the watch caught up with them all, else listed."""
    if events_watched:
        return batch.follower.state.events
    return read_events(
        batch.kubectl,
        batch.proxy,
        batch.namespace,
        batch.settings.chunk_size,
        COLLECT_RETRY_SECONDS if retry else None,
    )


def save_evidence(
    batch: BatchEvidence,
    job_future: concurrent.futures.Future,
    pods: tuple[PodReading, dict[str, str]] | concurrent.futures.Future,
    events_future: concurrent.futures.Future,
    retry_until: float | None,
    problems: list[str],
) -> Evidence:
    """Write what the fetches brought; fall back to the watch's view where a fetch failed.
    `pods`: the pods' reading and logs, saved already, or the fetch of the pods. What could
    not be saved is added to `problems`, and each kind of problem printed once."""
    follower = batch.follower
    job = job_future.result()
    if job is not None:
        # A batch of several Jobs saves each as read: job.json is then their List.
        write_json(
            os.path.join(batch.batch_dir, "job.json"),
            follower.jobs.saved() if follower.jobs.several else job,
        )
    # Unless saved already, the pods and logs are written while the events are read.
    reading, logs = (
        save_pods_and_logs(batch, pods, retry_until, problems)
        if isinstance(pods, concurrent.futures.Future)
        else pods
    )
    events = save_events(batch, events_future, job, reading.pods, problems)
    write_json(os.path.join(batch.batch_dir, "observed.json"), follower.observations())
    for line in summarised_problems(problems):
        print(f"Warning: could not save {line}", file=sys.stderr)
    return Evidence(job, reading, logs, events)


def save_pods_and_logs(
    batch: BatchEvidence,
    pods_future: concurrent.futures.Future,
    retry_until: float | None,
    problems: list[str],
) -> tuple[PodReading, dict[str, str]]:
    """pods.json, then one log per pod (their texts; unreadable -> empty, why in `problems`)."""
    reading = save_pods(batch, pods_future, retry_until)
    logs = batch.follower.log_reader.collect(reading.pods, batch.batch_dir, retry_until, problems)
    return reading, logs


def save_pods(
    batch: BatchEvidence, pods_future: concurrent.futures.Future, retry_until: float | None
) -> PodReading:
    """pods.json: the pods as listed (with any the list no longer shows), else as the pod watch
    saw them, each it saw unfinished read again."""
    follower = batch.follower
    try:
        reading = pods_future.result()
    except DemoError as error:
        reading = None
        print(
            f"Warning: could not list the pods ({error}); pods.json holds what the pod watch "
            f"saw, each pod it saw unfinished read again",
            file=sys.stderr,
        )
    if reading is None or reading.source != "final watch":
        drain_pod_watch(follower)
    watched = list(follower.state.pods.values())
    if reading is None:
        fresh = reread_pods(
            batch.kubectl,
            batch.proxy,
            batch.namespace,
            unfinished_pods(watched),
            None if retry_until is None else COLLECT_RETRY_SECONDS,
        )
        reading = PodReading(with_fresh_pods(watched, fresh), "watch", None, 0, 0, sorted(fresh))
    elif reading.source == "list":
        reading = reading._replace(pods=with_vanished(reading.pods, watched))
    pods = reading.pods
    indented = len(pods) < ONE_LINE_ITEMS_FROM
    texts = EncodedItems(
        lambda: (follower.state.pod_text(pod, indented) for pod in pods), len(pods), indented
    )
    write_json(
        os.path.join(batch.batch_dir, "pods.json"),
        dict(
            list_manifest([]),
            metadata={"resourceVersion": reading.resource_version or ""},
            items=texts,
        ),
    )
    return reading


def save_events(
    batch: BatchEvidence,
    events_future: concurrent.futures.Future,
    job: dict | None,
    pods: Sequence[dict],
    problems: list[str],
) -> list[EventRecord]:
    """events.txt and events.json, of this batch alone; the events, empty when unreadable.
    events.txt is kubectl's table with absolute times, not its ages, which mean nothing later."""
    events_path = os.path.join(batch.batch_dir, "events.json")
    events_listing: PagedList | EventStore | None = None
    try:
        events_listing = events_future.result()
        events = (
            events_listing.events()
            if isinstance(events_listing, EventStore)
            else event_records(events_listing.items)
        )
        write_events(events_path, events_listing, events, events_listing.resource_version or "")
    except DemoError as error:
        problems.append(f"events: {error}")
        events = []
    write_text(
        os.path.join(batch.batch_dir, "events.txt"),
        events_table_lines(events) if events else "",
    )
    batches = [entry.job for entry in batch.settings.batches]
    if len(batches) > 1 and events and events_listing is not None:
        # The namespace's events cover every batch so far; each batch keeps its own.
        events = batch_events(events, job, pods, first=batch.follower.job_name == batches[0])
        write_events(events_path, events_listing, events, None)
        write_text(os.path.join(batch.batch_dir, "events.txt"), events_table_lines(events))
    return events


def summarised_problems(problems: Sequence[str], shown: int = 3) -> list[str]:
    """A few problems in full and a count of the rest: 500 unreadable logs are one cause, not 500 lines."""
    if len(problems) <= shown + 1:
        return list(problems)
    return list(problems[:shown]) + [f"... and {len(problems) - shown} more (see the saved files)"]


def write_events(
    path: str,
    source: PagedList | EventStore,
    events: Sequence[EventRecord],
    resource_version: str | None,
) -> None:
    """events.json: the namespace's events as an EventList of the revision they were read at,
    or (`resource_version` None) a batch's share of them as a `v1 List`: `events`, each whole as
    read (the watch's waiting on disk), in the order read."""
    if isinstance(source, EventStore):
        names = [event.name or "" for event in events]
        items: Any = EncodedItems(lambda: source.whole(names), len(names))
    elif resource_version is None:
        kept = {event.name for event in events}
        items = [item for item in source.items if (item.get("metadata") or {}).get("name") in kept]
    else:
        items = list(source.items)
    if resource_version is None:
        write_json(path, dict(list_manifest([]), items=items))
    else:
        write_json(
            path,
            {
                "apiVersion": "v1",
                "kind": "EventList",
                "metadata": {"resourceVersion": resource_version},
                "items": items,
            },
        )


@dataclasses.dataclass
class RunContext:
    """What the steps of one `run` share: its settings and plan, its receipt, its open handles."""

    settings: Settings
    plan: RunPlan
    receipt: Receipt
    kubectl: Kubectl
    output: str
    progress: Progress
    pool: concurrent.futures.ThreadPoolExecutor
    cpu_start: float
    proxy: ApiProxy | None = None
    batch: BatchEvidence | None = None  # the batch under way: what an interruption saves
    touched_cluster: bool = False
    silent: bool = (
        False  # a quiet Python caller: its stdout and stderr carry only warnings and errors
    )
    spelling: Spelling = (
        COMMAND_LINE  # how its errors name the settings: flags, or run_batch()'s keywords
    )
    on_reward: Callable[[dict], None] | None = (
        None  # run_batch's caller, told each rewards.jsonl line
    )
    prepull: dict | None = None  # --prepull's figures, once it ran
    stop: StopRequest | None = None  # requested by stream_batch once its reader has gone
    # The command line, not a Python caller (run_batch, stream_batch): the process is the run's.
    owns_process: bool = False
    capacity: dict | None = None  # what check_capacity found the nodes can run: run.json keeps it
    # --queue: each batch's admission (by its directory), as Kueue's Workloads tell it
    admission: dict[str, dict] = dataclasses.field(default_factory=dict)
    tracer: Any = None  # telemetry.RunTracer with --otlp-endpoint: each batch's spans as it ends
    # --cleanup through the proxy: begun once the last batch's evidence is read (begin_cleanup),
    # its report's text the result; unstarted otherwise.
    cleanup_ahead: concurrent.futures.Future[str] | None = None
    lease: Any = None  # the FollowerLease this process holds on the run, released by close()
    detach: bool = False  # --detach: execute() returns once the first batch's Jobs exist

    @property
    def namespace(self) -> str:
        return self.receipt.namespace
