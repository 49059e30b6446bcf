"""The `cleanup` action, and `list` and `cleanup --stale`: the tool's runs in a cluster, found
without their receipts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence, TextIO

from .constants import (
    APP_LABEL,
    CALL_TIMEOUT_SECONDS,
    DELETE_WAIT_SECONDS,
    FIRST_CONTACT_RETRY_SECONDS,
    JOB_NAME,
    POLL_INTERVAL_SECONDS,
    RUN_LABEL,
)
from .model import DemoError
from .files import Receipt, kubeconfig_path
from .runs import ClusterRun, cluster_runs, run_record, runs_table, stale_verdict
from .kube import Kubectl, KubectlError
from .preflight import current_user, find_kubectl, require_kubectl, resolve_context
from .kueue import cleanup_shared, delete_shared_run


def wait_gone(
    kubectl: Kubectl, kind: str, name: str, namespace: str | None, seconds: float
) -> dict | None:
    """Poll until the object is gone; return its last state if it is still there at the deadline."""
    deadline = time.monotonic() + seconds
    # Through the proxy a look costs a local request, not a kubectl process: look again soon
    # (a Job's foreground deletion takes a tenth of a second or so), then less often.
    pause = POLL_INTERVAL_SECONDS if kubectl.api is None else 0.02
    while True:
        live = kubectl.get(kind, name, namespace, missing_ok=True, retry_until=deadline)
        if live is None:
            return None
        if time.monotonic() >= deadline:
            return live
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_INTERVAL_SECONDS)


def cleanup_namespace(
    kubectl: Kubectl,
    receipt: Receipt,
    wait_seconds: float = DELETE_WAIT_SECONDS,
    report: TextIO | None = None,
) -> None:
    """Delete the run's Jobs and namespace, only after proving both are the run's own (a run in a
    namespace it shares: the objects it made there, each by UID, never the namespace)."""
    report = report or sys.stdout
    if receipt.shared:
        cleanup_shared(kubectl, receipt, wait_seconds, report)
        return
    namespace = receipt.namespace
    live = live_namespace(kubectl, receipt)
    if live is None:
        say_namespace_absent(receipt, report)
        return
    check_namespace_owned(receipt, live)
    delete_proven_jobs(kubectl, receipt, wait_seconds)
    kubectl.delete(
        "namespace",
        namespace,
        None,
        "--wait=false",
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    stuck = wait_gone(kubectl, "namespace", namespace, None, wait_seconds)
    if stuck is not None:
        raise namespace_stuck(namespace, stuck, receipt.context, wait_seconds)
    print(f"Deleted test namespace: {namespace}", file=report, flush=True)


def live_namespace(kubectl: Kubectl, receipt: Receipt) -> dict | None:
    """The receipt's namespace as the cluster has it now, None when absent; DemoError when the
    cluster cannot be reached (nothing deleted)."""
    try:
        return kubectl.get(
            "namespace",
            receipt.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        raise DemoError(
            f"cannot reach the cluster of context {receipt.context!r} to look up "
            f"namespace {receipt.namespace}: {error}; nothing was deleted"
        ) from None


def say_namespace_absent(receipt: Receipt, report: TextIO) -> None:
    """The namespace was already gone: the guide's words on `report`, which one beside them."""
    print(
        "Namespace already absent", file=report, flush=True
    )  # the guide's words, as it prints them
    # Which one, beside the results' stream: run twice, cleanup names what it found gone.
    print(
        f"({receipt.namespace} in context {receipt.context}: nothing to delete)",
        file=sys.stderr if report is sys.stdout else report,
        flush=True,
    )


def check_namespace_owned(receipt: Receipt, live: dict) -> None:
    """DemoError (nothing deleted) unless the live namespace is the one the receipt recorded."""
    # Only a UID the run recorded proves the namespace its own: the label alone could be copied.
    if not receipt.namespace_uid or not receipt.owns_namespace(live):
        label = (live["metadata"].get("labels") or {}).get(RUN_LABEL)
        raise DemoError(
            f"refusing to delete namespace {receipt.namespace}: its UID {live['metadata'].get('uid')} / label "
            f"{RUN_LABEL}={label} do not match the receipt ({receipt.namespace_uid} / {receipt.run_id}); "
            f"nothing was deleted"
        )


def delete_proven_jobs(kubectl: Kubectl, receipt: Receipt, wait_seconds: float) -> None:
    """Delete the run's Jobs, each proven by the receipt's UID, and wait until each is gone."""
    namespace = receipt.namespace
    retry_until = time.monotonic() + CALL_TIMEOUT_SECONDS
    jobs = proven_jobs(kubectl, receipt, retry_until)
    for name in jobs:
        kubectl.delete(
            "job", name, namespace, "--cascade=foreground", "--wait=false", retry_until=retry_until
        )
    for name in jobs:
        if wait_gone(kubectl, "job", name, namespace, wait_seconds) is not None:
            raise DemoError(
                f"Job {name} in {namespace} still exists after {wait_seconds:g} s; "
                f"inspect it with: kubectl --context {receipt.context} get job {name} "
                f"-n {namespace} -o yaml"
            )


