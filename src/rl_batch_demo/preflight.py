"""What `run` checks and records before it changes anything in the cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

from .constants import (
    FIRST_CONTACT_RETRY_SECONDS,
    NEED_MIN_SERVER,
    RETRIES_MIN_SERVER,
    SETTINGS_FILE,
    UNSERVED_PATH_MESSAGE,
)
from .model import COMMAND_LINE, DemoError, Settings, Spelling
from .files import write_json
from .manifests import capacity_plan, capacity_warning
from .kube import (
    Kubectl,
    KubectlError,
)
from .proxied import api_whoami, kubeconfig_files, recently_read
from .follow import RunContext


def current_user(kubectl: Kubectl) -> str:
    """Who the context's credentials are: the API server's answer to `kubectl auth whoami`
    (a SelfSubjectReview), else, where the server or kubectl has none, the context's user
    in the kubeconfig."""
    try:
        retry_until = time.monotonic() + FIRST_CONTACT_RETRY_SECONDS
        api = kubectl.api
        review = (
            kubectl.get_json(["auth", "whoami"], retry_until=retry_until)
            if api is None
            else recently_read(kubectl, ("whoami",), lambda: api_whoami(api, retry_until))
        )
        username = (((review or {}).get("status") or {}).get("userInfo") or {}).get("username")
        if isinstance(username, str) and username:
            return username
    except (KubectlError, DemoError):
        pass  # no SelfSubjectReview API (before 1.28, or turned off), or a kubectl older than 1.27
    try:
        named = kubectl.run(
            ["config", "view", "--minify", "-o", "jsonpath={.contexts[0].context.user}"],
            request_timeout=None,
        ).strip()
    except KubectlError:
        named = ""
    return named or "(unknown)"


def find_kubectl(binary: str, spelling: Spelling = COMMAND_LINE) -> str:
    """The kubectl to run, or a one-line error naming what is wrong with it."""
    found = shutil.which(binary)
    if found:
        return found
    if os.path.exists(binary):
        raise DemoError(
            f"kubectl at {binary} is not executable (chmod +x it or pass "
            f"{spelling.option('kubectl', 'PATH')})"
        )
    raise DemoError(
        f"kubectl not found: {binary!r} (install kubectl or pass {spelling.option('kubectl', 'PATH')})"
    )


def require_kubectl(kubectl: Kubectl, spelling: Spelling = COMMAND_LINE) -> None:
    """Fail unless the binary answers `version --client` as kubectl does.

    A binary that is not kubectl (`--kubectl /bin/true`) answers every question
    with silence and success, which would read as "no current context" or
    "Namespace already absent".
    """
    try:
        version = json.loads(
            kubectl.run(["version", "--client", "-o", "json"], request_timeout=None)
        )
    except (KubectlError, ValueError):
        version = None
    if not isinstance(version, dict) or "clientVersion" not in version:
        raise DemoError(
            f"{spelling.setting('kubectl', kubectl.binary)} does not look like kubectl "
            f"(`version --client` printed no kubectl version)"
        )


# The contexts resolve_context found, by kubectl, the context asked for and the kubeconfig files as
# they were then: the same files give the same answer, without a kubectl process each step.
RESOLVED_CONTEXTS: dict[tuple, str] = {}


def resolve_context(kubectl: Kubectl, wanted: str | None, spelling: Spelling = COMMAND_LINE) -> str:
    """The context every later call names: --context if it exists, else the current one."""
    key = (kubectl.binary, wanted, kubeconfig_files())
    if key not in RESOLVED_CONTEXTS:
        RESOLVED_CONTEXTS[key] = context_named(kubectl, wanted, spelling)
    return RESOLVED_CONTEXTS[key]


def context_named(kubectl: Kubectl, wanted: str | None, spelling: Spelling) -> str:
    """resolve_context's answer, asked of kubectl."""
    if wanted:
        try:
            named = kubectl.run(
                ["config", "get-contexts", wanted, "-o", "name"], request_timeout=None
            )
        except KubectlError:
            raise DemoError(
                f"kube context {wanted!r} not found in the kubeconfig "
                f"(kubectl config get-contexts lists them)"
            ) from None
        if not named.strip():
            require_kubectl(kubectl, spelling)
            raise DemoError(
                f"kube context {wanted!r} not found in the kubeconfig "
                f"(kubectl config get-contexts lists them)"
            )
        return wanted
    try:
        context = kubectl.run(["config", "current-context"], request_timeout=None).strip()
    except KubectlError as error:
        raise DemoError(
            f"no current kube context ({error}); "
            f"set one or pass {spelling.option('context', 'NAME')}"
        ) from None
    if not context:
        require_kubectl(kubectl, spelling)
        raise DemoError(
            f"no current kube context; set one or pass {spelling.option('context', 'NAME')}"
        )
    return context


def save_run_records(run: RunContext) -> None:
    """The receipt and run.json, before anything in the cluster changes."""
    run.receipt.save()
    save_run_json(run)


