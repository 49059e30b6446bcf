"""A pool's episodes as points and phases, for its metrics.prom and its trace.

A pool's episode passes through its sandbox's start (the pod created, its container started, its
server listening) and then its own use (the trainer asks for a sandbox, is given one, finishes
it). Each point is the time episodes.csv writes for it; the phases run from point to point. A
sandbox served again (reuse) started once: its start belongs to the first episode it served, and
a later episode on it begins where the trainer asked for it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .timing import REFERENCE_CLOCK, WHOLE_SECOND, Point
from .metrics import (
    EPISODE_CLASSES,
    PREFIX,
    class_series,
    family,
    info_series,
    labelled,
    phase_series,
    reward_series,
    statistic_series,
    write_metrics_text,
)
from .render import (
    FAILED_FILL,
    FAILED_MEANING,
    LABEL_CHARS,
    TIMELINE_MAX_ROWS,
    TimelineKind,
    timeline_axis,
    timeline_head,
    timeline_layout,
    timeline_row,
)
from .telemetry import PhaseTable, RunTracer, episode_spans

CLIENT_CLOCK = "client"
SERVER_CLOCK = "sandbox server"
# A pool's episodes.csv: each episode's sandbox start and its own claim, each point as an absolute
# time with its precision and source, and the phases between them with theirs.
POOL_POINTS = (
    ("pod_created", WHOLE_SECOND, "the pod's creationTimestamp"),
    ("container_started", WHOLE_SECOND, "the kubelet's container status"),
    ("server_ready", 0.0, "the sandbox server's clock"),
    ("claimed", 0.0, "the client's clock"),
    ("finished", 0.0, "the client's clock"),
)
POINT_CLOCKS = {
    "pod_created": REFERENCE_CLOCK,
    "container_started": REFERENCE_CLOCK,
    "server_ready": SERVER_CLOCK,
}
# The points a sandbox's start gives the first episode it serves.
SANDBOX_POINTS = ("pod_created", "container_started", "server_ready")
# Where the trainer asked for a sandbox: `claimed` less the claim's wait (episodes.csv's
# claim_wait_seconds), on the client's clock.
CLAIM_ASKED = "claim_asked"
POOL_PHASES = {
    "pod_start": ("pod_created", "container_started"),
    "server_start": ("container_started", "server_ready"),
    "pod_to_ready": ("pod_created", "server_ready"),
    "claim_wait": (CLAIM_ASKED, "claimed"),
    "episode_work": ("claimed", "finished"),
}
POOL_TABLE = PhaseTable(
    (*SANDBOX_POINTS, CLAIM_ASKED, "claimed", "finished"), POOL_PHASES, ("pod_to_ready",)
)


class PoolTelemetry(NamedTuple):
    """Where a pool's telemetry goes: its trace (--otlp-endpoint or the OTEL_* variables), its
    metrics.prom pushed at the close (--pushgateway), and whether to say where the spans went."""

    tracer: RunTracer | None = None
    pushgateway: str | None = None
    quiet: bool = True


def sandbox_start(
    pod: str, created: float | None, started: float | None, ready: float | None
) -> dict:
    """results.json's record of one sandbox's start: its points, and between the container's
    start and the server listening `server_start`, as precise as the coarser point."""
    return {
        "pod": pod,
        "pod_created_at": created,
        "container_started_at": started,
        "container_started_precision_seconds": WHOLE_SECOND,
        "server_ready_at": ready,
        "server_ready_source": "the sandbox server's clock",
        "server_start_seconds": round(ready - started, 6) if ready and started else None,
        "server_start_precision_seconds": WHOLE_SECOND,
    }


def pool_points(line: Mapping[str, Any], start: Mapping[str, Any], first_use: bool) -> dict:
    """An episode's points from its rewards.jsonl line and its sandbox's start (sandbox_points'
    record), each a Point at the time episodes.csv writes; the sandbox's only on its first use."""
    at = {
        "pod_created": start.get("pod_created_at"),
        "container_started": start.get("container_started_at"),
        "server_ready": start.get("server_ready_at"),
        "claimed": line.get("claimed_at"),
        "finished": line.get("finished_at"),
    }
    points = {}
    for name, precision, source in POOL_POINTS:
        moment = at[name]
        if moment is not None and (first_use or name not in SANDBOX_POINTS):
            points[name] = Point(moment, precision, source, POINT_CLOCKS.get(name, CLIENT_CLOCK))
    if line.get("claimed_at") is not None and line.get("claim_wait_seconds") is not None:
        asked = round(line["claimed_at"] - line["claim_wait_seconds"], 6)
        points[CLAIM_ASKED] = Point(
            asked, 0.0, "the client's clock, claimed less its wait", CLIENT_CLOCK
        )
    return points