def proven_jobs(kubectl: Kubectl, receipt: Receipt, retry_until: float) -> list[str]:
    """The run's Jobs that still exist, each proven by the receipt's UID; any other refuses the cleanup."""
    expected = receipt.job_uids()
    live_jobs = []
    for name in sorted(set(expected) | {JOB_NAME}):
        job = kubectl.get("job", name, receipt.namespace, missing_ok=True, retry_until=retry_until)
        if job is None:
            continue
        if job["metadata"].get("uid") != expected.get(name):
            raise DemoError(
                f"refusing to delete Job {name} in {receipt.namespace}: its UID "
                f"{job['metadata'].get('uid')} is not the receipt's "
                f"({expected.get(name)}); nothing was deleted"
            )
        live_jobs.append(name)
    return live_jobs


def namespace_stuck(
    namespace: str, stuck: dict, context: str | None, wait_seconds: float
) -> DemoError:
    """Why a deleted namespace is still there, and how to look; finalizers are never stripped here."""
    finalizers = (stuck.get("metadata", {}).get("finalizers") or []) + (
        (stuck.get("spec") or {}).get("finalizers") or []
    )
    reasons = [
        f"{c.get('type')}: {c.get('message')}"
        for c in (stuck.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    ]
    return DemoError(
        f"namespace {namespace} is still {(stuck.get('status') or {}).get('phase', 'present')} after "
        f"{wait_seconds:g} s; inspect its finalizers ({', '.join(finalizers) or 'none listed'})"
        + (f" and conditions ({'; '.join(reasons)})" if reasons else "")
        + f" with: kubectl --context {context} get namespace {namespace} -o yaml "
        f"(finalizers are never stripped by this tool); run cleanup again later"
    )


def require_receipt_context(kubectl: Kubectl, receipt: Receipt) -> None:
    """The receipt's context must be in the kubeconfig kubectl reads now, else say which one the run used."""
    try:
        named = kubectl.run(
            ["config", "get-contexts", receipt.context, "-o", "name"], request_timeout=None
        )
    except KubectlError:
        named = ""
    if named.strip():
        return
    used = receipt.fields.get("kubeconfig")
    raise DemoError(
        f"kube context {receipt.context!r} of {receipt.path} is not in the kubeconfig kubectl reads "
        f"now ({kubeconfig_path()})"
        + (
            f"; the run used {used}: clean up with KUBECONFIG={used}"
            if used and used != kubeconfig_path()
            else ""
        )
        + "; nothing was deleted"
    )


def cleanup(args: argparse.Namespace) -> int:
    """Delete what the receipt proves this run created; the output directory is kept.
    With --stale, reap the tool's finished and expired runs instead, receipts or not."""
    if args.stale is not None:
        return cleanup_stale(args)
    receipt = Receipt.read(args.output)
    kubectl = Kubectl(find_kubectl(args.kubectl), receipt.context, verbose=args.verbose)
    # Silence from a binary that is not kubectl would read as "Namespace already absent".
    require_kubectl(kubectl)
    require_receipt_context(kubectl, receipt)
    cleanup_namespace(kubectl, receipt, args.wait)
    return 0


def cluster_kubectl(args: argparse.Namespace) -> Kubectl:
    """kubectl for --context (else the current context), named in every call like `run`'s."""
    kubectl = Kubectl(find_kubectl(args.kubectl), verbose=args.verbose)
    kubectl.context = resolve_context(kubectl, args.context)
    return kubectl


def list_everywhere(kubectl: Kubectl, kind: str, selector: str, what: str) -> list[dict]:
    """Every object of a kind that the label selector lets through, in the whole cluster; a
    refusal says which permission is missing."""
    flags = ["-l", selector] + (["--all-namespaces"] if kind != "namespaces" else [])
    try:
        listing = kubectl.get_list(
            kind, None, *flags, retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS
        )
    except KubectlError as error:
        if "(Forbidden)" in error.stderr:
            raise DemoError(
                f"the account of context {kubectl.context!r} may not list {what} at the cluster "
                f"scope, which `list` and `cleanup --stale` need: grant `list` on {what} (see the "
                f"README's Permissions)"
            ) from None
        raise DemoError(f"cannot list the {what} of context {kubectl.context!r}: {error}") from None
    return (listing or {}).get("items") or []


def find_runs(kubectl: Kubectl, namespace: str | None = None) -> list[ClusterRun]:
    """The runs in the context's cluster: namespaces with the run label, and the tool's Jobs;
    with `namespace`, only the runs that share it, found by its Jobs' labels."""
    if namespace is not None:
        try:
            listing = kubectl.get_list(
                "jobs",
                namespace,
                "-l",
                f"app={APP_LABEL}",
                retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
            )
        except KubectlError as error:
            raise DemoError(f"cannot list the Jobs of namespace {namespace}: {error}") from None
        return cluster_runs([], (listing or {}).get("items") or [])
    namespaces = list_everywhere(kubectl, "namespaces", RUN_LABEL, "namespaces")
    jobs = list_everywhere(kubectl, "jobs", f"app={APP_LABEL}", "jobs (batch)")
    return cluster_runs(namespaces, jobs)


def delete_if_uid(kubectl: Kubectl, namespace: str, uid: str) -> str:
    """Ask for the namespace's deletion only if it still has `uid` (the API server checks the
    precondition): "deleted", "recreated" (another namespace has the name now) or "gone"."""
    options = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": uid},
        "propagationPolicy": "Background",
    }
    try:
        # `delete --raw -f -` sends stdin as the DELETE's body, so the precondition travels with it.
        kubectl.run(
            ["delete", "--raw", f"/api/v1/namespaces/{namespace}", "-f", "-"],
            input_text=json.dumps(options),
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except KubectlError as error:
        if "(Conflict)" in error.stderr:
            return "recreated"
        if error.not_found:
            return "gone"
        raise DemoError(f"cannot delete namespace {namespace}: {error}") from None
    return "deleted"


def wait_runs_gone(kubectl: Kubectl, deleted: Sequence[ClusterRun], seconds: float) -> list[dict]:
    """Wait until no namespace of `deleted` (by UID) is left; those still there at the deadline."""
    deadline = time.monotonic() + seconds
    uids = {run.uid for run in deleted}
    while uids:
        left = [
            namespace
            for namespace in list_everywhere(kubectl, "namespaces", RUN_LABEL, "namespaces")
            if (namespace.get("metadata") or {}).get("uid") in uids
        ]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_INTERVAL_SECONDS)
    return []


