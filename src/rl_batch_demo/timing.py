"""Measurement: what each episode went through, from the API and the worker: points, bounds,
clocks, phases.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .stats import describe, rounded
from .store import Spool
from .parse import (
    EPISODE_FIELD_PATH,
    EventRecord,
    ImagePull,
    condition,
    container_status,
    container_terminated,
    job_finished,
    parse_time,
    pod_name,
    scheduled_event_times,
)

# Resolution of each kind of source, in seconds.
WHOLE_SECOND = 1.0

EVENT_TIME = 1e-6

PROC_TICK = 0.01

# How long after the step it reports an event is named at most. The recorder stamps the name
# (`<object>.<hex UnixNano>`) when it is called, but that is after the step's own call has
# returned: the Job controller's pod create (the API server stamps the pod, writes it to etcd,
# answers), the kubelet's RunPodSandbox (then its sandbox status and image checks over the
# CRI), and then the goroutine's turn, which a loaded machine stretches (0.22 s for a Job
# controller's SuccessfulCreate at load 40 on two cores). The same allowance as the
# scheduler's eventTime after its binding, for the same reason.
EVENT_FOLLOWS_SECONDS = 0.5

# How long after the binding the scheduler takes its Scheduled eventTime at most. Not at once:
# it takes it once its bind request has returned (a round trip through the API server and
# etcd, then its goroutine's turn), which a loaded machine stretches (0.16 s after the node
# agent saw the binding, at load ~30 on two cores). Where this is looser, the PodScheduled
# condition's second bounds the binding instead: the API server stamps it in the binding.
SCHEDULED_FOLLOWS_BINDING_SECONDS = 0.5

# Clocks that disagree by more than this are reported loudly: it is the precision the
# sharpest cluster-side points claim.
CLOCK_TOLERANCE_SECONDS = 0.05

REFERENCE_CLOCK = "control plane"

POINTS = (
    "pod_created",
    "scheduled",
    "sandbox_ready",
    "container_started",
    "process_started",
    "imports_done",
    "ready",
    "reward",
    "container_finished",
)

POINT_SOURCES = {
    "pod_created": "the Job controller's SuccessfulCreate event name (ns), within Pod creationTimestamp's "
    "second, else the client's watch seeing the pod (upper bound) within that second and "
    "after the Job's creation",
    "scheduled": "scheduler's Scheduled event eventTime (microseconds); "
    "PodScheduled condition (whole seconds) if the event is gone",
    "sandbox_ready": "the kubelet's first container event (Pulling/Pulled) name (ns), which follows the "
    "sandbox at once; else PodReadyToStartContainers (whole seconds; Kubernetes >= 1.29) "
    "bounded by the client's watch",
    "container_started": "between the kubelet's Created and Started event names (ns), within startedAt's second",
    "process_started": "worker's /proc start time (10 ms ticks)",
    "imports_done": "worker clock after its imports (microseconds)",
    "ready": "worker's ready event (microseconds)",
    "reward": "worker's reward event (microseconds)",
    "container_finished": "after the reward and within finishedAt's second, up to the client's watch "
    "seeing the container terminated",
}

# Phase name -> (from point, to point). The chain covers an episode end to end;
# pod_to_ready is the guide's own figure (pod created -> episode ready), here from the sharpest points.
PHASES = {
    "scheduling": ("pod_created", "scheduled"),
    "sandbox_creation": ("scheduled", "sandbox_ready"),
    "container_start": ("sandbox_ready", "process_started"),
    "python_imports": ("process_started", "imports_done"),
    "imports_done_to_ready": ("imports_done", "ready"),
    "episode_work": ("ready", "reward"),
    "container_exit": ("reward", "container_finished"),
    "pod_to_ready": ("pod_created", "ready"),
    "pod_to_reward": ("pod_created", "reward"),
    # Part of container_start: the kubelet's Pulling to its Pulled event (the wait behind the node's
    # other pulls included); 0 for an image already present (a Pulled event alone).
    "image_pull": ("image_pull_started", "image_pulled"),
}

# The kubelet's events about a container, in the order it records them when it starts one:
# image pulled or found, container created, container started.
KUBELET_CONTAINER_REASONS = ("Pulling", "Pulled", "Created", "Started")


class Point(NamedTuple):
    """When one point of an episode happened, on the reference clock.

    `precision` is the width of the interval that holds the true moment given every
    source at hand; `at` lies inside it.
    """

    at: float
    precision: float
    source: str
    clock: str
    earliest: float | None = None  # the interval's start, when known


class Bound(NamedTuple):
    """What one source says about a moment, already on the reference clock: it happened
    at or after `lower` and at or before `upper` (None: no limit that side)."""

    lower: float | None
    upper: float | None
    source: str
    clock: str


# Nanoseconds since 1970 take 15 or 16 hex digits from 1972 to 2554: anything else is another name.
EVENT_NAME_TIME = re.compile(r"\.([0-9a-f]{15,16})$")


def event_name_time(event: EventRecord) -> float | None:
    """The moment an event's recorder named it, from `<object>.<hex UnixNano>` (on the recorder's clock)."""
    found = EVENT_NAME_TIME.search(event.name or "")
    return int(found.group(1), 16) / 1e9 if found else None


def kubelet_container_events(
    events: Iterable[EventRecord],
) -> dict[str, dict[str, tuple[float, str]]]:
    """Pod name -> reason -> (earliest name time, node) of the kubelet's container events."""
    found: dict[str, dict[str, tuple[float, str]]] = {}
    for event in events:
        reason = event.reason
        if reason not in KUBELET_CONTAINER_REASONS or event.kind != "Pod":
            continue
        if event.field_path not in (None, EPISODE_FIELD_PATH):
            continue
        moment = event_name_time(event)
        if moment is None:
            continue
        node = event.host or event.reporting_instance or ""
        reasons = found.setdefault(event.object_name or "", {})
        if reason not in reasons or moment < reasons[reason][0]:
            reasons[reason] = (moment, node)
    return found


