"""A run in a namespace it shares (`--namespace`), and its Jobs queued through Kueue (`--queue`),
as the cluster has them: each object deleted by UID precondition, the LocalQueue and its
ClusterQueue's quota read before anything is made.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, NamedTuple, Sequence, TextIO

from .constants import (
    CALL_TIMEOUT_SECONDS,
    FIRST_CONTACT_RETRY_SECONDS,
    POLL_INTERVAL_SECONDS,
    RUN_LABEL,
)
from .model import DemoError
from .files import Receipt, write_json
from .manifests import list_manifest
from .kube import Kubectl, KubectlError
from .follow import RunContext
from .preflight import save_run_json
from .tenancy import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    WORKLOAD_JOB_UID_LABEL,
    cluster_queue_quota,
    object_path,
    admission_figures,
    quota_fit,
    runtime_overhead,
    true_since,
    wait_line,
)

# How often a queued batch's Jobs are read while Kueue has not admitted them: the admission's
# own moment comes from the Workload's conditions, not from this poll.
QUEUE_POLL_SECONDS = 1.0
# How long the Job controller may take to record a Job's resume once Kueue has unsuspended it.
RESUME_WAIT_SECONDS = 10.0
WORKLOADS_FILE = "workloads.json"


def delete_by_uid(
    kubectl: Kubectl, kind: str, namespace: str, name: str, uid: str, foreground: bool = False
) -> str:
    """Ask for one object's deletion only if it still has `uid` (the API server checks the
    precondition): "deleted", "replaced" (another object has the name now) or "gone"."""
    options = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": uid},
        "propagationPolicy": "Foreground" if foreground else "Background",
    }
    try:
        # `delete --raw -f -` sends stdin as the DELETE's body, so the precondition travels with it.
        kubectl.run(
            ["delete", "--raw", object_path(kind, namespace, name), "-f", "-"],
            input_text=json.dumps(options),
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except KubectlError as error:
        if "(Conflict)" in error.stderr:
            return "replaced"
        if error.not_found:
            return "gone"
        raise DemoError(f"cannot delete {kind} {name} in {namespace}: {error}") from None
    return "deleted"


def cleanup_shared(
    kubectl: Kubectl, receipt: Receipt, wait_seconds: float, report: TextIO | None = None
) -> None:
    """Delete exactly the objects the receipt names in the namespace the run shares, each by its
    UID; never the namespace, nothing else in it. Jobs go in the foreground (their pods and
    Workloads with them) and are waited for."""
    report = report or sys.stdout
    namespace, deleted, left = receipt.namespace, [], []
    jobs: list[str] = []
    record_labelled_jobs(kubectl, receipt)
    for item in receipt.objects():
        if not item.get("uid"):
            left.append(f"{item['kind']} {item['name']} (no UID recorded: not touched)")
            continue
        is_job = item["kind"] == "Job"
        outcome = delete_by_uid(
            kubectl, item["kind"], namespace, item["name"], item["uid"], foreground=is_job
        )
        if outcome == "deleted":
            deleted.append(f"{item['kind']} {item['name']}")
            if is_job:
                jobs.append(item["name"])
        elif outcome == "replaced":
            left.append(f"{item['kind']} {item['name']} (another object has the name now)")
    wait_jobs_gone(kubectl, receipt, jobs, wait_seconds)
    print(
        f"Deleted {len(deleted)} objects of run {receipt.run_id} in namespace {namespace} "
        f"(the namespace stays)" + (f"; left {', '.join(left)}" if left else ""),
        file=report,
        flush=True,
    )


def record_labelled_jobs(kubectl: Kubectl, receipt: Receipt) -> None:
    """The Jobs with the run's label that its receipt lacks (a SIGKILL came between a Job's
    creation and its record), recorded with the UIDs they have: the label is the run's own id, so
    they are the run's."""
    try:
        listed = kubectl.get_list(
            "jobs",
            receipt.namespace,
            "-l",
            f"{RUN_LABEL}={receipt.run_id}",
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except DemoError:
        return  # the receipt's own record is what is deleted
    for job in (listed or {}).get("items") or []:
        metadata = job["metadata"]
        mine = (metadata.get("labels") or {}).get(RUN_LABEL) == receipt.run_id  # checked here too
        if mine and not receipt.has_job(metadata["name"]):
            receipt.record_job(metadata["name"], metadata["uid"])


def wait_jobs_gone(
    kubectl: Kubectl, receipt: Receipt, names: Sequence[str], wait_seconds: float
) -> None:
    """Wait until the deleted Jobs are gone (their pods first: foreground deletion)."""
    deadline = time.monotonic() + wait_seconds
    for name in names:
        while True:
            live = kubectl.get(
                "job", name, receipt.namespace, missing_ok=True, retry_until=deadline
            )
            if live is None:
                break
            if time.monotonic() >= deadline:
                raise DemoError(
                    f"Job {name} in {receipt.namespace} still exists after {wait_seconds:g} s; "
                    f"inspect it with: kubectl --context {receipt.context} get job {name} "
                    f"-n {receipt.namespace} -o yaml"
                )
            time.sleep(POLL_INTERVAL_SECONDS)


def complete_shared_receipt(kubectl: Kubectl, receipt: Receipt, setup: Sequence[dict]) -> None:
    """The UIDs of the run's setup objects an interruption came between making and recording:
    each looked up by its name, which only this run gives, and taken only with the run's label."""
    recorded = {(item["kind"], item["name"]) for item in receipt.objects()}
    for manifest in setup:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if (kind, name) in recorded:
            continue
        try:
            live = kubectl.get(kind.lower(), name, receipt.namespace, missing_ok=True)
        except DemoError:
            continue
        labels = ((live or {}).get("metadata") or {}).get("labels") or {}
        if live and labels.get(RUN_LABEL) == receipt.run_id:
            receipt.record_object(kind, name, live["metadata"]["uid"])


def check_shared_namespace(run: RunContext) -> None:
    """--namespace: the namespace exists and the run may make its objects there, proven by a
    server-side dry run of its first object (nothing is made; no namespace verb is needed)."""
    if not run.settings.shared_namespace:
        return
    first = run.plan.setup[0]
    try:
        run.kubectl.run(
            ["create", "--dry-run=server", "-f", "-", "-o", "name"],
            input_text=json.dumps(first),
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        flag = run.spelling.option("namespace", "NAME")
        if error.not_found:
            raise DemoError(
                f"namespace {run.namespace!r} does not exist in context {run.kubectl.context!r}; "
                f"{flag} runs in a namespace that exists (ask its owner, or leave {flag} out to "
                f"have the run make its own); nothing was created"
            ) from None
        raise DemoError(
            f"cannot make the run's {first['kind']} in namespace {run.namespace}: {error}; "
            f"nothing was created"
        ) from None


def delete_shared_run(
    kubectl: Kubectl, namespace: str, run_id: str, job_uids: Sequence[tuple[str, str]]
) -> str:
    """`cleanup --stale` of a run in a namespace it shares, without its receipt: its Jobs, each by
    the UID it was listed with, then its ConfigMaps, Secrets and NetworkPolicies found by its run
    label, each by UID. "deleted", or "gone" when none was left."""
    outcomes = [delete_by_uid(kubectl, "job", namespace, name, uid) for name, uid in job_uids]
    for kind in ("configmap", "secret", "networkpolicy"):
        try:
            listing = kubectl.get_list(
                kind,
                namespace,
                "-l",
                f"{RUN_LABEL}={run_id}",
                retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
            )
        except KubectlError:
            continue  # not permitted to list them: the Jobs, which hold the work, are gone
        for item in (listing or {}).get("items") or []:
            metadata = item.get("metadata") or {}
            outcomes.append(
                delete_by_uid(kubectl, kind, namespace, metadata["name"], metadata["uid"])
            )
    return "deleted" if "deleted" in outcomes else "gone"


def local_queue_hint(namespace: str, queue: str) -> str:
    """How to make the LocalQueue that was not found, for the message that says so."""
    return (
        f"make one (its admin names the ClusterQueue): kubectl apply -f - <<<'"
        f'{{"apiVersion": "{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue", '
        f'"metadata": {{"name": "{queue}", "namespace": "{namespace}"}}, '
        f'"spec": {{"clusterQueue": "CLUSTER_QUEUE"}}}}'
        "'"
    )


def read_kueue(run: RunContext, kind: str, name: str, namespace: str | None) -> dict | None:
    """One Kueue object; None when the account may not read it (the caller says which figure it
    lacks). DemoError when it does not exist or the cluster does not serve Kueue's API."""
    try:
        return run.kubectl.get(
            f"{kind}.{KUEUE_VERSION}.{KUEUE_GROUP}",
            name,
            namespace,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        if "(Forbidden)" in error.stderr:
            return None
        if "the server doesn't have a resource type" in error.stderr:
            raise DemoError(
                f"context {run.kubectl.context!r} does not serve Kueue's {kind} "
                f"({KUEUE_GROUP}/{KUEUE_VERSION}): is Kueue installed? nothing was created"
            ) from None
        if error.not_found:
            where = f" in namespace {namespace}" if namespace else ""
            hint = local_queue_hint(namespace or "", name) if kind == "localqueues" else ""
            raise DemoError(
                f"{kind[:-1]} {name!r} not found{where} (context {run.kubectl.context!r}); "
                f"nothing was created" + (f"; {hint}" if hint else "")
            ) from None
        raise DemoError(f"cannot read {kind[:-1]} {name}: {error}; nothing was created") from None


def read_overhead(run: RunContext, plan: dict) -> dict[str, float]:
    """The RuntimeClass's overhead per pod, which Kueue counts against the quota; when it cannot be
    read, the plan says so (the figures then count the requests alone)."""
    try:
        runtime_class = run.kubectl.get(
            "runtimeclass",
            run.settings.runtime,
            missing_ok=True,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        plan["overhead_unknown"] = (
            f"RuntimeClass {run.settings.runtime} cannot be read ({error}): the quota check counts "
            f"the pods' requests without its overhead, which Kueue adds"
        )
        print(f"Warning: {plan['overhead_unknown']}", file=sys.stderr, flush=True)
        return {}
    overhead = runtime_overhead(runtime_class)
    plan["overhead_per_pod"] = overhead
    return overhead


def check_queue(run: RunContext, width: str = "parallelism") -> None:
    """--queue, in place of the nodes' capacity check: the LocalQueue exists, and every Job of the
    batch fits its ClusterQueue's quota; a Job that never can is refused, with the figures, before
    anything is made (`width`: the setting that says how many pods run at once, a pool's `size`).
    run.json keeps what was found (`capacity`, with `queue`)."""
    queue, namespace = run.settings.queue or "", run.namespace
    plan: dict = {"checked": False, "queue": queue}
    local = read_kueue(run, "localqueues", queue, namespace)
    cluster_queue = ((local or {}).get("spec") or {}).get("clusterQueue")
    plan["cluster_queue"] = cluster_queue
    found = read_kueue(run, "clusterqueues", cluster_queue, None) if cluster_queue else None
    if found is None:
        plan["reason"] = (
            f"reading LocalQueue {queue} is not permitted"
            if local is None
            else f"reading ClusterQueue {cluster_queue} is not permitted"
        )
        print(f"Warning: queue quota check skipped ({plan['reason']})", file=sys.stderr, flush=True)
    else:
        jobs = [job for batch in run.plan.jobs.values() for job in batch]
        overhead = read_overhead(run, plan)
        fit = quota_fit(cluster_queue_quota(found), jobs, overhead)
        plan.update(
            checked=True,
            quota={name: amount for name, amount in fit.quota.items() if amount != float("inf")},
            fits_at_once=fit.fits_at_once,
        )
        if fit.never:
            raise DemoError(
                f"the batch can never be admitted by queue {queue} (ClusterQueue {cluster_queue}): "
                f"{fit.never}; lower {run.spelling.name(width)} or ask for more quota; "
                f"nothing was created"
            )
    run.capacity = plan
    save_run_json(run)


def job_workload(kubectl: Kubectl, namespace: str, job_uid: str) -> dict | None:
    """The Workload Kueue made for a Job, found by its label `kueue.x-k8s.io/job-uid`; None when
    there is none yet. KubectlError when it cannot be read."""
    listing = kubectl.get_list(
        f"workloads.{KUEUE_VERSION}.{KUEUE_GROUP}",
        namespace,
        "-l",
        f"{WORKLOAD_JOB_UID_LABEL}={job_uid}",
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    items = (listing or {}).get("items") or []
    return items[0] if items else None


def set_workload_active(kubectl: Kubectl, namespace: str, job_uid: str, active: bool) -> str | None:
    """Stop (False) or let go (True) a queued Job the way Kueue wants it, through its Workload's
    `spec.active`: Kueue resumes a suspended Job whose Workload is admitted, so under a queue the
    Job's own `suspend` does not hold. Why it could not be done, or None."""
    try:
        workload = job_workload(kubectl, namespace, job_uid)
        if workload is None:
            return "Kueue has made no Workload for it yet"
        kubectl.run(
            ["patch", f"workloads.{KUEUE_VERSION}.{KUEUE_GROUP}", workload["metadata"]["name"]]
            + ["-n", namespace, "--type=merge", "-p", json.dumps({"spec": {"active": active}})],
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except DemoError as error:
        return f"{error}; grant patch on workloads.{KUEUE_GROUP}"
    return None


def stop_queued(kubectl: Kubectl, namespace: str, name: str, job_uid: str | None) -> None:
    """A queued Job just suspended, kept so: its Workload deactivated (else Kueue resumes it and
    its pods start again); a warning when that cannot be done."""
    said = (
        "its UID is not known"
        if not job_uid
        else set_workload_active(kubectl, namespace, job_uid, False)
    )
    if said:
        print(
            f"Warning: cannot deactivate the Kueue Workload of Job {name} ({said}): Kueue may "
            f"resume the Job and start its pods again; `cleanup` deletes it",
            file=sys.stderr,
            flush=True,
        )


def queue_word(kubectl: Kubectl, namespace: str, job: dict) -> str:
    """What Kueue says of a suspended Job now, from its Workload (wait_line)."""
    try:
        workload = job_workload(kubectl, namespace, job["metadata"]["uid"])
    except KubectlError as error:
        if "(Forbidden)" in error.stderr:
            return (
                "queued (its Workload may not be read: grant get/list on workloads.kueue.x-k8s.io)"
            )
        return f"queued (its Workload cannot be read: {error})"
    return wait_line(workload)


class Admitted(NamedTuple):
    """A queued batch once admitted: its first Job as created, and the client's wall clock just
    before and just after its create calls (the Job's creation lies between them)."""

    job: dict
    submitted: float
    created: float


def admit_batch(
    run: RunContext, create: Callable[[], dict], names: Sequence[str], batch: str
) -> Admitted:
    """--queue: the batch's Jobs made (suspended by Kueue until admitted), then waited for until
    Kueue has admitted every one (resumed it), saying on stderr what Kueue says while they wait:
    the Workload's Pending message, Inadmissible, an eviction or a requeue, never an episode's
    failure. The run's own deadline, as the Job's activeDeadlineSeconds does (the Job controller
    restarts a Job's startTime when it resumes), counts from the admission. The batch's
    admission (points, phases) goes in run.admission, its Workloads in workloads.json."""
    submitted = time.time()
    first = create()
    created = time.time()
    wait_admitted(run, names)
    record_admission(run, names, batch)
    return Admitted(first, submitted, created)


def wait_admitted(run: RunContext, names: Sequence[str]) -> None:
    """Until Kueue has admitted (resumed) every one of the Jobs, saying what it says meanwhile."""
    said = ""
    while True:
        if run.stop is not None:
            run.stop.check()
        jobs = read_jobs(run, names)
        waiting = [job for job in jobs if (job.get("spec") or {}).get("suspend")]
        if not waiting:
            break
        line = f"Job {waiting[0]['metadata']['name']}: {queue_word(run.kubectl, run.namespace, waiting[0])}"
        if line != said and not run.silent:
            print(line, file=sys.stderr, flush=True)
        said = line
        time.sleep(QUEUE_POLL_SECONDS)


def read_jobs(run: RunContext, names: Sequence[str]) -> list[dict]:
    """The batch's Jobs as they are now; DemoError when one is gone (deleted under the run)."""
    jobs = []
    for name in names:
        job = run.kubectl.get(
            "job",
            name,
            run.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
        if job is None:
            raise DemoError(f"Job {name} in {run.namespace} was deleted while it was queued")
        jobs.append(job)
    return jobs


def record_admission(run: RunContext, names: Sequence[str], batch: str) -> None:
    """Once the batch is admitted: its Workloads saved (workloads.json), and its points and phases
    in run.admission; the Jobs read again until the Job controller has recorded each resume
    (a few seconds at most), so that `resumed` is known."""
    deadline = time.monotonic() + RESUME_WAIT_SECONDS
    while True:
        jobs = read_jobs(run, names)
        resumed = all(true_since(job, "Suspended", "False") for job in jobs)
        if resumed or time.monotonic() >= deadline:
            break
        time.sleep(QUEUE_POLL_SECONDS / 4)
    workloads, unread = [], None
    for job in jobs:
        try:
            found = job_workload(run.kubectl, run.namespace, job["metadata"]["uid"])
        except KubectlError as error:
            unread = str(error)
            break
        if found is not None:
            workloads.append(found)
    batch_dir = os.path.normpath(os.path.join(run.output, batch))
    write_json(os.path.join(batch_dir, WORKLOADS_FILE), list_manifest(workloads))
    figures = admission_figures(jobs, workloads)
    if unread is not None:
        figures["unavailable"] = (
            f"the Workloads could not be read ({unread}): quota_reserved, admitted, queue_wait "
            f"and admission_checks are not known; grant get/list on workloads.kueue.x-k8s.io"
        )
        print(f"Warning: {figures['unavailable']}", file=sys.stderr, flush=True)
    run.admission[batch] = figures
