"""`report` and `compare`: saved files only, no cluster."""

from __future__ import annotations

import argparse
import os
from typing import NamedTuple

from .constants import JOB_NAME, PREPULL_FILE, RESULTS_FILE, SETTINGS_FILE
from .kueue import WORKLOADS_FILE
from .tenancy import admission_figures
from .model import BatchEntry, DemoError, Settings
from .files import Receipt, read_json, read_text
from .parse import EventRecord, event_records, job_finished, pod_name
from .timing import split_observed
from .outcomes import Delivery, episode_rows, group_images
from .summary import BatchSummary, summarise_batch
from .render import compare_table
from .metrics import push_saved_metrics, write_metrics
from .telemetry import export_batches, open_tracer, say_export
from .watch import saved_batch_job
from .results import (
    BatchOutcome,
    Results,
    assemble_results,
    batch_delivery_figures,
    describe_failure,
    summarise_rollout,
)
from .run import print_results


class SavedBatch(NamedTuple):
    """What a batch's directory holds, as its summary reads it."""

    job: dict
    pods: list[dict]
    events: list[EventRecord]
    logs: dict[str, str]  # pod name -> its log
    client: dict  # client.json; empty when the run saved none


def load_saved_batch(directory: str, entry: BatchEntry, settings: Settings) -> BatchOutcome:
    """Recompute one batch's summary from its saved files."""
    saved = read_saved_batch(directory, entry)
    check_saved_job_finished(saved, settings)
    observed_path = os.path.join(directory, "observed.json")
    observed = read_json(observed_path, "observed.json") if os.path.exists(observed_path) else {}
    if settings.rollout:
        summary = saved_rollout_summary(saved, settings, observed)
    else:
        summary = summarise_batch(
            saved.job,
            saved.pods,
            saved.logs,
            saved.events,
            settings.count,
            settings.builtin,
            saved.client.get("observed_at"),
            observed,
        )
    return BatchOutcome(entry, summary, saved.client or None)


def read_saved_batch(directory: str, entry: BatchEntry) -> SavedBatch:
    """The batch's Job, pods, events, logs and client.json; DemoError when it saved no job.json."""
    job_path = os.path.join(directory, "job.json")
    if not os.path.exists(job_path):
        raise DemoError(
            f"no job.json in {directory}: the run stopped before its Job's status was saved "
            f"(it was interrupted or failed early); nothing to report"
        )
    job = saved_batch_job(read_json(job_path, "job.json"), entry.job)
    pods = read_json(os.path.join(directory, "pods.json"), "pods.json").get("items", [])
    events_path = os.path.join(directory, "events.json")
    events = event_records(
        read_json(events_path, "events.json").get("items", [])
        if os.path.exists(events_path)
        else []
    )
    logs = {
        pod_name(pod): read_text(os.path.join(directory, f"{pod_name(pod)}.log")) for pod in pods
    }
    client_path = os.path.join(directory, "client.json")
    client = read_json(client_path, "client.json") if os.path.exists(client_path) else {}
    return SavedBatch(job, pods, events, logs, client)


def check_saved_job_finished(saved: SavedBatch, settings: Settings) -> None:
    """DemoError when the saved Job never finished, or (all episodes must succeed) failed."""
    job, pods, logs = saved.job, saved.pods, saved.logs
    end = job_finished(job)
    job_name = job["metadata"].get("name", JOB_NAME)
    if end is None:
        # Saved while the Job was still running: the run was interrupted or gave up waiting.
        # Only the pods' states are evidence; how long the Job ran is not.
        raise DemoError(
            "\n  ".join(
                [
                    f"Job {job_name} never finished while the run watched it (the run was interrupted or gave up "
                    f"waiting: job.json has no Complete or Failed condition); nothing to report"
                ]
                + describe_failure(job, pods, job_name, 0, logs)[1:]
            )
        )
    if end != "Complete" and not settings.rollout:
        raise DemoError(
            "\n  ".join(
                ["the saved Job did not complete"]
                + describe_failure(job, pods, job_name, settings.timeout, logs)
            )
        )


