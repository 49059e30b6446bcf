"""Scale: the capacity check, throughput figures and pictures that read at any size.

The pure functions fed synthetic batches; the large batches on the emulator's lightweight
kubelet are in tests/e2e/test_e2e_scale.py. Nothing here is timed: the figures of time are
printed by tests/benchmarks/benchmark.py.
"""

from __future__ import annotations

import json
import math
import re
from xml.etree import ElementTree

import pytest

import all_names as demo
from e2e_support import SVG, paths_by_title

# --------------------------------------------------------------------------
# A synthetic batch: waves of `parallelism` pods, Kubernetes times truncated to the second.


def synthetic_batch(
    count: int, parallelism: int, job_created: float = 1_800_000_000.0, sandbox_every: int = 1
) -> demo.BatchSummary:
    records = []
    for n in range(count):
        wave, jitter = divmod(n, parallelism)[0], (n * 37 % 100) / 1000
        created = job_created + 0.2 + wave * 3.0 + jitter
        true = {"pod_created": created, "scheduled": created + 0.01}
        true["sandbox_ready"] = true["scheduled"] + 0.5 + jitter
        true["container_started"] = true["sandbox_ready"] + 0.02
        true["process_started"] = true["container_started"] + 0.03
        true["imports_done"] = true["process_started"] + 0.1
        true["ready"] = true["imports_done"] + 0.001
        true["reward"] = true["ready"] + 1.5 + jitter
        true["container_finished"] = true["reward"] + 0.1
        whole = {"pod_created", "sandbox_ready", "container_started", "container_finished"}
        points = {
            point: (float(math.floor(moment)), 1.0) if point in whole else (moment, 1e-6)
            for point, moment in true.items()
        }
        if n % sandbox_every:
            points["sandbox_ready"] = None
        records.append(
            {
                "pod": f"rollout-{n:05d}",
                "points": points,
                "phases": demo.phase_durations(points),
                "index": None,
            }
        )
    return demo.BatchSummary(
        figures={}, episodes=records, job_created=job_created, origin=job_created
    )


# --------------------------------------------------------------------------
# Capacity.


def node(name: str, cpu: str = "8", memory: str = "32Gi", pods: str = "110", **spec) -> dict:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


CUBE = {
    "metadata": {"name": "cube"},
    "handler": "cube",
    "overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}},
}
REQUESTS = {"cpu": "100m", "memory": "64Mi"}


@pytest.mark.parametrize(
    "text, value",
    [
        ("250m", 0.25),
        ("768Mi", 768 * 2**20),
        ("32Gi", 32 * 2**30),
        ("8", 8.0),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("2k", 2000.0),
        ("100M", 1e8),
        (2, 2.0),
        ("64974408Ki", 64974408 * 1024.0),
    ],
)
def test_parse_quantity_reads_kubernetes_quantities(text, value):
    assert demo.parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", [None, "", "lots", "1Xi", "m", True])
def test_parse_quantity_of_a_non_quantity_is_none(text):
    assert demo.parse_quantity(text) is None


def test_capacity_adds_the_runtime_class_overhead_and_takes_the_scarcest_resource():
    # 8 CPU / 0.35 = 22 episodes; 32Gi / 832Mi = 39; 110 pod slots: CPU decides.
    plan = demo.capacity_plan(
        [node("a"), node("b"), node("c")], CUBE, REQUESTS, count=1000, parallelism=1000
    )
    assert plan["episodes_fit_per_node"] == {"a": 22, "b": 22, "c": 22}
    assert plan["episodes_fit_at_once"] == 66 and not plan["fits_at_once"]
    assert plan["expected_waves"] == math.ceil(1000 / 66) and plan["waves_at_parallelism"] == 1
    assert plan["per_episode"] == {
        "cpu": "100m + overhead 250m",
        "memory": "64Mi + overhead 768Mi",
        "cpu_cores": 0.35,
        "memory_bytes": (64 + 768) * 2**20,
    }
    # Memory decides on a node with CPU to spare; pod slots on a roomy one.
    plan = demo.capacity_plan(
        [node("m", cpu="64", memory="8Gi"), node("p", cpu="64", memory="512Gi", pods="30")],
        CUBE,
        REQUESTS,
        count=10,
        parallelism=10,
    )
    assert plan["episodes_fit_per_node"] == {"m": 9, "p": 30}
    assert plan["fits_at_once"] and plan["expected_waves"] == 1


