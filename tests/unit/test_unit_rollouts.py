"""Unit tests of the rollout functions: tasks, their ConfigMaps and volume, the Job's failure
policy, the failure classifier (one failing example per class), one row per episode, groups,
attempts and censored percentiles; and the emulator's podFailurePolicy matching."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import pytest

import kube_emulator
import all_names as demo
from test_cli import usage_error
from test_unit import (
    JOB_CREATED,
    NAMESPACE,
    T0,
    log_text,
    make_job,
    make_pod,
    ready_event,
    reward_event,
    stamp,
)

INDEX = "batch.kubernetes.io/job-completion-index"


PYTHON_TRACEBACK = """Traceback (most recent call last):
  File "/demo/episode.py", line 9, in <module>
    score(task)
  File "/demo/episode.py", line 5, in score
    return task["answer"]
KeyError: 'answer'
"""
# What `python /demo/episode.py` prints for a script that does not compile: no "Traceback" line.
SYNTAX_ERROR_LOG = """  File "/demo/episode.py", line 1
    print("hello"
         ^
SyntaxError: '(' was never closed
"""


def indexed_pod(name: str, index: int, failures: int = 0, **options: Any) -> dict:
    pod = make_pod(name, **options)
    pod["metadata"]["annotations"] = {INDEX: str(index)}
    if failures:
        pod["metadata"]["annotations"][demo.INDEX_FAILURE_COUNT_ANNOTATION] = str(failures)
    return pod


def honest_log(
    name: str, ready_at: float = T0 + 3.0, reward_at: float = T0 + 5.0, **fields: Any
) -> str:
    return log_text(ready_event(name, ready_at), reward_event(name, reward_at, **fields))


def failed_job(reason: str) -> dict:
    job = make_job(end="Failed", criteria_at=None)
    job["status"]["conditions"][-1]["reason"] = reason
    return job


# --------------------------------------------------------------------------
# Tasks in.


def test_tasks_take_their_id_field_else_their_line_number() -> None:
    tasks = demo.parse_tasks(['{"id": "a", "x": 1}\n', "\n", '  {"x": 2}  \n', '{"id": 7}\n'])
    # Always strings, so rewards.jsonl never mixes "a" with 3.
    assert tasks == [
        demo.Task("a", 1, '{"id": "a", "x": 1}'),
        demo.Task("3", 3, '{"x": 2}'),
        demo.Task("7", 4, '{"id": 7}'),
    ]
    assert [task.task_id for task in demo.parse_tasks(['{"id": 2.5}', '{"id": true}'])] == [
        "2.5",
        "true",
    ]


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"x": 1}\n', "not json\n"], "line 2 is not JSON"),
        (["[1, 2]\n"], "line 1 is not a JSON object"),
        (['{"id": {"a": 1}}\n'], "line 1: the task id must be a string or a number"),
        (['{"id": "a"}\n', '{"id": "a"}\n'], "task id 'a' appears more than once"),
        (['{"id": 7}\n', '{"id": "7"}\n'], "task id '7' appears more than once"),
        (['{"id": null}\n'], "line 1: the task id must be a string or a number"),
        (["\n", "  \n"], "no tasks in it"),
    ],
)
def test_bad_task_files_name_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        demo.parse_tasks(lines)


def test_tasks_split_across_configmaps_under_the_size_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(demo.MODULES["manifests"], "TASKS_CONFIGMAP_BYTES", 40)
    tasks = demo.parse_tasks(
        ['{"pad": "%s"}\n' % ("x" * 10)] * 0 + ['{"id": %d, "pad": "xxxx"}\n' % n for n in range(5)]
    )
    maps = demo.task_configmaps(NAMESPACE, tasks)
    # Each entry is "task-N.json" (11 bytes) + 23 bytes of JSON = 34: one per ConfigMap under 40.
    assert [m["metadata"]["name"] for m in maps] == [
        "tasks-0",
        "tasks-1",
        "tasks-2",
        "tasks-3",
        "tasks-4",
    ]
    assert maps[2]["data"] == {"task-2.json": '{"id": 2, "pad": "xxxx"}'}
    assert all(m["metadata"]["namespace"] == NAMESPACE for m in maps)


def test_a_task_too_large_for_a_configmap_is_refused_before_anything_is_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(demo.MODULES["manifests"], "TASKS_CONFIGMAP_BYTES", 30)
    with pytest.raises(
        demo.DemoError, match="task on line 2 takes 45 bytes; one task may take at most 30 bytes"
    ):
        demo.task_configmaps(
            NAMESPACE, demo.parse_tasks(['{"a": 1}\n', '{"a": "%s"}\n' % ("y" * 25)])
        )


def test_too_many_configmaps_of_tasks_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo.MODULES["manifests"], "TASKS_CONFIGMAP_BYTES", 30)
    monkeypatch.setattr(demo.MODULES["manifests"], "TASKS_MAX_CONFIGMAPS", 2)
    with pytest.raises(demo.DemoError, match="more than 2 ConfigMaps of 30 bytes can carry"):
        demo.task_configmaps(NAMESPACE, demo.parse_tasks(['{"id": %d}\n' % n for n in range(3)]))


def test_tasks_volume_gives_each_episode_of_a_group_its_task_file() -> None:
    maps = [
        {"metadata": {"name": "tasks-0"}, "data": {"task-0.json": "{}", "task-1.json": "{}"}},
        {"metadata": {"name": "tasks-1"}, "data": {"task-2.json": "{}"}},
    ]
    assert demo.tasks_volume(maps, 2) == {
        "name": "tasks",
        "projected": {
            "sources": [
                {
                    "configMap": {
                        "name": "tasks-0",
                        "items": [
                            {"key": "task-0.json", "path": "0.json"},
                            {"key": "task-0.json", "path": "1.json"},
                            {"key": "task-1.json", "path": "2.json"},
                            {"key": "task-1.json", "path": "3.json"},
                        ],
                    }
                },
                {
                    "configMap": {
                        "name": "tasks-1",
                        "items": [
                            {"key": "task-2.json", "path": "4.json"},
                            {"key": "task-2.json", "path": "5.json"},
                        ],
                    }
                },
            ]
        },
    }


def test_the_job_with_tasks_and_retries_uses_the_per_index_api() -> None:
    volume = {"name": "tasks", "projected": {"sources": []}}
    job = demo.job_manifest(
        NAMESPACE,
        4,
        2,
        "python:3.12-alpine",
        "cube",
        tasks=volume,
        policy=demo.RolloutPolicy(retries=2, allow_failures=1),
    )
    spec = job["spec"]
    assert "backoffLimit" not in spec
    assert (spec["completionMode"], spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (
        "Indexed",
        2,
        1,
    )
    assert spec["podFailurePolicy"] == {
        "rules": [
            {
                "action": "Count",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailIndex",
                "onExitCodes": {
                    "containerName": "episode",
                    "operator": "NotIn",
                    "values": [126, 127, 137, 143],
                },
            },
        ]
    }
    pod = spec["template"]["spec"]
    env = pod["containers"][0]["env"]
    assert [e["name"] for e in env] == ["EPISODE_ID", "EPISODE_INDEX", "TASK_FILE"]
    assert env[2] == {"name": "TASK_FILE", "value": "/tasks/$(EPISODE_INDEX).json"}
    assert pod["containers"][0]["volumeMounts"][-1] == {
        "name": "tasks",
        "mountPath": "/tasks",
        "readOnly": True,
    }
    assert pod["volumes"][-1] is volume


def test_without_the_rollout_options_the_job_is_the_guides() -> None:
    assert demo.job_manifest(NAMESPACE, 10, 10, "python:3.12-alpine", "cube") == demo.batch_job(
        NAMESPACE,
        demo.Settings(
            count=10, parallelism=10, image="python:3.12-alpine", runtime="cube", timeout=240
        ),
        "rollout",
        [],
    )
    assert demo.rollout_policy(demo.Settings(count=10, parallelism=10)) is None
    assert demo.rollout_policy(
        demo.Settings(count=10, parallelism=10, allow_failures=2)
    ) == demo.RolloutPolicy(0, 2)


# --------------------------------------------------------------------------
# The failure taxonomy: one example of each way to fail, and its class.


def evicted(pod: dict) -> dict:
    pod["status"]["reason"] = "Evicted"
    pod["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "TerminationByKubelet",
            "message": "The node was low on memory.",
        }
    )
    return pod


def waiting(pod: dict, reason: str) -> dict:
    pod["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": reason, "message": "no such image"}
    }
    return pod


def unscheduled(pod: dict) -> dict:
    pod["spec"].pop("nodeName")
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "message": "0/3 nodes are available: 3 Insufficient cpu.",
        }
    ]
    pod["status"]["containerStatuses"] = []
    return pod


def deleted(pod: dict) -> dict:
    pod["metadata"]["deletionTimestamp"] = stamp(30)
    return pod


@pytest.mark.parametrize(
    "pod, log, job, expected",
    [
        (
            evicted(make_pod("p", phase="Failed", exit_code=143)),
            "",
            make_job(),
            ("infrastructure", "disrupted (TerminationByKubelet: The node was low on memory.)"),
        ),
        (
            unscheduled(make_pod("p", phase="Pending")),
            "",
            failed_job("DeadlineExceeded"),
            ("infrastructure", "never scheduled: 0/3 nodes are available: 3 Insufficient cpu."),
        ),
        (
            waiting(make_pod("p", phase="Pending"), "ImagePullBackOff"),
            "",
            failed_job("DeadlineExceeded"),
            ("infrastructure", "container never started (ImagePullBackOff: no such image)"),
        ),
        (
            deleted(make_pod("p", phase="Failed", exit_code=137, started="")),
            "",
            failed_job("DeadlineExceeded"),
            ("infrastructure", "stopped when the Job ended (DeadlineExceeded) before it finished"),
        ),
        (
            deleted(make_pod("p", phase="Failed", exit_code=143)),
            "",
            failed_job("MaxFailedIndexesExceeded"),
            (
                "infrastructure",
                "stopped when the Job ended (MaxFailedIndexesExceeded) before it finished",
            ),
        ),
        (
            make_pod("p", phase="Failed", exit_code=137),
            "",
            make_job(),
            ("infrastructure", "container Error with exit code 137"),
        ),
        (
            make_pod("p", phase="Succeeded", restart_count=1),
            honest_log("p"),
            make_job(),
            ("infrastructure", "container restarted 1 time(s)"),
        ),
        (
            make_pod("p", phase="Failed", exit_code=2),
            log_text(ready_event("p", T0 + 3.0)),
            make_job(),
            ("episode", "exited 2"),
        ),
        (
            make_pod("p", phase="Failed", exit_code=1),
            log_text(ready_event("p", T0 + 3.0)) + PYTHON_TRACEBACK,
            make_job(),
            ("episode", "exited 1: KeyError: 'answer'"),
        ),
        (
            make_pod("p", phase="Failed", exit_code=1),
            SYNTAX_ERROR_LOG,
            make_job(),
            ("episode", "exited 1: SyntaxError: '(' was never closed"),
        ),
        (
            deleted(make_pod("p", phase="Failed", exit_code=143)),
            "",
            failed_job("DeadlineExceeded"),
            ("episode", "still running at the Job's deadline"),
        ),
        (
            make_pod("p"),
            log_text(ready_event("p", T0 + 3.0)),
            make_job(),
            ("episode", "expected exactly one reward event, found 0"),
        ),
        (
            make_pod("p", phase="Failed", exit_code=1),
            log_text(ready_event("p", T0 + 3.0)) + "baseline must fail the boundary test\n",
            make_job(),
            ("verifier", "exited 1: baseline must fail the boundary test"),
        ),
        (
            make_pod("p", phase="Failed", exit_code=1),
            honest_log("p", reward=0, tests_exit=1),
            make_job(),
            ("verifier", "exited 1: the patched code failed its tests (tests_exit 1)"),
        ),
        (make_pod("p"), honest_log("p", reward=0), make_job(), ("verifier", "reward is 0, not 1")),
        (
            make_pod("p"),
            honest_log("p", reward_at=T0 + 1.0),
            make_job(),
            (
                "verifier",
                "times out of order (job created %s, pod created %s, ready %s, reward %s): unsynchronised "
                "clocks or broken events" % (float(T0), float(T0 + 1), T0 + 3.0, T0 + 1.0),
            ),
        ),
        (make_pod("p"), honest_log("p"), make_job(), (None, None)),
        # Deleted as the Job ended, it ran on to exit 0 and was removed before its log was read.
        (
            deleted(make_pod("p")),
            "",
            failed_job("MaxFailedIndexesExceeded"),
            (
                "infrastructure",
                "its log was gone before it could be read: deleted as the Job ended "
                "(MaxFailedIndexesExceeded), the pod was removed once it exited 0",
            ),
        ),
        # Its log read, it is judged by it: complete, a success; a protocol broken, its own failure.
        (deleted(make_pod("p")), honest_log("p"), failed_job("FailedIndexes"), (None, None)),
        (
            deleted(make_pod("p")),
            log_text(ready_event("p", T0 + 3.0)),
            failed_job("FailedIndexes"),
            ("episode", "expected exactly one reward event, found 0"),
        ),
        # An empty log of a pod nothing deleted is what the episode printed.
        (make_pod("p"), "", make_job(), ("episode", "expected exactly one ready event, found 0")),
    ],
)
def test_each_failure_is_classified(pod: dict, log: str, job: dict, expected: tuple) -> None:
    assert demo.classify_attempt(pod, log, job, builtin=True) == expected


def test_a_disrupted_pod_that_still_succeeded_is_a_success_as_the_job_counts_it() -> None:
    # A real kubelet's eviction: SIGTERM to PID 1, which ignores it, so the episode ran to exit 0.
    pod = make_pod("p")
    pod["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
    )
    assert demo.classify_attempt(pod, honest_log("p"), make_job(), builtin=True) == (None, None)


def test_an_infrastructure_failure_names_the_pods_warnings() -> None:
    pod = deleted(make_pod("p", phase="Failed", exit_code=137, started=""))
    assert (
        demo.classify_attempt(
            pod, "", failed_job("DeadlineExceeded"), True, ["Failed: Error: ErrImagePull"]
        )[1]
        == "stopped when the Job ended (DeadlineExceeded) before it finished; pod warnings: Failed: Error: ErrImagePull"
    )


def test_a_custom_episode_may_reward_0_but_must_send_a_number() -> None:
    assert demo.classify_attempt(
        make_pod("p"), honest_log("p", reward=0), make_job(), builtin=False
    ) == (None, None)
    assert demo.classify_attempt(
        make_pod("p"), honest_log("p", reward="high"), make_job(), builtin=False
    ) == ("episode", "reward is 'high', not a number")


def test_pod_warnings_keep_the_first_few_distinct_lines_per_pod() -> None:
    events = [
        {
            "type": "Warning",
            "reason": "Failed",
            "message": "Error: ErrImagePull",
            "involvedObject": {"kind": "Pod", "name": "p"},
        }
    ] * 2 + [
        {"type": "Normal", "reason": "Pulling", "involvedObject": {"kind": "Pod", "name": "p"}},
        {
            "type": "Warning",
            "reason": "BackOff",
            "note": "Back-off  pulling\nimage",
            "regarding": {"kind": "Pod", "name": "p"},
        },
        {
            "type": "Warning",
            "reason": "FailedCreate",
            "involvedObject": {"kind": "Job", "name": "rollout"},
        },
    ]
    assert demo.pod_warnings(demo.event_records(events)) == {
        "p": ["Failed: Error: ErrImagePull", "BackOff: Back-off pulling image"]
    }


# --------------------------------------------------------------------------
# One row per episode.


def test_every_episode_has_a_row_its_final_attempt_and_what_came_before() -> None:
    job = failed_job("FailedIndexes")
    first = evicted(
        indexed_pod("rollout-0-aaaaa", 0, phase="Failed", exit_code=143, created=stamp(1))
    )
    retried = indexed_pod("rollout-0-bbbbb", 0, failures=1, created=stamp(2))
    failed = indexed_pod("rollout-1-ccccc", 1, phase="Failed", exit_code=1, created=stamp(1))
    logs = {
        "rollout-0-bbbbb": honest_log(
            "rollout-0-bbbbb", T0 + 3.0, T0 + 5.5, tests_output="ok", pod="x"
        ),
        "rollout-1-ccccc": log_text(ready_event("rollout-1-ccccc", T0 + 2.5)),
    }
    rows = demo.episode_rows(3, job, [failed, retried, first], logs, True, ["t0", "t1"], 2)
    assert rows[0] == {
        "index": 0,
        "task_id": "t0",
        "group": 0,
        "pod": "rollout-0-bbbbb",
        "attempts": 2,
        "reward": 1,
        "failure_class": None,
        "valid": True,
        "failure": None,
        "node": "node-1",
        "pod_to_ready_seconds": 1.0,
        "batch_to_ready_seconds": 3.0,
        "batch_to_reward_seconds": 5.5,
        "episode_seconds": 2.5,
        "evidence": None,
        "earlier_attempts": [
            {
                "pod": "rollout-0-aaaaa",
                "failure_class": "infrastructure",
                "failure": "disrupted (TerminationByKubelet: The node was low on memory.)",
            }
        ],
        "at": T0 + 5.5,
        "episode_id": "rollout-0-bbbbb",
        "baseline_exit": 1,
        "tests_exit": 0,
        "tests_output": "ok",
        "episode_pod": "x",
    }
    assert (
        rows[1]["failure_class"],
        rows[1]["failure"],
        rows[1]["attempts"],
        rows[1]["evidence"],
        rows[1]["reward"],
        rows[1]["pod_to_ready_seconds"],
    ) == ("episode", "exited 1", 1, "rollout-1-ccccc.log", None, 1.5)
    assert rows[2] == {
        "index": 2,
        "task_id": "t1",
        "group": 1,
        "pod": None,
        "attempts": 0,
        "reward": None,
        "failure_class": "infrastructure",
        "valid": False,
        "evidence": "job.json",
        "failure": "never started: the Job ended (FailedIndexes) before it created this "
        "episode's pod",
    }
    lines = demo.rewards_jsonl(rows).splitlines()
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2]


def row(
    index: int,
    failure_class: Optional[str] = None,
    reward_at: Optional[float] = None,
    attempts: int = 1,
    earlier: Optional[str] = None,
    reward: Any = 1,
) -> dict:
    return {
        "index": index,
        "group": index // 2,
        "task_id": f"t{index // 2}",
        "failure_class": failure_class,
        "batch_to_reward_seconds": reward_at,
        "attempts": attempts,
        "reward": reward,
        "earlier_attempts": [{"failure_class": earlier}] if earlier else [],
        "pod_to_ready_seconds": None if reward_at is None else reward_at - 2,
        "pod": f"p{index}",
    }


def test_groups_say_when_all_their_rewards_were_in_and_their_spread() -> None:
    rows = [
        row(0, reward_at=5.0, reward=0),
        row(1, reward_at=7.5),
        row(2, reward_at=6.0),
        row(3, "episode", reward=None),
    ]
    assert demo.group_figures(rows, 2) == [
        {
            "group": 0,
            "task_id": "t0",
            "episodes": 2,
            "rewards_in": 2,
            "complete": True,
            "all_rewards_seconds": 7.5,
            "spread_seconds": 2.5,
            "reward_mean": 0.5,
        },
        {
            "group": 1,
            "task_id": "t1",
            "episodes": 2,
            "rewards_in": 1,
            "complete": False,
            "all_rewards_seconds": None,
            "spread_seconds": 0.0,
            "reward_mean": 1.0,
        },
    ]


def test_attempts_count_first_attempts_and_final_outcomes_apart() -> None:
    rows = [
        row(0, reward_at=5.0, attempts=2, earlier="infrastructure"),
        row(1, reward_at=5.0),
        row(2, "episode"),
        row(3, "infrastructure", attempts=3, earlier="infrastructure"),
    ]
    assert demo.attempt_figures(rows) == {
        "attempts_total": 7,
        "episodes_retried": 2,
        "first_attempt": {
            "succeeded": 1,
            "failed": {"infrastructure": 2, "episode": 1, "verifier": 0},
        },
        "final": {
            "succeeded": 2,
            "failed": {"infrastructure": 1, "episode": 1, "verifier": 0},
            "cancelled": 0,
        },
    }


def test_pod_to_ready_counts_a_never_ready_episode_as_ready_at_the_deadline() -> None:
    job = make_job(end="Failed")
    job["spec"] = {"activeDeadlineSeconds": 60}
    job["status"]["startTime"] = JOB_CREATED
    pods = [make_pod("p0"), make_pod("p1"), make_pod("p2", created=stamp(4))]
    rows = [row(0, reward_at=5.0), row(1, reward_at=6.0), row(2, "infrastructure")]
    censored = demo.censored_pod_to_ready(rows, job, pods)
    # Samples 3.0, 4.0 and 60 - 4 = 56 (deadline at T0 + 60, the pod created at T0 + 4).
    assert (
        censored["p50"],
        censored["p95"],
        censored["max"],
        censored["samples"],
        censored["censored"],
    ) == (4.0, 50.8, 56.0, 3, 1)


def test_a_rollout_batch_over_its_allowance_is_refused_with_each_failure_listed() -> None:
    rows = [
        row(0, reward_at=5.0),
        dict(row(1, "episode"), failure="exited 1"),
        dict(row(2, "infrastructure"), failure="disrupted"),
    ]
    with pytest.raises(demo.DemoError) as raised:
        demo.summarise_rollout(
            rows,
            make_job(),
            [],
            {},
            [],
            demo.Settings(count=len(rows), parallelism=1, allow_failures=0),
        )
    assert str(raised.value) == (
        "1 of 3 episodes failed (1 infrastructure failure; 1 more failed on their own, valid "
        "samples); --allow-failures accepts 0\n"
        "  episode 2 (task 't1', pod p2, 1 attempt): infrastructure: disrupted\n"
        "  episode 1 (task 't0', pod p1, 1 attempt): episode: exited 1"
    )


def test_an_episodes_own_failure_is_a_sample_never_counted_against_the_allowance() -> None:
    """Only losses (infrastructure, verifier: lines to mask) count against --allow-failures; the
    episode's own failure is a valid line, and a batch of nothing else is no partial batch."""
    own = [dict(row(n, "episode"), failure="exited 1", evidence=f"p{n}.log") for n in range(3)]
    demo.check_rollout_accepted(own + [row(3)], None, 0, demo.COMMAND_LINE)
    demo.check_rollout_accepted(own, None, 0, demo.COMMAND_LINE)  # every agent failed: samples
    figures = demo.rollout_figures(own + [row(3)], make_job(), [], 2, 0, 0)
    assert (figures["failed_episodes"], figures["lost_episodes"]) == (3, 0)
    assert figures["accepted_partial"] is False
    verifier = dict(row(3, "verifier"), failure="reward is 0, not 1")
    with pytest.raises(demo.DemoError, match=r"^1 of 4 episodes failed \(1 verifier failure; 3"):
        demo.check_rollout_accepted(own + [verifier], None, 0, demo.COMMAND_LINE)
    lost = [dict(row(n, "infrastructure"), failure="disrupted") for n in range(2)]
    with pytest.raises(demo.DemoError, match="none has a valid line"):
        demo.check_rollout_accepted(lost, None, 2, demo.COMMAND_LINE)
    # --need K counts valid lines, as the Job's successPolicy counts the pods that ended 0.
    demo.check_rollout_accepted(own + lost, 3, 2, demo.COMMAND_LINE)
    with pytest.raises(demo.DemoError, match=r"^3 of 5 episodes have a valid line, fewer than"):
        demo.check_rollout_accepted(own + lost, 4, 1, demo.COMMAND_LINE)


@pytest.mark.parametrize(
    "classes, said",
    [
        (["episode", "episode"], "2 episode failures"),
        (
            ["infrastructure", "verifier", "verifier"],
            "1 infrastructure failure, 2 verifier failures",
        ),
    ],
)
def test_failures_are_counted_in_words_not_read_as_an_index(classes: list, said: str) -> None:
    assert demo.failures_said([{"failure_class": kind} for kind in classes]) == said


def test_counts_of_one_are_singular() -> None:
    assert demo.throughput_line({"max_episodes_running_at_once": 1}).endswith(
        "at most 1 episode running at once"
    )
    assert demo.throughput_line({"max_episodes_running_at_once": 3}).endswith(
        "at most 3 episodes running at once"
    )
    assert demo.timeline_title(demo.Settings(count=1, parallelism=1, runtime="cube")).startswith(
        "1 episode,"
    )
    assert demo.plural(None, "episode") == "- episodes"


# --------------------------------------------------------------------------
# The emulator's Job controller matches failed pods as matchPodFailurePolicy does.

POLICY = {
    "rules": [
        {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "FailIndex",
            "onExitCodes": {
                "containerName": "episode",
                "operator": "NotIn",
                "values": [126, 127, 137, 143],
            },
        },
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}},
    ]
}


