"""Unit tests of streaming rollouts: `valid` for every failure class, when an episode's outcome is
settled while the batch runs, cancellation (--need) and the per-episode deadline in the classifier,
the delivery figures, the RewardStream file (lines appended, never changed, rewritten in index
order), the manifests of --need and --episode-timeout, and the refused combinations."""

from __future__ import annotations

import json
from typing import Any

import pytest

import all_names as demo
from test_unit import T0, make_job, stamp
from test_unit_rollouts import evicted, honest_log, indexed_pod, usage_message

NEED_MET = {
    "type": "SuccessCriteriaMet",
    "status": "True",
    "reason": "SuccessPolicy",
    "message": "Matched rules at index 0",
    "lastTransitionTime": stamp(8),
}


def running_job(*conditions: dict, failed_indexes: str = "", completions: int = 3) -> dict:
    job = make_job(end="Complete", criteria_at=None)
    job["spec"] = {"completions": completions}
    job["status"] = {"conditions": list(conditions), "failedIndexes": failed_indexes}
    return job


def deleted(pod: dict) -> dict:
    pod["metadata"]["deletionTimestamp"] = stamp(9)
    return pod


def timed_out(pod: dict) -> dict:
    pod["status"].update(
        reason="DeadlineExceeded",
        message="Pod was active on the node longer than the specified deadline",
    )
    pod["spec"]["activeDeadlineSeconds"] = 30
    return pod


# --------------------------------------------------------------------------
# valid: the agent's own outcome, or a line to mask.


@pytest.mark.parametrize(
    "pod, log, job, failure_class, valid",
    [
        (indexed_pod("p", 0), honest_log("p"), make_job(), None, True),
        (indexed_pod("p", 0, phase="Failed", exit_code=1), "", make_job(), "episode", True),
        (
            timed_out(indexed_pod("p", 0, phase="Failed", exit_code=143)),
            "",
            make_job(),
            "episode",
            True,
        ),
        (
            evicted(indexed_pod("p", 0, phase="Failed", exit_code=137)),
            "",
            make_job(),
            "infrastructure",
            False,
        ),
        (
            indexed_pod("p", 0, phase="Failed", exit_code=137),
            "",
            make_job(),
            "infrastructure",
            False,
        ),
        (
            indexed_pod("p", 0),
            honest_log("p", tests_exit=1, reward=0),
            make_job(),
            "verifier",
            False,
        ),
        (
            deleted(indexed_pod("p", 0, phase="Failed", exit_code=143)),
            "",
            running_job(NEED_MET),
            "cancelled",
            False,
        ),
    ],
)
def test_every_line_says_whether_a_trainer_may_learn_from_it(
    pod: dict, log: str, job: dict, failure_class: Any, valid: bool
) -> None:
    row = demo.episode_row(0, [pod], job, {"p": log}, True, None, 1)
    assert (row["failure_class"], row["valid"]) == (failure_class, valid)
    assert list(row)[:8] == [
        "index",
        "task_id",
        "group",
        "pod",
        "attempts",
        "reward",
        "failure_class",
        "valid",
    ]


