"""The batch's summary: throughput, slots, each episode's draft, the events' index,
`summarise_batch`; and episodes.csv.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import csv
import dataclasses
import gc
import heapq
import io
import json
import math
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from .model import VerificationError
from .stats import describe, rounded
from .store import SharedStrings, Spool
from .parse import (
    EventRecord,
    ImagePull,
    container_image,
    container_status,
    count_image_cache,
    event_record,
    image_cache_states,
    image_pulls,
    parse_events,
    parse_time,
    pod_name,
    scheduled_event_times,
    warning_summary,
)
from .timing import (
    Bound,
    CLOCKS_AGREE,
    ClockBounds,
    EpisodeClocks,
    EpisodeDraft,
    EpisodeInputs,
    KUBELET_CONTAINER_REASONS,
    PHASES,
    POINTS,
    Point,
    REFERENCE_CLOCK,
    WHOLE_SECOND,
    clock_offsets,
    completion_gap,
    episode_points,
    job_creation,
    kubelet_container_events,
    kubelet_event_clocks,
    lower,
    node_distribution,
    phase_durations,
    phase_summary,
    pod_creation_events,
    slot_freed_after,
    split_observed,
    start_path_phases,
    worker_time,
)
from .outcomes import is_failure, never_ran, pod_index, verify_batch, verify_episode


class EventStore:
    """A namespace's events as a watch delivers them: a pure reducer of the watch's changes.

    Each event is held as its EventRecord (the fields this tool reads) for the summary, and its
    whole last version is kept on disk for events.json, so a batch of thousands of
    pods holds its tens of thousands of events in little memory.
    """

    def __init__(
        self,
        spool_dir: str | None = None,
        shared: SharedStrings | None = None,
        index: EventIndex | None = None,
    ) -> None:
        self.records: dict[str, EventRecord] = {}
        self._spool = Spool(spool_dir, "events.json")
        self._shared = shared or SharedStrings()
        # What the summary reads of the events held, kept up to date with them.
        self.index = index or EventIndex(self._shared)
        # The revision the events are known to be at least as new as, once a list has said so.
        self.resource_version: str | None = None

    def __len__(self) -> int:
        return len(self.records)

    def apply(self, change: str, event: dict) -> EventRecord | None:
        """One change a watch delivered: ADDED or MODIFIED keeps the event's newest version, DELETED
        forgets it. The record now held of it, if any."""
        name = (event.get("metadata") or {}).get("name")
        if not name:
            return None
        held = self.records.get(name)
        if change == "DELETED":
            if self.records.pop(name, None) is not None:
                self.index.changed()
            self._spool.forget(name)
            return None
        self._spool.put(name, json.dumps(event))
        record = self.records[name] = self._shared.share(event_record(event))
        if held is None:
            self.index.add(record)
        elif held != record:  # not an event told again as it was (a watch's restart lists all)
            self.index.replace(held, record)  # the drafts read the newest
        return record

    def forget_shared(self) -> None:
        self._shared.table.clear()

    def events(self, names: Iterable[str] | None = None) -> list[EventRecord]:
        """The events' records in the order a list gives them (by name)."""
        return [self.records[name] for name in sorted(self.records if names is None else names)]

    def whole(self, names: Iterable[str] | None = None) -> Iterator[bytes]:
        """Each event's last version as JSON text (UTF-8), in the order a list gives them."""
        for name in sorted(self.records if names is None else names):
            yield self._spool.get_bytes(name)


# Throughput: how fast the batch went through, from every episode's points.
RAMP_POINTS = ("pod_created", "scheduled", "sandbox_ready", "ready", "reward", "container_finished")


def per_whole_second_peak(moments: Sequence[float]) -> int:
    """The most moments that fall in one whole second (Kubernetes' own grain)."""
    return max(collections.Counter(map(math.floor, moments)).values(), default=0)


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals open at one moment (an end before a start that ties)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def throughput(batches: Sequence[tuple[str, BatchSummary]]) -> dict:
    """Pods created and sandboxes ready per second, and the most episodes running at once."""
    records = [record for _, summary in batches for record in summary.episodes]
    created = [r["points"]["pod_created"][0] for r in records if r["points"].get("pod_created")]
    sandboxes = [
        r["points"]["sandbox_ready"][0] for r in records if r["points"].get("sandbox_ready")
    ]
    first_job = min((summary.job_created for _, summary in batches), default=None)
    running = []
    for record in records:
        points = record["points"]
        start = (
            points.get("process_started") or points.get("container_started") or points.get("ready")
        )
        ends = [
            p[0] for p in (points.get("reward"), points.get("container_finished")) if p is not None
        ]
        if start is not None and ends:
            running.append((start[0], max(ends)))

    def mean_rate(moments: Sequence[float]) -> float | None:
        if not moments or first_job is None:
            return None
        # Whole-second times: a span shorter than their precision is read as one second.
        return rounded(len(moments) / max(WHOLE_SECOND, max(moments) - first_job), 2)

    return {
        "pods_created_per_second": mean_rate(created),
        "sandboxes_ready_per_second_mean": mean_rate(sandboxes),
        "sandboxes_ready_per_second_peak": per_whole_second_peak(sandboxes) if sandboxes else None,
        "max_episodes_running_at_once": most_at_once(running) if running else None,
        "sandboxes_ready_known": len(sandboxes),
        "note": "means: count / seconds from the first Job's creation to the last such moment (at least 1 s); "
        "peak: the most in one whole second (Kubernetes times are whole seconds); an episode runs "
        "from its process start to the later of its reward and its container's finish",
    }


def pod_row(pod: dict, ready: dict, reward: dict, job_created: float) -> dict:
    """One episode's row in `pods`: its seconds from the whole-second creationTimestamps, as the
    guide computes them."""
    created = parse_time(pod["metadata"]["creationTimestamp"])
    return {
        "pod": pod_name(pod),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "image_id": container_status(pod).get("imageID"),
        "reward": reward.get("reward"),
        "pod_to_ready_seconds": rounded(ready["at"] - created),
        "batch_to_ready_seconds": rounded(ready["at"] - job_created),
        "batch_to_reward_seconds": rounded(reward["at"] - job_created),
    }