def pod_creation_events(events: Iterable[EventRecord]) -> dict[str, float]:
    """Pod name -> name time of the Job controller's SuccessfulCreate event for it. An event the
    recorder combined with similar ones names no pod of its own and is skipped."""
    created: dict[str, float] = {}
    for event in events:
        if event.reason != "SuccessfulCreate":
            continue
        message = event.message or ""
        if (
            event.kind != "Job"
            or not message.startswith("Created pod: ")
            or int(event.count or 1) != 1
        ):
            continue
        moment = event_name_time(event)
        if moment is not None:
            created.setdefault(message[len("Created pod: ") :].strip(), moment)
    return created


def pod_observation(observed: dict[str, Any] | None, pod: dict, arrived: float) -> dict[str, Any]:
    """What this client saw of a pod so far (None: nothing), with this version of it, which reached
    it at `arrived` (its wall clock): when each transition first arrived, and the
    PodReadyToStartContainers stamp, kept since the kubelet turns the condition False again once
    the pod ends, so its True transition is only visible while the pod runs.

    A record is never changed once made: a version that adds to it gives a new one (the same one
    when it adds nothing), so whoever holds an earlier record (an episode's draft) holds what was
    seen by then, without a copy of its own.
    """
    observed = observed or {}
    times = observed.get("seen") or {}
    state = container_status(pod).get("state") or {}
    sandbox = condition(pod, "PodReadyToStartContainers")
    reached = {
        "added": True,
        "bound": bool((pod.get("spec") or {}).get("nodeName")),
        "sandbox_ready": sandbox is not None and sandbox.get("status") == "True",
        "running": bool(state.get("running") or state.get("terminated")),
        "terminated": bool(state.get("terminated")),
    }
    new_times = {
        transition: arrived
        for transition, happened in reached.items()
        if happened and transition not in times
    }
    stamp = (
        sandbox["lastTransitionTime"]
        if sandbox and sandbox.get("status") == "True" and sandbox.get("lastTransitionTime")
        else None
    )
    if not new_times and (stamp is None or observed.get("sandbox_ready") == stamp):
        return observed
    updated = dict(observed, seen={**times, **new_times})
    if stamp is not None:
        updated["sandbox_ready"] = stamp
    return updated


def record_job_observation(seen: dict[str, float], job: dict, arrived: float) -> None:
    """Note when this client first saw the Job and each of its conditions turn True."""
    seen.setdefault("added", arrived)
    for entry in (job.get("status") or {}).get("conditions") or []:
        if entry.get("status") == "True" and entry.get("type"):
            seen.setdefault(entry["type"], arrived)


def split_observed(observed: dict | None) -> tuple[dict[str, dict], dict[str, float]]:
    """observed.json -> (per pod, the Job's). Runs before watch times were kept saved the pods alone."""
    observed = observed or {}
    if isinstance(observed.get("pods"), dict):
        return observed["pods"], observed.get("job") or {}
    return observed, {}


# Each reading on another clock is moved onto the reference clock by `offset`, and widened
# each side by `slack`, how far that correction may be off.
def earlier_side(moment: float, offset: float, slack: float) -> float:
    """moment - offset - slack, and the very float when both are 0 (a moment of 0 aside, whose
    sign the sum may change): as every episode drafted with agreeing clocks has them, so that
    its points hold their sources' floats, not copies."""
    return moment if not offset and not slack and moment else moment - offset - slack


def later_side(moment: float, offset: float, slack: float) -> float:
    """moment - offset + slack, the very float when both are 0 (see earlier_side)."""
    return moment if not offset and not slack and moment else moment - offset + slack


