"""Unit tests of what lets a run be found and reaped without its receipt: the annotations
its namespace is created with, `--ttl` and `--stale` durations, a run's state as `list`
shows it, and what `cleanup --stale` decides for each run (pure functions, no cluster).
"""

from __future__ import annotations

import calendar
import json
from typing import Any

import pytest

import all_names as demo
from rl_batch_demo import main

NAMESPACE = "agc-rl-0123456789ab"
RUN_ID = "0123456789ab"
T0 = calendar.timegm((2026, 11, 29, 20, 0, 0))


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("2H", 7200),
        (" 45m ", 2700),
        ("1d2h3m4s", 86400 + 7200 + 180 + 4),
    ],
)
def test_durations_are_read_in_seconds(text: str, seconds: int) -> None:
    assert demo.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "2", "h", "2x", "1.5h", "-1h", "0s", "0h0m", "2h junk", "30 m", "m30"]
)
def test_a_bad_duration_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        demo.parse_duration(text)


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (0, "0s"),
        (45.9, "45s"),
        (119, "119s"),
        (120, "2m"),
        (3599, "59m"),
        (3600, "1h"),
        (3660, "1h1m"),
        (86399, "23h59m"),
        (86400, "24h"),
        (2 * 86400 + 4 * 3600 + 59, "2d4h"),
        (-5, "0s"),
    ],
)
def test_durations_are_shown_as_kubectl_shows_an_age(seconds: float, shown: str) -> None:
    assert demo.format_duration(seconds) == shown


def test_times_are_written_as_kubernetes_writes_them() -> None:
    assert demo.rfc3339(T0 + 0.9) == "2026-11-29T20:00:00Z"
    assert demo.parse_time(demo.rfc3339(T0)) == T0


def origin(**changes: Any) -> demo.RunOrigin:
    fields = dict(
        run_id=RUN_ID,
        version="0.1.0",
        host="bastion-1",
        output="/home/me/runs/first",
        user="alice@example.com",
        expires_at=None,
    )
    fields.update(changes)
    return demo.RunOrigin(**fields)


def test_the_namespace_says_who_made_the_run_and_from_where() -> None:
    manifest = demo.namespace_manifest(NAMESPACE, RUN_ID, origin=origin())
    assert manifest == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": NAMESPACE,
            "labels": {"agc-demo-run": RUN_ID},
            "annotations": {
                "rl-batch-demo.agc/run-id": RUN_ID,
                "rl-batch-demo.agc/version": "0.1.0",
                "rl-batch-demo.agc/host": "bastion-1",
                "rl-batch-demo.agc/output": "/home/me/runs/first",
                "rl-batch-demo.agc/user": "alice@example.com",
            },
        },
    }


def test_a_ttl_puts_the_expiry_on_the_namespace() -> None:
    annotations = demo.namespace_manifest(
        NAMESPACE, RUN_ID, harden=True, origin=origin(expires_at=T0 + 7200)
    )["metadata"]["annotations"]
    assert annotations["rl-batch-demo.agc/expires-at"] == "2026-11-29T22:00:00Z"


def test_the_guides_namespace_has_no_annotations() -> None:
    assert "annotations" not in demo.namespace_manifest(NAMESPACE, RUN_ID)["metadata"]
    settings = demo.Settings(count=3, parallelism=3, rounds=2)
    plan = demo.plan_run(NAMESPACE, RUN_ID, settings, demo.WORKER_SOURCE)  # no origin: no plan said
    assert "annotations" not in plan.namespace["metadata"]


@pytest.mark.parametrize(
    "argv, jobs, episodes",
    [
        ([], "1", "5"),
        (["--rounds", "3"], "3", "15"),
        (["--warmup", "--rounds", "2"], "3", "15"),
    ],
)
def test_the_namespace_says_how_many_jobs_and_episodes_the_run_plans(
    tmp_path, capsys, argv, jobs, episodes
) -> None:
    output = tmp_path / "out"
    assert main(["run", "--dry-run", "--count", "5", "--output", str(output), *argv]) == 0
    annotations = json.loads(capsys.readouterr().out)["items"][0]["metadata"]["annotations"]
    assert annotations["rl-batch-demo.agc/jobs-planned"] == jobs
    assert annotations["rl-batch-demo.agc/episodes-planned"] == episodes


