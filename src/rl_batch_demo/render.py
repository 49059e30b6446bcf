"""Rendering: SVG timeline and charts, tables, the comparison."""

from __future__ import annotations

import dataclasses
import math
from html import escape as html_escape
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from .constants import CANCELLED
from .model import Settings
from .stats import sorted_percentile
from .timing import PHASES
from .summary import BatchSummary, RAMP_POINTS, throughput

PHASE_COLOURS = {
    "scheduling": "#9e9e9e",
    "sandbox_creation": "#f4a259",
    "container_start": "#e76f51",
    "python_imports": "#8e7dbe",
    "imports_done_to_ready": "#2a9d8f",
    "episode_work": "#4f86c6",
    "container_exit": "#c9c9c9",
}


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks."""
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def timeline_title(settings: Settings) -> str:
    """What the timeline shows: its episodes in all, and in how many rounds."""
    count, rounds = settings.count, settings.rounds
    episodes = (
        plural(count, "episode")
        if rounds == 1
        else f"{rounds} rounds of {plural(count, 'episode')} ({rounds * count} in all)"
    )
    return f"{episodes}, parallelism {settings.parallelism}, runtime {settings.runtime}"


# Every picture and episodes.csv count from the same zero as results.json's batch_to_* figures.
TIME_AXIS = "seconds after the Job's creationTimestamp (its whole second, as results.json and episodes.csv count)"


def timeline_svg(
    batches: Sequence[tuple[str, BatchSummary]],
    title: str,
    task_ids: Sequence[str] | None = None,
    group_size: int = 1,
    admission: dict | None = None,
) -> str:
    """One bar per episode on a shared axis from its Job's creationTimestamp, coloured by phase;
    each row named by its task and group when the run has tasks (`task_ids`, one per group of
    `group_size`), else by its pod."""
    episodes = timeline_episodes(batches)
    layout = timeline_layout(episodes)
    parts = timeline_head(layout, title) + timeline_axis(layout)
    if len(batches) == 1:
        parts += admission_bands(
            layout.x, layout.top - 4, layout.axis_y(), batches[0][1].job_created, admission
        )
    if len(batches) == 1 and batches[0][1].origin > batches[0][1].job_created:
        parts.append(job_created_line(layout, batches[0][1]))
    if not layout.labels:
        middle = f"{layout.top + layout.row_height * layout.rows / 2:.0f}"
        parts.append(
            f'<text x="{layout.left - 12}" y="{middle}" text-anchor="middle" '
            f'transform="rotate(-90 {layout.left - 12} {middle})">'
            f"{layout.rows} episodes, one row each</text>"
        )
    for row, (origin, record) in enumerate(episodes):
        label = episode_label(record, task_ids, group_size)
        parts += timeline_row(layout, row, origin, record, label)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def timeline_episodes(batches: Sequence[tuple[str, BatchSummary]]) -> list[tuple[float, dict]]:
    """Every episode, failed ones included, with its Job's creationTimestamp: the bars in the order
    the pods were created, batch after batch."""
    return [
        (summary.job_created, record)
        for _, summary in batches
        for record in sorted(
            summary.episodes + summary.failed,
            key=lambda r: (
                r["points"]["pod_created"][0] if r["points"].get("pod_created") else math.inf,
                r["pod"] or "",
            ),
        )
    ]


class TimelineKind(NamedTuple):
    """What a timeline's bars are: its phases (each from one point to another) in the order drawn,
    their colours, the legend's other entries (a meaning and its fill), and what its axis counts."""

    phases: Mapping[str, tuple[str, str]]
    colours: Mapping[str, str]
    legend: Sequence[tuple[str, str]]
    axis: str
    # Whether each phase begins where the one before ended (a run's). A pool's claim_wait begins
    # at the claim, which a cold claim makes before its sandbox is ready: its title says its own
    # length, its bar the part after the phase before.
    chained: bool = True


class TimelineLayout(NamedTuple):
    """Where the timeline's parts go: its size, its rows, its plot and its time axis."""

    width: int
    height: int
    rows: int  # one per episode
    row_height: int
    labels: bool  # each row named: rows tall enough to read
    left: int  # the plot's left edge
    plot_width: int
    top: int  # the first row's top, below the legend
    legend: list[str]  # the legend's parts
    step: float  # seconds between ticks
    axis_end: float  # seconds at the axis' right end
    kind: TimelineKind  # a run's episodes, or a pool's

    def x(self, seconds: float) -> float:
        """Where a moment `seconds` after the axis' start is drawn."""
        return self.left + self.plot_width * max(0.0, seconds) / self.axis_end

    def axis_y(self) -> int:
        """Where the time axis is drawn, below the last row."""
        return self.top + self.row_height * self.rows + 6


