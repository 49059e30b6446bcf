"""Runs in a cluster: what `list` shows and `cleanup --stale` decides, without receipts."""

from __future__ import annotations

import json
from typing import Iterable, NamedTuple, Sequence

from .constants import (
    APP_LABEL,
    EPISODES_PLANNED_ANNOTATION,
    EXPIRES_ANNOTATION,
    FOLLOWER_ANNOTATION,
    LEASE_RENEW_SECONDS,
    LEASE_STALE_PERIODS,
    HOST_ANNOTATION,
    JOBS_PLANNED_ANNOTATION,
    NAMESPACE_PREFIX,
    OUTPUT_ANNOTATION,
    RUN_ID_ANNOTATION,
    RUN_LABEL,
    USER_ANNOTATION,
)
from .parse import condition, format_duration, job_finished, parse_time, rfc3339

# What a run is doing: a Job of it has not ended, or fewer Jobs than it plans are there yet
# and none ended as a run stops (running; the latter between two batches), every Job not ended
# is suspended (suspended: an interrupted run stops its pods so; queued: each is a queue's Job
# that Kueue holds until it admits it, and has not started), all ended Complete
# (succeeded) or one Failed (failed), its namespace is being deleted (terminating), or
# no Job of the tool is in it yet (pending: a run starting, or one that stopped before
# it submitted its Job).
RUN_STATES = ("running", "suspended", "queued", "succeeded", "failed", "terminating", "pending")
# A Job handed to a Kueue LocalQueue carries this label; suspended and never started, it waits
# for Kueue's admission (queued).
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"

# The reason a Job ends Failed with failed indexes within its maxFailedIndexes (--allow-failures):
# a run accepts that batch and goes on to its next.
ACCEPTED_FAILURES_REASON = "FailedIndexes"


class ClusterRun(NamedTuple):
    """One run found in a cluster: its namespace, what the namespace says of the run, its Jobs' state."""

    namespace: str
    uid: str
    run_id: str  # the agc-demo-run label's value
    annotated_run_id: str | None  # the run-id annotation's; None on a run of the guide's script
    created_at: float | None
    state: str
    jobs: int  # Jobs of the tool in the namespace
    # The episodes the run plans, all told (a run without the annotation: its Jobs' completions).
    episodes: int
    succeeded: int
    user: str | None
    host: str | None
    output: str | None
    expires_at: float | None
    jobs_planned: int | None = None  # None: a guide's run, or one of a version that did not say
    between_batches: bool = False  # running, with every Job there ended and more to come
    last_ended_at: float | None = None  # when its last ended Job ended (None: none has)
    follower: dict | None = None  # the lease of the client that follows it (None: nobody)
    shared: bool = False  # in a namespace it shares (`--namespace`): its Jobs, not the namespace
    job_uids: tuple[tuple[str, str], ...] = ()  # a shared run's Jobs: (name, UID)

    @property
    def place(self) -> str:
        """Where the run is, as list and cleanup --stale name it: its namespace, and in a namespace
        it shares, its run id after it."""
        return f"{self.namespace}/{self.run_id}" if self.shared else self.namespace

    @property
    def guide(self) -> bool:
        """Made by the guide's script: its label, none of this tool's annotations."""
        return self.annotated_run_id is None

    def age(self, now: float) -> float:
        return max(0.0, now - self.created_at) if self.created_at is not None else 0.0