def whole_second(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    """A Kubernetes stamp: truncated to the second, so the moment lies in [T, T+1)."""
    return (
        None
        if moment is None
        else Bound(
            earlier_side(moment, offset, slack),
            moment + WHOLE_SECOND - offset + slack,
            source,
            clock,
        )
    )


def upper(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    return None if moment is None else Bound(None, later_side(moment, offset, slack), source, clock)


def lower(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    return (
        None if moment is None else Bound(earlier_side(moment, offset, slack), None, source, clock)
    )


def followed_by_event(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    """A step that an event reports as soon as it returns: at most EVENT_FOLLOWS_SECONDS before its name."""
    if moment is None:
        return None
    return Bound(
        moment - offset - EVENT_FOLLOWS_SECONDS - slack,
        later_side(moment, offset, slack),
        source,
        clock,
    )


@functools.lru_cache(maxsize=1 << 12, typed=True)
def precision_held(seconds: float) -> float:
    """A precision as one float for every point or phase that states it: thousands of episodes
    state the same few (a microsecond, a tick, a second and their sums)."""
    return seconds


def sharpest(bounds: Iterable[Bound | None], stamp: Bound | None = None) -> Point | None:
    """The narrowest interval all the sources allow, as a point.

    The point is the earliest moment known to follow it (an event named after it, a watch
    that saw it), or the start of the server's second when a stamp is all there is. Sources
    that contradict each other (clocks apart) leave the stamp alone to speak.
    """
    low = high = (
        None  # the first bound with the latest lower end, the first with the earliest upper end
    )
    for bound in itertools.chain(bounds, (stamp,)):
        if bound is None:
            continue
        if bound.lower is not None and (low is None or bound.lower > low.lower):  # type: ignore[operator]
            low = bound
        if bound.upper is not None and (high is None or bound.upper < high.upper):  # type: ignore[operator]
            high = bound
    if high is None:
        return None  # nothing shows it happened at all
    if low is not None and low.lower > high.upper:  # type: ignore[operator]
        if stamp is not None:
            return sharpest([], stamp)
        return Point(high.upper, math.inf, f"{high.source} (other sources disagree)", high.clock)  # type: ignore[arg-type]
    assert high is not None and high.upper is not None
    if low is None:
        return Point(high.upper, math.inf, high.source, high.clock)
    if high is stamp:  # nothing but the server's second above it: its start, the guide's reading
        at, named = low.lower, low
    else:
        at, named = high.upper, high
    source = named.source if low is high or named is low else f"{high.source}, after {low.source}"
    width = precision_held(round(high.upper - low.lower, 6))  # type: ignore[operator]
    return Point(at, width, source, named.clock, low.lower)  # type: ignore[arg-type]


def worker_time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class EpisodeClocks(NamedTuple):
    """The client's and the episode's node's clocks minus the control plane's, and how far each may be off."""

    client: float = 0.0
    client_slack: float = 0.0
    node: float = 0.0
    node_slack: float = 0.0


# What an episode is drafted with, as it ends: every clock read as the control plane's.
CLOCKS_AGREE = EpisodeClocks()


def kubelet_named(kubelet: dict[str, tuple[float, str]], reason: str) -> float | None:
    """When the kubelet named its event of that reason (on the node's clock), if it did."""
    return kubelet[reason][0] if reason in kubelet else None


def pod_created_point(
    created: Bound | None,
    seen: dict,
    created_event_at: float | None,
    created_after: Bound | None,
    clocks: EpisodeClocks,
) -> Point | None:
    """The pod's creation: its stamp's second, sharpened by the Job controller's event and this client's watch."""
    return sharpest(
        [
            followed_by_event(created_event_at, "SuccessfulCreate event name", REFERENCE_CLOCK),
            upper(
                seen.get("added"), "watch saw the pod", "client", clocks.client, clocks.client_slack
            ),
            created_after,
        ],
        created,
    )


def scheduled_point(pod: dict, scheduled_at: float | None) -> Point | None:
    """The pod's binding to a node: the scheduler's Scheduled eventTime, else its condition's second."""
    if scheduled_at is not None:
        return Point(scheduled_at, EVENT_TIME, "Scheduled event eventTime", REFERENCE_CLOCK)
    entry = condition(pod, "PodScheduled")
    return sharpest(
        [],
        whole_second(
            parse_time((entry or {}).get("lastTransitionTime")),
            "PodScheduled condition",
            REFERENCE_CLOCK,
        ),
    )


def sandbox_ready_stamp(pod: dict, observed: dict) -> float | None:
    """The PodReadyToStartContainers condition's time while it is True, else as this client's watch saw it."""
    sandbox_condition = condition(pod, "PodReadyToStartContainers") or {}
    stamp = (
        parse_time(sandbox_condition.get("lastTransitionTime"))
        if sandbox_condition.get("status") == "True"
        else None
    )
    return parse_time(observed.get("sandbox_ready")) if stamp is None else stamp


def sandbox_ready_point(
    pod: dict,
    observed: dict,
    kubelet: dict[str, tuple[float, str]],
    scheduled: Point | None,
    created: Bound | None,
    clocks: EpisodeClocks,
) -> Point | None:
    """The pod's sandbox ready: after its binding and creation, before the kubelet's first image or container event."""
    sandbox_stamp = sandbox_ready_stamp(pod, observed)
    sandbox_ready = sharpest(
        sandbox_ready_bounds(observed, kubelet, scheduled, created, clocks, sandbox_stamp)
    )
    if (
        sandbox_ready is not None
        and sandbox_stamp is not None
        and sandbox_ready.source.startswith("PodReadyToStartContainers")
    ):
        # Only the condition bounds it from above: read it as the condition says, as far as the
        # lower bound allows; the precision still spans everything before.
        sandbox_ready = sandbox_ready._replace(
            at=min(
                sandbox_ready.at,
                max(sandbox_stamp - clocks.node, sandbox_ready.at - sandbox_ready.precision),
            )
        )
    return sandbox_ready


def sandbox_ready_bounds(
    observed: dict,
    kubelet: dict[str, tuple[float, str]],
    scheduled: Point | None,
    created: Bound | None,
    clocks: EpisodeClocks,
    sandbox_stamp: float | None,
) -> list[Bound | None]:
    """What bounds the sandbox's readiness: from above the kubelet's events, the watch and the
    PodReadyToStartContainers condition; from below the pod's binding and its creation."""
    seen = observed.get("seen") or {}
    return [
        *kubelet_sandbox_bounds(kubelet, clocks),
        upper(
            seen.get("sandbox_ready"),
            "watch saw the sandbox ready",
            "client",
            clocks.client,
            clocks.client_slack,
        ),
        lower(
            scheduled.at if scheduled is not None and scheduled.precision <= EVENT_TIME else None,
            "Scheduled eventTime",
            REFERENCE_CLOCK,
        ),
        lower(
            created.lower if created is not None else None,
            "Pod creationTimestamp",
            REFERENCE_CLOCK,
        ),
        # The kubelet stamps this condition when its status update reports it, often together
        # with the running container: the sandbox was ready by then, maybe long before.
        upper(
            None if sandbox_stamp is None else sandbox_stamp + WHOLE_SECOND,
            "PodReadyToStartContainers condition",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
    ]


def kubelet_sandbox_bounds(
    kubelet: dict[str, tuple[float, str]], clocks: EpisodeClocks
) -> list[Bound | None]:
    """The kubelet's first image event (Pulling, else Pulled) and its Created event, each named
    once the sandbox was ready."""
    image_event = min((kubelet[r] for r in ("Pulling", "Pulled") if r in kubelet), default=None)
    return [
        followed_by_event(
            image_event[0] if image_event else None,
            f"kubelet {'Pulling' if 'Pulling' in kubelet else 'Pulled'} event name",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
        upper(
            kubelet_named(kubelet, "Created"),
            "kubelet Created event name",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
    ]


def container_started_point(
    state: dict,
    kubelet: dict[str, tuple[float, str]],
    seen: dict,
    clocks: EpisodeClocks,
) -> Point | None:
    """The container's start: its startedAt second, sharpened by the kubelet's events and the watch.

    Not by the worker's /proc start time: a real runtime (runc, crun) forks the container's first
    process when it creates the task, inside the kubelet's start call, and lets it run only when it
    starts the task, so the process's birth comes before the container's start there (and after it
    where the runtime spawns the process to start it)."""
    node, node_slack = clocks.node, clocks.node_slack
    running = state.get("terminated") or state.get("running") or {}
    return sharpest(
        [
            lower(
                kubelet_named(kubelet, "Created"),
                "kubelet Created event name",
                "node",
                node,
                node_slack,
            ),
            upper(
                kubelet_named(kubelet, "Started"),
                "kubelet Started event name",
                "node",
                node,
                node_slack,
            ),
            upper(
                seen.get("running"),
                "watch saw the container running",
                "client",
                clocks.client,
                clocks.client_slack,
            ),
        ],
        whole_second(
            parse_time(running.get("startedAt")), "container startedAt", "node", node, node_slack
        ),
    )


def container_finished_point(
    state: dict, reward: dict, seen: dict, clocks: EpisodeClocks
) -> Point | None:
    """The container's end: its finishedAt second, after the worker's reward, before this client's watch saw it."""
    return sharpest(
        [
            lower(
                worker_time(reward.get("at")),
                "worker reward event",
                "node",
                clocks.node,
                clocks.node_slack,
            ),
            upper(
                seen.get("terminated"),
                "watch saw the container terminated",
                "client",
                clocks.client,
                clocks.client_slack,
            ),
        ],
        whole_second(
            parse_time((state.get("terminated") or {}).get("finishedAt")),
            "container finishedAt",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
    )


def worker_point(value: Any, precision: float, source: str, clocks: EpisodeClocks) -> Point | None:
    """A moment the worker read on the node's clock, moved onto the control plane's."""
    moment = worker_time(value)
    return (
        None
        if moment is None
        else Point(
            earlier_side(moment, clocks.node, 0.0),
            precision_held(round(precision + 2 * clocks.node_slack, 6)),
            source,
            "node",
        )
    )


def creation_stamp(pod: dict) -> Bound | None:
    """The pod's creationTimestamp, the second its creation fell in."""
    return whole_second(
        parse_time(pod["metadata"].get("creationTimestamp")),
        "Pod creationTimestamp",
        REFERENCE_CLOCK,
    )


def episode_points(
    pod: dict,
    ready: dict,
    reward: dict,
    scheduled_at: float | None,
    observed: dict | None = None,
    kubelet: dict[str, tuple[float, str]] | None = None,
    created_event_at: float | None = None,
    clocks: EpisodeClocks = CLOCKS_AGREE,
    created_after: Bound | None = None,
) -> dict[str, Point | None]:
    """When each point of one episode happened, from its sharpest sources, on the control plane's clock.

    `observed` is what this client's watch saw of the pod (when each transition first
    arrived, and stamps seen only while it ran); `kubelet` the kubelet's container events
    (reason -> name time, node); `clocks` the client's and this pod's node's clocks minus the
    control plane's, and how far each may be off: a point read on that clock is that much less
    precise (by default every clock reads as the control plane's). `created_after`:
    what else the pod was created after (its Job's creation, an earlier pod's end).
    """
    observed = observed or {}
    seen = observed.get("seen") or {}
    kubelet = kubelet or {}
    state = container_status(pod).get("state") or {}
    created = creation_stamp(pod)
    scheduled = scheduled_point(pod, scheduled_at)
    return {
        "pod_created": pod_created_point(created, seen, created_event_at, created_after, clocks),
        "scheduled": scheduled,
        "sandbox_ready": sandbox_ready_point(pod, observed, kubelet, scheduled, created, clocks),
        "container_started": container_started_point(state, kubelet, seen, clocks),
        "process_started": worker_point(
            ready.get("process_started_at"), PROC_TICK, "worker /proc start time", clocks
        ),
        "imports_done": worker_point(
            ready.get("imports_done_at"), EVENT_TIME, "worker imports_done_at", clocks
        ),
        "ready": worker_point(ready.get("at"), EVENT_TIME, "worker ready event", clocks),
        "reward": worker_point(reward.get("at"), EVENT_TIME, "worker reward event", clocks),
        "container_finished": container_finished_point(state, reward, seen, clocks),
        **image_pull_points(kubelet, clocks),
    }


def image_pull_points(
    kubelet: dict[str, tuple[float, str]], clocks: EpisodeClocks
) -> dict[str, Point | None]:
    """When the kubelet began and ended getting the image: its Pulling and Pulled event names (a present
    image: its Pulled event, both). Not in POINTS: they bound the phase image_pull alone."""
    pulled = kubelet_named(kubelet, "Pulled")
    started = kubelet_named(kubelet, "Pulling")
    if pulled is None:
        return {"image_pull_started": None, "image_pulled": None}
    points = {}
    for point, moment, reason in (
        ("image_pull_started", pulled if started is None else started, "Pulling"),
        ("image_pulled", pulled, "Pulled"),
    ):
        points[point] = sharpest(
            [
                followed_by_event(
                    moment,
                    f"kubelet {reason if started else 'Pulled'} event name",
                    "node",
                    clocks.node,
                    clocks.node_slack,
                )
            ]
        )
    return points


class ClockBounds:
    """What the evidence proves about one clock's reading minus the control plane's, in seconds."""

    def __init__(self) -> None:
        self.lowest: float | None = None  # the offset is above this
        self.highest: float | None = None  # and below this
        self.samples = 0

    def copy(self) -> ClockBounds:
        other = ClockBounds()
        other.lowest, other.highest, other.samples = self.lowest, self.highest, self.samples
        return other

    def at_least(self, value: float) -> None:
        self.lowest = value if self.lowest is None else max(self.lowest, value)
        self.samples += 1

    def at_most(self, value: float) -> None:
        self.highest = value if self.highest is None else min(self.highest, value)
        self.samples += 1

    def contradictory(self) -> bool:
        return self.lowest is not None and self.highest is not None and self.lowest > self.highest

    def apart(self) -> float:
        """The least the clocks are proven apart by (signed), 0 while they may agree."""
        if self.contradictory():
            return 0.0  # contradictory evidence: corrected by nothing, and said so
        value = 0.0 if self.lowest is None else max(0.0, self.lowest)
        return value if self.highest is None else min(value, self.highest)

    def corrected(self) -> bool:
        """Proven apart by more than a sharp point's precision: a lesser gap may be no more than
        the premises' allowances (an event named a little later than they say) and is left alone."""
        return abs(self.apart()) > CLOCK_TOLERANCE_SECONDS

    def offset(self) -> float:
        """The correction applied: none while the clocks may agree (the points then assume they do),
        else the middle of what the evidence allows, or its one known edge."""
        if not self.corrected():
            return 0.0
        if self.lowest is None or self.highest is None:
            return self.apart()
        return (self.lowest + self.highest) / 2

    def slack(self) -> float:
        """How far the applied correction may be off: half the evidence's interval, when corrected."""
        if not self.corrected() or self.lowest is None or self.highest is None:
            return 0.0
        return (self.highest - self.lowest) / 2

    def describe(self, what: str, evidence: str) -> tuple[dict, list[str]]:
        offset, apart = self.offset(), self.apart()
        entry = {
            "offset_seconds": rounded(offset, 6),
            "correction_slack_seconds": rounded(self.slack(), 6),
            "at_least_seconds": rounded(self.lowest, 6),
            "at_most_seconds": rounded(self.highest, 6),
            "uncertainty_seconds": None
            if self.lowest is None or self.highest is None
            else rounded(max(0.0, self.highest - self.lowest), 6),
            "samples": self.samples,
            "evidence": evidence,
        }
        warnings = []
        if self.contradictory():
            warnings.append(
                f"{what}: the evidence contradicts itself (offset at least {self.lowest:.3f} s and "
                f"at most {self.highest:.3f} s); no correction applied, sub-second points that mix "
                f"clocks may be wrong by that much"
            )
        elif abs(apart) > CLOCK_TOLERANCE_SECONDS and (self.lowest is None or self.highest is None):
            # One edge only: the correction is the least gap proven; how much more there is, nothing says.
            warnings.append(
                f"{what} disagree by at least {abs(apart):.3f} s (more than the "
                f"{CLOCK_TOLERANCE_SECONDS:g} s a sharp point claims); its times were corrected by "
                f"{-offset:+.3f} s, the least gap proven, but no evidence bounds the gap from the "
                f"other side: points on this clock may be off by more than their stated precision"
            )
        elif abs(apart) > CLOCK_TOLERANCE_SECONDS:
            warnings.append(
                f"{what} disagree by at least {abs(apart):.3f} s (more than the "
                f"{CLOCK_TOLERANCE_SECONDS:g} s a sharp point claims); its times were corrected by "
                f"{-offset:+.3f} s (+/- {self.slack():.3f} s, added to their precision) onto the "
                f"control plane's clock"
            )
        return entry, warnings


def client_clock_bounds(job: dict, job_observed: dict[str, float]) -> ClockBounds:
    """The client's clock as its Job says: its create call before the Job's stamp, its watch
    after each stamped change (each pod's are added by bound_clocks_by_pods)."""
    client = ClockBounds()
    job_created = parse_time(job["metadata"].get("creationTimestamp"))
    if job_created is not None and job_observed.get("submitted") is not None:
        client.at_least(job_observed["submitted"] - job_created - WHOLE_SECOND)
    if job_created is not None and job_observed.get("added") is not None:
        client.at_most(job_observed["added"] - job_created)
    for kind, seen_at in job_observed.items():
        stamp = parse_time((condition(job, kind) or {}).get("lastTransitionTime"))
        if stamp is not None and kind not in ("added", "submitted", "create_returned"):
            client.at_most(seen_at - stamp)
    return client


def kubelet_event_clocks(
    events: Sequence[EventRecord],
) -> tuple[dict[str, ClockBounds], dict[str, tuple[float, str]]]:
    """Each node's clock from its kubelet's events (named before they are stored), and each pod's first Started."""
    nodes: dict[str, ClockBounds] = {}
    started: dict[str, tuple[float, str]] = {}
    for event in events:
        node = event.host
        if not node or event.component != "kubelet":
            continue
        named = event_name_time(event)
        if named is None:
            continue
        stored = parse_time(event.created)
        if stored is not None and int(event.count or 1) == 1:
            nodes.setdefault(node, ClockBounds()).at_least(named - stored - WHOLE_SECOND)
        if event.reason == "Started" and event.kind == "Pod":
            started.setdefault(event.object_name or "", (named, node))
    return nodes, started


def bound_after(stamp: float | None, scheduled_at: float | None) -> float | None:
    """The earliest a pod can have been bound (control plane's clock): its PodScheduled second's
    start (`stamp`), or SCHEDULED_FOLLOWS_BINDING_SECONDS before the scheduler's eventTime if that
    is later."""
    after_event = None if scheduled_at is None else scheduled_at - SCHEDULED_FOLLOWS_BINDING_SECONDS
    known = [moment for moment in (stamp, after_event) if moment is not None]
    return max(known) if known else None


def bound_clocks_by_pods(
    client: ClockBounds,
    nodes: dict[str, ClockBounds],
    pods: Sequence[dict],
    observed_pods: dict[str, dict],
    scheduled: dict[str, float],
    kubelet: dict[str, dict[str, tuple[float, str]]],
    started: dict[str, tuple[float, str]],
) -> dict[str, float]:
    """What each pod says of the clocks, in one pass over the pods (at 10,000 pods, one for each
    clock took a tenth of a second). The client's clock from above: its watch sees a pod after its
    stamped creation and binding. Each node's from above: its kubelet acts on a pod only after the
    pod's creation and binding. Returned: node -> the most the client's clock reads ahead of it
    (the watch sees a container run after it Started)."""
    client_vs_node: dict[str, float] = {}
    for pod in pods:
        name = pod_name(pod)
        seen = (observed_pods.get(name) or {}).get("seen") or {}
        created = parse_time(pod["metadata"].get("creationTimestamp"))
        if created is not None and seen.get("added") is not None:
            client.at_most(seen["added"] - created)
        binding = parse_time((condition(pod, "PodScheduled") or {}).get("lastTransitionTime"))
        if binding is not None and seen.get("bound") is not None:
            client.at_most(seen["bound"] - binding)
        # Only a pod the scheduler bound (its event) is known to have waited for a binding here.
        bound = bound_after(binding, scheduled[name]) if name in scheduled else None
        reasons = kubelet.get(name)
        if bound is not None and reasons:
            named, node = min(reasons.values())  # its first container event
            nodes.setdefault(node, ClockBounds()).at_most(named - bound)
        started_on_node = parse_time((pod.get("status") or {}).get("startTime"))
        node_name = (pod.get("spec") or {}).get("nodeName")
        if bound is not None and started_on_node is not None and node_name:
            # The kubelet stamps the pod's startTime when it first takes the bound pod up: after the binding.
            nodes.setdefault(node_name, ClockBounds()).at_most(
                started_on_node + WHOLE_SECOND - bound
            )
        if name in started:
            named, node = started[name]
            if created is not None:
                nodes.setdefault(node, ClockBounds()).at_most(named - created)
            if seen.get("running") is not None:
                gap = seen["running"] - named
                client_vs_node[node] = min(client_vs_node.get(node, gap), gap)
    return client_vs_node


def describe_clocks(
    client: ClockBounds, nodes: dict[str, ClockBounds], client_vs_node: dict[str, float]
) -> dict:
    """The clocks entry: each clock's offset and evidence, and a warning for each that disagrees."""
    entry, warnings = client.describe(
        "the client's and the control plane's clocks",
        "the create call before the Job's creationTimestamp; the watch seeing "
        "stamped changes (pod created, bound, Job conditions) after their second",
    )
    result: dict[str, Any] = {"reference": REFERENCE_CLOCK, "client": entry, "nodes": {}}
    for node, bounds in sorted(nodes.items()):
        node_entry, node_warnings = bounds.describe(
            f"node {node}'s and the control plane's clocks",
            "kubelet event names before their creationTimestamp's second ends, after the pod's creation "
            "and after its binding (within its PodScheduled second, at most "
            f"{SCHEDULED_FOLLOWS_BINDING_SECONDS:g} s before the Scheduled eventTime); the pod's startTime "
            "after that binding",
        )
        result["nodes"][node] = node_entry
        warnings += node_warnings
        if node in client_vs_node:
            node_entry["client_minus_node_at_most_seconds"] = rounded(client_vs_node[node], 6)
            disagreement = (
                entry["offset_seconds"] - node_entry["offset_seconds"] - client_vs_node[node]
            )
            # A correction known only within its slack may account for that much of it.
            allowed = (
                CLOCK_TOLERANCE_SECONDS
                + entry["correction_slack_seconds"]
                + node_entry["correction_slack_seconds"]
            )
            if disagreement > allowed:
                warnings.append(
                    f"the client saw containers on node {node} running {disagreement:.3f} s before "
                    f"the node's own Started events (corrected clocks): the client's and the node's "
                    f"clocks disagree"
                )
    result["warnings"] = warnings
    return result


def clock_offsets(
    job: dict,
    pods: Sequence[dict],
    events: Sequence[EventRecord],
    observed_pods: dict[str, dict],
    job_observed: dict[str, float],
    kubelet: dict[str, dict[str, tuple[float, str]]] | None = None,
    scheduled: dict[str, float] | None = None,
    kubelet_clocks: tuple[dict[str, ClockBounds], dict[str, tuple[float, str]]] | None = None,
) -> dict:
    """Each clock's offset from the control plane's, bounded by transitions seen on both.

    A watch sees a change after it happened and a server stamp truncates it: the client's
    clock reads at most (seen - stamp) ahead. The client's create call precedes the Job's
    creation. A kubelet names an event before the API server stores it (the event's
    creationTimestamp) and after the pod exists; the client sees a container running only
    after the kubelet's Started event. The kubelet's first container event follows a sandbox
    it started only once the pod was bound, which lies in its PodScheduled second and at most
    SCHEDULED_FOLLOWS_BINDING_SECONDS before the scheduler's Scheduled eventTime; so does the
    pod's startTime, which the kubelet stamps as it takes the pod up (whole seconds, and its
    second's fraction differs from pod to pod, so a few pods pin the node's clock).
    """
    if scheduled is None:
        scheduled = scheduled_event_times(events)
    if kubelet is None:
        kubelet = kubelet_container_events(events)
    client = client_clock_bounds(job, job_observed)
    nodes, started = kubelet_clocks or kubelet_event_clocks(events)
    client_vs_node = bound_clocks_by_pods(
        client, nodes, pods, observed_pods, scheduled, kubelet, started
    )
    return describe_clocks(client, nodes, client_vs_node)


def phase_durations(points: dict[str, Any]) -> dict[str, tuple[float, float] | None]:
    """Phase -> (seconds, precision), or None when a source is missing.

    A phase's precision is the sum of its ends' (the interval of a difference). Its ends
    happen in this order, so a phase that comes out negative is shorter than its
    precision and is reported as 0.
    """
    durations: dict[str, tuple[float, float] | None] = {}
    for phase, (start, end) in PHASES.items():
        first, last = points.get(start), points.get(end)
        durations[phase] = (
            None
            if first is None or last is None
            else (max(0.0, last[0] - first[0]), precision_held(round(first[1] + last[1], 6)))
        )
    return durations


def phase_summary(
    episodes_durations: Sequence[Mapping[str, tuple[float, float] | None]],
    samples: dict[str, list[float]] | None = None,
) -> dict[str, dict]:
    """Per phase: P50/P95/P99/max/mean, sample and missing counts, stated precision. `samples`,
    if given, is filled with each phase's seconds, sorted (the CDF's lines are drawn from them)."""
    summary = {}
    known_of: dict[str, list[tuple[float, float]]] = {phase: [] for phase in PHASES}
    for durations in episodes_durations:  # one pass over the episodes, not one for each phase
        for phase, duration in durations.items():
            if duration is not None and phase in known_of:
                known_of[phase].append(duration)
    for phase, (start, end) in PHASES.items():
        known = known_of[phase]
        values = [value for value, _ in known]
        ordered = sorted(values)
        if samples is not None:
            samples[phase] = ordered
        entry = describe(values, missing=len(episodes_durations) - len(known), ordered=ordered)
        widest = max((p for _, p in known), default=None)
        # An end bounded on one side only has no finite precision: JSON has no infinity, so null.
        entry.update(
            {
                "from": start,
                "to": end,
                "precision_seconds": rounded(widest, 6)
                if widest is not None and math.isfinite(widest)
                else None,
            }
        )
        if not known:
            entry["why_missing"] = f"no episode had both {start} and {end}"
        summary[phase] = entry
    return summary


def difference(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def completion_gap(
    job: dict, pods: Sequence[dict], last_reward_at: float | None, client_observed_at: float | None
) -> dict:
    """What the time between the last reward and the client seeing the end is made of (from the
    last container's finish when no episode rewarded: a rollout whose every agent failed)."""
    finished = [parse_time((container_terminated(p) or {}).get("finishedAt")) for p in pods]
    finished_known = [t for t in finished if t is not None]
    last_finished = max(finished_known) if finished_known else None
    criteria = parse_time((condition(job, "SuccessCriteriaMet") or {}).get("lastTransitionTime"))
    end_kind = job_finished(job) or "Complete"
    end = parse_time((condition(job, end_kind) or {}).get("lastTransitionTime"))
    if last_reward_at is None:
        last_reward_at = last_finished if last_finished is not None else end or 0.0
    parts = completion_parts(last_reward_at, last_finished, criteria, end, client_observed_at)
    gap, bounds = parts_read(parts)
    gap.update(
        {
            "bounds_seconds": bounds,
            "precision_seconds": WHOLE_SECOND,
            "note": "container finish and Job conditions are whole-second Kubernetes times, each read no earlier "
            "than the moment before it; each part lies within its bounds_seconds; SuccessCriteriaMet "
            "exists on Kubernetes >= 1.31",
        }
    )
    return gap


class GapPart(NamedTuple):
    """A part of the completion gap: its earlier and later stamps, each with how far its moment
    may lie after it (the bounds), and the part as read."""

    first: float | None
    first_spread: float
    last: float | None
    last_spread: float
    seconds: float | None


def completion_parts(
    last_reward_at: float,
    last_finished: float | None,
    criteria: float | None,
    end: float | None,
    client_observed_at: float | None,
) -> dict[str, GapPart]:
    """The parts of the completion gap, from the last reward, the last container's finish, the
    Job's SuccessCriteriaMet and end conditions, and the client seeing the end."""
    # A Kubernetes time names the second its moment fell in. The moments happen in this order
    # (reward, container finished, the Job's conditions, the client seeing it), so each stamp
    # is read no earlier than the moment before it: every part is then 0 or more, where two
    # stamps' difference could read as a negative duration, and the parts still add up.
    finish_at = None if last_finished is None else max(last_finished, last_reward_at)
    after_finish = last_reward_at if finish_at is None else finish_at
    met_at = None if criteria is None else max(criteria, after_finish)
    end_at = None if end is None else max(end, after_finish)
    return {
        "last_reward_to_last_container_finished_seconds": GapPart(
            last_reward_at, 0.0, last_finished, WHOLE_SECOND, difference(finish_at, last_reward_at)
        ),
        "last_container_finished_to_success_criteria_met_seconds": GapPart(
            last_finished, WHOLE_SECOND, criteria, WHOLE_SECOND, difference(met_at, finish_at)
        ),
        "last_container_finished_to_job_complete_seconds": GapPart(
            last_finished, WHOLE_SECOND, end, WHOLE_SECOND, difference(end_at, finish_at)
        ),
        "job_complete_to_client_observed_seconds": GapPart(
            end, WHOLE_SECOND, client_observed_at, 0.0, difference(client_observed_at, end_at)
        ),
        "last_reward_to_client_observed_seconds": GapPart(
            last_reward_at,
            0.0,
            client_observed_at,
            0.0,
            difference(client_observed_at, last_reward_at),
        ),
    }


def parts_read(
    parts: dict[str, GapPart],
) -> tuple[dict[str, Any], dict[str, list[float | None]]]:
    """Each part's seconds as read (None where a stamp is missing), and its bounds."""
    gap: dict[str, Any] = {}
    bounds: dict[str, list[float | None]] = {}
    for name, (first, first_spread, last, last_spread, seconds) in parts.items():
        if first is None or last is None or seconds is None:
            gap[name] = None
            continue
        gap[name] = rounded(max(0.0, seconds))
        bounds[name] = [
            rounded(max(0.0, last - first - first_spread)),
            rounded(max(0.0, last + last_spread - first)),
        ]
    return gap, bounds


def node_distribution(pods: Iterable[dict]) -> dict[str, int]:
    """Episodes per node, from the pods."""
    return count_nodes((pod.get("spec") or {}).get("nodeName") for pod in pods)


def count_nodes(nodes: Iterable[str | None]) -> dict[str, int]:
    """Episodes per node name, sorted by name; a pod never scheduled counts as "(unscheduled)"."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node or "(unscheduled)"] = counts.get(node or "(unscheduled)", 0) + 1
    return dict(sorted(counts.items()))


START_PATH_PARTS = (("image", "image"), ("image", "image_cache"), ("runtime", "runtime_class"))


def start_path_phases(records: Sequence[dict]) -> dict[str, dict] | None:
    """When a batch mixes start paths (the image found on the node or pulled; the runtime class),
    the phases of each path apart: pooled, a pull's seconds would pass for a slow sandbox. A path
    is named by the parts that differ within the batch. None for one path."""
    varying = [
        (label, key)
        for label, key in START_PATH_PARTS
        if len({record.get(key) for record in records}) > 1
    ]
    if not varying:
        return None
    paths: dict[str, list] = {}
    for record in records:
        path = ", ".join(f"{label} {record.get(key) or 'unknown'}" for label, key in varying)
        paths.setdefault(path, []).append(record["phases"])
    return {path: phase_summary(durations) for path, durations in sorted(paths.items())}


def slot_freed_after(
    created_within: dict[str, tuple[float, float]], ended_after: dict[str, float], parallelism: int
) -> dict[str, float]:
    """Pod -> a moment it was created after, from its Job's parallelism.

    A Job runs at most `parallelism` pods at once, so a pod created after n others came only
    once n - parallelism + 1 of them had ended. `created_within`: each pod's creation lies in
    (earliest, latest); another pod was provably created before it when its latest precedes
    this one's earliest (a watch's order says less: its first listing comes in name order).
    `ended_after`: a moment each pod's container ended after; an earlier pod whose end is
    unknown leaves no bound.
    """
    found: dict[str, float] = {}
    by_latest = sorted(created_within.items(), key=lambda item: item[1][1])
    ends: list[float] = []
    earlier = 0
    unknown = False
    for name, (earliest, _) in sorted(created_within.items(), key=lambda item: item[1][0]):
        while earlier < len(by_latest) and by_latest[earlier][1][1] < earliest:
            other = by_latest[earlier][0]
            if other in ended_after:
                bisect.insort(ends, ended_after[other])
            else:
                unknown = True
            earlier += 1
        if earlier >= parallelism and not unknown:
            found[name] = ends[earlier - parallelism]
    return found


def job_creation(
    job: dict, job_observed: dict[str, float], client_offset: float, client_slack: float
) -> Point:
    """When the Job was truly created: inside the client's create call and its creationTimestamp's
    second; the client's moments widened by how far its clock's correction may be off."""
    stamp = whole_second(
        parse_time(job["metadata"].get("creationTimestamp")),
        "Job creationTimestamp",
        REFERENCE_CLOCK,
    )
    point = sharpest(
        [
            lower(
                job_observed.get("submitted"),
                "client's create call",
                "client",
                client_offset,
                client_slack,
            ),
            upper(
                job_observed.get("create_returned"),
                "client's create call",
                "client",
                client_offset,
                client_slack,
            ),
            upper(
                job_observed.get("added"),
                "watch saw the Job",
                "client",
                client_offset,
                client_slack,
            ),
        ],
        stamp,
    )
    assert point is not None and stamp is not None  # verify_batch checked the stamp
    return point


class EpisodeInputs(NamedTuple):
    """Everything besides its pod and log that an episode's points are made from (episode_points'
    arguments): equal inputs give equal points."""

    scheduled_at: float | None
    observed: dict | None
    kubelet: dict | None
    created_event_at: float | None
    clocks: EpisodeClocks
    created_after: Bound | None


class EpisodeDraft(NamedTuple):
    """One episode summarised as it ended, from the evidence known then: its verification, its row,
    its points and phases. summarise_batch takes what the final evidence leaves unchanged."""

    pod: dict
    log_text: str
    job_created: float
    builtin: bool
    ready: dict
    reward: dict
    row: dict
    inputs: EpisodeInputs
    points: dict[str, Point | None]
    phases: dict[str, tuple[float, float] | None]
    # Its row of episodes.csv after the batch, pod and index columns, kept in `csv` under its pod's
    # name, as made from these points, phases and row and the image as the events said then.
    csv: Spool | None = None
    image_cache: str | None = None
    image_pull: ImagePull | None = None

    def verified(self, pod: dict, log_text: str, job_created: float, builtin: bool) -> bool:
        """Verified already, from this very pod, log, Job creation and worker."""
        return (
            (self.pod is pod or self.pod == pod)
            and (self.log_text is log_text or self.log_text == log_text)
            and self.job_created == job_created
            and self.builtin == builtin
        )

    def points_for(
        self, pod: dict, ready: dict, inputs: EpisodeInputs
    ) -> tuple[dict[str, Point | None], dict[str, tuple[float, float] | None]] | None:
        """Its points and phases for these final inputs, if made from the same pod and log (None: to
        be made again). What else the pod was created after (an earlier pod's end freeing its slot,
        known for certain only once every earlier pod has ended) bears on its creation alone: should
        only that differ, only that point is made again."""
        if ready is not self.ready or not (self.pod is pod or self.pod == pod):
            return None
        if inputs == self.inputs:
            return self.points, self.phases
        if inputs._replace(created_after=None) != self.inputs._replace(created_after=None):
            return None
        seen = (inputs.observed or {}).get("seen") or {}
        points = dict(
            self.points,
            pod_created=pod_created_point(
                creation_stamp(pod),
                seen,
                inputs.created_event_at,
                inputs.created_after,
                inputs.clocks,
            ),
        )
        return points, phase_durations(points)