def slots_freed(
    episodes: Sequence[tuple[dict, dict, dict]],
    clocks_of: Callable[[dict], EpisodeClocks],
    creations: dict[str, float],
    observed_pods: dict[str, dict],
    job_earliest: float | None,
    parallelism: int,
    replaces_terminating: bool = True,
) -> dict[str, float]:
    """Per pod, the latest moment an earlier pod's end provably freed the slot it was created into:
    each pod's creation bounded by its stamp, its creation event and the watch, each end by its
    reward on the node's clock (corrected, less its slack). Where the Job `replaces_terminating`
    pods (its podReplacementPolicy is not Failed), a pod asked to be deleted freed its slot at
    the request, maybe before its end, and its deletionTimestamp need not name that moment (a
    later, shorter delete moves it): its end is unknown."""
    created_within = {}
    for pod, _, _ in episodes:
        name = pod_name(pod)
        created_within[name] = creation_window(
            pod, job_earliest, creations.get(name), observed_pods.get(name), clocks_of(pod)
        )
    if not slots_may_have_waited(created_within, parallelism):
        return {}  # the ends are read only where some pod may have waited for a slot
    ended_after = {}
    for pod, _, reward in episodes:
        end = end_freeing_slot(pod, reward, clocks_of(pod), replaces_terminating)
        if end is not None:
            ended_after[pod_name(pod)] = end
    return slot_freed_after(created_within, ended_after, parallelism)


def creation_window(
    pod: dict,
    job_earliest: float | None,
    created_event_at: float | None,
    observed: dict | None,
    clocks: EpisodeClocks,
) -> tuple[float, float]:
    """(earliest, latest): the pod was created within its stamp's second, after its Job's
    earliest moment, no later than its creation event and the moment this client's watch saw it."""
    stamp = parse_time(pod["metadata"]["creationTimestamp"])
    assert stamp is not None  # the API server stamps every pod it creates
    seen = ((observed or {}).get("seen") or {}).get("added")
    latest = stamp + WHOLE_SECOND
    if created_event_at is not None:
        latest = min(latest, created_event_at)
    if seen is not None:
        latest = min(latest, seen - clocks.client + clocks.client_slack)
    return max(stamp, job_earliest or stamp), latest


def end_freeing_slot(
    pod: dict, reward: dict, clocks: EpisodeClocks, replaces_terminating: bool
) -> float | None:
    """A moment the pod's end freed its slot after: its reward on its node's clock (corrected,
    less its slack); None when that is unknown (no reward; a pod asked to be deleted, where the
    Job `replaces_terminating` pods, freed its slot at the request)."""
    reward_at = worker_time(reward.get("at"))
    if reward_at is None or (replaces_terminating and pod["metadata"].get("deletionTimestamp")):
        return None
    return reward_at - clocks.node - clocks.node_slack


def job_replaces_terminating(job: dict | None) -> bool:
    """Whether the Job creates a pod's replacement as soon as the pod is asked to be deleted
    (its podReplacementPolicy is not Failed)."""
    return ((job or {}).get("spec") or {}).get("podReplacementPolicy") != "Failed"


def created_after_bound(job_bound: Bound | None, slot: float | None) -> Bound | None:
    """What a pod was created after: its Job's creation, or an earlier pod's end freeing its
    slot, whichever is later."""
    if slot is None:
        return job_bound
    return max(
        [job_bound, lower(slot, "an earlier pod's end freeing its slot", REFERENCE_CLOCK)],
        key=lambda bound: -math.inf if bound is None or bound.lower is None else bound.lower,
    )


class SlotSweep:
    """slot_freed_after kept as the batch runs, for each episode's draft: told each pod as it is
    seen (`created`) and each end as its episode is drafted (`ended`), it says what an ended
    pod was created after (`slot_bound`).

    A pod created after n others came once n - parallelism + 1 of them had ended, all before it
    was created; by its own end those episodes are usually drafted, and any of the n still
    running then ends later than all of them. So the bound known at its end is mostly the one the
    final pass finds from every episode. Where it is not (an earlier episode's log read late, a
    pod failed or deleted after, a clock corrected), the final pass makes that point again: it
    takes a draft only where the two agree.
    """

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self._latest: dict[str, float] = {}  # each pod seen: the latest moment it was created
        self._waiting: list[tuple[float, str]] = []  # a heap: the pods not yet counted
        self._counted_below = -math.inf  # every pod seen created before this moment is counted
        self._counted: list[tuple[float, str]] = []  # (latest, pod), sorted
        self._ends: list[float] = []  # sorted: the known ends of the pods counted
        self._end_of: dict[str, float] = {}
        self._gone: set[str] = set()  # pods no episode of the summary stands for
        # The earliest latest moment of a pod whose end freed its slot at an unknown moment: the
        # summary bounds no pod created after it.
        self._unknown_from = math.inf

    def knows(self, name: str) -> bool:
        return name in self._latest

    def created(self, name: str, latest: float) -> None:
        """A pod seen, and the latest moment it was created (the first one told counts)."""
        if name in self._latest:
            return
        self._latest[name] = latest
        if latest >= self._counted_below:
            heapq.heappush(self._waiting, (latest, name))
            return
        bisect.insort(self._counted, (latest, name))  # seen after a later one was asked about
        if name in self._end_of:
            bisect.insort(self._ends, self._end_of[name])

    def forget(self, name: str) -> None:
        """A pod that is no episode of the summary (it failed, or failed verification): the
        summary counts only its episodes' pods."""
        if name in self._gone or name not in self._latest:
            return
        self._gone.add(name)
        latest = self._latest[name]
        if latest >= self._counted_below:
            return  # still waiting: left out as it would be counted
        del self._counted[bisect.bisect_left(self._counted, (latest, name))]
        if name in self._end_of:
            del self._ends[bisect.bisect_left(self._ends, self._end_of[name])]

    def end_unknown(self, name: str) -> None:
        """A pod whose end freed its slot at a moment not known (asked to be deleted, where its Job
        replaces terminating pods): no pod created after it is bounded."""
        if name in self._latest:
            self._unknown_from = min(self._unknown_from, self._latest[name])

    def ended(self, name: str, end: float) -> None:
        """A moment the pod's end freed its slot after (the first one told counts)."""
        if name in self._end_of or name in self._gone:
            return
        self._end_of[name] = end
        latest = self._latest.get(name)
        if latest is not None and latest < self._counted_below:
            bisect.insort(self._ends, end)

    def slot_bound(self, earliest: float) -> float | None:
        """For a pod created no earlier than `earliest`: the moment an earlier pod's end freed
        the slot it was created into, if the ends known say so."""
        if self._unknown_from < earliest:
            return None
        if earliest >= self._counted_below:
            while self._waiting and self._waiting[0][0] < earliest:
                latest, name = heapq.heappop(self._waiting)
                if name in self._gone:
                    continue
                self._counted.append((latest, name))
                if name in self._end_of:
                    bisect.insort(self._ends, self._end_of[name])
            self._counted_below = earliest
            return nth_smallest(self._ends, [], len(self._counted) - self.parallelism)
        # An earlier moment than one asked about before: the pods counted since are left out.
        counted = bisect.bisect_left(self._counted, (earliest, ""))
        later = sorted(self._end_of[n] for _, n in self._counted[counted:] if n in self._end_of)
        return nth_smallest(self._ends, later, counted - self.parallelism)