def test_a_run_with_an_image_per_task_plans_a_job_per_image_and_batch() -> None:
    tasks = [demo.Task(str(n), n, "{}", image) for n, image in enumerate(["a:1", "b:1", "a:1"])]
    settings = demo.Settings(
        count=6, parallelism=2, builtin=False, group_size=2, rollout=True, rounds=2, warmup=True
    )
    plan = demo.plan_run(NAMESPACE, RUN_ID, settings, "print()", tasks, origin())
    assert [len(jobs) for jobs in plan.jobs.values()] == [2, 2, 2]
    annotations = plan.namespace["metadata"]["annotations"]
    assert (
        annotations["rl-batch-demo.agc/jobs-planned"],
        annotations["rl-batch-demo.agc/episodes-planned"],
    ) == ("6", "18")


def test_dry_run_shows_the_annotations_and_the_expiry(tmp_path, capsys) -> None:
    output = tmp_path / "out"
    assert main(["run", "--dry-run", "--output", str(output), "--ttl", "30m"]) == 0
    namespace = json.loads(capsys.readouterr().out)["items"][0]
    annotations = namespace["metadata"]["annotations"]
    assert (
        annotations["rl-batch-demo.agc/run-id"] == namespace["metadata"]["labels"]["agc-demo-run"]
    )
    assert annotations["rl-batch-demo.agc/output"] == str(output.resolve())
    assert annotations["rl-batch-demo.agc/user"] == demo.USER_UNKNOWN_BEFORE_RUN
    expires = demo.parse_time(annotations["rl-batch-demo.agc/expires-at"])
    assert 1700 < expires - demo.time.time() <= 1800
    assert not output.exists()


@pytest.mark.parametrize(
    "ttl, message",
    [
        (["--ttl", "soon"], "argument --ttl: not a duration: 'soon'"),
        # A value that starts with a dash reaches the check: not "expected one argument".
        (["--ttl", "-5m"], "argument --ttl: a duration is never negative: '-5m' (e.g. 90s"),
        (["--ttl", "--quiet"], "argument --ttl: expected one argument"),  # a flag is a flag
    ],
)
def test_a_bad_ttl_is_a_usage_error(tmp_path, capsys, ttl, message) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--output", str(tmp_path / "out"), *ttl])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_negative_ttl_from_python_is_a_usage_error(tmp_path) -> None:
    for given in ({"ttl": "-5m"}, {"options": ["--ttl", "-5m"]}):
        with pytest.raises(demo.UsageError, match="a duration is never negative: '-5m'"):
            demo.run_batch(count=1, output=str(tmp_path / "out"), **given)
    assert not (tmp_path / "out").exists()


def test_run_batch_takes_the_ttl_as_the_flag_does(tmp_path) -> None:
    listing = demo.run_batch(output=tmp_path / "out", count=1, dry_run=True, ttl="1h30m")
    expires = demo.parse_time(
        listing["items"][0]["metadata"]["annotations"]["rl-batch-demo.agc/expires-at"]
    )
    assert 5300 < expires - demo.time.time() <= 5400
    with pytest.raises(demo.UsageError, match="ttl='soon'"):
        demo.run_batch(output=tmp_path / "out", count=1, dry_run=True, ttl="soon")


# --------------------------------------------------------------------------
# A run's state, and what `cleanup --stale` does with it.


