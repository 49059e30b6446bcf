"""Unit tests of an image per task: the task field, grouping, --image-map, the shares of
--parallelism, each image's Job, and a batch's Jobs read as one."""

from __future__ import annotations

import pytest

import all_names as demo

NAMESPACE = "agc-rl-0123456789ab"


def tasks_of(*images: str | None) -> list[demo.Task]:
    return [demo.Task(str(n), n, "{}", image) for n, image in enumerate(images, start=1)]


def test_a_task_names_its_image() -> None:
    tasks = demo.parse_tasks(['{"id": "a", "image": "repo/one:1"}', '{"id": "b"}'])
    assert [task.image for task in tasks] == ["repo/one:1", None]
    for bad in ('""', '" repo/one:1"', "3", "null"):
        with pytest.raises(ValueError, match="line 1: the task image must be a non-empty string"):
            demo.parse_tasks([f'{{"image": {bad}}}'])


def test_tasks_are_grouped_by_image_in_order_of_first_appearance() -> None:
    groups = demo.image_groups(tasks_of("b", None, "b", "c", None), 10, 2, "default:1")
    assert groups == [
        demo.ImageGroup("b", (0, 1, 4, 5)),
        demo.ImageGroup("default:1", (2, 3, 8, 9)),
        demo.ImageGroup("c", (6, 7)),
    ]
    assert demo.image_groups([], 3, 1, "default:1") == [demo.ImageGroup("default:1", (0, 1, 2))]


def test_image_map_rewrites_the_longest_prefix_once() -> None:
    image_map = demo.parse_image_map(
        ["docker.io=mirror.local", "docker.io/swebench=registry.internal/swebench"]
    )
    assert (
        demo.rewrite_image("docker.io/swebench/a:1", image_map) == "registry.internal/swebench/a:1"
    )
    assert (
        demo.rewrite_image("docker.io/library/python:3", image_map)
        == "mirror.local/library/python:3"
    )
    assert demo.rewrite_image("quay.io/x:1", image_map) == "quay.io/x:1"
    # Once: a rewritten reference that starts with a FROM again is not rewritten again.
    assert demo.rewrite_image("a/x", demo.parse_image_map(["a=ab"])) == "ab/x"
    assert demo.task_images(tasks_of("a/x", None), "a/default", demo.parse_image_map(["a=ab"])) == [
        "ab/x",
        "a/default",
    ]
    # At a boundary of the reference's parts only.
    swebench = demo.parse_image_map(["docker.io/swebench=registry.internal/swebench"])
    assert demo.rewrite_image("docker.io/swebench-extra/a:1", swebench) == (
        "docker.io/swebench-extra/a:1"
    )
    assert demo.rewrite_image("docker.io/swebench:1", swebench) == "registry.internal/swebench:1"
    # Docker Hub's short forms are matched in full, as containerd resolves them.
    assert demo.rewrite_image("swebench/a:1", swebench) == "registry.internal/swebench/a:1"
    assert demo.rewrite_image("python:3", image_map) == "mirror.local/library/python:3"
    assert demo.rewrite_image("localhost/x:1", image_map) == "localhost/x:1"
    assert demo.rewrite_image("registry.internal:5000/x", image_map) == "registry.internal:5000/x"
    # A short FROM stands for its full form too, and the longest full prefix wins.
    python = demo.parse_image_map(["docker.io=mirror.local", "python=special.local/python"])
    for written in ("python:3", "docker.io/library/python:3", "library/python:3"):
        assert demo.rewrite_image(written, python) == "special.local/python:3", written
    assert demo.rewrite_image("pythonista:1", python) == "mirror.local/library/pythonista:1"
    short = demo.parse_image_map(["swebench=localhost:5000/swebench"])
    assert demo.rewrite_image("docker.io/swebench/a:1", short) == "localhost:5000/swebench/a:1"
    for bad in ("nothing", "=to", "from=", " from=to"):
        with pytest.raises(ValueError, match="is not FROM=TO"):
            demo.parse_image_map([bad])
    with pytest.raises(ValueError, match="mapped twice"):
        demo.parse_image_map(["a=b", "a=c"])