def test_capacity_without_a_runtime_class_overhead_counts_the_requests_alone():
    plan = demo.capacity_plan(
        [node("a", cpu="1", memory="1Gi")], {"handler": "runc"}, REQUESTS, 20, 20
    )
    assert plan["episodes_fit_at_once"] == 10  # 1 CPU / 100m
    assert plan["per_episode"]["cpu"] == "100m + overhead 0"


def test_capacity_counts_only_nodes_that_take_new_pods():
    unready = node("unready")
    unready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes = [
        node("ok"),
        node("cordoned", unschedulable=True),
        unready,
        node("tainted", taints=[{"key": "gpu", "effect": "NoSchedule"}]),
        node("preferred", taints=[{"key": "spot", "effect": "PreferNoSchedule"}]),
    ]
    plan = demo.capacity_plan(nodes, CUBE, REQUESTS, 10, 10)
    assert sorted(plan["episodes_fit_per_node"]) == ["ok", "preferred"]
    assert plan["schedulable_nodes"] == 2 and plan["nodes_seen"] == 5


def test_capacity_warning_names_the_fit_and_the_waves_or_says_nothing():
    tight = demo.capacity_plan([node("a")], CUBE, REQUESTS, count=100, parallelism=50)
    warning = demo.capacity_warning(tight, 50)
    assert warning is not None and warning.startswith("Warning: capacity:")
    assert "fit about 22 episodes at once" in warning and "parallelism 50" in warning
    assert f"about {math.ceil(100 / 22)} waves instead of 2" in warning
    roomy = demo.capacity_plan([node("a")], CUBE, REQUESTS, count=100, parallelism=20)
    assert demo.capacity_warning(roomy, 20) is None
    nothing = demo.capacity_plan([node("a", cpu="100m")], CUBE, REQUESTS, count=5, parallelism=5)
    assert "no schedulable node has room for one episode" in demo.capacity_warning(nothing, 5)
    skipped = {"checked": False, "reason": "reading nodes or the RuntimeClass is not permitted"}
    assert demo.capacity_warning(skipped, 5) == (
        "Warning: capacity check skipped (reading nodes or the RuntimeClass is not permitted)"
    )


# --------------------------------------------------------------------------
# Throughput.


def test_most_at_once_counts_overlaps_and_a_handover_as_one():
    assert demo.most_at_once([]) == 0
    assert demo.most_at_once([(0, 2), (1, 3), (1.5, 1.7), (5, 6)]) == 3
    assert demo.most_at_once([(0, 1), (1, 2), (2, 3)]) == 1  # one ends as the next starts


def test_per_whole_second_peak_buckets_by_the_second():
    assert demo.per_whole_second_peak([10.0, 10.9, 11.0, 11.2, 11.99, 13.5]) == 3
    assert demo.per_whole_second_peak([]) == 0


def test_throughput_of_waves_of_pods():
    batch = synthetic_batch(300, parallelism=100)
    figures = demo.throughput([("rollout", batch)])
    created = [r["points"]["pod_created"][0] for r in batch.episodes]
    sandboxes = [r["points"]["sandbox_ready"][0] for r in batch.episodes]
    assert figures["pods_created_per_second"] == round(300 / (max(created) - batch.job_created), 2)
    assert figures["sandboxes_ready_per_second_mean"] == round(
        300 / (max(sandboxes) - batch.job_created), 2
    )
    assert figures["sandboxes_ready_per_second_peak"] == max(
        sandboxes.count(t) for t in set(sandboxes)
    )
    # Each wave's episodes end before the next wave's start: at most one wave runs at once.
    assert figures["max_episodes_running_at_once"] == 100
    assert figures["sandboxes_ready_known"] == 300
    assert all(
        "per_second" in name
        for name in figures
        if name.startswith(("pods_", "sandboxes_ready_per"))
    )


