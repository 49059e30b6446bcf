"""A run inside a namespace it did not create (`--namespace`), and its Jobs handed to a Kueue queue
(`--queue`): the names and labels that keep two runs of one namespace apart, the queue's label,
and the fit of a batch in a ClusterQueue's quota. Pure: plain data in, plain data out.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .constants import RUN_ID_ANNOTATION, RUN_LABEL
from .parse import parse_time
from .manifests import (
    PlannedWork,
    RunOrigin,
    origin_annotations,
    parse_quantity,
    planned_annotations,
    planned_work,
)

# The label Kueue's Job integration reads: the LocalQueue, in the Job's namespace, it queues in.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The label Kueue puts on a Job's Workload: the Job's UID.
WORKLOAD_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"

# The objects a run makes in a namespace it shares, and where the API serves each: deleting one
# by UID precondition is a DELETE on that path with a body.
OBJECT_PATHS = {
    "configmap": "/api/v1/namespaces/{namespace}/configmaps/{name}",
    "secret": "/api/v1/namespaces/{namespace}/secrets/{name}",
    "networkpolicy": "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}",
    "job": "/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
}


def object_path(kind: str, namespace: str, name: str) -> str:
    """The API path of one object a run makes in a shared namespace."""
    return OBJECT_PATHS[kind.lower()].format(namespace=namespace, name=name)


def run_suffix(run_id: str) -> str:
    """What every name a run gives in a shared namespace ends with, so two runs never collide."""
    return f"-{run_id}"


def owned_metadata(manifest: dict, run_id: str, extra: Mapping[str, str] | None = None) -> None:
    """Label and annotate one object with the run id (and `extra` annotations), in place."""
    metadata = manifest.setdefault("metadata", {})
    metadata.setdefault("labels", {})[RUN_LABEL] = run_id
    metadata.setdefault("annotations", {}).update({RUN_ID_ANNOTATION: run_id, **(extra or {})})


def renamed_config_maps(setup: Sequence[dict], suffix: str) -> dict[str, str]:
    """Each ConfigMap's (and NetworkPolicy's) name -> its name in a shared namespace."""
    return {
        manifest["metadata"]["name"]: manifest["metadata"]["name"] + suffix
        for manifest in setup
        if not manifest["metadata"]["name"].endswith(suffix)
    }


def rename_volumes(pod_spec: dict, renamed: Mapping[str, str]) -> None:
    """A pod spec's ConfigMap references (and its containers' Secrets, the copies the run makes),
    renamed in place."""
    for container in pod_spec.get("containers") or []:
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                name = source["secretRef"]["name"]
                source["secretRef"]["name"] = renamed.get(name, name)
    for volume in pod_spec.get("volumes") or []:
        if "configMap" in volume:
            volume["configMap"]["name"] = renamed.get(
                volume["configMap"]["name"], volume["configMap"]["name"]
            )
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "configMap" in source:
                source["configMap"]["name"] = renamed.get(
                    source["configMap"]["name"], source["configMap"]["name"]
                )


def shared_setup(setup: Sequence[dict], run_id: str) -> list[dict]:
    """The run's ConfigMaps (and --harden's NetworkPolicy) for a shared namespace: renamed after
    the run, labelled with it; the NetworkPolicy denies only the run's own pods."""
    suffix, owned = run_suffix(run_id), []
    for manifest in setup:
        manifest = copy.deepcopy(manifest)
        if not manifest["metadata"]["name"].endswith(suffix):
            manifest["metadata"]["name"] += suffix
        owned_metadata(manifest, run_id)
        if manifest["kind"] == "NetworkPolicy":
            manifest["spec"]["podSelector"] = {"matchLabels": {RUN_LABEL: run_id}}
        owned.append(manifest)
    return owned