def timeline_layout(
    episodes: Sequence[tuple[float, dict]], kind: TimelineKind | None = None
) -> TimelineLayout:
    """The timeline's layout: rows as tall as its count allows, named where they are tall enough,
    and an axis to the latest point any episode reached; `kind` a run's unless given."""
    kind = kind or RUN_TIMELINE
    count = len(episodes)
    row_height = 18 if count <= 40 else max(3, min(12, 720 // max(count, 1)))
    labels = row_height >= 10
    left = 170 if labels else 60
    width, right = 1000, 30
    legend, legend_last_row = timeline_legend(left, width - right, kind)
    top = legend_last_row + 38
    span = max(
        [
            point[0] - origin
            for origin, record in episodes
            for point in record["points"].values()
            if point is not None
        ]
        + [1.0]
    )
    step = nice_step(span)
    return TimelineLayout(
        width,
        top + row_height * count + 80,
        count,
        row_height,
        labels,
        left,
        width - left - right,
        top,
        legend,
        step,
        math.ceil(span / step) * step,
        kind,
    )


def timeline_head(layout: TimelineLayout, title: str) -> list[str]:
    """The timeline's opening: its size, the hatching of unsplit phases, its title and legend."""
    width, height = layout.width, layout.height
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        '<defs><pattern id="unsplit" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f4a259"/>'
        '<rect width="3" height="6" fill="#e76f51"/></pattern>'
        '<pattern id="unrewarded" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#dbe6f4"/>'
        '<rect width="2" height="6" fill="#4f86c6"/></pattern></defs>',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{layout.left}" y="20" font-size="15" font-weight="bold">{html_escape(title)}</text>',
    ] + layout.legend


def timeline_axis(layout: TimelineLayout) -> list[str]:
    """The time axis: a gridline and a label per tick, the axis line and what it counts."""
    top, left, plot_width, axis_y = layout.top, layout.left, layout.plot_width, layout.axis_y()
    parts = []
    tick = 0.0
    while tick <= layout.axis_end + 1e-9:
        tx = layout.x(tick)
        parts.append(
            f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{axis_y}" stroke="#e5e5e5"/>'
        )
        parts.append(f'<text x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle">{tick:g}</text>')
        tick += layout.step
    parts.append(
        f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_width}" y2="{axis_y}" stroke="black"/>'
    )
    parts.append(
        f'<text x="{left + plot_width / 2:.0f}" y="{axis_y + 36}" text-anchor="middle">'
        f"{html_escape(layout.kind.axis)}</text>"
    )
    return parts


def job_created_line(layout: TimelineLayout, summary: BatchSummary) -> str:
    """Where the Job may first have existed: its stamp only names the second it began in."""
    created_x = layout.x(summary.origin - summary.job_created)
    return (
        f'<line x1="{created_x:.1f}" y1="{layout.top - 4}" x2="{created_x:.1f}" '
        f'y2="{layout.axis_y()}" stroke="#888" stroke-dasharray="4 3"><title>the Job created, '
        f"at the earliest: {summary.origin - summary.job_created:.3f} s</title></line>"
    )


# The widest row name the timeline's left margin holds.
LABEL_CHARS = 26


