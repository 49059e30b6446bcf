"""The run's trace in a real Jaeger v2 (v1.75.0: in-memory storage, its OTLP HTTP receiver),
read back through Jaeger's query API, from runs on the real control plane: the span tree, every
span's start and end equal to the points of episodes.csv to the microsecond, the failed
episode an error; and a Jaeger killed during the run costs the run a warning, with
results.json saying what was not exported. A pool's trace too, its sandboxes served by the
node agent: each episode in Jaeger while the pool is still open."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from conftest import skip_or_fail
from e2e_support import load, wait_for
from test_e2e_observability import PHASE_POINTS, POINTS, TASKS, csv_rows, micros, run
from test_e2e_pool_observability import Span, assert_pool_trace, delete_during_a_command

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
import build_jaeger  # noqa: E402  (needs the path above)
from telemetry_servers import Jaeger, get_json  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]
PRODUCT = Path(__file__).resolve().parent.parent.parent / "rl_batch_demo.py"


def jaeger_bin() -> Path:
    given = os.environ.get(build_jaeger.ENV_VAR)
    bin_dir = Path(given) if given else build_jaeger.BIN_DIR
    if not build_jaeger.binaries_present(bin_dir):
        skip_or_fail("missing prerequisite: jaeger (python3 tests/support/build_jaeger.py)")
    return bin_dir


def tags_of(span: dict) -> dict:
    return {tag["key"]: tag["value"] for tag in span["tags"]}


def parent_of(span: dict) -> str | None:
    return next(
        (r["spanID"] for r in span.get("references", []) if r["refType"] == "CHILD_OF"), None
    )


def test_jaeger_holds_the_waterfall_of_episodes_csv(real_cluster, tmp_path):
    bin_dir = jaeger_bin()
    kubectl, cluster = real_cluster
    with Jaeger(bin_dir, tmp_path) as jaeger:
        done, output = run(
            (kubectl, cluster), tmp_path, "traced", "--otlp-endpoint", jaeger.otlp_url
        )
        telemetry = load(output / "results.json")["telemetry"]
        assert telemetry["not_exported_spans"] == 0, telemetry
        trace = jaeger.trace(telemetry["trace_id"], telemetry["spans"])
    spans = trace["spans"]
    assert len(spans) == telemetry["spans"]
    by_id = {s["spanID"]: s for s in spans}
    roots = [s for s in spans if parent_of(s) is None]
    assert [r["operationName"] for r in roots] == [f"run {load(output / 'receipt.json')['run_id']}"]
    assert trace["processes"][roots[0]["processID"]]["serviceName"] == "rl_batch_demo"
    batches = [s for s in spans if parent_of(s) == roots[0]["spanID"]]
    assert [b["operationName"] for b in batches] == ["batch rollout"]
    episodes = {s["operationName"]: s for s in spans if parent_of(s) == batches[0]["spanID"]}
    rows = {f"episode {row['index']}": row for row in csv_rows(output)}
    assert episodes.keys() == rows.keys() and len(rows) == len(TASKS)
    for name, episode in episodes.items():
        row = rows[name]
        ats = [micros(row[f"{p}_at"]) for p in POINTS if row[f"{p}_at"]]
        assert episode["startTime"] == min(ats), name
        assert episode["startTime"] + episode["duration"] == max(ats), name
        tags = tags_of(episode)
        assert tags["k8s.pod.name"] == row["pod"] and tags["k8s.node.name"] == row["node"]
        for point in POINTS:
            if row[f"{point}_at"]:
                assert tags[f"point.{point}.precision_seconds"] == float(
                    row[f"{point}_precision_seconds"]
                )
        phases = {s["operationName"]: s for s in spans if parent_of(s) == episode["spanID"]}
        for phase, (start, end) in PHASE_POINTS.items():
            if row[f"{start}_at"] and row[f"{end}_at"]:
                # A phase shorter than its precision (its end point placed before its start, as
                # bounds allow) is 0 s long, as in the phase table: it ends where it starts.
                began, ended = micros(row[f"{start}_at"]), micros(row[f"{end}_at"])
                assert phases[phase]["startTime"] == began, (name, phase)
                assert phases[phase]["startTime"] + phases[phase]["duration"] == max(began, ended)
        assert all(parent_of(p) == episode["spanID"] for p in phases.values())
        if row["failure_class"]:
            assert tags["error"] is True and tags["otel.status_description"] == row["failure"]
        else:
            assert "error" not in tags
    assert set(by_id) == {s["spanID"] for s in spans}
    print(
        f"jaeger held {len(spans)} spans of {len(episodes)} episodes; run stderr: {done.stderr[-300:]}"
    )


def test_a_jaeger_killed_during_the_run_costs_it_a_warning(real_cluster, tmp_path):
    """Two rounds: the first round's spans reach Jaeger while the second runs; Jaeger is then
    killed, and the rest is counted, not exported; the run passes."""
    bin_dir = jaeger_bin()
    kubectl, cluster = real_cluster
    service = f"killed-{time.monotonic_ns()}"
    jaeger = Jaeger(bin_dir, tmp_path)
    jaeger.start()
    try:
        argv = [sys.executable, str(PRODUCT), "run", "--kubectl", kubectl, "--count", "2"]
        argv += ["--rounds", "2", "--output", str(tmp_path / "killed"), "--quiet"]
        argv += ["--otlp-endpoint", jaeger.otlp_url]
        env = {**cluster.env(), "OTEL_SERVICE_NAME": service}
        process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        query = urllib.parse.urlencode({"service": service, "limit": 1})
        wait_for(
            lambda: get_json(f"{jaeger.query_url}/api/traces?{query}").get("data"),
            seconds=240,
            what="the first round's spans in Jaeger",
        )
        jaeger.kill()
        stdout, stderr = process.communicate(timeout=300)
    finally:
        jaeger.stop()
    assert process.returncode == 0, stderr
    telemetry = load(tmp_path / "killed" / "results.json")["telemetry"]
    assert telemetry["exported_spans"] > 0 and telemetry["not_exported_spans"] > 0
    assert telemetry["exported_spans"] + telemetry["not_exported_spans"] == telemetry["spans"]
    assert telemetry["errors"][0].startswith("no answer")
    assert (
        f"Warning: traces: {telemetry['not_exported_spans']} of {telemetry['spans']} spans not exported"
        in stderr
    )


def jaeger_span(span: dict) -> Span:
    tags = tags_of(span)
    error = tags.get("otel.status_description") if tags.get("error") else None
    end = span["startTime"] + span["duration"]
    return Span(
        span["operationName"], span["spanID"], parent_of(span), span["startTime"], end, tags, error
    )


def test_jaeger_holds_a_pools_trace_each_episode_as_it_is_finished(
    real_cluster, tmp_path, monkeypatch
):
    """A pool on the real API server and the node agent: an episode finished is in Jaeger while
    the pool is still open; once it closes, the trace is episodes.csv's (one sandbox deleted
    under its command: that episode an error)."""
    import rl_batch_demo

    bin_dir = jaeger_bin()
    kubectl, cluster = real_cluster
    if os.geteuid() != 0:
        skip_or_fail("root (the node agent's pod network is a network namespace of its own)")
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)
    output = tmp_path / "pool"
    tasks = [{"id": "fix-a"}, {"id": "fix-b"}]
    with Jaeger(bin_dir, tmp_path) as jaeger:
        with rl_batch_demo.open_pool(
            output=str(output),
            size=2,
            episodes=3,
            tasks=tasks,
            kubectl=kubectl,
            otlp_endpoint=jaeger.otlp_url,
        ) as pool:
            with pool.claim(tasks[0], timeout=180) as first:
                assert first.run(["true"]).exit_code == 0
                first.finish(reward=1.0)
            trace_id = pool.telemetry.tracer.trace_id
            early = jaeger.trace(trace_id, 5, seconds=60)  # the episode and its 4 phases
            assert {s["operationName"] for s in early["spans"]} >= {"episode 0", "episode_work"}
            lost = pool.claim(tasks[1], timeout=180)
            delete_during_a_command(lost, kubectl, pool.run.namespace, cluster.env())
            lost.finish(reward=1.0)
            with pool.claim(tasks[1], timeout=180) as again:
                again.finish(reward=0.0)
        telemetry = load(output / "results.json")["telemetry"]
        assert telemetry["not_exported_spans"] == 0 and telemetry["trace_id"] == trace_id
        trace = jaeger.trace(trace_id, telemetry["spans"])
    spans = [jaeger_span(s) for s in trace["spans"]]
    assert len(spans) == telemetry["spans"] == 1 + 3 * 5
    episodes = assert_pool_trace(spans, output)
    assert episodes["episode 1"].error.startswith(f"sandbox {lost.pod} lost")
    assert episodes["episode 1"].tags["episode.class"] == "infrastructure"
    print(f"jaeger held the pool's {len(spans)} spans")