def nth_smallest(values: list[float], removed: list[float], n: int) -> float | None:
    """The n-th (from 0) smallest of sorted `values` less `removed` (sorted, and some of them),
    found by bisection: copying thousands of values for each pod cost more than its draft."""
    if n < 0 or n >= len(values) - len(removed):
        return None
    low, high = n, n + len(removed)
    while low < high:
        middle = (low + high) // 2
        value = values[middle]
        if bisect.bisect_right(values, value) - bisect.bisect_right(removed, value) > n:
            high = middle
        else:
            low = middle + 1
    return values[low]


def slots_may_have_waited(created_within: dict[str, tuple[float, float]], parallelism: int) -> bool:
    """Whether slot_freed_after can find any pod created after `parallelism` others. With no fewer
    slots than pods, only a pod created after every pod, itself too (its own bounds contradicting
    each other), would be: every pod's latest moment of creation before its earliest one."""
    if parallelism < len(created_within):
        return True
    return bool(created_within) and max(latest for _, latest in created_within.values()) < max(
        earliest for earliest, _ in created_within.values()
    )


@dataclasses.dataclass
class BatchSummary:
    """One batch verified and measured: `figures` are its own figures as results.json saves them
    (BatchOutcome.figures adds how long the client waited); the rest is what the CSV, the
    pictures and the pooling of rounds read, and nothing saves as such."""

    figures: dict[str, Any]
    episodes: list[
        dict
    ]  # per episode: pod, index, points, phases, image_cache, runtime_class, guide_pod_to_ready
    job_created: float  # the Job's creationTimestamp (whole seconds): where every time axis starts
    origin: (
        float  # the earliest moment its Job may have existed, within the second after job_created
    )
    # Accepted failures, each with its points as far as it got, for the timeline to draw:
    # pod (None when it never existed), points, phases, index, failure_class, failure.
    failed: list[dict] = dataclasses.field(default_factory=list)
    # A rollout's successful rewards as they reached rewards.jsonl (the client's wall clock), for ramp.svg.
    deliveries: list[float] = dataclasses.field(default_factory=list)
    drafts_taken: int = 0  # episodes whose points were taken from their drafts, made while waiting
    # Pod -> where its draft's row of episodes.csv is kept, for each episode taken whole from a
    # draft whose row the final evidence leaves as it was made (see episodes_csv_pieces).
    csv_rows: dict[str, Spool] = dataclasses.field(default_factory=dict)
    # Phase -> the seconds of its episodes, sorted: the figures' sample, which cdf.svg draws.
    phase_samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)


# The cycle collector's full passes walk every object held: a batch's pods, events and drafts,
# which hold no cycles and live to the batch's end. Each pass freed nothing and took longer as the
# batch grew (of a 30,000-episode wait, 3.2 s on Python 3.13 and 8.7 s on 3.9). While a batch is
# followed, what is held by then is moved out of its sight this often (gc.freeze, which costs
# nothing), and given back once the batch is summarised, so that a finished batch's own cycles
# (a follower and the readers that call it back) are freed as ever. Only the command line does
# this: it owns its process. A freeze is the whole process's, so in a Python caller's (run_batch,
# stream_batch) it would also hide the caller's own garbage from the collector until the batch
# ended, and the unfreeze would undo a freeze the caller made meanwhile.
SPARE_HELD_SECONDS = 1.0