def pool_phases(points: Mapping[str, Point]) -> dict[str, tuple[float, float]]:
    """Each phase with both its points: its seconds (0 for an end placed before its start, as
    two points closer than their precisions may be) and its precision (the coarser point's)."""
    phases = {}
    for phase, (first, last) in POOL_PHASES.items():
        if first in points and last in points:
            seconds = max(0.0, points[last].at - points[first].at)
            precision = max(points[first].precision, points[last].precision)
            phases[phase] = (round(seconds, 6), precision)
    return phases


def pool_episode(
    line: Mapping[str, Any], start: Mapping[str, Any], first_use: bool, node: str | None = None
) -> dict:
    """One episode of a pool as a run's episode record reads: what its span and metrics need."""
    points = pool_points(line, start, first_use)
    return {
        "index": line.get("index"),
        "task_id": line.get("task_id"),
        "image": line.get("image"),
        "node": node,
        "pod": line.get("sandbox"),
        "failure_class": line.get("failure_class"),
        "failure": line.get("failure"),
        "valid": line.get("valid"),
        "reward": line.get("reward"),
        "points": points,
        "phases": pool_phases(points),
    }


def first_uses(lines: Iterable[Mapping[str, Any]]) -> set[int]:
    """The index of each sandbox's first episode: a sandbox serves one claim at a time, and
    claims are numbered as they are given."""
    first: dict[str, int] = {}
    for line in lines:
        sandbox, index = line["sandbox"], line["index"]
        first[sandbox] = min(index, first.get(sandbox, index))
    return set(first.values())


def pool_episodes(
    lines: Sequence[Mapping[str, Any]], starts: Sequence[Mapping[str, Any]]
) -> list[dict]:
    """Every episode of a pool, in index order, from rewards.jsonl's lines and the sandboxes'
    starts."""
    by_pod = {start["pod"]: start for start in starts}
    firsts = first_uses(lines)
    return [
        pool_episode(line, by_pod.get(line["sandbox"]) or {}, line["index"] in firsts)
        for line in sorted(lines, key=lambda line: line["index"])
    ]


