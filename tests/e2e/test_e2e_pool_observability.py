"""End to end, a pool's observability: its metrics.prom held to `promtool check metrics` and pushed
to a real Pushgateway at the close; its trace as the OTLP/HTTP JSON requests a recording collector
receives, each episode's spans sent as the trainer finishes it, every span's start and end the
points of episodes.csv. Jaeger's reading of a pool's trace is in
tests/real_cluster/test_real_cluster_traces.py. Real kubectl against the emulator."""

from __future__ import annotations

import csv
import re
import subprocess
import threading
from xml.etree import ElementTree
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import pytest

import rl_batch_demo
from e2e_support import emulators, load, tool, wait_for
from recording_server import RecordingServer
from test_e2e_observability import promtool_bin, spans_sent
from telemetry_servers import Pushgateway

pytestmark = pytest.mark.e2e
TASKS = [{"id": "fix-a"}, {"id": "fix-b"}]
# A pool episode's phases, each from its point to its point (claim_asked: claimed less its wait).
POOL_PHASE_POINTS = {
    "pod_start": ("pod_created", "container_started"),
    "server_start": ("container_started", "server_ready"),
    "claim_wait": ("claim_asked", "claimed"),
    "episode_work": ("claimed", "finished"),
}


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(kubectl 1.35, a started emulator) with its environment set for in-process pools."""
    kubectl = require_e2e("1.35")
    with emulators(tmp_path) as make:
        emulator = make()
        for name, value in emulator.env().items():
            monkeypatch.setenv(name, value)
        yield kubectl, emulator


class Span(NamedTuple):
    """A span as either reader gives it: the OTLP request's JSON, or Jaeger's query API."""

    name: str
    span_id: str
    parent: str | None
    start_us: int
    end_us: int
    tags: dict
    error: str | None


def otlp_span(span: dict) -> Span:
    tags = {a["key"]: list(a["value"].values())[0] for a in span["attributes"]}
    status = span.get("status") or {}
    return Span(
        span["name"],
        span["spanId"],
        span.get("parentSpanId"),
        int(span["startTimeUnixNano"]) // 1000,
        int(span["endTimeUnixNano"]) // 1000,
        tags,
        status.get("message") if status.get("code") == 2 else None,
    )


def us(text: str) -> int:
    """A time of a pool's episodes.csv (written `%.6f`) in microseconds, read as text: a float
    times 1e6 can miss by one at today's times."""
    return int(f"{float(text):.6f}".replace(".", ""))


def row_points(row: dict, first_use: bool) -> dict[str, int]:
    """A row's points in microseconds; claim_asked is claimed less the claim's wait. A sandbox
    served again started once: its start points are its first episode's alone."""
    names = ("claimed", "finished")
    if first_use:
        names = ("pod_created", "container_started", "server_ready", *names)
    points = {name: us(row[f"{name}_at"]) for name in names if row[f"{name}_at"]}
    points["claim_asked"] = us(row["claimed_at"]) - us(row["claim_wait_seconds"])
    return points


def assert_pool_trace(spans: Sequence[Span], output: Path) -> dict[str, Span]:
    """One root, `pool RUN_ID`; under it an episode per row of episodes.csv from its first point
    to its last, its attributes those of its row (and its pod's node in pods.json); under each,
    its phases from point to point; a failed episode an error with its failure. The episodes."""
    roots = [s for s in spans if s.parent is None]
    assert [r.name for r in roots] == [f"pool {load(output / 'receipt.json')['run_id']}"]
    episodes = {s.name: s for s in spans if s.parent == roots[0].span_id}
    with open(output / "episodes.csv", newline="") as handle:
        rows = {f"episode {row['index']}": row for row in csv.DictReader(handle)}
    assert episodes.keys() == rows.keys()
    nodes = {
        pod["metadata"]["name"]: pod["spec"].get("nodeName")
        for pod in load(output / "pods.json")["items"]
    }
    firsts: dict[str, int] = {}
    for row in rows.values():
        firsts[row["sandbox"]] = min(int(row["index"]), firsts.get(row["sandbox"], 10**9))
    for name, episode in episodes.items():
        row = rows[name]
        points = row_points(row, firsts[row["sandbox"]] == int(row["index"]))
        assert (episode.start_us, episode.end_us) == (min(points.values()), points["finished"])
        tags = episode.tags
        assert str(tags["episode.index"]) == row["index"]
        assert tags.get("episode.task") == (row["task_id"] or None)  # none without tasks
        assert (
            tags["container.image.name"] == row["image"] and tags["k8s.pod.name"] == row["sandbox"]
        )
        if row["sandbox"] in nodes:  # a pod deleted before the close is not in pods.json
            assert tags["k8s.node.name"] == nodes[row["sandbox"]], name
        assert tags["episode.class"] == (row["failure_class"] or "ok")
        assert tags["episode.valid"] is (row["valid"] == "True")
        assert episode.error == (row["failure"] or None)
        if row["reward"]:
            assert tags["episode.reward"] == float(row["reward"])
        phases = {s.name: s for s in spans if s.parent == episode.span_id}
        drawn = {p: ends for p, ends in POOL_PHASE_POINTS.items() if set(ends) <= set(points)}
        assert set(phases) == set(drawn), name
        for phase, (first, last) in drawn.items():
            began, ended = points[first], points[last]
            got = (phases[phase].start_us, phases[phase].end_us)
            assert got == (began, max(began, ended)), (name, phase, row)
    return episodes