@contextlib.contextmanager
def held_objects_spared(spare: bool) -> Iterator[None]:
    """While one batch is followed and summarised: gc.unfreeze at its end, whatever its follower
    froze (BatchFollower.spare_held). Nothing when not `spare` (a Python caller's process), nor
    in a process that froze objects of its own: those stay as they are."""
    ours = spare and gc.get_freeze_count() == 0
    try:
        yield
    finally:
        if ours:
            gc.unfreeze()


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Hold Python's cycle collector while the summary builds its many small records: each of its
    passes would walk every pod and event still held, seconds at thousands of episodes, to free
    nothing (the records hold no cycles; reference counts free them)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class EventIndex:
    """What the summary reads of each event, kept as the watch delivers them, so that after the
    end neither the drafts nor the summary read every event again: per pod its Scheduled
    eventTime, its creation event's name time, its kubelet's container events, its first Started,
    its image as found or pulled; per node what its kubelet's events bound its clock by.

    A pure reducer (`add`, `replace`), each event taken as scheduled_event_times,
    pod_creation_events, kubelet_container_events, image_cache_states, image_pulls and
    kubelet_event_clocks take the events of a list in its order. It is `exact` while each event it
    was told is held as told (none deleted since, none changed since but one no reader took
    anything from) and the order they came in decided nothing: no pod had two events of a kind
    where the first or the last one counts, and no kubelet event tied another's moment. Then it
    is what those functions make of the events held, in any order, and the summary takes it
    instead of reading them all.
    """

    def __init__(self, shared: SharedStrings | None = None) -> None:
        self.scheduled: dict[str, float] = {}
        self.creations: dict[str, float] = {}
        self.kubelet: dict[str, dict[str, tuple[float, str]]] = {}
        self.started: dict[str, tuple[float, str]] = {}
        self.cache: dict[str, str] = {}
        self.pulls: dict[str, ImagePull] = {}
        self.nodes: dict[str, ClockBounds] = {}
        self.told = 0  # the events it was told, each once
        self.exact = True
        self._shared = shared or SharedStrings()

    def changed(self) -> None:
        """An event it was told changed or went: the index no longer says what the events held say."""
        self.exact = False

    def add(self, event: EventRecord) -> None:
        """One event, told once. Each reader is asked only of the events it reads (a reason of
        its own, a kubelet's): a few of hundreds of thousands are read by each."""
        self.told += 1
        self._take(event)

    def replace(self, held: EventRecord, event: EventRecord) -> None:
        """A newer version of an event told before. One that no reader took anything from is
        replaced exactly: the recorder's combined event (a Job creating thousands of pods has one,
        its message and count changed with each pod) names no pod, so the index stays exact."""
        if self.reads(held):
            self.changed()
        self._take(event)

    @staticmethod
    def reads(event: EventRecord) -> bool:
        """Whether any reader takes something from this event."""
        return (
            event.reason == "Scheduled"
            or event.component == "kubelet"
            or event.reason in KUBELET_CONTAINER_REASONS
            or bool(pod_creation_events((event,)))
        )

    def _take(self, event: EventRecord) -> None:
        if event.reason == "Scheduled":
            for pod, moment in scheduled_event_times((event,)).items():
                self._last(self.scheduled, pod, moment)
        elif event.reason == "SuccessfulCreate":
            for pod, moment in pod_creation_events((event,)).items():
                # The name read from the event's message: the text its pod's other tables key by.
                self._first(self.creations, self._shared.text(pod), moment)
        if event.component == "kubelet" or event.reason in KUBELET_CONTAINER_REASONS:
            self._add_kubelets(event)

    def _add_kubelets(self, event: EventRecord) -> None:
        """A kubelet's event, or one of a reason its container events have."""
        for pod, reasons in kubelet_container_events((event,)).items():
            known = self.kubelet.get(pod) or {}
            for reason, named in reasons.items():
                if reason in known and named[0] == known[reason][0] and named != known[reason]:
                    self.exact = False  # a tie: the first in the list's order would be kept
            earlier = {
                reason: named
                for reason, named in reasons.items()
                if reason not in known or named[0] < known[reason][0]
            }
            if earlier or pod not in self.kubelet:
                # A new dict, never one changed in place: a draft holds the one it was made from.
                self.kubelet[pod] = {**known, **earlier}
        nodes, started = kubelet_event_clocks((event,))
        for node, bounds in nodes.items():
            held = self.nodes.setdefault(node, ClockBounds())
            if bounds.lowest is not None:
                held.at_least(bounds.lowest)
        for pod, named in started.items():
            # The kubelet index's own record of the same Started event, where it is one.
            indexed = (self.kubelet.get(pod) or {}).get("Started")
            self._first(self.started, pod, indexed if indexed == named else named)
        if event.reason != "Pulled":
            return
        for pod, state in image_cache_states((event,)).items():
            if state == "present" or pod not in self.cache:
                self.cache[pod] = state
        for pod, pull in image_pulls((event,)).items():
            self._first(self.pulls, pod, pull)

    def _first(self, table: dict, key: str, value: Any) -> None:
        """The first value told counts (as the first in a list's order would)."""
        if key in table:
            self.exact = self.exact and table[key] == value
            return
        table[key] = value

    def _last(self, table: dict, key: str, value: Any) -> None:
        """The last value told counts (as the last in a list's order would)."""
        if key in table and table[key] != value:
            self.exact = False
        table[key] = value


class EpisodeDrafts:
    """Each episode summarised the moment it ends (its pod final, its log read), while the batch
    still runs: what the summary after the end takes as it is when the final evidence agrees.

    A pure reducer, as BatchState is: told each pod as it is seen (`saw`) and each ended episode
    (`draft`), it reads what the events said of its pod so far from `index` (which the follower's
    EventStore keeps up to date). A draft assumes the clocks agree, and takes the slot an earlier
    pod's end freed for it as the ends known then say (`slots`): the final pass makes again only
    the points whose inputs the final clocks and evidence change.
    """

    def __init__(
        self, builtin: bool, shared: SharedStrings | None = None, spool_dir: str | None = None
    ) -> None:
        self.builtin = builtin
        self.drafts: dict[str, EpisodeDraft] = {}
        # Each draft's row of episodes.csv (but its batch, pod and index), made as it ends: at
        # 100,000 episodes the rows took 4 s to make after the end, and take megabytes to hold.
        self.csv = Spool(spool_dir, "episodes.csv")
        # The follower's one table of shared texts: a pod's name, its node, its uid are the same
        # objects in its pod, its events, its drafts and every index of them.
        self.shared = shared or SharedStrings()
        self.index = EventIndex(self.shared)
        self._job_bound: Bound | None = None
        # Where the Job runs fewer pods at once than it has, the slots its pods were created into.
        self.slots: SlotSweep | None = None

    def saw(self, pod: dict, job: dict | None, observed: dict | None) -> None:
        """A pod of the batch seen (any version of it), for the slots later pods are created into."""
        if self.slots is None:
            spec = (job or {}).get("spec") or {}
            parallelism = int(spec.get("parallelism") or 1)
            if job is None or parallelism >= int(spec.get("completions") or 1):
                return
            self.slots = SlotSweep(parallelism)
        name = self.shared.text(pod_name(pod))
        if not self.slots.knows(name):
            _, latest = creation_window(
                pod, None, self.index.creations.get(name), observed, CLOCKS_AGREE
            )
            self.slots.created(name, latest)
        if (pod.get("status") or {}).get("phase") == "Failed":
            self.slots.forget(name)
        elif pod["metadata"].get("deletionTimestamp") and job_replaces_terminating(job):
            self.slots.end_unknown(name)

    def draft(
        self,
        pod: dict,
        log_text: str,
        job: dict | None,
        job_observed: dict[str, float],
        observed: dict | None,
    ) -> None:
        """Summarise one ended episode now; one that fails verification is left to the final pass,
        which says why."""
        name = self.shared.text(pod_name(pod))
        job_created = parse_time(((job or {}).get("metadata") or {}).get("creationTimestamp"))
        if job_created is None or (pod.get("status") or {}).get("phase") != "Succeeded":
            return
        assert job is not None  # it has a creationTimestamp
        inputs = self.inputs(name, pod, job, job_observed, observed)
        known = self.drafts.get(name)
        if known is not None and drafted_already(known, pod, log_text, job_created, inputs):
            # The ended pod's next version (the Job controller counted it): the same episode,
            # drafted already. Its draft now holds this version, which the summary will be given.
            self.drafts[name] = known._replace(pod=pod)
            return
        try:
            ready, reward = verify_episode(
                pod, parse_events(log_text.splitlines()), job_created, self.builtin
            )
        except VerificationError:
            self.drafts.pop(name, None)
            if self.slots is not None:
                self.slots.forget(name)
            return
        if self.slots is not None:
            end = end_freeing_slot(pod, reward, CLOCKS_AGREE, job_replaces_terminating(job))
            if end is not None:
                self.slots.ended(name, end)
        self.drafts[name] = made_draft(self, pod, log_text, job_created, ready, reward, inputs)

    def inputs(
        self, name: str, pod: dict, job: dict, job_observed: dict[str, float], observed: dict | None
    ) -> EpisodeInputs:
        """What an ended episode's points are made from, as the events and the slots say so far."""
        earliest = job_creation(job, job_observed, 0.0, 0.0).earliest
        job_bound = lower(earliest, "the Job's creation", REFERENCE_CLOCK)
        if job_bound != self._job_bound:  # the batch's drafts share one
            self._job_bound = job_bound
        index = self.index
        slot = None
        if self.slots is not None:
            window = creation_window(
                pod, earliest, index.creations.get(name), observed, CLOCKS_AGREE
            )
            slot = self.slots.slot_bound(window[0])
        return EpisodeInputs(
            index.scheduled.get(name),
            observed,  # the watch's record as it is now: a later sight makes a new one
            index.kubelet.get(name),  # replaced, never changed, by a later event
            index.creations.get(name),
            CLOCKS_AGREE,
            created_after_bound(self._job_bound, slot),
        )


