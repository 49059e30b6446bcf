"""End to end, an image per task: one Indexed Job per image in the run's namespace, followed,
saved, verified, receipted and cleaned up as one batch, with the run-wide episode index kept.
Real kubectl against the emulator; the scenarios marked on_tiers run on the real control plane
too, where the real kube-apiserver takes each image's Job (its server-side dry run first) and
serves the batch's label selectors, and the real Job controller gives each pod its
JOB_COMPLETION_INDEX, which the episode launcher turns into the run-wide index."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

import all_names as rl_batch_demo
from conftest import on_tiers
from e2e_support import (
    TASK_EPISODE_HEAD,
    assert_pulls_one_at_a_time,
    emulators,
    load,
    run_namespaces,
    run_tool,
    tool,
    tool_flags,
    write_script,
)
from kube_emulator import ANY_IMAGE

pytestmark = pytest.mark.e2e

# Reports what it was given: its run-wide index, its task (from $TASK_FILE) and its interpreter's argv.
IMAGE_EPISODE = (
    TASK_EPISODE_HEAD
    + """\
emit("reward", reward=1, task_seen=task["id"], episode_index_seen=int(os.environ["EPISODE_INDEX"]),
     task_file_seen=os.environ["TASK_FILE"], argv_seen=sys.argv[0], name_seen=__name__)