def namespace(
    name: str = NAMESPACE,
    run_id: str = RUN_ID,
    annotated: bool = True,
    user: str = "alice",
    expires: str | None = None,
    terminating: bool = False,
    planned: tuple[int, int] | None = None,
) -> dict:
    annotations = (
        {
            "rl-batch-demo.agc/run-id": run_id,
            "rl-batch-demo.agc/user": user,
            "rl-batch-demo.agc/host": "bastion-1",
            "rl-batch-demo.agc/output": "/runs/a",
        }
        if annotated
        else {}
    )
    if expires:
        annotations["rl-batch-demo.agc/expires-at"] = expires
    if planned:
        annotations["rl-batch-demo.agc/jobs-planned"] = str(planned[0])
        annotations["rl-batch-demo.agc/episodes-planned"] = str(planned[1])
    metadata = {
        "name": name,
        "uid": "uid-" + name,
        "labels": {"agc-demo-run": run_id},
        "creationTimestamp": demo.rfc3339(T0),
        "annotations": annotations,
    }
    if terminating:
        metadata["deletionTimestamp"] = demo.rfc3339(T0 + 10)
    return {"metadata": metadata, "status": {"phase": "Terminating" if terminating else "Active"}}


def job(
    ns: str = NAMESPACE,
    end: str | None = "Complete",
    completions: int = 3,
    succeeded: int = 3,
    app: str = "rl-batch-demo",
    name: str = "rollout",
    ended_at: float | None = None,
    reason: str | None = None,
) -> dict:
    conditions = (
        [{"type": end, "status": "True"}]
        if end
        else [{"type": "SuccessCriteriaMet", "status": "True"}]
    )
    if ended_at is not None:
        conditions[0]["lastTransitionTime"] = demo.rfc3339(ended_at)
    if reason is not None:
        conditions[0]["reason"] = reason
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"completions": completions},
        "status": {"succeeded": succeeded, "conditions": conditions},
    }


def suspended(job: dict) -> dict:
    """The Job as an interrupted run leaves it: suspended."""
    job["spec"]["suspend"] = True
    if not any(c["type"] in ("Complete", "Failed") for c in job["status"]["conditions"]):
        job["status"]["conditions"] = [{"type": "Suspended", "status": "True"}]
    return job


@pytest.mark.parametrize(
    "jobs, terminating, state",
    [
        ([job()], False, "succeeded"),
        ([job(), job(end="Failed")], False, "failed"),
        (
            [job(end="Failed"), job(end=None)],
            False,
            "running",
        ),  # criteria met, pods still terminating: not ended
        ([], False, "pending"),
        ([job(end=None)], True, "terminating"),
        # Interrupted: its Job suspended (its pods stopped), not ended.
        ([suspended(job(end=None))], False, "suspended"),
        ([job(), suspended(job(end=None))], False, "suspended"),
        ([suspended(job(end=None)), job(end=None)], False, "running"),
        ([suspended(job(end="Failed"))], False, "failed"),
    ],
)
def test_a_runs_state_comes_from_its_namespace_and_jobs(jobs, terminating, state) -> None:
    assert demo.run_state(namespace(terminating=terminating), jobs) == state
    assert state in demo.RUN_STATES


@pytest.mark.parametrize(
    "planned, jobs, state",
    [
        # Round 1 of 2 ended, round 2 not made yet: between batches, running.
        ((2, 6), [job(name="rollout-1")], "running"),
        ((3, 9), [job(name="rollout-warmup"), job(name="rollout-1")], "running"),
        # A batch whose failures --allow-failures accepts ends Failed (FailedIndexes); the run goes on.
        ((2, 6), [job(name="rollout-1", end="Failed", reason="FailedIndexes")], "running"),
        # A batch that failed as a run stops: the run stopped there.
        ((2, 6), [job(name="rollout-1", end="Failed", reason="BackoffLimitExceeded")], "failed"),
        (
            (2, 6),
            [job(name="rollout-1", end="Failed", reason="MaxFailedIndexesExceeded")],
            "failed",
        ),
        ((2, 6), [job(name="rollout-1", end="Failed", reason="DeadlineExceeded")], "failed"),
        # Every Job it plans is there and ended.
        ((2, 6), [job(name="rollout-1"), job(name="rollout-2")], "succeeded"),
        (
            (2, 6),
            [job(name="rollout-1", end="Failed", reason="FailedIndexes"), job(name="rollout-2")],
            "failed",
        ),
        # A run of an older version says nothing of its plan: as before.
        (None, [job(name="rollout-1")], "succeeded"),
    ],
)
def test_a_run_with_fewer_jobs_than_it_plans_is_running_between_batches(
    planned, jobs, state
) -> None:
    assert demo.run_state(namespace(planned=planned), jobs) == state
    (run,) = demo.cluster_runs([namespace(planned=planned)], jobs)
    assert run.state == state
    assert run.between_batches is (state == "running")
    assert run.jobs_planned == (planned[0] if planned else None)


