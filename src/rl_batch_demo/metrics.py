"""metrics.prom: a run's figures in the OpenMetrics text format, and the push to a Pushgateway.

The file is the part of OpenMetrics that Prometheus's classic text parser reads as well (the one
node_exporter's textfile collector, the Pushgateway and `promtool check metrics` use): gauges,
histograms and summaries, each with HELP and TYPE, no timestamps, ending with `# EOF`. The info
series is a gauge of value 1 named `..._info`, as `go_info` is, since the classic parser knows
no `info` type. Every series carries the run's `run_id`, so that the files of several runs can
sit side by side in one textfile directory.
"""

from __future__ import annotations

import base64
import http.client
import math
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterable, Mapping, Sequence

from .constants import __version__
from .files import read_text, write_text
from .stats import describe
from .summary import BatchSummary
from .timing import PHASES

METRICS_FILE = "metrics.prom"
PREFIX = "rl_batch_demo"
# From 5 ms to 10 min: a phase's seconds span a sub-second scheduling and a long image pull.
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# An episode's class: its failure_class in rewards.jsonl, "ok" for none.
EPISODE_CLASSES = ("ok", "infrastructure", "episode", "verifier", "cancelled")
QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"), ("1", "max"))
PUSH_TIMEOUT_SECONDS = 10.0


def label_value(value: Any) -> str:
    """A label value as both text formats escape it: backslash, double quote and newline."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value: integers without a fraction, +Inf spelled as both formats spell it."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def labelled(name: str, labels: Mapping[str, Any], value: float) -> str:
    inside = ",".join(f'{key}="{label_value(val)}"' for key, val in labels.items())
    return f"{name}{{{inside}}} {number(value)}"


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def histogram(name: str, labels: Mapping[str, Any], values: Sequence[float]) -> list[str]:
    """One histogram's buckets (cumulative, +Inf last), count and sum."""
    lines = [
        labelled(f"{name}_bucket", {**labels, "le": number(bound)}, sum(v <= bound for v in values))
        for bound in PHASE_BUCKETS
    ]
    lines.append(labelled(f"{name}_bucket", {**labels, "le": "+Inf"}, len(values)))
    lines.append(labelled(f"{name}_count", labels, len(values)))
    lines.append(labelled(f"{name}_sum", labels, round(sum(values), 6)))
    return lines


def summary_lines(name: str, labels: Mapping[str, Any], values: Sequence[float]) -> list[str]:
    """A summary: the quantiles results.json gives (interpolated as its percentiles are), count, sum."""
    described = describe(values)
    lines = [
        labelled(name, {**labels, "quantile": quantile}, described[key])
        for quantile, key in QUANTILES
        if key in described
    ]
    lines.append(labelled(f"{name}_count", labels, len(values)))
    lines.append(labelled(f"{name}_sum", labels, round(sum(values), 6)))
    return lines


def episode_classes(batches: Sequence[tuple[str, BatchSummary]]) -> dict[str, int]:
    """How many episodes of the measured batches ended in each class."""
    counts = dict.fromkeys(EPISODE_CLASSES, 0)
    for _, summary in batches:
        counts["ok"] += len(summary.episodes)
        for record in summary.failed:
            kind = record.get("failure_class") or "ok"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def phase_values(batches: Sequence[tuple[str, BatchSummary]]) -> dict[str, list[float]]:
    """Each phase's seconds over every episode that has it (failed ones as far as they got)."""
    values: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _, summary in batches:
        for record in [*summary.episodes, *summary.failed]:
            for phase, measured in (record.get("phases") or {}).items():
                if measured is not None:
                    values.setdefault(phase, []).append(measured[0])
    return values


def figure_gauges(figures: Mapping[str, Any], run: Mapping[str, str]) -> list[str]:
    """The batch-wide figures of results.json that have a value, one gauge each."""
    lines: list[str] = []
    for key, help_text in (
        ("batch_to_all_ready_seconds", "Job created to the last episode ready (the guide's)."),
        ("batch_to_all_rewards_seconds", "Job created to the last reward (the guide's)."),
        ("client_job_complete_seconds", "Submission to the client seeing the Job end."),
        ("reward_mean", "Mean reward over the run's episodes (results.json's reward_mean)."),
    ):
        if figures.get(key) is not None:
            name = f"{PREFIX}_{key}"
            lines += family(name, "gauge", help_text, [labelled(name, run, figures[key])])
    return lines


def info_series(figures: Mapping[str, Any], run: Mapping[str, str]) -> list[str]:
    """The run's info series: what it ran, where, and with which version of the tool."""
    info = {
        **run,
        "image": figures.get("image") or "",
        "runtime_class": figures.get("runtime") or "",
        "namespace": figures.get("namespace") or "",
        "context": figures.get("context") or "",
        "version": __version__,
    }
    return family(
        f"{PREFIX}_run_info",
        "gauge",
        "The run: its id, image, runtime class, namespace, context and the tool's version.",
        [labelled(f"{PREFIX}_run_info", info, 1)],
    )


