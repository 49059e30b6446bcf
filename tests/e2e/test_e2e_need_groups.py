"""End to end, --need-groups K: the batch ends once K tasks' groups have every member's valid line,
the tool suspending the rest (one Job, or one per image: no successPolicy can say "K whole groups").
On the emulator and on the real control plane, whose Job controller does the stopping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import all_names as rl_batch_demo
from conftest import on_tiers
from e2e_support import TASK_EPISODE_HEAD, load, run_tool, write_script

pytestmark = pytest.mark.e2e

# A task that says "hold" never ends on its own; one that says "fail" fails on its own (a valid line);
# one that says "sigterm" ends with a failure of its own once told to stop, as many programs do:
# stopped by the tool, that end is not the episode's.
EPISODE = (
    TASK_EPISODE_HEAD
    + """\
if task.get("sigterm"):
    import signal
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit("stopped"))
while task.get("hold"):
    time.sleep(0.05)
if task.get("fail"):
    sys.exit("the agent gave up")
emit("reward", reward=task["x"])
"""
)


def need_groups_run(
    cluster: Any, kubectl: str, tmp_path: Path, tasks: list[dict], **flags: Any
) -> Any:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return run_tool(
        cluster,
        kubectl,
        "run",
        output=tmp_path / "out",
        tasks=tmp_path / "tasks.jsonl",
        episode_script=write_script(tmp_path, EPISODE),
        group_size=2,
        process_timeout=240,
        **flags,
    )


def lines(output: Path) -> dict[str, list[tuple[Any, bool]]]:
    """Each task's members' (failure_class, valid), from rewards.jsonl."""
    found: dict[str, list[tuple[Any, bool]]] = {}
    for line in (output / "rewards.jsonl").read_text().splitlines():
        row = json.loads(line)
        found.setdefault(row["task_id"], []).append((row["failure_class"], row["valid"]))
    return found


@on_tiers("emulator", "real_cluster", "real_node")
@pytest.mark.parametrize("images", [1, 2])
def test_need_groups_ends_the_batch_once_k_groups_are_whole(
    tier: Any, tmp_path: Path, images: int
) -> None:
    kubectl, cluster = tier
    other = {"image": "python:3.12-alpine"} if images == 2 else {}
    tasks = [
        {"id": "quick", "x": 1},
        {"id": "stuck", "x": 2, "hold": True, **other},
        {"id": "gave-up", "x": 3, "fail": True},
        {"id": "stuck-too", "x": 4, "hold": True, "sigterm": True, **other},
    ]
    if images == 2:  # the same image by another name: a Job of its own
        tasks[1]["image"] = tasks[3]["image"] = "docker.io/library/python:3.12-alpine"
    result = need_groups_run(cluster, kubectl, tmp_path, tasks, need_groups=2)
    assert result.returncode == 0, result.stderr
    output = tmp_path / "out"
    assert "--need-groups 2 met: the rest of the batch stopped" in result.stderr
    assert "--need-groups 2 met: 4 of 8 episodes cancelled, 0 lost" in result.stderr
    # The two whole groups (one of them its agents' own failures: valid samples), the rest cancelled.
    assert lines(output) == {
        "quick": [(None, True)] * 2,
        "stuck": [("cancelled", False)] * 2,
        "gave-up": [("episode", True)] * 2,
        "stuck-too": [("cancelled", False)] * 2,
    }
    cancelled = [
        json.loads(line)["failure"]
        for line in (output / "rewards.jsonl").read_text().splitlines()
        if json.loads(line)["failure_class"] == "cancelled"
    ]
    assert {f.split(" was met")[0] for f in cancelled} == {"cancelled: --need-groups"}
    results = load(output / "results.json")
    assert results["need_groups"] == 2 and results["cancelled_episodes"] == 4
    assert results["job_end"] == {"condition": "Complete", "reason": "NeedGroupsMet"}
    assert results["accepted_partial"] is False and results["jobs"] == images
    # Each Job says why it stopped, in the saved evidence too.
    saved = load(output / "job.json")
    for job in saved["items"] if images == 2 else [saved]:
        assert job["metadata"]["annotations"][rl_batch_demo.NEED_GROUPS_ANNOTATION] == "2"
    # `report` recomputes the same from the saved files alone.
    reported = run_tool(cluster, kubectl, "report", output)
    assert reported.returncode == 0, reported.stderr
    assert json.loads(reported.stdout)["job_end"] == results["job_end"]
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"need_groups": 2}, "--need-groups needs --tasks"),
        ({"need_groups": 4, "tasks": True}, "--need-groups 4 must be fewer than the 4 tasks"),
        ({"need_groups": 1, "tasks": True, "need": 3}, "--need-groups cannot go with --need"),
        (
            {"need_groups": 1, "tasks": True, "allow_failures": 1},
            "--need-groups cannot go with --allow-failures",
        ),
    ],
)
def test_need_groups_out_of_bounds_is_a_usage_error(
    flags: dict, message: str, tmp_path: Path, capsys: Any
) -> None:
    argv = ["run", "--dry-run", "--output", str(tmp_path / "out")]
    if flags.pop("tasks", False):
        (tmp_path / "t.jsonl").write_text("".join(f'{{"id": "{n}"}}\n' for n in range(4)))
        argv += ["--tasks", str(tmp_path / "t.jsonl"), "--episode-script", __file__]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    with pytest.raises(SystemExit) as exited:
        rl_batch_demo.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
