"""The `run` action: `perform_run` -> `start_run` -> `execute`, its steps on one `RunContext`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import secrets
import signal
import socket
import shlex
import sys
import threading
import time
from typing import Any, Iterator, NamedTuple, NoReturn, Sequence

from .constants import (
    EPISODE_TIMEOUT_SLACK_SECONDS,
    NEED_GROUPS_ANNOTATION,
    CALL_TIMEOUT_SECONDS,
    CLIENT_GRACE_SECONDS,
    DEADLINE_GROWS_ABOVE_EPISODES,
    DEFAULT_JOB_DEADLINE_SECONDS,
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    FIRST_CONTACT_RETRY_SECONDS,
    JOB_NAME,
    LOG_READERS,
    NAMESPACE_PREFIX,
    PREPULL_FILE,
    PREPULL_LABEL,
    PLANNED_JOBS_FILE,
    PREPULL_POLL_SECONDS,
    RECEIPT_FILE,
    RESULTS_FILE,
    REWARDS_FILE,
    SETTINGS_FILE,
    SUSPEND_PATCH,
    USER_UNKNOWN_BEFORE_RUN,
    WARMUP_JOB_NAME,
    WORKER_SOURCE,
    __version__,
)

from .model import (
    EpisodePod,
    BatchEntry,
    Caller,
    DemoError,
    ImageGroup,
    RolloutPolicy,
    RunPlan,
    RunRequest,
    Settings,
    StreamClosed,
    Task,
)
from .stats import rounded
from .files import (
    Receipt,
    attach_command,
    cleanup_command,
    kubeconfig_path,
    program_name,
    write_json,
)
from .parse import (
    EventRecord,
    count_image_cache,
    event_records,
    image_cache_states,
    job_finished,
    pod_name,
)
from .manifests import (
    Launch,
    RunOrigin,
    configmap_manifest,
    image_groups,
    job_manifest,
    list_manifest,
    namespace_manifest,
    network_policy_manifest,
    parallelism_shares,
    parse_image_map,
    planned_work,
    prepull_failures,
    prepull_pod_manifest,
    rewrite_image,
    run_images,
    task_configmaps,
    task_images,
    tasks_volume,
    usable_nodes,
)
from .summary import BatchSummary, EpisodeDrafts, held_objects_spared
from .render import phase_tables, plural, printed_results, throughput_line
from .metrics import push_saved_metrics, redacted
from .telemetry import finish_trace, open_tracer
from .kube import (
    ApiProxy,
    INTERRUPTS,
    Kubectl,
    KubectlError,
    PodReading,
)
from .proxied import ProxiedKubectl, api_create, shared_proxy
from .watch import BatchJobs, WatchStream, pod_terminal
from .follow import (
    BatchEvidence,
    BatchFollower,
    Evidence,
    Progress,
    RewardCallbackError,
    RewardStream,
    RunContext,
)
from .syntax import check_episode_syntax
from .podspec import egress_policy_manifest, episode_pod, resolve_egress, secret_copy_manifest
from .preflight import (
    check_capacity,
    check_runtime_class,
    check_server_version,
    current_user,
    find_kubectl,
    resolve_context,
    save_run_records,
)
from .results import (
    BatchOutcome,
    Results,
    cpu_seconds,
    rollout_summary,
    save_results,
    verified_summary,
    warn_clocks,
)
from .lifecycle import cleanup_namespace
from .kueue import (
    admit_batch,
    check_queue,
    check_shared_namespace,
    complete_shared_receipt,
    record_admission,
    stop_queued,
    wait_admitted,
)
from .tenancy import queued_job, run_suffix, shared_jobs, shared_setup, stamped_jobs
from .secretcopy import filled, read_secrets
from .lease import FollowerLease, take_lock


def default_timeout(count: int, parallelism: int) -> int:
    """The Job deadline: the guide's 240 s up to the default cap, then grown with the waves of pods."""
    if count <= DEADLINE_GROWS_ABOVE_EPISODES:
        return DEFAULT_JOB_DEADLINE_SECONDS
    waves = math.ceil(count / parallelism)
    return max(DEFAULT_JOB_DEADLINE_SECONDS, 120 + 20 * waves)


def batch_names(rounds: int, warmup: bool, suffix: str = "") -> list[tuple[str, bool]]:
    """(Job name, measured?) for every batch of a run; one measured batch is plain `rollout`
    (`suffix`: what a run in a shared namespace ends its names with)."""
    names = [(WARMUP_JOB_NAME, False)] if warmup else []
    if rounds == 1:
        names.append((JOB_NAME, True))
    else:
        names += [(f"{JOB_NAME}-{n}", True) for n in range(1, rounds + 1)]
    return [(name + suffix, measured) for name, measured in names]


def rollout_policy(settings: Settings) -> RolloutPolicy | None:
    """Retries and accepted failures, when either was asked for, or --need (which accepts the
    failures it over-provisions for: count - need); else the guide's backoffLimit 0."""
    if settings.need is not None:
        return RolloutPolicy(settings.retries or 0, settings.count - settings.need, settings.need)
    if settings.need_groups is not None:  # the tool stops the rest itself, once K are whole
        lost = settings.count - settings.need_groups * settings.group_size
        return RolloutPolicy(settings.retries or 0, lost)
    if settings.retries is None and settings.allow_failures is None:
        return None
    return RolloutPolicy(settings.retries or 0, settings.allow_failures or 0)


def image_job_policy(settings: Settings, episodes: int) -> RolloutPolicy | None:
    """The policy of one image's Job of `episodes`: --allow-failures K holds for the whole batch
    (the run counts every Job's failures against it), and a Job can fail no more than its own
    episodes, so its maxFailedIndexes is K or its episodes, the fewer (the API refuses more)."""
    policy = rollout_policy(settings)
    if policy is None:
        return None
    return policy._replace(allow_failures=min(policy.allow_failures, episodes))


def pod_deadline(settings: Settings) -> int | None:
    """Each pod's activeDeadlineSeconds, counted from its start on the node: --pull-timeout and
    --episode-timeout together, since one deadline bounds the pull and the episode after it. A
    rollout's launcher stops its episode at --episode-timeout itself: its pod's deadline, a backstop,
    leaves EPISODE_TIMEOUT_SLACK_SECONDS more for the pod to start."""
    known = [part for part in (settings.pull_timeout, settings.episode_timeout) if part is not None]
    if settings.rollout and settings.episode_timeout is not None:
        known.append(EPISODE_TIMEOUT_SLACK_SECONDS)
    return sum(known) if known else None