def class_series(classes: Mapping[str, int], run: Mapping[str, str]) -> list[str]:
    return family(
        f"{PREFIX}_episodes",
        "gauge",
        "Episodes of the run by class (rewards.jsonl's failure_class; ok for none).",
        [labelled(f"{PREFIX}_episodes", {**run, "class": k}, n) for k, n in classes.items()],
    )


def phase_series(values: Mapping[str, Sequence[float]], run: Mapping[str, str]) -> list[str]:
    """One histogram per phase, under one family (whose help a Pushgateway holds the same for
    every group pushed to it: a run's and a pool's say the same)."""
    lines = [
        line
        for phase, seconds in values.items()
        for line in histogram(f"{PREFIX}_phase_seconds", {**run, "phase": phase}, seconds)
    ]
    return family(
        f"{PREFIX}_phase_seconds",
        "histogram",
        "Each episode's phases (docs/measurement.md), seconds, from their sharpest points.",
        lines,
    )


def statistic_series(
    name: str, help_text: str, statistics: Mapping[str, Any], run: Mapping[str, str]
) -> list[str]:
    """A gauge per statistic of one figure (p50, p95, max...) that has a value."""
    samples = [
        labelled(f"{PREFIX}_{name}", {**run, "statistic": key}, value)
        for key, value in statistics.items()
        if value is not None
    ]
    return family(f"{PREFIX}_{name}", "gauge", help_text, samples)


def reward_series(rewards: Sequence[float], run: Mapping[str, str]) -> list[str]:
    return family(
        f"{PREFIX}_reward",
        "summary",
        "The rewards of the run's episodes that produced one.",
        summary_lines(f"{PREFIX}_reward", run, rewards),
    )


def metrics_text(
    figures: Mapping[str, Any], batches: Sequence[tuple[str, BatchSummary]], run_id: str
) -> str:
    """metrics.prom from what results.json is made of: its figures and its measured batches."""
    run = {"run_id": run_id}
    lines = info_series(figures, run) + class_series(episode_classes(batches), run)
    lines += phase_series(phase_values(batches), run)
    lines += statistic_series(
        "pod_to_ready_seconds",
        "Pod created to episode ready: results.json's pod_to_ready_<statistic>_seconds, the "
        "guide's figure (a rollout's failed episodes counted at the deadline).",
        {key: figures.get(f"pod_to_ready_{key}_seconds") for key in ("p50", "p95", "max")},
        run,
    )
    rewards = [row["reward"] for row in figures.get("pods") or () if row.get("reward") is not None]
    lines += reward_series(rewards, run)
    lines += figure_gauges(figures, run)
    return "\n".join([*lines, "# EOF", ""])


def redacted(url: str) -> str:
    """A URL fit to print and save: no user or password, no query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def with_credentials(url: str, headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A URL's user and password (`https://user:pass@host/`) sent as HTTP basic auth, the URL
    without them: urllib would take them for part of the host, and its error then quotes them."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, dict(headers)
    given = (
        f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
    )
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port else ""
    bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    auth = "Basic " + base64.b64encode(given.encode("utf-8")).decode("ascii")
    return bare, {"Authorization": auth, **headers}


def push_url(gateway: str, run_id: str) -> str:
    """The Pushgateway's URL for this run's group: job rl_batch_demo, run_id the run's."""
    return (
        f"{gateway.rstrip('/')}/metrics/job/{PREFIX}/run_id/{urllib.parse.quote(run_id, safe='')}"
    )


def push_metrics(gateway: str, run_id: str, text: str) -> str | None:
    """PUT the run's metrics to a Pushgateway, replacing its group; what went wrong, or None."""
    # The classic text format, which the Pushgateway parses; `# EOF` is a comment to it.
    url, headers = with_credentials(
        push_url(gateway, run_id), {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )
    request = urllib.request.Request(url, data=text.encode("utf-8"), method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=PUSH_TIMEOUT_SECONDS) as response:
            response.read()
    except urllib.error.HTTPError as error:
        body = error.read().decode("utf-8", "replace").strip()[:300]
        return f"the Pushgateway answered {error.code} {error.reason}: {body}"
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        return f"cannot reach the Pushgateway at {redacted(gateway)}: {error}"
    return None


def write_metrics(
    output: str,
    figures: Mapping[str, Any],
    batches: Sequence[tuple[str, BatchSummary]],
    run_id: str,
) -> None:
    """metrics.prom in the run's directory, beside results.json and made of the same; left as it
    is when it says that already (`report` of a run that wrote it)."""
    write_metrics_text(output, metrics_text(figures, batches, run_id))


def write_metrics_text(output: str, text: str) -> None:
    """metrics.prom written, unless it holds `text` already."""
    path = os.path.join(output, METRICS_FILE)
    if not os.path.exists(path) or read_text(path) != text:
        write_text(path, text)


def push_saved_metrics(output: str, gateway: str, run_id: str) -> bool:
    """--pushgateway: the run's metrics.prom pushed; a failure is a warning, never the run's."""
    problem = push_metrics(gateway, run_id, read_text(os.path.join(output, METRICS_FILE)))
    if problem is not None:
        print(f"Warning: metrics not pushed: {problem}", file=sys.stderr)
    return problem is None