@pytest.mark.parametrize(
    "parallelism, sizes, shares",
    [
        (4, [4, 2, 2], [2, 1, 1]),
        (8, [4, 2, 2], [4, 2, 2]),
        (3, [8, 1, 1], [1, 1, 1]),
        (5, [8, 1, 1], [3, 1, 1]),
        (10, [3, 3, 4], [3, 3, 4]),
        (7, [6, 6], [4, 3]),
        (2, [1, 5], [1, 1]),
    ],
)
def test_parallelism_is_shared_by_episodes(
    parallelism: int, sizes: list[int], shares: list[int]
) -> None:
    got = demo.parallelism_shares(parallelism, sizes)
    assert got == shares
    assert sum(got) <= parallelism and all(1 <= share <= size for share, size in zip(got, sizes))


def test_more_images_than_pods_at_once_is_refused() -> None:
    with pytest.raises(ValueError, match="3 images need at least one pod each"):
        demo.parallelism_shares(2, [1, 1, 1])


def test_index_ranges() -> None:
    assert demo.index_ranges([8, 0, 1, 2, 3, 9, 11]) == "0-3,8-9,11"
    assert demo.index_list(demo.index_ranges(range(5))) == set(range(5))


def settings(**changes: object) -> demo.Settings:
    base: dict = {
        "count": 8,
        "parallelism": 4,
        "image": "default:1",
        "runtime": "cube",
        "timeout": 240,
        "builtin": False,
        "group_size": 2,
        "rollout": True,
    }
    return demo.Settings(**dict(base, **changes))


def test_one_job_per_image_with_its_episodes() -> None:
    tasks = [
        demo.Task(str(n), n, f'{{"n": {n}}}', image)
        for n, image in enumerate(["b", None, "b", "c"])
    ]
    plan = demo.plan_run(NAMESPACE, "0123456789ab", settings(), "print()", tasks)
    jobs = plan.jobs["rollout"]
    assert [job["metadata"]["name"] for job in jobs] == [
        "rollout-image-1",
        "rollout-image-2",
        "rollout-image-3",
    ]
    first = jobs[0]
    assert first["metadata"]["labels"] == {"app": demo.APP_LABEL, demo.BATCH_LABEL: "rollout"}
    assert first["spec"]["completions"] == 4 and first["spec"]["parallelism"] == 2
    assert first["spec"]["completionMode"] == "Indexed"
    template = first["spec"]["template"]
    assert template["metadata"]["labels"][demo.BATCH_LABEL] == "rollout"
    assert template["metadata"]["annotations"] == {
        demo.EPISODE_INDEXES_ANNOTATION: "0-1,4-5",
        demo.EPISODE_EXIT_ANNOTATION: "recorded",
    }
    container = template["spec"]["containers"][0]
    assert container["image"] == "b"
    assert container["command"] == ["python", "-B", "/demo/launcher.py"]
    assert plan.setup[0]["data"]["launcher.py"] == demo.EPISODE_LAUNCHER
    assert [env["name"] for env in container["env"]] == ["EPISODE_ID", "EPISODE_INDEXES"]
    projected = next(v for v in template["spec"]["volumes"] if v["name"] == demo.TASKS_VOLUME)
    items = [
        item
        for source in projected["projected"]["sources"]
        for item in source["configMap"]["items"]
    ]
    assert [(item["key"], item["path"]) for item in items] == [
        ("task-0.json", "0.json"),
        ("task-0.json", "1.json"),
        ("task-2.json", "4.json"),
        ("task-2.json", "5.json"),
    ]
    # Every Job in the listing, in creation order after the setup.
    assert plan.objects()[-3:] == jobs


def test_each_jobs_max_failed_indexes_is_the_allowance_or_its_episodes() -> None:
    """The API refuses maxFailedIndexes above a Job's completions; K holds for the whole batch."""
    tasks = [demo.Task(str(n), n, "{}", image) for n, image in enumerate(["b", None, None, None])]
    plan = demo.plan_run(
        NAMESPACE, "0123456789ab", settings(allow_failures=3, retries=1), "print()", tasks
    )
    specs = [job["spec"] for job in plan.jobs["rollout"]]
    assert [
        (s["completions"], s["maxFailedIndexes"], s["backoffLimitPerIndex"]) for s in specs
    ] == [
        (2, 2, 1),
        (6, 3, 1),
    ]