def save_run_json(run: RunContext) -> None:
    """run.json: the run's settings, and the capacity plan once known."""
    saved = run.settings.saved()
    if run.capacity is not None:
        saved["capacity"] = run.capacity
    write_json(os.path.join(run.output, SETTINGS_FILE), saved)


def check_runtime_class(run: RunContext) -> None:
    """The RuntimeClass exists; the first contact with the cluster, so it also says whether it answers."""
    runtime, context = run.settings.runtime, run.kubectl.context
    # Retried briefly, so an unreachable cluster is reported in seconds rather than after a minute.
    retry_until = time.monotonic() + FIRST_CONTACT_RETRY_SECONDS
    try:
        if run.kubectl.api is not None:
            run.kubectl.get("runtimeclass", runtime, retry_until=retry_until)
        else:
            run.kubectl.run(["get", "runtimeclass", runtime, "-o", "name"], retry_until=retry_until)
    except KubectlError as error:
        if UNSERVED_PATH_MESSAGE in error.stderr:  # no missing RuntimeClass: an unknown URL
            raise DemoError(
                f"the endpoint of context {context!r}{server_of_context(run.kubectl)} "
                f"does not serve the Kubernetes API (or lacks node.k8s.io/v1 RuntimeClass): "
                f"{error}; nothing was created"
            ) from None
        if error.not_found:
            raise DemoError(
                f"RuntimeClass {runtime!r} not found in context {context!r}; "
                f"nothing was created (pass {run.spelling.option('runtime', 'NAME')})"
            ) from None
        if run.settings.shared_namespace and "(Forbidden)" in error.stderr:
            # A namespace's Role grants nothing at the cluster's scope: the pods will tell.
            print(f"Warning: RuntimeClass check skipped ({error})", file=sys.stderr, flush=True)
            return
        raise DemoError(
            f"cannot reach the cluster of context {context!r}: {error}; nothing was created"
        ) from None


def check_server_version(run: RunContext) -> None:
    """Retries, accepted failures and --need need the Job API of Kubernetes >= 1.33; an older server
    would drop or reject the fields, so say so before anything is created."""
    context, name = run.kubectl.context, run.spelling.name
    needs = (
        f"{name('need')} needs"
        if run.settings.need is not None
        else f"{name('retries')} and {name('allow_failures')} need"
    )
    try:
        version = json.loads(
            run.kubectl.run(
                ["get", "--raw", "/version"],
                retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
            )
        )
        found = (int(version["major"]), int(re.sub(r"\D.*", "", version["minor"]) or 0))
    except (KubectlError, ValueError, KeyError, TypeError) as error:
        raise DemoError(
            f"cannot tell the Kubernetes version of context {context!r} ({error}); "
            f"{needs} >= 1.33; nothing was created"
        ) from None
    if run.settings.need is not None and found < NEED_MIN_SERVER:
        raise DemoError(
            f"{needs} Kubernetes >= 1.33 (the Job's successPolicy, with backoffLimitPerIndex "
            f"and maxFailedIndexes); context {context!r} serves {found[0]}.{found[1]}; "
            f"nothing was created"
        )
    if found < RETRIES_MIN_SERVER:
        raise DemoError(
            f"{needs} Kubernetes >= 1.33 (backoffLimitPerIndex, "
            f"maxFailedIndexes and podFailurePolicy FailIndex); context {context!r} "
            f"serves {found[0]}.{found[1]}; nothing was created"
        )


def check_capacity(run: RunContext) -> None:
    """Warn, before anything is created, when the nodes cannot run the whole batch at once;
    run.json keeps the plan."""
    # Every batch's Job asks for the same resources per pod.
    run.capacity = read_capacity(run.kubectl, run.settings, next(iter(run.plan.jobs.values()))[0])
    save_run_json(run)
    warning = capacity_warning(run.capacity, run.settings.parallelism)
    if warning:
        print(warning, file=sys.stderr, flush=True)


def server_of_context(kubectl: Kubectl) -> str:
    """` (URL)` of the context's API server for a message, or nothing if kubectl cannot say."""
    try:
        server = kubectl.run(
            ["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"],
            request_timeout=None,
        ).strip()
    except DemoError:
        return ""
    return f" ({server})" if server else ""


def read_capacity(kubectl: Kubectl, settings: Settings, job: dict) -> dict:
    """The capacity plan for `job`'s pods from the live nodes and RuntimeClass; a check that cannot
    read them says why."""
    retry_until = time.monotonic() + FIRST_CONTACT_RETRY_SECONDS
    try:
        runtime_class = kubectl.get("runtimeclass", settings.runtime, retry_until=retry_until)
        nodes = kubectl.get_list(
            "nodes", None, f"--chunk-size={settings.chunk_size}", retry_until=retry_until
        )
    except DemoError as error:
        forbidden = "forbidden" in getattr(error, "stderr", "").lower()
        return {
            "checked": False,
            "reason": "reading nodes or the RuntimeClass is not permitted"
            if forbidden
            else str(error),
        }
    requests = job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    return capacity_plan(
        (nodes or {}).get("items") or [],
        runtime_class,
        requests,
        settings.count,
        settings.parallelism,
    )