def episode_label(record: dict, task_ids: Sequence[str] | None, group_size: int) -> str:
    """A timeline row's name: its task, group and place in the group (`task-7 g3.1`) when the run
    has tasks, a long task id shortened in its middle; else its pod's name, which starts with its
    Job's and so names the round too."""
    index = record.get("index")  # a succeeded episode's as episodes.csv holds it: a str
    if not task_ids or index is None or not str(index).isdigit():
        label = record["pod"] or f"episode {index}: no pod"
        return label[-LABEL_CHARS:]
    group, member = divmod(int(index), max(1, group_size))
    task = str(task_ids[group]) if group < len(task_ids) else "?"
    where = f" g{group}.{member}"
    room = LABEL_CHARS - len(where)
    if len(task) > room:
        task = task[: room // 2] + "…" + task[len(task) - (room - room // 2 - 1) :]
    return task + where


def timeline_row(
    layout: TimelineLayout, row: int, origin: float, record: dict, label: str
) -> list[str]:
    """One episode's row: its name (`label`) where rows are named, its phase bars, and the mark
    of a failed episode; `origin` its Job's creationTimestamp."""
    y = layout.top + row * layout.row_height
    failed = "failure_class" in record
    parts = []
    if layout.labels:
        parts.append(
            f"<g><title>{html_escape(record['pod'] or label)}</title>"
            f'<text x="{layout.left - 6}" y="{y + layout.row_height * 0.7:.1f}" text-anchor="end" '
            f'font-size="11"{FAILED_FILL if failed else ""}>{html_escape(label)}</text></g>'
        )

    def at(moment: float) -> float:
        return layout.x(moment - origin)

    parts += timeline_bars(record, at, y, layout.row_height, layout.kind)
    parts += unrewarded_bar(record, at, y, layout.row_height)
    if failed:
        parts.append(failed_marker(record, at, layout.left, y, layout.row_height))
    return parts


FAILED_FILL = ' fill="#c1121f"'

GAP_MEANING = "gap: a point not reported (e.g. by an episode script) or not measured"

FAILED_MEANING = "\u2715 failed (or cancelled) episode, drawn as far as it got"

UNREWARDED_MEANING = "ran, no reward (hung to its deadline, or crashed)"

RUN_TIMELINE = TimelineKind(
    PHASES,
    PHASE_COLOURS,
    (
        ("split below its precision", 'fill="url(#unsplit)"'),
        (UNREWARDED_MEANING, 'fill="url(#unrewarded)"'),
        (FAILED_MEANING, FAILED_FILL.strip()),
        (GAP_MEANING, 'fill="white" stroke="#999"'),
    ),
    TIME_AXIS,
)

# The points an episode passes before its reward, in order: where its running time starts.
BEFORE_REWARD = (
    "pod_created",
    "scheduled",
    "sandbox_ready",
    "process_started",
    "imports_done",
    "ready",
)


def unrewarded_bar(record: dict, x: Callable[[float], float], y: int, row_height: int) -> list[str]:
    """The time a container ran with no reward to show for it, from the last point it reached
    to its end: a hung episode stopped by its deadline, or one that crashed. Without it a hung
    episode's row ended where its running began."""
    points = record["points"]
    finished = points.get("container_finished")
    if finished is None or points.get("reward") is not None:
        return []
    reached = [points[name][0] for name in BEFORE_REWARD if points.get(name) is not None]
    begin = max((moment for moment in reached if moment <= finished[0]), default=None)
    if begin is None or finished[0] <= begin:
        return []
    bar_gap = 1 if row_height >= 8 else 0
    x0, x1 = x(begin), x(finished[0])
    return [
        f'<rect x="{x0:.2f}" y="{y + bar_gap}" width="{x1 - x0:.2f}" '
        f'height="{row_height - 2 * bar_gap}" fill="url(#unrewarded)"><title>'
        f"{html_escape(record['pod'] or '')} ran with no reward: {finished[0] - begin:.3f} s"
        "</title></rect>"
    ]


def failed_marker(
    record: dict, x: Callable[[float], float], left: int, y: int, row_height: int
) -> str:
    """A failed episode's mark after the last point it reached (at the axis start if none), its
    class and why in the tooltip."""
    reached = [point[0] for point in record["points"].values() if point is not None]
    at = x(max(reached)) if reached else float(left)
    who = record["pod"] or f"episode {record['index']}"
    what = (
        "cancelled"
        if record["failure_class"] == CANCELLED
        else f"failed ({record['failure_class']})"
    )
    why = f"{who} {what}: {record['failure']}"
    return (
        f'<text x="{at + 2:.1f}" y="{y + row_height * 0.8:.1f}" font-size="{min(12, row_height + 2)}"'
        f"{FAILED_FILL}>\u2715<title>{html_escape(why)}</title></text>"
    )


def timeline_legend(left: int, right_edge: int, kind: TimelineKind) -> tuple[list[str], int]:
    """The timeline's legend, one swatch per phase, wrapped at `right_edge`; and its last row's y."""
    legend = [
        (phase.replace("_", " "), f'fill="{colour}"') for phase, colour in kind.colours.items()
    ]
    legend += kind.legend
    parts, legend_x, legend_y = [], left, 32
    for name, fill in legend:
        item_width = 16 + 7 * len(name) + 14
        if legend_x + item_width > right_edge and legend_x > left:
            legend_x, legend_y = left, legend_y + 18
        parts.append(f'<rect x="{legend_x}" y="{legend_y}" width="12" height="12" {fill}/>')
        parts.append(f'<text x="{legend_x + 16}" y="{legend_y + 10}">{name}</text>')
        legend_x += item_width
    return parts, legend_y


def timeline_bars(
    record: dict, x: Callable[[float], float], y: int, row_height: int, kind: TimelineKind
) -> list[str]:
    """One episode's row of phase bars; `x` places an absolute moment on the axis."""
    points = record["points"]
    # Thin rows are drawn edge to edge: a gap would leave a hairline of colour.
    bar_gap = 1 if row_height >= 8 else 0
    parts = []
    # Whole-second points can fall before the sub-second point drawn just before them;
    # such a phase cannot be split from the next one, so both are drawn as one hatched bar.
    cursor: float | None = None
    unsplit: list[str] = []
    for phase, colour in kind.colours.items():
        start, end = kind.phases[phase]
        if points.get(start) is None or points.get(end) is None:
            cursor, unsplit = None, []
            continue
        begin = points[start][0] if cursor is None else max(cursor, points[start][0])
        finish = points[end][0]
        if finish < begin:
            unsplit.append(phase)
            continue
        if finish == begin:
            continue
        names = "+".join(unsplit + [phase])
        fill = "url(#unsplit)" if unsplit else colour
        x0, x1 = x(begin), x(finish)
        said = f"{finish - begin:.3f} s"
        if not kind.chained and not unsplit and begin > points[start][0]:
            said = f"{finish - points[start][0]:.3f} s ({said} of it after the phase before)"
        parts.append(
            f'<rect x="{x0:.2f}" y="{y + bar_gap}" width="{x1 - x0:.2f}" '
            f'height="{row_height - 2 * bar_gap}" fill="{fill}"><title>{html_escape(record["pod"])} '
            f"{names}: {said}</title></rect>"
        )
        cursor, unsplit = finish, []
    return parts


# Pictures that read at any size: the ramp (cumulative counts over time) and the
# distributions (CDFs). Each line is thinned to a few hundred steps, so the file stays
# small and the browser quick however many episodes there are.
CHART_STEPS = 400

TIMELINE_MAX_ROWS = 200

RAMP_COLOURS = {
    "pod_created": "#9e9e9e",
    "scheduled": "#6c757d",
    "sandbox_ready": "#f4a259",
    "ready": "#2a9d8f",
    "reward": "#4f86c6",
    "container_finished": "#1d1d1d",
    "reward_delivered": "#d62828",
}

CDF_COLOURS = dict(
    PHASE_COLOURS, pod_to_ready="#d62828", pod_to_reward="#1d1d1d", image_pull="#b5651d"
)


def thinned(values: Sequence[float], steps: int = CHART_STEPS) -> list[tuple[float, int]]:
    """(value, how many values are <= it) at no more than `steps` evenly spaced ranks, the last included."""
    ordered = sorted(values)
    if not ordered:
        return []
    count = len(ordered)
    kept = min(steps, count)
    ranks = sorted({min(count, max(1, round(count * (i + 1) / kept))) for i in range(kept)})
    return [(ordered[rank - 1], rank) for rank in ranks]


def chart_svg(
    title: str,
    subtitle: str,
    series: Sequence[tuple[str, str, list[tuple[float, float]], bool, str]],
    x_label: str,
    y_label: str,
    y_max: float,
    y_ticks: Sequence[tuple[float, str]],
    x_min: float = 0.0,
    bands: Callable[[ChartLayout], list[str]] | None = None,
) -> str:
    """Step lines on shared axes; each series is (legend text, colour, [(x, y)] rising in x, bold?,
    tooltip); `bands`: what to shade behind them, drawn on the chart's layout."""
    layout = chart_layout(series, y_max, x_min)
    width, height, left = layout.width, layout.height, layout.left
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">{html_escape(title)}</text>',
        f'<text x="{left}" y="40" fill="#444">{html_escape(subtitle)}</text>',
    ]
    parts += chart_axes(layout, x_label, y_label, y_ticks)
    if bands is not None:
        parts += bands(layout)
    parts += chart_legend(layout, series)
    # The bold line is drawn last, so no other hides it.
    for _, colour, points, bold, tooltip in sorted(series, key=lambda line: line[3]):
        if points:
            parts.append(
                f'<path d="{step_path(layout, points)}" fill="none" stroke="{colour}" '
                f'stroke-width="{2.5 if bold else 1.5}"><title>{html_escape(tooltip)}</title></path>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


class ChartLayout(NamedTuple):
    """Where a chart's parts go: its size, its plot, and the values its axes span."""

    width: int
    height: int
    left: int  # the plot's left edge
    top: int  # the plot's top edge
    plot_w: int
    plot_h: int
    axis_start: float  # x at the plot's left edge
    axis_end: float  # x at its right edge
    step: float  # x between ticks
    y_max: float  # y at the plot's top edge

    def sx(self, value: float) -> float:
        """Where x `value` is drawn."""
        return self.left + self.plot_w * (value - self.axis_start) / (
            self.axis_end - self.axis_start
        )

    def sy(self, value: float) -> float:
        """Where y `value` is drawn."""
        return self.top + self.plot_h * (1 - value / max(self.y_max, 1e-9))


def chart_layout(
    series: Sequence[tuple[str, str, list[tuple[float, float]], bool, str]],
    y_max: float,
    x_min: float,
) -> ChartLayout:
    """A chart's layout: the legend right of the plot, the x axis from `x_min` to past the largest
    x, in round steps."""
    width, height = 1000, 560
    left, right, top, bottom = 70, 270, 56, 60
    x_max = max([x for _, _, points, _, _ in series for x, _ in points] + [x_min + 1.0])
    step = nice_step(x_max - x_min)
    return ChartLayout(
        width,
        height,
        left,
        top,
        width - left - right,
        height - top - bottom,
        math.floor(x_min / step) * step,
        math.ceil(x_max / step) * step,
        step,
        y_max,
    )


def chart_axes(
    layout: ChartLayout, x_label: str, y_label: str, y_ticks: Sequence[tuple[float, str]]
) -> list[str]:
    """A chart's gridlines and tick labels, its plot's frame and what each axis counts."""
    left, top, plot_w, plot_h = layout.left, layout.top, layout.plot_w, layout.plot_h
    sx, sy = layout.sx, layout.sy
    parts = []
    tick = layout.axis_start
    while tick <= layout.axis_end + 1e-9:
        parts.append(
            f'<line x1="{sx(tick):.1f}" y1="{top}" x2="{sx(tick):.1f}" y2="{top + plot_h}" stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text x="{sx(tick):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{tick:g}</text>'
        )
        tick += layout.step
    for value, text in y_ticks:
        parts.append(
            f'<line x1="{left}" y1="{sy(value):.1f}" x2="{left + plot_w}" y2="{sy(value):.1f}" '
            f'stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{sy(value) + 4:.1f}" text-anchor="end">{html_escape(text)}</text>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>'
    )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{layout.height - 18}" text-anchor="middle">'
        f"{html_escape(x_label)}</text>"
    )
    parts.append(
        f'<text x="16" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + plot_h / 2:.0f})">{html_escape(y_label)}</text>'
    )
    return parts