def test_an_episode_never_created_is_masked_and_cancelled_once_need_was_met() -> None:
    row = demo.episode_row(3, [], running_job(NEED_MET), {}, True, None, 1)
    assert (row["failure_class"], row["valid"], row["evidence"]) == ("cancelled", False, "job.json")
    row = demo.episode_row(
        3,
        [],
        running_job({"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}),
        {},
        True,
        None,
        1,
    )
    assert (row["failure_class"], row["valid"]) == ("infrastructure", False)


# --------------------------------------------------------------------------
# Cancelled and timed-out episodes in the classifier.


def test_a_pod_stopped_once_need_was_met_is_cancelled_whatever_its_exit_code() -> None:
    job = running_job(NEED_MET)
    for code in (143, 137, 1):
        pod = deleted(indexed_pod("p", 0, phase="Failed", exit_code=code))
        assert demo.classify_attempt(pod, "", job, True) == (
            "cancelled",
            "cancelled: --need was met while it ran",
        )
    # One that failed on its own before (not being deleted) keeps its own class.
    assert demo.classify_attempt(
        indexed_pod("p", 0, phase="Failed", exit_code=1), "", job, True
    ) == ("episode", "exited 1")
    # One that exited 0 when stopped, before its reward, was cancelled too; one with its reward succeeded.
    stopped = deleted(indexed_pod("p", 0))
    assert demo.classify_attempt(stopped, "", job, True)[0] == "cancelled"
    assert demo.classify_attempt(stopped, honest_log("p"), job, True) == (None, None)
    assert demo.classify_attempt(indexed_pod("p", 0), "", job, True)[0] == "episode"
    # Without --need met, a deleted pod is what it was.
    assert (
        demo.classify_attempt(
            deleted(indexed_pod("p", 0, phase="Failed", exit_code=1)), "", running_job(), True
        )[0]
        == "episode"
    )


def test_a_pod_past_its_deadline_ran_out_of_time_unless_it_never_started() -> None:
    pod = timed_out(indexed_pod("p", 0, phase="Failed", exit_code=143))
    assert demo.classify_attempt(pod, "", make_job(), True) == (
        "episode",
        "ran out of time: still running 30 s after its pod started (its deadline: "
        "its pod's activeDeadlineSeconds)",
    )
    never = timed_out(indexed_pod("p", 0, phase="Failed", exit_code=None))
    never["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ImagePullBackOff"}}
    assert demo.classify_attempt(never, "", make_job(), True)[0] == "infrastructure"


def test_a_pod_marked_past_its_deadline_after_it_succeeded_is_still_a_success() -> None:
    # A real kubelet (1.35) checks a pod's activeDeadlineSeconds for as long as the pod is on its
    # node: one that succeeded turns Failed (DeadlineExceeded) once its deadline passes while the
    # batch still runs, its container's exit code still 0 (tests/e2e/test_e2e_streaming.py, on the real node).
    pod = timed_out(indexed_pod("p", 1, phase="Failed", exit_code=0))
    pod["status"]["startTime"] = stamp(1)  # its deadline: 30 s later; its container ended at 9
    uncounted = make_job()
    assert demo.classify_attempt(pod, honest_log("p"), uncounted, True) == (None, None)
    assert [
        p["status"]["phase"]
        for p, _, _ in demo.verify_batch(1, uncounted, [pod], {"p": honest_log("p")})
    ] == ["Succeeded"]
    # Ended in its deadline's own second: a success if the Job counted it, since the Job saw the
    # pod Succeeded first.
    late = timed_out(indexed_pod("p", 1, phase="Failed", exit_code=0, finished=stamp(31)))
    late["status"]["startTime"] = stamp(1)
    counted = make_job()
    counted["status"]["completedIndexes"] = "0-1"
    assert demo.classify_attempt(late, honest_log("p"), counted, True) == (None, None)
    # Else it may be a program that exits 0 when stopped at its deadline: it ran out of time.
    assert demo.classify_attempt(late, honest_log("p"), uncounted, True)[0] == "episode"
    stopped = timed_out(indexed_pod("p", 1, phase="Failed", exit_code=137))
    stopped["status"]["startTime"] = stamp(1)
    assert demo.classify_attempt(stopped, honest_log("p"), counted, True)[0] == "episode"


# --------------------------------------------------------------------------
# When an outcome is final while the batch runs.


def test_a_success_settles_once_its_log_is_read() -> None:
    pod = indexed_pod("p", 0)
    assert not demo.settled_attempt([pod], running_job(), 0, {}, may_retry=True)
    assert demo.settled_attempt([pod], running_job(), 0, {"p": honest_log("p")}, may_retry=True)
    running = indexed_pod("p", 0, phase="Running", exit_code=None)
    assert not demo.settled_attempt([running], running_job(), 0, {"p": ""}, may_retry=False)


def test_a_failure_settles_at_once_without_retries_else_when_the_job_will_not_retry_it() -> None:
    pod = indexed_pod("p", 0, phase="Failed", exit_code=137)
    assert demo.settled_attempt([pod], running_job(), 0, {"p": ""}, may_retry=False)
    assert not demo.settled_attempt([pod], running_job(), 0, {"p": ""}, may_retry=True)
    assert demo.settled_attempt(
        [pod], running_job(failed_indexes="0,2-3"), 0, {"p": ""}, may_retry=True
    )
    assert not demo.settled_attempt(
        [pod], running_job(failed_indexes="1,2-3"), 0, {"p": ""}, may_retry=True
    )
    ended = running_job({"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded"})
    assert demo.settled_attempt([pod], ended, 0, {"p": ""}, may_retry=True)


def test_a_deleted_pod_waits_for_the_jobs_word_on_why() -> None:
    pod = deleted(indexed_pod("p", 0, phase="Failed", exit_code=143))
    assert not demo.settled_attempt([pod], running_job(), 0, {"p": ""}, may_retry=False)
    assert demo.settled_attempt([pod], running_job(NEED_MET), 0, {"p": ""}, may_retry=False)


def test_every_attempts_log_is_needed_and_a_container_that_never_ran_has_none() -> None:
    first = indexed_pod("a", 0, phase="Failed", exit_code=137, created=stamp(1))
    second = indexed_pod("b", 0, failures=1, created=stamp(2))
    logs = {"b": honest_log("b")}
    assert not demo.settled_attempt([first, second], running_job(), 0, logs, may_retry=True)
    assert demo.settled_attempt([first, second], running_job(), 0, dict(logs, a=""), may_retry=True)
    never = indexed_pod("c", 0, phase="Failed", exit_code=None)
    never["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ErrImagePull"}}
    assert demo.ended_logs([never], {}) == {"c": ""}
    ended = indexed_pod("d", 0)
    assert demo.ended_logs([ended], {"d": ("containerd://other", "x")}) == {}
    assert demo.ended_logs([ended], {"d": ("containerd://d", "x")}) == {"d": "x"}