def pod_deadline_parts(settings: Settings) -> str | None:
    """What each pod's deadline (pod_deadline) is made of: the flags given, with their values."""
    parts = [
        f"{flag} {seconds}"
        for flag, seconds in (
            ("--pull-timeout", settings.pull_timeout),
            ("--episode-timeout", settings.episode_timeout),
        )
        if seconds is not None
    ]
    if settings.rollout and settings.episode_timeout is not None:
        parts.append(f"{EPISODE_TIMEOUT_SLACK_SECONDS} s for the pod to start")
    return " + ".join(parts) or None


def episode_launch(settings: Settings) -> Launch | None:
    """How a rollout's pods run their episode: through the launcher, with --episode-timeout."""
    return Launch(timeout=settings.episode_timeout) if settings.rollout else None


def batch_job(namespace: str, settings: Settings, name: str, task_maps: Sequence[dict]) -> dict:
    """The Job of one batch, from the run's settings and the ConfigMaps that carry its tasks."""
    return job_manifest(
        namespace,
        settings.count,
        settings.parallelism,
        settings.image,
        settings.runtime,
        settings.timeout,
        name=name,
        harden=settings.harden,
        # Rewards are kept per completion index: a rollout's pods need one, whatever they run.
        indexed=not settings.builtin or settings.rollout,
        tasks=tasks_volume(task_maps, settings.group_size) if task_maps else None,
        policy=rollout_policy(settings),
        episode_timeout=pod_deadline(settings),
        launch=episode_launch(settings),
        deadline_parts=pod_deadline_parts(settings),
        pod=settings.pod,
    )


def image_job_name(batch: str, number: int) -> str:
    """The Job of a batch's `number`th image (from 1)."""
    return f"{batch}-image-{number}"


def batch_jobs(
    namespace: str,
    settings: Settings,
    name: str,
    task_maps: Sequence[dict],
    groups: Sequence[ImageGroup],
) -> list[dict]:
    """The Jobs of one batch: its one Job, or one per image, --parallelism shared between them."""
    if len(groups) == 1:
        return [
            batch_job(
                namespace, dataclasses.replace(settings, image=groups[0].image), name, task_maps
            )
        ]
    shares = parallelism_shares(settings.parallelism, [len(group.indexes) for group in groups])
    return [
        job_manifest(
            namespace,
            len(group.indexes),
            share,
            group.image,
            settings.runtime,
            settings.timeout,
            name=image_job_name(name, number),
            harden=settings.harden,
            indexed=True,
            tasks=tasks_volume(task_maps, settings.group_size, group.indexes)
            if task_maps
            else None,
            policy=image_job_policy(settings, len(group.indexes)),
            episode_timeout=pod_deadline(settings),
            batch=name,
            episode_indexes=group.indexes,
            launch=episode_launch(settings),
            deadline_parts=pod_deadline_parts(settings),
            pod=settings.pod,
        )
        for number, (group, share) in enumerate(zip(groups, shares), start=1)
    ]


def plan_run(
    namespace: str,
    run_id: str,
    settings: Settings,
    worker_source: str,
    tasks: Sequence[Task] = (),
    origin: RunOrigin | None = None,
) -> RunPlan:
    """Every object `run` creates, from its settings (and the run's origin, once known) alone."""
    task_maps = task_configmaps(namespace, tasks) if tasks else []
    setup = [network_policy_manifest(namespace)] if settings.harden else []
    if settings.pod.egress:
        setup.append(egress_policy_manifest(namespace, settings.pod.egress))
    # Planned without their data: the Secrets are read when the run starts (secretcopy).
    setup += [
        secret_copy_manifest(namespace, source)
        for source in settings.pod.secrets
        # In a namespace the run shares, a Secret of that namespace is read where it is.
        if not (settings.shared_namespace and source.namespace == namespace)
    ]
    setup += [configmap_manifest(namespace, worker_source, settings.rollout), *task_maps]
    groups = image_groups(
        tasks, settings.count, settings.group_size, settings.image, settings.image_map
    )
    suffix = run_suffix(run_id) if settings.shared_namespace else ""
    jobs = {
        name: batch_jobs(namespace, settings, name, task_maps, groups)
        for name, _ in batch_names(settings.rounds, settings.warmup, suffix)
    }
    # What the run plans goes with its origin: a namespace without either is the guide's.
    planned = planned_work(jobs) if origin is not None else None
    if settings.shared_namespace:
        shared = shared_jobs(jobs, setup, run_id, origin, planned, settings.queue)
        return RunPlan(None, shared_setup(setup, run_id), shared)
    if settings.queue:
        jobs = {
            name: [queued_job(job, settings.queue) for job in each] for name, each in jobs.items()
        }
    return RunPlan(
        namespace_manifest(namespace, run_id, settings.harden, origin, planned), setup, jobs
    )


def planned_objects(
    namespace: str,
    run_id: str,
    settings: Settings,
    worker_source: str,
    tasks: Sequence[Task] = (),
    origin: RunOrigin | None = None,
) -> list[dict]:
    """Every object `run` creates, in creation order."""
    return plan_run(namespace, run_id, settings, worker_source, tasks, origin).objects()


def run_origin(run_id: str, output: str, user: str, ttl_seconds: int | None) -> RunOrigin:
    """This run's origin as of now: this host, the absolute output directory, the expiry `--ttl` sets."""
    return RunOrigin(
        run_id,
        __version__,
        socket.gethostname(),
        os.path.abspath(output),
        user,
        None if ttl_seconds is None else time.time() + ttl_seconds,
    )


def execute(run: RunContext) -> Results | None:
    """The steps of `run`, in order; each leaves on disk what a failure after it needs."""
    save_run_records(run)
    # The run's one follower, once its receipt is there: its lock file, then its lease.
    run.lease = FollowerLease(run.kubectl, run.receipt, run.output, take_lock(run.output)).start()
    check_runtime_class(run)
    if rollout_policy(run.settings):
        check_server_version(run)  # --need among them
    check_shared_namespace(run)
    if run.settings.queue:
        check_queue(run)  # the queue's quota, not the nodes, holds the batch
    else:
        check_capacity(run)
    secrets_read = read_secrets(run)  # --env-from-secret: held in memory alone
    stamp_origin(run)
    save_planned_jobs(run)
    create_namespace(run)
    try:
        for manifest in run.plan.setup:
            created = create_object(run, filled(manifest, secrets_read))
            if run.receipt.shared:  # its UID saved before the next object is made
                metadata = created["metadata"]
                run.receipt.record_object(manifest["kind"], metadata["name"], metadata["uid"])
    finally:
        secrets_read.clear()  # on a failure too: no traceback's frame keeps the values
    if run.settings.prepull:
        prepull(run)
    if run.detach:
        submit_detached(run)
        return None
    outcomes: list[BatchOutcome] = []
    for entry in run.settings.batches:
        for earlier in outcomes[-1:]:  # its drafted rows wait in memory, not in an open file
            for spool in set(earlier.summary.csv_rows.values()):
                spool.hold_in_memory()
        with held_objects_spared(run.owns_process):
            outcomes.append(run_one_batch(run, entry))
        if run.tracer is not None:
            run.tracer.batch_done(entry.job, outcomes[-1].summary, entry.measured)
    return save_results(run, outcomes)


