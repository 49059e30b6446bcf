"""The replay stand-in kubectl (tests/support/replay_kubectl.py) against the real recording it replays.

It stands in for kubectl only where no cluster can go (the cost model to 100,000 episodes in
tests/benchmarks/benchmark.py --replay), so what it prints must be what real kubectl printed: verbatim, the
recorded watch lines come back as they were (renamed into the run's namespace); scaled up, each
episode's lines are its recorded pod's, moved by whole seconds and renamed, and nothing else;
and the tool, followed against it unchanged, verifies and summarises every episode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import replay_kubectl as replay

SUPPORT = Path(__file__).resolve().parent
STAND_IN = SUPPORT / "replay_kubectl.py"
PRODUCT = SUPPORT.parent.parent / "rl_batch_demo.py"
NAMESPACE = "agc-rl-0123456789ab"


def stand_in(
    args: list[str], state: Path, stdin: str = "", **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(STAND_IN), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, REPLAY_STATE=str(state), **env),
    )


def create_job(state: Path, **env: str) -> dict:
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout", "namespace": NAMESPACE},
        "spec": {"completions": 40, "parallelism": 40},
    }
    created = stand_in(["create", "-f", "-", "-o", "json"], state, json.dumps(manifest), **env)
    assert created.returncode == 0, created.stderr
    return json.loads(created.stdout)


def watched(kind: str, state: Path, **env: str) -> list[str]:
    """Everything the stand-in's watch of `kind` prints before its request times out."""
    args = {
        "jobs": ["get", "jobs", "--field-selector", "metadata.name=rollout"],
        "pods": ["get", "pods", "-l", "job-name=rollout"],
        "events": ["get", "events"],
    }[kind]
    result = stand_in(
        [
            "--request-timeout=8s",
            *args,
            "-n",
            NAMESPACE,
            "-o",
            "json",
            "--watch",
            "--output-watch-events",
        ],
        state,
        **env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def recorded_lines(kind: str) -> list[str]:
    return [
        entry["line"]
        for entry in (
            json.loads(line)
            for line in (replay.TEMPLATE / f"{kind}.watch").read_text().splitlines()
        )
    ]


@pytest.mark.parametrize("kind", ["jobs", "pods", "events"])
def test_verbatim_the_recorded_watch_lines_come_back_as_real_kubectl_printed_them(
    kind: str, tmp_path: Path
) -> None:
    job = create_job(tmp_path, REPLAY_VERBATIM="1")
    recording = replay.Recording(replay.TEMPLATE)
    expected = [
        line.replace(recording.namespace, NAMESPACE).replace(
            recording.job_uid, job["metadata"]["uid"]
        )
        for line in recorded_lines(kind)
    ]
    assert watched(kind, tmp_path, REPLAY_VERBATIM="1") == expected


def test_scaled_up_each_episode_is_its_recorded_pod_moved_by_whole_seconds_and_renamed(
    tmp_path: Path,
) -> None:
    env = {"REPLAY_EPISODES": "7", "REPLAY_POD_EVENTS_PER_SECOND": "4000"}
    job = create_job(tmp_path, **env)
    plan = replay.plan_of(json.loads((tmp_path / "job.json").read_text()))
    recording = plan.recording
    lines = watched("pods", tmp_path, **env)
    assert len(lines) == 7 * replay.LINES_PER_POD
    for episode in range(7):
        template = plan.template_of(episode)
        own = [line for line in lines if f'"name":"{plan.pod_name(episode)}"' in line]
        recorded = [line for line in recorded_lines("pods") if f'"name":"{template}"' in line]
        shift = plan.shift(episode)
        assert shift == int(shift) and shift > 0
        # Undo the rename and the move: what is left is the recorded line, resourceVersion aside.
        undone = [
            replay.RESOURCE_VERSION.sub(
                '"resourceVersion":""',
                replay.moved(
                    line.replace(plan.pod_name(episode), template)
                    .replace(plan.pod_uid(episode), recording.pod_uids[template])
                    .replace(NAMESPACE, recording.namespace)
                    .replace(job["metadata"]["uid"], recording.job_uid),
                    -shift,
                    -episode,
                ),
            )
            for line in own
        ]
        assert undone == [
            replay.RESOURCE_VERSION.sub('"resourceVersion":""', line) for line in recorded
        ]


def test_the_tool_followed_against_the_scaled_replay_verifies_and_summarises_every_episode(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    env = dict(
        os.environ,
        REPLAY_STATE=str(tmp_path / "state"),
        REPLAY_EPISODES="40",
        REPLAY_POD_EVENTS_PER_SECOND="2000",
    )
    result = subprocess.run(
        [
            sys.executable,
            str(PRODUCT),
            "run",
            "--count",
            "40",
            "--parallelism",
            "40",
            "--max-episodes",
            "40",
            "--output",
            str(output),
            "--kubectl",
            str(STAND_IN),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    results: dict[str, Any] = json.loads((output / "results.json").read_text())
    client = json.loads((output / "client.json").read_text())
    assert results["episodes"] == results["successful_episodes"] == 40
    assert results["clock_warnings"] == [] and "Warning" not in result.stderr
    # Followed to the end by the watches alone, as against a cluster whose watches keep up.
    assert client["pods_read"]["source"] == "final watch" and client["events_read"] == "watch"
    assert results["phases"]["sandbox_creation"]["samples"] == 40
    plan = replay.plan_of(json.loads((tmp_path / "state" / "job.json").read_text()))
    for episode in (0, 17, 39):
        assert (output / f"{plan.pod_name(episode)}.log").read_text() == replay.log_of(
            plan, episode
        )
