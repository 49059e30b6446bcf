"""Requests in kubectl's stead: a trainer's many steps through one `kubectl proxy` kept for the
process (`ProxiedKubectl`, `shared_proxy`), with kubectl's own answers and errors."""

from __future__ import annotations

import atexit
import json
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Sequence

from .model import DemoError
from .files import kubeconfig_path
from .kube import (
    API_RESOURCES,
    CREATED_KINDS,
    ApiProxy,
    Kubectl,
    PagedList,
    resource_path,
    proxied_delete_flags,
    proxied_list_flags,
)


def parsed_object(text: str, verb: str) -> dict:
    """An API answer's object; DemoError, as for kubectl's output, when it is not one."""
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise DemoError(f"kubectl {verb} printed something that is not JSON")
    return answer


def api_get_object(
    proxy: ApiProxy,
    kind: str,
    name: str,
    namespace: str | None,
    missing_ok: bool,
    retry_until: float | None,
) -> dict | None:
    """`kubectl get KIND NAME -o json`, as the object; None when absent and `missing_ok`."""
    path = resource_path(kind, namespace, name)
    text = proxy.call(f"get {kind} {name}", "GET", path, retry_until, absent_ok=missing_ok)
    return None if text is None else parsed_object(text, f"get {kind}")


def api_get_list(
    proxy: ApiProxy,
    kind: str,
    namespace: str | None,
    flags: Sequence[str],
    retry_until: float | None,
) -> dict:
    """`kubectl get KIND [-l SELECTOR] [--chunk-size=N] -o json`: every page, as one List."""
    selector = flags[1] if list(flags[:1]) == ["-l"] else None  # flags: a tuple as often as not
    sizes = [int(flag.split("=", 1)[1]) for flag in flags if flag.startswith("--chunk-size=")]
    listing = PagedList(resource_path(kind, namespace), selector, limit=sizes[0] if sizes else 500)
    while not listing.done:
        text = proxy.call(f"get {kind}", "GET", listing.next_path(), retry_until)
        listing.apply(parsed_object(text or "", f"get {kind}"))
    resource = API_RESOURCES[kind]
    version = resource.prefix.split("/", 2)[-1]
    items = [{"apiVersion": version, "kind": resource.kind, **item} for item in listing.items]
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": items,
        "metadata": {"resourceVersion": ""},
    }


def api_create(
    proxy: ApiProxy, manifest: dict, retry_until: float | None, dry_run: bool = False
) -> dict:
    """`kubectl create -f - -o json` (`dry_run`: with `--dry-run=server`): POSTed to its kind's
    collection; the object as stored (or as it would be)."""
    kind = CREATED_KINDS[manifest["kind"]]
    path = resource_path(kind, (manifest.get("metadata") or {}).get("namespace"))
    path += "?dryRun=All" if dry_run else ""
    text = proxy.call("create", "POST", path, retry_until, body=json.dumps(manifest))
    return parsed_object(text or "", "create")


def api_delete(
    proxy: ApiProxy,
    kind: str,
    name: str,
    namespace: str | None,
    foreground: bool,
    retry_until: float | None,
) -> None:
    """`kubectl delete KIND NAME --wait=false --ignore-not-found [--cascade=foreground]`."""
    options = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "propagationPolicy": "Foreground" if foreground else "Background",
    }
    path = resource_path(kind, namespace, name)
    proxy.call(
        f"delete {kind} {name}",
        "DELETE",
        path,
        retry_until,
        json.dumps(options),
        absent_ok=True,
    )