def chart_legend(
    layout: ChartLayout, series: Sequence[tuple[str, str, list[tuple[float, float]], bool, str]]
) -> list[str]:
    """A chart's legend right of its plot: each series' line and text, in the order given."""
    right_of_plot = layout.left + layout.plot_w
    parts = []
    for index, (label, colour, _, bold, _) in enumerate(series):
        legend_y = layout.top + 8 + 20 * index
        parts.append(
            f'<line x1="{right_of_plot + 14}" y1="{legend_y}" x2="{right_of_plot + 38}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="{3 if bold else 2}"/>'
        )
        parts.append(
            f'<text x="{right_of_plot + 44}" y="{legend_y + 4}">{html_escape(label)}</text>'
        )
    return parts


def step_path(layout: ChartLayout, points: Sequence[tuple[float, float]]) -> str:
    """A series' steps as a path's data: from 0 at its first x, up (or down) at each point."""
    sx, sy = layout.sx, layout.sy
    path = [f"M{sx(points[0][0]):.1f},{sy(0):.1f}"]
    previous_y = 0.0
    for x_value, y_value in points:
        path.append(f"L{sx(x_value):.1f},{sy(previous_y):.1f}L{sx(x_value):.1f},{sy(y_value):.1f}")
        previous_y = y_value
    return "".join(path)