def test_index_lists_read_as_the_job_controller_writes_them() -> None:
    assert demo.index_list("0,2-4,9") == {0, 2, 3, 4, 9}
    assert demo.index_list("") == set() and demo.index_list("x,1") == {1}


# --------------------------------------------------------------------------
# Delivery figures.


def test_delivery_figures_count_from_the_create_call_and_the_earliest_possible_end() -> None:
    deliveries = [
        demo.Delivery(0, True, 110.5, 110.0, 110.25, True, 110.25),
        demo.Delivery(1, False, 112.0, 111.0, 112.0, True, 111.75),
        demo.Delivery(2, True, 113.0, 112.9, None, True),
        demo.Delivery(3, True, 120.0, None, None, False),
    ]
    figures = demo.delivery_figures(deliveries, 100.0, 0.25, need=2)
    assert figures["first_reward_seconds"] == 10.5
    assert figures["kth_reward_seconds"] == 13.0
    assert figures["reward_delivery_lag_p50_seconds"] == 0.5
    assert figures["reward_delivery_lag_max_seconds"] == 1.0
    assert figures["reward_delivery_lag_p99_seconds"] == pytest.approx(0.99, abs=0.001)
    assert figures["reward_delivery"]["lag_samples"] == 3
    assert figures["reward_delivery"]["seen_to_written_p50_seconds"] == 0.25
    assert figures["reward_delivery"]["lag_precision_seconds"] == 1.0
    assert figures["reward_delivery"]["written_after_the_end"] == 1
    assert figures["reward_delivery"]["origin_precision_seconds"] == 0.25
    assert "kth_reward_seconds" not in demo.delivery_figures(deliveries, 100.0, 0.25, need=None)
    assert demo.delivery_figures(deliveries[:2], 100.0, None, need=2)["kth_reward_seconds"] is None


def test_a_containers_end_lies_after_its_reward_and_within_its_finished_second() -> None:
    pod = indexed_pod("p", 0, finished=stamp(9))
    finished = demo.parse_time(stamp(9))
    assert demo.container_end_bounds(
        pod, honest_log("p", reward_at=finished + 0.4), finished + 0.7
    ) == (finished + 0.4, finished + 0.7)
    assert demo.container_end_bounds(pod, "", None) == (finished, finished + 1.0)
    assert demo.container_end_bounds(None, "", None) == (None, None)


# --------------------------------------------------------------------------
# The stream itself.