def delete_during_a_command(
    sandbox: Any, kubectl: str, namespace: str, env: dict
) -> rl_batch_demo.SandboxLost:
    """The sandbox's pod deleted while a command runs in it: the sandbox lost."""
    argv = [kubectl, "delete", "pod", sandbox.pod, "-n", namespace, "--wait=false"]
    deleting = threading.Timer(
        1.0, lambda: subprocess.run(argv, env=env, capture_output=True, timeout=60)
    )
    deleting.start()
    with pytest.raises(rl_batch_demo.SandboxLost) as lost:
        sandbox.run("sleep 20", timeout=30)
    deleting.join()
    return lost.value


def episode_names(collector: RecordingServer) -> Callable[[], set[str]]:
    return lambda: {s["name"] for s in spans_sent(collector) if s["name"].startswith("episode ")}


def test_a_pools_trace_is_sent_as_each_episode_is_finished(cluster: Any, tmp_path: Path) -> None:
    kubectl, emulator = cluster
    output = tmp_path / "p"
    with RecordingServer() as collector:
        with rl_batch_demo.open_pool(
            output=str(output),
            size=2,
            episodes=3,
            tasks=TASKS,
            kubectl=kubectl,
            otlp_endpoint=collector.url,
        ) as pool:
            with pool.claim(TASKS[0], timeout=60) as first:
                assert first.run(["true"]).exit_code == 0
                first.finish(reward=1.0)
            # Sent as it was finished, the pool still open.
            wait_for(lambda: episode_names(collector)() == {"episode 0"}, 30, "episode 0's span")
            lost = pool.claim(TASKS[1], timeout=60)
            delete_during_a_command(lost, kubectl, pool.run.namespace, emulator.env())
            lost.finish(reward=1.0)
            with pool.claim(TASKS[1], timeout=60) as again:
                again.finish(reward=0.0)
            wait_for(lambda: len(episode_names(collector)()) == 3, 30, "every episode's span")
            assert not [s for s in spans_sent(collector) if "parentSpanId" not in s]  # no root yet
    spans = [otlp_span(s) for s in spans_sent(collector)]
    assert len({s["traceId"] for s in spans_sent(collector)}) == 1
    episodes = assert_pool_trace(spans, output)
    assert episodes["episode 1"].tags["episode.class"] == "infrastructure"
    assert episodes["episode 1"].error.startswith(f"sandbox {lost.pod} lost")
    telemetry = load(output / "results.json")["telemetry"]
    assert telemetry["spans"] == len(spans) == telemetry["exported_spans"] == 1 + 3 * 5
    assert telemetry["not_exported_spans"] == 0
    assert_pool_timeline(output, episodes)