def saved_rollout_summary(saved: SavedBatch, settings: Settings, observed: dict) -> BatchSummary:
    """A rollout batch's summary from its saved files, with its reward deliveries if it saved them."""
    job, pods, events, logs, client = saved
    rows = episode_rows(
        settings.count,
        job,
        pods,
        logs,
        settings.builtin,
        settings.task_ids,
        settings.group_size,
        events,
        group_images(settings),
    )
    summary = summarise_rollout(
        rows, job, pods, logs, events, settings, client.get("observed_at"), observed
    )
    if client.get("reward_deliveries") is not None:
        deliveries = [Delivery(*record) for record in client["reward_deliveries"]]
        summary.figures.update(
            batch_delivery_figures(deliveries, split_observed(observed)[1], settings.need)
        )
        summary.deliveries = [d.written_at for d in deliveries if d.success]
    return summary


def recompute(output: str) -> Results:
    """Results of a finished run from its saved files alone."""
    settings_path = os.path.join(output, SETTINGS_FILE)
    if os.path.exists(settings_path):
        saved_settings = read_json(settings_path, "run.json")
        settings, capacity = Settings.from_saved(saved_settings), saved_settings.get("capacity")
    else:  # a run saved by the guide's script, which keeps only the guide's files
        receipt = Receipt.read(output)
        saved = read_json(os.path.join(output, RESULTS_FILE), "results.json")
        settings = Settings(
            count=saved["episodes"],
            parallelism=saved["parallelism"],
            image=saved["image"],
            runtime=saved["runtime"],
            timeout=0,
            context=receipt.context,
            namespace=receipt.namespace,
            batches=(BatchEntry(JOB_NAME, True, "."),),
        )
        capacity = None
    batches = [
        load_saved_batch(os.path.normpath(os.path.join(output, entry.dir)), entry, settings)
        for entry in settings.batches
    ]
    previous = os.path.join(output, RESULTS_FILE)
    client = read_json(previous, "results.json").get("client") if os.path.exists(previous) else None
    results = assemble_results(settings, batches, client, capacity)
    saved_prepull = os.path.join(output, PREPULL_FILE)
    if os.path.exists(saved_prepull):
        results.figures["prepull"] = {
            key: value
            for key, value in read_json(saved_prepull, PREPULL_FILE).items()
            if key not in ("node_names", "image_names", "pod_states")
        }
    admission = saved_admission(output, settings)
    if admission:
        results.figures["admission"] = admission
    return results


def saved_admission(output: str, settings: Settings) -> dict | None:
    """--queue: each batch's admission from its saved Workloads (workloads.json, read once Kueue
    admitted the batch) and its Job (job.json), as the run measured it; None without them."""
    found = {}
    for entry in settings.batches:
        directory = os.path.normpath(os.path.join(output, entry.dir))
        workloads_path = os.path.join(directory, WORKLOADS_FILE)
        if not os.path.exists(workloads_path):
            continue
        saved_jobs = read_json(os.path.join(directory, "job.json"), "job.json")
        jobs = saved_jobs.get("items") or [saved_jobs]
        workloads = read_json(workloads_path, WORKLOADS_FILE).get("items") or []
        found[entry.dir] = admission_figures(jobs, workloads)
    return found.get(".") or ({"batches": found} if found else None)


def report(args: argparse.Namespace) -> int:
    """Recompute and reprint a finished run from its saved files; metrics.prom made again from
    them (and pushed, with --pushgateway)."""
    results = recompute(args.output)
    run_id = Receipt.read(args.output).run_id
    write_metrics(args.output, results.figures, results.batches, run_id)
    print_results(results.figures, args.quiet, os.path.join(args.output, RESULTS_FILE))
    if args.pushgateway:
        push_saved_metrics(args.output, args.pushgateway, run_id)
    tracer = open_tracer(args.otlp_endpoint, run_id)
    if tracer is not None:
        say_export(export_batches(tracer, results.batches, results.figures), args.quiet)
    return 0


def compare(args: argparse.Namespace) -> int:
    """Print the key figures of two finished runs side by side, with ratios."""
    first = read_json(os.path.join(args.first, RESULTS_FILE), "results.json")
    second = read_json(os.path.join(args.second, RESULTS_FILE), "results.json")
    print(
        compare_table(
            first,
            second,
            f"A: {os.path.basename(os.path.normpath(args.first))}",
            f"B: {os.path.basename(os.path.normpath(args.second))}",
        )
    )
    return 0