def test_between_batches_the_total_is_what_the_run_plans() -> None:
    (run,) = demo.cluster_runs(
        [namespace(planned=(3, 15))],
        [
            job(name="rollout-warmup", completions=5, succeeded=5, ended_at=T0 + 60),
            job(name="rollout-1", completions=5, succeeded=4, ended_at=T0 + 120),
        ],
    )
    assert (run.state, run.jobs, run.episodes, run.succeeded) == ("running", 2, 15, 9)
    record = demo.run_record(run, T0 + 180)
    assert (record["state"], record["episodes"], record["succeeded"]) == ("running", 15, 9)
    assert (record["jobs"], record["jobs_planned"], record["between_batches"]) == (2, 3, True)
    assert record["last_job_ended"] == demo.rfc3339(T0 + 120)
    assert demo.runs_table([run], T0 + 180).splitlines()[1].split()[1:4] == [
        "running",
        "3m",
        "9/15",
    ]
    # While a Job runs the run is running, not between batches; once all it plans ended, it is done.
    (running,) = demo.cluster_runs(
        [namespace(planned=(2, 10))], [job(name="rollout-1", completions=5), job(end=None)]
    )
    assert (running.state, running.between_batches, running.episodes) == ("running", False, 10)


def test_runs_are_namespaces_with_the_label_and_the_tools_jobs_inside() -> None:
    runs = demo.cluster_runs(
        [
            namespace(),
            namespace("agc-rl-guide0000000", "guide0000000", annotated=False),
            {"metadata": {"name": "unrelated", "uid": "u", "labels": {}}},
        ],
        [
            job(completions=3, succeeded=2, end=None),
            job(completions=4, succeeded=4),
            job(app="someone-else"),
            job("agc-rl-guide0000000", completions=2, succeeded=2),
        ],
    )
    assert [run.namespace for run in runs] == [NAMESPACE, "agc-rl-guide0000000"]
    ours, guide = runs
    assert (ours.state, ours.jobs, ours.episodes, ours.succeeded, ours.guide) == (
        "running",
        2,
        7,
        6,
        False,
    )
    assert (guide.state, guide.guide, guide.user) == ("succeeded", True, None)
    record = demo.run_record(ours, T0 + 3600.4)
    assert record == {
        "namespace": NAMESPACE,
        "uid": "uid-" + NAMESPACE,
        "run_id": RUN_ID,
        "state": "running",
        "age_seconds": 3600,
        "episodes": 7,
        "succeeded": 6,
        "user": "alice",
        "host": "bastion-1",
        "output": "/runs/a",
        "expires": None,
        "guide": False,
        "jobs": 2,
        "jobs_planned": None,
        "between_batches": False,
        "last_job_ended": None,
        "follower": None,
    }
    assert demo.run_record(guide, T0)["run_id"] == "guide0000000"
    table = demo.runs_table(runs, T0 + 3600).splitlines()
    assert table[0].split() == [
        *("NAMESPACE", "STATE", "AGE", "EPISODES", "USER", "FROM", "EXPIRES", "FOLLOWER")
    ]
    assert table[1].split() == [
        NAMESPACE,
        "running",
        "1h",
        "6/7",
        "alice",
        "bastion-1:/runs/a",
        "-",
        "-",
    ]
    assert table[2].split() == [
        "agc-rl-guide0000000",
        "succeeded",
        "1h",
        "2/2",
        "-",
        "(guide's",
        "script)",
        "-",
        "-",
    ]