def drafted_already(
    known: EpisodeDraft, pod: dict, log_text: str, job_created: float, inputs: EpisodeInputs
) -> bool:
    """Whether `known` is this very episode's draft: the same log, Job and inputs, its pod the
    same but for what the Job controller changes in an ended pod."""
    return (
        known.log_text is log_text
        and known.job_created == job_created
        and known.inputs == inputs
        and same_but_bookkeeping(known.pod, pod)
    )


def made_draft(
    drafts: EpisodeDrafts,
    pod: dict,
    log_text: str,
    job_created: float,
    ready: dict,
    reward: dict,
    inputs: EpisodeInputs,
) -> EpisodeDraft:
    """A verified episode's draft, its row of episodes.csv put in the drafts' spool."""
    name = drafts.shared.text(pod_name(pod))
    # Thousands of drafts repeat their field names, sources, nodes and the worker's words.
    share = drafts.shared.texts
    points = share(episode_points(pod, ready, reward, *inputs))
    phases = phase_durations(points)
    row = share(pod_row(pod, ready, reward, job_created))
    cache, pull = drafts.index.cache.get(name), drafts.index.pulls.get(name)
    record = {
        "points": points,
        "phases": phases,
        "image_cache": cache,
        "runtime_class": (pod.get("spec") or {}).get("runtimeClassName"),
        "image": container_image(pod),
        "image_pull": pull,
    }
    drafts.csv.put(name, csv_text(episode_csv_fields(row, record, job_created)))
    return EpisodeDraft(
        pod,
        log_text,
        job_created,
        drafts.builtin,
        summarised_fields(ready, READY_FIELDS_SUMMARISED),
        summarised_fields(reward, REWARD_FIELDS_SUMMARISED),
        row,
        inputs,
        points,
        phases,
        drafts.csv,
        cache,
        pull,
    )


# What the Job controller changes in an ended pod once it has counted it (its tracking finalizer
# removed): nothing an episode's verification, points or row read.
POD_BOOKKEEPING = ("resourceVersion", "finalizers", "managedFields")


def same_but_bookkeeping(earlier: dict, later: dict) -> bool:
    """Two versions of a pod that differ at most in POD_BOOKKEEPING."""
    if earlier.keys() != later.keys():
        return False
    for key, value in later.items():
        if key != "metadata":
            if earlier[key] != value:
                return False
            continue
        before, after = earlier[key], value
        if not isinstance(before, dict) or not isinstance(after, dict):
            if before != after:
                return False
            continue
        if {field: item for field, item in before.items() if field not in POD_BOOKKEEPING} != {
            field: item for field, item in after.items() if field not in POD_BOOKKEEPING
        }:
            return False
    return True


# What the summary reads of an episode's verified ready and reward events (its points, its row):
# a draft holds these alone, not the worker's other words.
READY_FIELDS_SUMMARISED = ("at", "process_started_at", "imports_done_at")

REWARD_FIELDS_SUMMARISED = ("at", "reward")


def summarised_fields(event: dict, fields: Sequence[str]) -> dict:
    """The fields of a worker's event the summary reads, those it has."""
    return {field: event[field] for field in fields if field in event}


class EventTables(NamedTuple):
    """What the batch's events say of each pod (by name), and what its kubelets' events bound
    each node's clock by, as the summary reads them."""

    scheduled: dict[str, float]  # its Scheduled eventTime
    cache: dict[str, str]  # its image, found present or pulled
    pulls: dict[str, ImagePull]  # what the kubelet said of its image's pull
    kubelet: dict[str, dict[str, tuple[float, str]]]  # its kubelet's container events
    creations: dict[str, float]  # its creation event's name time
    kubelet_clocks: tuple[dict[str, ClockBounds], dict[str, tuple[float, str]]]


def event_tables(events: Sequence[EventRecord], index: EventIndex | None) -> EventTables:
    """The events' tables: the watch's `index` where it is exact and of these very events, else
    the events read again."""
    if index is not None and index.exact and index.told == len(events):
        # Copies of the node bounds: clock_offsets adds the pods' bounds to them.
        nodes = {node: bounds.copy() for node, bounds in index.nodes.items()}
        return EventTables(
            index.scheduled,
            index.cache,
            index.pulls,
            index.kubelet,
            index.creations,
            (nodes, index.started),
        )
    return EventTables(
        scheduled_event_times(events),
        image_cache_states(events),
        image_pulls(events),
        kubelet_container_events(events),
        pod_creation_events(events),
        kubelet_event_clocks(events),
    )