def shared_job(
    job: dict,
    run_id: str,
    renamed: Mapping[str, str],
    annotations: Mapping[str, str],
    queue: str | None = None,
) -> dict:
    """One Job for a shared namespace: the run's label and annotations on it and on its pods
    (its template's labels copied onto it, as the API server does only for a Job without labels),
    its ConfigMaps renamed; with a queue, Kueue's queue label."""
    job = copy.deepcopy(job)
    template = job["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("labels", {})[RUN_LABEL] = run_id
    labels = {**template["metadata"]["labels"], **(job["metadata"].get("labels") or {})}
    job["metadata"]["labels"] = labels
    owned_metadata(job, run_id, annotations)
    if queue:
        labels[QUEUE_LABEL] = queue
    rename_volumes(template["spec"], renamed)
    return job


def queued_job(job: dict, queue: str) -> dict:
    """One Job of a run in its own namespace handed to a queue: Kueue's label beside the template's."""
    job = copy.deepcopy(job)
    template_labels = (job["spec"]["template"].get("metadata") or {}).get("labels") or {}
    job["metadata"]["labels"] = {
        **template_labels,
        **(job["metadata"].get("labels") or {}),
        QUEUE_LABEL: queue,
    }
    return job


def shared_jobs(
    jobs: Mapping[str, Sequence[dict]],
    setup: Sequence[dict],
    run_id: str,
    origin: RunOrigin | None,
    planned: PlannedWork | None,
    queue: str | None = None,
) -> dict[str, list[dict]]:
    """Every batch's Jobs for a shared namespace: what the namespace's annotations say of a run in
    its own namespace (origin, planned work) is on each Job, where `list` reads it."""
    annotations = {
        **(origin_annotations(origin) if origin is not None else {}),
        **(planned_annotations(planned) if planned is not None else {}),
    }
    renamed = renamed_config_maps(setup, run_suffix(run_id))
    return {
        batch: [shared_job(job, run_id, renamed, annotations, queue) for job in batch_jobs]
        for batch, batch_jobs in jobs.items()
    }


def stamped_jobs(jobs: Mapping[str, Sequence[dict]], origin: RunOrigin) -> dict[str, list[dict]]:
    """A shared namespace's Jobs with the run's origin (who, where, until when) and planned work
    annotated on each, as a run's own namespace carries them."""
    annotations = {**origin_annotations(origin), **planned_annotations(planned_work(jobs))}
    stamped = {}
    for batch, batch_jobs in jobs.items():
        stamped[batch] = [copy.deepcopy(job) for job in batch_jobs]
        for job in stamped[batch]:
            job["metadata"].setdefault("annotations", {}).update(annotations)
    return stamped


# A ClusterQueue's quota, and a batch held against it.


class QuotaFit(NamedTuple):
    """How a batch's requests meet its queue's quota: the pods of its widest Job the quota admits
    at once (None: no quota limits them), and why a Job never fits, if one never does."""

    fits_at_once: int | None
    never: str | None  # a Job whose pods at once are beyond the quota, with figures
    quota: dict[str, float]  # resource -> the most one flavor offers (nominal + borrowing limit)


def cluster_queue_quota(cluster_queue: dict) -> dict[str, float]:
    """Each resource's quota in a ClusterQueue as one Job can have it: Kueue gives a Job's pods
    (its PodSet) one flavor per resource, so the most any one flavor offers; in a cohort, its
    nominal quota plus its borrowing limit (none: unbounded, as much as the cohort lends)."""
    spec = cluster_queue.get("spec") or {}
    in_cohort = bool(spec.get("cohortName") or spec.get("cohort"))
    quota: dict[str, float] = {}
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                nominal = parse_quantity(resource.get("nominalQuota"))
                if nominal is None:
                    continue
                borrowing = parse_quantity(resource.get("borrowingLimit"))
                if in_cohort:
                    nominal = float("inf") if borrowing is None else nominal + borrowing
                quota[resource["name"]] = max(quota.get(resource["name"], 0.0), nominal)
    return quota


def pod_requests(job: dict, overhead: Mapping[str, float] | None = None) -> dict[str, float]:
    """One pod's requests as Kueue counts them: every container summed, plus its RuntimeClass's
    overhead (podFixed), which Kueue adds to each pod of the Workload."""
    requests: dict[str, float] = dict(overhead or {})
    for container in job["spec"]["template"]["spec"].get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            amount = parse_quantity(value)
            if amount is not None:
                requests[name] = requests.get(name, 0.0) + amount
    return requests


def runtime_overhead(runtime_class: dict | None) -> dict[str, float]:
    """A RuntimeClass's overhead per pod (overhead.podFixed), as numbers."""
    fixed = ((runtime_class or {}).get("overhead") or {}).get("podFixed") or {}
    amounts = {name: parse_quantity(value) for name, value in fixed.items()}
    return {name: amount for name, amount in amounts.items() if amount is not None}


def quota_fit(
    quota: Mapping[str, float], jobs: Iterable[dict], overhead: Mapping[str, float] | None = None
) -> QuotaFit:
    """The pods of the widest Job that fit at once, and whether a Job never can be admitted. Kueue
    admits a Job whole, its parallelism's pods at once, and never one that asks for a resource
    its ClusterQueue does not cover ("resource X unavailable in ClusterQueue")."""
    fits: int | None = None
    never = None
    for job in jobs:
        name, parallelism = job["metadata"]["name"], int(job["spec"].get("parallelism") or 1)
        for resource, amount in pod_requests(job, overhead).items():
            if amount <= 0:
                continue
            if resource not in quota:
                never = never or (
                    f"Job {name} asks for {resource}, which the ClusterQueue has no quota of"
                )
                continue
            if quota[resource] == float("inf"):
                continue
            at_once = int(quota[resource] / amount + 1e-9)  # 1 / 0.1 is 9.999...
            fits = at_once if fits is None else min(fits, at_once)
            if at_once < parallelism and never is None:
                never = (
                    f"Job {name} runs {parallelism} pods at once, "
                    f"{format_amount(resource, amount * parallelism)} of {resource} "
                    f"({format_amount(resource, amount)} each), and the "
                    f"quota is {format_amount(resource, quota[resource])} "
                    f"({at_once} pods' worth)"
                )
    return QuotaFit(fits, never, dict(quota))


def format_amount(resource: str, amount: float) -> str:
    """A resource amount as people write it: CPU in millicores, memory in Mi, counts bare."""
    if resource == "cpu":
        return f"{amount * 1000:.0f}m"
    if resource == "memory" or resource.endswith("storage"):
        return f"{amount / 2**20:.0f}Mi"
    return f"{amount:g}"


def uids_of(objects: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """name -> UID of listed objects."""
    return {
        (item.get("metadata") or {}).get("name", ""): (item.get("metadata") or {}).get("uid", "")
        for item in objects
    }


def workload_condition(workload: dict | None, kind: str) -> dict | None:
    for found in ((workload or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return found
    return None


def wait_line(workload: dict | None) -> str:
    """What Kueue says of a Job it holds, in one line, from its Workload's conditions: the Pending
    message, Inadmissible, an eviction and its requeue, or quota reserved awaiting admission checks."""
    if workload is None:
        return "suspended, no Workload yet (Kueue has not taken the Job in)"
    evicted = workload_condition(workload, "Evicted")
    requeued = workload_condition(workload, "Requeued")
    reserved = workload_condition(workload, "QuotaReserved")
    admitted = workload_condition(workload, "Admitted")
    if admitted and admitted.get("status") == "True":
        return "admitted by Kueue, resuming"
    if evicted and evicted.get("status") == "True":
        again = (
            f"; requeued: {requeued.get('message')}"
            if requeued and requeued.get("status") == "True"
            else "; waiting to be requeued"
        )
        return f"evicted by Kueue ({evicted.get('reason')}: {evicted.get('message')}){again}"
    if reserved and reserved.get("status") == "True":
        checks = [
            f"{check.get('name')} {check.get('state')}"
            for check in (workload.get("status") or {}).get("admissionChecks") or []
        ]
        return "quota reserved, awaiting admission checks" + (
            f" ({', '.join(checks)})" if checks else ""
        )
    if reserved and reserved.get("reason") == "Inadmissible":
        return f"Inadmissible, Kueue will not admit it as things are: {reserved.get('message')}"
    if reserved:
        return f"queued: {reserved.get('message') or reserved.get('reason')}"
    return "queued, not yet considered by Kueue"


# Admission as a phase: when a queued Job was created, had its quota reserved, was admitted and
# resumed. The API server writes each condition's lastTransitionTime (and a creationTimestamp) in
# whole seconds, so each point is known to 1 s, and a phase between two of them to 1 s too.
ADMISSION_PRECISION_SECONDS = 1.0
ADMISSION_SOURCES = {
    "queued": "Job metadata.creationTimestamp",
    "quota_reserved": "Workload condition QuotaReserved lastTransitionTime",
    "admitted": "Workload condition Admitted lastTransitionTime",
    "resumed": "Job condition Suspended=False (JobResumed) lastTransitionTime",
}


def true_since(obj: dict | None, kind: str, status: str = "True") -> float | None:
    """When a condition of `kind` turned `status`, if it has that status now."""
    found = workload_condition(obj, kind)
    if not found or found.get("status") != status:
        return None
    return parse_time(found.get("lastTransitionTime"))


def job_admission(job: dict, workload: dict | None) -> dict[str, Any]:
    """One queued Job's points (epoch seconds, None where unknown) and its Workload's name."""
    metadata = job.get("metadata") or {}
    evicted = workload_condition(workload, "Evicted")
    return {
        "job": metadata.get("name"),
        "workload": ((workload or {}).get("metadata") or {}).get("name"),
        "queued_at": parse_time(metadata.get("creationTimestamp")),
        "quota_reserved_at": true_since(workload, "QuotaReserved"),
        "admitted_at": true_since(workload, "Admitted"),
        "resumed_at": true_since(job, "Suspended", "False"),
        "evicted": None
        if evicted is None
        else f"{evicted.get('reason')}: {evicted.get('message')}",
    }


def admission_figures(jobs: Sequence[dict], workloads: Sequence[dict]) -> dict[str, Any]:
    """A batch's admission (results.json `admission`): its first Job's creation (queued), and the
    last of its Jobs' quota reservations, admissions and resumes, since the batch runs whole only
    then; the phases queue_wait (queued to quota reserved) and admission_checks (reserved to
    admitted), each with its precision and the sources of its points."""
    by_uid = {
        ((w.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_JOB_UID_LABEL): w
        for w in workloads
    }
    per_job = [job_admission(job, by_uid.get(job["metadata"].get("uid"))) for job in jobs]

    def point(key: str, pick: Any) -> float | None:
        known = [row[key] for row in per_job]
        return None if not known or None in known else pick(known)

    points = {
        "queued_at": point("queued_at", min),
        "quota_reserved_at": point("quota_reserved_at", max),
        "admitted_at": point("admitted_at", max),
        "resumed_at": point("resumed_at", max),
    }

    def between(start: str, end: str) -> float | None:
        if points[start] is None or points[end] is None:
            return None
        return round(max(0.0, points[end] - points[start]), 3)  # type: ignore[operator]

    return {
        **points,
        "queue_wait_seconds": between("queued_at", "quota_reserved_at"),
        "admission_checks_seconds": between("quota_reserved_at", "admitted_at"),
        "resume_seconds": between("admitted_at", "resumed_at"),
        "precision_seconds": ADMISSION_PRECISION_SECONDS,
        "sources": dict(ADMISSION_SOURCES),
        "jobs": per_job,
    }