def test_throughput_without_sandbox_times_says_none_and_reads_a_short_span_as_one_second():
    batch = synthetic_batch(5, parallelism=5, sandbox_every=10**9)
    batch.episodes = [dict(r, points=dict(r["points"], sandbox_ready=None)) for r in batch.episodes]
    figures = demo.throughput([("rollout", batch)])
    assert figures["sandboxes_ready_per_second_mean"] is None
    assert figures["sandboxes_ready_per_second_peak"] is None
    assert figures["pods_created_per_second"] == 5.0  # all created within the Job's first second


# --------------------------------------------------------------------------
# Pictures.


def last_y(d: str) -> float:
    return float(re.findall(r"[ML][-\d.]+,([-\d.]+)", d)[-1])


def first_y(d: str) -> float:
    return float(re.findall(r"[ML][-\d.]+,([-\d.]+)", d)[0])


@pytest.mark.parametrize("count", [10, 2000, 10000])
def test_ramp_svg_has_one_rising_line_per_point_ending_at_its_count(count):
    batch = synthetic_batch(count, parallelism=1000, sandbox_every=3)
    text = demo.ramp_svg([("rollout", batch)], f"{count} episodes")
    paths = paths_by_title(text)
    with_sandbox = len([n for n in range(count) if n % 3 == 0])
    assert sorted(paths) == sorted(
        [f"{point}: {count} episodes" for point in demo.RAMP_POINTS if point != "sandbox_ready"]
        + [f"sandbox_ready: {with_sandbox} episodes"]
    )
    root = ElementTree.fromstring(text)
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert f"sandbox ready ({with_sandbox} known)" in texts and "ready" in texts
    # Full lines end at the top tick (the count); each line only rises; each stays small.
    top = last_y(paths[f"ready: {count} episodes"])
    for title, d in paths.items():
        ys = [float(y) for y in re.findall(r"[ML][-\d.]+,([-\d.]+)", d)]
        assert all(b <= a + 1e-9 for a, b in zip(ys, ys[1:])), title
        assert len(ys) <= 2 * demo.CHART_STEPS + 1, title
    assert last_y(paths[f"reward: {count} episodes"]) == top
    assert last_y(paths[f"sandbox_ready: {with_sandbox} episodes"]) > top
    assert len(text) < 200_000


@pytest.mark.parametrize("count", [10, 2000])
def test_cdf_svg_has_one_line_per_phase_from_0_to_100_percent(count):
    batch = synthetic_batch(count, parallelism=500)
    text = demo.cdf_svg([("rollout", batch)], "phases")
    paths = paths_by_title(text)
    # One line per phase the episodes went through (these pull no image: no image_pull line).
    measured = [
        phase for phase in demo.PHASES if any(r["phases"].get(phase) for r in batch.episodes)
    ]
    assert "image_pull" not in measured and len(measured) == len(demo.PHASES) - 1
    assert sorted(paths) == sorted(f"{phase}: {count} episodes" for phase in measured)
    tops = {last_y(d) for d in paths.values()}
    bottoms = {first_y(d) for d in paths.values()}
    assert len(tops) == 1 and len(bottoms) == 1 and tops.pop() < bottoms.pop()
    texts = ["".join(t.itertext()) for t in ElementTree.fromstring(text).iter(f"{SVG}text")]
    values = [r["phases"]["pod_to_ready"][0] for r in batch.episodes]
    assert (
        f"pod to ready (sharp)  {demo.percentile(values, 0.5):.2f} / "
        f"{demo.percentile(values, 0.95):.2f}" in texts
    )