def test_settings_keep_the_image_options_in_run_json() -> None:
    kept = settings(
        task_images=("b", "default:1"),
        image_map=(("docker.io", "mirror"),),
        pull_timeout=30,
        prepull=True,
        context="c",
        namespace=NAMESPACE,
        batches=(demo.BatchEntry("rollout", True, ".", ("rollout-image-1", "rollout-image-2")),),
    )
    saved = kept.saved()
    assert saved["task_images"] == ["b", "default:1"] and saved["image_map"] == {
        "docker.io": "mirror"
    }
    assert saved["pull_timeout"] == 30 and saved["prepull"] is True
    assert saved["batches"] == [
        {
            "job": "rollout",
            "measured": True,
            "dir": ".",
            "jobs": ["rollout-image-1", "rollout-image-2"],
        }
    ]
    assert demo.Settings.from_saved(saved) == kept
    plain = settings(
        context="c", namespace=NAMESPACE, batches=(demo.BatchEntry("rollout", True, "."),)
    ).saved()
    assert "image_map" not in plain and "prepull" not in plain and "jobs" not in plain["batches"][0]


def test_one_image_keeps_the_one_job_of_today() -> None:
    tasks = [demo.Task(str(n), n, "{}", None) for n in range(4)]
    plan = demo.plan_run(NAMESPACE, "0123456789ab", settings(), "print()", tasks)
    (job,) = plan.jobs["rollout"]
    assert job["metadata"] == {"name": "rollout", "namespace": NAMESPACE}
    # A rollout's episode runs through the launcher, as with several Jobs, without their indexes.
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-B", "/demo/launcher.py"]
    assert [env["name"] for env in container["env"]] == ["EPISODE_ID", "EPISODE_INDEX", "TASK_FILE"]
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        demo.EPISODE_EXIT_ANNOTATION: "recorded"
    }


def test_pull_timeout_and_episode_timeout_share_the_pod_deadline() -> None:
    # A rollout's launcher keeps the episode's own time; its pod's deadline leaves 30 s to start.
    assert demo.pod_deadline(settings(pull_timeout=30, episode_timeout=60)) == 120
    assert demo.pod_deadline(settings(pull_timeout=30)) == 30
    assert demo.pod_deadline(settings()) is None
    # Without a rollout, no launcher: the pod's deadline is the episode's, as the guide's.
    assert demo.pod_deadline(settings(rollout=False, episode_timeout=60)) == 60
    job = demo.batch_job(NAMESPACE, settings(pull_timeout=45), "rollout", [])
    assert job["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 45


def pod(job: str, index: int, indexes: str | None) -> dict:
    annotations = {demo.COMPLETION_INDEX_ANNOTATION: str(index)}
    if indexes is not None:
        annotations[demo.EPISODE_INDEXES_ANNOTATION] = indexes
    return {"metadata": {"name": f"{job}-{index}-abcde", "annotations": annotations}}


def test_a_pod_index_is_the_run_wide_index() -> None:
    assert demo.pod_index(pod("rollout", 3, None)) == 3
    assert demo.pod_index(pod("rollout-image-1", 2, "0-1,4-5")) == 4
    assert demo.pod_index(pod("rollout-image-1", 4, "0-1,4-5")) is None  # not one of its Job's


def job(
    name: str,
    indexes: str,
    completions: int,
    conditions: list[dict],
    created: str = "2026-01-01T00:00:01Z",
    status: dict | None = None,
    version: str = "10",
) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "resourceVersion": version,
        },
        "spec": {
            "completions": completions,
            "parallelism": 1,
            "template": {"metadata": {"annotations": {demo.EPISODE_INDEXES_ANNOTATION: indexes}}},
        },
        "status": dict(status or {}, conditions=conditions),
    }


def done(kind: str, at: str, reason: str = "") -> dict:
    return {"type": kind, "status": "True", "lastTransitionTime": at, "reason": reason}


