"""OpenTelemetry traces of a run over OTLP/HTTP with JSON encoding: standard library only.

One trace per run: a root span for the run, a span per batch, a span per episode (from its pod's
creation to its last point) and under it a span per phase (docs/measurement.md's PHASES: each
from its start point to its end point). Every span's start and end are its points' `at`, to the
microsecond episodes.csv writes, and carries each point's precision and source as attributes. A
batch's spans go out on a background thread as soon as the batch is summarised, while the run
goes on; the root span last. An export that fails never fails the run: a warning, and the
record of what was not exported (`telemetry` in results.json).

Configured as OpenTelemetry SDKs are: `--otlp-endpoint URL` else $OTEL_EXPORTER_OTLP_ENDPOINT
(a base URL; /v1/traces is added), $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as is),
$OTEL_EXPORTER_OTLP_HEADERS and _TRACES_HEADERS (`key=value,...`, values URL-encoded; sent,
never printed or saved), $OTEL_SERVICE_NAME and $OTEL_RESOURCE_ATTRIBUTES.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import math
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from .constants import RESULTS_FILE, __version__
from .files import read_json, write_json
from .timing import PHASES, POINTS
from .summary import BatchSummary
from .metrics import redacted, with_credentials

SERVICE_NAME = "rl_batch_demo"
TRACES_PATH = "/v1/traces"
# OTEL_BSP_MAX_EXPORT_BATCH_SIZE's default: spans a request, so that one request stays small.
MAX_SPANS_PER_REQUEST = 512
# Each request: this many attempts at most, waiting between them as the server's Retry-After
# says (capped), else doubling from RETRY_FIRST_SECONDS.
MAX_ATTEMPTS = 5
RETRY_FIRST_SECONDS = 0.5
RETRY_AFTER_CAP_SECONDS = 30.0
OTLP_REQUEST_TIMEOUT_SECONDS = 10.0
# How long the end of the run waits for what is still queued before it counts it not exported.
CLOSE_WAIT_SECONDS = 60.0
RETRIED_STATUSES = (429, 502, 503, 504)
# Phases that are sums of others: the episode's own span already covers them.
SUMMED_PHASES = ("pod_to_ready", "pod_to_reward")
STATUS_ERROR = 2
SPAN_KIND_INTERNAL = 1


class OtlpConfig(NamedTuple):
    """Where spans go and what they say of their source; `headers` are secrets."""

    url: str  # the traces URL
    headers: dict[str, str]
    resource: dict[str, str]


def key_values(text: str | None) -> dict[str, str]:
    """`k1=v1,k2=v2` with URL-encoded values, as the OTEL_* variables write them; a pair
    without `=` is skipped."""
    pairs: dict[str, str] = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return pairs


def traces_url(base: str) -> str:
    """A base endpoint with /v1/traces added, unless it names it already."""
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def otlp_config(endpoint: str | None, environ: Mapping[str, str]) -> OtlpConfig | None:
    """The export's settings from the flag and the standard variables; None for no export."""
    if endpoint:
        url = traces_url(endpoint)
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        url = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = traces_url(environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    else:
        return None
    headers = key_values(environ.get("OTEL_EXPORTER_OTLP_HEADERS"))
    headers.update(key_values(environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")))
    resource = key_values(environ.get("OTEL_RESOURCE_ATTRIBUTES"))
    resource["service.name"] = (
        environ.get("OTEL_SERVICE_NAME") or resource.get("service.name") or SERVICE_NAME
    )
    resource.setdefault("service.version", __version__)
    return OtlpConfig(url, headers, resource)


def nanos(at: float) -> str:
    """Unix nanoseconds of a point, at the microsecond episodes.csv writes it (`%.6f`)."""
    return str(int(f"{at:.6f}".replace(".", "")) * 1000)


def attribute(key: str, value: Any) -> dict:
    """One OTLP attribute; bool before int, since a bool is an int to Python."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float) and math.isfinite(value):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def attributes(pairs: Mapping[str, Any]) -> list[dict]:
    return [attribute(key, value) for key, value in pairs.items() if value is not None]


def new_id(size: int) -> str:
    return os.urandom(size).hex()


def span(
    trace_id: str,
    parent: str | None,
    name: str,
    start: float,
    end: float,
    pairs: Mapping[str, Any],
    error: str | None = None,
) -> dict:
    """One span in OTLP JSON (ids as hex, times as decimal strings of nanoseconds)."""
    made = {
        "traceId": trace_id,
        "spanId": new_id(8),
        "name": name,
        "kind": SPAN_KIND_INTERNAL,
        "startTimeUnixNano": nanos(start),
        "endTimeUnixNano": nanos(max(start, end)),
        "attributes": attributes(pairs),
    }
    if parent is not None:
        made["parentSpanId"] = parent
    if error is not None:
        made["status"] = {"code": STATUS_ERROR, "message": error}
    return made


def point_attributes(points: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Each known point's time (Unix seconds), precision and source."""
    pairs: dict[str, Any] = {}
    for name in names:
        point = points.get(name)
        if point is not None:
            pairs[f"point.{name}.at"] = round(point[0], 6)
            pairs[f"point.{name}.precision_seconds"] = float(f"{point[1]:.6g}")  # as the CSV
            pairs[f"point.{name}.source"] = getattr(point, "source", None)
    return pairs


def known_points(points: Mapping[str, Any], names: Sequence[str] = POINTS) -> list[float]:
    return [points[name][0] for name in names if points.get(name) is not None]


class PhaseTable(NamedTuple):
    """What an episode's spans are made of: its points in order, its phases (each from one point
    to another), and the phases that are sums of others (the episode's own span covers them)."""

    points: Sequence[str]
    phases: Mapping[str, tuple[str, str]]
    summed: Sequence[str]


RUN_PHASES = PhaseTable(POINTS, PHASES, SUMMED_PHASES)


def episode_spans(
    trace_id: str,
    parent: str,
    record: Mapping[str, Any],
    batch_start: float,
    table: PhaseTable | None = None,
) -> list[dict]:
    """An episode's span and its phases' spans; a failed episode's span is an error with its
    failure (one whose pod never existed has no points: a moment at its batch's start). `table`:
    the points and phases of another kind of episode (a pool's), else a run's."""
    table = table or RUN_PHASES
    points = record.get("points") or {}
    times = known_points(points, table.points)
    start, end = (min(times), max(times)) if times else (batch_start, batch_start)
    failure = record.get("failure")
    pairs = {
        "episode.index": None if record.get("index") is None else int(record["index"]),
        "episode.task": record.get("task_id"),
        "container.image.name": record.get("image"),
        "k8s.node.name": record.get("node"),
        "k8s.pod.name": record.get("pod"),
        "episode.class": record.get("failure_class") or "ok",
        "episode.valid": record.get("valid") is not False,
        "episode.reward": None if record.get("reward") is None else float(record["reward"]),
        **point_attributes(points, table.points),
    }
    if failure is not None:
        pairs["error.type"] = record.get("failure_class") or "failure"
    name = (
        f"episode {record.get('index') if record.get('index') is not None else record.get('pod')}"
    )
    episode = span(trace_id, parent, name, start, end, pairs, failure)
    spans = [episode]
    for phase, (first, last) in table.phases.items():
        measured = (record.get("phases") or {}).get(phase)
        if phase in table.summed or measured is None:
            continue
        if points.get(first) is None or points.get(last) is None:
            continue
        phase_pairs = {
            "phase.seconds": float(measured[0]),
            "phase.precision_seconds": float(f"{measured[1]:.6g}"),
            **point_attributes(points, (first, last)),
        }
        spans.append(
            span(trace_id, episode["spanId"], phase, points[first][0], points[last][0], phase_pairs)
        )
    return spans


def episode_records(summary: BatchSummary) -> list[dict]:
    """The batch's episodes, each with what its row of episodes.csv says beside its points."""
    rows = {row["pod"]: row for row in summary.figures.get("pods") or ()}
    records = []
    for record in summary.episodes:
        row = rows.get(record["pod"], {})
        records.append({**row, **record, "reward": row.get("reward"), "node": row.get("node")})
    return records + list(summary.failed)


def batch_spans(
    trace_id: str, parent: str, job: str, summary: BatchSummary, measured: bool
) -> list[dict]:
    """A batch's span (its Job's creation to its last episode's last point) and its episodes'."""
    created = summary.figures.get("job_created") or {}
    start = created.get("at", summary.job_created)
    records = episode_records(summary)
    ends = [at for record in records for at in known_points(record.get("points") or {})]
    batch = span(
        trace_id,
        parent,
        f"batch {job}",
        start,
        max([start, *ends]),
        {
            "k8s.job.name": job,
            "batch.measured": measured,
            "batch.episodes": len(records),
            "batch.failed_episodes": len(summary.failed),
            "point.job_created.precision_seconds": created.get("precision"),
        },
    )
    return [batch] + [
        s for r in records for s in episode_spans(trace_id, batch["spanId"], r, start)
    ]


def resource_spans(config: OtlpConfig, spans: Sequence[dict]) -> dict:
    """The body of one export request."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": attributes(config.resource)},
                "scopeSpans": [
                    {"scope": {"name": SERVICE_NAME, "version": __version__}, "spans": list(spans)}
                ],
            }
        ]
    }


def retry_after(value: str | None, attempt: int) -> float:
    """How long to wait before the next attempt: the server's Retry-After (seconds or an HTTP
    date), capped; else exponential backoff."""
    if value:
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError):
                seconds = RETRY_FIRST_SECONDS * 2**attempt
        return min(max(0.0, seconds), RETRY_AFTER_CAP_SECONDS)
    return RETRY_FIRST_SECONDS * 2**attempt


class Response(NamedTuple):
    status: int  # 0: no answer
    retry_after: str | None
    body: str


def post(url: str, headers: Mapping[str, str], body: bytes) -> Response:
    """POST one request; an HTTP error is a Response, no answer is status 0."""
    url, sent = with_credentials(url, {**headers, "Content-Type": "application/json"})
    request = urllib.request.Request(url, data=body, method="POST", headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=OTLP_REQUEST_TIMEOUT_SECONDS) as answer:
            return Response(answer.status, None, answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        text = error.read().decode("utf-8", "replace")
        return Response(error.code, error.headers.get("Retry-After"), text)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        # ValueError: a bad URL; HTTPException: a bad port, or the connection cut mid-answer
        reason = getattr(error, "reason", error)
        return Response(0, None, str(reason))


class ExportRecord:
    """What was exported and what was not, and why: results.json's `telemetry`."""

    def __init__(self, url: str) -> None:
        self.endpoint = redacted(url)
        self.spans = 0
        self.exported = 0
        self.not_exported = 0
        self.requests = 0
        self.retries = 0
        self.errors: list[str] = []

    def saved(self) -> dict[str, Any]:
        return {
            "otlp_endpoint": self.endpoint,
            "trace_id": None,
            "spans": self.spans,
            "exported_spans": self.exported,
            "not_exported_spans": self.not_exported,
            "requests": self.requests,
            "retries": self.retries,
            "errors": self.errors[:10],
        }


class SpanExporter:
    """Spans sent from a thread of their own, at most MAX_SPANS_PER_REQUEST a request, each
    request retried on 429/502/503/504 and on no answer, as Retry-After says. Once a request has
    failed for good the exporter gives up: what comes after is counted, not sent, so a collector
    gone away costs the run one request's retries, not one per batch."""

    def __init__(
        self,
        config: OtlpConfig,
        send: Callable[[str, Mapping[str, str], bytes], Response] = post,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config, self.send, self.sleep = config, send, sleep
        self.record = ExportRecord(config.url)
        self.given_up = False
        self.abandoned = False  # closed with a request in flight: close() counted what was left
        self.counting = threading.Lock()
        self.queue: queue.Queue[list[dict] | None] = queue.Queue()
        self.thread = threading.Thread(target=self.work, name="otlp-exporter", daemon=True)
        self.thread.start()

    def submit(self, spans: list[dict]) -> None:
        self.record.spans += len(spans)
        for first in range(0, len(spans), MAX_SPANS_PER_REQUEST):
            self.queue.put(spans[first : first + MAX_SPANS_PER_REQUEST])

    def work(self) -> None:
        while True:
            spans = self.queue.get()
            if spans is None:
                return
            sent = not self.given_up and self.export(spans)
            with self.counting:
                if self.abandoned:
                    return  # close() already counted these spans as not exported
                if sent:
                    self.record.exported += len(spans)
                else:
                    self.record.not_exported += len(spans)
                    self.given_up = True

    def export(self, spans: list[dict]) -> bool:
        """One request, retried; whether the collector took its spans (a partial success counts
        the spans it rejected as not exported)."""
        body = json.dumps(resource_spans(self.config, spans)).encode("utf-8")
        for attempt in range(MAX_ATTEMPTS):
            self.record.requests += 1
            answer = self.send(self.config.url, self.config.headers, body)
            if 200 <= answer.status < 300:
                self.count_rejected(answer.body)
                return True
            retried = answer.status == 0 or answer.status in RETRIED_STATUSES
            if not retried or attempt == MAX_ATTEMPTS - 1:
                said = "no answer" if answer.status == 0 else f"HTTP {answer.status}"
                self.record.errors.append(f"{said}: {answer.body.strip()[:200]}")
                return False
            self.record.retries += 1
            self.sleep(retry_after(answer.retry_after, attempt))
        return False

    def count_rejected(self, body: str) -> None:
        try:
            partial = (json.loads(body or "{}") or {}).get("partialSuccess") or {}
            rejected = int(partial.get("rejectedSpans") or 0)
        except (ValueError, AttributeError, TypeError):
            return
        if rejected:
            self.record.exported -= rejected
            self.record.not_exported += rejected
            self.record.errors.append(f"rejected {rejected}: {partial.get('errorMessage', '')}")

    def close(self, wait: float = CLOSE_WAIT_SECONDS) -> ExportRecord:
        """Wait (at most `wait` seconds) for what is queued; what is left is not exported."""
        self.queue.put(None)
        self.thread.join(wait)
        with self.counting:
            if self.thread.is_alive():
                # A request still in flight is counted not exported: whether it lands is unknown.
                self.given_up = self.abandoned = True
                left = self.record.spans - self.record.exported - self.record.not_exported
                self.record.not_exported += left
                self.record.errors.append(
                    f"{left} spans still queued or in flight after {wait:.0f} s"
                )
        return self.record


class RunTracer:
    """One run's trace: its batches' spans handed to the exporter as each batch is summarised,
    the run's root span at the end."""

    def __init__(
        self,
        config: OtlpConfig,
        run_id: str,
        exporter: SpanExporter | None = None,
        kind: str = "run",
    ) -> None:
        self.trace_id = new_id(16)
        self.root_id = new_id(8)
        self.run_id = run_id
        self.kind = kind  # the root span's name: "run <id>", or "pool <id>"
        self.exporter = exporter or SpanExporter(config)
        self.bounds: list[float] = []
        self.adding = threading.Lock()  # a pool's episodes end on many trainer threads

    def batch_done(self, job: str, summary: BatchSummary, measured: bool = True) -> None:
        self.add(batch_spans(self.trace_id, self.root_id, job, summary, measured))

    def add(self, spans: list[dict]) -> None:
        """Spans under the root sent now; the first's start and end widen the root's."""
        with self.adding:
            self.bounds += [
                int(spans[0][key]) / 1e9 for key in ("startTimeUnixNano", "endTimeUnixNano")
            ]
            self.exporter.submit(spans)

    def finish(self, figures: Mapping[str, Any] | None, failure: str | None = None) -> dict:
        """The root span sent, the exporter closed: what was exported, for results.json."""
        now = time.time()
        start, end = (min(self.bounds), max(self.bounds)) if self.bounds else (now, now)
        figures = figures or {}
        root = span(
            self.trace_id,
            None,
            f"{self.kind} {self.run_id}",
            start,
            end,
            {
                "run.id": self.run_id,
                "k8s.namespace.name": figures.get("namespace"),
                "container.image.name": figures.get("image"),
                "k8s.runtime_class": figures.get("runtime"),
                "run.episodes": figures.get("episodes"),
                "run.successful_episodes": figures.get("successful_episodes"),
            },
            failure,
        )
        root["spanId"] = self.root_id
        with self.adding:
            self.exporter.submit([root])
        saved = self.exporter.close().saved()
        saved["trace_id"] = self.trace_id
        return saved


def open_tracer(
    endpoint: str | None, run_id: str, environ: Mapping[str, str] = os.environ, kind: str = "run"
) -> RunTracer | None:
    """The run's tracer when an endpoint is set (flag or environment), else None; `kind` names
    its root span ("pool" for a pool's)."""
    config = otlp_config(endpoint, environ)
    return None if config is None else RunTracer(config, run_id, kind=kind)


def say_export(saved: Mapping[str, Any], quiet: bool = False) -> None:
    """A warning for what was not exported (whatever --quiet says); else a line, unless quiet."""
    if saved["not_exported_spans"]:
        reasons = "; ".join(saved["errors"][:3])
        print(
            f"Warning: traces: {saved['not_exported_spans']} of {saved['spans']} spans not "
            f"exported to {saved['otlp_endpoint']} ({reasons}); the run's files hold them all",
            file=sys.stderr,
        )
    elif not quiet:
        print(
            f"Traces: {saved['spans']} spans exported to {saved['otlp_endpoint']} "
            f"(trace {saved['trace_id']})",
            file=sys.stderr,
        )


def export_batches(
    tracer: RunTracer, batches: Sequence[tuple[str, BatchSummary]], figures: Mapping[str, Any]
) -> dict:
    """A saved run's trace (`report DIR --otlp-endpoint`): every measured batch, then the root."""
    for job, summary in batches:
        tracer.batch_done(job, summary)
    return tracer.finish(figures)


def finish_trace(
    tracer: RunTracer,
    output: str,
    figures: dict[str, Any] | None,
    failure: BaseException | None,
    quiet: bool,
) -> None:
    """The end of a run's trace: the root span (an error for a failed run) sent, what was not
    exported said, and recorded as `telemetry` in results.json (and the figures) when there is one."""
    saved = tracer.finish(figures, None if failure is None else str(failure).splitlines()[0])
    say_export(saved, quiet)
    if figures is None:
        return
    figures["telemetry"] = saved
    path = os.path.join(output, RESULTS_FILE)
    if os.path.exists(path):
        write_json(path, dict(read_json(path, RESULTS_FILE), telemetry=saved))