def ramp_svg(
    batches: Sequence[tuple[str, BatchSummary]],
    title: str,
    figures: dict | None = None,
    admission: dict | None = None,
) -> str:
    """How many pods had been created, scheduled, ... finished, over time from their Job's
    creationTimestamp (as the timeline counts); `figures`: the batches' throughput, when already computed."""
    records = [
        (summary.job_created, record) for _, summary in batches for record in summary.episodes
    ]
    total = len(records)
    series = []
    for point in RAMP_POINTS:
        moments = [
            record["points"][point][0] - origin
            for origin, record in records
            if record["points"].get(point)
        ]
        known = "" if len(moments) == total else f" ({len(moments)} known)"
        series.append(
            (
                f"{point.replace('_', ' ')}{known}",
                RAMP_COLOURS[point],
                [(x, float(n)) for x, n in thinned(moments)],
                point == "ready",
                f"{point}: {plural(len(moments), 'episode')}",
            )
        )
    delivered = [
        moment - summary.job_created for _, summary in batches for moment in summary.deliveries
    ]
    if delivered:
        # A rollout's successful rewards as they reached rewards.jsonl (the client's clock).
        series.append(
            (
                "reward in rewards.jsonl",
                RAMP_COLOURS["reward_delivered"],
                [(x, float(n)) for x, n in thinned(delivered)],
                True,
                f"rewards delivered: {len(delivered)} lines",
            )
        )
    figures = figures if figures is not None else throughput(batches)
    failed = sum(len(summary.failed) for _, summary in batches)
    left_out = f" ({failed} failed or cancelled, not counted)" if failed else ""
    subtitle = (
        f"{plural(total, 'episode')}{left_out}; pods created "
        f"{figures['pods_created_per_second'] or '-'}/s; sandboxes ready "
        f"{figures['sandboxes_ready_per_second_mean'] or '-'}/s mean, "
        f"{figures['sandboxes_ready_per_second_peak'] or '-'} in the busiest second; "
        f"at most {plural(figures['max_episodes_running_at_once'] or None, 'episode')} running at once"
    )
    bands = ramp_bands(batches, admission)
    ticks = count_ticks(total)
    return chart_svg(title, subtitle, series, TIME_AXIS, RAMP_Y, max(total, 1), ticks, 0.0, bands)


RAMP_Y = "episodes (cumulative)"


def count_ticks(total: int) -> list[tuple[float, str]]:
    """The ramp's y ticks, up to `total` episodes in round steps."""
    y_step = nice_step(max(total, 1), ticks=5)
    ticks = []
    value = 0.0
    while value <= total + 1e-9:
        ticks.append((value, f"{value:g}"))
        value += y_step
    return ticks


def ramp_bands(
    batches: Sequence[tuple[str, BatchSummary]], admission: dict | None
) -> Callable[[ChartLayout], list[str]] | None:
    """The admission's bands behind one queued batch's ramp; none for several batches."""
    if len(batches) != 1 or not admission:
        return None
    origin = batches[0][1].job_created

    def bands(layout: ChartLayout) -> list[str]:
        bottom = layout.top + layout.plot_h
        return admission_bands(layout.sx, layout.top, bottom, origin, admission, axis_start=0.0)

    return bands


# --queue: the bands of a queued batch's admission, behind the timeline and the ramp.
ADMISSION_BANDS = (
    ("queued_at", "quota_reserved_at", "queue_wait", "#cfd8dc"),
    ("quota_reserved_at", "admitted_at", "admission_checks", "#ffe0b2"),
)