@pytest.mark.parametrize(
    "pod, expected",
    [
        (evicted(make_pod("p", phase="Failed", exit_code=1)), (None, True, "Count")),
        (make_pod("p", phase="Failed", exit_code=3), (None, True, "FailIndex")),
        (make_pod("p", phase="Failed", exit_code=137), (None, False, "Ignore")),
        (make_pod("p", phase="Failed", exit_code=143), (None, True, None)),
        (make_pod("p", phase="Failed", exit_code=0), (None, True, None)),
    ],
)
def test_emulator_matches_the_first_rule_that_applies(pod: dict, expected: tuple) -> None:
    assert kube_emulator.match_pod_failure_policy(POLICY, pod) == expected


def test_emulator_fail_job_rule_says_which_container_and_rule() -> None:
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    assert kube_emulator.match_pod_failure_policy(
        policy, make_pod("p", phase="Failed", exit_code=42)
    ) == (
        f"Container episode for pod {NAMESPACE}/p failed with exit code 42 matching FailJob rule at index 0",
        True,
        "FailJob",
    )


# --------------------------------------------------------------------------
# The command line: the rollout options, in-process.


def usage_message(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """What `main` printed on stopping with a usage error (exit status 2)."""
    assert usage_error(argv) == 2
    return capsys.readouterr().err


@pytest.fixture
def task_file(tmp_path: Any) -> Any:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c"}\n')
    return path


@pytest.mark.parametrize(
    "log, tail",
    [
        (PYTHON_TRACEBACK, "KeyError: 'answer'"),
        (SYNTAX_ERROR_LOG, "SyntaxError: '(' was never closed"),
        # A chained exception: the last traceback's line, the one that ended the program.
        (
            'Traceback (most recent call last):\n  File "a", line 1, in <module>\nValueError: x\n\nDuring handling '
            "of the above exception, another exception occurred:\n\n"
            + PYTHON_TRACEBACK
            + "after\n",
            "KeyError: 'answer'",
        ),
        ('{"event": "ready"}\nthe agent gave up\n', None),  # sys.exit("...") prints no traceback
        ("", None),
    ],
)
def test_traceback_tail_is_the_line_that_ended_the_program(log: str, tail: Optional[str]) -> None:
    assert demo.traceback_tail(log) == tail


def test_a_failed_pod_line_quotes_its_traceback() -> None:
    pod = make_pod("p", phase="Failed", exit_code=1)
    job = make_job()
    assert demo.describe_failure(job, [pod], "rollout", 240, {"p": SYNTAX_ERROR_LOG})[1:] == [
        "pod p: Failed, container exited 1 (Error): SyntaxError: '(' was never closed"
    ]
    assert demo.describe_failure(job, [pod], "rollout", 240, {"p": "no traceback\n"})[1:] == [
        "pod p: Failed, container exited 1 (Error)"
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--group-size", "2"], "--group-size needs --tasks (2 episodes per task)"),
        (
            ["--tasks", "{tasks}", "--count", "4"],
            "--count 4 disagrees with --tasks: 3 tasks x --group-size 1 = 3 episodes (leave --count out)",
        ),
        (
            ["--tasks", "{tasks}", "--group-size", "7"],
            "--group-size 7 with 3 tasks is 21 episodes, over the cap of 20 episodes (raise it with --max-episodes 21)",
        ),
        (
            ["--count", "21"],
            "--count 21 is over the cap of 20 episodes (raise it with --max-episodes 21)",
        ),
        (
            ["--retries", "1", "--rounds", "2"],
            "--tasks, --retries, --allow-failures and --need run one batch",
        ),
        (["--allow-failures", "11"], "--allow-failures 11 is more than the 10 episodes"),
        (["--retries", "-1"], "argument --retries: must be 0 or more, got -1"),
        (["--tasks", "{missing}"], "No such file or directory"),
        (
            ["--tasks", "{tasks}"],
            "--tasks needs --episode-script: the built-in episode ignores tasks, so its rewards "
            "would not come from them; ship an episode that reads its task from $TASK_FILE",
        ),
    ],
)
def test_rollout_usage_errors(
    extra: list[str], message: str, tmp_path: Any, task_file: Any, capsys: pytest.CaptureFixture
) -> None:
    argv = ["run", "--output", str(tmp_path / "out")] + [
        a.format(tasks=task_file, missing=tmp_path / "none.jsonl") for a in extra
    ]
    assert message in usage_message(argv, capsys)
    assert not (tmp_path / "out").exists()  # refused before anything is created