HOUR = 3600


def verdict(
    ns: dict, jobs: list, now: float = T0 + 2 * HOUR, user: str = "alice", all_users: bool = False
):
    return demo.stale_verdict(demo.cluster_runs([ns], jobs)[0], now, HOUR, user, all_users)


@pytest.mark.parametrize(
    "ns, jobs, now, user, all_users, delete, why",
    [
        (
            namespace(),
            [job()],
            T0 + 2 * HOUR,
            "alice",
            False,
            True,
            "succeeded, 2h old: older than --stale 1h",
        ),
        (namespace(), [job(end="Failed")], T0 + 2 * HOUR, "alice", False, True, "failed, 2h old"),
        (namespace(), [job()], T0 + 30 * 60, "alice", False, False, "younger than --stale 1h"),
        (namespace(), [job(end=None)], T0 + 9 * HOUR, "alice", False, False, "still running"),
        # An interrupted run whose Job was suspended: stale by its age, as an ended one.
        (
            namespace(),
            [suspended(job(end=None))],
            T0 + 2 * HOUR,
            "alice",
            False,
            True,
            "suspended, 2h old: older than --stale 1h",
        ),
        (
            namespace(),
            [suspended(job(end=None))],
            T0 + 30 * 60,
            "alice",
            False,
            False,
            "suspended, 30m old: younger than --stale 1h",
        ),
        (
            namespace(expires=demo.rfc3339(T0 + 60)),
            [job(end=None)],
            T0 + 120,
            "alice",
            False,
            True,
            "running, past its --ttl (expired 60s ago)",
        ),
        (
            namespace(expires=demo.rfc3339(T0 + 3 * HOUR)),
            [job(end=None)],
            T0 + 2 * HOUR,
            "alice",
            False,
            False,
            "still running",
        ),
        (
            namespace(user="bob"),
            [job()],
            T0 + 2 * HOUR,
            "alice",
            False,
            False,
            "started by bob, not by you (alice)",
        ),
        (namespace(user="bob"), [job()], T0 + 2 * HOUR, "alice", True, True, "older than --stale"),
        (
            namespace(user="bob", expires=demo.rfc3339(T0)),
            [job()],
            T0 + 2 * HOUR,
            "alice",
            False,
            False,
            "started by bob",
        ),
        (
            namespace(annotated=False),
            [job()],
            T0 + 9 * HOUR,
            "alice",
            True,
            False,
            "made by the guide's script",
        ),
        (
            namespace(),
            [],
            T0 + 9 * HOUR,
            "alice",
            True,
            False,
            "no Job labelled app=rl-batch-demo inside",
        ),
        (namespace(), [job(app="copycat")], T0 + 9 * HOUR, "alice", True, False, "no Job labelled"),
        (
            namespace("agc-rl-aaaaaaaaaaaa"),
            [job("agc-rl-aaaaaaaaaaaa")],
            T0 + 9 * HOUR,
            "alice",
            True,
            False,
            "disagree: not proven",
        ),
        (
            namespace(terminating=True),
            [job()],
            T0 + 9 * HOUR,
            "alice",
            True,
            False,
            "already being deleted",
        ),
    ],
)
def test_what_cleanup_stale_deletes_and_why(ns, jobs, now, user, all_users, delete, why) -> None:
    decided = verdict(ns, jobs, now, user, all_users)
    assert decided.delete is delete
    assert why in decided.why


