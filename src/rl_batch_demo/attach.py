"""`attach`: follow a run whose client is gone, from its receipt, run.json and saved files."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import time
from typing import Any, Callable, NamedTuple, Sequence

from .constants import (
    CALL_TIMEOUT_SECONDS,
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    LOCK_FILE,
    LOG_READERS,
    PLANNED_JOBS_FILE,
    RESULTS_FILE,
    REWARDS_FILE,
    SETTINGS_FILE,
    SUSPEND_PATCH,
)
from .model import BatchEntry, Caller, DemoError, RunPlan, Settings, Spelling, StreamClosed
from .files import Receipt, cleanup_command, read_json, read_text, write_json
from .parse import cancelled_by_tool, job_finished
from .kube import Kubectl
from .follow import Progress, RewardCallbackError, RunContext
from .preflight import find_kubectl
from .results import BatchOutcome, Results, cpu_seconds, save_results
from .lifecycle import cleanup_namespace, require_receipt_context
from .lease import (
    FollowerBusy,
    FollowerLease,
    lease_of,
    lease_renewed_at,
    lease_verdict,
    take_lock,
    this_holder,
)
from .kueue import set_workload_active
from .run import close, finish_run, interrupted, print_results, run_one_batch
from .report import load_saved_batch


class AttachRequest(NamedTuple):
    """`attach`'s arguments, from the command line or attach_batch()."""

    output: str
    force: bool = False
    kubectl: str = "kubectl"
    verbose: bool = False
    quiet: bool = False
    cleanup: bool = False
    spelling: Spelling | None = None


class FirstFollower(NamedTuple):
    """What is known of the client that followed the run before: the last moment it is proven
    alive (its lease renewed, its lock file touched, a line written), and by what."""

    alive_at: float | None
    evidence: str


# Client figures a crash makes unknowable for a batch another client began: why, in client.json.
UNKNOWN_SUBMISSION = (
    "the Job was created by the client that stopped: the moments of its create call went with it"
)
UNKNOWN_DELIVERIES = (
    "lines written by the client that stopped: when each was written went with it, and the "
    "lines written by the attach waited for nobody, so no lag is a client's"
)


def kept_lines(path: str, count: int) -> list[dict]:
    """The lines a client that is gone wrote to rewards.jsonl: each whole line (a last line
    torn by the crash is dropped), one per episode index, the first of each kept."""
    kept: dict[int, dict] = {}
    for line in read_text(path).splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            row = json.loads(line)
        except ValueError:
            continue
        index = row.get("index") if isinstance(row, dict) else None
        if isinstance(index, int) and 0 <= index < count and index not in kept:
            kept[index] = row
    return [kept[index] for index in sorted(kept)]


def batch_done(batch_dir: str) -> bool:
    """The batch was followed to its end and summarised: client.json has its last figure."""
    path = os.path.join(batch_dir, "client.json")
    if not os.path.exists(path):
        return False
    try:
        return "post_completion_seconds" in read_json(path, "client.json")
    except DemoError:
        return False


def first_follower(output: str, lease: dict | None) -> FirstFollower:
    """The latest proof that the client before was alive: its lease's renewal, its lock file's
    touch, or the last write to rewards.jsonl (each a moment it still ran)."""
    proofs: list[tuple[float, str]] = []
    renewed = lease_renewed_at(lease) if lease else None
    if renewed is not None:
        proofs.append((renewed, "its lease on the namespace, last renewed"))
    for name, what in ((LOCK_FILE, "its lock file, last touched"), (REWARDS_FILE, "a line")):
        for path in [os.path.join(output, name)] + (
            [os.path.join(root, name) for root, _, files in os.walk(output) if name in files]
            if name == REWARDS_FILE
            else []
        ):
            try:
                proofs.append((os.path.getmtime(path), what))
            except OSError:
                pass
    if not proofs:
        return FirstFollower(None, "nothing it left says when it stopped")
    at, what = max(proofs)
    return FirstFollower(at, f"{what}; it stopped after that, within a lease period of it")