def admission_bands(
    x: Callable[[float], float],
    top: float,
    bottom: float,
    origin: float,
    admission: dict | None,
    axis_start: float | None = None,
) -> list[str]:
    """A band per admission phase of one batch (queue_wait, admission_checks), from its points'
    seconds after `origin` (the Job's creationTimestamp), each named with its figure and precision."""
    parts: list[str] = []
    for start, end, name, colour in ADMISSION_BANDS:
        begin, until = (admission or {}).get(start), (admission or {}).get(end)
        if begin is None or until is None or until <= begin:
            continue
        left = x(max(begin - origin, axis_start or 0.0))
        right = x(until - origin)
        precision = (admission or {}).get("precision_seconds")
        parts.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left, 1.0):.1f}" '
            f'height="{bottom - top:.1f}" fill="{colour}" fill-opacity="0.6">'
            f"<title>{name}: {until - begin:g} s (+/- {precision:g} s)</title></rect>"
        )
        parts.append(
            f'<text x="{(left + right) / 2:.1f}" y="{top + 12:.1f}" text-anchor="middle" '
            f'fill="#455a64">{name}</text>'
        )
    return parts


def cdf_svg(batches: Sequence[tuple[str, BatchSummary]], title: str) -> str:
    """The distribution of each phase's duration: the share of episodes done within x seconds."""
    records = [record for _, summary in batches for record in summary.episodes]
    series, lowest = [], 0.0
    for phase in PHASES:
        if all(phase in summary.phase_samples for _, summary in batches):
            # The summaries' own samples (sorted runs, merged by the sort below).
            values = [value for _, summary in batches for value in summary.phase_samples[phase]]
        else:
            values = [
                record["phases"][phase][0]
                for record in records
                if record["phases"].get(phase) is not None
            ]
        # Named apart from the guide's pod_to_ready, as the phase table names it.
        name = (SHARP_POD_TO_READY if phase == "pod_to_ready" else phase).replace("_", " ")
        if values:
            lowest = min(lowest, min(values))
            values.sort()  # once, for both percentiles and the line
            p50, p95 = sorted_percentile(values, 0.5), sorted_percentile(values, 0.95)
            label = f"{name}  {p50:.2f} / {p95:.2f}"
        else:
            label = f"{name}: no samples"
        series.append(
            (
                label,
                CDF_COLOURS[phase],
                [(x, n / len(values)) for x, n in thinned(values)],
                phase == "pod_to_ready",
                f"{phase}: {plural(len(values), 'episode')}",
            )
        )
    ticks = [(q / 4, f"{q * 25}%") for q in range(5)]
    subtitle = (
        f"{plural(len(records), 'episode')}; each line: the share of episodes whose phase took at most "
        f"x seconds; "
        f"legend: P50 / P95 in seconds"
    )
    return chart_svg(
        title, subtitle, series, "seconds", "share of episodes", 1.0, ticks, x_min=lowest
    )


def timeline_sample(
    batches: Sequence[tuple[str, BatchSummary]], limit: int = TIMELINE_MAX_ROWS
) -> tuple[list[tuple[str, BatchSummary]], str]:
    """At most `limit` episodes for the timeline, evenly spread in order of pod creation, and a note saying so."""
    total = sum(len(summary.episodes) + len(summary.failed) for _, summary in batches)
    if total <= limit:
        return list(batches), ""
    ordered = sorted(
        (
            (name, summary, record)
            for name, summary in batches
            for record in summary.episodes + summary.failed
        ),
        key=lambda item: (
            (item[2]["points"].get("pod_created") or (0.0,))[0],
            (item[2]["points"].get("ready") or (0.0,))[0],
        ),
    )
    keep = {round(i * (total - 1) / (limit - 1)) for i in range(limit)}
    chosen: dict[str, list] = {}
    for index, (name, _, record) in enumerate(ordered):
        if index in keep:
            chosen.setdefault(name, []).append(record)
    sampled = [
        (
            name,
            dataclasses.replace(
                summary,
                episodes=[r for r in chosen[name] if "failure_class" not in r],
                failed=[r for r in chosen[name] if "failure_class" in r],
            ),
        )
        for name, summary in batches
        if name in chosen
    ]
    return sampled, f" - {len(keep)} of {total} episodes, evenly spread in order of pod creation"


def printed_results(saved: dict, path: str | None = None) -> dict:
    """Results as printed, from their saved form: their summary, then `results_file` (`path`), the
    file that holds the rest. Every field of the guide's results.json but its per-pod rows, as the
    guide prints them, and of the rest each field that is one line's worth: a number, a string, a
    flag, an object of those, a list of strings (clock warnings); and the warning events, each
    naming its first few objects. Rows (per pod, episode, group),
    phases and clocks stay in the file: printed whole they ran to hundreds of lines. Each round
    and the warm-up are summarised alike."""
    kept: dict[str, Any] = {}
    for key, value in saved.items():
        if key == "rounds" and isinstance(value, list):
            kept[key] = [printed_results(round_) for round_ in value]
        elif key == "warmup" and isinstance(value, dict):
            kept[key] = printed_results(value)
        elif key == "warnings" and isinstance(value, dict):
            kept[key] = printed_warnings(value)
        elif key != "pods" and one_line_field(value):
            kept[key] = value
    if path is not None:
        kept["results_file"] = path
    return kept


