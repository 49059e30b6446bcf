"""Parsing what the cluster and the episodes said."""

from __future__ import annotations

import datetime
import functools
import itertools
import json
import re
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

from .constants import (
    BATCH_LABEL,
    CONTAINER_NAME,
    DURATION_UNITS,
    EPISODE_INDEXES_ANNOTATION,
    NEED_GROUPS_ANNOTATION,
)
from .files import ENCODED_ITEMS_A_PIECE


def index_ranges(indexes: Iterable[int]) -> str:
    """Indexes as a Job's index list: `0-3,8-11` (the format of its completedIndexes)."""
    ranges: list[list[int]] = []
    for index in sorted(set(indexes)):
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


# Thousands of pods and events share each whole second's stamp: each is parsed once.
@functools.lru_cache(maxsize=1 << 16)
def parse_time(text: str | None) -> float | None:
    """RFC 3339 (`2026-01-02T03:04:05Z`, optional fraction or offset) -> epoch seconds."""
    if not text:
        return None
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    if "." in value:
        head, rest = value.split(".", 1)
        digits = len(rest) - len(rest.lstrip("0123456789"))
        fraction, offset = rest[:digits], rest[digits:]
        value = f"{head}.{(fraction + '000000')[:6]}{offset}"
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def rfc3339(moment: float) -> str:
    """Epoch seconds -> RFC 3339 in UTC, whole seconds, as Kubernetes writes times."""
    return datetime.datetime.fromtimestamp(int(moment), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `2h`, `1d`, `1h30m` -> seconds (more than 0); ValueError naming the text otherwise."""
    value = text.strip().lower()
    if value.startswith("-"):
        raise ValueError(f"a duration is never negative: {text!r} (e.g. 90s, 30m, 2h, 1d, 1h30m)")
    parts = re.findall(r"(\d+)([smhd])", value)
    if not value or "".join(number + unit for number, unit in parts) != value:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 30m, 2h, 1d, 1h30m)")
    seconds = sum(int(number) * DURATION_UNITS[unit] for number, unit in parts)
    if seconds <= 0:
        raise ValueError(f"duration must be more than 0: {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> the two largest units, as kubectl shows an age: `45s`, `12m`, `3h5m`, `2d4h`."""
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s"
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size * (2 if unit == "d" else 1):
            rest = (whole % size) // smaller_size
            return f"{whole // size}{unit}" + (f"{rest}{smaller}" if rest else "")
    return f"{whole // 60}m"


def parse_events(lines: Iterable[str]) -> list[dict]:
    """The JSON events of an episode log; any other line is kept in the log and skipped here."""
    events = []
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            events.append(record)
    return events


def iter_json_stream(chunks: Iterable[str]) -> Iterator[Any]:
    """Yield each JSON value of a stream of concatenated values (what `kubectl get -w -o json` prints)."""
    decoder = json.JSONDecoder()
    buffer = ""
    for chunk in chunks:
        buffer += chunk
        while True:
            stripped = buffer.lstrip()
            if not stripped:
                buffer = ""
                break
            try:
                value, end = decoder.raw_decode(stripped)
            except ValueError:
                buffer = stripped  # incomplete: wait for more text
                break
            buffer = stripped[end:]
            yield value


def condition(obj: dict, kind: str) -> dict | None:
    """The status condition of that type, if present."""
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return None


def condition_true(obj: dict, kind: str) -> bool:
    entry = condition(obj, kind)
    return entry is not None and entry.get("status") == "True"


def job_finished(job: dict) -> str | None:
    """ "Complete" or "Failed" once the Job controller has said so, else None. A Job the tool
    stopped once --need-groups was met is "Complete" once none of its pods is left running,
    whatever its controller concluded of the pods that stopping deleted."""
    if cancelled_by_tool(job):
        status = job.get("status") or {}
        stopped = any(condition_true(job, kind) for kind in ("Suspended", "Complete", "Failed"))
        # Its pods still terminating are stopped all the same: the batch is over.
        return "Complete" if stopped and not status.get("active") else None
    for kind in ("Complete", "Failed"):
        if condition_true(job, kind):
            return kind
    return None


def cancelled_by_tool(job: dict) -> bool:
    """The tool stopped the Job's remaining episodes once --need-groups was met."""
    return NEED_GROUPS_ANNOTATION in ((job.get("metadata") or {}).get("annotations") or {})


def job_episode_indexes(job: dict) -> list[int] | None:
    """The run-wide index of each completion index of a Job of several (None: a batch's one Job)."""
    annotations = (((job.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
        "annotations"
    ) or {}
    text = annotations.get(EPISODE_INDEXES_ANNOTATION)
    return None if text is None else sorted(index_list(text))


def run_wide_indexes(job: dict, field: str) -> set[int]:
    """A Job's completedIndexes or failedIndexes as the run's episode indexes."""
    local = index_list(((job.get("status") or {}).get(field)) or "")
    mapping = job_episode_indexes(job)
    if mapping is None:
        return local
    return {mapping[index] for index in local if 0 <= index < len(mapping)}


def latest_condition(jobs: Sequence[dict], kind: str) -> dict | None:
    """The condition `kind` of the Job that reached it last, if every Job reached it (True)."""
    entries = [condition(job, kind) for job in jobs]
    if not entries or any(entry is None or entry.get("status") != "True" for entry in entries):
        return None
    return max(entries, key=lambda entry: parse_time(entry.get("lastTransitionTime")) or 0.0)  # type: ignore


def merged_job(batch: str, jobs: Sequence[dict], expected: int) -> dict:
    """The Jobs of one batch (one per image) read as the one Job the rest of the tool knows: created
    when the first was, its counts and index lists the sums and unions (as run-wide indexes), and
    ended only once all `expected` have: Complete if every one is, else Failed as the first that
    failed says (the latest end's time). `jobs`: as last seen, in creation order."""
    metadata = jobs[0].get("metadata") or {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": batch,
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "creationTimestamp": first_creation(jobs),
            "resourceVersion": newest_version(jobs),
            "labels": {BATCH_LABEL: batch},
            **merged_annotations(jobs),
        },
        "spec": merged_spec(jobs),
        "status": merged_status(jobs, expected),
    }


def merged_annotations(jobs: Sequence[dict]) -> dict[str, Any]:
    """Of the Jobs' annotations, the one that says the tool stopped them (--need-groups)."""
    for job in jobs:
        annotations = (job.get("metadata") or {}).get("annotations") or {}
        if NEED_GROUPS_ANNOTATION in annotations:
            return {"annotations": {NEED_GROUPS_ANNOTATION: annotations[NEED_GROUPS_ANNOTATION]}}
    return {}


def first_creation(jobs: Sequence[dict]) -> str | None:
    """The earliest creationTimestamp of the Jobs, as written."""
    return min(
        (
            job["metadata"].get("creationTimestamp")
            for job in jobs
            if job["metadata"].get("creationTimestamp")
        ),
        key=lambda t: parse_time(t) or 0.0,
        default=None,
    )


def newest_version(jobs: Sequence[dict]) -> str:
    """The highest resourceVersion of the Jobs."""
    versions = [str(job["metadata"].get("resourceVersion") or "") for job in jobs]
    return max(versions, key=lambda v: int(v) if v.isdigit() else -1)


def merged_spec(jobs: Sequence[dict]) -> dict[str, Any]:
    """The first Job's spec, its completions and parallelism the sums of all the Jobs'."""
    spec = dict(jobs[0].get("spec") or {})
    spec.update(
        completions=sum(int((job.get("spec") or {}).get("completions") or 0) for job in jobs),
        parallelism=sum(int((job.get("spec") or {}).get("parallelism") or 0) for job in jobs),
    )
    return spec


def merged_status(jobs: Sequence[dict], expected: int) -> dict[str, Any]:
    """The Jobs' status as one: counts summed, the first start, index lists joined (run-wide),
    and an end once all `expected` Jobs have ended."""
    statuses = [job.get("status") or {} for job in jobs]
    status: dict[str, Any] = {
        key: sum(int(s.get(key) or 0) for s in statuses)
        for key in ("active", "ready", "succeeded", "failed", "terminating")
        if any(key in s for s in statuses)
    }
    starts = [s["startTime"] for s in statuses if s.get("startTime")]
    if starts:
        status["startTime"] = min(starts, key=lambda t: parse_time(t) or 0.0)
    for field in ("completedIndexes", "failedIndexes"):
        indexes = set().union(*(run_wide_indexes(job, field) for job in jobs))
        if indexes or any(field in s for s in statuses):
            status[field] = index_ranges(indexes)
    ends = [job_finished(job) for job in jobs]
    if len(jobs) == expected and all(ends):
        status["conditions"] = merged_end(jobs, ends)
    return status


def merged_end(jobs: Sequence[dict], ends: Sequence[str | None]) -> list[dict]:
    """The conditions of Jobs that have all ended: Complete (and SuccessCriteriaMet) as the latest
    says if every one completed, else Failed as the first that failed says, at the latest end."""
    if all(end == "Complete" for end in ends):
        suspended = [
            condition(job, "Suspended") for job in jobs if condition_true(job, "Suspended")
        ]
        return [
            c
            for c in (
                latest_condition(jobs, "SuccessCriteriaMet"),
                latest_condition(jobs, "Complete"),
                # Those the tool stopped (--need-groups): the last of them to be.
                max(suspended, key=lambda c: parse_time((c or {}).get("lastTransitionTime")) or 0.0)
                if suspended
                else None,
            )
            if c is not None
        ]
    failed = next(job for job, end in zip(jobs, ends) if end == "Failed")
    last_end = max(
        (condition(job, end or "") or {}).get("lastTransitionTime") or ""
        for job, end in zip(jobs, ends)
    )
    return [dict(condition(failed, "Failed") or {}, lastTransitionTime=last_end)]


def container_status(pod: dict, name: str = CONTAINER_NAME) -> dict:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return status
    return {}


def container_image(pod: dict) -> str | None:
    """The image the pod's episode container runs, as its spec names it."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == CONTAINER_NAME:
            return container.get("image")
    return containers[0].get("image") if containers else None


def container_terminated(pod: dict) -> dict | None:
    """The episode container's terminated state, if it has ended."""
    return (container_status(pod).get("state") or {}).get("terminated")


def pod_name(pod: dict) -> str:
    return pod["metadata"]["name"]


def event_object(event: dict) -> dict:
    """What an event is about: core/v1 says involvedObject, events.k8s.io/v1 says regarding."""
    return event.get("involvedObject") or event.get("regarding") or {}


class EventRecord(NamedTuple):
    """One Kubernetes event, the fields of it this tool reads, from core/v1 or events.k8s.io/v1
    alike: what every reader of events takes (event_record makes one from the event as the API
    gives it). The watch holds each event so, its whole text waiting on disk for events.json: a
    tuple of shared texts takes a third of the event's decoded dicts.

    Each field is the event's own value, None where it has none; what it is about (`kind`,
    `object_name`, `uid`, `field_path`) is its involvedObject's, else its regarding's."""

    name: str | None  # metadata.name: the recorder names it `<object>.<hex UnixNano>`
    created: str | None  # metadata.creationTimestamp: when the API server stored it
    kind: str | None
    object_name: str | None
    uid: str | None
    field_path: str | None
    reason: str | None
    type: str | None
    message: Any  # its message, else (events.k8s.io/v1) its note
    event_time: str | None
    last_timestamp: str | None
    count: Any
    reporting_instance: str | None
    component: str | None  # source.component
    host: str | None  # source.host

    @property
    def text(self) -> str:
        """Its message (or note) as text, "" for none."""
        return str(self.message or "")


def event_record(event: dict) -> EventRecord:
    """The fields of an event this tool reads (see EventRecord)."""
    metadata = event.get("metadata") or {}
    regarding = event_object(event)
    source = event.get("source") or {}
    return EventRecord(
        metadata.get("name"),
        metadata.get("creationTimestamp"),
        regarding.get("kind"),
        regarding.get("name"),
        regarding.get("uid"),
        regarding.get("fieldPath"),
        event.get("reason"),
        event.get("type"),
        event.get("message") or event.get("note"),
        event.get("eventTime"),
        event.get("lastTimestamp"),
        event.get("count"),
        event.get("reportingInstance"),
        source.get("component"),
        source.get("host"),
    )


def event_records(events: Iterable[dict]) -> list[EventRecord]:
    """Events as the API gives them (a list's items, events.json's), as their readers take them."""
    return [event_record(event) for event in events]


def pod_events(events: Iterable[EventRecord], reason: str) -> Iterator[tuple[EventRecord, str]]:
    """The events of `reason` about a Pod: (event, the pod's name)."""
    for event in events:
        if event.reason == reason and event.kind == "Pod":
            yield event, event.object_name or ""


def scheduled_event_times(events: Iterable[EventRecord]) -> dict[str, float]:
    """Pod name -> the scheduler's `Scheduled` eventTime (microsecond precision)."""
    times: dict[str, float] = {}
    for event, pod in pod_events(events, "Scheduled"):
        moment = parse_time(event.event_time)
        if moment is not None:
            times[pod] = moment
    return times


def batch_events(
    events: Iterable[EventRecord], job: dict | None, pods: Sequence[dict], first: bool
) -> list[EventRecord]:
    """The events of one batch of several in a namespace: about its Job or its pods, and
    (for the first batch) about whatever no Job owns, such as the ConfigMap."""
    job_name = ((job or {}).get("metadata") or {}).get("name", "")
    uids = {((job or {}).get("metadata") or {}).get("uid")} | {
        p["metadata"].get("uid") for p in pods
    }
    uids.discard(None)
    # A pod gone before the pods were listed is known by its name alone: <job>-[<index>-]<suffix>.
    own_pod = re.compile(re.escape(job_name) + r"-(\d+-)?[a-z0-9]{5}$")
    kept = []
    for event in events:
        kind, name = event.kind, event.object_name or ""
        if (
            event.uid in uids
            or (kind == "Job" and name == job_name)
            or (kind == "Pod" and own_pod.match(name))
            or (first and kind not in ("Job", "Pod"))
        ):
            kept.append(event)
    return kept


def events_table(events: Sequence[EventRecord]) -> str:
    """Events as a table in the order they were created, like `kubectl get events`, with the UTC time
    each was last seen (kubectl prints its age, which means nothing once the file is read later)."""
    return "".join(events_table_lines(events))


def events_table_lines(events: Sequence[EventRecord]) -> Iterator[str]:
    """events_table a thousand lines at a time, each with its line end: hundreds of thousands of
    events are written without one string of them all, nor one write each."""
    yield f"{'LAST SEEN (UTC)':<22}{'TYPE':<9}{'REASON':<26}{'OBJECT':<40}MESSAGE\n"
    lines = map(event_table_line, sorted(events, key=lambda e: e.created or ""))
    while True:  # as many lines to a piece as a long JSON list's items
        piece = "".join(itertools.islice(lines, ENCODED_ITEMS_A_PIECE))
        if not piece:
            return
        yield piece


def event_table_line(event: EventRecord) -> str:
    seen = event.last_timestamp or event.event_time or event.created
    about = ("" if event.kind is None else event.kind.lower()) + "/" + (event.object_name or "")
    return (
        f"{(seen or '')[:19] + 'Z':<22}{event.type or '':<9}{event.reason or '':<26}"
        f"{about:<40}{(event.message or '').strip()}\n"
    )


def image_cache_states(events: Iterable[EventRecord]) -> dict[str, str]:
    """Pod name -> "present" (the node had the image) or "pulled", from the kubelet's Pulled event."""
    states: dict[str, str] = {}
    for event, pod in pod_events(events, "Pulled"):
        if "already present on machine" in event.text:
            states[pod] = "present"
        elif "Successfully pulled" in event.text:
            states.setdefault(pod, "pulled")
    return states


GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")

GO_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

# The kubelet's words once an image is pulled (Kubernetes >= 1.30 adds the waiting and the size):
# `Successfully pulled image "X" in 1.234s (2.5s including waiting). Image size: 123 bytes.`
PULLED_MESSAGE = re.compile(
    r'Successfully pulled image "(?P<image>[^"]*)" in (?P<pull>\S+?)'
    r"(?: \((?P<total>\S+) including waiting\))?\.?"
    r"(?: Image size: (?P<size>\d+) bytes\.)?\s*$"
)


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration as time.Duration prints it (`1.5s`, `850ms`, `1m2.5s`, `0s`);
    ValueError for anything else."""
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    if body == "0":
        return 0.0
    parts = GO_DURATION_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"not a Go duration: {text!r}")
    return sign * sum(float(number) * GO_DURATION_UNITS[unit] for number, unit in parts)


class ImagePull(NamedTuple):
    """What the kubelet said of one pod's image: pulled or present, and for a pull its own figures
    (seconds pulling, seconds including the wait for earlier pulls on the node, bytes), None where
    its message does not say."""

    image: str
    pulled: bool
    pull_seconds: float | None = None
    total_seconds: float | None = None
    size_bytes: int | None = None

    @property
    def waiting_seconds(self) -> float | None:
        """How long the pull queued behind others (the kubelet pulls one image at a time by default)."""
        if self.pull_seconds is None or self.total_seconds is None:
            return None
        return max(0.0, self.total_seconds - self.pull_seconds)


# Every pod whose image was present says so in the same words: each is read once, into one record.
@functools.lru_cache(maxsize=1 << 12)
def parse_pulled_message(message: str) -> ImagePull | None:
    """A kubelet Pulled event's message read; None for one that is neither a pull nor a present image."""
    present = re.match(r'Container image "(?P<image>[^"]*)" already present on machine', message)
    if present:
        return ImagePull(present.group("image"), False)
    found = PULLED_MESSAGE.match(message.strip())
    if not found:
        return None

    def seconds(text: str | None) -> float | None:
        try:
            return None if text is None else parse_go_duration(text)
        except ValueError:
            return None

    size = found.group("size")
    return ImagePull(
        found.group("image"),
        True,
        seconds(found.group("pull")),
        seconds(found.group("total")),
        None if size is None else int(size),
    )


def image_pulls(events: Iterable[EventRecord]) -> dict[str, ImagePull]:
    """Pod name -> its episode container's image as the kubelet's Pulled event says (its first one)."""
    pulls: dict[str, ImagePull] = {}
    for event, pod in pod_events(events, "Pulled"):
        if event.field_path not in (None, EPISODE_FIELD_PATH):
            continue
        pull = parse_pulled_message(event.text)
        if pull is not None:
            pulls.setdefault(pod, pull)
    return pulls


def count_image_cache(states: Iterable[str | None]) -> dict[str, int]:
    """How many episodes found their image on the node, had it pulled, or left no trace of which."""
    counts = {"present": 0, "pulled": 0, "unknown": 0}
    for state in states:
        counts[state or "unknown"] += 1
    return counts


def warning_summary(events: Iterable[EventRecord]) -> dict[str, dict]:
    """Warning events per reason: how many, and which objects they named."""
    summary: dict[str, dict] = {}
    for event in events:
        if event.type != "Warning":
            continue
        entry = summary.setdefault(event.reason or "Unknown", {"count": 0, "objects": []})
        entry["count"] += int(event.count or 1)
        kind = "?" if event.kind is None else event.kind
        name = f"{kind}/{'?' if event.object_name is None else event.object_name}"
        if name not in entry["objects"]:
            entry["objects"].append(name)
    return summary


PULL_FAILURE_CHARS = 400


def pod_warnings(events: Iterable[EventRecord], most: int = 3) -> dict[str, list[str]]:
    """Pod name -> its first few distinct Warning events as `reason: message` (a kubelet says
    "Failed: Error: ErrImagePull"), each message cut to one short line."""
    warnings: dict[str, list[str]] = {}
    for event in events:
        if event.type == "Warning" and event.kind == "Pod":
            message = " ".join(event.text.split())
            # A failed pull is said whole enough to name the image and the registry's answer.
            cut = PULL_FAILURE_CHARS if message.startswith("Failed to pull image") else 120
            text = f"{event.reason or 'Unknown'}: {message[:cut]}".rstrip(": ")
            seen = warnings.setdefault(event.object_name or "", [])
            if text not in seen and len(seen) < most:
                seen.append(text)
    return warnings


def index_list(text: str) -> set[int]:
    """A Job's index list ("1,3-5") as a set; a malformed piece is skipped."""
    indexes: set[int] = set()
    for piece in text.split(","):
        first, _, last = piece.strip().partition("-")
        try:
            indexes.update(range(int(first), int(last or first) + 1))
        except ValueError:
            continue
    return indexes


# The kubelet's events about the episode's container name it so (others: an init container's).
EPISODE_FIELD_PATH = f"spec.containers{{{CONTAINER_NAME}}}"
