"""A run in a namespace it shares (`--namespace`), and its Jobs queued through Kueue (`--queue`),
as the cluster has them: each object deleted by UID precondition, the LocalQueue and its
ClusterQueue's quota read before anything is made.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Sequence, TextIO

from .constants import (
    CALL_TIMEOUT_SECONDS,
    FIRST_CONTACT_RETRY_SECONDS,
    POLL_INTERVAL_SECONDS,
    RUN_LABEL,
)
from .model import DemoError
from .files import Receipt
from .kube import Kubectl, KubectlError
from .follow import RunContext
from .tenancy import object_path


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
