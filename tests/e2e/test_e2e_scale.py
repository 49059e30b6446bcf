"""Scale end to end: large batches on the emulator's lightweight kubelet.

The real tool with real kubectl against the emulator with its lightweight kubelet
(containers emit the built-in worker's events but spawn no process: the only way to run
hundreds of pods on two cores). Nothing here is timed: the figures of time are printed by
tests/benchmarks/benchmark.py; the pure functions are held in tests/unit/test_scale.py.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path
from typing import NamedTuple
from xml.etree import ElementTree

import pytest

import all_names as demo
from e2e_support import SVG, load, paths_by_title, run_tool


SCALE_COUNT = 400
SCALE_PARALLELISM = 200


class ScaleRun(NamedTuple):
    """One batch of the scale fixture: its output directory, the finished tool, the API requests it made
    and its results.json."""

    output: Path
    done: subprocess.CompletedProcess
    requests: list
    results: dict


@pytest.fixture(scope="module")
def scale_run(tmp_path_factory, require_e2e):
    """(emulator, small, large): a 10-episode batch and a 400-episode one at parallelism 200 (ScaleRuns),
    on one lightweight-kubelet emulator."""
    from e2e_support import DEFAULT_TIMING
    from kube_emulator import Emulator

    kubectl = require_e2e()
    root = tmp_path_factory.mktemp("scale")
    emulator = Emulator(root / "emulator", faults={**DEFAULT_TIMING, "lightweight_kubelet": True})
    emulator.start()
    try:
        runs = {}
        for count, parallelism in ((10, 10), (SCALE_COUNT, SCALE_PARALLELISM)):
            output = root / f"run-{count}"
            first = len(emulator.requests)
            done = run_tool(
                emulator,
                kubectl,
                "run",
                count=count,
                parallelism=parallelism,
                max_episodes=count,
                output=output,
                process_timeout=600,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            runs[count] = ScaleRun(
                output, done, list(emulator.requests[first:]), load(output / "results.json")
            )
        yield emulator, runs[10], runs[SCALE_COUNT]
    finally:
        emulator.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_lightweight_kubelet_scale_batch_is_verified_whole(scale_run):
    _, _, large = scale_run
    output, results = large.output, large.results
    assert results["episodes"] == results["successful_episodes"] == SCALE_COUNT
    assert len(results["pods"]) == SCALE_COUNT
    # The lightweight containers printed what the built-in worker prints.
    log = (output / f"{results['pods'][0]['pod']}.log").read_text().splitlines()
    ready, reward = (json.loads(line) for line in log)
    assert set(ready) == {
        "event",
        "at",
        "episode_id",
        "imports_done_at",
        "process_started_at",
        "modules_before_ready",
        "import_seconds",
    }
    assert set(reward) == {
        "event",
        "at",
        "episode_id",
        "reward",
        "baseline_exit",
        "tests_exit",
        "tests_output",
    }
    assert results["phases"]["python_imports"]["samples"] == SCALE_COUNT


@pytest.mark.e2e
@pytest.mark.slow
def test_lightweight_kubelet_scale_costs_constant_processes_and_about_one_request_per_episode(
    scale_run,
):
    emulator, small_run, large_run = scale_run
    small, large = small_run.results, large_run.results
    # Never more than a small batch's (one fewer: a large batch's events table is made from the
    # events followed); while waiting, the watches of the Job, its pods and the events.
    assert large["client"]["kubectl_processes"] <= small["client"]["kubectl_processes"]
    assert large["client_wait"]["kubectl_processes_while_waiting"] == 3
    assert large["client_wait"]["watch_restarts"] == 0 and emulator.watches_expired == 0
    # How far the client fell behind its watches is recorded (benchmark.py prints it).
    assert (
        isinstance(large["client_wait"]["watch_queue_peak"], int)
        and large["client_wait"]["watch_queue_peak"] >= 1
    )
    # Requests: one log read per episode plus a constant (discovery, creates, watches, pages).
    requests = {10: len(small_run.requests), SCALE_COUNT: len(large_run.requests)}
    per_episode_growth = (requests[SCALE_COUNT] - requests[10]) / (SCALE_COUNT - 10)
    assert per_episode_growth <= 1.2, requests
    assert requests[SCALE_COUNT] <= 1.2 * SCALE_COUNT + 60, requests


@pytest.mark.e2e
@pytest.mark.slow
def test_lightweight_kubelet_scale_capacity_warns_of_waves_before_creating(scale_run):
    _, small, large = scale_run
    done, requests, capacity = large.done, large.requests, large.results["capacity"]
    # Three emulated nodes of 8 CPU: 22 episodes of 100m + 250m overhead each.
    assert capacity["episodes_fit_at_once"] == 66 and not capacity["fits_at_once"]
    assert capacity["expected_waves"] == math.ceil(SCALE_COUNT / 66)
    assert (
        f"fit about 66 episodes at once (100m + overhead 250m CPU, 64Mi + overhead 768Mi memory each), "
        f"fewer than parallelism {SCALE_PARALLELISM}: expect about {math.ceil(SCALE_COUNT / 66)} waves "
        f"instead of {math.ceil(SCALE_COUNT / SCALE_PARALLELISM)}"
    ) in done.stderr
    # The nodes were read before the namespace was created.
    nodes = next(i for i, r in enumerate(requests) if r["path"] == "/api/v1/nodes")
    created = next(
        i
        for i, r in enumerate(requests)
        if r["method"] == "POST" and r["path"] == "/api/v1/namespaces"
    )
    assert nodes < created
    assert small.results["capacity"]["fits_at_once"] and "capacity" not in small.done.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_lightweight_kubelet_scale_pictures_hold_every_episode(scale_run):
    _, small, large = scale_run
    output, done, results = large.output, large.done, large.results
    ramp = paths_by_title((output / "ramp.svg").read_text())
    # Each line counts the episodes whose point is known: every one, but the sandbox's readiness
    # only where the pod watch saw it while the pod ran.
    with open(output / "episodes.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for point in demo.RAMP_POINTS:
        known = sum(1 for row in rows if row[f"{point}_after_job_seconds"])
        assert known == SCALE_COUNT or point == "sandbox_ready", (point, known)
        assert f"{point}: {known} episodes" in ramp, sorted(ramp)
    cdf = paths_by_title((output / "cdf.svg").read_text())
    assert f"pod_to_ready: {SCALE_COUNT} episodes" in cdf
    timeline = ElementTree.parse(output / "timeline.svg").getroot()
    rows = {
        rect.get("y")
        for rect in timeline.iter(f"{SVG}rect")
        if rect.find(f"{SVG}title") is not None
    }
    assert len(rows) == demo.TIMELINE_MAX_ROWS
    texts = ["".join(t.itertext()) for t in timeline.iter(f"{SVG}text")]
    assert any(f"{demo.TIMELINE_MAX_ROWS} of {SCALE_COUNT} episodes" in text for text in texts)
    figures = results["throughput"]
    assert 0 < figures["max_episodes_running_at_once"] <= SCALE_PARALLELISM
    assert (
        figures["pods_created_per_second"] > 0 and figures["sandboxes_ready_per_second_peak"] >= 1
    )
    assert "throughput: pods created" in done.stderr
    assert small.results["throughput"]["max_episodes_running_at_once"] <= 10


@pytest.mark.e2e
def test_capacity_check_skipped_when_nodes_are_forbidden_and_the_run_goes_on(
    make_cluster, tmp_path
):
    kubectl, make = make_cluster
    emulator = make(lightweight_kubelet=True, forbidden=["nodes"])
    output = tmp_path / "run"
    done = run_tool(emulator, kubectl, "run", count=3, output=output)
    assert done.returncode == 0, done.stderr
    assert (
        "Warning: capacity check skipped (reading nodes or the RuntimeClass is not permitted)"
        in done.stderr
    )
    results = load(output / "results.json")
    assert results["capacity"] == {
        "checked": False,
        "reason": "reading nodes or the RuntimeClass is not permitted",
    }
    assert any(r["path"] == "/api/v1/nodes" and r["status"] == 403 for r in emulator.requests)