def episode_clocks(clocks: dict) -> Callable[[dict], EpisodeClocks]:
    """Each pod's clocks, the client's and its node's corrections (each node's made once, not each
    pod's: its pods share them)."""
    client = clocks["client"]
    client_only = EpisodeClocks(client["offset_seconds"], client["correction_slack_seconds"])
    node_clocks = {
        node: client_only._replace(
            node=entry.get("offset_seconds") or 0.0,
            node_slack=entry.get("correction_slack_seconds") or 0.0,
        )
        for node, entry in clocks["nodes"].items()
        if entry
    }

    def clocks_of(pod: dict) -> EpisodeClocks:
        return node_clocks.get((pod.get("spec") or {}).get("nodeName") or "", client_only)

    return clocks_of


class BatchSources(NamedTuple):
    """What each episode of a batch is placed from besides its pod and log."""

    job_created: float  # the Job's creationTimestamp: where every time axis starts
    job_point: Point  # when the Job was truly created (job_creation)
    clocks: dict  # each clock's offset from the control plane's (clock_offsets)
    clocks_of: Callable[[dict], EpisodeClocks]  # a pod's clocks (episode_clocks)
    tables: EventTables
    observed_pods: dict[str, dict]  # what the watch saw of each pod, when
    job_bound: Bound | None  # the Job's creation, which every pod's follows
    slots: dict[str, float]  # pod -> when an earlier pod's end freed the slot it was created into

    def inputs(self, pod: dict) -> EpisodeInputs:
        """What an episode's points are made from, besides its pod and log."""
        name = pod_name(pod)
        return EpisodeInputs(
            self.tables.scheduled.get(name),
            self.observed_pods.get(name),
            self.tables.kubelet.get(name),
            self.tables.creations.get(name),
            self.clocks_of(pod),
            created_after_bound(self.job_bound, self.slots.get(name)),
        )


def batch_sources(
    job: dict,
    pods: Sequence[dict],
    count: int,
    episodes: Sequence[tuple[dict, dict, dict]],
    events: Sequence[EventRecord],
    observed: dict[str, dict] | None,
    index: EventIndex | None,
) -> BatchSources:
    """The events' tables, the clocks, the Job's creation and the slots (slots_freed, when every
    episode's pod is known) of a verified batch."""
    job_created = parse_time(job["metadata"]["creationTimestamp"])
    assert job_created is not None  # verify_batch checked it
    tables = event_tables(events, index)
    observed_pods, job_observed = split_observed(observed)
    clocks = clock_offsets(
        job,
        pods,
        events,
        observed_pods,
        job_observed,
        tables.kubelet,
        tables.scheduled,
        tables.kubelet_clocks,
    )
    client = clocks["client"]
    job_point = job_creation(
        job, job_observed, client["offset_seconds"], client["correction_slack_seconds"]
    )
    clocks_of = episode_clocks(clocks)
    slots = (
        slots_freed(
            episodes,
            clocks_of,
            tables.creations,
            observed_pods,
            job_point.earliest,
            int((job.get("spec") or {}).get("parallelism") or 1),
            job_replaces_terminating(job),
        )
        if len(pods) == count
        else {}
    )
    job_bound = lower(job_point.earliest, "the Job's creation", REFERENCE_CLOCK)
    return BatchSources(
        job_created, job_point, clocks, clocks_of, tables, observed_pods, job_bound, slots
    )


class SummarisedEpisode(NamedTuple):
    """One verified episode as the summary has it."""

    row: dict  # its row of `pods` in results.json
    record: dict  # what the CSV and the pictures read (BatchSummary.episodes)
    drafted: bool  # its points taken from its draft
    csv_row: Spool | None  # where its draft's row of episodes.csv is kept, if that row holds


def summarised_episode(
    sources: BatchSources, pod: dict, ready: dict, reward: dict, draft: EpisodeDraft | None
) -> SummarisedEpisode:
    """One verified episode's row and record: its draft's where the draft was made from these
    final inputs, else made again."""
    name, inputs = pod_name(pod), sources.inputs(pod)
    drafted = None if draft is None else draft.points_for(pod, ready, inputs)
    csv_row = None
    if drafted is not None and draft is not None:
        points, phases = drafted
        row = (
            draft.row
            if draft.job_created == sources.job_created
            else pod_row(pod, ready, reward, sources.job_created)
        )
        if (
            draft.csv is not None
            and points is draft.points
            and row is draft.row
            and sources.tables.cache.get(name) == draft.image_cache
            and sources.tables.pulls.get(name) == draft.image_pull
        ):
            csv_row = draft.csv  # its row of episodes.csv is made already
    else:
        points = episode_points(pod, ready, reward, *inputs)
        phases = phase_durations(points)
        row = pod_row(pod, ready, reward, sources.job_created)
    record = episode_record(pod, ready, points, phases, sources.tables)
    return SummarisedEpisode(row, record, drafted is not None, csv_row)


def episode_record(
    pod: dict,
    ready: dict,
    points: dict[str, Point | None],
    phases: dict[str, tuple[float, float] | None],
    tables: EventTables,
) -> dict:
    """A verified episode's record: its points and phases, its image and how it was found."""
    name = pod_name(pod)
    created = parse_time(pod["metadata"]["creationTimestamp"])
    return {
        "pod": name,
        "points": points,
        "phases": phases,
        "image_cache": tables.cache.get(name),
        "runtime_class": (pod.get("spec") or {}).get("runtimeClassName"),
        "index": None if pod_index(pod) is None else str(pod_index(pod)),
        "image": container_image(pod),
        "image_pull": tables.pulls.get(name),
        "guide_pod_to_ready": ready["at"] - created,
    }