def test_a_batch_of_jobs_reads_as_one_job() -> None:
    jobs = demo.BatchJobs("rollout", ["rollout-image-1", "rollout-image-2"])
    first = job(
        "rollout-image-1",
        "0-1,4-5",
        4,
        [done("Complete", "2026-01-01T00:00:09Z")],
        status={"succeeded": 3, "failed": 1, "failedIndexes": "3"},
        version="12",
    )
    view = jobs.see(first)
    assert (
        view is not None and demo.job_finished(view) is None
    )  # the other Job has not been seen end
    assert view["status"]["failedIndexes"] == "5"  # its index 3 is the run's episode 5
    second = job(
        "rollout-image-2",
        "2-3",
        2,
        [done("Failed", "2026-01-01T00:00:07Z", "BackoffLimitExceeded")],
        created="2026-01-01T00:00:02Z",
        status={"succeeded": 1, "failed": 1, "failedIndexes": "0"},
        version="9",
    )
    view = jobs.see(second)
    assert (
        view["metadata"]["name"] == "rollout"
        and view["metadata"]["creationTimestamp"] == "2026-01-01T00:00:01Z"
    )
    assert view["metadata"]["resourceVersion"] == "12"
    assert view["spec"]["completions"] == 6 and view["spec"]["parallelism"] == 2
    assert view["status"]["succeeded"] == 4 and view["status"]["failed"] == 2
    assert view["status"]["failedIndexes"] == "2,5"
    assert demo.job_finished(view) == "Failed"
    failed = demo.condition(view, "Failed")
    assert (
        failed["reason"] == "BackoffLimitExceeded"
        and failed["lastTransitionTime"] == "2026-01-01T00:00:09Z"
    )
    assert jobs.see({"metadata": {"name": "rollout-warmup"}}) is None  # not one of the batch's
    saved = jobs.saved()
    assert saved["kind"] == "List" and [j["metadata"]["name"] for j in saved["items"]] == [
        "rollout-image-1",
        "rollout-image-2",
    ]
    assert demo.saved_batch_job(saved, "rollout") == view
    assert jobs.pod_selector() == f"{demo.BATCH_LABEL}=rollout"
    assert jobs.job_selector() == ["-l", f"{demo.BATCH_LABEL}=rollout"]


def test_a_batch_is_complete_when_every_job_is() -> None:
    jobs = demo.BatchJobs("rollout", ["rollout-image-1", "rollout-image-2"])
    jobs.see(
        job(
            "rollout-image-1",
            "0-1",
            2,
            [
                done("SuccessCriteriaMet", "2026-01-01T00:00:05Z"),
                done("Complete", "2026-01-01T00:00:06Z"),
            ],
        )
    )
    view = jobs.see(
        job(
            "rollout-image-2",
            "2-3",
            2,
            [
                done("SuccessCriteriaMet", "2026-01-01T00:00:07Z"),
                done("Complete", "2026-01-01T00:00:08Z"),
            ],
        )
    )
    assert demo.job_finished(view) == "Complete"
    assert demo.condition(view, "Complete")["lastTransitionTime"] == "2026-01-01T00:00:08Z"
    assert (
        demo.condition(view, "SuccessCriteriaMet")["lastTransitionTime"] == "2026-01-01T00:00:07Z"
    )


def test_one_job_reads_as_itself() -> None:
    jobs = demo.BatchJobs("rollout", ["rollout"])
    only = {"metadata": {"name": "rollout"}, "status": {}}
    assert jobs.see(only) is only and jobs.saved() is only
    assert jobs.pod_selector() == "job-name=rollout"
    assert jobs.job_selector() == ["--field-selector", "metadata.name=rollout"]


def test_rows_name_their_image() -> None:
    rows = demo.episode_rows(
        4, {"metadata": {}}, [], {}, False, ["a", "b"], 2, images=["one", "two"]
    )
    assert [row["image"] for row in rows] == ["one", "one", "two", "two"]
    assert demo.group_images(settings(count=2, image="x")) == ["x", "x"]
    assert demo.group_images(settings(task_images=("a", "b"))) == ["a", "b"]


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1.5s", 1.5),
        ("850ms", 0.85),
        ("1m2.5s", 62.5),
        ("0s", 0.0),
        ("2h0m0s", 7200.0),
        ("1.234567ms", 0.001234567),
        ("500\u00b5s", 0.0005),
        ("12ns", 1.2e-8),
        ("3m", 180.0),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert demo.parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1.5", "s", "1.5 s", "1x", "ms850", "1s2", "--1s"])
