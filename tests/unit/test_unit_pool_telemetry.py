"""Unit tests of a pool's telemetry: its episodes' points and phases, its metrics.prom and the
spans of its trace, from rewards.jsonl's lines and the sandboxes' starts alone."""

from __future__ import annotations

import json
import time
from typing import Any

import all_names as demo
from recording_server import RecordingServer

CREATED, STARTED, READY = 1000.0, 1001.0, 1001.25


def line(index: int, sandbox: str, claimed: float, finished: float, **fields: Any) -> dict:
    made = {
        "index": index,
        "task_id": f"task-{index}",
        "sandbox": sandbox,
        "image": "python:3.12-alpine",
        "reward": 1.0,
        "valid": True,
        "failure_class": None,
        "failure": None,
        "claimed_at": claimed,
        "claim_wait_seconds": 0.5,
        "finished_at": finished,
    }
    made.update(fields)
    return made


START = demo.sandbox_start("pool-a", CREATED, STARTED, READY)


def test_a_first_episode_spans_its_sandboxs_start_and_its_own_use() -> None:
    record = demo.pool_episode(line(0, "pool-a", 1002.0, 1004.5), START, True, "node-1")
    points = {name: point.at for name, point in record["points"].items()}
    assert points == {
        "pod_created": CREATED,
        "container_started": STARTED,
        "server_ready": READY,
        "claim_asked": 1001.5,
        "claimed": 1002.0,
        "finished": 1004.5,
    }
    assert record["phases"] == {
        "pod_start": (1.0, 1.0),
        "server_start": (0.25, 1.0),
        "pod_to_ready": (1.25, 1.0),
        "claim_wait": (0.5, 0.0),
        "episode_work": (2.5, 0.0),
    }
    assert (record["pod"], record["node"], record["task_id"]) == ("pool-a", "node-1", "task-0")


def test_a_reused_sandboxs_later_episode_begins_at_its_claim() -> None:
    lines = [line(3, "pool-a", 1010.0, 1011.0), line(1, "pool-a", 1002.0, 1004.5)]
    assert demo.first_uses(lines) == {1}
    later, first = demo.pool_episodes(lines, [START])[::-1]
    assert set(first["points"]) >= {"pod_created", "server_ready"}
    assert set(later["points"]) == {"claim_asked", "claimed", "finished"}
    assert set(later["phases"]) == {"claim_wait", "episode_work"}


def test_a_phase_whose_end_is_placed_before_its_start_is_0_s() -> None:
    # The container's start is a whole second: the server may answer inside that second.
    start = demo.sandbox_start("pool-a", CREATED, 1001.0, 1000.75)
    record = demo.pool_episode(line(0, "pool-a", 1002.0, 1003.0), start, True)
    assert record["phases"]["server_start"] == (0.0, 1.0)


def spans_of(record: dict) -> dict[str, dict]:
    sent = demo.episode_spans("t" * 32, "r" * 16, record, 0.0, demo.POOL_TABLE)
    return {span["name"]: span for span in sent}


def test_an_episodes_spans_run_from_point_to_point_and_a_lost_one_is_an_error() -> None:
    lost = line(
        2,
        "pool-a",
        1002.0,
        1004.5,
        reward=None,
        valid=False,
        failure_class="infrastructure",
        failure="sandbox pool-a lost: deleted",
    )
    spans = spans_of(demo.pool_episode(lost, START, True, "node-1"))
    assert sorted(spans) == [
        "claim_wait",
        "episode 2",
        "episode_work",
        "pod_start",
        "server_start",
    ]  # pod_to_ready is their sum: the episode's own span covers it
    episode = spans["episode 2"]
    assert (episode["startTimeUnixNano"], episode["endTimeUnixNano"]) == (
        "1000000000000",
        "1004500000000",
    )
    assert episode["status"] == {"code": 2, "message": "sandbox pool-a lost: deleted"}
    tags = {a["key"]: list(a["value"].values())[0] for a in episode["attributes"]}
    assert tags["episode.index"] == "2" and tags["episode.class"] == "infrastructure"
    assert tags["episode.valid"] is False and "episode.reward" not in tags
    assert tags["k8s.node.name"] == "node-1" and tags["k8s.pod.name"] == "pool-a"
    assert tags["point.server_ready.source"] == "the sandbox server's clock"
    claim = spans["claim_wait"]
    assert (claim["startTimeUnixNano"], claim["endTimeUnixNano"]) == (
        "1001500000000",
        "1002000000000",
    )
    assert all(s["parentSpanId"] == episode["spanId"] for n, s in spans.items() if n != "episode 2")