def cleanup_stale(args: argparse.Namespace) -> int:
    """Delete the runs of this tool past their --ttl, or older than --stale with every Job ended
    (a run between batches: its last Job ended longer ago than that); say what was deleted, what
    was left and why."""
    kubectl = cluster_kubectl(args)
    runs, user, now = (
        find_runs(kubectl, getattr(args, "namespace", None)),
        current_user(kubectl),
        time.time(),
    )
    deleted: list[ClusterRun] = []
    would = 0
    for found in runs:
        verdict = stale_verdict(found, now, args.stale, user, args.all_users)
        if not verdict.delete:
            print(f"Left {found.place}: {verdict.why}", flush=True)
        elif args.dry_run:
            would += 1
            print(f"Would delete {found.place}: {verdict.why}", flush=True)
        else:
            outcome = (
                delete_shared_run(kubectl, found.namespace, found.run_id, found.job_uids)
                if found.shared
                else delete_if_uid(kubectl, found.namespace, found.uid)
            )
            if outcome == "deleted":
                deleted.append(found)
                print(f"Deleted {found.place}: {verdict.why}", flush=True)
            elif outcome == "recreated":
                print(
                    f"Left {found.place}: made again under that name since it was listed (its UID is "
                    f"no longer {found.uid}); not touched",
                    flush=True,
                )
            else:
                print(f"Left {found.place}: already gone", flush=True)
    done = f"Would delete {would}" if args.dry_run else f"Deleted {len(deleted)}"
    print(
        f"{done}, left {len(runs) - would - len(deleted)} of {len(runs)} runs in context {kubectl.context}.",
        flush=True,
    )
    stuck = wait_runs_gone(kubectl, [run for run in deleted if not run.shared], args.wait)
    if stuck:
        raise DemoError(
            "; ".join(
                str(
                    namespace_stuck(
                        namespace["metadata"]["name"], namespace, kubectl.context, args.wait
                    )
                )
                for namespace in stuck
            )
        )
    return 0


def list_runs(args: argparse.Namespace) -> int:
    """Print the tool's runs in the cluster, one line each (or a JSON list with -o json)."""
    kubectl = cluster_kubectl(args)
    runs, now = find_runs(kubectl, getattr(args, "namespace", None)), time.time()
    if args.format == "json":
        print(json.dumps([run_record(run, now) for run in runs], indent=2))
    elif runs:
        print(runs_table(runs, now))
    else:
        print(f"No runs in context {kubectl.context}.", file=sys.stderr)
    return 0
