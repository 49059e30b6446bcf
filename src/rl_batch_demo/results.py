"""results.json: a batch's figures, verified or rolled out, and the run's."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

try:
    import resource
except ImportError:  # not on Windows; CPU figures are then left out
    resource = None  # type: ignore[assignment]

from .constants import (
    CANCELLED,
    CLIENT_GRACE_SECONDS,
    RESULTS_FILE,
    REWARDS_FILE,
    SUCCESS_POLICY_REASON,
    NEED_GROUPS_REASON,
    VALID_CLASSES,
)
from .model import BatchEntry, COMMAND_LINE, DemoError, Settings, Spelling, VerificationError
from .stats import describe, rounded
from .files import write_json, write_text
from .parse import (
    EventRecord,
    cancelled_by_tool,
    condition,
    container_status,
    count_image_cache,
    job_finished,
    pod_name,
)
from .timing import EpisodeDraft, POINT_SOURCES, count_nodes, phase_summary, start_path_phases
from .outcomes import (
    Delivery,
    attempt_figures,
    censored_pod_to_ready,
    delivery_figures,
    episode_rows,
    failure_counts,
    group_figures,
    group_images,
    is_failure,
    is_loss,
    job_cut_short,
    job_end_reason,
    rewards_jsonl,
    with_traceback,
)
from .summary import (
    BatchSummary,
    EventIndex,
    cycle_collector_paused,
    episodes_csv_pieces,
    image_figures,
    summarise_batch,
    throughput,
)
from .render import cdf_svg, plural, ramp_svg, timeline_sample, timeline_svg, timeline_title
from .metrics import write_metrics
from .follow import BatchEvidence, Evidence, RunContext


def describe_failure(
    job: dict | None,
    pods: Sequence[dict],
    job_name: str,
    limit_seconds: int,
    logs: dict[str, str] | None = None,
) -> list[str]:
    """Why a Job did not complete: its condition and each pod that did not succeed (a failed
    container's line quotes the end of the Python traceback in its log)."""
    lines = []
    failed = condition(job or {}, "Failed")
    if failed and failed.get("status") == "True":
        lines.append(
            f"Job {job_name}: Failed ({failed.get('reason', '?')}: {failed.get('message', '')})"
        )
    else:
        lines.append(f"Job {job_name}: not Complete within {limit_seconds} s")
    for pod in sorted(pods, key=pod_name):
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded":
            continue
        state = container_status(pod).get("state") or {}
        if "terminated" in state:
            detail = with_traceback(
                f"container exited {state['terminated'].get('exitCode')} "
                f"({state['terminated'].get('reason', '')})",
                (logs or {}).get(pod_name(pod), ""),
            )
        elif "waiting" in state:
            detail = f"{state['waiting'].get('reason', 'waiting')}: {state['waiting'].get('message', '')}".rstrip(
                ": "
            )
        elif "running" in state:
            detail = "still running"
        else:
            unscheduled = condition(pod, "PodScheduled")
            detail = (unscheduled or {}).get("message") or "no container status"
        lines.append(f"pod {pod_name(pod)}: {phase}, {detail}")
    return lines


def saved_evidence(
    job: dict | None, pods: Sequence[dict], logs: dict[str, str], events: Sequence[EventRecord]
) -> str:
    """Which evidence a failed batch left, so no one looks for logs that never existed."""
    written = sum(1 for text in logs.values() if text.strip())
    parts = [
        f"saved: job.json{'' if job else ' (unreadable)'}",
        f"pods.json ({plural(len(pods), 'pod')})",
        f"events.txt ({plural(len(events), 'event')})",
        f"{written} of {len(pods)} pod logs with content",
    ]
    if not pods:
        parts.append(
            "no pod is left to have a log (the Job controller deletes a Job's pods when it ends it "
            "for its deadline)"
        )
    return ", ".join(parts)


def verified_summary(batch: BatchEvidence, end: str | None, evidence: Evidence) -> BatchSummary:
    """The summary of a batch whose every episode must succeed; a batch that did not fails here."""
    job, reading, logs, events = evidence
    settings, pods, job_name = batch.settings, reading.pods, batch.follower.job_name
    if end != "Complete":
        raise DemoError(
            "\n  ".join(
                ["Job failed or timed out; inspect saved status/events/logs, then cleanup"]
                + describe_failure(
                    job, pods, job_name, settings.timeout + CLIENT_GRACE_SECONDS, logs
                )
                + [saved_evidence(job, pods, logs, events)]
            )
        )
    if reading.source == "watch" and len(pods) < settings.count:
        # A watch that saw fewer pods than episodes proves nothing about the others.
        raise DemoError(
            f"cannot verify the batch: the pods could not be listed and the pod watch saw "
            f"only {len(pods)} of {settings.count}"
        )
    assert job is not None  # its Complete condition was seen on it
    try:
        return summarise_batch(
            job,
            pods,
            logs,
            events,
            settings.count,
            settings.builtin,
            batch.follower.end_seen_wall,
            batch.follower.observations(),
            drafts=batch.follower.drafts.drafts if batch.follower.drafts else None,
            index=batch.event_index(),
        )
    except VerificationError as error:
        if reading.source == "watch":
            raise VerificationError(
                f"{error} (judged from the pods the watch saw, each unfinished one "
                f"read again: the pods could not be listed)"
            ) from None
        raise


def rollout_summary(batch: BatchEvidence, end: str | None, evidence: Evidence) -> BatchSummary:
    """Write rewards.jsonl with every episode; accept the batch if its failures are within
    --allow-failures, and summarise its successful episodes."""
    rows = rollout_rows(batch, evidence)
    failures = [row for row in rows if is_failure(row)]
    job = finished_rollout_job(batch, end, evidence)
    summary = summarised_rollout(batch, rows, job, evidence)
    rewards = batch.follower.rewards
    if rewards is not None:
        summary.figures.update(
            batch_delivery_figures(
                rewards.deliveries, batch.follower.state.job_observed, batch.settings.need
            )
        )
        summary.deliveries = [d.written_at for d in rewards.deliveries if d.success]
    if not batch.silent:  # a quiet Python caller reads all of it in the results
        say_rollout_outcome(batch, summary, failures)
    return summary


def rollout_rows(batch: BatchEvidence, evidence: Evidence) -> list[dict]:
    """Every episode's row, and rewards.jsonl with them all (the reward stream finishes its own)."""
    job, reading, logs, events = evidence
    settings, follower = batch.settings, batch.follower
    rows = episode_rows(
        settings.count,
        job or {"metadata": {}},
        reading.pods,
        logs,
        settings.builtin,
        settings.task_ids,
        settings.group_size,
        events,
        group_images(settings),
    )
    if follower.rewards is not None:
        return follower.rewards.finish(rows, reading.pods, logs, follower.state.observed)
    write_text(os.path.join(batch.batch_dir, REWARDS_FILE), rewards_jsonl(rows))
    return rows


def finished_rollout_job(batch: BatchEvidence, end: str | None, evidence: Evidence) -> dict:
    """The rollout batch's Job, once it finished and every pod was seen; else DemoError saying
    what was saved."""
    job, reading, logs, events = evidence
    settings, pods = batch.settings, reading.pods
    if end is None or job is None:
        raise DemoError(
            "\n  ".join(
                ["Job did not finish; inspect saved status/events/logs, then cleanup"]
                + describe_failure(
                    job,
                    pods,
                    batch.follower.job_name,
                    settings.timeout + CLIENT_GRACE_SECONDS,
                    logs,
                )
                + [
                    f"{REWARDS_FILE} lists every episode as last seen",
                    saved_evidence(job, pods, logs, events),
                ]
            )
        )
    if reading.source == "watch" and len(pods) < settings.count:
        raise DemoError(
            f"cannot verify the batch: the pods could not be listed and the pod watch saw "
            f"only {len(pods)} of {settings.count}"
        )
    return job


def summarised_rollout(
    batch: BatchEvidence, rows: Sequence[dict], job: dict, evidence: Evidence
) -> BatchSummary:
    """summarise_rollout over the batch's evidence; a batch it refuses says where the rest is."""
    _, reading, logs, events = evidence
    follower = batch.follower
    try:
        return summarise_rollout(
            rows,
            job,
            reading.pods,
            logs,
            events,
            batch.settings,
            follower.end_seen_wall,
            follower.observations(),
            batch.spelling,
            follower.drafts.drafts if follower.drafts else None,
            batch.event_index(),
        )
    except DemoError as error:
        raise DemoError(
            f"{error}\n  {REWARDS_FILE} lists every episode with its class; "
            f"{saved_evidence(job, reading.pods, logs, events)}"
        ) from None


def say_rollout_outcome(
    batch: BatchEvidence, summary: BatchSummary, failures: Sequence[dict]
) -> None:
    """On stderr: how --need was met, and which failures the batch accepted."""
    settings, count = batch.settings, batch.settings.count
    cancelled = summary.figures.get("cancelled_episodes") or 0
    need = batch.spelling.setting("need", settings.need)
    losses = [row for row in failures if is_loss(row)]
    own = [row for row in failures if not is_loss(row)]
    if settings.need_groups is not None:
        need = batch.spelling.setting("need_groups", settings.need_groups)
        print(
            f"{need} met: {cancelled} of {count} episodes cancelled, {len(losses)} lost",
            file=sys.stderr,
        )
    elif settings.need is not None:
        print(
            f"{need} met: {count - cancelled - len(failures)} of {count} episodes succeeded, "
            + (f"{len(own)} failed on their own (valid), " if own else "")
            + f"{cancelled} cancelled, {len(losses)} failed"
            + (f" ({failures_said(losses)})" if losses else ""),
            file=sys.stderr,
        )
    if losses:
        accepted = (
            f"Failures within {need}"
            if settings.need is not None or settings.need_groups is not None
            else "Accepted a partial batch"
        )
        print(
            "\n  ".join(
                [
                    f"{accepted}: {len(losses)} of {count} episodes failed "
                    f"({failures_said(losses)}); every episode is in {REWARDS_FILE}"
                ]
                + failure_lines(losses)
            ),
            file=sys.stderr,
        )
    if own:
        print(
            "\n  ".join(
                [
                    f"{len(own)} of {count} episodes failed on their own ({failures_said(own)}): "
                    f"valid samples, each in {REWARDS_FILE}"
                ]
                + failure_lines(own)
            ),
            file=sys.stderr,
        )


def batch_delivery_figures(
    deliveries: Sequence[Delivery], job_observed: dict[str, float], need: int | None
) -> dict:
    """delivery_figures from the moments the client's create call started and returned."""
    submitted, returned = job_observed.get("submitted"), job_observed.get("create_returned")
    slack = returned - submitted if submitted is not None and returned is not None else None
    return delivery_figures(deliveries, submitted, slack, need)


@cycle_collector_paused()
def save_results(run: RunContext, batches: Sequence[BatchOutcome]) -> Results:
    """results.json, episodes.csv and the pictures, from every batch's summary."""
    results = assemble_results(run.settings, batches, client_figures(run).saved(), run.capacity)
    if run.prepull is not None:
        results.figures["prepull"] = run.prepull
    if run.admission:  # --queue: one batch's admission, or each batch's by its directory
        admission = run.admission
        results.figures["admission"] = admission.get(".") or {"batches": admission}
    write_json(os.path.join(run.output, RESULTS_FILE), results.figures)
    write_text(os.path.join(run.output, "episodes.csv"), episodes_csv_pieces(results.batches))
    write_pictures(
        run.output,
        results.batches,
        run.settings,
        results.figures["throughput"],
        results.figures.get("admission"),
    )
    write_metrics(run.output, results.figures, results.batches, run.receipt.run_id)
    return results


class ClientCost(NamedTuple):
    """What the run cost on this machine (results.json's `client`)."""

    kubectl_processes: int
    api_retries: int
    cpu_seconds: float | None
    peak_rss_mib: float | None  # None where the platform cannot say: then left out

    def saved(self) -> dict[str, Any]:
        saved = self._asdict()
        if self.peak_rss_mib is None:
            del saved["peak_rss_mib"]
        return saved


def client_figures(run: RunContext) -> ClientCost:
    """What the run cost on this machine: kubectl processes, retries, CPU, peak memory."""
    return ClientCost(
        run.kubectl.processes,
        run.kubectl.retries,
        rounded(cpu_seconds() - run.cpu_start),
        peak_rss_mib(),
    )


def peak_rss_mib() -> float | None:
    """This process's own peak resident memory in MiB: Linux's VmHWM where there is one, since
    ru_maxrss carries over an exec the RSS of whatever spawned the tool (a large trainer's)."""
    try:
        with open("/proc/self/status", encoding="utf-8", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return rounded(int(line.split()[1]) / 1024, 1)  # in kB
    except (OSError, ValueError, IndexError):
        pass  # not Linux: ru_maxrss below
    if resource is None:
        return None
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return rounded(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20, 1)


def failures_said(failures: Sequence[dict]) -> str:
    """`1 infrastructure failure, 2 episode failures`: the failed episodes counted by class."""
    counts = failure_counts(row["failure_class"] for row in failures)
    return ", ".join(plural(number, f"{kind} failure") for kind, number in counts.items() if number)


def failure_lines(failures: Sequence[dict], most: int = 10) -> list[str]:
    """One line per failed episode (the first few): which, whose fault, why."""
    return [
        f"episode {row['index']} (task {row['task_id']!r}, pod {row['pod']}, "
        f"{plural(row['attempts'], 'attempt')}): {row['failure_class']}: {row['failure']}"
        for row in failures[:most]
    ] + ([f"... and {len(failures) - most} more"] if len(failures) > most else [])


def summarise_rollout(
    rows: Sequence[dict],
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    events: Sequence[EventRecord],
    settings: Settings,
    end_seen_at: float | None = None,
    observed: dict | None = None,
    spelling: Spelling = COMMAND_LINE,
    drafts: Mapping[str, EpisodeDraft] | None = None,
    index: EventIndex | None = None,
) -> BatchSummary:
    """A rollout batch's summary: the figures of its successful episodes, with failures, attempts and
    groups; DemoError when more episodes failed than --allow-failures accepts, or all did. Pure."""
    need = settings.need
    allowed = len(rows) - need if need is not None else settings.allow_failures or 0
    if settings.need_groups is not None:
        allowed = len(rows) - settings.need_groups * settings.group_size
    check_rollout_accepted(rows, need, allowed, spelling)
    check_groups_whole(rows, settings, spelling)
    successes = {row["pod"] for row in rows if row["failure_class"] is None}
    by_name = {pod_name(pod): pod for pod in pods}
    summary = summarise_batch(
        job,
        [pod for pod in pods if pod_name(pod) in successes],
        logs,
        events,
        len(successes),
        settings.builtin,
        end_seen_at,
        observed,
        # Cancelled episodes too: the timeline draws every episode.
        [(by_name.get(row["pod"]), row) for row in rows if row["failure_class"] is not None],
        drafts,
        index,
    )
    task_of = {row["pod"]: row["task_id"] for row in rows if row["failure_class"] is None}
    for record in summary.episodes:  # episodes.csv names each episode's task
        record["task_id"] = task_of.get(record["pod"])
    summary.figures.update(
        rollout_figures(rows, job, pods, settings.group_size, allowed, settings.retries or 0, need)
    )
    summary.figures["images"] = image_figures(summary.episodes, rows)
    if settings.need_groups is not None:  # the losses it absorbs make no partial batch
        summary.figures.update(need_groups=settings.need_groups, accepted_partial=False)
    return summary


def whole_groups(rows: Sequence[dict], group_size: int) -> list[int]:
    """The groups whose every member has a valid line."""
    return [
        start // group_size
        for start in range(0, len(rows), group_size)
        if all(row["valid"] for row in rows[start : start + group_size])
    ]


def check_groups_whole(rows: Sequence[dict], settings: Settings, spelling: Spelling) -> None:
    """--need-groups K: DemoError when fewer than K groups are whole."""
    wanted = settings.need_groups
    whole = whole_groups(rows, settings.group_size)
    if wanted is not None and len(whole) < wanted:
        losses = [row for row in rows if is_loss(row)]
        raise DemoError(
            "\n  ".join(
                [
                    f"{len(whole)} of {len(rows) // settings.group_size} groups have every "
                    f"member's valid line, fewer than {spelling.setting('need_groups', wanted)} "
                    f"({len(losses)} episodes lost: {failures_said(losses) or 'none'})"
                ]
                + failure_lines(losses)
            )
        )


def check_rollout_accepted(
    rows: Sequence[dict], need: int | None, allowed: int, spelling: Spelling
) -> None:
    """DemoError, naming the first failed episodes, when fewer than --need K episodes have a valid
    line (a success, or the episode's own failure: a sample all the same), more than `allowed` were
    lost (infrastructure, verifier), or none has a valid line. An episode's own failure never
    fails the batch: it is a sample, and --allow-failures counts only the losses."""
    failures = [row for row in rows if is_failure(row)]
    losses = [row for row in rows if is_loss(row)]
    valid = [row for row in rows if row["failure_class"] in VALID_CLASSES]
    if need is not None and len(valid) < need:
        raise DemoError(
            "\n  ".join(
                [
                    f"{len(valid)} of {len(rows)} episodes have a valid line, fewer than "
                    f"{spelling.setting('need', need)} ({len(losses)} lost: "
                    f"{failures_said(losses) or 'none'})"
                ]
                + failure_lines(failures)
            )
        )
    if len(losses) > allowed or not valid:
        allowance = (
            f"allow_failures={allowed} accepts no more"
            if spelling.python
            else f"--allow-failures accepts {allowed}"
        )
        accepts = allowance if len(losses) > allowed else "none has a valid line"
        own = len(failures) - len(losses)
        raise DemoError(
            "\n  ".join(
                [
                    f"{len(losses)} of {len(rows)} episodes failed "
                    f"({failures_said(losses)}"
                    + (f"; {own} more failed on their own, valid samples" if own else "")
                    + f"); {accepts}"
                ]
                + failure_lines(losses + [row for row in failures if not is_loss(row)])
            )
        )


ROLLOUT_FIELDS = (
    "failed_episodes",
    "lost_episodes",
    "failures_by_class",
    "failures",
    "accepted_partial",
    "allow_failures",
    "retries",
    "attempts",
    "group_size",
    "groups",
    "groups_complete",
    "group_all_rewards_seconds",
    "group_spread_seconds",
    "pod_to_ready_censored",
    "job_end",
    "need",
    "need_groups",
    "cancelled_episodes",
    "first_reward_seconds",
    "kth_reward_seconds",
    "reward_delivery_lag_p50_seconds",
    "reward_delivery_lag_p99_seconds",
    "reward_delivery_lag_max_seconds",
    "reward_delivery",
)


# What results.json keeps of each failed episode.
FAILURE_RECORD_KEYS = (
    "index",
    "task_id",
    "pod",
    "attempts",
    "failure_class",
    "failure",
    "evidence",
)


def rollout_figures(
    rows: Sequence[dict],
    job: dict,
    pods: Sequence[dict],
    group_size: int,
    allowed: int,
    retries: int,
    need: int | None = None,
) -> dict:
    """What a rollout batch adds to its summary: failures by class, attempts, groups; with --need,
    the episodes it cancelled (no failures: a run that got its K successes exits 0)."""
    failures = [row for row in rows if is_failure(row)]
    losses = [row for row in failures if is_loss(row)]
    figures: dict[str, Any] = {
        "episodes": len(rows),
        "failed_episodes": len(failures),
        "lost_episodes": len(losses),
        "failures_by_class": failure_counts(row["failure_class"] for row in failures),
        "failures": [{key: row[key] for key in FAILURE_RECORD_KEYS} for row in failures],
        # Partial: some lines are to be masked. The episodes' own failures are samples.
        "accepted_partial": bool(losses) and need is None,
        "allow_failures": allowed,
        "cancelled_episodes": sum(1 for row in rows if row["failure_class"] == CANCELLED),
        "retries": retries,
        "attempts": attempt_figures(rows),
        **group_summary_figures(rows, group_size),
        "job_end": {
            "condition": job_finished(job),
            "reason": NEED_GROUPS_REASON
            if cancelled_by_tool(job)
            else job_end_reason(job) or (SUCCESS_POLICY_REASON if job_cut_short(job) else None),
        },
    }
    if need is not None:
        figures["need"] = need
    if failures:
        figures.update(censored_pod_to_ready_figures(rows, job, pods))
    return figures


def group_summary_figures(rows: Sequence[dict], group_size: int) -> dict[str, Any]:
    """The groups of a rollout batch: each group, how many are complete, and their timing."""
    groups = group_figures(rows, group_size)
    complete = [g for g in groups if g["complete"]]
    return {
        "group_size": group_size,
        "groups": groups,
        "groups_complete": len(complete),
        "group_all_rewards_seconds": describe(
            [g["all_rewards_seconds"] for g in complete], missing=len(groups) - len(complete)
        ),
        "group_spread_seconds": describe(
            [g["spread_seconds"] for g in groups if g["spread_seconds"] is not None]
        ),
    }


def censored_pod_to_ready_figures(
    rows: Sequence[dict], job: dict, pods: Sequence[dict]
) -> dict[str, Any]:
    """pod_to_ready's percentiles over every episode, one that never became ready counted as ready
    at the Job's deadline, and how they were counted."""
    censored = censored_pod_to_ready(rows, job, pods)
    return {
        "pod_to_ready_p50_seconds": censored["p50"],
        "pod_to_ready_p95_seconds": censored["p95"],
        "pod_to_ready_max_seconds": censored["max"],
        "pod_to_ready_censored": censored,
    }


def write_pictures(
    output: str,
    measured: Sequence[tuple[str, BatchSummary]],
    settings: Settings,
    figures: dict | None = None,
    admission: dict | None = None,
) -> None:
    """timeline.svg (a sample of a large batch), ramp.svg and cdf.svg; `figures`: the throughput, if known."""
    title = timeline_title(settings)
    sampled, note = timeline_sample(measured)
    write_text(
        os.path.join(output, "timeline.svg"),
        timeline_svg(sampled, title + note, settings.task_ids, settings.group_size, admission),
    )
    write_text(
        os.path.join(output, "ramp.svg"), ramp_svg(measured, f"Ramp: {title}", figures, admission)
    )
    write_text(os.path.join(output, "cdf.svg"), cdf_svg(measured, f"Phase durations: {title}"))


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (kubectl), or 0 where unknown."""
    if resource is None:
        return 0.0
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class BatchOutcome(NamedTuple):
    """One batch as results.json pools them."""

    entry: BatchEntry  # its entry in run.json's `batches`
    summary: BatchSummary
    client_wait: (
        dict | None
    )  # client.json: how the client waited (none for a run of the guide's script)

    def figures(self) -> dict:
        """The batch's saved form; of how the client waited, it shows the one figure."""
        return dict(
            self.summary.figures,
            client_job_complete_seconds=(self.client_wait or {}).get("client_job_complete_seconds"),
        )


@dataclasses.dataclass
class Results:
    """A run's results: `figures` as results.json saves them (printed_results gives the printed
    form), and the measured batches they pool, for episodes.csv and the pictures."""

    figures: dict[str, Any]
    batches: list[tuple[str, BatchSummary]]  # each measured batch: its Job's name and its summary


def assemble_results(
    settings: Settings,
    batches: Sequence[BatchOutcome],
    client: dict | None,
    capacity: dict | None = None,
) -> Results:
    """results.json, top to bottom: the fields of every run, then a single batch's own or the
    rounds', the warm-up, what the run cost (`client`), the throughput, and the capacity plan
    check_capacity made (`capacity`, if it did)."""
    measured = [batch for batch in batches if batch.entry.measured]
    warmups = [batch for batch in batches if not batch.entry.measured]
    results = common_results(settings, measured)
    results.update(
        single_batch_results(measured[0]) if len(measured) == 1 else rounds_results(measured)
    )
    if warmups:
        results["warmup"] = warmups[0].figures()
    if client is not None:
        results["client"] = client
    pooled = [(batch.entry.job, batch.summary) for batch in measured]
    results["throughput"] = throughput(pooled)
    if capacity is not None:
        results["capacity"] = capacity
    return Results(results, pooled)


def latest(values: Iterable[float | None]) -> float | None:
    """The largest of the known values: None for a batch with no successful episode to measure
    (a rollout whose every agent failed on its own)."""
    return max((value for value in values if value is not None), default=None)


def common_results(settings: Settings, measured: Sequence[BatchOutcome]) -> dict[str, Any]:
    """The fields of every results.json: the measured batches pooled, and the run's settings."""
    figures = [batch.figures() for batch in measured]
    episodes = [record for batch in measured for record in batch.summary.episodes]
    rows = [
        dict(row, job=batch.entry.job) if len(measured) > 1 else row
        for batch in measured
        for row in batch.summary.figures["pods"]
    ]
    if len(measured) == 1:  # its own summary already pooled the same episodes
        phases, by_start_path = figures[0]["phases"], figures[0]["phases_by_start_path"]
    else:
        phases, by_start_path = (
            phase_summary([r["phases"] for r in episodes]),
            start_path_phases(episodes),
        )
    guide = describe([r["guide_pod_to_ready"] for r in episodes])
    client_seconds = [f.get("client_job_complete_seconds") for f in figures]
    known_seconds = [seconds for seconds in client_seconds if seconds is not None]
    return {
        "episodes": sum(f["episodes"] for f in figures),
        "successful_episodes": sum(f["successful_episodes"] for f in figures),
        "reward_sum": sum(f["reward_sum"] for f in figures),
        "batch_to_all_ready_seconds": latest(f["batch_to_all_ready_seconds"] for f in figures),
        "batch_to_all_rewards_seconds": latest(f["batch_to_all_rewards_seconds"] for f in figures),
        "pod_to_ready_p50_seconds": guide.get("p50"),
        "pod_to_ready_p95_seconds": guide.get("p95"),
        "pod_to_ready_max_seconds": guide.get("max"),
        "pods": rows,
        "context": settings.context,
        "namespace": settings.namespace,
        "image": settings.image,
        "runtime": settings.runtime,
        "parallelism": settings.parallelism,
        "cache_state": "warmed" if settings.warmup else "uncontrolled",
        "image_cache": count_image_cache(record.get("image_cache") for record in episodes),
        # A batch's own figures know a rollout's failed episodes too; rounds pool the summarised ones.
        "images": figures[0]["images"] if len(figures) == 1 else image_figures(episodes),
        # Every Job the run created: one per batch, or one per image and batch.
        "jobs": sum(len(entry.jobs or (entry.job,)) for entry in settings.batches),
        **({"image_map": dict(settings.image_map)} if settings.image_map else {}),
        "harden": settings.harden,
        "episode_script": settings.episode_script,
        "episode_script_sha256": settings.episode_script_sha256,
        "client_job_complete_seconds": max(known_seconds)
        if len(known_seconds) == len(client_seconds)
        else None,
        "reward_mean": rounded(
            sum(f["reward_sum"] for f in figures) / max(1, sum(f["episodes"] for f in figures)), 6
        ),
        "rounds_measured": len(figures),
        "phases": phases,
        "phases_by_start_path": by_start_path,
        "phase_points": POINT_SOURCES,
        "clock_warnings": [w for f in figures for w in f["clocks"]["warnings"]],
        "nodes": count_nodes(row["node"] for row in rows),
        "warnings": merge_warnings([f["warnings"] for f in figures]),
    }


def single_batch_results(batch: BatchOutcome) -> dict[str, Any]:
    """What results.json adds for one measured batch: its completion gap, clocks, Job creation and
    wait; for a rollout, its failures, attempts and groups (and the guide's pod_to_ready figures
    with its failed episodes counted at the deadline)."""
    figures = batch.figures()
    results = {
        "completion_gap": figures["completion_gap"],
        "clocks": figures["clocks"],
        "job_created": figures["job_created"],
        "client_wait": batch.client_wait,
    }
    if "failed_episodes" in figures:
        results.update(
            {
                key: figures[key]
                for key in ROLLOUT_FIELDS
                + (
                    "pod_to_ready_p50_seconds",
                    "pod_to_ready_p95_seconds",
                    "pod_to_ready_max_seconds",
                )
                if key in figures
            }
        )
    return results


def rounds_results(measured: Sequence[BatchOutcome]) -> dict[str, Any]:
    """What results.json adds for several measured rounds: each round's own figures."""
    return {
        "round_figures": (
            "batch_to_all_ready_seconds, batch_to_all_rewards_seconds and "
            "client_job_complete_seconds are the slowest round's; each round's "
            "are in rounds[], and the percentiles pool every round's episodes"
        ),
        "rounds": [dict(batch.figures(), job=batch.entry.job) for batch in measured],
    }


def merge_warnings(summaries: Iterable[dict]) -> dict:
    merged: dict[str, dict] = {}
    for summary in summaries:
        for reason, entry in summary.items():
            target = merged.setdefault(reason, {"count": 0, "objects": []})
            target["count"] += entry["count"]
            target["objects"] += [o for o in entry["objects"] if o not in target["objects"]]
    return merged


def warn_clocks(results: dict) -> None:
    """Clocks that disagree are said on stderr whatever --quiet says: every sub-second phase that
    mixes them is off by that much."""
    for warning in results.get("clock_warnings") or []:
        print(f"WARNING: clocks: {warning}", file=sys.stderr)