def claim(
    request: AttachRequest, kubectl: Kubectl, receipt: Receipt
) -> tuple[dict | None, str, FirstFollower]:
    """The run's live namespace (None: gone), this attach's lock file, and what is known of the
    client before; FollowerBusy when a live follower holds the run (its lease, or its lock)."""
    live = kubectl.get(
        "namespace",
        receipt.namespace,
        missing_ok=True,
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    # A namespace the run shares is not its own (no run label, no lease on it): it need only be.
    if live is not None and not (receipt.shared or receipt.owns_namespace(live)):
        live = None
    lease = None if receipt.shared else lease_of(live)
    why = lease_verdict(lease, this_holder(), time.time(), request.force)
    if why is not None:
        raise FollowerBusy(f"{why}; nothing was changed")
    before = first_follower(request.output, lease)
    # A lock of another host is replaced only by --force, its lease found stale (or absent).
    return live, take_lock(request.output, replace_remote=request.force), before


def planned_jobs(output: str, entry: BatchEntry) -> list[dict]:
    """The Jobs of one batch as the run planned them (jobs-planned.json), else as it saved
    them when it submitted them (job-submitted.json)."""
    names = set(entry.jobs or (entry.job,))
    path = os.path.join(output, PLANNED_JOBS_FILE)
    if os.path.exists(path):
        items = read_json(path, PLANNED_JOBS_FILE).get("items") or []
        return [job for job in items if job["metadata"]["name"] in names]
    submitted_path = os.path.join(output, entry.dir, "job-submitted.json")
    if not os.path.exists(submitted_path):
        return []
    submitted = read_json(submitted_path, "job-submitted.json")
    return submitted.get("items") if submitted.get("kind") == "List" else [submitted]


def attached_context(
    request: AttachRequest, settings: Settings, receipt: Receipt, kubectl: Kubectl, caller: Caller
) -> RunContext:
    """The run's context as its client had it, rebuilt from its files; new lines reach the
    caller marked `replayed: false`."""
    plan = RunPlan(
        {}, [], {entry.job: planned_jobs(request.output, entry) for entry in settings.batches}
    )
    on_reward = caller.on_reward
    saved = read_json(os.path.join(request.output, SETTINGS_FILE), SETTINGS_FILE)
    python = request.spelling is not None and request.spelling.python
    run = RunContext(
        settings,
        plan,
        receipt,
        kubectl,
        request.output,
        Progress(request.quiet),
        concurrent.futures.ThreadPoolExecutor(LOG_READERS),
        cpu_seconds(),
        touched_cluster=True,
        silent=request.quiet and python,
        on_reward=None if on_reward is None else lambda line: on_reward(dict(line, replayed=False)),
        stop=caller.stop,
        owns_process=not python,
        capacity=saved.get("capacity"),
    )
    if request.spelling is not None:
        run.spelling = request.spelling
    return run


def existing_jobs(run: RunContext, entry: BatchEntry) -> list[dict]:
    """The batch's Jobs in the cluster now, each recorded in the receipt (a client stopped
    between a Job's creation and its record left it out); [] when none exists yet."""
    found = []
    for name in entry.jobs or (entry.job,):
        live = run.kubectl.get(
            "job", name, run.namespace, missing_ok=True, retry_until=time.monotonic() + 30
        )
        if live is None:
            continue
        if not run.receipt.has_job(name):
            run.receipt.record_job(name, live["metadata"]["uid"])
        found.append(live)
    return found


def resume(run: RunContext, jobs: Sequence[dict]) -> list[str]:
    """Resume each of the batch's Jobs an interrupted client suspended (and not ended). One the
    tool stopped once --need-groups was met stays stopped, even before its controller has said
    so (its Suspended condition, its pods gone): resumed, its cancelled episodes would run."""
    resumed = []
    for job in jobs:
        suspended = (job.get("spec") or {}).get("suspend")
        if job_finished(job) or not suspended or cancelled_by_tool(job):
            continue
        name = job["metadata"]["name"]
        if run.settings.queue:
            # Kueue holds a queued Job suspended until it admits it: its Workload is let go (the
            # interrupted client deactivated it), and Kueue resumes the Job once admitted.
            said = set_workload_active(run.kubectl, run.namespace, job["metadata"]["uid"], True)
            if said:
                raise DemoError(f"cannot let Kueue resume Job {name}: {said}")
        else:
            run.kubectl.run(
                ["patch", "job", name, "-n", run.namespace, "--type=merge", "-p"]
                + [SUSPEND_PATCH.replace("true", "false")],
                retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
            )
        resumed.append(name)
    return resumed


def replay(lines: Sequence[dict], on_reward: Callable[[dict], None] | None) -> None:
    """Hand the caller the lines written before the attach, each marked `replayed: true`."""
    if on_reward is not None:
        for row in lines:
            on_reward(dict(row, replayed=True))


def attach_batch_step(
    run: RunContext, entry: BatchEntry, caller: Caller, began: float, before: FirstFollower
) -> tuple[BatchOutcome, dict | None]:
    """One batch of the run: recomputed from its files if it was followed to its end, followed
    if its Jobs exist, else submitted as `run` would. The batch's record of the attach (None
    when nothing of it was unknown)."""
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    rewards_path = os.path.join(batch_dir, REWARDS_FILE)
    if batch_done(batch_dir):
        replay(kept_lines(rewards_path, run.settings.count), caller.on_reward)
        return load_saved_batch(batch_dir, entry, run.settings), None
    jobs = existing_jobs(run, entry)
    gone = [name for name in entry.jobs or (entry.job,) if run.receipt.has_job(name)]
    gone = [name for name in gone if name not in {job["metadata"]["name"] for job in jobs}]
    if gone:
        # Made again, its episodes would run twice: what it did is unknowable instead.
        raise evidence_gone(run, entry, f"Job {', '.join(gone)} of the receipt is gone")
    if not jobs:
        return run_one_batch(run, entry), None
    kept = kept_lines(rewards_path, run.settings.count) if run.settings.rollout else []
    ended_before = all(job_finished(job) for job in jobs)
    resumed = resume(run, jobs)
    replay(kept, caller.on_reward)
    outcome = run_one_batch(run, entry, kept, adopt=True)
    record = {
        # The client before stopped after this moment (within a lease period of it, if it held one).
        "first_follower_alive_at": before.alive_at,
        "first_follower_evidence": before.evidence,
        "attach_began_at": began,
        "job_ended_before_attach": ended_before,
        "resumed_jobs": resumed,
        "replayed_lines": len(kept),
    }
    return mark_unknown(outcome, batch_dir, record, ended_before), record


def mark_unknown(
    outcome: BatchOutcome, batch_dir: str, record: dict, ended_before: bool
) -> BatchOutcome:
    """A batch another client began: what its crash made unknowable is None, and client.json
    says why, never a figure made up."""
    unknown = {
        "submitted_at": UNKNOWN_SUBMISSION,
        "client_job_complete_seconds": UNKNOWN_SUBMISSION,
        "reward_deliveries": UNKNOWN_DELIVERIES,
    }
    if ended_before:
        unknown["observed_at"] = "the Job ended while no client followed it"
    client = dict(outcome.client_wait or {})
    client.update({key: None for key in unknown}, attached=record, unknown=unknown)
    write_json(os.path.join(batch_dir, "client.json"), client)
    figures = outcome.summary.figures
    for key in list(figures):
        if key.startswith("reward_delivery_lag") or key in (
            "first_reward_seconds",
            "kth_reward_seconds",
        ):
            figures[key] = None
    if isinstance(figures.get("reward_delivery"), dict):
        figures["reward_delivery"]["unknown"] = UNKNOWN_DELIVERIES
    return outcome._replace(client_wait=client)


def evidence_gone(run: RunContext, entry: BatchEntry, what: str) -> DemoError:
    """The batch's Jobs (or the namespace) are gone from the cluster: nothing can be followed
    or proven of the episodes without a line. attach.json says what is missing and why."""
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    kept = kept_lines(os.path.join(batch_dir, REWARDS_FILE), run.settings.count)
    missing = sorted(set(range(run.settings.count)) - {row["index"] for row in kept})
    write_json(
        os.path.join(run.output, "attach.json"),
        {
            "verdict": "cannot verify",
            "batch": entry.job,
            "missing": what,
            "why": "deleted while no client followed the run (cleanup, cleanup --stale, a TTL, "
            "or by hand): its pods, logs and events went with it",
            "lines_kept": len(kept),
            "episodes_unknown": missing,
        },
    )
    return DemoError(
        f"cannot verify batch {entry.job}: {what} (deleted while no client followed it); "
        f"{REWARDS_FILE} keeps the {len(kept)} lines written before its client stopped, and "
        f"the outcomes of the other {len(missing)} episodes cannot be known; attach.json says so"
    )


def never_started(run: RunContext, live: dict | None) -> DemoError:
    """The run stopped before its first Job existed: nothing ran; its namespace (proven the
    run's own) is deleted, else `cleanup` is named."""
    if live is None:
        return DemoError(
            f"the run never started: no Job of it was created and its namespace "
            f"{run.namespace} is gone; nothing to follow or clean up"
        )
    try:
        cleanup_namespace(run.kubectl, run.receipt, report=io.StringIO())
    except DemoError as error:
        return DemoError(
            f"the run never started: no Job of it was created before its client stopped; "
            f"its namespace {run.namespace} could not be deleted ({error}); clean up with: "
            f"{cleanup_command(run.output, run.kubectl.binary)}"
        )
    return DemoError(
        f"the run never started: no Job of it was created before its client stopped; its "
        f"namespace {run.namespace} held no work and was deleted; run it again"
    )


def finished_results(output: str, settings: Settings, caller: Caller) -> tuple[int, Results]:
    """A run that wrote results.json: every line replayed, its results as they are."""
    figures = read_json(os.path.join(output, RESULTS_FILE), RESULTS_FILE)
    for entry in settings.batches:
        path = os.path.join(os.path.normpath(os.path.join(output, entry.dir)), REWARDS_FILE)
        replay(kept_lines(path, settings.count), caller.on_reward)
    return (EXIT_PARTIAL if figures.get("accepted_partial") else 0), Results(figures, [])


def attach_run(request: AttachRequest, caller: Caller) -> tuple[int, Results | None]:
    """`attach`: follow the run in `request.output` to its end as its client would have, its
    results saved; the exit status and the results."""
    began = time.time()
    receipt = Receipt.read(request.output)
    settings = Settings.from_saved(
        read_json(os.path.join(request.output, SETTINGS_FILE), SETTINGS_FILE)
    )
    if os.path.exists(os.path.join(request.output, RESULTS_FILE)):
        return finished_results(request.output, settings, caller)
    kubectl = Kubectl(find_kubectl(request.kubectl), receipt.context, verbose=request.verbose)
    require_receipt_context(kubectl, receipt)
    live, lock_path, before = claim(request, kubectl, receipt)
    run = attached_context(request, settings, receipt, kubectl, caller)
    run.lease = FollowerLease(kubectl, receipt, request.output, lock_path, request.force).start()
    first = settings.batches[0]
    if live is None and receipt.fields.get("jobs"):
        close(run)
        unfinished = [
            e for e in settings.batches if not batch_done(os.path.join(run.output, e.dir))
        ]
        gone = f"the run's namespace {receipt.namespace} is gone"
        raise evidence_gone(run, (unfinished or [first])[0], gone)
    if live is None or (not receipt.fields.get("jobs") and not existing_jobs(run, first)):
        close(run)
        raise never_started(run, live)
    return follow_attached(run, request, caller, began, before)


def follow_attached(
    run: RunContext, request: AttachRequest, caller: Caller, began: float, before: FirstFollower
) -> tuple[int, Results | None]:
    """Each batch of the attached run in order, then results.json; stopped as `run` stops."""
    hint = cleanup_command(run.output, run.kubectl.binary)
    failure: DemoError | None = None
    results: Results | None = None
    try:
        outcomes, records = [], []
        for entry in run.settings.batches:
            outcome, record = attach_batch_step(run, entry, caller, began, before)
            outcomes.append(outcome)
            records.append(record)
        results = save_results(run, outcomes)
        results.figures["attach"] = attach_figures(before, began, records)
        write_json(os.path.join(run.output, RESULTS_FILE), results.figures)
    except KeyboardInterrupt:
        interrupted(run, request.cleanup, hint)
        return EXIT_INTERRUPTED, None
    except StreamClosed as closed:
        interrupted(run, request.cleanup, hint, f"{closed}.")
        return EXIT_INTERRUPTED, None
    except RewardCallbackError as error:
        interrupted(run, request.cleanup, hint, f"{error}; the attach stopped.")
        raise error.original from None
    except DemoError as error:
        failure = error
    finally:
        close(run)
    python = request.spelling is not None and request.spelling.python
    if failure is None and results is not None and not python:
        print_results(results.figures, request.quiet, os.path.join(run.output, RESULTS_FILE))
    finish_run(run, failure, request.cleanup, request.quiet, hint)
    assert results is not None  # finish_run raised otherwise
    return (EXIT_PARTIAL if results.figures.get("accepted_partial") else 0), results


def attach_figures(before: FirstFollower, began: float, records: Sequence[dict | None]) -> dict:
    """results.json's `attach`: when the first client was last proven alive, when the attach
    began, and which batches it picked up (each batch's client.json says what is unknown)."""
    return {
        "first_follower_alive_at": before.alive_at,
        "first_follower_evidence": before.evidence,
        "attach_began_at": began,
        "batches_attached": sum(1 for record in records if record is not None),
        "client": "the attach's own cost; the first client's went with it",
    }


def attach_action(args: Any) -> int:
    """`attach --output DIR`: the command line's attach."""
    request = AttachRequest(
        args.output, args.force, args.kubectl, args.verbose, args.quiet, args.cleanup
    )
    return attach_run(request, Caller())[0]