class Seen:
    """What the stream saw of the batch: pods, their early logs, the Job."""

    def __init__(self) -> None:
        self.state = demo.BatchState()
        self.early: dict[str, tuple[str, str]] = {}

    def pod(self, pod: dict, log: str | None = None) -> str:
        self.state.apply("pods", "MODIFIED", pod, T0 + 10)
        if log is not None:
            self.early[pod["metadata"]["name"]] = (f"containerd://{pod['metadata']['name']}", log)
        return pod["metadata"]["name"]


def stream_settings(count: int, retries: int = 0) -> demo.Settings:
    return demo.Settings(count=count, parallelism=count, rollout=True, retries=retries)


def test_lines_are_appended_as_episodes_settle_and_rewritten_in_index_order(tmp_path: Any) -> None:
    path = tmp_path / "rewards.jsonl"
    told: list[dict] = []
    stream = demo.RewardStream(str(path), stream_settings(3), told.append)
    seen = Seen()
    seen.state.apply("job", "MODIFIED", running_job(), T0 + 1)
    stream.judge(seen.state, seen.early, [seen.pod(indexed_pod("p2", 2), honest_log("p2"))])
    stream.judge(seen.state, seen.early, [seen.pod(indexed_pod("p0", 0))])  # its log not read yet
    written = path.read_text().splitlines()
    assert [json.loads(line)["index"] for line in written] == [2]
    seen.pod(indexed_pod("p0", 0), honest_log("p0"))
    stream.judge(seen.state, seen.early, ["p0"])
    assert path.read_text().splitlines()[0] == written[0]  # never rewritten while the batch runs
    assert [row["index"] for row in told] == [2, 0]
    # At the end: the rows from the evidence; the lines written keep their text, the rest are added.
    final_rows = [
        dict(demo.episode_row(i, [], running_job(), {}, True, None, 1), note="from the end")
        for i in range(3)
    ]
    rows = stream.finish(final_rows, [], {}, {})
    assert [row["index"] for row in rows] == [0, 1, 2]
    lines = path.read_text().splitlines()
    assert (
        lines[2] == written[0]
        and "note" not in json.loads(lines[0])
        and json.loads(lines[1])["note"]
    )
    assert [d.streamed for d in stream.deliveries] == [True, True, False]


def test_a_line_waits_until_every_job_of_its_batch_was_seen(tmp_path: Any) -> None:
    """Its times count from the batch's first Job's creation: a pod seen ended before the Jobs (a
    slow Job watch, one Job of several seen) waits for them, never counted from 1970."""
    stream = demo.RewardStream(str(tmp_path / "rewards.jsonl"), stream_settings(3))
    seen = Seen()
    stream.judge(seen.state, seen.early, [seen.pod(indexed_pod("p2", 2), honest_log("p2"))])
    assert stream.rows == {} and stream.waiting == {2}
    one_of_two = running_job(completions=2)  # the merged view of the Jobs seen so far
    seen.state.apply("job", "MODIFIED", one_of_two, T0 + 1)
    stream.judge(seen.state, seen.early, None)
    assert stream.rows == {}
    seen.state.apply("job", "MODIFIED", running_job(completions=3), T0 + 2)
    stream.judge(seen.state, seen.early, None)
    line = stream.rows[2]
    assert line["failure_class"] is None and 0 < line["batch_to_ready_seconds"] < 60
    # An episode's row without the Job's creation has no batch times, rather than times from 1970.
    unknown = {"metadata": {}, "spec": {"completions": 3}}
    row = demo.episode_row(
        2, [indexed_pod("p2", 2)], unknown, {"p2": honest_log("p2")}, True, None, 1
    )
    assert row["batch_to_ready_seconds"] is None and row["pod_to_ready_seconds"] is not None


def test_a_failure_waits_for_the_jobs_word_when_it_may_be_retried(tmp_path: Any) -> None:
    stream = demo.RewardStream(str(tmp_path / "rewards.jsonl"), stream_settings(2, retries=1))
    seen = Seen()
    seen.state.apply("job", "MODIFIED", running_job(completions=2), T0 + 1)
    stream.judge(
        seen.state, seen.early, [seen.pod(indexed_pod("p1", 1, phase="Failed", exit_code=1), "")]
    )
    assert stream.rows == {} and stream.waiting == {1}
    seen.state.apply("job", "MODIFIED", running_job(failed_indexes="1", completions=2), T0 + 2)
    stream.judge(seen.state, seen.early, None)
    assert stream.rows[1]["failure_class"] == "episode" and stream.waiting == set()