def stamp_origin(run: RunContext) -> None:
    """Who starts the run, from where and until when, and what it plans, into the namespace about
    to be created."""
    origin = run_origin(
        run.receipt.run_id, run.output, current_user(run.kubectl), run.settings.ttl_seconds
    )
    if run.plan.namespace is None:  # a shared namespace: its Jobs carry the origin
        run.plan = run.plan._replace(jobs=stamped_jobs(run.plan.jobs, origin))
        return
    run.plan = run.plan._replace(
        namespace=namespace_manifest(
            run.namespace,
            origin.run_id,
            run.settings.harden,
            origin,
            planned_work(run.plan.jobs),
        )
    )


def submit_detached(run: RunContext) -> None:
    """--detach: the first batch's Jobs created (job-submitted.json, their UIDs in the receipt)
    and nothing followed: `attach` picks the run up from its files."""
    entry = run.settings.batches[0]
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    os.makedirs(batch_dir, exist_ok=True)
    manifests = run.plan.jobs[entry.job]
    save_submitted_jobs(run, batch_dir, manifests)
    create_batch_jobs(run, manifests)


def say_detached(run: RunContext) -> None:
    """What a detached run prints on stdout: its namespace and the command that follows it."""
    if not run.silent:
        print(f"Detached: attach with: {attach_command(run.output, run.kubectl.binary)}")


def detached_telemetry(run: RunContext, pushgateway: str | None) -> None:
    """A detached run has not ended: no root span is sent (its trace would say it ended with no
    episode), nothing is pushed; it says how to send both once `attach` has saved its results."""
    if run.tracer is None and not pushgateway:
        return
    if run.tracer is not None:
        run.tracer.exporter.close()  # nothing was submitted: nothing is sent
    report = f"{program_name()} report {shlex.quote(run.output)}"
    if run.tracer is not None:
        report += f" --otlp-endpoint {shlex.quote(redacted(run.tracer.exporter.config.url))}"
    if pushgateway:
        report += f" --pushgateway {shlex.quote(redacted(pushgateway))}"
    print(
        f"Note: a detached run sends no traces or metrics now; once attach has saved its "
        f"results, send them with: {report}",
        file=sys.stderr,
    )


def save_planned_jobs(run: RunContext) -> None:
    """jobs-planned.json: every Job of every batch, as a List, before any is created (what
    `attach` creates of a run stopped between two batches)."""
    jobs = [job for batch in run.plan.jobs.values() for job in batch]
    write_json(os.path.join(run.output, PLANNED_JOBS_FILE), list_manifest(jobs))


def create_namespace(run: RunContext) -> None:
    """The run's namespace, its UID in the receipt at once (a shared namespace: none is made)."""
    run.touched_cluster = True
    if run.plan.namespace is None:
        return
    created = create_object(run, run.plan.namespace)
    run.receipt.record_namespace(created["metadata"]["uid"])
    if not run.silent:
        print(f"Test namespace: {run.namespace}", flush=True)