def test_cdf_svg_of_a_phase_without_samples_says_so():
    batch = synthetic_batch(4, parallelism=4, sandbox_every=10**9)
    for record in batch.episodes:
        record["points"]["sandbox_ready"] = None
        record["phases"] = demo.phase_durations(record["points"])
    text = demo.cdf_svg([("rollout", batch)], "phases")
    texts = ["".join(t.itertext()) for t in ElementTree.fromstring(text).iter(f"{SVG}text")]
    assert "sandbox creation: no samples" in texts
    assert "sandbox_creation: 0 episodes" not in paths_by_title(text)


def test_thinned_keeps_the_last_rank_and_at_most_the_steps_asked():
    assert demo.thinned([]) == []
    assert demo.thinned([3.0, 1.0, 2.0]) == [(1.0, 1), (2.0, 2), (3.0, 3)]
    thin = demo.thinned([float(v) for v in range(10000)], steps=400)
    assert len(thin) == 400 and thin[-1] == (9999.0, 10000) and thin[0] == (24.0, 25)


def test_timeline_sample_keeps_small_batches_whole_and_spreads_a_sample_over_large_ones():
    small = [("rollout", synthetic_batch(demo.TIMELINE_MAX_ROWS, parallelism=50))]
    assert demo.timeline_sample(small) == (small, "")
    large = synthetic_batch(2000, parallelism=1000)
    sampled, note = demo.timeline_sample([("rollout", large)])
    kept = [record["pod"] for record in sampled[0][1].episodes]
    assert len(kept) == demo.TIMELINE_MAX_ROWS
    assert (
        note
        == f" - {demo.TIMELINE_MAX_ROWS} of 2000 episodes, evenly spread in order of pod creation"
    )
    # The first and last pods created are in; both waves are.
    order = sorted(
        large.episodes, key=lambda r: (r["points"]["pod_created"][0], r["points"]["ready"][0])
    )
    assert order[0]["pod"] in kept and order[-1]["pod"] in kept
    assert sum(1 for pod in kept if int(pod.split("-")[1]) < 1000) == demo.TIMELINE_MAX_ROWS // 2
    assert len(large.episodes) == 2000  # the batch itself is untouched
    svg = demo.timeline_svg(sampled, "2000 episodes" + note)
    rows = {
        rect.get("y")
        for rect in ElementTree.fromstring(svg).iter(f"{SVG}rect")
        if rect.find(f"{SVG}title") is not None
    }
    assert len(rows) == demo.TIMELINE_MAX_ROWS


def test_timeline_sample_of_rounds_keeps_each_rounds_name():
    rounds = [
        ("rollout-1", synthetic_batch(150, 150)),
        ("rollout-2", synthetic_batch(150, 150, 1_800_000_100.0)),
    ]
    sampled, _ = demo.timeline_sample(rounds)
    assert [name for name, _ in sampled] == ["rollout-1", "rollout-2"]
    assert sum(len(s.episodes) for _, s in sampled) == demo.TIMELINE_MAX_ROWS


def test_json_pieces_are_indented_json_with_long_lists_one_item_per_line():
    small = {"a": [1, {"b": None, "c": []}], "d": {}, "e": 1.5, "f": 'x"y', "g": True}
    assert "".join(demo.json_pieces(small)) == json.dumps(small, indent=2)
    large = {
        "kind": "List",
        "items": [{"metadata": {"name": f"pod-{n}"}} for n in range(demo.ONE_LINE_ITEMS_FROM)],
    }
    text = "".join(demo.json_pieces(large))
    assert json.loads(text) == large
    lines = text.splitlines()
    assert lines[3] == '    {"metadata": {"name": "pod-0"}},'
    assert len(lines) == demo.ONE_LINE_ITEMS_FROM + 5
    # An object of as many entries (the pods observed) likewise.
    observed = {"pods": {f"pod-{n}": {"ready": 1.5} for n in range(demo.ONE_LINE_ITEMS_FROM)}}
    lines = "".join(demo.json_pieces(observed)).splitlines()
    assert json.loads("\n".join(lines)) == observed and lines[2] == '    "pod-0": {"ready": 1.5},'