# How many objects a printed warning names; the rest are counted (results.json names them all).
PRINTED_WARNING_OBJECTS = 3


def printed_warnings(warnings: dict[str, dict]) -> dict[str, dict]:
    """The warning events per reason, each naming its first few objects and counting the rest."""
    printed = {}
    for reason, entry in warnings.items():
        objects = list(entry.get("objects") or [])
        shown = objects[:PRINTED_WARNING_OBJECTS]
        if len(objects) > len(shown):
            shown.append(f"and {len(objects) - len(shown)} more")
        printed[reason] = {**entry, "objects": shown}
    return printed


def one_line_field(value: Any) -> bool:
    """A number, string, flag or null; an object of those; or a list of strings."""

    def plain(item: Any) -> bool:
        return item is None or isinstance(item, (str, int, float, bool))

    if isinstance(value, dict):
        return all(plain(item) for item in value.values())
    if isinstance(value, list):
        return bool(value) and all(isinstance(item, str) for item in value)
    return plain(value)


def throughput_line(figures: dict) -> str:
    """The throughput figures in one line for the terminal."""

    def shown(value: Any) -> str:
        return "-" if value is None else f"{value:g}"

    return (
        f"throughput: pods created {shown(figures.get('pods_created_per_second'))}/s, sandboxes ready "
        f"{shown(figures.get('sandboxes_ready_per_second_mean'))}/s mean and "
        f"{shown(figures.get('sandboxes_ready_per_second_peak'))} in the busiest second, "
        f"at most {plural(figures.get('max_episodes_running_at_once'), 'episode')} running at once"
    )


# The phase of the guide's name, measured between sharper points: named apart where printed.
SHARP_POD_TO_READY = "pod_to_ready (sharp)"


def phase_table(phases: dict[str, dict]) -> str:
    """A plain-text table of the phase breakdown."""
    lines = [
        f"{'phase':<24}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}{'n':>6}{'missing':>9}  precision"
    ]
    for phase, entry in phases.items():
        label = SHARP_POD_TO_READY if phase == "pod_to_ready" else phase
        precision = entry.get("precision_seconds")

        def cell(key: str) -> str:  # called for this row only, before the loop moves on
            return f"{figure(entry.get(key), precision):>8}"  # noqa: B023

        lines.append(
            f"{label:<24}{cell('p50')}{cell('p95')}{cell('p99')}{cell('max')}"
            f"{entry['samples']:>6}{entry['missing']:>9}  "
            f"{'-' if precision is None else f'{precision:.3g} s'}"
        )
    return "\n".join(lines)


def pod_to_ready_line(results: dict) -> str | None:
    """The two pod_to_ready P50s side by side, each named by how it is measured."""
    sharp = (results.get("phases") or {}).get("pod_to_ready") or {}
    guide = results.get("pod_to_ready_p50_seconds")
    if guide is None or sharp.get("p50") is None:
        return None
    counted = (
        " (failed episodes counted at the deadline)" if results.get("pod_to_ready_censored") else ""
    )
    return (
        f"pod_to_ready P50: {guide:.3f} s the guide's (from the pod's whole-second creationTimestamp; "
        f"pod_to_ready_p50_seconds{counted})\n"
        f"                  {figure(sharp['p50'], sharp.get('precision_seconds')):>5} s sharp (between the "
        f"sharpest points; phases.pod_to_ready)"
    )


def phase_tables(results: dict) -> str:
    """The phase table and the two pod_to_ready P50s, then one table per start path when the
    batch mixed them."""
    tables = [
        phase_table(results["phases"])
        + "".join(f"\n{line}" for line in [pod_to_ready_line(results)] if line)
    ]
    for path, phases in (results.get("phases_by_start_path") or {}).items():
        tables.append(f"start path: {path}\n{phase_table(phases)}")
    return "\n\n".join(tables)


# Figures are rounded to the millisecond: a finer precision is below what they show.
FIGURE_RESOLUTION = 0.001


def below_precision(value: Any, precision: float | None) -> bool:
    """A figure smaller than the precision it was measured with says only that it is that small."""
    return (
        isinstance(value, (int, float))
        and precision is not None
        and precision >= FIGURE_RESOLUTION
        and value < precision
    )


def figure(value: Any, precision: float | None) -> str:
    """A measured figure as printed: `< precision` when it is below it, `-` when missing."""
    if not isinstance(value, (int, float)):
        return "-"
    if below_precision(value, precision):
        return f"<{precision:.2g}"
    return f"{value:.3f}"