def create_object(run: RunContext, manifest: dict) -> dict:
    """Create one object; a retry that finds it already there adopts it only if it is provably ours.
    A stop requested meanwhile (stream_batch closed) comes first: nothing more is created."""
    if run.stop is not None:
        run.stop.check()
    kubectl = run.kubectl
    retries_before = kubectl.retries
    try:
        return kubectl.create(manifest, retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS)
    except KubectlError as error:
        # Only a retried create may find its own first attempt already done.
        if not error.already_exists or kubectl.retries == retries_before:
            raise
    kind = manifest["kind"].lower()
    name = manifest["metadata"]["name"]
    existing = kubectl.get(
        kind,
        name,
        None if kind == "namespace" else run.namespace,
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    assert existing is not None  # not missing_ok: a missing object raised
    if kind == "namespace" and not run.receipt.owns_namespace(existing):
        raise DemoError(f"namespace {name} already exists and is not this run's")
    return existing


def prepull(run: RunContext) -> None:
    """--prepull: every image of the run made present on every node the batch can use, before its
    first Job: one pod per node and image, waited for until each ended (or its deadline passed).
    Leaves prepull.json (the step's figures and its pods); the figures go into results.json."""
    nodes = prepull_nodes(run)
    images = run_images(run.plan.jobs)
    deadline_seconds = run.settings.pull_timeout or run.settings.timeout
    pods = prepull_pods(run, nodes, images, deadline_seconds)
    started = time.monotonic()
    for pod in pods:
        create_object(run, pod)
    finished = wait_prepulled(run, len(pods), started + deadline_seconds + CLIENT_GRACE_SECONDS)
    seconds = time.monotonic() - started
    events = namespace_events(run)
    failures = prepull_failures(finished, events)
    run.prepull = {
        "seconds": rounded(seconds),
        "nodes": len(nodes),
        "images": len(images),
        "pods": len(pods),
        "failures": failures,
        "image_cache": count_image_cache(
            image_cache_states(events).get(pod_name(p)) for p in finished
        ),
    }
    write_json(
        os.path.join(run.output, PREPULL_FILE),
        dict(run.prepull, node_names=nodes, image_names=images, pod_states=list_manifest(finished)),
    )
    if not run.silent:
        say_prepulled(seconds, nodes, images, len(pods), failures)


def prepull_nodes(run: RunContext) -> list[str]:
    """The nodes --prepull pulls on: those the batch can use (schedulable, with the RuntimeClass's
    labels); DemoError when they cannot be listed, or there are none."""
    retry_until = time.monotonic() + FIRST_CONTACT_RETRY_SECONDS
    try:
        runtime_class = run.kubectl.get(
            "runtimeclass", run.settings.runtime, retry_until=retry_until
        )
        nodes = usable_nodes(
            (run.kubectl.get_list("nodes", None, retry_until=retry_until) or {}).get("items") or [],
            runtime_class,
        )
    except DemoError as error:
        raise DemoError(
            f"{run.spelling.switch('prepull')} needs to list the nodes (and get the "
            f"RuntimeClass): {error}"
        ) from None
    if not nodes:
        raise DemoError(
            f"{run.spelling.switch('prepull')} found no node the batch can use (schedulable, "
            f"with the RuntimeClass's labels)"
        )
    return nodes


def prepull_pods(
    run: RunContext, nodes: Sequence[str], images: Sequence[str], deadline_seconds: int
) -> list[dict]:
    """One --prepull pod manifest per image and node, named by their places in the two lists."""
    return [
        prepull_pod_manifest(
            run.namespace,
            f"prepull-{i}-{n}",
            node,
            image,
            run.settings.runtime,
            run.settings.harden,
            deadline_seconds,
        )
        for i, image in enumerate(images, start=1)
        for n, node in enumerate(nodes, start=1)
    ]


def namespace_events(run: RunContext) -> list[EventRecord]:
    """Every event in the run's namespace, read now."""
    listed = run.kubectl.get_list(
        "events", run.namespace, retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS
    )
    return event_records((listed or {}).get("items") or [])


def say_prepulled(
    seconds: float,
    nodes: Sequence[str],
    images: Sequence[str],
    pods: int,
    failures: Sequence[dict],
) -> None:
    """On stderr: what --prepull pulled where, how long it took, and the first pods that failed."""
    print(
        f"Pre-pulled {plural(len(images), 'image')} on {plural(len(nodes), 'node')} in {seconds:.1f} s"
        + (
            f"; {len(failures)} of {pods} pods failed: "
            + "; ".join(f"{f['image']} on {f['node']}: {f['why']}" for f in failures[:3])
            if failures
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )


def wait_prepulled(run: RunContext, count: int, deadline: float) -> list[dict]:
    """The --prepull pods once each has ended, or as they are at the deadline (polled: a short step)."""
    while True:
        listed = run.kubectl.get_list(
            "pods",
            run.namespace,
            "-l",
            f"{PREPULL_LABEL}=true",
            retry_until=min(deadline, time.monotonic() + CALL_TIMEOUT_SECONDS),
        )
        pods = (listed or {}).get("items") or []
        if (
            len(pods) >= count and all(pod_terminal(pod) for pod in pods)
        ) or time.monotonic() >= deadline:
            return sorted(pods, key=pod_name)
        time.sleep(PREPULL_POLL_SECONDS)


def open_proxy(run: RunContext) -> None:
    """The API proxy that reads logs and pages, once a run; without it, one kubectl per read."""
    if run.proxy is None:
        try:
            run.proxy = ApiProxy(run.kubectl)
        except DemoError as error:  # e.g. kubectl proxy forbidden here
            print(f"Warning: {error}; reading logs with one kubectl per pod", file=sys.stderr)


def run_one_batch(
    run: RunContext, entry: BatchEntry, kept: Sequence[dict] = (), adopt: bool = False
) -> BatchOutcome:
    """Submit one Job, follow it, save its evidence, verify and summarise it. `adopt`: its Jobs
    exist already (attach), and `kept` are the rewards.jsonl lines written before."""
    job_name = entry.job
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    os.makedirs(batch_dir, exist_ok=True)
    manifests = run.plan.jobs[job_name]
    job_names = [manifest["metadata"]["name"] for manifest in manifests]
    if not adopt:
        save_submitted_jobs(run, batch_dir, manifests)
    admitted = (
        admit_batch(run, lambda: create_batch_jobs(run, manifests), job_names, entry.dir)
        if run.settings.queue and not adopt
        else None
    )
    if run.settings.queue and adopt:  # attach: the Jobs made before, maybe queued still
        wait_admitted(run, job_names)
        record_admission(run, job_names, entry.dir)
    # The client's own deadline, which bounds its watches from their start; its measures start
    # at the submission, just before the create call.
    client_deadline = time.monotonic() + run.settings.timeout + CLIENT_GRACE_SECONDS
    watches = start_batch_watches(run, job_name, job_names, client_deadline)
    follower = batch_follower(run, job_name, job_names, batch_dir, watches, kept)
    run.batch = batch = BatchEvidence(run, follower, batch_dir)
    if adopt:
        follower.adopt()
    else:
        follower.submit(lambda: admitted.job if admitted else create_batch_jobs(run, manifests))
    if admitted:  # the Jobs were made before the queue's wait: the clocks take the true moments
        follower.state.submitted(admitted.submitted)
        follower.state.created(admitted.created)
    end = follower.follow(client_deadline)
    wait = client_wait(follower, end)
    evidence = batch.collect(job_name)
    follower.stop_watches()
    if entry == run.settings.batches[-1]:
        begin_cleanup(run)
    wait = wait._replace(
        pods_read=pods_read(evidence.reading, follower.state.end_resource_version),
        events_read=batch.events_read,
    )
    client_path = os.path.join(batch_dir, "client.json")
    summary, wait = summarise_followed_batch(batch, end, evidence, wait, client_path)
    assert (
        follower.end_seen_monotonic is not None
    )  # both summaries fail a batch whose end was not seen
    wait = wait._replace(
        episodes_summarised_while_waiting=summary.drafts_taken,
        post_completion_seconds=rounded(time.monotonic() - follower.end_seen_monotonic),
    )
    write_json(client_path, wait.saved())
    return BatchOutcome(entry, summary, wait.saved())


def begin_cleanup(run: RunContext) -> None:
    """--cleanup through the proxy (run.cleanup_ahead): the namespace's deletion begun once the
    last batch's evidence is read, while its summary is made, since the API server takes a tenth
    of a second or more to delete a Job; finish_run waits for it (cleaned_up). It cuts a
    trainer's step by that much (tests/benchmarks/step_benchmark.py)."""
    ahead = run.cleanup_ahead
    if ahead is None or not ahead.set_running_or_notify_cancel():
        return

    def clean() -> None:
        report = io.StringIO()
        try:
            cleanup_namespace(run.kubectl, run.receipt, report=report)
        except BaseException as error:  # raised where it is waited for
            ahead.set_exception(error)
        else:
            ahead.set_result(report.getvalue())

    threading.Thread(target=clean, name="rl-batch-demo cleanup", daemon=True).start()


def cleaned_up(run: RunContext, report: Any) -> None:
    """The run's namespace deleted (cleanup_namespace), what it said on `report`: waited for
    when begin_cleanup began it, else done now."""
    ahead = run.cleanup_ahead
    if ahead is None or not (ahead.running() or ahead.done()):
        cleanup_namespace(run.kubectl, run.receipt, report=report)
        return
    report.write(ahead.result())
    report.flush()


def save_submitted_jobs(run: RunContext, batch_dir: str, manifests: Sequence[dict]) -> None:
    """job-submitted.json: the batch's Job (a List of them when several, each checked first)."""
    write_json(
        os.path.join(batch_dir, "job-submitted.json"),
        manifests[0] if len(manifests) == 1 else list_manifest(manifests),
    )
    if len(manifests) > 1:
        check_jobs_accepted(run, manifests)


def start_batch_watches(
    run: RunContext, job_name: str, job_names: Sequence[str], client_deadline: float
) -> WatchStream:
    """The batch's watches with the pod watch started, and the API proxy open."""
    watches = WatchStream(run.kubectl, run.namespace, job_name, BatchJobs(job_name, job_names))
    # The pod watch first, so that it is listening by the time the Job's first pods are created
    # (and starts while the proxy does).
    watches.start("pods", client_deadline)
    try:
        open_proxy(run)
    except BaseException:
        watches.stop()
        raise
    return watches


def batch_follower(
    run: RunContext,
    job_name: str,
    job_names: Sequence[str],
    batch_dir: str,
    watches: WatchStream,
    kept: Sequence[dict] = (),
) -> BatchFollower:
    """What follows the batch, with its reward stream when it is a rollout."""
    stop_rest = (
        (lambda: stop_for_groups(run, job_names)) if run.settings.need_groups is not None else None
    )
    path = os.path.join(batch_dir, REWARDS_FILE)
    rewards = (
        RewardStream(path, run.settings, run.on_reward, run.stop, stop_rest, kept)
        if run.settings.rollout
        else None
    )
    return BatchFollower(
        run.kubectl,
        run.namespace,
        job_name,
        run.settings.count,
        run.progress,
        run.pool,
        run.proxy,
        batch_dir,
        rewards,
        watches,
        EpisodeDrafts(run.settings.builtin, spool_dir=batch_dir),
        job_names,
        spare_held=run.owns_process,
    )


def stop_for_groups(run: RunContext, job_names: Sequence[str]) -> None:
    """--need-groups K met: each Job of the batch stamped as stopped by the tool and suspended, so
    that its controller deletes its running pods and starts no more (the Job's own successPolicy
    cannot say "K whole groups"). A Job that has ended is stamped alone."""
    stamp = {"metadata": {"annotations": {NEED_GROUPS_ANNOTATION: str(run.settings.need_groups)}}}
    for name in job_names:
        ended = job_finished(run.batch.follower.jobs.seen.get(name) or {}) if run.batch else None
        patch = stamp if ended else dict(stamp, spec={"suspend": True})
        run.kubectl.run(
            ["patch", "job", name, "-n", run.namespace, "--type=merge", "-p", json.dumps(patch)],
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
        if run.settings.queue and not ended:  # else Kueue resumes it: the cancelled would run
            stop_queued(run.kubectl, run.namespace, name, run.receipt.job_uids().get(name))
    if not run.silent:
        print(
            f"{run.spelling.setting('need_groups', run.settings.need_groups)} met: the rest of "
            f"the batch stopped",
            file=sys.stderr,
            flush=True,
        )


def create_batch_jobs(run: RunContext, manifests: Sequence[dict]) -> dict:
    """The batch's Jobs in order, each UID in the receipt at once; the batch starts with the first."""
    created = []
    for manifest in manifests:
        created.append(create_object(run, manifest))
        run.receipt.record_job(manifest["metadata"]["name"], created[-1]["metadata"]["uid"])
    return created[0]


def summarise_followed_batch(
    batch: BatchEvidence, end: str | None, evidence: Evidence, wait: ClientWait, client_path: str
) -> tuple[BatchSummary, ClientWait]:
    """The batch verified (or rolled out) and summarised; a rollout's wait takes its reward
    deliveries, saved in client.json at once to be kept should the summary fail."""
    summarise = rollout_summary if batch.settings.rollout else verified_summary
    rewards = batch.follower.rewards
    try:
        summary = summarise(batch, end, evidence)
    finally:
        if rewards is not None:
            rewards.close()
            wait = wait._replace(reward_deliveries=[d.saved() for d in rewards.deliveries])
            write_json(client_path, wait.saved())
    return summary, wait


def check_jobs_accepted(run: RunContext, manifests: Sequence[dict]) -> None:
    """Each Job of a batch of several, as the API server would take it (a server-side dry run), before
    any is created: one refused (an invalid image reference) fails the run with none of them made,
    and the namespace made for them, empty of work, deleted."""
    for manifest in manifests:
        retry_until = time.monotonic() + CALL_TIMEOUT_SECONDS
        try:
            if run.kubectl.api is not None:
                api_create(run.kubectl.api, manifest, retry_until, dry_run=True)
            else:
                run.kubectl.run(
                    ["create", "--dry-run=server", "-f", "-", "-o", "name"],
                    input_text=json.dumps(manifest),
                    retry_until=retry_until,
                )
        except KubectlError as error:
            image = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
            raise DemoError(
                f"the API server refuses Job {manifest['metadata']['name']} (image {image}): "
                f"{error}; none of the batch's {len(manifests)} Jobs was created"
                f"{remove_unused_namespace(run)}"
            ) from None


def remove_unused_namespace(run: RunContext) -> str:
    """Delete the run's namespace before any Job of it exists (it holds the run's ConfigMaps, no
    work): what to add to the failure's words; nothing when it stays (cleanup says why then)."""
    try:
        cleanup_namespace(run.kubectl, run.receipt, report=io.StringIO())
    except DemoError:
        return ""
    run.touched_cluster = False  # nothing is left for cleanup to do
    return f"; its namespace {run.namespace} was deleted"


class ClientWait(NamedTuple):
    """How the client waited for one Job (client.json): when it saw the end, what the wait cost,
    how the evidence was read after it, and (a rollout) when each rewards.jsonl line was written."""

    job: str
    end: str | None  # Complete or Failed; None when the client gave up waiting
    submitted_at: float  # wall clock, just before the create call
    observed_at: float | None  # wall clock, when the client saw the end
    client_job_complete_seconds: float | None
    kubectl_processes_while_waiting: int
    watch_restarts: int
    watch_queue_peak: int
    wait_mode: str  # "watch", or "poll" once the watches gave up
    pods_read: dict | None = None  # pods_read(): known once the evidence is read
    events_read: str | None = None  # "watch" or "list" (BatchEvidence.events_read)
    reward_deliveries: list[list] | None = None  # a rollout's Delivery records, saved
    # How many episodes' points the summary took from their drafts, made while the batch ran.
    episodes_summarised_while_waiting: int | None = None
    post_completion_seconds: float | None = None  # from seeing the end to the summary made

    def saved(self) -> dict[str, Any]:
        """client.json's fields: the ones not known yet (or not a rollout's) left out."""
        return {
            key: value
            for key, value in self._asdict().items()
            if value is not None or key not in CLIENT_WAIT_LATER
        }


# What client.json gains as the batch is read and summarised; the fields before are there from the end.
CLIENT_WAIT_LATER = (
    "pods_read",
    "events_read",
    "reward_deliveries",
    "episodes_summarised_while_waiting",
    "post_completion_seconds",
)


def client_wait(follower: BatchFollower, end: str | None) -> ClientWait:
    """How the client waited for one Job, as of the end seen (or given up on)."""
    submission = follower.submission
    assert submission is not None  # followed only once submitted
    return ClientWait(
        job=follower.job_name,
        end=end,
        submitted_at=submission.wall,
        observed_at=follower.end_seen_wall,
        client_job_complete_seconds=rounded(follower.end_seen_monotonic - submission.monotonic)
        if follower.end_seen_monotonic is not None
        else None,
        kubectl_processes_while_waiting=follower.cost.processes,
        watch_restarts=follower.cost.restarts,
        watch_queue_peak=follower.cost.queue_peak,
        wait_mode="poll" if follower.polling else "watch",
    )


def pods_read(reading: PodReading, not_older_than: str | None) -> dict[str, Any]:
    """client.json's `pods_read`: how the Job's pods were read after its end."""
    return {
        "source": reading.source,
        "not_older_than": not_older_than,
        "resource_version": reading.resource_version,
        "pages": reading.pages,
        "continue_expiries": reading.continue_expiries,
        "read_again": reading.reread,
    }


def salvage(run: RunContext) -> list[str]:
    """After an interruption: complete the receipt, stop the batch's pods (suspend_batch), and
    save what can be saved quickly. The names of the Jobs suspended."""
    batch = run.batch
    if batch is not None:
        batch.follower.stop_watches()
    complete_receipt(run)
    suspended = suspend_batch(run)
    if batch is not None:
        try:
            batch.collect(batch.follower.job_name, retry=False)
        except (DemoError, OSError):
            pass  # whatever could be saved is saved
    return suspended


def complete_receipt(run: RunContext) -> None:
    """The namespace's and the batch's Jobs' UIDs in the receipt, should the interruption have
    come between their creation and their record."""
    batch = run.batch
    if run.touched_cluster and run.receipt.shared:
        complete_shared_receipt(run.kubectl, run.receipt, run.plan.setup)
    elif run.touched_cluster and not run.receipt.namespace_uid:
        try:
            live = run.kubectl.get("namespace", run.namespace, missing_ok=True)
        except DemoError:
            live = None
        if live and run.receipt.owns_namespace(live):
            run.receipt.record_namespace(live["metadata"]["uid"])
    for name in [] if batch is None else batch.follower.jobs.names:
        if run.receipt.has_job(name):
            continue
        try:
            live = run.kubectl.get("job", name, run.namespace, missing_ok=True)
        except DemoError:
            live = None
        if live:
            run.receipt.record_job(name, live["metadata"]["uid"])
    # Saved again even when nothing was added: the interruption may have come while it was written.
    run.receipt.save()


def suspend_batch(run: RunContext) -> list[str]:
    """Stop the pods of the batch under way: each of its Jobs the receipt names, not seen ended,
    suspended. The Job controller deletes its running pods and starts no more; the Job, its ended
    pods and their logs stay (evidence in the cluster, and a Job that could be resumed). Deleting
    the Jobs instead would take those with them. The names of the Jobs suspended; one that could
    not be is named on stderr."""
    batch = run.batch
    if batch is None:
        return suspend_queued(run) if run.settings.queue else []
    if batch.follower.state.end is not None:
        return []
    jobs, suspended = batch.follower.jobs, []
    for name in jobs.names:
        if not run.receipt.has_job(name) or job_finished(jobs.seen.get(name) or {}):
            continue
        if suspend_run_job(run, name):
            suspended.append(name)
    return suspended


def suspend_queued(run: RunContext) -> list[str]:
    """Interrupted while Kueue held the batch (or had just let it go): each Job the receipt names
    and the cluster has not seen end, suspended and its Workload deactivated."""
    names = []
    for name in run.receipt.job_uids():
        try:
            live = run.kubectl.get("job", name, run.namespace, missing_ok=True)
        except DemoError:
            live = None
        if live is not None and not job_finished(live) and suspend_run_job(run, name):
            names.append(name)
    return names


def suspend_run_job(run: RunContext, name: str) -> bool:
    """One Job suspended (its Workload deactivated too, under a queue); whether it was."""
    try:
        run.kubectl.run(
            ["patch", "job", name, "-n", run.namespace, "--type=merge", "-p", SUSPEND_PATCH],
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except DemoError as error:
        print(f"Warning: could not suspend Job {name}: {error}", file=sys.stderr)
        return False
    if run.settings.queue:  # else Kueue resumes it, its Workload being admitted
        stop_queued(run.kubectl, run.namespace, name, run.receipt.job_uids().get(name))
    return True


def close(run: RunContext) -> None:
    """Stop what the run started: watches, the proxy, idle log readers."""
    if run.batch is not None:
        run.batch.follower.stop_watches()
        if run.batch.follower.rewards is not None:
            run.batch.follower.rewards.close()
    if run.proxy is not None:
        run.proxy.close()
    run.pool.shutdown(wait=False)
    if run.lease is not None:
        run.lease.release()


def load_worker(request: RunRequest) -> tuple[str, bool]:
    """The episode program to ship and whether it is the built-in one."""
    script = request.episode_script
    if script is None:
        return WORKER_SOURCE, True
    named = request.spelling.setting("episode_script", script)
    try:
        with open(script, encoding="utf-8") as handle:
            source = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise DemoError(
            f"cannot read {named}: {getattr(error, 'strerror', None) or error}"
        ) from None
    check_episode_syntax(script, source, named)
    return source, False


def run_command(request: RunRequest, caller: Caller) -> int:
    """`run`: submit the batch(es), wait, save every record, verify, report."""
    return perform_run(request, caller)[0]


def perform_run(request: RunRequest, caller: Caller) -> tuple[int, Results | None]:
    """`run`: its exit status (0, or EXIT_PARTIAL for an accepted partial batch) and its results."""
    if request.dry_run:
        print(json.dumps(dry_run_listing(request), indent=2))
        return 0, None
    worker_source, builtin = load_worker(request)
    run = start_run(request, caller, worker_source, builtin)
    run.tracer = open_tracer(request.otlp_endpoint, run.receipt.run_id)
    if request.cleanup and run.kubectl.api is not None:
        run.cleanup_ahead = concurrent.futures.Future()
    cleanup_hint = cleanup_command(run.output, request.kubectl)
    failure: DemoError | None = None
    with signals_interrupt():
        try:
            results = execute(run)
        except KeyboardInterrupt:
            interrupted(run, request.cleanup, cleanup_hint)
            return EXIT_INTERRUPTED, None
        except StreamClosed as closed:
            interrupted(run, request.cleanup, cleanup_hint, f"{closed}.")
            return EXIT_INTERRUPTED, None
        except RewardCallbackError as error:
            # The caller's own code stopped the run: stopped as by Ctrl-C, its exception raised as it was.
            interrupted(run, request.cleanup, cleanup_hint, f"{error}; the run stopped.")
            raise error.original from None
        except DemoError as error:
            failure = error
        finally:
            close(run)
    if failure is None and results is None:  # --detach: `attach` follows the run
        say_detached(run)
        detached_telemetry(run, request.pushgateway)
        return 0, None
    if run.tracer is not None:
        finish_trace(
            run.tracer,
            run.output,
            None if failure or results is None else results.figures,
            failure,
            request.quiet,
        )
    if failure is None and results is not None and not request.spelling.python:
        # a Python caller has them returned
        print_results(results.figures, request.quiet, os.path.join(run.output, RESULTS_FILE))
    if failure is None and request.pushgateway:
        push_saved_metrics(run.output, request.pushgateway, run.receipt.run_id)
    finish_run(run, failure, request.cleanup, request.quiet, cleanup_hint)
    status = EXIT_PARTIAL if results is not None and results.figures.get("accepted_partial") else 0
    if caller.exit_when_done:
        exit_at_once(status)  # while the run is still held: freeing it is what would take the time
    return status, results


def exit_at_once(status: int) -> NoReturn:
    """End the process now, its output flushed. By then every file is written, every kubectl it
    started has been stopped and waited for, and nothing it holds is needed: freeing that (every
    pod, event and summary of the run: a quarter of a second at 2,000 episodes) and joining idle
    log readers is all a normal exit would add."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can be said on it
    os._exit(status)


def dry_run_listing(request: RunRequest) -> dict:
    """`run --dry-run`: the objects a run would create, as one v1 List; nothing is touched."""
    worker_source, builtin = load_worker(request)
    run_id = secrets.token_hex(6)
    namespace = request.namespace or NAMESPACE_PREFIX + run_id
    settings = run_settings(request, worker_source, builtin, None, namespace, run_id)
    origin = run_origin(run_id, request.output, USER_UNKNOWN_BEFORE_RUN, settings.ttl_seconds)
    return list_manifest(
        planned_objects(namespace, run_id, settings, worker_source, request.tasks or (), origin)
    )


def run_settings(
    request: RunRequest,
    worker_source: str,
    builtin: bool,
    context: str | None,
    namespace: str,
    run_id: str = "",
) -> Settings:
    """The run's settings, made once from its request, program, context (none: --dry-run), namespace."""
    rollout, tasks = request.rollout, request.tasks or ()
    suffix = run_suffix(run_id) if request.namespace else ""
    batches = batch_names(request.rounds, request.warmup, suffix)
    image_map = parse_image_map(request.image_map)
    # Rewritten once, here: every later use of an image takes the rewritten reference.
    image = rewrite_image(request.image, image_map)
    groups = image_groups(tasks, request.count, request.group_size, image, image_map)
    return Settings(
        version=__version__,
        count=request.count,
        parallelism=request.parallelism,
        image=image,
        runtime=request.runtime,
        timeout=request.timeout or default_timeout(request.count, request.parallelism),
        rounds=request.rounds,
        warmup=request.warmup,
        harden=request.harden,
        builtin=builtin,
        episode_script=request.episode_script,
        chunk_size=request.chunk_size,
        episode_script_sha256=None
        if builtin
        else hashlib.sha256(worker_source.encode("utf-8")).hexdigest(),
        ttl_seconds=request.ttl,
        rollout=rollout,
        # The rollout options are recorded (and read) only for a rollout batch.
        tasks_file=request.tasks_file if rollout else None,
        group_size=request.group_size if rollout else 1,
        retries=request.retries if rollout else None,
        allow_failures=request.allow_failures if rollout else None,
        task_ids=tuple(task.task_id for task in tasks) if rollout and tasks else None,
        need=request.need,
        need_groups=request.need_groups,
        episode_timeout=request.episode_timeout,
        context=context,
        namespace=namespace,
        batches=batch_entries(batches, len(groups), suffix),
        image_map=image_map,
        pull_timeout=request.pull_timeout,
        prepull=request.prepull,
        task_images=tuple(task_images(tasks, image, image_map)) if rollout and tasks else None,
        shared_namespace=request.namespace is not None,
        queue=request.queue,
        pod=shared_secrets(
            resolve_egress(episode_pod(request), request.spelling),  # each HOST resolved once
            request.namespace,
        ),
    )


def shared_secrets(pod: EpisodePod, namespace: str | None) -> EpisodePod:
    """With --namespace, a bare --env-from-secret NAME is that namespace's Secret, as a user given
    the namespace means it (the context's namespace otherwise)."""
    if namespace is None:
        return pod
    return pod._replace(
        secrets=tuple(s if s.namespace else s._replace(namespace=namespace) for s in pod.secrets)
    )


def batch_entries(
    batches: Sequence[tuple[str, bool]], images: int, suffix: str
) -> tuple[BatchEntry, ...]:
    """run.json's batches: each Job's name, and its directory (named without the run's suffix)."""
    return tuple(
        BatchEntry(
            name,
            measured,
            name[: len(name) - len(suffix)] if len(batches) > 1 else ".",
            tuple(image_job_name(name, n) for n in range(1, images + 1)) if images > 1 else (),
        )
        for name, measured in batches
    )


def start_run(request: RunRequest, caller: Caller, worker_source: str, builtin: bool) -> RunContext:
    """Claim the output directory and name the context, run id and namespace; nothing in the cluster changes."""
    output, spelling = request.output, request.spelling
    if os.path.lexists(output):
        raise DemoError(
            f"output directory {output} already exists; records are never overwritten, "
            f"choose a new {spelling.name('output')}"
        )
    # A Python caller runs step after step in one process: its requests go through the
    # process's one proxy, started once (a kubectl process per request cost most of a step).
    kind = ProxiedKubectl if spelling.python else Kubectl
    kubectl = kind(find_kubectl(request.kubectl, spelling), verbose=request.verbose)
    kubectl.context = resolve_context(kubectl, request.context, spelling)
    try:
        os.makedirs(output)
    except OSError as error:
        raise DemoError(
            f"cannot create output directory {output}: {error.strerror or error}"
        ) from None
    run_id = secrets.token_hex(6)
    namespace = request.namespace or NAMESPACE_PREFIX + run_id
    settings = run_settings(request, worker_source, builtin, kubectl.context, namespace, run_id)
    run = RunContext(
        settings,
        plan_run(namespace, run_id, settings, worker_source, request.tasks or ()),
        Receipt.start(
            output,
            kubectl.context,
            namespace,
            run_id,
            kubeconfig_path(),
            shared=settings.shared_namespace,
        ),
        kubectl,
        output,
        Progress(request.quiet),
        concurrent.futures.ThreadPoolExecutor(LOG_READERS),
        cpu_seconds(),
        proxy=shared_proxy(kubectl) if spelling.python else None,
        silent=request.quiet and spelling.python,
        spelling=spelling,
        on_reward=caller.on_reward,
        stop=caller.stop,
        owns_process=not spelling.python,
        detach=request.detach,
    )
    return run


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM interrupts as Ctrl-C does, so a stopped run saves its evidence, and neither lands inside
    a fork (InterruptsAcrossForks; main thread only: no other thread may set a signal handler)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = (
        {
            signum: signal.signal(signum, INTERRUPTS.handle)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        if main_thread
        else {}
    )
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def interrupted(
    run: RunContext, clean_up: bool, cleanup_hint: str, why: str = "Interrupted."
) -> None:
    """After Ctrl-C or SIGTERM (or stream_batch closed, or an on_reward callback that raised): stop
    the batch's pods and salvage what is quick to save; then clean up if asked, else say how to."""
    run.progress.finish()
    suspended: list[str] = []
    try:
        suspended = salvage(run)
    except (KeyboardInterrupt, DemoError):
        pass
    not_cleaned = None
    if clean_up and run.touched_cluster:
        not_cleaned = cleanup_after_interrupt(run)
    print(
        interruption_message(run, why, suspended, clean_up, not_cleaned, cleanup_hint),
        file=sys.stderr,
    )


def cleanup_after_interrupt(run: RunContext) -> str | None:
    """`--cleanup` after an interruption: None once the namespace is gone, else why it is not."""
    report = io.StringIO() if run.silent else sys.stderr
    try:
        cleaned_up(run, report)
    except DemoError as error:
        return str(error)
    except KeyboardInterrupt:
        return "interrupted again"
    return None


def interruption_message(
    run: RunContext,
    why: str,
    suspended: Sequence[str],
    clean_up: bool,
    not_cleaned: str | None,
    cleanup_hint: str,
) -> str:
    """What an interrupted run says on stderr: why it stopped, what became of its pods, where its
    evidence is, and how to clean up (or that it did)."""
    lines = [f"{why} Evidence saved in {run.output}; receipt.json names namespace {run.namespace}."]
    if suspended:
        lines.append(
            f"Suspended Job {', '.join(suspended)}: its running pods were stopped and no more "
            "start; its ended pods and their logs stay."
        )
    elif run.receipt.fields.get("jobs") and (
        run.batch is None or run.batch.follower.state.end is None
    ):
        # Ctrl-C can read as "stop the batch": say so when the Job could not be stopped.
        lines.append(
            "The Job was not stopped: it runs on in the cluster, its namespace with it, until you "
            "clean up."
        )
    if clean_up and run.touched_cluster and not_cleaned is None:
        lines.append(f"Deleted test namespace: {run.namespace} ({run.spelling.switch('cleanup')}).")
    elif run.touched_cluster:
        if not_cleaned is not None:
            lines.append(f"{run.spelling.switch('cleanup')} failed: {not_cleaned}")
        if run.receipt.fields.get("jobs"):
            lines.append(f"Attach with: {attach_command(run.output, run.kubectl.binary)}")
        lines.append(f"Clean up with: {cleanup_hint}")
    return "\n".join(lines)


def print_results(results: dict, quiet: bool, path: str) -> None:
    """The results' summary (printed_results) on stdout, with `path`, the results.json that holds
    them all; the phase tables and throughput beside the progress on stderr."""
    print(json.dumps(printed_results(results, path), indent=2))
    if not quiet:
        print(phase_tables(results), file=sys.stderr)
        print(throughput_line(results["throughput"]), file=sys.stderr)
    warn_clocks(results)


def finish_run(
    run: RunContext, failure: DemoError | None, clean_up: bool, quiet: bool, cleanup_hint: str
) -> None:
    """`--cleanup` if asked, then one error naming why the run failed, its evidence and what to clean up."""
    if clean_up and run.touched_cluster:
        # stdout carries only the results; what cleanup says goes with the progress.
        report = io.StringIO() if run.silent else sys.stderr
        cleanup = run.spelling.switch("cleanup")
        print(f"Cleaning up ({cleanup}) after {'a failed' if failure else 'the'} run.", file=report)
        try:
            cleaned_up(run, report)
        except DemoError as error:
            # Never let a failed cleanup hide why the run failed or where its evidence is.
            why = (
                f"{failure}\n  evidence: {run.output}\n  {cleanup} failed too: " if failure else ""
            )
            raise DemoError(f"{why}{error}\n  clean up: {cleanup_hint}") from None
    if failure is not None:
        if not run.touched_cluster and release_output(run.output):
            raise DemoError(
                f"{failure}\n  {run.output} was removed again, so the same "
                f"{run.spelling.name('output')} can be reused"
            )
        if run.touched_cluster and not clean_up:
            raise DemoError(f"{failure}\n  evidence: {run.output}\n  clean up: {cleanup_hint}")
        raise DemoError(f"{failure}\n  evidence: {run.output}")
    if run.touched_cluster and not clean_up and not quiet:
        print(
            f"{stays(run)} for inspection; clean up with: {cleanup_hint}",
            file=sys.stderr,
        )


def stays(run: RunContext) -> str:
    """What a run leaves in the cluster for inspection: its namespace, or its objects in one it shares."""
    if run.receipt.shared:
        return f"The run's objects in namespace {run.namespace} stay"
    return f"The namespace {run.namespace} stays"


def release_output(output: str) -> bool:
    """Remove a run's directory that holds nothing but its receipt and settings: a run
    that created nothing in the cluster has nothing to trace, and its name stays free."""
    try:
        names = os.listdir(output)
        if RECEIPT_FILE not in names or not set(names) <= {RECEIPT_FILE, SETTINGS_FILE}:
            return False
        for name in names:
            os.remove(os.path.join(output, name))
        os.rmdir(output)
    except OSError:
        return False
    return True