def assert_pool_timeline(output: Path, episodes: dict[str, Span]) -> None:
    """timeline.svg: a row per episode named by its task and index, a bar per phase as long as
    its span, the lost episode marked failed."""
    svg = (output / "timeline.svg").read_text()
    ElementTree.fromstring(svg)  # well-formed
    assert "3 episodes on a pool of 2 sandboxes" in svg
    for name, episode in episodes.items():
        index = name.split()[1]
        assert f">{episode.tags['episode.task']} #{index}</text>" in svg
    work = re.findall(r"<title>([^<]+) episode_work: ([0-9.]+) s</title>", svg)
    assert len(work) == 3
    lost = episodes["episode 1"].tags["k8s.pod.name"]
    assert f"{lost} failed (infrastructure)" in svg


def test_a_reused_sandboxs_later_episode_begins_at_its_claim(cluster: Any, tmp_path: Path) -> None:
    kubectl, _emulator = cluster
    output = tmp_path / "p"
    with RecordingServer() as collector:
        with rl_batch_demo.open_pool(
            output=str(output),
            size=1,
            episodes=2,
            reuse=True,
            kubectl=kubectl,
            otlp_endpoint=collector.url,
        ) as pool:
            for _ in range(2):
                with pool.claim(timeout=60) as sandbox:
                    sandbox.finish(reward=1.0)
    spans = [otlp_span(s) for s in spans_sent(collector)]
    episodes = assert_pool_trace(spans, output)
    assert episodes["episode 0"].tags["k8s.pod.name"] == episodes["episode 1"].tags["k8s.pod.name"]
    later = {s.name for s in spans if s.parent == episodes["episode 1"].span_id}
    assert later == {"claim_wait", "episode_work"}
    assert len(spans) == 1 + 5 + 3


def test_a_pools_metrics_prom_passes_promtool_and_is_pushed_at_the_close(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    bin_dir = promtool_bin()
    output = tmp_path / "pool"
    with Pushgateway(bin_dir, tmp_path) as gateway:
        done = tool(
            emulator,
            kubectl,
            "pool",
            "--output",
            str(output),
            "--size",
            "2",
            "--episodes",
            "3",
            "--pushgateway",
            gateway.url,
        )
        pushed = gateway.metrics()
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr
    text = (output / "metrics.prom").read_text()
    checked = subprocess.run(
        [str(bin_dir / "promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""  # no lint finding either
    run = f'run_id="{load(output / "receipt.json")["run_id"]}"'
    results = load(output / "results.json")
    block = results["pool"]
    assert f'rl_batch_demo_episodes{{{run},class="ok"}} 3' in text
    for phase, count in (("server_start", 3), ("pod_to_ready", 3), ("claim_wait", 3)):
        assert f'rl_batch_demo_phase_seconds_count{{{run},phase="{phase}"}} {count}' in text
    claim_p99 = block["claim_wait_seconds"]["p99"]
    assert f'rl_batch_demo_pool_claim_wait_seconds{{{run},statistic="p99"}} {claim_p99!r}' in text
    ready_p50 = block["pod_to_ready_seconds"]["p50"]
    assert f'rl_batch_demo_pool_pod_to_ready_seconds{{{run},statistic="p50"}} {ready_p50!r}' in text
    assert f"rl_batch_demo_reward_sum{{{run}}} 3" in text
    assert 'runtime_class="cube"' in text and "rl_batch_demo_run_info{" in text
    # The Pushgateway parsed it and serves it under the pool's group.
    assert f'rl_batch_demo_pool_size{{instance="",job="rl_batch_demo",{run}}} 2' in pushed
    assert 'phase="server_start"' in pushed


def test_a_collector_gone_costs_a_pool_a_warning_never_its_episodes(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    gone = RecordingServer()
    gone_url = gone.url  # bound, then closed: nothing listens there
    gone.httpd.server_close()
    output = tmp_path / "pool"
    done = tool(
        emulator,
        kubectl,
        "pool",
        "--output",
        str(output),
        "--size",
        "1",
        "--episodes",
        "2",
        "--otlp-endpoint",
        gone_url,
    )
    assert done.returncode == 0, done.stderr
    assert "Episodes: 2, rewards 2.0, successful 2" in done.stdout
    telemetry = load(output / "results.json")["telemetry"]
    assert telemetry["exported_spans"] == 0 and telemetry["errors"][0].startswith("no answer")
    assert telemetry["not_exported_spans"] == telemetry["spans"] == 1 + 2 * 5
    assert f"Warning: traces: 11 of 11 spans not exported to {gone_url}/v1/traces" in done.stderr
