"""An image per task on a real control plane: the real kube-apiserver takes each image's Job (its
server-side dry run first) and serves the batch's label selectors, and the real Job controller
runs every Job, giving each pod its JOB_COMPLETION_INDEX, which the episode launcher turns into
the run-wide index."""

from __future__ import annotations

import pytest

import all_names as rl_batch_demo
from e2e_support import load, run_tool
from test_e2e_images import TASKS, images_run, rewards_of

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster]


def test_one_job_per_image_on_the_real_job_controller(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    flags, output = images_run(
        tmp_path, parallelism=3, image_map=["docker.io/other=mirror.local/other"]
    )
    result = run_tool(cluster, kubectl, "run", **flags)
    assert result.returncode == 0, result.stderr
    rows = rewards_of(output)
    one, two = "docker.io/swebench/one:1", "mirror.local/other/two:2"
    assert [row["image"] for row in rows] == [
        one,
        one,
        rl_batch_demo.DEFAULT_IMAGE,
        rl_batch_demo.DEFAULT_IMAGE,
        one,
        one,
        two,
        two,
    ]
    assert [row["episode_index_seen"] for row in rows] == list(range(8))
    assert [row["task_seen"] for row in rows] == [task["id"] for task in TASKS for _ in range(2)]
    jobs = load(output / "job.json")
    assert [job["metadata"]["name"] for job in jobs["items"]] == [
        "rollout-image-1",
        "rollout-image-2",
        "rollout-image-3",
    ]
    assert [job["spec"]["parallelism"] for job in jobs["items"]] == [1, 1, 1]
    assert all(rl_batch_demo.job_finished(job) == "Complete" for job in jobs["items"])
    receipt = load(output / "receipt.json")
    assert receipt["jobs"] == {
        job["metadata"]["name"]: job["metadata"]["uid"] for job in jobs["items"]
    }
    results = load(output / "results.json")
    assert results["jobs"] == 3 and results["successful_episodes"] == 8
    assert set(results["images"]) == {one, two, rl_batch_demo.DEFAULT_IMAGE}
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0
    assert not cluster.list("jobs", receipt["namespace"])