def test_a_callback_that_raises_stops_the_run_with_its_own_exception(tmp_path: Any) -> None:
    def refuse(row: dict) -> None:
        raise ValueError("trainer full")

    stream = demo.RewardStream(str(tmp_path / "rewards.jsonl"), stream_settings(1), refuse)
    seen = Seen()
    seen.state.apply("job", "MODIFIED", running_job(completions=1), T0 + 1)
    with pytest.raises(demo.RewardCallbackError) as caught:
        stream.judge(seen.state, seen.early, [seen.pod(indexed_pod("p", 0), honest_log("p"))])
    assert isinstance(caught.value.original, ValueError)
    assert (
        json.loads((tmp_path / "rewards.jsonl").read_text())["index"] == 0
    )  # the line was written first


# --------------------------------------------------------------------------
# Manifests and refusals.


def test_need_makes_an_indexed_job_with_a_success_policy_absorbing_count_minus_k_failures() -> None:
    settings = demo.Settings(
        count=8,
        parallelism=8,
        image="img",
        runtime="cube",
        timeout=240,
        rollout=True,
        need=6,
        episode_timeout=45,
    )
    spec = demo.batch_job("ns", settings, "rollout", [])["spec"]
    assert spec["successPolicy"] == {"rules": [{"succeededCount": 6}]}
    assert (spec["completionMode"], spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (
        "Indexed",
        0,
        2,
    )
    # The launcher keeps the episode's 45 s; the pod's deadline, a backstop, leaves room to start.
    assert spec["template"]["spec"]["activeDeadlineSeconds"] == 45 + 30
    plain = demo.job_manifest("ns", 2, 2, "img", "cube")["spec"]
    assert "successPolicy" not in plain and "activeDeadlineSeconds" not in plain["template"]["spec"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--count", "4", "--need", "4"], "--need 4 must be fewer than the 4 episodes"),
        (["--need", "0"], "argument --need: must be at least 1, got 0"),
        (
            ["--tasks", "{tasks}", "--group-size", "2", "--need", "3"],
            "--need cannot hold with --group-size",
        ),
        (
            ["--count", "4", "--need", "2", "--allow-failures", "1"],
            "--need already accepts count - K = 2 failed episodes: leave out --allow-failures",
        ),
        (
            ["--count", "4", "--need", "2", "--rounds", "2"],
            "--tasks, --retries, --allow-failures and --need run one batch",
        ),
        (["--episode-timeout", "0"], "argument --episode-timeout: must be at least 1, got 0"),
    ],
)
def test_combinations_that_cannot_hold_are_usage_errors(
    extra: list[str], message: str, tmp_path: Any, capsys: pytest.CaptureFixture
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n{"id": "b"}\n')
    argv = ["run", "--output", str(tmp_path / "out")] + [a.format(tasks=tasks) for a in extra]
    assert message in usage_message(argv, capsys)
    assert not (tmp_path / "out").exists()


def test_the_help_says_whose_clock_the_episode_deadline_is(
    capsys: pytest.CaptureFixture,
) -> None:
    with pytest.raises(SystemExit):
        demo.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    timeout = text[text.index("--episode-timeout S ") :]
    assert (
        "S seconds after its program started (in a rollout, its launcher keeps the time)" in timeout
    )
    assert "a valid sample, never retried" in timeout
    assert "Without --tasks or another rollout option, the pod's deadline is S itself" in timeout


def test_episode_timeout_holds_with_retries(tmp_path: Any, capsys: pytest.CaptureFixture) -> None:
    """A hang is the episode's failure (its launcher stops it and the pod ends 0: never retried);
    only the infrastructure's losses are retried, the pod's deadline a backstop past S."""
    listing = demo.run_batch(
        output=tmp_path / "out", count=2, retries=2, episode_timeout=30, dry_run=True
    )
    job = listing["items"][-1]
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimitPerIndex"] == 2
    assert pod["activeDeadlineSeconds"] == 30 + demo.EPISODE_TIMEOUT_SLACK_SECONDS
    assert {"name": "EPISODE_TIMEOUT_SECONDS", "value": "30"} in pod["containers"][0]["env"]


def test_the_help_names_every_combination_need_is_refused_with(
    capsys: pytest.CaptureFixture,
) -> None:
    with pytest.raises(SystemExit):
        demo.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    need = text[text.index("--need K ") : text.index("--episode-timeout S ")]
    # Each refusal of test_combinations_that_cannot_hold_are_usage_errors and
    # test_need_with_several_images_is_refused (test_e2e_images.py).
    assert "1 <= K < count" in need
    assert "not with --group-size, --allow-failures, --rounds or --warmup" in need
    assert "nor with tasks of several images" in need
    assert "Needs Kubernetes >= 1.33" in need


# The same refusals from Python: named as keywords (need=, count=), by run_batch() and
# stream_batch() alike, before anything is created.
TWO_IMAGES = [{"id": "a", "image": "img:1"}, {"id": "b", "image": "img:2"}]


@pytest.mark.parametrize(
    "tasks, keywords, message",
    [
        (None, {"count": 4, "need": 4}, "need=4 must be fewer than the 4 episodes"),
        (None, {"need": 10}, "need=10 must be fewer than the 10 episodes"),
        (None, {"count": 4, "need": 0}, "need=0: must be at least 1, got 0"),
        (
            [{"id": "a"}, {"id": "b"}],
            {"group_size": 2, "need": 3},
            "need= cannot hold with group_size=: the Job stops whichever episodes",
        ),
        (
            None,
            {"count": 4, "need": 2, "allow_failures": 1},
            "need= already accepts count - K = 2 failed episodes: leave out allow_failures=",
        ),
        (None, {"count": 4, "need": 2, "rounds": 2}, "leave out rounds= and warmup="),
        (None, {"count": 4, "need": 2, "warmup": True}, "leave out rounds= and warmup="),
        (TWO_IMAGES, {"need": 1}, "need= cannot hold with tasks of 2 images"),
        (None, {"episode_timeout": 0}, "episode_timeout=0: must be at least 1, got 0"),
    ],
)
@pytest.mark.parametrize("function", [demo.run_batch, demo.stream_batch])
def test_python_refuses_what_cannot_hold_naming_the_keywords(
    function: Any, tasks: Any, keywords: dict, message: str, tmp_path: Any
) -> None:
    if tasks is not None:
        script = tmp_path / "ep.py"
        script.write_text("print('episode')\n")
        keywords = dict(keywords, episode_script=str(script))
    with pytest.raises(demo.UsageError) as refused:
        # stream_batch() too refuses at the call, before its first next().
        function(tasks, output=tmp_path / "out", kubectl="/nonexistent/kubectl", **keywords)
    assert message in str(refused.value)
    assert "--" not in str(refused.value)  # no flag's spelling: the caller wrote keywords
    assert not (tmp_path / "out").exists()


def test_stream_batch_takes_every_argument_of_run_batch_but_on_reward(tmp_path: Any) -> None:
    import inspect

    run = inspect.signature(demo.run_batch).parameters
    stream = inspect.signature(demo.stream_batch).parameters
    assert [name for name in run if name != "on_reward"] == list(stream)
    assert all(run[name] == stream[name] for name in stream)
    with pytest.raises(demo.KeywordTypeError, match="stream_batch\\(\\) yields each line itself"):
        demo.stream_batch(count=2, output=tmp_path / "out", on_reward=print)
    with pytest.raises(demo.KeywordTypeError, match="unexpected keyword argument 'cout'"):
        demo.stream_batch(cout=2, output=tmp_path / "out")
    # A dry run's listing is the generator's return value, as run_batch()'s return.
    stream_run = demo.stream_batch(count=2, output=tmp_path / "out", dry_run=True)
    with pytest.raises(StopIteration) as stopped:
        next(stream_run)
    assert [item["kind"] for item in stopped.value.value["items"]] == [
        item["kind"]
        for item in demo.run_batch(count=2, output=tmp_path / "out", dry_run=True)["items"]
    ]