def test_a_bad_task_line_is_a_usage_error_naming_it(
    tmp_path: Any, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{"id": 2,\n')
    err = usage_message(["run", "--output", str(tmp_path / "out"), "--tasks", str(bad)], capsys)
    assert f"--tasks {bad}: line 2 is not JSON" in err


def test_dry_run_with_tasks_lists_their_configmap_before_the_job(
    tmp_path: Any, task_file: Any, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "ep.py").write_text("print('reads its task')\n")
    assert (
        demo.main(
            [
                "run",
                "--output",
                str(tmp_path / "out"),
                "--tasks",
                str(task_file),
                "--group-size",
                "2",
                "--episode-script",
                str(tmp_path / "ep.py"),
                "--allow-failures",
                "1",
                "--dry-run",
            ]
        )
        == 0
    )
    items = json.loads(capsys.readouterr().out)["items"]
    assert [(o["kind"], o["metadata"]["name"]) for o in items] == [
        ("Namespace", items[0]["metadata"]["name"]),
        ("ConfigMap", "episode"),
        ("ConfigMap", "tasks-0"),
        ("Job", "rollout"),
    ]
    assert items[2]["data"] == {
        "task-0.json": '{"id": "a"}',
        "task-1.json": '{"id": "b"}',
        "task-2.json": '{"id": "c"}',
    }
    spec = items[3]["spec"]
    assert (
        spec["completions"],
        spec["parallelism"],
        spec["backoffLimitPerIndex"],
        spec["maxFailedIndexes"],
    ) == (6, 6, 0, 1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "tasks, keywords, error, message",
    [
        (
            [{"id": 1}, {"id": 2}, {"id": 3}],
            {"group_size": 8},
            ValueError,
            "group_size=8 with 3 tasks is 24 episodes, over max_episodes=20 (raise it with max_episodes=24)",
        ),
        (
            None,
            {"count": 24},
            ValueError,
            "count=24 is over max_episodes=20 (raise it with max_episodes=24)",
        ),
        (None, {"count": "2"}, TypeError, "count= must be int | None, got str '2'"),
        (None, {"harden": 1}, TypeError, "harden= must be bool, got int 1"),
        (None, {"cout": 2}, TypeError, "run_batch() got an unexpected keyword argument 'cout'"),
        (None, {"timeout": 0}, ValueError, "timeout=0: must be at least 1, got 0"),
        (None, {"retries": -1}, ValueError, "retries=-1: must be 0 or more, got -1"),
        (None, {"group_size": 2}, ValueError, "group_size= needs tasks (2 episodes per task)"),
        (
            None,
            {"count": 2, "parallelism": 5},
            ValueError,
            "parallelism= must be between 1 and the count (2), got 5",
        ),
        (
            None,
            {"rounds": 2},
            ValueError,
            "run_batch() runs one batch: leave out rounds= and warmup=",
        ),
        (
            None,
            {"allow_failures": 11},
            ValueError,
            "allow_failures=11 is more than the 10 episodes",
        ),
        (
            [{"id": 1}],
            {"count": 4},
            ValueError,
            "count=4 disagrees with tasks: 1 tasks x group_size=1 = 1 episodes (leave count= out)",
        ),
        ([[1, 2]], {}, TypeError, "tasks[0] must be a dict, got list [1, 2]"),
        ([{"id": 1}, {"id": 1}], {}, ValueError, "tasks: task id '1' appears more than once"),
        (
            [{"id": [1]}],
            {},
            ValueError,
            "tasks: tasks[0]: the task id must be a string or a number",
        ),
        (
            [{"x": {1, 2}}],
            {},
            ValueError,
            "tasks[0] is not JSON: Object of type set is not JSON serializable",
        ),
        ([], {}, ValueError, "tasks is empty"),
        (None, {"options": ["--bogus"]}, ValueError, "options: unrecognized arguments: --bogus"),
        (
            [{"id": 1}],
            {},
            ValueError,
            "tasks needs episode_script=: the built-in episode ignores tasks",
        ),
        (None, {"options": "--count 2"}, TypeError, "options must be a list of strings"),
        (
            None,
            {"count": 2, "options": ["--count", "3"]},
            ValueError,
            "count= and options' --count both set count: give it once",
        ),
        (
            None,
            {"options": ["--output=elsewhere"]},
            ValueError,
            "options' --output: give output as run_batch()'s own argument",
        ),
    ],
)
def test_run_batch_says_what_is_wrong_in_python_terms(
    tasks: Any,
    keywords: dict,
    error: type,
    message: str,
    tmp_path: Any,
    capsys: pytest.CaptureFixture,
) -> None:
    with pytest.raises(demo.UsageError) as raised:
        demo.run_batch(tasks, output=str(tmp_path / "out"), **keywords)
    assert isinstance(raised.value, error) and str(raised.value).startswith(message), str(
        raised.value
    )
    assert capsys.readouterr() == (
        "",
        "",
    )  # no usage block, nothing printed: the reason is the exception's
    assert not (tmp_path / "out").exists()


def test_every_run_flag_is_a_typed_documented_keyword_of_run_batch() -> None:
    import inspect

    run_parser = demo.build_parser().parse_args(["run", "--output", "x"]).action_parser
    flags = {
        action.dest: action
        for action in run_parser._actions
        if action.option_strings and action.dest not in ("help", "output", "tasks")
    }
    parameters = inspect.signature(demo.run_batch).parameters
    assert set(flags) <= set(parameters)
    assert list(parameters)[:3] == ["tasks", "output", "options"]
    for name, action in flags.items():
        parameter = parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.annotation, name
        assert (
            f"    {name}: {parameter.annotation} = {parameter.default!r}  ({action.option_strings[-1]})"
            in demo.run_batch.__doc__
        ), name
    assert (parameters["count"].annotation, parameters["episode_script"].annotation) == (
        "int | None",
        "str | os.PathLike | None",
    )
    # The two defaults a trainer calling in wants, unlike the command line's.
    assert (parameters["cleanup"].default, parameters["quiet"].default) == (True, True)
    assert (flags["cleanup"].default, flags["quiet"].default) == (False, False)


def test_run_batch_keywords_reach_the_objects_it_creates(
    tmp_path: Any, capsys: pytest.CaptureFixture
) -> None:
    script = tmp_path / "ep.py"
    script.write_text("print('episode')\n")
    listing = demo.run_batch(
        [{"id": "a"}, {"id": "b"}],
        output=tmp_path / "out",
        group_size=3,
        parallelism=2,
        image="img:1",
        runtime="gvisor",
        timeout=77,
        retries=1,
        allow_failures=2,
        harden=True,
        episode_script=script,
        dry_run=True,
    )
    assert capsys.readouterr() == ("", "")
    kinds = [item["kind"] for item in listing["items"]]
    assert kinds[0] == "Namespace" and "NetworkPolicy" in kinds  # harden=True
    job = listing["items"][-1]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (
        spec["completions"],
        spec["parallelism"],
        spec["activeDeadlineSeconds"],
        spec["backoffLimitPerIndex"],
        spec["maxFailedIndexes"],
    ) == (6, 2, 77, 1, 2)
    assert (pod["runtimeClassName"], pod["containers"][0]["image"]) == ("gvisor", "img:1")
    episode = next(item for item in listing["items"] if item["metadata"]["name"] == "episode")
    assert episode["data"]["episode.py"] == "print('episode')\n"
    # A --tasks file's path is taken as the tasks, as `run --tasks` takes it.
    (tmp_path / "tasks.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c"}\n')
    listing = demo.run_batch(
        tmp_path / "tasks.jsonl",
        output=str(tmp_path / "out"),
        episode_script=str(script),
        dry_run=True,
    )
    assert listing["items"][-1]["spec"]["completions"] == 3
    with pytest.raises(demo.UsageError, match=r"^tasks='.*none.jsonl': No such file or directory$"):
        demo.run_batch(str(tmp_path / "none.jsonl"), output=str(tmp_path / "out"), dry_run=True)


def test_every_rollout_job_is_indexed_the_guides_run_is_not(tmp_path: Any, capsys: Any) -> None:
    """A rollout's lines are matched to its pods by completion index: a Python call without
    tasks (the built-in demo, count= episodes) is a rollout, so its Job is Indexed too."""
    listing = demo.run_batch(output=tmp_path / "out", count=2, dry_run=True)
    assert listing["items"][-1]["spec"]["completionMode"] == "Indexed"
    streamed = demo.stream_batch(output=tmp_path / "out", count=3, dry_run=True)
    with pytest.raises(StopIteration) as listed:
        next(streamed)
    assert listed.value.value["items"][-1]["spec"]["completionMode"] == "Indexed"
    # The guide's own run (Part A) keeps its NonIndexed Job.
    assert demo.main(["run", "--output", str(tmp_path / "out"), "--dry-run"]) == 0
    job = json.loads(capsys.readouterr().out)["items"][-1]
    assert job["kind"] == "Job" and "completionMode" not in job["spec"]


def test_run_batch_failures_before_the_cluster_name_its_keywords(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    script = tmp_path / "ep.py"
    script.write_text("print('episode')\n")
    (tmp_path / "taken").mkdir()
    with pytest.raises(
        demo.DemoError, match=r"records are never overwritten, choose a new output=$"
    ):
        demo.run_batch(output=tmp_path / "taken", count=1)
    with pytest.raises(
        demo.DemoError,
        match=r"^kubectl not found: '/no/kubectl' \(install kubectl or pass "
        r"kubectl=PATH\)$",
    ):
        demo.run_batch(output=tmp_path / "out", count=1, kubectl="/no/kubectl")
    with pytest.raises(
        demo.UsageError, match=r"^cannot read episode_script='.*missing.py': No such file"
    ):
        demo.run_batch(output=tmp_path / "out", count=1, episode_script=tmp_path / "missing.py")
    script.write_text('print("hello"\n')
    with pytest.raises(
        demo.DemoError, match=r"^episode_script='.*ep.py', line 1: .*; nothing was created$"
    ):
        demo.run_batch(output=tmp_path / "out", count=1, episode_script=script)
    assert not (tmp_path / "out").exists()
    # The command line keeps its flags.
    assert demo.main(["run", "--output", str(tmp_path / "out"), "--kubectl", "/no/kubectl"]) == 1
    assert "(install kubectl or pass --kubectl PATH)" in capsys.readouterr().err


class NodelessKubectl:
    """A kubectl for prepull() whose node list answers as given: an error, or no nodes."""

    def __init__(self, refusal: Optional[str]) -> None:
        self.refusal = refusal

    def get(self, kind: str, name: str, retry_until: float = 0.0) -> dict:
        return {"kind": "RuntimeClass", "metadata": {"name": name}, "handler": "runc"}

    def get_list(self, kind: str, namespace: Optional[str], retry_until: float = 0.0) -> dict:
        if self.refusal:
            raise demo.DemoError(self.refusal)
        return {"items": []}


@pytest.mark.parametrize(
    "spelling, switch", [(demo.PYTHON_CALL, "prepull=True"), (demo.COMMAND_LINE, "--prepull")]
)
@pytest.mark.parametrize(
    "refusal, said",
    [
        ("nodes is forbidden", r"needs to list the nodes \(and get the RuntimeClass\): nodes is"),
        (None, "found no node the batch can use"),
    ],
)
def test_prepull_refusals_name_the_setting_as_the_caller_spelled_it(
    spelling: Any, switch: str, refusal: Optional[str], said: str
) -> None:
    settings = type("Settings", (), {"runtime": "cube"})
    run: Any = type(
        "Run", (), {"kubectl": NodelessKubectl(refusal), "settings": settings, "spelling": spelling}
    )
    with pytest.raises(demo.DemoError, match=rf"^{re.escape(switch)} {said}"):
        demo.prepull(run)


@pytest.mark.parametrize(
    "spelling, said", [(demo.PYTHON_CALL, "cleanup=True"), (demo.COMMAND_LINE, "--cleanup")]
)
def test_a_failed_cleanup_after_a_failed_run_names_it_as_the_caller_spelled_it(
    spelling: Any, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def unreachable(*args: Any, **options: Any) -> None:
        raise demo.DemoError("cannot reach the cluster")

    monkeypatch.setattr(demo.MODULES["run"], "cleanup_namespace", unreachable)  # finish_run's
    run: Any = type(
        "Run",
        (),
        {
            "touched_cluster": True,
            "silent": spelling.python,
            "kubectl": None,
            "receipt": None,
            "output": "runs/out",
            "spelling": spelling,
            "cleanup_ahead": None,
        },
    )
    with pytest.raises(demo.DemoError) as raised:
        demo.finish_run(run, demo.DemoError("the Job failed"), True, True, "HINT")
    assert str(raised.value) == (
        f"the Job failed\n  evidence: runs/out\n  {said} failed too: cannot reach the cluster\n"
        f"  clean up: HINT"
    )
    # From Python nothing is printed; the command line says what it does, in its flags.
    err = capsys.readouterr().err
    assert err == ("" if spelling.python else "Cleaning up (--cleanup) after a failed run.\n")