@pytest.mark.parametrize(
    "ns, jobs, now, delete, why",
    [
        # Alive between its batches: 2h old, round 1 ended a minute ago.
        (
            namespace(planned=(2, 6)),
            [job(name="rollout-1", ended_at=T0 + 2 * HOUR - 60)],
            T0 + 2 * HOUR,
            False,
            "between batches (1 of 2 Jobs made, the last ended 60s ago): may still make its next",
        ),
        (
            namespace(planned=(3, 9)),
            [
                job(name="rollout-warmup", ended_at=T0 + 60),
                job(name="rollout-1", end="Failed", reason="FailedIndexes", ended_at=T0 + 90 * 60),
            ],
            T0 + 2 * HOUR,
            False,
            "between batches (2 of 3 Jobs made, the last ended 30m ago)",
        ),
        # Stopped there (killed, crashed): its last Job ended longer ago than --stale.
        (
            namespace(planned=(2, 6)),
            [job(name="rollout-1", ended_at=T0 + 30 * 60)],
            T0 + 2 * HOUR,
            True,
            "stopped between batches (1 of 2 Jobs made, the last ended 1h30m ago): longer ago "
            "than --stale 1h",
        ),
        # No end time to judge by: only the --ttl.
        (
            namespace(planned=(2, 6)),
            [job(name="rollout-1")],
            T0 + 9 * HOUR,
            False,
            "no end time on its Jobs): may still make its next, only its --ttl reaps it",
        ),
        # Past its --ttl, alive or not, as any run.
        (
            namespace(planned=(2, 6), expires=demo.rfc3339(T0 + HOUR)),
            [job(name="rollout-1", ended_at=T0 + 2 * HOUR - 60)],
            T0 + 2 * HOUR,
            True,
            "running (between batches), past its --ttl (expired 1h ago)",
        ),
    ],
)
def test_cleanup_stale_leaves_a_run_between_batches_until_its_last_job_ended_stale_ago(
    ns, jobs, now, delete, why
) -> None:
    decided = verdict(ns, jobs, now)
    assert decided.delete is delete
    assert why in decided.why, decided.why


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["cleanup", "--stale", "1h", "--output", "runs/a"],
            "--stale finds the runs in the cluster",
        ),
        (["cleanup", "runs/a", "--dry-run"], "--dry-run goes with --stale AGE"),
        (["cleanup", "runs/a", "--all-users"], "--all-users goes with --stale AGE"),
        (["cleanup", "--output", "runs/a", "--context", "x"], "--context goes with --stale AGE"),
        (["cleanup", "--stale", "old"], "not a duration: 'old'"),
        (["cleanup", "--stale", "-5m"], "argument --stale: a duration is never negative: '-5m'"),
        (["list", "-o", "yaml"], "invalid choice: 'yaml'"),
    ],
)
def test_cleanup_stale_and_list_usage_errors(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_run_with_every_job_it_plans_or_one_that_failed_is_judged_by_its_age_as_before() -> None:
    recent = T0 + 2 * HOUR - 60  # the last Job ended a minute ago; the run is 2h old
    # Round 2 of 2 has not been made yet: left, alive as far as anyone can tell.
    assert not verdict(namespace(planned=(2, 6)), [job(name="rollout-1", ended_at=recent)]).delete
    for ns, jobs, why in [
        # Every Job it plans is there and ended.
        (
            namespace(planned=(2, 6)),
            [job(name="rollout-1", ended_at=T0 + 60), job(name="rollout-2", ended_at=recent)],
            "succeeded, 2h old: older than --stale 1h",
        ),
        # A batch failed as a run stops: it stopped there.
        (
            namespace(planned=(2, 6)),
            [job(name="rollout-1", end="Failed", reason="BackoffLimitExceeded", ended_at=recent)],
            "failed, 2h old: older than --stale 1h",
        ),
        # A run of an older version says nothing of its plan.
        (namespace(), [job(name="rollout-1", ended_at=recent)], "succeeded, 2h old"),
    ]:
        decided = verdict(ns, jobs)
        assert decided.delete and why in decided.why, decided.why