def api_whoami(proxy: ApiProxy, retry_until: float | None) -> dict:
    """`kubectl auth whoami -o json`: the API server's SelfSubjectReview of these credentials."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    text = proxy.call("auth whoami", "POST", path, retry_until, json.dumps(review))
    return parsed_object(text or "", "auth whoami")


def kubeconfig_files() -> tuple:
    """What kubectl's reading of the kubeconfig depends on: $KUBECONFIG, and each file's size
    and modification time (a file changed, or another named, may name another cluster)."""
    stamps: list[tuple[str, int | None, int | None]] = []
    for path in kubeconfig_path().split(os.pathsep):
        try:
            status = os.stat(path)
            stamps.append((path, status.st_mtime_ns, status.st_size))
        except OSError:
            stamps.append((path, None, None))
    return (os.environ.get("KUBECONFIG"), tuple(stamps))


class SharedProxies:
    """One `kubectl proxy` per kubectl binary, context and kubeconfig, kept for the process's
    life, so that a trainer calling run_batch() or stream_batch() step after step starts no
    kubectl for its reads, creations, deletions and watches (each kubectl process costs about
    0.1 s of CPU and as much of the step's time). A proxy whose kubeconfig changed, or that died,
    is replaced; all are stopped when the process exits (and by the guardian should it be killed).

    Each is started from a thread of its own that lives as long as the process: the kernel's
    PR_SET_PDEATHSIG, which every kubectl is started with, fires when the thread that started it
    ends, and stream_batch() runs each batch in a thread that ends with it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proxies: dict[tuple, ApiProxy] = {}
        self._starts: queue.Queue[tuple[Kubectl, queue.Queue]] = queue.Queue()
        self._starter: threading.Thread | None = None

    def get(self, kubectl: Kubectl) -> ApiProxy:
        """The proxy for `kubectl`'s binary, context and kubeconfig, started if there is none alive,
        as `kubectl` uses it; DemoError when it cannot start."""
        key = (kubectl.binary, kubectl.context, kubeconfig_files())
        with self._lock:
            proxy = self._proxies.get(key)
            if proxy is None or not proxy.alive():
                for stale in [k for k in self._proxies if k[:2] == key[:2]]:
                    self._proxies.pop(stale).close()
                proxy = self._proxies[key] = self._start(kubectl)
        return proxy.view(kubectl)

    def _start(self, kubectl: Kubectl) -> ApiProxy:
        if self._starter is None or not self._starter.is_alive():
            self._starter = threading.Thread(
                target=self._serve, name="rl-batch-demo proxies", daemon=True
            )
            self._starter.start()
        answer: queue.Queue[ApiProxy | BaseException] = queue.Queue()
        self._starts.put((kubectl, answer))  # the proxy's process counted as the caller's
        started = answer.get()
        if isinstance(started, BaseException):
            raise started
        return started

    def _serve(self) -> None:
        """The proxies' starter: each proxy asked for, started from this thread, which never ends."""
        while True:
            kubectl, answer = self._starts.get()
            try:
                answer.put(ApiProxy(kubectl))
            except BaseException as error:  # handed to the thread that asked
                answer.put(error)

    def close_all(self) -> None:
        with self._lock:
            proxies, self._proxies = list(self._proxies.values()), {}
        for proxy in proxies:
            proxy.close()

    def after_fork_in_child(self) -> None:
        """A forked child starts proxies of its own: its parent's stay the parent's."""
        self._lock = threading.Lock()
        self._proxies, self._starts, self._starter = {}, queue.Queue(), None


SHARED_PROXIES = SharedProxies()
atexit.register(SHARED_PROXIES.close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SHARED_PROXIES.after_fork_in_child)


class ProxiedKubectl(Kubectl):
    """A Kubectl whose reads, creations, deletions and watches go through the process's shared
    proxy (shared_proxy) where they can: the same requests, answers and errors as kubectl's,
    without a kubectl process each. What the proxy cannot say, kubectl runs, as without one."""

    def get(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        missing_ok: bool = False,
        retry_until: float | None = None,
    ) -> dict | None:
        if self.api is None or kind not in API_RESOURCES:
            return super().get(kind, name, namespace, missing_ok, retry_until)
        api = self.api
        return recently_read(
            self,
            (kind, name, namespace, missing_ok),
            lambda: api_get_object(api, kind, name, namespace, missing_ok, retry_until),
        )

    def get_list(
        self, kind: str, namespace: str | None = None, *flags: str, retry_until: float | None = None
    ) -> dict | None:
        if self.api is None or kind not in API_RESOURCES or not proxied_list_flags(flags):
            return super().get_list(kind, namespace, *flags, retry_until=retry_until)
        api = self.api
        return recently_read(
            self,
            (kind, namespace, flags),
            lambda: api_get_list(api, kind, namespace, flags, retry_until),
        )

    def create(self, manifest: dict, retry_until: float | None = None) -> dict:
        if self.api is None or manifest.get("kind") not in CREATED_KINDS:
            return super().create(manifest, retry_until)
        return api_create(self.api, manifest, retry_until)

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        *flags: str,
        retry_until: float | None = None,
    ) -> None:
        if self.api is None or kind not in API_RESOURCES or not proxied_delete_flags(flags):
            super().delete(kind, name, namespace, *flags, retry_until=retry_until)
            return
        foreground = "--cascade=foreground" in flags
        api_delete(self.api, kind, name, namespace, foreground, retry_until)

    def sibling(self) -> ProxiedKubectl:
        """A kubectl of the same cluster with counts of its own, through the same proxy."""
        other = ProxiedKubectl(self.binary, self.context, self.verbose)
        other.api = None if self.api is None else self.api.view(other)
        return other