def test_not_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a Go duration"):
        demo.parse_go_duration(text)


def test_the_kubelets_pulled_messages() -> None:
    pull = demo.parse_pulled_message(
        'Successfully pulled image "docker.io/swebench/a:1" in 1.234s '
        "(2.5s including waiting). Image size: 543804759 bytes."
    )
    assert pull == demo.ImagePull("docker.io/swebench/a:1", True, 1.234, 2.5, 543804759)
    assert pull.waiting_seconds == pytest.approx(1.266)
    minutes = demo.parse_pulled_message(
        'Successfully pulled image "a:1" in 850ms (1m2.5s including waiting). Image size: 7 bytes.'
    )
    assert (
        minutes.pull_seconds == 0.85 and minutes.total_seconds == 62.5 and minutes.size_bytes == 7
    )
    # Before Kubernetes 1.30 the kubelet gave the pull's time alone.
    old = demo.parse_pulled_message('Successfully pulled image "busybox" in 1.661s')
    assert old == demo.ImagePull("busybox", True, 1.661, None, None) and old.waiting_seconds is None
    assert demo.parse_pulled_message(
        'Container image "python:3.12-alpine" already present on machine'
    ) == demo.ImagePull("python:3.12-alpine", False)
    assert demo.parse_pulled_message(
        'Container image "x:1" already present on machine and can be accessed by the pod'
    ) == demo.ImagePull("x:1", False)
    assert demo.parse_pulled_message('Pulling image "x"') is None


def test_image_pulls_take_the_episode_containers_first_pulled_event() -> None:
    def event(pod: str, message: str, field_path: str = "spec.containers{episode}") -> dict:
        return {
            "reason": "Pulled",
            "message": message,
            "involvedObject": {"kind": "Pod", "name": pod, "fieldPath": field_path},
        }

    pulls = demo.image_pulls(
        demo.event_records(
            [
                event(
                    "a",
                    'Successfully pulled image "x:1" in 1s (3s including waiting). Image size: 9 bytes.',
                ),
                event("a", 'Container image "x:1" already present on machine'),
                event(
                    "b",
                    'Container image "sidecar:1" already present on machine',
                    "spec.containers{sidecar}",
                ),
            ]
        )
    )
    assert pulls == {"a": demo.ImagePull("x:1", True, 1.0, 3.0, 9)}


def test_image_figures_per_image() -> None:
    def record(image: str, cache: str, pull: float | None, report: demo.ImagePull | None) -> dict:
        return {
            "image": image,
            "image_cache": cache,
            "image_pull": report,
            "phases": {"image_pull": None if pull is None else (pull, 0.2)},
        }

    records = [
        record("x", "pulled", 2.0, demo.ImagePull("x", True, 1.0, 2.0, 100)),
        record("x", "pulled", 4.0, demo.ImagePull("x", True, 0.02, 3.9, 100)),
        record("x", "present", 0.0, demo.ImagePull("x", False)),
        record("y", "present", 0.0, demo.ImagePull("y", False)),
    ]
    figures = demo.image_figures(records)
    assert figures["x"] == {
        "episodes": 3,
        "pulled": 2,
        "present": 1,
        "image_pull_p50_seconds": 3.0,
        "image_pull_max_seconds": 4.0,
        "image_pull_waiting_p50_seconds": 2.44,
        "image_pull_waiting_max_seconds": 3.88,
        "image_size_bytes": 100,
    }
    assert figures["y"]["image_pull_p50_seconds"] is None and figures["y"]["present"] == 1
    rows = [{"image": "x", "failure_class": None}] * 3 + [
        {"image": "y", "failure_class": None},
        {"image": "z", "failure_class": "infrastructure"},
    ]
    with_rows = demo.image_figures(records, rows)
    assert (
        with_rows["z"]["episodes"] == 1
        and with_rows["z"]["failed_episodes"] == 1
        and with_rows["z"]["pulled"] == 0
    )
    assert with_rows["x"]["failed_episodes"] == 0
