"""End to end, observability: metrics.prom held to Prometheus's own parser (`promtool check
metrics`) and pushed to a real Pushgateway; the run's trace as the OTLP/HTTP JSON requests a
collector receives (a recording server that answers as each test needs: 503 with Retry-After,
no answer at all). The real Jaeger's reading of the same trace is in
tests/real_cluster/test_real_cluster_traces.py.
Real kubectl against the emulator."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import all_names as rl_batch_demo
from conftest import skip_or_fail
from e2e_support import emulators, load
from recording_server import Answer, RecordingServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
import build_promtool  # noqa: E402  (needs the path above)
from telemetry_servers import Pushgateway  # noqa: E402

pytestmark = pytest.mark.e2e
PRODUCT = Path(__file__).resolve().parent.parent.parent / "rl_batch_demo.py"
SECRET = "s3cret-token-do-not-print"

EPISODE = """\
import json, os, sys, time
def emit(event, **fields):
    fields.update(event=event, at=time.time(), episode_id=os.environ["EPISODE_ID"])
    print(json.dumps(fields), flush=True)
with open(os.environ["TASK_FILE"]) as handle:
    task = json.load(handle)
emit("ready")
if task.get("fail"):
    sys.exit("the agent gave up")
emit("reward", reward=task["x"] * 0.5)
"""
TASKS = [
    {"id": "a", "x": 1},
    {"id": "b", "x": 2},
    {"id": "c", "x": 1, "fail": True},
    {"id": "d", "x": 0},
]


def promtool_bin() -> Path:
    given = os.environ.get(build_promtool.ENV_VAR)
    bin_dir = Path(given) if given else build_promtool.BIN_DIR
    if not build_promtool.binaries_present(bin_dir):
        skip_or_fail(
            "missing prerequisite: promtool and pushgateway (python3 tests/support/build_promtool.py)"
        )
    return bin_dir


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any):
    kubectl = require_e2e("1.35")
    with emulators(tmp_path) as make:
        yield kubectl, make()


def run(
    cluster: Any, tmp_path: Path, name: str, *flags: str, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """A rollout of TASKS (one fails on its own, accepted), with `flags` added."""
    kubectl, emulator = cluster
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (tmp_path / "episode.py").write_text(EPISODE)
    output = tmp_path / name
    argv = [sys.executable, str(PRODUCT), "run", "--kubectl", kubectl, "--output", str(output)]
    argv += [
        "--tasks",
        str(tmp_path / "tasks.jsonl"),
        "--episode-script",
        str(tmp_path / "episode.py"),
    ]
    argv += ["--allow-failures", "1", "--quiet", *flags]
    done = subprocess.run(
        argv, env={**emulator.env(), **(env or {})}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done, output


def spans_sent(server: RecordingServer) -> list[dict]:
    """Every span of every request the collector took (200), in order."""
    spans = []
    for request in server.requests:
        if request.path != "/v1/traces" or request.status != 200:
            continue
        body = json.loads(request.body)
        spans += [s for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    return spans


def csv_rows(output: Path) -> list[dict]:
    with open(output / "episodes.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def micros(at_text: str) -> int:
    """A `%.6f` time of episodes.csv in whole microseconds."""
    return int(at_text.replace(".", ""))


def test_metrics_prom_passes_promtool_and_reaches_a_real_pushgateway(cluster, tmp_path):
    bin_dir = promtool_bin()
    with Pushgateway(bin_dir, tmp_path) as gateway:
        _, output = run(cluster, tmp_path, "pushed", "--pushgateway", gateway.url)
        pushed = gateway.metrics()
    text = (output / "metrics.prom").read_text()
    assert text.endswith("# EOF\n")
    checked = subprocess.run(
        [str(bin_dir / "promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""  # no lint finding either
    run_id = load(output / "receipt.json")["run_id"]
    assert f'rl_batch_demo_episodes{{run_id="{run_id}",class="ok"}} 3' in text
    assert f'rl_batch_demo_episodes{{run_id="{run_id}",class="episode"}} 1' in text
    assert f'rl_batch_demo_reward_count{{run_id="{run_id}"}} 3' in text
    assert f'rl_batch_demo_reward_sum{{run_id="{run_id}"}} 1.5' in text
    results = load(output / "results.json")
    assert (
        f'rl_batch_demo_pod_to_ready_seconds{{run_id="{run_id}",statistic="p50"}} '
        f"{results['pod_to_ready_p50_seconds']!r}" in text
    )
    assert 'runtime_class="cube"' in text and 'image="python:3.12-alpine"' in text
    # The Pushgateway parsed it and serves it under the run's group.
    assert (
        f'rl_batch_demo_episodes{{class="ok",instance="",job="rl_batch_demo",run_id="{run_id}"}} 3'
        in pushed
    )
    assert "rl_batch_demo_phase_seconds_bucket{" in pushed
    # `report` makes the same file again from the saved files alone.
    (output / "metrics.prom").unlink()
    reported = subprocess.run(
        [sys.executable, str(PRODUCT), "report", str(output), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert reported.returncode == 0, reported.stderr
    assert (output / "metrics.prom").read_text() == text


def test_a_push_that_fails_costs_a_warning(cluster, tmp_path):
    with RecordingServer(then=Answer(400, b"text format parsing error in line 3")) as gateway:
        done, output = run(cluster, tmp_path, "refused", "--pushgateway", gateway.url)
    assert gateway.requests[0].method == "PUT"
    assert gateway.requests[0].path.startswith("/metrics/job/rl_batch_demo/run_id/")
    assert "Warning: metrics not pushed: the Pushgateway answered 400" in done.stderr
    assert (output / "metrics.prom").exists()


def test_the_trace_is_the_waterfall_of_episodes_csv(cluster, tmp_path):
    """One trace; run -> batch -> episode -> phase; every episode's span from its first point
    to its last as episodes.csv writes them, its phases from point to point; the failed episode
    an error; the first request refused with 503 and Retry-After, retried after it; the headers
    sent and never said."""
    answers = [Answer(503, b"busy", (("Retry-After", "1"),))]
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{SECRET},x-tenant=rl",
        "OTEL_SERVICE_NAME": "trainer-7",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,team=rl",
    }
    with RecordingServer(answers) as collector:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url
        done, output = run(cluster, tmp_path, "traced", env=env)
    first, retried = collector.requests[:2]
    assert first.body == retried.body and retried.at - first.at >= 1.0
    assert all(r.headers["Authorization"] == f"Bearer {SECRET}" for r in collector.requests)
    resource = json.loads(first.body)["resourceSpans"][0]["resource"]["attributes"]
    assert {a["key"]: a["value"]["stringValue"] for a in resource} == {
        "service.name": "trainer-7",
        "service.version": rl_batch_demo.__version__,
        "deployment.environment": "test",
        "team": "rl",
    }
    spans = spans_sent(collector)
    assert len({s["traceId"] for s in spans}) == 1
    by_id = {s["spanId"]: s for s in spans}
    roots = [s for s in spans if "parentSpanId" not in s]
    assert [r["name"] for r in roots] == [f"run {load(output / 'receipt.json')['run_id']}"]
    batches = [s for s in spans if s.get("parentSpanId") == roots[0]["spanId"]]
    assert [b["name"] for b in batches] == ["batch rollout"]
    episodes = {s["name"]: s for s in spans if s.get("parentSpanId") == batches[0]["spanId"]}
    rows = {f"episode {row['index']}": row for row in csv_rows(output)}
    assert episodes.keys() == rows.keys()
    for name, episode in episodes.items():
        row = rows[name]
        ats = [micros(row[f"{p}_at"]) for p in POINTS if row[f"{p}_at"]]
        assert int(episode["startTimeUnixNano"]) == min(ats) * 1000
        assert int(episode["endTimeUnixNano"]) == max(ats) * 1000
        tags = {a["key"]: list(a["value"].values())[0] for a in episode["attributes"]}
        assert tags["k8s.pod.name"] == row["pod"] and tags["k8s.node.name"] == row["node"]
        assert tags["episode.task"] == row["task_id"]
        phases = {s["name"]: s for s in spans if s.get("parentSpanId") == episode["spanId"]}
        for phase, (start, end) in PHASE_POINTS.items():
            if row[f"{start}_at"] and row[f"{end}_at"]:
                # A phase shorter than its precision (its end placed before its start, as the
                # bounds allow) is 0 s long, as in the phase table: it ends where it starts.
                began, ended = micros(row[f"{start}_at"]), micros(row[f"{end}_at"])
                assert int(phases[phase]["startTimeUnixNano"]) == began * 1000
                assert int(phases[phase]["endTimeUnixNano"]) == max(began, ended) * 1000
        for point in POINTS:
            if row[f"{point}_at"]:
                assert float(tags[f"point.{point}.precision_seconds"]) == float(
                    row[f"{point}_precision_seconds"]
                )
        if row["failure_class"]:
            assert episode["status"] == {"code": 2, "message": row["failure"]}
            assert tags["episode.class"] == "episode" and tags["episode.valid"] is True
        else:
            assert "status" not in episode and tags["episode.reward"] == float(row["reward"])
    assert all(s["spanId"] in by_id for s in spans)
    telemetry = load(output / "results.json")["telemetry"]
    assert telemetry["spans"] == len(spans) == telemetry["exported_spans"]
    assert telemetry["not_exported_spans"] == 0 and telemetry["retries"] == 1
    said = (
        done.stdout
        + done.stderr
        + "".join(p.read_text(errors="replace") for p in output.rglob("*") if p.is_file())
    )
    assert SECRET not in said and "x-tenant" not in said


def test_a_collector_gone_costs_the_run_a_warning_and_says_what_was_not_exported(cluster, tmp_path):
    gone = RecordingServer()
    gone_url = gone.url  # bound, then closed: nothing listens there
    gone.httpd.server_close()
    done, output = run(cluster, tmp_path, "lost", "--otlp-endpoint", gone_url)
    telemetry = load(output / "results.json")["telemetry"]
    assert telemetry["exported_spans"] == 0
    assert telemetry["not_exported_spans"] == telemetry["spans"] > 0
    assert telemetry["errors"][0].startswith("no answer")
    assert (
        f"Warning: traces: {telemetry['spans']} of {telemetry['spans']} spans not exported"
        in done.stderr
    )


def test_report_exports_a_saved_run(cluster, tmp_path):
    with RecordingServer() as live:
        _, output = run(cluster, tmp_path, "saved", "--otlp-endpoint", live.url)
    sent_live = spans_sent(live)
    with RecordingServer() as later:
        reported = subprocess.run(
            [sys.executable, str(PRODUCT), "report", str(output), "--otlp-endpoint", later.url],
            capture_output=True,
            text=True,
        )
    assert reported.returncode == 0, reported.stderr
    sent_later = spans_sent(later)
    assert sorted(
        (s["name"], s["startTimeUnixNano"], s["endTimeUnixNano"]) for s in sent_later
    ) == sorted((s["name"], s["startTimeUnixNano"], s["endTimeUnixNano"]) for s in sent_live)
    assert {s["traceId"] for s in sent_later} != {s["traceId"] for s in sent_live}


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
# The phases whose two points episodes.csv writes (image_pull's are the kubelet's, not in it).
PHASE_POINTS = {
    "scheduling": ("pod_created", "scheduled"),
    "sandbox_creation": ("scheduled", "sandbox_ready"),
    "container_start": ("sandbox_ready", "process_started"),
    "python_imports": ("process_started", "imports_done"),
    "imports_done_to_ready": ("imports_done", "ready"),
    "episode_work": ("ready", "reward"),
    "container_exit": ("reward", "container_finished"),
}


def test_a_detached_run_sends_no_trace_and_pushes_nothing_and_says_how_to_later(cluster, tmp_path):
    """`run --detach` has not ended when it returns: a root span then would be a trace of a run
    that ended with no episode, a push a metrics.prom it has not written; `report` sends both once
    `attach` has saved the results."""
    with RecordingServer() as collector, RecordingServer() as gateway:
        done, output = run(
            cluster,
            tmp_path,
            "detached",
            "--detach",
            "--otlp-endpoint",
            collector.url,
            "--pushgateway",
            gateway.url,
        )
    assert collector.requests == [] and gateway.requests == []
    assert not (output / "results.json").exists()
    assert f"report {output} --otlp-endpoint {collector.url}/v1/traces" in done.stderr
    assert f"--pushgateway {gateway.url}" in done.stderr