def failed_record(
    sources: BatchSources, logs: dict[str, str], failed_pod: dict | None, row: dict
) -> dict:
    """An accepted failure's record for the timeline: its points as far as it got (none when its
    pod never existed)."""
    points: dict[str, Point | None] = {point: None for point in POINTS}
    if failed_pod is not None:
        name = pod_name(failed_pod)
        log_events = parse_events(logs.get(name, "").splitlines())
        ready, reward = (
            next((e for e in log_events if e["event"] == kind), {}) for kind in ("ready", "reward")
        )
        # Placed after the Job's creation alone: the slots are those of the verified episodes.
        inputs = sources.inputs(failed_pod)._replace(created_after=sources.job_bound)
        points = episode_points(failed_pod, ready, reward, *inputs)
    return {
        "pod": row["pod"],
        "points": points,
        "phases": phase_durations(points),
        "index": row["index"],
        "failure_class": row["failure_class"],
        "failure": row["failure"],
        # What its row of episodes.csv says beside its points.
        "task_id": row.get("task_id"),
        "valid": row.get("valid"),
        "node": row.get("node"),
        "reward": row.get("reward"),
        "image": row.get("image"),
    }


def reward_figures(rows: Sequence[dict], records: Sequence[dict], builtin: bool) -> dict:
    """The batch's rewards, its spans to the last ready and the last reward, and the guide's
    pod-to-ready figures."""
    guide = describe([record["guide_pod_to_ready"] for record in records])
    rewards = [r["reward"] for r in rows]
    return {
        "episodes": len(rows),
        "successful_episodes": sum(1 for r in rewards if r == 1) if builtin else len(rows),
        "reward_sum": sum(rewards),
        # A rollout whose every episode failed on its own has no successful one to measure.
        "reward_mean": rounded(sum(rewards) / len(rewards), 6) if rewards else None,
        "batch_to_all_ready_seconds": max(
            (r["batch_to_ready_seconds"] for r in rows), default=None
        ),
        "batch_to_all_rewards_seconds": max(
            (r["batch_to_reward_seconds"] for r in rows), default=None
        ),
        # The guide's figures, from the whole-second creationTimestamp as the guide computes them;
        # the pod_to_ready phase measures the same span from the sharpest points.
        "pod_to_ready_p50_seconds": guide.get("p50"),
        "pod_to_ready_p95_seconds": guide.get("p95"),
        "pod_to_ready_max_seconds": guide.get("max"),
    }


def ran_pods(
    job: dict, pods: Sequence[dict], logs: Mapping[str, str]
) -> tuple[list[dict], list[str]]:
    """The pods an episode may have run in, and the names of those a suspension of the Job
    deleted before any container was made (outcomes.never_ran): no episode, not counted."""
    unrun = {pod_name(pod) for pod in pods if never_ran(pod, job, logs.get(pod_name(pod), ""))}
    return [pod for pod in pods if pod_name(pod) not in unrun], sorted(unrun)


@cycle_collector_paused()
def summarise_batch(
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    events: Sequence[EventRecord],
    count: int,
    builtin: bool = True,
    client_observed_at: float | None = None,
    observed: dict[str, dict] | None = None,
    failed: Sequence[tuple[dict | None, dict]] = (),
    drafts: Mapping[str, EpisodeDraft] | None = None,
    index: EventIndex | None = None,
) -> BatchSummary:
    """Verify one batch and compute its figures and its phase breakdown; pure. `failed`: the
    accepted failures, (final pod or None, rewards row), placed as far as they got, from the
    same sources and clocks, for the timeline; no figure counts them. `drafts`: episodes
    summarised while the batch ran, each taken where its pod, log and inputs are the final ones
    (the result is the same as without them). `index`: the watch's index of the events, taken
    where it is exact and of these very events (else they are read again)."""
    drafts, (pods, unrun) = drafts or {}, ran_pods(job, pods, logs)
    episodes = verify_batch(count, job, pods, logs, builtin, drafts)
    sources = batch_sources(job, pods, count, episodes, events, observed, index)
    summarised = [
        summarised_episode(sources, pod, ready, reward, drafts.get(pod_name(pod)))
        for pod, ready, reward in episodes
    ]
    rows = [episode.row for episode in summarised]
    records = [episode.record for episode in summarised]
    phase_samples: dict[str, list[float]] = {}
    figures = reward_figures(rows, records, builtin)
    last_reward = max((reward["at"] for _, _, reward in episodes), default=None)
    figures.update(
        phases=phase_summary([record["phases"] for record in records], phase_samples),
        job_created=sources.job_point._asdict(),
        phases_by_start_path=start_path_phases(records),
        clocks=sources.clocks,
        completion_gap=completion_gap(job, pods, last_reward, client_observed_at),
        nodes=node_distribution(pods),
        image_cache=count_image_cache(record["image_cache"] for record in records),
        images=image_figures(records),
        warnings=warning_summary(events),
        pods=rows,
        **({"pods_that_never_ran": unrun} if unrun else {}),
    )
    # The Job may first have existed before the create call returned (its pods can be created
    # before): the timeline marks that moment on its axis, which starts at job_created.
    return BatchSummary(
        figures,
        records,
        sources.job_created,
        sources.job_point.earliest or sources.job_created,
        [failed_record(sources, logs, failed_pod, row) for failed_pod, row in failed],
        drafts_taken=sum(episode.drafted for episode in summarised),
        csv_rows={
            episode.record["pod"]: episode.csv_row
            for episode in summarised
            if episode.csv_row is not None
        },
        phase_samples=phase_samples,
    )


def image_figures(records: Sequence[dict], rows: Sequence[dict] = ()) -> dict[str, dict]:
    """Per image: its episodes (with `rows`, a rollout's every episode, and how many failed), how many
    of the summarised ones found it present or had it pulled, the image_pull phase of those pulled
    (the wait behind the node's other pulls included) and the kubelet's own figures: its wait, the
    image's size."""
    by_image: dict[str, list[dict]] = {}
    for record in records:
        by_image.setdefault(record.get("image") or "unknown", []).append(record)
    attempted: dict[str, list[dict]] = {}
    for row in rows:
        attempted.setdefault(row.get("image") or "unknown", []).append(row)
    figures = {}
    for image in list(by_image) + [image for image in attempted if image not in by_image]:
        summarised = by_image.get(image, [])
        pulled = [record for record in summarised if record.get("image_cache") == "pulled"]
        pull = describe(
            [
                record["phases"]["image_pull"][0]
                for record in pulled
                if (record["phases"] or {}).get("image_pull") is not None
            ]
        )
        reports = [
            record["image_pull"] for record in summarised if record.get("image_pull") is not None
        ]
        waiting = describe(
            [
                report.waiting_seconds
                for report in reports
                if report.pulled and report.waiting_seconds is not None
            ]
        )
        sizes = [report.size_bytes for report in reports if report.size_bytes is not None]
        entry: dict[str, Any] = {
            "episodes": len(attempted[image]) if rows else len(summarised),
            "pulled": len(pulled),
            "present": sum(1 for record in summarised if record.get("image_cache") == "present"),
            "image_pull_p50_seconds": pull.get("p50"),
            "image_pull_max_seconds": pull.get("max"),
            "image_pull_waiting_p50_seconds": waiting.get("p50"),
            "image_pull_waiting_max_seconds": waiting.get("max"),
            "image_size_bytes": max(sizes) if sizes else None,
        }
        if rows:
            entry["failed_episodes"] = sum(1 for row in attempted[image] if is_failure(row))
        figures[image] = entry
    return figures