COMPARED_FIELDS = (
    "episodes",
    "failed_episodes",
    "parallelism",
    "reward_sum",
    "batch_to_all_ready_seconds",
    "batch_to_all_rewards_seconds",
    "client_job_complete_seconds",
    "pod_to_ready_p50_seconds",
    "pod_to_ready_p95_seconds",
    "pod_to_ready_max_seconds",
)

# What a run was, beside what it measured: two runs that differ here are not alike.
COMPARED_CONDITIONS = (
    "context",
    "image",
    "runtime",
    "cache_state",
    "harden",
    "episode_script_sha256",
)

# A run without the field failed no episode: it has results only if every episode passed.
COMPARED_DEFAULTS = {"failed_episodes": 0}


def compare_table(first: dict, second: dict, first_label: str, second_label: str) -> str:
    """Key figures of two runs side by side, with second/first ratios."""
    width = max(len(first_label), len(second_label), 12)
    lines = [f"{'metric':<32}{first_label:>{width}}  {second_label:>{width}}  {'B/A':>8}"]
    rows = [
        (
            field,
            first.get(field, COMPARED_DEFAULTS.get(field)),
            second.get(field, COMPARED_DEFAULTS.get(field)),
        )
        for field in COMPARED_FIELDS
    ]
    precise: dict[str, tuple[Any, Any]] = {}  # row -> the precision of each side's figure
    for row, a, b, precisions in phase_rows(first, second):
        rows.append((row, a, b))
        precise[row] = precisions
    rows += condition_rows(first, second)
    for name, a, b in rows:
        if any(isinstance(value, (str, bool)) for value in (a, b)):
            lines.append(condition_line(name, a, b, width))
        elif name in precise:
            lines.append(precise_line(name, a, b, width, precise[name]))
        else:
            ratio = (
                f"{b / a:.2f}"
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a
                else "-"
            )
            shown_a, shown_b = "-" if a is None else str(a), "-" if b is None else str(b)
            lines.append(f"{name:<32}{shown_a:>{width}}  {shown_b:>{width}}  {ratio:>8}")
    return "\n".join(lines)


def phase_rows(first: dict, second: dict) -> list[tuple[str, Any, Any, tuple[Any, Any]]]:
    """Each phase's median in either run: (row, first's, second's, the precision of each)."""
    rows = []
    for phase in PHASES:
        # The guide's figure of the same name counts from whole seconds; the phase is sharper.
        row = (
            f"{phase}_phase_p50_seconds"
            if f"{phase}_p50_seconds" in COMPARED_FIELDS
            else f"{phase}_p50_seconds"
        )
        entry_a = (first.get("phases") or {}).get(phase, {})
        entry_b = (second.get("phases") or {}).get(phase, {})
        a, b = entry_a.get("p50"), entry_b.get("p50")
        if a is not None or b is not None:
            precisions = (entry_a.get("precision_seconds"), entry_b.get("precision_seconds"))
            rows.append((row, a, b, precisions))
    return rows


def condition_rows(first: dict, second: dict) -> list[tuple[str, Any, Any]]:
    """What each run was (COMPARED_CONDITIONS) and how many of its episodes found their image
    present or pulled, where either run says."""
    conditions = [(field, first.get(field), second.get(field)) for field in COMPARED_CONDITIONS]
    conditions += [
        (
            f"image_{state}_episodes",
            (first.get("image_cache") or {}).get(state),
            (second.get("image_cache") or {}).get(state),
        )
        for state in ("present", "pulled")
    ]
    return [(name, a, b) for name, a, b in conditions if a is not None or b is not None]


def condition_line(name: str, a: Any, b: Any, width: int) -> str:
    """A row of texts or flags: whether the two runs had the same (a digest shown by its start)."""
    a, b = (
        value[:12] if isinstance(value, str) and len(value) == 64 else value for value in (a, b)
    )
    same = "same" if a == b else "differ"
    return (
        f"{name:<32}{'-' if a is None else a!s:>{width}}  {'-' if b is None else b!s:>{width}}  "
        f"{same:>8}"
    )


def precise_line(name: str, a: Any, b: Any, width: int, precisions: tuple[Any, Any]) -> str:
    """A row of phase figures measured with a precision: one below it is shown as such."""
    precision_a, precision_b = precisions
    # No ratio of a figure below its precision: it could be anything from 0 to that.
    ratio = (
        "-"
        if below_precision(a, precision_a)
        or below_precision(b, precision_b)
        or not a
        or a is None
        or b is None
        else f"{b / a:.2f}"
    )
    shown_a, shown_b = precise_figure(a, precision_a), precise_figure(b, precision_b)
    return f"{name:<32}{shown_a:>{width}}  {shown_b:>{width}}  {ratio:>8}"


def precise_figure(value: Any, precision: float | None) -> str:
    """A figure as compared: `< precision` when it is below it, `-` when missing, else as saved."""
    if value is None:
        return "-"
    return figure(value, precision) if below_precision(value, precision) else str(value)


def plural(number: Any, noun: str) -> str:
    """`1 episode`, `2 episodes`: a count with its noun (a missing count reads `-`)."""
    return f"{'-' if number is None else number} {noun}{'' if number == 1 else 's'}"