def test_a_pool_tracer_sends_each_episode_at_once_and_the_pools_root_last() -> None:
    with RecordingServer() as collector:
        config = demo.OtlpConfig(collector.url + "/v1/traces", {}, {"service.name": "t"})
        tracer = demo.RunTracer(config, "abc", kind="pool")
        tracer.bounds.append(999.0)
        demo.trace_episode(
            tracer, demo.pool_episode(line(0, "pool-a", 1002.0, 1004.5), START, True)
        )
        for _ in range(200):
            if collector.requests:
                break
            time.sleep(0.01)
        assert len(collector.requests) == 1  # sent before the pool closes
        saved = tracer.finish({"namespace": "ns", "episodes": 1})
    bodies = [json.loads(r.body) for r in collector.requests]
    names = [
        s["name"]
        for body in bodies
        for rs in body["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert names[-1] == "pool abc" and names[0] == "episode 0"
    root = bodies[-1]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert (root["startTimeUnixNano"], root["endTimeUnixNano"]) == ("999000000000", "1004500000000")
    assert saved["spans"] == saved["exported_spans"] == 6


def test_a_pools_metrics_prom() -> None:
    lines = [
        line(0, "pool-a", 1002.0, 1004.5),
        line(1, "pool-b", 1003.0, 1004.0, reward=0.0),
        line(2, "pool-c", 1003.0, 1005.0, reward=None, valid=False, failure_class="infrastructure"),
    ]
    starts = [START, demo.sandbox_start("pool-b", CREATED, STARTED, 1002.5)]
    figures = {
        "image": "python:3.12-alpine",
        "runtime": "cube",
        "namespace": "agc-rl-x",
        "pool": {
            "size": 2,
            "claim_wait_seconds": {"p50": 0.5, "p95": 0.5, "p99": 0.5, "max": 0.5, "warm_share": 1},
            "pod_to_ready_seconds": {
                "p50": 1.875,
                "p95": 2.4375,
                "max": 2.5,
                "precision_seconds": 1,
            },
            "round_trip_seconds": {"p50": 0.01, "p95": None, "p99": None, "max": 0.02},
            "commands_per_second": 3.5,
        },
    }
    text = demo.pool_metrics_text(figures, demo.pool_episodes(lines, starts), "r1")
    run = 'run_id="r1"'
    assert f'rl_batch_demo_episodes{{{run},class="ok"}} 2' in text
    assert f'rl_batch_demo_episodes{{{run},class="infrastructure"}} 1' in text
    assert f'rl_batch_demo_phase_seconds_count{{{run},phase="server_start"}} 2' in text
    assert f'rl_batch_demo_phase_seconds_count{{{run},phase="claim_wait"}} 3' in text
    assert f'rl_batch_demo_phase_seconds_sum{{{run},phase="pod_to_ready"}} 3.75' in text
    assert f'rl_batch_demo_pool_pod_to_ready_seconds{{{run},statistic="p95"}} 2.4375' in text
    assert "precision_seconds" not in text and "warm_share" not in text
    assert f'rl_batch_demo_pool_claim_wait_seconds{{{run},statistic="p99"}} 0.5' in text
    assert f'rl_batch_demo_pool_round_trip_seconds{{{run},statistic="p95"}}' not in text
    assert f"rl_batch_demo_pool_size{{{run}}} 2" in text
    assert f"rl_batch_demo_pool_commands_per_second{{{run}}} 3.5" in text
    assert f"rl_batch_demo_reward_count{{{run}}} 2" in text  # the lost one gave none
    assert 'runtime_class="cube"' in text and text.endswith("# EOF\n")
    # A family a run writes too says the same of itself: a Pushgateway refuses two helps.
    ran = demo.metrics_text({}, [], "r2")
    for family in ("phase_seconds", "episodes", "reward", "run_info"):
        helps = [
            row
            for row in (text + ran).splitlines()
            if row.startswith(f"# HELP rl_batch_demo_{family} ")
        ]
        assert len(helps) == 2 and helps[0] == helps[1], helps


def test_a_pools_timeline_names_each_row_by_its_task_and_draws_its_phases() -> None:
    lost = line(
        1,
        "pool-b",
        1003.0,
        1004.0,
        task_id="a-task-id-far-too-long-for-the-margin",
        valid=False,
        failure_class="infrastructure",
        failure="sandbox pool-b lost: deleted",
    )
    lines = [line(0, "pool-a", 1002.0, 1004.5), lost]
    starts = [START, demo.sandbox_start("pool-b", CREATED, STARTED, 1002.0)]
    svg = demo.pool_timeline_svg(demo.pool_episodes(lines, starts), "2 episodes")
    assert ">task-0 #0</text>" in svg and ">a-task-id-far-too-long\u2026 #1</text>" in svg
    assert "<title>pool-a server_start: 0.250 s</title>" in svg
    assert "<title>pool-a episode_work: 2.500 s</title>" in svg
    assert "pool-b failed (infrastructure): sandbox pool-b lost: deleted" in svg
    assert "pool-a failed" not in svg  # an episode with no failure class is not marked
    assert "seconds after the pool&#x27;s first pod was created" in svg
    many = [line(i, f"pool-{i}", 1002.0, 1003.0) for i in range(250)]
    svg = demo.pool_timeline_svg(demo.pool_episodes(many, []), "250 episodes")
    assert "(the first 200 episodes of 250)" in svg
    assert "<title>pool-199 " in svg and "<title>pool-200 " not in svg


def test_a_cold_claims_wait_is_titled_with_its_own_length() -> None:
    # Claimed before its sandbox was ready (at 1000.5, ready at 1001.25), given it at 1010.
    cold = line(0, "pool-a", 1010.0, 1012.0, claim_wait_seconds=9.5)
    svg = demo.pool_timeline_svg(demo.pool_episodes([cold], [START]), "1 episode")
    assert "<title>pool-a claim_wait: 9.500 s (8.750 s of it after the phase before)</title>" in svg
    assert "<title>pool-a server_start: 0.250 s</title>" in svg