"""
)

# Three images, interleaved: tasks a and c share one, b uses --image, d has its own.
TASKS = [
    {"id": "a", "image": "docker.io/swebench/one:1"},
    {"id": "b"},
    {"id": "c", "image": "docker.io/swebench/one:1"},
    {"id": "d", "image": "docker.io/other/two:2"},
]


@pytest.fixture
def emulator_tier(cluster: Any) -> tuple[str, Any]:
    """(kubectl 1.35, an emulator whose sandboxes each wait for a watch of their pods): the batch's
    one pod watch (by its label) must serve every Job."""
    kubectl, make = cluster
    return kubectl, make(sandbox_after_watch=True)


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any):
    """(kubectl 1.35, make(**faults)): nodes that take every image as present (TASKS' too)."""
    kubectl = require_e2e("1.35")
    with emulators(tmp_path, timing={"job_backoff_base": 0.5}, images=ANY_IMAGE) as make:
        yield kubectl, make


def images_run(
    tmp_path: Path, tasks: list[dict] = TASKS, **flags: Any
) -> tuple[dict[str, Any], Path]:
    """The flags of a `run` of `tasks` in groups of 2 by the image episode (more `flags` added or
    replacing these), and its output directory."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in tasks))
    output = tmp_path / "out"
    return {
        "output": output,
        "quiet": True,
        "tasks": tmp_path / "tasks.jsonl",
        "group_size": 2,
        "episode_script": write_script(tmp_path, IMAGE_EPISODE),
        **flags,
    }, output


def rewards_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "rewards.jsonl").read_text().splitlines()]


@on_tiers("emulator", "real_cluster")
def test_one_job_per_image_keeps_the_run_wide_index(tier: Any, tmp_path: Path) -> None:
    kubectl, cluster = tier
    flags, output = images_run(
        tmp_path, parallelism=4, image_map=["docker.io/swebench=registry.internal/swebench"]
    )
    result = run_tool(cluster, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    rows = rewards_of(output)
    one, two, default = (
        "registry.internal/swebench/one:1",
        "docker.io/other/two:2",
        rl_batch_demo.DEFAULT_IMAGE,
    )
    assert [row["index"] for row in rows] == list(range(8))
    assert [row["image"] for row in rows] == [one, one, default, default, one, one, two, two]
    # Each episode saw its run-wide index and the task of its group, through the launcher, as __main__.
    assert [row["episode_index_seen"] for row in rows] == list(range(8))
    assert [row["task_seen"] for row in rows] == ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert [row["task_file_seen"] for row in rows] == [f"/tasks/{i}.json" for i in range(8)]
    assert {row["argv_seen"] for row in rows} == {"/demo/episode.py"}
    assert {row["name_seen"] for row in rows} == {"__main__"}
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert len(pods) == 8
    for row in rows:  # each pod runs its task's image, in its image's Job
        pod = pods[row["pod"]]
        assert pod["spec"]["containers"][0]["image"] == row["image"]
    jobs = load(output / "job.json")
    assert jobs["kind"] == "List"
    names = [job["metadata"]["name"] for job in jobs["items"]]
    assert names == ["rollout-image-1", "rollout-image-2", "rollout-image-3"]
    assert [job["spec"]["completions"] for job in jobs["items"]] == [4, 2, 2]
    assert [job["spec"]["parallelism"] for job in jobs["items"]] == [
        2,
        1,
        1,
    ]  # 4 shared by episodes
    assert all(rl_batch_demo.job_finished(job) == "Complete" for job in jobs["items"])
    assert {pods[row["pod"]]["metadata"]["labels"]["job-name"] for row in rows[:2] + rows[4:6]} == {
        "rollout-image-1"
    }
    submitted = load(output / "job-submitted.json")
    assert [job["metadata"]["name"] for job in submitted["items"]] == names
    receipt = load(output / "receipt.json")
    assert receipt["jobs"] == {
        job["metadata"]["name"]: job["metadata"]["uid"] for job in jobs["items"]
    }
    results = load(output / "results.json")
    assert results["jobs"] == 3 and results["episodes"] == 8 and results["successful_episodes"] == 8
    assert results["image_map"] == {"docker.io/swebench": "registry.internal/swebench"}
    assert set(results["images"]) == {one, two, default}
    assert results["image"] == default
    assert sorted(results["nodes"].values()) and sum(results["nodes"].values()) == 8
    episodes = list(csv.DictReader(io.StringIO((output / "episodes.csv").read_text())))
    assert sorted(int(row["index"]) for row in episodes) == list(range(8))
    assert {row["pod"]: row["image"] for row in episodes} == {
        row["pod"]: row["image"] for row in rows
    }
    # report recomputes the batch from job.json's List alone.
    report = tool(cluster, kubectl, "report", str(output))
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["episodes"] == 8

    namespace = receipt["namespace"]
    cleanup = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleanup.returncode == 0, cleanup.stderr
    assert f"Deleted test namespace: {namespace}" in cleanup.stdout
    assert namespace not in [ns["metadata"]["name"] for ns in run_namespaces(cluster)]
    assert not [job for job in cluster.list("jobs", namespace)]


# Crashes on its task's "crash" member and hangs on its "hang" member (0 or 1 of a group of 2).
CRASH_OR_HANG_EPISODE = (
    TASK_EPISODE_HEAD
    + """\
member = int(os.environ["EPISODE_INDEX"]) % 2
if task.get("crash") == member:
    sys.exit("the agent crashed")
if task.get("hang") == member:
    time.sleep(60)
emit("reward", reward=1)
"""
)


def test_lines_seen_before_their_jobs_count_from_the_batchs_creation(
    cluster: Any, tmp_path: Path
) -> None:
    """The issue's recipe (six tasks, two of their own image, a crash and a hang), with the Jobs'
    watch failing at first, as a slow one does: every pod ends before any Job is seen, and no line
    may count its times from 1970 (nor from a later Job's creation): it waits for the Jobs."""
    kubectl, make = cluster
    emulator = make(api_errors={"count": 4, "match": "jobs?labelSelector", "status": 503})
    tasks = [
        {"id": "a"},
        {"id": "b", "image": "docker.io/swebench/one:1", "crash": 0},
        {"id": "c"},
        {"id": "d", "image": "docker.io/other/two:2", "hang": 1},
        {"id": "e"},
        {"id": "f"},
    ]
    flags, output = images_run(tmp_path, episode_timeout=4, allow_failures=2, tasks=tasks)
    flags["episode_script"] = write_script(tmp_path, CRASH_OR_HANG_EPISODE)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode in (0, 3), result.stderr
    csv_ready = {
        row["pod"]: float(row["ready_after_job_seconds"])
        for row in csv.DictReader(io.StringIO((output / "episodes.csv").read_text()))
        if row["ready_after_job_seconds"]
    }
    rewards = rewards_of(output)
    assert len(rewards) == 12 and len(csv_ready) >= 10
    for line in rewards:
        assert 0 < line["batch_to_ready_seconds"] < 30, line
        if line["pod"] in csv_ready:
            assert abs(line["batch_to_ready_seconds"] - csv_ready[line["pod"]]) < 0.002, line
    for group in load(output / "results.json")["groups"]:
        assert group["all_rewards_seconds"] is None or 0 < group["all_rewards_seconds"] < 30
        assert 0 <= group["spread_seconds"] < 30, group


def test_dry_run_prints_every_job(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make()
    flags, output = images_run(tmp_path, dry_run=True, parallelism=3, quiet=False)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    jobs = [item for item in listing["items"] if item["kind"] == "Job"]
    assert [job["metadata"]["name"] for job in jobs] == [
        "rollout-image-1",
        "rollout-image-2",
        "rollout-image-3",
    ]
    assert [job["spec"]["template"]["spec"]["containers"][0]["image"] for job in jobs] == [
        "docker.io/swebench/one:1",
        rl_batch_demo.DEFAULT_IMAGE,
        "docker.io/other/two:2",
    ]
    assert [
        job["spec"]["template"]["metadata"]["annotations"][rl_batch_demo.EPISODE_INDEXES_ANNOTATION]
        for job in jobs
    ] == ["0-1,4-5", "2-3", "6-7"]
    assert not output.exists()
    assert not [r for r in emulator.requests if r.get("method") == "POST"]


def test_a_refused_job_fails_the_run_before_any_job_is_created(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    # The API server refuses the Jobs (as an admission policy that allows only some registries would).
    emulator = make(api_errors={"count": 1, "match": "dryRun=All", "status": 403})
    flags, output = images_run(tmp_path)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 1, result.stderr
    assert "refuses Job rollout-image-1 (image docker.io/swebench/one:1)" in result.stderr
    assert "none of the batch's 3 Jobs was created" in result.stderr
    namespace = load(output / "receipt.json")["namespace"]
    assert not [job for job in emulator.list("jobs", namespace)]
    assert "jobs" not in load(output / "receipt.json")


def test_allow_failures_above_a_small_jobs_episodes_holds_for_the_batch(
    cluster: Any, tmp_path: Path
) -> None:
    """--allow-failures 3 with a Job of 2 episodes (task d's image): the API refuses a Job's
    maxFailedIndexes above its completions, so each Job gets K or its episodes, the fewer, and K
    holds for the whole batch; and a Job refused all the same leaves no empty namespace."""
    kubectl, make = cluster
    emulator = make()
    flags, output = images_run(tmp_path, allow_failures=3)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    jobs = {job["metadata"]["name"]: job["spec"] for job in load(output / "job.json")["items"]}
    assert {
        name: (spec["completions"], spec["maxFailedIndexes"]) for name, spec in jobs.items()
    } == {
        "rollout-image-1": (4, 3),
        "rollout-image-2": (2, 2),
        "rollout-image-3": (2, 2),
    }
    assert [line["failure_class"] for line in rewards_of(output)] == [None] * 8
    # Refused all the same (an admission policy, say): nothing of the run stays in the cluster.
    refusing = make(api_errors={"count": 1, "match": "dryRun=All", "status": 403})
    (tmp_path / "refused").mkdir()
    flags, output = images_run(tmp_path / "refused", allow_failures=3)
    result = run_tool(refusing, kubectl, "run", **flags)
    assert result.returncode == 1, result.stderr
    assert "none of the batch's 3 Jobs was created" in result.stderr
    namespace = load(output / "receipt.json")["namespace"]
    assert f"its namespace {namespace} was deleted" in result.stderr
    assert run_namespaces(refusing) == []


def test_run_batch_with_per_task_images(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make()
    script = write_script(tmp_path, IMAGE_EPISODE)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in emulator.env().items():
            patch.setenv(key, value)
        results = rl_batch_demo.run_batch(
            TASKS,
            output=tmp_path / "py",
            episode_script=str(script),
            kubectl=kubectl,
            image_map=["docker.io/other=mirror.local/other"],
        )
    assert results["jobs"] == 3
    assert [row["image"] for row in results["rewards"]] == [
        "docker.io/swebench/one:1",
        rl_batch_demo.DEFAULT_IMAGE,
        "docker.io/swebench/one:1",
        "mirror.local/other/two:2",
    ]
    assert [row["task_seen"] for row in results["rewards"]] == ["a", "b", "c", "d"]
    # run_batch cleans up by default: every Job went with the namespace.
    assert not emulator.list("jobs")


def test_need_with_several_images_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # --group-size 1 (the last one given wins): with images_run's groups of 2, --need would be
    # refused for --group-size before the images are looked at.
    flags, output = images_run(tmp_path, group_size=1, need=3)
    with pytest.raises(SystemExit) as exit_info:
        rl_batch_demo.main(["run", *tool_flags(**flags)])
    assert exit_info.value.code == 2
    assert (
        "--need cannot hold with tasks of 3 images: each image runs its own Job, and a Job's "
        "successPolicy counts only its own episodes"
    ) in " ".join(capsys.readouterr().err.split())
    assert not output.exists()


# The nodes' images: one already on every node, two to pull (a second apiece), one that does not exist.
PRESENT, COLD_ONE, COLD_TWO, MISSING = (
    "docker.io/swebench/present:1",
    "docker.io/swebench/one:1",
    "docker.io/other/two:2",
    "registry.invalid/nope:1",
)
IMAGES = {
    "registry": {PRESENT: 10_000_000, COLD_ONE: 50_000_000, COLD_TWO: 60_000_000},
    "present": {PRESENT: True},
    "pull_bytes_per_second": 50e6,
}


@pytest.fixture
def image_cluster(tmp_path: Path, require_e2e: Any):
    """(kubectl 1.35, make(**faults)): two nodes with image stores (IMAGES)."""
    kubectl = require_e2e("1.35")
    with emulators(tmp_path, timing={"job_backoff_base": 0.5}, nodes=2, images=IMAGES) as make:
        yield kubectl, make


def test_pulls_are_measured_per_episode_and_per_image(image_cluster: Any, tmp_path: Path) -> None:
    kubectl, make = image_cluster
    emulator = make()
    tasks = [
        {"id": "p", "image": PRESENT},
        {"id": "one", "image": COLD_ONE},
        {"id": "two", "image": COLD_TWO},
    ]
    flags, output = images_run(tmp_path, parallelism=6, tasks=tasks)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    images = results["images"]
    assert list(images) == [PRESENT, COLD_ONE, COLD_TWO]
    assert (
        images[PRESENT]["episodes"] == 2
        and images[PRESENT]["present"] == 2
        and images[PRESENT]["pulled"] == 0
    )
    assert images[PRESENT]["image_pull_p50_seconds"] is None
    for image, size in ((COLD_ONE, 50_000_000), (COLD_TWO, 60_000_000)):
        entry = images[image]
        # Each node pulls an image once; a second pod of it on that node waits for that pull (pulled),
        # or finds it present if it came after.
        assert (
            entry["episodes"] == 2
            and entry["pulled"] >= 1
            and entry["pulled"] + entry["present"] == 2
        )
        assert entry["image_pull_max_seconds"] >= entry["image_pull_p50_seconds"] > 0
        assert entry["image_size_bytes"] == size
        assert (
            entry["image_pull_waiting_p50_seconds"] is not None
            and entry["image_pull_waiting_p50_seconds"] >= 0
        )
    assert results["phases"]["image_pull"]["samples"] == 6
    assert results["image_cache"] == {
        "present": 2 + sum(images[i]["present"] for i in (COLD_ONE, COLD_TWO)),
        "pulled": images[COLD_ONE]["pulled"] + images[COLD_TWO]["pulled"],
        "unknown": 0,
    }
    # The start paths split by image as well as by pulled / present.
    assert any(
        path.startswith(f"image {COLD_ONE}, image pulled")
        for path in results["phases_by_start_path"]
    )
    rows = {row["pod"]: row for row in rewards_of(output)}
    lines = list(csv.DictReader(io.StringIO((output / "episodes.csv").read_text())))
    assert len(lines) == 6
    for name in ("image", "image_pull_seconds", "image_pull_waiting_seconds"):
        assert name in lines[0]
    events = load(output / "events.json")["items"]
    pulled_messages = {
        e["involvedObject"]["name"]: e["message"] for e in events if e["reason"] == "Pulled"
    }
    for cells in lines:
        assert cells["image"] == rows[cells["pod"]]["image"]
        pull = rl_batch_demo.parse_pulled_message(pulled_messages[cells["pod"]])
        assert pull is not None and pull.image == cells["image"]
        if cells["image_cache"] == "present":
            assert (
                float(cells["image_pull_seconds"]) == 0
                and float(cells["image_pull_waiting_seconds"]) == 0
            )
        else:  # the kubelet's own figures, as its message gives them
            assert pull.pulled and float(cells["image_pull_waiting_seconds"]) == pytest.approx(
                pull.waiting_seconds
            )
            assert float(cells["image_pull_seconds"]) > 0
    # Each node pulled one image at a time, as the kubelet's default (held on the real one too).
    nodes = {row["pod"]: row["node"] for row in results["pods"]}
    assert_pulls_one_at_a_time(events, nodes)
    table = tool(emulator, kubectl, "report", str(output))
    assert table.returncode == 0 and "image_pull" in table.stderr + table.stdout


def test_a_missing_image_is_retried_then_fails_as_infrastructure(
    image_cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = image_cluster
    emulator = make()
    tasks = [{"id": "ok", "image": PRESENT}, {"id": "gone", "image": MISSING}]
    flags, output = images_run(tmp_path, retries=1, allow_failures=2, pull_timeout=10, tasks=tasks)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == rl_batch_demo.EXIT_PARTIAL, result.stderr
    rows = rewards_of(output)
    assert [row["failure_class"] for row in rows] == [
        None,
        None,
        "infrastructure",
        "infrastructure",
    ]
    for row in rows[2:]:
        assert row["image"] == MISSING and row["attempts"] == 2 and row["valid"] is False
        assert f"image {MISSING} not pulled" in row["failure"]
        assert (
            f'Failed to pull image "{MISSING}"' in row["failure"] and "not found" in row["failure"]
        )
        assert (
            len(row["earlier_attempts"]) == 1
            and row["earlier_attempts"][0]["failure_class"] == "infrastructure"
        )
    pods = load(output / "pods.json")["items"]
    for pod in pods:
        if pod["spec"]["containers"][0]["image"] == MISSING:
            assert pod["spec"]["activeDeadlineSeconds"] == 10
            assert (
                pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "DeadlineExceeded"
            )
    results = load(output / "results.json")
    assert (
        results["images"][MISSING]["episodes"] == 2
        and results["images"][MISSING]["failed_episodes"] == 2
    )
    assert results["images"][PRESENT]["failed_episodes"] == 0
    assert results["failures_by_class"]["infrastructure"] == 2


def test_prepull_makes_every_image_present_before_the_batch(
    image_cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = image_cluster
    emulator = make()
    tasks = [
        {"id": "p", "image": PRESENT},
        {"id": "one", "image": COLD_ONE},
        {"id": "two", "image": COLD_TWO},
    ]
    flags, output = images_run(tmp_path, parallelism=6, prepull=True, tasks=tasks, quiet=False)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    assert "Pre-pulled 3 images on 2 nodes in" in result.stderr
    results = load(output / "results.json")
    prepull = results["prepull"]
    assert (
        prepull["nodes"] == 2
        and prepull["images"] == 3
        and prepull["pods"] == 6
        and prepull["failures"] == []
    )
    assert prepull["seconds"] > 0
    # Each node pulled the two cold images and found the third.
    assert prepull["image_cache"] == {"present": 2, "pulled": 4, "unknown": 0}
    # Then every episode found its image on its node.
    assert results["image_cache"] == {"present": 6, "pulled": 0, "unknown": 0}
    assert all(
        entry["pulled"] == 0 and entry["present"] == 2 for entry in results["images"].values()
    )
    saved = load(output / "prepull.json")
    assert saved["node_names"] == ["emu-node-1", "emu-node-2"]
    assert saved["image_names"] == [PRESENT, COLD_ONE, COLD_TWO]
    pods = saved["pod_states"]["items"]
    assert {(pod["spec"]["nodeName"], pod["spec"]["containers"][0]["image"]) for pod in pods} == {
        (node, image) for node in saved["node_names"] for image in saved["image_names"]
    }
    assert all(pod["status"]["phase"] == "Succeeded" for pod in pods)
    assert all(pod["spec"]["containers"][0]["command"] == ["python", "-c", "pass"] for pod in pods)
    # Its pods are the run's, in its namespace, and go with it.
    namespace = load(output / "receipt.json")["namespace"]
    assert {pod["metadata"]["namespace"] for pod in pods} == {namespace}
    assert tool(emulator, kubectl, "report", str(output)).returncode == 0
    assert run_tool(emulator, kubectl, "cleanup", output=output).returncode == 0
    assert not emulator.list("pods", namespace)


def test_prepull_names_an_image_that_will_not_pull(image_cluster: Any, tmp_path: Path) -> None:
    kubectl, make = image_cluster
    emulator = make()
    tasks = [{"id": "ok", "image": PRESENT}, {"id": "gone", "image": MISSING}]
    # A deadline with room for a present image's pod on a loaded machine: only the missing one fails.
    flags, output = images_run(
        tmp_path, prepull=True, pull_timeout=8, retries=0, allow_failures=2, tasks=tasks
    )
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == rl_batch_demo.EXIT_PARTIAL, result.stderr
    failures = load(output / "results.json")["prepull"]["failures"]
    missing = [f for f in failures if f["image"] == MISSING]
    assert sorted(f["node"] for f in missing) == ["emu-node-1", "emu-node-2"]
    assert all(f'Failed to pull image "{MISSING}"' in f["why"] for f in missing)


def test_a_run_of_several_jobs_is_listed_and_reaped_without_its_receipt(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    emulator = make()
    flags, output = images_run(tmp_path)
    result = run_tool(emulator, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    namespace = load(output / "receipt.json")["namespace"]
    # Each Job carries the tool's label itself: the API server copies the template's labels onto
    # a Job only when the Job has none, and these carry the batch's.
    for job in load(output / "job.json")["items"]:
        assert job["metadata"]["labels"]["app"] == rl_batch_demo.APP_LABEL
    listed = run_tool(emulator, kubectl, "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (run,) = [item for item in json.loads(listed.stdout) if item["namespace"] == namespace]
    assert (run["state"], run["episodes"], run["succeeded"]) == ("succeeded", 8, 8)
    (output / "receipt.json").unlink()  # found and proven from the cluster alone
    reaped = run_tool(emulator, kubectl, "cleanup", stale="1s")
    assert reaped.returncode == 0, reaped.stderr
    assert f"Deleted {namespace}: succeeded" in reaped.stdout, reaped.stdout
    left = [ns for ns in run_namespaces(emulator) if ns["metadata"]["name"] == namespace]
    assert all(ns["metadata"].get("deletionTimestamp") for ns in left), left