def planned_count(namespace: dict, key: str) -> int | None:
    """A count the run's namespace says it plans (None: not said, or not a count)."""
    text = ((namespace.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value >= 0 else None


def run_state(namespace: dict, jobs: Sequence[dict]) -> str:
    """One of RUN_STATES, from the namespace's phase, its Jobs' conditions, and how many Jobs the
    run plans: with fewer there, every one ended, and none failed as a run stops, the run is
    between two batches (running), or stopped there without a word (killed, crashed: only the
    time since its last Job ended tells, see stale_verdict)."""
    if (namespace.get("metadata") or {}).get("deletionTimestamp") or (
        namespace.get("status") or {}
    ).get("phase") == "Terminating":
        return "terminating"
    if not jobs:
        return "pending"
    ends = [job_finished(job) for job in jobs]
    if None in ends:
        unended = [job for job, end in zip(jobs, ends) if end is None]
        if not all((j.get("spec") or {}).get("suspend") for j in unended):
            return "running"
        return "queued" if all(awaits_admission(job) for job in unended) else "suspended"
    planned = planned_count(namespace, JOBS_PLANNED_ANNOTATION)
    if (
        planned is not None
        and len(jobs) < planned
        and all(
            end == "Complete"
            or (condition(job, "Failed") or {}).get("reason") == ACCEPTED_FAILURES_REASON
            for job, end in zip(jobs, ends)
        )
    ):
        return "running"
    return "failed" if "Failed" in ends else "succeeded"


def awaits_admission(job: dict) -> bool:
    """A Job of a queue that Kueue holds suspended and that never started (an interrupted run's
    Job, suspended by the run, has started)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    return QUEUE_NAME_LABEL in labels and not (job.get("status") or {}).get("startTime")


def job_ended_at(job: dict) -> float | None:
    """When a Job ended: its Complete or Failed condition's transition (else its completionTime)."""
    end = job_finished(job)
    if end is None:
        return None
    return parse_time((condition(job, end) or {}).get("lastTransitionTime")) or parse_time(
        (job.get("status") or {}).get("completionTime")
    )


def cluster_runs(namespaces: Iterable[dict], jobs: Iterable[dict]) -> list[ClusterRun]:
    """Every namespace with the run label, oldest first, with the tool's Jobs inside it
    (`jobs`: Jobs labelled app=rl-batch-demo, from every namespace); and every run in a namespace
    it shares (`--namespace`), found by its Jobs' run label."""
    by_namespace: dict[str, list[dict]] = {}
    for job in jobs:
        metadata = job.get("metadata") or {}
        if (metadata.get("labels") or {}).get("app") == APP_LABEL:
            by_namespace.setdefault(metadata.get("namespace", ""), []).append(job)
    runs, own = [], set()
    for namespace in namespaces:
        metadata = namespace.get("metadata") or {}
        if RUN_LABEL not in (metadata.get("labels") or {}):
            continue
        own.add(metadata.get("name", ""))
        runs.append(cluster_run(namespace, by_namespace.get(metadata.get("name", ""), [])))
    for name, inside in by_namespace.items():
        if name not in own:
            runs += [
                cluster_run(carrier, run_jobs, shared=True)
                for carrier, run_jobs in shared_runs(name, inside)
            ]
    return sorted(runs, key=lambda run: (run.created_at or 0.0, run.namespace))


def shared_runs(namespace: str, jobs: Sequence[dict]) -> list[tuple[dict, list[dict]]]:
    """The runs in a namespace they share, by their Jobs' run label: each as a stand-in for the
    namespace a run of its own would have (its first Job's labels and annotations) and its Jobs."""
    by_run: dict[str, list[dict]] = {}
    for job in jobs:
        run_id = ((job.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)
        if run_id:
            by_run.setdefault(run_id, []).append(job)
    found = []
    for run_id, run_jobs in by_run.items():
        first = min(run_jobs, key=lambda job: job["metadata"].get("creationTimestamp") or "")
        carrier = {
            "metadata": {
                "name": namespace,
                "uid": "",
                "labels": {RUN_LABEL: run_id},
                "annotations": first["metadata"].get("annotations") or {},
                "creationTimestamp": first["metadata"].get("creationTimestamp"),
            }
        }
        found.append((carrier, run_jobs))
    return found


def cluster_run(namespace: dict, inside: Sequence[dict], shared: bool = False) -> ClusterRun:
    """One run from its namespace (or, `shared`, its stand-in) and the tool's Jobs in it."""
    metadata = namespace.get("metadata") or {}
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    state = run_state(namespace, inside)
    ended = [job_ended_at(job) for job in inside if job_finished(job) is not None]
    planned_episodes = planned_count(namespace, EPISODES_PLANNED_ANNOTATION)
    return ClusterRun(
        namespace=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        run_id=labels[RUN_LABEL],
        annotated_run_id=annotations.get(RUN_ID_ANNOTATION),
        created_at=parse_time(metadata.get("creationTimestamp")),
        state=state,
        jobs=len(inside),
        episodes=planned_episodes
        if planned_episodes is not None
        else sum(int((job.get("spec") or {}).get("completions") or 1) for job in inside),
        succeeded=sum(int((job.get("status") or {}).get("succeeded") or 0) for job in inside),
        user=annotations.get(USER_ANNOTATION),
        host=annotations.get(HOST_ANNOTATION),
        output=annotations.get(OUTPUT_ANNOTATION),
        expires_at=parse_time(annotations.get(EXPIRES_ANNOTATION)),
        jobs_planned=planned_count(namespace, JOBS_PLANNED_ANNOTATION),
        between_batches=state == "running" and bool(inside) and len(ended) == len(inside),
        last_ended_at=max((at for at in ended if at is not None), default=None),
        follower=follower_lease(annotations.get(FOLLOWER_ANNOTATION)),
        shared=shared,
        job_uids=tuple(
            (
                (job.get("metadata") or {}).get("name", ""),
                (job.get("metadata") or {}).get("uid", ""),
            )
            for job in inside
        )
        if shared
        else (),
    )


def follower_lease(text: str | None) -> dict | None:
    """The follower lease's record (lease.lease_record), or None: none, or not one."""
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("host") else None


def follower_record(run: ClusterRun, now: float) -> dict | None:
    """Who follows the run, as `list -o json` prints it: host, PID, when the lease was last
    renewed, and whether that is older than LEASE_STALE_PERIODS periods (its client looks gone)."""
    lease = run.follower
    if lease is None:
        return None
    renewed = parse_time(str(lease.get("renewTime") or ""))
    period = lease.get("renewPeriodSeconds") or LEASE_RENEW_SECONDS
    return {
        "host": lease.get("host"),
        "pid": lease.get("pid"),
        "output": lease.get("output"),
        "renewed": lease.get("renewTime"),
        "stale": renewed is None or now - renewed >= LEASE_STALE_PERIODS * float(period),
    }


def follower_text(run: ClusterRun, now: float) -> str:
    record = follower_record(run, now)
    if record is None:
        return "-"
    return f"{record['host']}/{record['pid']}" + (" (stale)" if record["stale"] else "")


def run_record(run: ClusterRun, now: float) -> dict:
    """One run as `list -o json` prints it."""
    return {
        "namespace": run.namespace,
        "uid": run.uid,
        "run_id": run.annotated_run_id or run.run_id,
        "state": run.state,
        "age_seconds": round(run.age(now)),
        "episodes": run.episodes,
        "succeeded": run.succeeded,
        "user": run.user,
        "host": run.host,
        "output": run.output,
        "expires": rfc3339(run.expires_at) if run.expires_at is not None else None,
        "guide": run.guide,
        "jobs": run.jobs,
        "jobs_planned": run.jobs_planned,
        "between_batches": run.between_batches,
        "last_job_ended": rfc3339(run.last_ended_at) if run.last_ended_at is not None else None,
        "follower": follower_record(run, now),
        **({"shared_namespace": True} if run.shared else {}),
    }


def expiry_text(run: ClusterRun, now: float) -> str:
    if run.expires_at is None:
        return "-"
    if run.expires_at <= now:
        return f"expired {format_duration(now - run.expires_at)} ago"
    return f"in {format_duration(run.expires_at - now)}"


def runs_table(runs: Sequence[ClusterRun], now: float) -> str:
    """One line per run: namespace, state, age, episodes done of total, who and where from, expiry."""
    rows = [("NAMESPACE", "STATE", "AGE", "EPISODES", "USER", "FROM", "EXPIRES", "FOLLOWER")]
    for run in runs:
        where = "(guide's script)" if run.guide else f"{run.host or '?'}:{run.output or '?'}"
        rows.append(
            (
                run.place,
                run.state,
                format_duration(run.age(now)),
                f"{run.succeeded}/{run.episodes}",
                run.user or "-",
                where,
                expiry_text(run, now),
                follower_text(run, now),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


class Verdict(NamedTuple):
    """What `cleanup --stale` does with one run, and why."""

    delete: bool
    why: str


def stale_verdict(
    run: ClusterRun, now: float, stale_seconds: float, user: str, all_users: bool
) -> Verdict:
    """Delete a run of this tool, proven so, of `user` (or anyone's, with `all_users`), that is past
    its --ttl, or older than `stale_seconds` with every Job ended; leave anything else, saying why.
    A run between two batches (fewer Jobs than it plans, all ended) may be alive, about to make its
    next Job, or may have stopped there (killed, crashed): it is stale only once its last Job ended
    longer than `stale_seconds` ago."""
    spared = unproven_verdict(run, user, all_users)
    if spared is not None:
        return spared
    if run.expires_at is not None and run.expires_at <= now:
        state = f"{run.state} (between batches)" if run.between_batches else run.state
        return Verdict(
            True,
            f"{state}, past its --ttl (expired {format_duration(now - run.expires_at)} ago)",
        )
    if run.between_batches:
        return between_batches_verdict(run, now, stale_seconds)
    return age_verdict(run, now, stale_seconds)


def unproven_verdict(run: ClusterRun, user: str, all_users: bool) -> Verdict | None:
    """Why `cleanup --stale` leaves a run it may not take for its own: already being deleted, the
    guide's, not proven this tool's, or another user's; None for a run it may judge."""
    if run.state == "terminating":
        return Verdict(False, "already being deleted (Terminating)")
    if run.guide:
        return Verdict(
            False,
            "made by the guide's script (no run-id annotation): clean it up with its receipt "
            "(cleanup --output DIR)",
        )
    # A run in a namespace it shares is proven by its Jobs' label and annotation, each Job
    # deleted by the UID it was listed with; a run's own namespace by its name as well.
    own_name = run.shared or run.namespace == NAMESPACE_PREFIX + run.run_id
    if run.annotated_run_id != run.run_id or not own_name:
        return Verdict(
            False,
            f"its name, {RUN_LABEL} label ({run.run_id}) and run-id annotation "
            f"({run.annotated_run_id}) disagree: not proven a run of this tool",
        )
    if not run.jobs:
        return Verdict(
            False, f"no Job labelled app={APP_LABEL} inside: not proven a run of this tool"
        )
    if not all_users and run.user != user:
        return Verdict(
            False,
            f"started by {run.user}, not by you ({user}); --all-users reaps every user's runs",
        )
    return None


def between_batches_verdict(run: ClusterRun, now: float, stale_seconds: float) -> Verdict:
    """A run between two batches is stale once its last Job ended longer than `stale_seconds` ago."""
    made = f"{run.jobs} of {run.jobs_planned} Jobs made"
    if run.last_ended_at is None:
        return Verdict(
            False,
            f"between batches ({made}; no end time on its Jobs): may still make its next, "
            f"only its --ttl reaps it",
        )
    since = max(0.0, now - run.last_ended_at)
    if since < stale_seconds:
        return Verdict(
            False,
            f"between batches ({made}, the last ended {format_duration(since)} ago): may "
            f"still make its next; stale once its last Job ended longer ago than --stale "
            f"{format_duration(stale_seconds)}",
        )
    return Verdict(
        True,
        f"stopped between batches ({made}, the last ended {format_duration(since)} ago): "
        f"longer ago than --stale {format_duration(stale_seconds)}",
    )


def age_verdict(run: ClusterRun, now: float, stale_seconds: float) -> Verdict:
    """A run whose Jobs have all ended is stale once it is older than `stale_seconds`."""
    if run.state == "running":
        return Verdict(False, "still running (a Job has not ended)")
    if run.age(now) < stale_seconds:
        return Verdict(
            False,
            f"{run.state}, {format_duration(run.age(now))} old: younger than --stale "
            f"{format_duration(stale_seconds)}",
        )
    return Verdict(
        True,
        f"{run.state}, {format_duration(run.age(now))} old: older than --stale "
        f"{format_duration(stale_seconds)}",
    )