def pod_to_ready(starts: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each sandbox's pod created to its server listening, seconds."""
    return [
        round(start["server_ready_at"] - start["pod_created_at"], 6)
        for start in starts
        if start.get("server_ready_at") is not None and start.get("pod_created_at") is not None
    ]


def pool_metrics_text(figures: Mapping[str, Any], episodes: Sequence[dict], run_id: str) -> str:
    """A pool's metrics.prom, from its results.json and its episodes (pool_episodes)."""
    run = {"run_id": run_id}
    classes = dict.fromkeys(EPISODE_CLASSES, 0)
    for record in episodes:
        kind = record.get("failure_class") or "ok"
        classes[kind] = classes.get(kind, 0) + 1
    phases: dict[str, list[float]] = {phase: [] for phase in POOL_PHASES}
    for record in episodes:
        for phase, (seconds, _precision) in record["phases"].items():
            phases[phase].append(seconds)
    block = figures.get("pool") or {}
    lines = info_series(figures, run) + class_series(classes, run) + phase_series(phases, run)
    for name, help_text in (
        ("pod_to_ready_seconds", "A sandbox's pod created to its server listening."),
        ("claim_wait_seconds", "A claim asked to a sandbox given, as the trainer waited."),
        ("round_trip_seconds", "A command's round trip, as the client timed it."),
    ):
        given = block.get(name) or {}
        statistics = {k: v for k, v in given.items() if k == "max" or k[1:].isdigit()}
        lines += statistic_series(
            f"pool_{name}", f"{help_text} results.json's pool.{name}.", statistics, run
        )
    for name, help_text in (
        ("size", "The pool's size: its sandboxes at once."),
        ("commands_per_second", "Commands answered per second of the pool's use."),
    ):
        if block.get(name) is not None:
            metric = f"{PREFIX}_pool_{name}"
            lines += family(metric, "gauge", help_text, [labelled(metric, run, block[name])])
    rewards = [r["reward"] for r in episodes if r.get("valid") and r.get("reward") is not None]
    lines += reward_series(rewards, run)
    return "\n".join([*lines, "# EOF", ""])


def write_pool_metrics(
    output: str, figures: Mapping[str, Any], episodes: Sequence[dict], run_id: str
) -> None:
    """metrics.prom in the pool's directory, beside its results.json."""
    write_metrics_text(output, pool_metrics_text(figures, episodes, run_id))


def trace_episode(tracer: RunTracer, record: Mapping[str, Any]) -> None:
    """An episode's span and its phases' spans sent now, under the pool's root span."""
    points = record["points"]
    start = min((point.at for point in points.values()), default=None)
    if start is not None:
        tracer.add(episode_spans(tracer.trace_id, tracer.root_id, record, start, POOL_TABLE))


# A pool's timeline: each episode's sandbox starting, the trainer waiting for it, and its use; the
# blank between a sandbox's start and its claim is the sandbox warm, waiting to be claimed.
POOL_TIMELINE = TimelineKind(
    {
        phase: POOL_PHASES[phase]
        for phase in ("pod_start", "server_start", "claim_wait", "episode_work")
    },
    {
        "pod_start": "#f4a259",
        "server_start": "#e76f51",
        "claim_wait": "#9e9e9e",
        "episode_work": "#4f86c6",
    },
    (
        ("placed below its precision", 'fill="url(#unsplit)"'),
        (FAILED_MEANING.replace(" (or cancelled)", ""), FAILED_FILL.strip()),
        ("gap: the sandbox warm, not yet claimed", 'fill="white" stroke="#999"'),
    ),
    "seconds after the pool's first pod was created (its whole second)",
    chained=False,
)


def pool_row_label(record: Mapping[str, Any]) -> str:
    """A row's name: its task (shortened to fit) and the episode's index."""
    where = f" #{record['index']}"
    task = str(record.get("task_id") or record.get("pod") or "")
    room = LABEL_CHARS - len(where)
    return (task if len(task) <= room else task[: room - 1] + "\u2026") + where


def pool_timeline_svg(episodes: Sequence[dict], title: str) -> str:
    """timeline.svg of a pool: a row per episode (the first TIMELINE_MAX_ROWS by index), its
    phases as bars from the pool's first point, a failed one marked."""
    shown = list(episodes[:TIMELINE_MAX_ROWS])
    if len(episodes) > len(shown):
        title += f" (the first {len(shown)} episodes of {len(episodes)})"
    moments = [point.at for record in shown for point in record["points"].values()]
    origin = float(int(min(moments, default=0.0)))
    # The timeline marks an episode failed when its record names a failure class at all.
    rows = [(origin, {k: v for k, v in r.items() if k != "failure_class" or v}) for r in shown]
    layout = timeline_layout(rows, POOL_TIMELINE)
    parts = timeline_head(layout, title) + timeline_axis(layout)
    for row, (start, record) in enumerate(rows):
        parts += timeline_row(layout, row, start, record, pool_row_label(record))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
