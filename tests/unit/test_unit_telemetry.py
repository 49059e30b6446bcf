"""Unit tests of the OTLP export's settings, its requests and their retries, and of metrics.prom's
text (escaping, histograms)."""

from __future__ import annotations

import json
import threading
import time

import all_names as demo
from recording_server import Answer, RecordingServer


def test_the_standard_variables_set_the_export() -> None:
    assert demo.otlp_config(None, {}) is None
    config = demo.otlp_config(
        None,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc, x-team = rl ,broken",
            "OTEL_SERVICE_NAME": "trainer",
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored,deployment.environment=prod%2Feu",
        },
    )
    assert config.url == "https://collector:4318/v1/traces"
    assert config.headers == {"Authorization": "Bearer abc", "x-team": "rl"}
    assert config.resource["service.name"] == "trainer"
    assert config.resource["deployment.environment"] == "prod/eu"
    # The flag wins over the variables; a signal's own endpoint is taken as it is.
    flagged = demo.otlp_config("http://here:4318/v1/traces", {"OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
    assert flagged.url == "http://here:4318/v1/traces"
    own = demo.otlp_config(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/custom"})
    assert own.url == "http://t:1/custom" and own.resource["service.name"] == "rl_batch_demo"


def test_an_endpoint_is_said_without_its_credentials() -> None:
    assert (
        demo.redacted("https://user:pw@host:4318/v1/traces?key=abc")
        == "https://host:4318/v1/traces"
    )


def test_times_are_the_microseconds_episodes_csv_writes() -> None:
    assert demo.nanos(1796622471.1635842) == "1796622471163584000"
    assert demo.nanos(1796622471.0000004) == "1796622471000000000"


def test_retry_after_seconds_or_a_date_capped_else_backoff() -> None:
    assert demo.retry_after("2", 0) == 2.0
    assert demo.retry_after("3600", 0) == demo.RETRY_AFTER_CAP_SECONDS
    assert demo.retry_after(None, 2) == demo.RETRY_FIRST_SECONDS * 4
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 5))
    assert 3.0 <= demo.retry_after(later, 0) <= 5.0


def config_for(url: str) -> demo.OtlpConfig:
    return demo.OtlpConfig(url + "/v1/traces", {"authorization": "secret"}, {"service.name": "t"})


def spans(count: int) -> list[dict]:
    return [
        demo.span("0" * 32, None, f"s{n}", 1.0, 2.0, {"n": n, "ok": True, "x": 0.5})
        for n in range(count)
    ]


def test_spans_go_in_bounded_requests_and_429_is_retried_as_retry_after_says() -> None:
    slept: list[float] = []
    with RecordingServer([Answer(429, b"", (("Retry-After", "7"),))]) as server:
        exporter = demo.SpanExporter(config_for(server.url), sleep=slept.append)
        exporter.submit(spans(demo.MAX_SPANS_PER_REQUEST * 2 + 1))
        record = exporter.close()
    sizes = [
        len(json.loads(r.body)["resourceSpans"][0]["scopeSpans"][0]["spans"])
        for r in server.requests
    ]
    assert sizes == [512, 512, 512, 1]  # the first refused, then sent again
    assert slept == [7.0]
    assert record.exported == record.spans == 1025 and record.not_exported == 0
    assert record.retries == 1


def test_a_refused_request_gives_up_and_counts_the_rest_not_exported() -> None:
    with RecordingServer(then=Answer(400, b"bad")) as server:
        exporter = demo.SpanExporter(config_for(server.url), sleep=lambda _: None)
        exporter.submit(spans(600))
        exporter.submit(spans(3))
        record = exporter.close()
    assert len(server.requests) == 1  # 400 is not retried, and nothing is sent after it
    assert (record.exported, record.not_exported) == (0, 603)
    assert record.errors == ["HTTP 400: bad"]
    assert "secret" not in json.dumps(record.saved())


def test_a_partial_success_counts_the_rejected_spans() -> None:
    answer = Answer(200, b'{"partialSuccess": {"rejectedSpans": "2", "errorMessage": "too old"}}')
    with RecordingServer([answer]) as server:
        exporter = demo.SpanExporter(config_for(server.url), sleep=lambda _: None)
        exporter.submit(spans(5))
        record = exporter.close()
    assert (record.exported, record.not_exported) == (3, 2)
    assert record.errors == ["rejected 2: too old"]


def test_a_request_in_flight_at_close_is_counted_once_not_exported() -> None:
    sending, release = threading.Event(), threading.Event()

    def send(url, headers, body):
        sending.set()
        release.wait(10)
        return demo.Response(200, None, "{}")

    exporter = demo.SpanExporter(config_for("http://127.0.0.1:9"), send=send)
    exporter.submit(spans(4))
    assert sending.wait(10)
    record = exporter.close(wait=0.05)
    release.set()
    exporter.thread.join(10)
    # Whether it landed is unknown: not exported, and never also counted exported.
    assert (record.spans, record.exported, record.not_exported) == (4, 0, 4)
    assert record.errors == ["4 spans still queued or in flight after 0 s"]


def test_attributes_keep_their_types() -> None:
    assert demo.attributes({"b": True, "i": 3, "f": 0.5, "s": "x", "none": None}) == [
        {"key": "b", "value": {"boolValue": True}},
        {"key": "i", "value": {"intValue": "3"}},
        {"key": "f", "value": {"doubleValue": 0.5}},
        {"key": "s", "value": {"stringValue": "x"}},
    ]
    # JSON has no infinity: a precision bounded on one side only is said as text.
    assert demo.attribute("p", float("inf")) == {"key": "p", "value": {"stringValue": "inf"}}


def test_metric_labels_are_escaped_and_histograms_cumulative() -> None:
    assert demo.labelled("m", {"a": 'q"b\\c\nd'}, 2.0) == 'm{a="q\\"b\\\\c\\nd"} 2'
    lines = demo.histogram("h", {"phase": "p"}, [0.004, 0.2, 0.2, 700.0])
    assert 'h_bucket{phase="p",le="0.005"} 1' in lines
    assert 'h_bucket{phase="p",le="0.25"} 3' in lines
    assert 'h_bucket{phase="p",le="600"} 3' in lines
    assert lines[-3:] == [
        'h_bucket{phase="p",le="+Inf"} 4',
        'h_count{phase="p"} 4',
        'h_sum{phase="p"} 700.404',
    ]


def test_a_failed_episode_without_a_pod_is_an_error_at_its_batchs_start() -> None:
    points = {name: None for name in demo.POINTS}
    ok_points = dict(points, pod_created=demo.Point(10.5, 0.001, "s", "c"))
    ok_points["container_finished"] = demo.Point(12.25, 0.2, "s", "c")
    summary = demo.BatchSummary(
        figures={"pods": [{"pod": "p0", "node": "n1", "reward": 1.0}], "job_created": {"at": 10.0}},
        episodes=[{"pod": "p0", "index": "0", "points": ok_points, "phases": {}}],
        job_created=10.0,
        origin=10.0,
        failed=[
            {
                "pod": None,
                "index": 1,
                "points": points,
                "phases": {},
                "failure_class": "infrastructure",
                "failure": "pod never created",
                "valid": False,
                "reward": None,
            }
        ],
    )
    spans = demo.batch_spans("1" * 32, "2" * 16, "rollout", summary, True)
    batch, ok, failed = spans
    assert (batch["startTimeUnixNano"], batch["endTimeUnixNano"]) == ("10000000000", "12250000000")
    assert (ok["startTimeUnixNano"], ok["endTimeUnixNano"]) == ("10500000000", "12250000000")
    assert "status" not in ok
    assert failed["status"] == {"code": 2, "message": "pod never created"}
    assert failed["startTimeUnixNano"] == failed["endTimeUnixNano"] == "10000000000"
    tags = {a["key"]: list(a["value"].values())[0] for a in failed["attributes"]}
    assert tags["episode.class"] == "infrastructure" and tags["episode.valid"] is False
    assert tags["error.type"] == "infrastructure" and "k8s.pod.name" not in tags


def test_a_urls_user_and_password_go_as_basic_auth_and_are_never_quoted() -> None:
    """`http://user:pass@host/` as --otlp-endpoint or --pushgateway: urllib would take the user
    and password for part of the host (no port: an error quoting the password, uncaught, out of
    the exporter's thread or the run); they are sent as HTTP basic auth, and never said."""
    import base64

    secret = "s3cret-do-not-print"
    basic = "Basic " + base64.b64encode(f"user:{secret}".encode()).decode()
    with RecordingServer() as collector:
        port = collector.url.rsplit(":", 1)[1]
        answer = demo.MODULES["telemetry"].post(
            f"http://user:{secret}@127.0.0.1:{port}/v1/traces", {"X-Key": "k"}, b"{}"
        )
        assert answer.status == 200
        problem = demo.push_metrics(f"http://user:{secret}@127.0.0.1:{port}", "run-1", "# EOF\n")
        assert problem is None
    assert [r.headers["Authorization"] for r in collector.requests] == [basic, basic]
    assert collector.requests[0].headers["X-Key"] == "k"
    # No port: urllib's own error would quote the password.
    lost = demo.MODULES["telemetry"].post(f"http://user:{secret}@no-such-host.invalid/", {}, b"{}")
    assert lost.status == 0 and secret not in lost.body
    problem = demo.push_metrics(f"http://user:{secret}@no-such-host.invalid", "run-1", "")
    assert problem is not None and secret not in problem