def episodes_csv(batches: Sequence[tuple[str, BatchSummary]]) -> str:
    """One row per episode, a rollout's failed and cancelled ones included (after the others, in
    index order, their points as far as they got): every point (seconds after its Job's
    creationTimestamp, and as an absolute time with its source, clock and precision) and every
    phase with its precision; then its task and outcome (OUTCOME_COLUMNS). `index` (the
    completion index) is there for an Indexed Job; a default run's pods have none."""
    return "".join(episodes_csv_pieces(batches))


# The last columns of episodes.csv, after every column older files had (read by place too):
# the episode's task and its outcome, as its line of rewards.jsonl says them.
OUTCOME_COLUMNS = ["task_id", "failure_class", "failure", "valid"]


def outcome_fields(record: Mapping[str, Any]) -> list[str]:
    """An episode's OUTCOME_COLUMNS: a success's class and failure are empty, and it is valid."""
    task_id = record.get("task_id")
    return [
        "" if task_id is None else str(task_id),
        record.get("failure_class") or "",
        record.get("failure") or "",
        "false" if record.get("valid") is False else "true",
    ]


# episodes.csv is made in pieces of this many rows: 100,000 rows (about 90 MB) are written
# without one string of them all.
CSV_ROWS_A_PIECE = 1000


def episodes_csv_header(indexed: bool) -> list[str]:
    """The columns of episodes.csv, in their places (`index` only for an Indexed Job)."""
    return (
        ["batch", "pod", *(["index"] if indexed else []), "node", "reward"]
        + ["image_cache", "runtime_class"]
        + [f"{p}_after_job_seconds" for p in POINTS]
        + [f"{p}_precision_seconds" for p in POINTS]
        + [f"{phase}_seconds" for phase in PHASES]
        + [f"{p}_at" for p in POINTS]
        + [f"{p}_source" for p in POINTS]
        + [f"{p}_clock" for p in POINTS]
        + [f"{phase}_precision_seconds" for phase in PHASES]
        + ["image", "image_pull_waiting_seconds", "image_pull_kubelet_seconds", "image_size_bytes"]
        + OUTCOME_COLUMNS
    )


def episodes_csv_pieces(batches: Sequence[tuple[str, BatchSummary]]) -> Iterator[str]:
    """episodes.csv (see episodes_csv) a piece at a time."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    indexed = any(
        record.get("index") is not None
        for _, summary in batches
        for record in [*summary.episodes, *summary.failed]
    )
    writer.writerow(episodes_csv_header(indexed))
    for batch_name, summary in batches:
        rows = {row["pod"]: row for row in summary.figures["pods"]}
        job_created = summary.job_created
        for number, record in enumerate(summary.episodes):
            if number % CSV_ROWS_A_PIECE == 0:
                yield out.getvalue()
                out.seek(0)
                out.truncate()
            leading = [batch_name, record["pod"], *([record["index"] or ""] if indexed else [])]
            made = summary.csv_rows.get(record["pod"])
            if made is None:
                writer.writerow(
                    leading
                    + episode_csv_fields(rows[record["pod"]], record, job_created)
                    + outcome_fields(record)
                )
                continue
            # Its draft's row between the leading and the outcome fields, written as the writer
            # writes them: a row is its fields, each quoted or not on its own, joined by the delimiter.
            out.write(
                csv_text(leading)[:-1]
                + ","
                + made.get(record["pod"])[:-1]
                + ","
                + csv_text(outcome_fields(record))
            )
        for record in sorted(summary.failed, key=lambda failed: failed["index"]):
            leading = [batch_name, record["pod"] or "", *([record["index"]] if indexed else [])]
            writer.writerow(
                leading + episode_csv_fields(record, record, job_created) + outcome_fields(record)
            )
    yield out.getvalue()


def episode_csv_fields(row: dict, record: Mapping[str, Any], job_created: float) -> list[Any]:
    """An episode's fields of episodes.csv after its batch, pod and index: from its row in
    results.json and its record, all a draft has as it ends."""
    points = [record["points"][p] for p in POINTS]
    phases = [record["phases"][ph] for ph in PHASES]
    return (
        [
            row["node"] or "",
            "" if row["reward"] is None else row["reward"],
            record.get("image_cache") or "",
            record.get("runtime_class") or "",
        ]
        + ["" if point is None else f"{point[0] - job_created:.6f}" for point in points]
        + ["" if point is None else f"{point[1]:.6g}" for point in points]
        + ["" if phase is None else f"{phase[0]:.6f}" for phase in phases]
        + ["" if point is None else f"{point[0]:.6f}" for point in points]
        + ["" if point is None else getattr(point, "source", "") for point in points]
        + ["" if point is None else getattr(point, "clock", "") for point in points]
        + ["" if phase is None else f"{phase[1]:.6g}" for phase in phases]
        + image_columns(record)
    )


def csv_text(fields: Sequence[Any]) -> str:
    """One row of episodes.csv as its writer writes it, with its line end."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(fields)
    return out.getvalue()


def image_columns(record: Mapping[str, Any]) -> list[str]:
    """An episode's image and what the kubelet said of its pull: the wait, the pull alone, the size."""
    pull: ImagePull | None = record.get("image_pull")

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.6f}"

    if pull is None:
        return [record.get("image") or "", "", "", ""]
    if not pull.pulled:  # present: no pull, so no wait
        return [record.get("image") or "", number(0.0), number(0.0), ""]
    return [
        record.get("image") or "",
        number(pull.waiting_seconds),
        number(pull.pull_seconds),
        "" if pull.size_bytes is None else str(pull.size_bytes),
    ]