# The cluster-wide facts a run reads before it creates anything (its RuntimeClass, the nodes, who
# its credentials are), kept this long in the process: a trainer's steps, seconds apart, read them
# once (each read is a request, and the nodes' list a big one on a big cluster). A RuntimeClass
# deleted meanwhile fails the batch's pods, reported as such, instead of the check before it.
RECENT_READ_SECONDS = 30.0
RECENT_KINDS = ("runtimeclass", "nodes", "whoami")
RECENT_READS: dict[tuple, tuple[float, Any]] = {}


def recently_read(kubectl: Kubectl, what: tuple, read: Callable[[], Any]) -> Any:
    """`read()`, or for a cluster-wide fact (RECENT_KINDS) its answer to the same kubectl, context
    and kubeconfig within RECENT_READ_SECONDS. A failed read is not kept. Read it, never change it."""
    if what[0] not in RECENT_KINDS:
        return read()
    key = (kubectl.binary, kubectl.context, kubeconfig_files(), what)
    kept = RECENT_READS.get(key)
    if kept is not None and time.monotonic() - kept[0] < RECENT_READ_SECONDS:
        return kept[1]
    read_at = time.monotonic()
    value = RECENT_READS[key] = (read_at, read())
    return value[1]


def shared_proxy(kubectl: Kubectl) -> ApiProxy | None:
    """`kubectl`'s calls given the process's shared proxy (SharedProxies); None, with a warning,
    when it cannot start (each call then runs a kubectl of its own, as before)."""
    try:
        kubectl.api = SHARED_PROXIES.get(kubectl)
    except DemoError as error:  # e.g. kubectl proxy forbidden here
        print(f"Warning: {error}; running one kubectl per request", file=sys.stderr)
        kubectl.api = None
    return kubectl.api


def merge_patch(
    kubectl: Kubectl,
    kind: str,
    name: str,
    namespace: str | None,
    patch: dict,
    retry_until: float | None = None,
) -> None:
    """`kubectl patch KIND NAME --type=merge -p PATCH` (a resourceVersion in it: a precondition),
    through the shared proxy when `kubectl` has one."""
    if isinstance(kubectl, ProxiedKubectl) and kubectl.api is not None and kind in API_RESOURCES:
        kubectl.api.call(
            f"patch {kind} {name}",
            "PATCH",
            resource_path(kind, namespace, name),
            retry_until,
            json.dumps(patch),
            content="application/merge-patch+json",
        )
        return
    args = ["patch", kind, name] + (["-n", namespace] if namespace else [])
    kubectl.run(args + ["--type=merge", "-p", json.dumps(patch)], retry_until=retry_until)
