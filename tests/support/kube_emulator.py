#!/usr/bin/env python3
"""A small but faithful Kubernetes API emulator for tests.

Real ``kubectl`` binaries (1.27 ... 1.35) talk to it over plain HTTP.  It
serves discovery, OpenAPI (v2 protobuf + v3 JSON, so kubectl's default
validation works and sends ``fieldValidation=Strict``), CRUD with real
``Status`` errors, server-side ``Table`` printing, list/watch (chunked watch
streams, bookmarks, ``sendInitialEvents``), pod logs, the pods/proxy
subresource, and the controllers needed to run a batch/v1 Job end to end:

* ``JobController``   - pods, counters, SuccessCriteriaMet/Complete,
  FailureTarget/Failed, deadlines, tracking finalizers, events;
* ``Scheduler``       - binds pods to ``emu-node-N``, ``Scheduled`` events
  through events.k8s.io/v1 (micro-second ``eventTime``);
* ``Kubelet``         - one per node: sandbox delay, image events, runs every
  container as a real local process inside bubblewrap (read-only host root,
  volumes at their mount paths, uid/gid from the securityContext, no
  network -- except a pod that declares ports: it shares the host's network
  and serves on a loopback pod IP of its own, ``LoopbackPodIPs``), container
  statuses, logs, graceful deletion;
  With the fault ``lightweight_kubelet`` (scale tests only) a container spawns
  no process and writes the built-in worker's events with declared timing
  (``LIGHTWEIGHT_TIMING``), so thousands of pods fit on two cores;
* ``GarbageCollector``- background / foreground / orphan propagation;
* ``NamespaceController`` - namespace termination and its conditions.
* Pod Security Admission - pods in a namespace labelled
  ``pod-security.kubernetes.io/enforce=baseline|restricted`` are rejected with the
  real ``violates PodSecurity "restricted:latest": ...`` message; ``warn`` adds
  warnings for pods and Job templates.

How it is put together: ``Emulator`` only composes and starts the pieces.  The
``Store`` holds every object and the watch history; its listeners only enqueue.
``Authenticator`` knows each request's user (a bearer token per user, as
``--token-auth-file`` does; the admin's basic credentials) and ``Authorizer``
answers 403 as RBAC does for a user without a grant; ``SelfReview`` answers
``kubectl auth whoami`` (SelfSubjectReview).  ``Faults`` holds the faults in force (declared in ``FAULTS`` and
``READ_PATH_FAULTS``, refused when unknown) and says whom each hits.  Reads go
through ``ReadPath`` (the watch cache), writes through ``WritePath`` (admission,
defaulting, validation); ``ApiServer`` routes HTTP to them and composes the
rest of the REST layer: ``RequestFaults`` (latency, refusals, injected errors),
``Discovery`` (version, groups, resource lists, OpenAPI), ``Representation``
(objects, metadata or Tables), ``WatchServer``, ``LogServer`` and ``PodProxy`` (pods/proxy).  ``EventRecorder``
writes the components' Events and ``TruthRecord`` notes when things really
happened, for the tests to compare with.

Only the Python standard library is used (Python >= 3.9).

Python API::

    emu = Emulator(workdir, faults={...}, nodes=3, server_version="1.33", images={...})
    emu.start(); env = emu.env(); ...; emu.stop()

``images`` (see ``ImageStore``) gives each node an image store and a registry to pull from:
pull time from the image's size, pulls serialized per node as the kubelet's default, the
kubelet's own Pulling / Pulled / Failed / BackOff events, references that do not exist. By default
(``GUIDE_IMAGE_ONLY``) the guide's image is the only one there: any other fails to pull, as on a
real node; a test that runs images it does not declare says ``images=ANY_IMAGE``.

CLI::

    python tests/support/kube_emulator.py --workdir DIR [--faults JSON] [--nodes N] [--images JSON]
"""

from __future__ import annotations

import argparse
import base64
import bisect
import builtins
import calendar
import hashlib
import heapq
import http.client
import http.server
import ipaddress
import json
import os
import queue
import random
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, quote, unquote, urlsplit

from sandbox import (
    SANDBOX_PATH,
    ContainerLog,
    MountError,
    build_bwrap_argv,
    signal_container,
    signal_tree,
    expand_vars,
    resolve_field_ref,
)

# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
FOREGROUND_FINALIZER = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"
STUCK_FINALIZER = "example.com/stuck"
# the apiserver's name-suffix alphabet (k8s.io/apimachinery/pkg/util/rand)
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

DEFAULT_TIMING: dict[str, float] = {
    "sandbox_delay": 0.08,  # RunPodSandbox
    "sandbox_jitter": 0.12,
    "schedule_delay": 0.01,  # scheduler latency per pod
    "job_status_lag": 0.2,  # job controller batches pod updates
    "job_backoff_base": 10.0,  # pod failure back-off (real: 10 s)
    "create_retry_base": 0.5,  # back-off after a rejected pod create
    "grace_cap": 1.0,  # effective max termination grace period
    "image_pull_backoff": 0.4,  # time between pull attempts (fault)
    "watch_history": 20000,  # watch events kept (older rv -> 410)
    "bookmark_interval": 10.0,  # BOOKMARK cadence on watches
    "resync": 1.0,  # controllers' periodic resync
    "restart_delay": 0.2,  # before a faulted container restarts
    "replace_after": 0.3,  # replace_pod: delete this long after start
}

# Faults of the read path (the watch cache and lists), checked when set.  Each
# takes seconds: a number for every resource, or {"pods": 2.0, ...} for the
# resources (store names) it names.
# Every fault the emulator knows, declared once: a fault not listed here is refused when
# set, so a misspelt one cannot silently inject nothing. "Per index" faults name the
# pods they hit by the pod's creation order in the emulator (0, 1, ...), as a list or as
# the keys of a dict.
FAULTS: dict[str, str] = {
    "sandbox_delay": "seconds RunPodSandbox takes (overrides the timing)",
    "sandbox_jitter": "extra random seconds, up to this, on each sandbox (overrides the timing)",
    "job_status_lag": "seconds the Job controller batches pod updates (overrides the timing)",
    "sandbox_after_watch": "a sandbox starts only once a client watches its Job's pods",
    "sandbox_status_with_running": "the kubelet reports PodReadyToStartContainers True only in the status update "
    "that shows the container running, stamped with that update's time",
    "api_latency": "seconds every API answer is late",
    "api_errors": "{count, match, status}: the next `count` requests whose path contains `match` fail",
    "api_clock_skew": "seconds the API server's and kubelets' clocks run ahead",
    "node_clock_offset": "{node: seconds}: that node's clock runs this far ahead of the API server's (negative: "
    "behind): its kubelet's status stamps, event names and event times, its containers' log "
    "timestamps, and the times the built-in worker reads in its containers",
    "missing_runtimeclass": "the RuntimeClass cube does not exist",
    "job_controller_stalled": "True: the Job controller does nothing; N: it stops once a Job has N pods",
    "stuck_terminating": "namespaces get a finalizer no one removes",
    "fail_pods": "per index: the container exits 3",
    "restart_container": "per index: the container crashes once, then runs",
    "replace_pod": "per index: the pod holds until it is evicted and replaced",
    "image_pull_backoff": "per index (or True): the image never pulls",
    "unreadable_logs": "per index: the kubelet does not serve the pod's log",
    "log_gone": "per index: the kubelet answers the pod's log with its notice that the log is gone "
    "(status 200, as when the runtime no longer has the container)",
    "log_tamper": "{index: duplicate_ready | drop_reward | wrong_id | junk_lines}: the log is altered",
    "lightweight_kubelet": "True or {timing}: containers print the built-in worker's events without a "
    "process (scale tests only)",
    "forbidden": "[resource, ...]: requests for these answer 403 as RBAC would",
}
READ_PATH_FAULTS: dict[str, str] = {
    "watch_delay": "the watch cache runs this far behind the store: watches get each event this late, "
    "and a list with resourceVersionMatch=NotOlderThan waits for the cache",
    "watch_stall": "from the moment the fault is set, the watch cache takes in nothing for this long "
    "(watches deliver nothing), then catches up at once",
    "list_latency": "every list answer is this late (504 Timeout when the request's timeout is shorter)",
    "continue_ttl": "a list's continue token stays good this long, then answers 410 Expired",
}
# The lightweight kubelet, for scale tests only (fault "lightweight_kubelet": true, or a dict
# overriding these keys): a container spawns no process; it writes the built-in worker's
# events ("ready" with the worker's own clock readings, then "reward") into its log with
# this timing, in seconds, each delay scaled by uniform(1 - jitter, 1 + jitter), and exits 0.
# A container with a per-pod fault (fail_pods, replace_pod, ...) still runs for real.
LIGHTWEIGHT_TIMING: dict[str, float] = {
    "process_start": 0.02,  # container started -> interpreter running (the /proc start time)
    "imports": 0.05,  # interpreter start -> the worker's imports done
    "write_task": 0.003,  # imports done -> ready (writing the task's two files)
    "episode_work": 0.15,  # ready -> reward (the tests run twice)
    "exit": 0.01,  # reward -> process exit
    "jitter": 0.3,
}
LIGHTWEIGHT_TESTS_OUTPUT = (
    "...\n----------------------------------------------------------------------\n"
    "Ran 3 tests in 0.000s\n\nOK\n"
)


def check_lightweight(value: Any) -> None:
    """Reject a lightweight_kubelet setting that is not true/false or {timing key: seconds}."""
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, dict) or any(
        k not in LIGHTWEIGHT_TIMING
        or isinstance(v, bool)
        or not isinstance(v, (int, float))
        or v < 0
        for k, v in value.items()
    ):
        phases = ", ".join(LIGHTWEIGHT_TIMING)
        raise ValueError(
            f"fault lightweight_kubelet takes true or {{{phases}: seconds}}, not {value!r}"
        )


# Real values: a list that needs a newer resourceVersion than the watch cache has waits
# 3 s (apiserver cacher blockTimeout) then answers 504 "Too large resource version" with
# retryAfterSeconds 1; a continue token lives until etcd compacts its revision (5 min).
READ_PATH_TIMING: dict[str, float] = {
    "fresh_block": 3.0,
    "fresh_retry_after": 1.0,
    "continue_ttl": 300.0,
}


# client-go's EventAggregator: this many events about one object that differ only by message,
# within this many seconds, and the rest are combined into one.
EVENT_AGGREGATE_AFTER = 10
EVENT_AGGREGATE_SECONDS = 600.0


def clone(obj: Any) -> Any:
    """Deep copy for JSON-like data (faster than copy.deepcopy)."""
    return json.loads(json.dumps(obj))


def fmt_time(t: float) -> str:
    """RFC 3339, whole seconds (truncated), UTC ``Z`` - like metav1.Time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))


def fmt_micro(t: float) -> str:
    """RFC 3339 with microseconds - like metav1.MicroTime."""
    whole = int(t)
    micros = int(round((t - whole) * 1e6))
    if micros >= 1000000:
        whole, micros = whole + 1, micros - 1000000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{micros:06d}Z"


def parse_time(s: str | None) -> float | None:
    """Parse an RFC 3339 timestamp produced by Kubernetes."""
    if not s:
        return None
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$", s)
    if not m:
        return None
    base = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
    frac = float(m.group(2)) if m.group(2) else 0.0
    tz = m.group(3) or "Z"
    off = 0
    if tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        off = sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    return base + frac - off


def human_duration(d: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if d < -1:
        return "<invalid>"
    if d < 0:
        return "0s"
    seconds = int(d)
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


_QUANTITY_SUFFIX = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}


def parse_quantity(q: Any) -> float:
    """Parse a resource.Quantity ("128Mi", "250m", "1e3", 2)."""
    if isinstance(q, (int, float)):
        return float(q)
    m = re.match(r"^([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([a-zA-Z]*)$", str(q).strip())
    if not m or m.group(2) not in _QUANTITY_SUFFIX:
        raise ValueError(
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    return float(m.group(1)) * _QUANTITY_SUFFIX[m.group(2)]


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(NAME_ALPHABET) for _ in range(n))


def hex64(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def normalize_image(image: str) -> tuple[str, str]:
    """Return (repository, full reference) like containerd reports them."""
    name, tag = image, "latest"
    if "@" in name:
        name = name.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    parts = name.split("/")
    if len(parts) == 1:
        repo = "docker.io/library/" + name
    elif "." not in parts[0] and ":" not in parts[0] and parts[0] != "localhost":
        repo = "docker.io/" + name
    else:
        repo = name
    return repo, f"{repo}:{tag}"


def get_path(obj: Any, dotted: str) -> Any:
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def meta(obj: dict) -> dict:
    return obj.setdefault("metadata", {})


def condition(
    ctype: str,
    status: str,
    t: float,
    reason: str | None = None,
    message: str | None = None,
    probe: bool = False,
) -> dict:
    c: dict[str, Any] = {"type": ctype, "status": status}
    if probe:
        c["lastProbeTime"] = fmt_time(t)
    else:
        c["lastProbeTime"] = None
    c["lastTransitionTime"] = fmt_time(t)
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def set_condition(conds: list[dict], new: dict) -> bool:
    """Set a condition, keeping lastTransitionTime when status is unchanged."""
    for i, c in enumerate(conds):
        if c.get("type") == new["type"]:
            if (
                c.get("status") == new["status"]
                and c.get("reason") == new.get("reason")
                and c.get("message") == new.get("message")
            ):
                return False
            if c.get("status") == new["status"]:
                new = dict(new, lastTransitionTime=c.get("lastTransitionTime"))
            conds[i] = new
            return True
    conds.append(new)
    return True


def find_condition(conds: list[dict] | None, ctype: str) -> dict | None:
    for c in conds or []:
        if c.get("type") == ctype:
            return c
    return None


def cond_true(conds: list[dict] | None, ctype: str) -> bool:
    c = find_condition(conds, ctype)
    return bool(c and c.get("status") == "True")


def version_tuple(v: str) -> tuple[int, int]:
    m = re.match(r"v?(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (1, 33)


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


class ApiError(Exception):
    """An error the API answers with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def qualified(info: ResourceInfo) -> str:
    return info.plural if not info.group else f"{info.plural}.{info.group}"


def err_not_found(info: ResourceInfo, name: str) -> ApiError:
    d = {"name": name, "kind": info.plural}
    if info.group:
        d = {"name": name, "group": info.group, "kind": info.plural}
    return ApiError(404, "NotFound", f'{qualified(info)} "{name}" not found', d)


def err_already_exists(info: ResourceInfo, name: str) -> ApiError:
    d = {"name": name, "kind": info.plural}
    if info.group:
        d = {"name": name, "group": info.group, "kind": info.plural}
    return ApiError(409, "AlreadyExists", f'{qualified(info)} "{name}" already exists', d)


def err_conflict(info: ResourceInfo, name: str) -> ApiError:
    d = {"name": name, "kind": info.plural}
    if info.group:
        d["group"] = info.group
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(info)} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        d,
    )


def err_bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def err_invalid(info: ResourceInfo, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """causes: (field, reason, message-fragment)."""
    kind = info.kind if not info.group else f"{info.kind}.{info.group}"
    parts = [f"{f}: {m}" for f, _, m in causes]
    if len(parts) == 1:
        msg = f'{kind} "{name}" is invalid: {parts[0]}'
    else:
        msg = f'{kind} "{name}" is invalid: [{", ".join(parts)}]'
    d: dict[str, Any] = {
        "name": name,
        "kind": info.kind,
        "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes],
    }
    if info.group:
        d["group"] = info.group
    return ApiError(422, "Invalid", msg, d)


def err_forbidden(info: ResourceInfo, name: str, why: str, causes: list | None = None) -> ApiError:
    label = f'{qualified(info)} "{name}"' if name else qualified(info)
    d: dict[str, Any] = {"name": name, "kind": info.plural}
    if info.group:
        d["group"] = info.group
    if causes:
        d["causes"] = causes
    return ApiError(403, "Forbidden", f"{label} is forbidden: {why}", d)


# --------------------------------------------------------------------------
# Pod Security Admission (k8s.io/pod-security-admission/policy, the checks a
# pod of this project's kind can trip), messages worded as the real ones
# --------------------------------------------------------------------------

PSA_LABEL = "pod-security.kubernetes.io/"
PSA_LEVELS = ("privileged", "baseline", "restricted")
# volume types the restricted level allows (check_restrictedVolumes.go)
PSA_RESTRICTED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)


def _join_quote(items: list[str]) -> str:
    return '"' + '", "'.join(items) + '"' if items else ""


def _containers_noun(names: list[str]) -> str:
    return f"{'container' if len(names) == 1 else 'containers'} {_join_quote(names)}"


def _pod_containers(spec: dict) -> list[dict]:
    return (
        list(spec.get("initContainers") or [])
        + list(spec.get("containers") or [])
        + list(spec.get("ephemeralContainers") or [])
    )


def _psa_must_set(
    spec: dict,
    field: str,
    good: Callable[[Any], bool],
    reason: str,
    pod_level: bool,
    set_text: str,
    bad_text: Callable[[list[str], list[str]], str],
) -> tuple[str, str] | None:
    """The pod-or-container pattern of runAsNonRoot / seccompProfile (restricted)."""
    pod_security = spec.get("securityContext") or {}
    bad_setters: list[str] = []
    bad_values: list[str] = []
    pod_ok = False
    if pod_level and pod_security.get(field) is not None:
        if good(pod_security[field]):
            pod_ok = True
        else:
            bad_setters.append("pod")
            bad_values.append(
                str(
                    pod_security[field].get("type")
                    if isinstance(pod_security[field], dict)
                    else pod_security[field]
                )
            )
    explicit, implicit = [], []
    for c in _pod_containers(spec):
        value = (c.get("securityContext") or {}).get(field)
        if value is not None:
            if not good(value):
                explicit.append(c.get("name", ""))
                bad_values.append(str(value.get("type") if isinstance(value, dict) else value))
        elif not pod_ok:
            implicit.append(c.get("name", ""))
    if explicit:
        bad_setters.append(_containers_noun(explicit))
    if bad_setters:
        return reason, bad_text(bad_setters, sorted(set(bad_values)))
    if implicit:
        return reason, f"pod or {_containers_noun(implicit)} must set {set_text}"
    return None


def _psa_allow_privilege_escalation(spec: dict) -> tuple[str, str] | None:
    """allowPrivilegeEscalation (restricted): every container sets it to false."""
    bad = [
        c.get("name", "")
        for c in _pod_containers(spec)
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if not bad:
        return None
    return (
        "allowPrivilegeEscalation != false",
        f"{_containers_noun(bad)} must set securityContext.allowPrivilegeEscalation=false",
    )


def _psa_capabilities(spec: dict) -> tuple[str, str] | None:
    """capabilities_restricted: every container drops ALL and adds nothing but NET_BIND_SERVICE."""
    missing_drop, adding, forbidden = [], [], set()
    for c in _pod_containers(spec):
        caps = (c.get("securityContext") or {}).get("capabilities")
        if caps is None:
            missing_drop.append(c.get("name", ""))
            continue
        if "ALL" not in (caps.get("drop") or []):
            missing_drop.append(c.get("name", ""))
        extra = [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(c.get("name", ""))
            forbidden.update(extra)
    details = []
    if missing_drop:
        details.append(
            f'{_containers_noun(missing_drop)} must set securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_containers_noun(adding)} must not include {_join_quote(sorted(forbidden))} in "
            "securityContext.capabilities.add"
        )
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _psa_host_namespaces(spec: dict) -> tuple[str, str] | None:
    """hostNamespaces: no host network, PID or IPC namespace."""
    host = [f + "=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    return ("host namespaces", ", ".join(host)) if host else None


def _psa_host_path_volumes(spec: dict) -> tuple[str, str] | None:
    """hostPathVolumes (baseline; restrictedVolumes covers it at restricted): no hostPath volume."""
    hp = [v.get("name", "") for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    if not hp:
        return None
    return (
        "hostPath volumes",
        f"{'volume' if len(hp) == 1 else 'volumes'} {_join_quote(hp)}",
    )


def _psa_privileged(spec: dict) -> tuple[str, str] | None:
    """privileged: no privileged container."""
    privileged = [
        c.get("name", "")
        for c in _pod_containers(spec)
        if (c.get("securityContext") or {}).get("privileged")
    ]
    if not privileged:
        return None
    return (
        "privileged",
        f"{_containers_noun(privileged)} must not set securityContext.privileged=true",
    )


def _psa_restricted_volumes(spec: dict) -> tuple[str, str] | None:
    """restrictedVolumes: only the volume types the restricted level allows."""
    bad_volumes = sorted(
        v.get("name", "")
        for v in spec.get("volumes") or []
        if not any(v.get(t) is not None for t in PSA_RESTRICTED_VOLUMES)
    )
    if not bad_volumes:
        return None
    quoted = " ".join(f'"{n}"' for n in bad_volumes)
    return "restricted volume types", f"volumes [{quoted}] have restricted types"


def _psa_run_as_non_root(spec: dict) -> tuple[str, str] | None:
    """runAsNonRoot (restricted): true on the pod or on every container, false nowhere."""
    return _psa_must_set(
        spec,
        "runAsNonRoot",
        lambda v: v is True,
        "runAsNonRoot != true",
        True,
        "securityContext.runAsNonRoot=true",
        lambda setters, _: (
            f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
        ),
    )


def _psa_run_as_user(spec: dict) -> tuple[str, str] | None:
    """runAsUser (restricted): neither the pod nor a container runs as user 0."""
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    zero = [
        c.get("name", "")
        for c in _pod_containers(spec)
        if (c.get("securityContext") or {}).get("runAsUser") == 0
    ]
    if zero:
        setters.append(_containers_noun(zero))
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _psa_seccomp_restricted(spec: dict) -> tuple[str, str] | None:
    """seccompProfile_restricted: RuntimeDefault or Localhost on the pod or on every container."""
    return _psa_must_set(
        spec,
        "seccompProfile",
        lambda v: isinstance(v, dict) and v.get("type") in ("RuntimeDefault", "Localhost"),
        "seccompProfile",
        True,
        'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
        lambda setters, values: (
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to "
            f"{_join_quote(values)}"
        ),
    )


def _psa_seccomp_baseline(spec: dict) -> tuple[str, str] | None:
    """seccompProfile_baseline: Unconfined nowhere."""
    unconfined = [
        c.get("name", "")
        for c in _pod_containers(spec)
        if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        == "Unconfined"
    ]
    pod_unconfined = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get(
        "type"
    ) == "Unconfined"
    if not unconfined and not pod_unconfined:
        return None
    who = (["pod"] if pod_unconfined else []) + (
        [_containers_noun(unconfined)] if unconfined else []
    )
    return (
        "seccompProfile",
        f'{" and ".join(who)} must not set securityContext.seccompProfile.type to "Unconfined"',
    )


# The checks in the policy registry's order (by check ID), each with the levels it applies at.
PSA_CHECKS: list[tuple[tuple[str, ...], Callable[[dict], tuple[str, str] | None]]] = [
    (("restricted",), _psa_allow_privilege_escalation),
    (("restricted",), _psa_capabilities),
    (("baseline", "restricted"), _psa_host_namespaces),
    (("baseline",), _psa_host_path_volumes),
    (("baseline", "restricted"), _psa_privileged),
    (("restricted",), _psa_restricted_volumes),
    (("restricted",), _psa_run_as_non_root),
    (("restricted",), _psa_run_as_user),
    (("restricted",), _psa_seccomp_restricted),
    (("baseline",), _psa_seccomp_baseline),
]


def pod_security_violations(spec: dict, level: str) -> list[tuple[str, str]]:
    """(reason, detail) per failed check, in the policy registry's order (by check ID)."""
    out: list[tuple[str, str]] = []
    for levels, check in PSA_CHECKS:
        if level in levels:
            result = check(spec)
            if result:
                out.append(result)
    return out


def pod_security_policy(ns_labels: dict[str, str] | None, mode: str) -> str | None:
    """ "restricted:latest" etc. for the namespace's enforce/warn/audit label, or None (privileged)."""
    labels = ns_labels or {}
    level = labels.get(PSA_LABEL + mode)
    if level not in ("baseline", "restricted"):
        return None
    return f"{level}:{labels.get(PSA_LABEL + mode + '-version') or 'latest'}"


def pod_security_message(policy: str, spec: dict) -> str | None:
    """The aggregated detail the admission plugin prints, or None when the spec complies."""
    violations = pod_security_violations(spec, policy.split(":", 1)[0])
    if not violations:
        return None
    listing = ", ".join(f"{rule} ({detail})" if detail else rule for rule, detail in violations)
    return f'violates PodSecurity "{policy}": {listing}'


# --------------------------------------------------------------------------
# resource registry
# --------------------------------------------------------------------------


class ResourceInfo:
    """Static description of one served resource (one group/version/plural)."""

    def __init__(
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        namespaced: bool,
        short_names: list[str] | None = None,
        store: str | None = None,
        categories: list[str] | None = None,
        subresources: dict[str, list[str]] | None = None,
    ):
        self.group = group
        self.version = version
        self.plural = plural
        self.kind = kind
        self.namespaced = namespaced
        self.short_names = short_names or []
        self.store = store or plural
        self.categories = categories or []
        self.subresources = subresources or {}

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def gv_path(self) -> str:
        return "api/v1" if not self.group else f"apis/{self.group}/{self.version}"

    @property
    def singular(self) -> str:
        return self.kind.lower()


VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

RESOURCES: list[ResourceInfo] = [
    ResourceInfo(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        ["ns"],
        subresources={"finalize": ["update"], "status": ["get", "patch", "update"]},
    ),
    ResourceInfo("", "v1", "configmaps", "ConfigMap", True, ["cm"]),
    ResourceInfo("", "v1", "secrets", "Secret", True, []),
    ResourceInfo(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        ["po"],
        categories=["all"],
        subresources={
            "eviction": ["create"],
            "log": ["get"],
            "proxy": ["create", "delete", "get", "patch", "update"],
            "status": ["get", "patch", "update"],
        },
    ),
    ResourceInfo("", "v1", "events", "Event", True, ["ev"]),
    ResourceInfo(
        "",
        "v1",
        "nodes",
        "Node",
        False,
        ["no"],
        subresources={"status": ["get", "patch", "update"]},
    ),
    ResourceInfo(
        "batch",
        "v1",
        "jobs",
        "Job",
        True,
        [],
        categories=["all"],
        subresources={"status": ["get", "patch", "update"]},
    ),
    ResourceInfo("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, []),
    ResourceInfo("events.k8s.io", "v1", "events", "Event", True, ["ev"], store="events"),
    ResourceInfo("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ["netpol"]),
]
GROUP_VERSIONS: list[tuple[str, str]] = []
for _r in RESOURCES:
    if (_r.group, _r.version) not in GROUP_VERSIONS:
        GROUP_VERSIONS.append((_r.group, _r.version))
CANONICAL: dict[str, ResourceInfo] = {}
for _r in RESOURCES:
    CANONICAL.setdefault(_r.store, _r)
NAMESPACED_STORES = [s for s, r in CANONICAL.items() if r.namespaced]


def find_resource(group: str, version: str, plural: str) -> ResourceInfo | None:
    for r in RESOURCES:
        if r.group == group and r.version == version and r.plural == plural:
            return r
    return None


# --------------------------------------------------------------------------
# strict field validation (known-structure schemas)
# --------------------------------------------------------------------------
# A schema is a dict {field: subschema}; subschema None = anything,
# "map" = free-form map, [schema] = list of schema.

_OWNER_REF = {
    "apiVersion": None,
    "kind": None,
    "name": None,
    "uid": None,
    "controller": None,
    "blockOwnerDeletion": None,
}
OBJECT_META = {
    "name": None,
    "generateName": None,
    "namespace": None,
    "selfLink": None,
    "uid": None,
    "resourceVersion": None,
    "generation": None,
    "creationTimestamp": None,
    "deletionTimestamp": None,
    "deletionGracePeriodSeconds": None,
    "labels": "map",
    "annotations": "map",
    "ownerReferences": [_OWNER_REF],
    "finalizers": None,
    "managedFields": None,
}
_SEC_CTX = {
    "capabilities": {"add": None, "drop": None},
    "privileged": None,
    "seLinuxOptions": None,
    "windowsOptions": None,
    "runAsUser": None,
    "runAsGroup": None,
    "runAsNonRoot": None,
    "readOnlyRootFilesystem": None,
    "allowPrivilegeEscalation": None,
    "procMount": None,
    "seccompProfile": {"type": None, "localhostProfile": None},
    "appArmorProfile": None,
}
_POD_SEC_CTX = {
    "seLinuxOptions": None,
    "windowsOptions": None,
    "runAsUser": None,
    "runAsGroup": None,
    "runAsNonRoot": None,
    "supplementalGroups": None,
    "supplementalGroupsPolicy": None,
    "fsGroup": None,
    "sysctls": None,
    "fsGroupChangePolicy": None,
    "seccompProfile": {"type": None, "localhostProfile": None},
    "appArmorProfile": None,
    "seLinuxChangePolicy": None,
}
_ENV_VAR = {
    "name": None,
    "value": None,
    "valueFrom": {
        "fieldRef": {"apiVersion": None, "fieldPath": None},
        "resourceFieldRef": None,
        "configMapKeyRef": None,
        "secretKeyRef": None,
        "fileKeyRef": None,
    },
}
CONTAINER = {
    "name": None,
    "image": None,
    "command": None,
    "args": None,
    "workingDir": None,
    "ports": None,
    "envFrom": None,
    "env": [_ENV_VAR],
    "resources": {"limits": "map", "requests": "map", "claims": None},
    "resizePolicy": None,
    "restartPolicy": None,
    "restartPolicyRules": None,
    "volumeMounts": [
        {
            "name": None,
            "readOnly": None,
            "recursiveReadOnly": None,
            "mountPath": None,
            "subPath": None,
            "mountPropagation": None,
            "subPathExpr": None,
        }
    ],
    "volumeDevices": None,
    "livenessProbe": None,
    "readinessProbe": None,
    "startupProbe": None,
    "lifecycle": None,
    "terminationMessagePath": None,
    "terminationMessagePolicy": None,
    "imagePullPolicy": None,
    "securityContext": _SEC_CTX,
    "stdin": None,
    "stdinOnce": None,
    "tty": None,
}
VOLUME = {
    "name": None,
    "configMap": {"name": None, "items": None, "defaultMode": None, "optional": None},
    "emptyDir": {"medium": None, "sizeLimit": None},
    "secret": None,
    "hostPath": None,
    "projected": None,
    "downwardAPI": None,
    "persistentVolumeClaim": None,
    "ephemeral": None,
    "csi": None,
    "image": None,
    "nfs": None,
}
POD_SPEC = {
    "volumes": [VOLUME],
    "initContainers": [CONTAINER],
    "containers": [CONTAINER],
    "ephemeralContainers": None,
    "restartPolicy": None,
    "terminationGracePeriodSeconds": None,
    "activeDeadlineSeconds": None,
    "dnsPolicy": None,
    "nodeSelector": "map",
    "serviceAccountName": None,
    "serviceAccount": None,
    "automountServiceAccountToken": None,
    "nodeName": None,
    "hostNetwork": None,
    "hostPID": None,
    "hostIPC": None,
    "shareProcessNamespace": None,
    "securityContext": _POD_SEC_CTX,
    "imagePullSecrets": None,
    "hostname": None,
    "subdomain": None,
    "affinity": None,
    "schedulerName": None,
    "tolerations": None,
    "hostAliases": None,
    "priorityClassName": None,
    "priority": None,
    "dnsConfig": None,
    "readinessGates": None,
    "runtimeClassName": None,
    "enableServiceLinks": None,
    "preemptionPolicy": None,
    "overhead": "map",
    "topologySpreadConstraints": None,
    "setHostnameAsFQDN": None,
    "os": None,
    "hostUsers": None,
    "schedulingGates": None,
    "resourceClaims": None,
    "resources": None,
}
SCHEMAS: dict[str, dict] = {
    "Namespace": {"spec": {"finalizers": None}, "status": None},
    "ConfigMap": {"data": "map", "binaryData": "map", "immutable": None},
    "Secret": {"data": "map", "stringData": "map", "type": None, "immutable": None},
    "Pod": {"spec": POD_SPEC, "status": None},
    "Job": {
        "spec": {
            "parallelism": None,
            "completions": None,
            "activeDeadlineSeconds": None,
            "podFailurePolicy": None,
            "successPolicy": None,
            "backoffLimit": None,
            "backoffLimitPerIndex": None,
            "maxFailedIndexes": None,
            "selector": None,
            "manualSelector": None,
            "template": {"metadata": OBJECT_META, "spec": POD_SPEC},
            "ttlSecondsAfterFinished": None,
            "completionMode": None,
            "suspend": None,
            "podReplacementPolicy": None,
            "managedBy": None,
        },
        "status": None,
    },
    "NetworkPolicy": {
        "spec": {"podSelector": None, "ingress": None, "egress": None, "policyTypes": None}
    },
    "RuntimeClass": {"handler": None, "overhead": {"podFixed": "map"}, "scheduling": None},
    "Node": {"spec": None, "status": None},
}


def unknown_fields(kind: str, obj: dict) -> list[str]:
    """Paths of fields the server would reject with fieldValidation=Strict."""
    top = {"apiVersion": None, "kind": None, "metadata": OBJECT_META}
    top.update(SCHEMAS.get(kind, {}))
    if kind == "Event":
        return []
    out: list[str] = []

    def walk(value: Any, schema: Any, path: str) -> None:
        if schema is None or schema == "map":
            return
        if isinstance(schema, list):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    walk(item, schema[0], f"{path}[{i}]")
            return
        if not isinstance(value, dict):
            return
        for k, v in value.items():
            p = k if not path else f"{path}.{k}"
            if k not in schema:
                out.append(p)
            else:
                walk(v, schema[k], p)

    walk(obj, top, "")
    return out


# --------------------------------------------------------------------------
# label / field selectors
# --------------------------------------------------------------------------


class LabelSelector:
    """Parses the string form of a label selector (equality and set based)."""

    def __init__(self, text: str):
        self.reqs: list[tuple[str, str, list[str]]] = []
        text = (text or "").strip()
        if not text:
            return
        for part in self._split(text):
            part = part.strip()
            if not part:
                continue
            m = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", part)
            if m:
                vals = [v.strip() for v in m.group(3).split(",") if v.strip()]
                self.reqs.append((m.group(1), m.group(2), vals))
            elif part.startswith("!"):
                self.reqs.append((part[1:].strip(), "!", []))
            elif "!=" in part:
                k, v = part.split("!=", 1)
                self.reqs.append((k.strip(), "!=", [v.strip()]))
            elif "==" in part:
                k, v = part.split("==", 1)
                self.reqs.append((k.strip(), "=", [v.strip()]))
            elif "=" in part:
                k, v = part.split("=", 1)
                self.reqs.append((k.strip(), "=", [v.strip()]))
            else:
                self.reqs.append((part, "exists", []))

    @staticmethod
    def _split(text: str) -> list[str]:
        out, depth, cur = [], 0, ""
        for ch in text:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            if ch == "," and depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += ch
        out.append(cur)
        return out

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        for key, op, vals in self.reqs:
            has = key in labels
            val = labels.get(key)
            if op == "=" and (not has or val != vals[0]):
                return False
            if op == "!=" and has and val == vals[0]:
                return False
            if op == "in" and (not has or val not in vals):
                return False
            if op == "notin" and has and val in vals:
                return False
            if op == "exists" and not has:
                return False
            if op == "!" and has:
                return False
        return True


class FieldSelector:
    """metadata.name=x,status.phase!=Running style selectors."""

    def __init__(self, text: str):
        self.reqs: list[tuple[str, str, str]] = []
        for part in (text or "").split(","):
            part = part.strip()
            if not part:
                continue
            if "!=" in part:
                k, v = part.split("!=", 1)
                self.reqs.append((k.strip(), "!=", v.strip()))
            elif "==" in part:
                k, v = part.split("==", 1)
                self.reqs.append((k.strip(), "=", v.strip()))
            elif "=" in part:
                k, v = part.split("=", 1)
                self.reqs.append((k.strip(), "=", v.strip()))
            else:
                raise err_bad_request(f"invalid selector: '{text}'; can't understand '{part}'")

    def matches(self, obj: dict) -> bool:
        for key, op, val in self.reqs:
            actual = get_path(obj, key)
            actual = "" if actual is None else str(actual)
            if op == "=" and actual != val:
                return False
            if op == "!=" and actual == val:
                return False
        return True


# --------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------


class Expired(Exception):
    """A watch asked for a resourceVersion that was compacted away."""


class Store:
    """All objects, one global resourceVersion counter and the watch history.

    A single re-entrant lock protects everything.  Listeners are called with
    the lock held and must only enqueue work.
    """

    def __init__(self, clock: Callable[[], float], history_limit: int = 20000):
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.clock = clock
        self.objects: dict[str, dict[str, dict[str, dict]]] = {}
        self.uids: dict[str, tuple[str, str, str]] = {}
        self.rv = 1
        self.history: list[tuple[int, str, str, dict]] = []
        self.history_rvs: list[int] = []
        self.history_limit = max(10, int(history_limit))
        self.compacted_rv = 0
        self.listeners: list[Callable[[str, str, dict], None]] = []
        self.created_wall: dict[str, float] = {}

    # -- internals --------------------------------------------------------
    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _record(self, etype: str, store: str, obj: dict) -> None:
        snap = clone(obj)
        rv = int(obj["metadata"]["resourceVersion"])
        self.history.append((rv, etype, store, snap))
        self.history_rvs.append(rv)
        if len(self.history) > self.history_limit:
            drop = len(self.history) - self.history_limit
            self.compacted_rv = self.history_rvs[drop - 1]
            del self.history[:drop]
            del self.history_rvs[:drop]
        self.cond.notify_all()
        for fn in list(self.listeners):
            try:
                fn(etype, store, snap)
            except Exception:  # pragma: no cover - listener bugs must not break the API
                traceback.print_exc()

    def _bucket(self, store: str, ns: str) -> dict[str, dict]:
        return self.objects.setdefault(store, {}).setdefault(ns or "", {})

    # -- reads ------------------------------------------------------------
    def get(self, store: str, ns: str | None, name: str) -> dict | None:
        with self.lock:
            obj = self.objects.get(store, {}).get(ns or "", {}).get(name)
            return clone(obj) if obj is not None else None

    def list(self, store: str, ns: str | None = None) -> tuple[builtins.list[dict], int]:
        with self.lock:
            buckets = self.objects.get(store, {})
            out: list[dict] = []
            if ns is not None and ns != "":
                out = [clone(o) for o in buckets.get(ns, {}).values()]
            else:
                for b in buckets.values():
                    out.extend(clone(o) for o in b.values())
            out.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            return out, self.rv

    def list_raw(self, store: str, ns: str | None = None) -> builtins.list[dict]:
        """Like list() but without copying: stored dicts are never mutated in place
        (updates replace them), so callers may read but must not modify them."""
        with self.lock:
            buckets = self.objects.get(store, {})
            if ns:
                return list(buckets.get(ns, {}).values())
            out: list[dict] = []
            for b in buckets.values():
                out.extend(b.values())
            return out

    def by_uid(self, uid: str) -> tuple[str, str, str] | None:
        with self.lock:
            return self.uids.get(uid)

    # -- writes -----------------------------------------------------------
    def create(self, store: str, obj: dict) -> dict:
        with self.lock:
            metadata = obj["metadata"]
            ns = metadata.get("namespace", "") or ""
            bucket = self._bucket(store, ns)
            if metadata["name"] in bucket:
                raise KeyError(metadata["name"])
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata["resourceVersion"] = str(self._next_rv())
            metadata["creationTimestamp"] = fmt_time(self.clock())
            # The true moment of creation, taken with the stamp: the listeners that note it may
            # run a while later on a loaded machine.
            if store in ("pods", "jobs", "namespaces"):
                self.created_wall[metadata["uid"]] = time.time()
            bucket[metadata["name"]] = obj
            self.uids[metadata["uid"]] = (store, ns, metadata["name"])
            self._record("ADDED", store, obj)
            return clone(obj)

    def update(
        self,
        store: str,
        ns: str | None,
        name: str,
        mutate: Callable[[dict], bool | None],
        expect_rv: str | None = None,
        removes: bool = True,
    ) -> dict | None:
        """Apply ``mutate`` to the stored object.

        ``mutate`` may return False to signal "no change" (no new rv).  If the
        result has a deletionTimestamp, no finalizers and a zero grace period
        the object is removed (like the generic registry does), unless
        ``removes`` is False: the caller removes it after this update is seen.
        Returns the new object, or None when it was removed / does not exist.
        """
        with self.lock:
            bucket = self._bucket(store, ns or "")
            cur = bucket.get(name)
            if cur is None:
                return None
            if expect_rv and expect_rv != cur["metadata"]["resourceVersion"]:
                raise ValueError("conflict")
            new = clone(cur)
            changed = mutate(new)
            if changed is False:
                return clone(cur)
            if removes and self.finalized(store, new):
                self._remove_locked(store, ns or "", name, new)
                return None
            new["metadata"]["resourceVersion"] = str(self._next_rv())
            bucket[name] = new
            self._record("MODIFIED", store, new)
            return clone(new)

    @staticmethod
    def finalized(store: str, obj: dict) -> bool:
        """Whether the object is being deleted and nothing holds it any more: it is to be removed."""
        metadata = obj["metadata"]
        if not metadata.get("deletionTimestamp") or metadata.get("finalizers"):
            return False
        if store == "namespaces" and (obj.get("spec") or {}).get("finalizers"):
            return False
        return metadata.get("deletionGracePeriodSeconds", 0) == 0

    def remove(self, store: str, ns: str | None, name: str) -> dict | None:
        with self.lock:
            cur = self._bucket(store, ns or "").get(name)
            if cur is None:
                return None
            return self._remove_locked(store, ns or "", name, clone(cur))

    def _remove_locked(self, store: str, ns: str, name: str, final: dict) -> dict:
        bucket = self._bucket(store, ns)
        bucket.pop(name, None)
        self.uids.pop(final["metadata"].get("uid", ""), None)
        final["metadata"]["resourceVersion"] = str(self._next_rv())
        self._record("DELETED", store, final)
        return final

    # -- watch support ----------------------------------------------------
    def events_since(self, rv: int) -> builtins.list[tuple[int, str, str, dict]]:
        with self.lock:
            if rv < self.compacted_rv:
                raise Expired()
            i = bisect.bisect_right(self.history_rvs, rv)
            return self.history[i:]


# --------------------------------------------------------------------------
# Table printing (server side, like pkg/printers/internalversion)
# --------------------------------------------------------------------------

_NAME_COL = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace. Is required when creating "
    "resources, although some resources may allow a client to request the "
    "generation of an appropriate name automatically. Name is primarily "
    "intended for creation idempotence and configuration definition. Cannot "
    "be updated. More info: https://kubernetes.io/docs/concepts/overview/"
    "working-with-objects/names#names",
    "priority": 0,
}
_AGE_COL = {
    "name": "Age",
    "type": "string",
    "format": "",
    "description": "CreationTimestamp is a timestamp representing the server time when this "
    "object was created.",
    "priority": 0,
}


def _col(
    name: str, desc: str = "", priority: int = 0, ctype: str = "string", fmt: str = ""
) -> dict:
    return {"name": name, "type": ctype, "format": fmt, "description": desc, "priority": priority}


TABLE_COLUMNS: dict[str, list[dict]] = {
    "pods": [
        _NAME_COL,
        _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
        _col("Status", "The aggregate status of the containers in this pod."),
        _col(
            "Restarts",
            "The number of times the containers in this pod have been restarted "
            "and when the last container in this pod has restarted.",
        ),
        _AGE_COL,
        _col("IP", "podIP", 1),
        _col("Node", "nodeName", 1),
        _col("Nominated Node", "nominatedNodeName", 1),
        _col("Readiness Gates", "readinessGates", 1),
    ],
    "jobs": [
        _NAME_COL,
        _col("Status", "Status of the job."),
        _col("Completions", "The number of pods which reached phase Succeeded."),
        _col("Duration", "Time required to complete the job."),
        _AGE_COL,
        _col("Containers", "Names of each container in the template.", 1),
        _col("Images", "Images referenced by each container in the template.", 1),
        _col("Selector", "A label query over pods that should match the pod count.", 1),
    ],
    "events": [
        _col(
            "Last Seen", "The time at which the most recent occurrence of this event was recorded."
        ),
        _col(
            "Type", "Type of this event (Normal, Warning), new types could be added in the future"
        ),
        _col(
            "Reason",
            "This should be a short, machine understandable string that gives the "
            "reason for the transition into the object's current status.",
        ),
        _col("Object", "The object that this event is about."),
        _col("Subobject", "fieldPath", 1),
        _col("Source", "The component reporting this event.", 1),
        _col("Message", "A human-readable description of the status of this operation."),
        _col("First Seen", "The time at which the event was first recorded.", 1),
        _col("Count", "The number of times this event has occurred.", 1),
        dict(_NAME_COL, priority=1),
    ],
    "namespaces": [_NAME_COL, _col("Status", "The status of the namespace"), _AGE_COL],
    "runtimeclasses": [
        _NAME_COL,
        _col(
            "Handler",
            "Handler specifies the underlying runtime and "
            "configuration that the CRI implementation will use",
        ),
        _AGE_COL,
    ],
    "configmaps": [_NAME_COL, _col("Data", "Data contains the configuration data."), _AGE_COL],
    "secrets": [
        _NAME_COL,
        _col("Type", "Used to facilitate programmatic handling of secret data."),
        _col("Data", "Data contains the secret data."),
        _AGE_COL,
    ],
    "nodes": [
        _NAME_COL,
        _col("Status", "The status of the node"),
        _col("Roles", "The roles of the node"),
        _AGE_COL,
        _col("Version", "Kubelet Version reported by the node."),
        _col("Internal-IP", "List of addresses reachable to the node.", 1),
        _col("External-IP", "List of addresses reachable to the node.", 1),
        _col("OS-Image", "OS Image reported by the node.", 1),
        _col("Kernel-Version", "Kernel Version reported by the node.", 1),
        _col("Container-Runtime", "ContainerRuntime Version reported by the node.", 1),
    ],
    "networkpolicies": [
        _NAME_COL,
        _col("Pod-Selector", "Selects the pods to which this NetworkPolicy object applies."),
        _AGE_COL,
    ],
}


def _age(obj: dict, now: float) -> str:
    t = parse_time(obj.get("metadata", {}).get("creationTimestamp"))
    return "<unknown>" if t is None else human_duration(now - t)


def format_label_selector(sel: dict | None) -> str:
    if not sel:
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op = e["operator"]
        if op in ("In", "NotIn"):
            parts.append(f"{e['key']} {op.lower()} ({','.join(e.get('values') or [])})")
        elif op == "Exists":
            parts.append(e["key"])
        else:
            parts.append("!" + e["key"])
    return ",".join(parts) if parts else "<none>"


def pod_row(pod: dict, now: float) -> list[Any]:
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    phase = status.get("phase") or ""
    reason = status.get("reason") or phase
    total = len(spec.get("containers") or [])
    ready = 0
    restarts = 0
    last_restart = None
    has_running = False
    for cs in reversed(status.get("containerStatuses") or []):
        restarts += cs.get("restartCount", 0)
        lt = (cs.get("lastState") or {}).get("terminated")
        if lt:
            finished = parse_time(lt.get("finishedAt"))
            if finished and (last_restart is None or finished > last_restart):
                last_restart = finished
        st = cs.get("state") or {}
        if st.get("waiting") and st["waiting"].get("reason"):
            reason = st["waiting"]["reason"]
        elif st.get("terminated") and st["terminated"].get("reason"):
            reason = st["terminated"]["reason"]
        elif st.get("terminated"):
            t = st["terminated"]
            reason = (
                f"Signal:{t['signal']}" if t.get("signal") else f"ExitCode:{t.get('exitCode', 0)}"
            )
        elif cs.get("ready") and st.get("running"):
            has_running = True
            ready += 1
    if reason == "Completed" and has_running:
        reason = "Running" if cond_true(status.get("conditions"), "Ready") else "NotReady"
    if pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    rs = str(restarts)
    if restarts and last_restart:
        rs = f"{restarts} ({human_duration(now - last_restart)} ago)"
    ip = status.get("podIP") or "<none>"
    return [
        pod["metadata"]["name"],
        f"{ready}/{total}",
        reason,
        rs,
        _age(pod, now),
        ip,
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        "<none>",
    ]


def job_row(job: dict, now: float) -> list[Any]:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    succeeded = status.get("succeeded", 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    elif (spec.get("parallelism") or 0) > 1:
        completions = f"{succeeded}/1 of {spec['parallelism']}"
    else:
        completions = f"{succeeded}/1"
    st, ct = parse_time(status.get("startTime")), parse_time(status.get("completionTime"))
    dur = "" if st is None else human_duration((ct if ct is not None else now) - st)
    conds = status.get("conditions")
    if cond_true(conds, "Complete"):
        state = "Complete"
    elif cond_true(conds, "Failed"):
        state = "Failed"
    elif job["metadata"].get("deletionTimestamp"):
        state = "Terminating"
    elif cond_true(conds, "Suspended"):
        state = "Suspended"
    elif cond_true(conds, "FailureTarget"):
        state = "FailureTarget"
    else:
        state = "Running"
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    return [
        job["metadata"]["name"],
        state,
        completions,
        dur,
        _age(job, now),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        format_label_selector(spec.get("selector")),
    ]


def event_row(ev: dict, now: float) -> list[Any]:
    first = parse_time(ev.get("firstTimestamp"))
    first_s = human_duration(now - first) if first else None
    if first_s is None:
        et = parse_time(ev.get("eventTime"))
        first_s = human_duration(now - et) if et else "<unknown>"
    last = parse_time(ev.get("lastTimestamp"))
    last_s = human_duration(now - last) if last else first_s
    count = ev.get("count") or 0
    series = ev.get("series")
    if series:
        lo = parse_time(series.get("lastObservedTime"))
        last_s = human_duration(now - lo) if lo else "<unknown>"
        count = series.get("count", 0)
    elif count == 0:
        count = 1
    io = ev.get("involvedObject") or {}
    target = (
        f"{io.get('kind', '').lower()}/{io['name']}"
        if io.get("name")
        else io.get("kind", "").lower()
    )
    src = ev.get("source") or {}
    comp = src.get("component") or ev.get("reportingComponent") or ""
    host = src.get("host") or ev.get("reportingInstance") or ""
    source = f"{comp}, {host}" if host and src.get("component") else comp
    return [
        last_s,
        ev.get("type", ""),
        ev.get("reason", ""),
        target,
        io.get("fieldPath", ""),
        source,
        (ev.get("message") or "").strip(),
        first_s,
        count,
        ev["metadata"]["name"],
    ]


def node_row(node: dict, now: float) -> list[Any]:
    status = node.get("status") or {}
    ready = find_condition(status.get("conditions"), "Ready")
    state = "Ready" if ready and ready.get("status") == "True" else "NotReady"
    roles = sorted(
        k.split("/", 1)[1]
        for k in (node["metadata"].get("labels") or {})
        if k.startswith("node-role.kubernetes.io/")
    )
    info = status.get("nodeInfo") or {}
    internal = [
        a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"
    ]
    return [
        node["metadata"]["name"],
        state,
        ",".join(roles) or "<none>",
        _age(node, now),
        info.get("kubeletVersion", ""),
        internal[0] if internal else "<none>",
        "<none>",
        info.get("osImage", ""),
        info.get("kernelVersion", ""),
        info.get("containerRuntimeVersion", ""),
    ]


def table_row(store: str, obj: dict, now: float) -> list[Any]:
    name = obj["metadata"]["name"]
    if store == "pods":
        return pod_row(obj, now)
    if store == "jobs":
        return job_row(obj, now)
    if store == "events":
        return event_row(obj, now)
    if store == "nodes":
        return node_row(obj, now)
    if store == "namespaces":
        return [name, (obj.get("status") or {}).get("phase", ""), _age(obj, now)]
    if store == "runtimeclasses":
        return [name, obj.get("handler", ""), _age(obj, now)]
    if store == "configmaps":
        return [name, len(obj.get("data") or {}) + len(obj.get("binaryData") or {}), _age(obj, now)]
    if store == "secrets":
        return [name, obj.get("type", ""), len(obj.get("data") or {}), _age(obj, now)]
    if store == "networkpolicies":
        return [
            name,
            format_label_selector((obj.get("spec") or {}).get("podSelector"))
            if (obj.get("spec") or {}).get("podSelector")
            else "<none>",
            _age(obj, now),
        ]
    return [name, obj["metadata"].get("creationTimestamp")]


def table_columns(store: str) -> list[dict]:
    return TABLE_COLUMNS.get(store) or [
        _NAME_COL,
        _col(
            "Created At",
            "CreationTimestamp is a timestamp representing the server time "
            "when this object was created.",
            0,
            "date",
        ),
    ]


# --------------------------------------------------------------------------
# events.k8s.io/v1 <-> core/v1 conversion
# --------------------------------------------------------------------------


def core_event_to_v1(ev: dict) -> dict:
    out: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "events.k8s.io/v1",
        "metadata": ev["metadata"],
        "eventTime": ev.get("eventTime"),
    }
    for src, dst in (
        ("reportingComponent", "reportingController"),
        ("reportingInstance", "reportingInstance"),
        ("action", "action"),
        ("reason", "reason"),
        ("type", "type"),
        ("series", "series"),
        ("related", "related"),
    ):
        if ev.get(src) not in (None, ""):
            out[dst] = ev[src]
    out["regarding"] = ev.get("involvedObject") or {}
    if ev.get("message"):
        out["note"] = ev["message"]
    if ev.get("source") is not None:
        out["deprecatedSource"] = ev["source"]
    if ev.get("firstTimestamp"):
        out["deprecatedFirstTimestamp"] = ev["firstTimestamp"]
    if ev.get("lastTimestamp"):
        out["deprecatedLastTimestamp"] = ev["lastTimestamp"]
    if ev.get("count"):
        out["deprecatedCount"] = ev["count"]
    return out


def v1_event_to_core(ev: dict) -> dict:
    out: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": ev.get("metadata") or {},
        "involvedObject": ev.get("regarding") or {},
        "reason": ev.get("reason", ""),
        "message": ev.get("note", ""),
        "source": ev.get("deprecatedSource") or {},
        "firstTimestamp": ev.get("deprecatedFirstTimestamp"),
        "lastTimestamp": ev.get("deprecatedLastTimestamp"),
        "type": ev.get("type", ""),
        "eventTime": ev.get("eventTime"),
        "reportingComponent": ev.get("reportingController", ""),
        "reportingInstance": ev.get("reportingInstance", ""),
    }
    if ev.get("deprecatedCount"):
        out["count"] = ev["deprecatedCount"]
    for k in ("action", "series", "related"):
        if ev.get(k):
            out[k] = ev[k]
    return out


# --------------------------------------------------------------------------
# OpenAPI documents
# --------------------------------------------------------------------------


def _pb_field(num: int, payload: bytes) -> bytes:
    """Length-delimited protobuf field (wire type 2)."""
    key = (num << 3) | 2
    out = bytearray()
    for value in (key, len(payload)):
        while True:
            b = value & 0x7F
            value >>= 7
            if value:
                out.append(b | 0x80)
            else:
                out.append(b)
                break
    return bytes(out) + payload


def openapi_v2_protobuf(version: str) -> bytes:
    """A minimal gnostic openapi_v2.Document: swagger, info, empty paths/definitions."""
    info = _pb_field(1, b"Kubernetes") + _pb_field(2, (f"v{version}.0").encode())
    return _pb_field(1, b"2.0") + _pb_field(2, info) + _pb_field(8, b"") + _pb_field(9, b"")


def openapi_v3_doc(group: str, version: str, server_version: str) -> dict:
    params = [
        {
            "name": "dryRun",
            "in": "query",
            "description": "When present, indicates that modifications should not be persisted.",
            "schema": {"type": "string", "uniqueItems": True},
        },
        {
            "name": "fieldManager",
            "in": "query",
            "description": "fieldManager is a name associated "
            "with the actor or entity that is making these changes.",
            "schema": {"type": "string", "uniqueItems": True},
        },
        {
            "name": "fieldValidation",
            "in": "query",
            "description": "fieldValidation instructs the "
            "server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or "
            "duplicate fields. Valid values are: Ignore, Warn, Strict.",
            "schema": {"type": "string", "uniqueItems": True},
        },
    ]
    paths: dict[str, Any] = {}
    for r in RESOURCES:
        if r.group != group or r.version != version:
            continue
        prefix = "/" + r.gv_path
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        if r.namespaced:
            coll = f"{prefix}/namespaces/{{namespace}}/{r.plural}"
        else:
            coll = f"{prefix}/{r.plural}"
        item = coll + "/{name}"

        def op(
            action: str, desc: str, extra: list | None = None
        ) -> dict:  # called in this turn only
            return {
                "description": desc,
                "operationId": f"{action}{r.kind}",  # noqa: B023
                "tags": [r.gv_path.replace("/", "_")],  # noqa: B023
                "parameters": list(params) + list(extra or []),
                "responses": {"200": {"description": "OK"}, "401": {"description": "Unauthorized"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,  # noqa: B023
            }

        paths[coll] = {
            "get": op("list", f"list or watch objects of kind {r.kind}"),
            "post": op("post", f"create a {r.kind}"),
        }
        paths[item] = {
            "get": op("get", f"read the specified {r.kind}"),
            "put": op("put", f"replace the specified {r.kind}"),
            "patch": op(
                "patch",
                f"partially update the specified {r.kind}",
                [
                    {
                        "name": "force",
                        "in": "query",
                        "schema": {"type": "boolean", "uniqueItems": True},
                    }
                ],
            ),
            "delete": op("delete", f"delete a {r.kind}"),
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": f"v{server_version}.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


# --------------------------------------------------------------------------
# JSON patch helpers
# --------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return clone(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "conditions": "type",
    "ownerReferences": "uid",
    "containerStatuses": "name",
    "ports": "containerPort",
}


def strategic_merge_patch(target: Any, patch: Any, key: str = "") -> Any:
    """A practical subset of strategic merge patch (merge keys, $patch, $deleteFromPrimitiveList)."""
    if isinstance(patch, list) and isinstance(target, list) and key in _MERGE_KEYS:
        mk = _MERGE_KEYS[key]
        out = [clone(x) for x in target]
        for item in patch:
            if not isinstance(item, dict):
                continue
            directive = item.get("$patch")
            idx = next(
                (i for i, x in enumerate(out) if isinstance(x, dict) and x.get(mk) == item.get(mk)),
                None,
            )
            if directive == "delete":
                if idx is not None:
                    out.pop(idx)
                continue
            clean = {k: v for k, v in item.items() if k != "$patch"}
            if idx is None:
                out.append(clean)
            else:
                out[idx] = strategic_merge_patch(out[idx], clean)
        return out
    if not isinstance(patch, dict):
        return clone(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    for k, v in patch.items():
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            out[field] = [x for x in (out.get(field) or []) if x not in v]
            continue
        if k.startswith("$setElementOrder/") or k == "$patch" or k.startswith("$retainKeys"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge_patch(out.get(k), v, k)
    return out


def json_patch(target: Any, ops: list[dict]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, move, copy)."""
    doc = clone(target)

    def split(path: str) -> list[str]:
        return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]

    def parent(path: str) -> tuple[Any, str]:
        parts = split(path)
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    for op in ops:
        kind = op.get("op")
        if kind in ("add", "replace", "test"):
            par, last = parent(op["path"])
            if kind == "test":
                cur = par[int(last)] if isinstance(par, list) else par.get(last)
                if cur != op.get("value"):
                    raise err_bad_request(
                        "the server rejected our request due to an error in our request"
                    )
                continue
            if isinstance(par, list):
                if last == "-":
                    par.append(op["value"])
                elif kind == "add":
                    par.insert(int(last), op["value"])
                else:
                    par[int(last)] = op["value"]
            else:
                par[last] = op["value"]
        elif kind == "remove":
            par, last = parent(op["path"])
            if isinstance(par, list):
                par.pop(int(last))
            else:
                par.pop(last)
        elif kind in ("move", "copy"):
            fpar, flast = parent(op["from"])
            val = fpar[int(flast)] if isinstance(fpar, list) else fpar[flast]
            if kind == "move":
                if isinstance(fpar, list):
                    fpar.pop(int(flast))
                else:
                    fpar.pop(flast)
            par, last = parent(op["path"])
            if isinstance(par, list):
                par.insert(len(par) if last == "-" else int(last), clone(val))
            else:
                par[last] = clone(val)
    return doc


# --------------------------------------------------------------------------
# HTTP front end
# --------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    """Thin adapter: every method is handled by ApiServer.handle."""

    protocol_version = "HTTP/1.1"
    server_version = "kube-emulator"
    sys_version = ""
    # Go sets TCP_NODELAY on every connection, as the API server's are: without it an answer whose
    # body follows its headers in a second write waited for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence
        pass

    def setup(self) -> None:
        super().setup()
        self.server.api.connections.add(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api.connections.discard(self.connection)  # type: ignore[attr-defined]

    def send_response(self, code: int, message: str | None = None) -> None:
        # The request log notes the status before a byte of the answer leaves: a client may read
        # the answer and exit before the handler returns, and whoever reads the log then must
        # already find the status (a test on a loaded machine found None).
        entry = getattr(self, "request_entry", None)
        if entry is not None and entry.get("status") is None:
            entry["status"] = code
        super().send_response(code, message)

    def _dispatch(self) -> None:
        self.server.api.handle(self)  # type: ignore[attr-defined]

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _dispatch


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-request (kubectl stopped, a proxy's connection reset as its tool or
        this emulator stops) is no error of the server's: say nothing, as the API server does.
        Anything else is printed, traceback and all."""
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLEOFError)):
            return
        super().handle_error(request, client_address)


def read_body(h: _Handler) -> bytes:
    """A request's body, of a Content-Length or chunked (as kubectl sends a body it streams,
    e.g. `kubectl delete --raw PATH -f -`)."""
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        chunks = []
        while True:
            size = int(h.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (
                    b"\r\n",
                    b"\n",
                    b"",
                ):  # trailers, then the blank line
                    pass
                return b"".join(chunks)
            chunks.append(h.rfile.read(size))
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length else b""


def send_bytes(
    h: _Handler, code: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
) -> int:
    """One whole response (no body for HEAD); returns the status code for the request log."""
    h.send_response(code)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.send_header("Cache-Control", "no-cache, private")
    h.send_header("Audit-Id", str(uuid.uuid4()))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(data)
    h.wfile.flush()
    return code


def send_json(
    h: _Handler,
    code: int,
    obj: Any,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> int:
    """One whole response of a JSON document (or bytes already encoded)."""
    data = json.dumps(obj, separators=(",", ":")).encode() if not isinstance(obj, bytes) else obj
    return send_bytes(h, code, data, content_type, headers)


def start_chunked(h: _Handler, content_type: str) -> None:
    """The headers of a streamed response (a watch, a followed log)."""
    h.send_response(200)
    h.send_header("Content-Type", content_type)
    h.send_header("Transfer-Encoding", "chunked")
    h.send_header("Cache-Control", "no-cache, private")
    h.end_headers()
    h.wfile.flush()


def write_chunk(h: _Handler, data: bytes) -> None:
    """One chunk of a streamed response, sent at once (nothing for empty data)."""
    if not data:
        return
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.flush()


def client_gone(h: _Handler) -> bool:
    """True when the client closed its side (detects abandoned watches/follows)."""
    try:
        readable, _, _ = select.select([h.connection], [], [], 0)
        if readable:
            return h.connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
    return False


def end_chunked(h: _Handler) -> None:
    """The last chunk of a streamed response, if the client is still there to take it."""
    try:
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
    except OSError:
        pass


# --------------------------------------------------------------------------
# The read path: a watch cache that may lag or stall, slow lists, paging
# --------------------------------------------------------------------------

# storage/etcd3: the answer to a continue token whose revision was compacted.
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token "
    "in this response to retrieve the remainder of the results. Continuing with the "
    "provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may "
    "show up in the list."
)
LIST_SNAPSHOTS_KEPT = 16  # paged lists whose first page is remembered (older ones: 410)
READ_TIMELINE_KEPT = 200000  # store events whose time the watch cache's lag is computed from


class ExpiredContinue(ApiError):
    """410 Expired for a compacted continue token; like etcd3 it offers a token that goes on
    inconsistently (from the newest revision) after the same key."""

    def __init__(self, token: str):
        super().__init__(410, "Expired", CONTINUE_EXPIRED)
        self.token = token

    def status(self) -> dict:
        body = super().status()
        body["metadata"] = {"continue": self.token}
        return body


def check_faults(faults: dict) -> None:
    """Reject a fault the emulator does not know, and a read-path fault that is not seconds or {store: seconds}."""
    unknown = sorted(set(faults) - set(FAULTS) - set(READ_PATH_FAULTS))
    if unknown:
        known = ", ".join(sorted(set(FAULTS) | set(READ_PATH_FAULTS)))
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; the emulator knows {known}")
    offsets = faults.get("node_clock_offset")
    if offsets is not None and (
        not isinstance(offsets, dict)
        or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in offsets.values()
        )
    ):
        raise ValueError(f"fault node_clock_offset takes {{node: seconds}}, not {offsets!r}")
    for name in READ_PATH_FAULTS:
        value = faults.get(name)
        if value is None:
            continue
        amounts = list(value.values()) if isinstance(value, dict) else [value]
        if not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) and a >= 0 for a in amounts
        ):
            raise ValueError(f"fault {name} takes seconds or {{resource: seconds}}, not {value!r}")


class Faults:
    """The faults in force, validated when set, and the one rule for whom each applies to.

    A fault that names pods applies to every pod when it is True, else to the pods whose
    creation index (0, 1, ...) it lists, as a list or as a dict's keys; a dict's value is that
    pod's setting. A fault measured in seconds may override a timing, and a read-path fault may
    give its seconds per resource.
    """

    def __init__(self, values: dict | None = None):
        values = clone(values or {})
        check_faults(values)
        check_lightweight(values.get("lightweight_kubelet"))
        self._values: dict[str, Any] = values
        self._lock = threading.Lock()
        now = time.time()
        self.set_at: dict[str, float] = {name: now for name in values}

    def set(self, **values: Any) -> None:
        """Set faults (None clears one), noting when: a stall runs from the moment it is set."""
        check_faults(values)
        check_lightweight(values.get("lightweight_kubelet"))
        with self._lock:
            for name, value in values.items():
                self.set_at[name] = time.time()
                if value is None:
                    self._values.pop(name, None)
                else:
                    self._values[name] = clone(value)

    def value(self, name: str) -> Any:
        """The fault's value as set, None when it is not set."""
        return self._values.get(name)

    def on(self, name: str) -> bool:
        return bool(self._values.get(name))

    def applies(self, name: str, pod_index: int | None) -> bool:
        """Does the fault hit the pod created `pod_index`-th (None: a pod the emulator did not number)?"""
        value = self._values.get(name)
        if value is True:
            return True
        return pod_index is not None and pod_index in self._indexes(value)

    def for_pod(self, name: str, pod_index: int | None) -> Any:
        """The setting a per-pod fault given as {index: setting} holds for this pod, else None."""
        value = self._values.get(name)
        if not isinstance(value, dict) or pod_index is None:
            return None
        return {int(k): v for k, v in value.items()}.get(pod_index)

    @staticmethod
    def _indexes(value: Any) -> builtins.set[int]:
        if isinstance(value, (dict, list, tuple, set)):
            return {int(x) for x in value}
        return set()

    def timing(self, name: str, default: float, resource: str | None = None) -> float:
        """The seconds the fault sets (for `resource`, when it names resources), else `default`."""
        value = self._values.get(name)
        if isinstance(value, dict):
            value = value.get(resource)
        return default if value is None else float(value)

    def lightweight(self) -> dict[str, float] | None:
        """The lightweight kubelet's timing when it is selected (scale tests only), else None."""
        value = self._values.get("lightweight_kubelet")
        if not value:
            return None
        return dict(LIGHTWEIGHT_TIMING, **(value if isinstance(value, dict) else {}))

    def take_request_error(self, request: str) -> int | None:
        """The status the request (path and query) fails with under api_errors, counting it, else None."""
        with self._lock:
            errors = self._values.get("api_errors")
            if (
                not errors
                or errors.get("count", 0) <= 0
                or (errors.get("match") or "") not in request
            ):
                return None
            errors["count"] -= 1
            return int(errors.get("status", 503))


def encode_continue(rv: int, key: tuple[str, str], snapshot: str = "") -> str:
    token: dict[str, Any] = {"rv": rv, "start": list(key)}
    if snapshot:
        token["snap"] = snapshot
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")


def decode_continue(token: str) -> dict:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode() + b"==").decode())
        data["start"] = tuple(data["start"])
        data["rv"] = int(data["rv"])
    except Exception:
        raise err_bad_request("continue key is not valid: illegal base64 data") from None
    return data


def too_large_resource_version(wanted: int, current: int, retry_after: float) -> ApiError:
    """storage.NewTooLargeResourceVersionError: a 504 Timeout with its own cause."""
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {wanted}, current: {current}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": int(retry_after),
        },
    )


class ReadPath:
    """How reads see the store (etcd): through a watch cache, which may lag or stall.

    The watch cache is a delayed view of the store's event stream, progress
    notifications included, so its resourceVersion follows every resource's
    writes.  Watches deliver what the cache has taken in.  A list with
    resourceVersionMatch=NotOlderThan is answered once the cache has reached that
    version (else 504 after fresh_block); its items are the store's current ones,
    never older than asked.  A consistent list (no resourceVersion) reads the
    store.  Continue pages come from the snapshot of their first page, as etcd
    reads them at the first page's revision.
    """

    def __init__(self, emu: Emulator):
        self.emu = emu
        self.times: list[float] = []
        self.rvs: list[int] = []
        self.base_rv = emu.store.rv
        # token -> (when kept, the items, whether they are in list order yet)
        self.snapshots: dict[str, tuple[float, list[dict], bool]] = {}
        self.lock = threading.Lock()
        emu.store.listeners.append(self.on_store_event)

    # -- the watch cache ----------------------------------------------------
    def on_store_event(self, etype: str, store: str, obj: dict) -> None:
        """Called with the store's lock held, in resourceVersion order."""
        self.times.append(time.time())
        self.rvs.append(int(obj["metadata"]["resourceVersion"]))
        if len(self.times) > READ_TIMELINE_KEPT:
            drop = len(self.times) - READ_TIMELINE_KEPT // 2
            self.base_rv = self.rvs[drop - 1]
            del self.times[:drop]
            del self.rvs[:drop]

    def timing(self, key: str) -> float:
        return float(self.emu.timing.get(key, READ_PATH_TIMING[key]))

    def cache_rv(self, store: str) -> int:
        """The resourceVersion the watch cache of `store` has reached."""
        now = time.time()
        faults = self.emu.faults
        delay = faults.timing("watch_delay", 0.0, store)
        view = now - delay
        stall = faults.timing("watch_stall", 0.0, store)
        since = faults.set_at.get("watch_stall", 0.0)
        if stall and since <= now < since + stall:
            view = min(view, since - delay)
        with self.emu.store.lock:
            if view >= now:
                return self.emu.store.rv
            i = bisect.bisect_right(self.times, view)
            return self.rvs[i - 1] if i else self.base_rv

    def visible(
        self, store: str, events: list[tuple[int, str, str, dict]]
    ) -> tuple[list[tuple[int, str, str, dict]], bool]:
        """The events (in rv order) a watch of `store` may deliver now, and whether some wait."""
        reached = self.cache_rv(store)
        if not events or events[-1][0] <= reached:
            return events, False
        if events[0][0] > reached:
            return [], True
        return events[: bisect.bisect_right([e[0] for e in events], reached)], True

    # -- lists --------------------------------------------------------------
    def before_list(self, info: ResourceInfo, query: dict[str, str]) -> None:
        """A slow list's delay, the ListOptions rules, and waiting for a NotOlderThan version."""
        latency = self.emu.faults.timing("list_latency", 0.0, info.store)
        if latency > 0:
            limit = parse_go_duration(query.get("timeout"))
            if limit is not None and limit < latency:
                time.sleep(limit)
                raise ApiError(
                    504,
                    "Timeout",
                    "Timeout: request did not complete within requested timeout "
                    "- context deadline exceeded",
                    {},
                )
            time.sleep(latency)
        rv = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        token = query.get("continue", "")
        causes = []
        if match and not rv:
            causes.append(
                (
                    "resourceVersionMatch",
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if match and token:
            causes.append(
                (
                    "resourceVersionMatch",
                    "FieldValueForbidden",
                    "Forbidden: resourceVersionMatch is forbidden when continue is provided",
                )
            )
        if match and match not in ("Exact", "NotOlderThan"):
            causes.append(
                (
                    "resourceVersionMatch",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan"',
                )
            )
        if causes:
            raise err_invalid(ListOptionsInfo, "", causes)
        if token and rv not in ("", "0"):
            raise err_bad_request("specifying resource version is not allowed when using continue")
        # Without a match, a resourceVersion means "not older than" unless the list is paged.
        not_older_than = match == "NotOlderThan" or (
            not match and rv not in ("", "0") and not int(query.get("limit") or 0)
        )
        if not not_older_than:
            return
        try:
            wanted = int(rv)
        except ValueError:
            raise err_bad_request(f'invalid resource version "{rv}"') from None
        deadline = time.time() + self.timing("fresh_block")
        while True:
            reached = self.cache_rv(info.store)
            if reached >= wanted:
                return
            if time.time() >= deadline:
                raise too_large_resource_version(wanted, reached, self.timing("fresh_retry_after"))
            time.sleep(0.02)

    def page(
        self,
        info: ResourceInfo,
        query: dict[str, str],
        current: Callable[[], tuple[list[dict], str]],
    ) -> tuple[list[dict], str, str | None, int | None]:
        """One page of a list: (items, resourceVersion, continue token, remainingItemCount)."""
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        snapshot = ""
        start = 0
        if not token:
            items, rv = current()
            if 0 < limit < len(items):
                # The first page alone, not the whole list sorted: etcd and the watch cache find
                # a page of a namespace's tens of thousands of events in milliseconds.
                page = heapq.nsmallest(limit, items, key=list_order)
                return self._first_page(items, rv, page, query)
            items.sort(key=list_order)
        else:
            data = decode_continue(token)
            if data["rv"] < 0:  # going on after an expiry: the newest revision, no snapshot
                items, rv = current()
                items.sort(key=list_order)
            else:
                snapshot = data.get("snap", "")
                with self.lock:
                    kept = self.snapshots.get(snapshot)
                ttl = self.emu.faults.timing(
                    "continue_ttl", self.timing("continue_ttl"), info.store
                )
                if (
                    kept is None
                    or time.time() - kept[0] > ttl
                    or data["rv"] < self.emu.store.compacted_rv
                ):
                    raise ExpiredContinue(encode_continue(-1, data["start"]))
                items, rv = self._sorted_snapshot(snapshot, kept), str(data["rv"])
            start = bisect.bisect_right(
                [(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in items],
                data["start"],
            )
        page = items[start : start + limit] if limit > 0 else items[start:]
        if limit <= 0 or start + limit >= len(items):
            return page, rv, None, None
        if token and data["rv"] < 0:
            next_rv = -1
        else:
            next_rv = int(rv)
            if not snapshot:
                snapshot = self._keep(items, True)
        return (
            page,
            rv,
            self._continue(next_rv, page, snapshot),
            self._remaining(query, len(items) - start - limit),
        )

    def _first_page(
        self, items: list[dict], rv: str, page: list[dict], query: dict[str, str]
    ) -> tuple[list[dict], str, str | None, int | None]:
        """A list's first page of several: the rest kept, unsorted, for its continue token."""
        snapshot = self._keep(items, False)
        return (
            page,
            rv,
            self._continue(int(rv), page, snapshot),
            self._remaining(query, len(items) - len(page)),
        )

    def _sorted_snapshot(self, snapshot: str, kept: tuple[float, list[dict], bool]) -> list[dict]:
        """A kept list's items in list order: sorted by the first page after the first that reads
        them, and kept so, not sorted again for each page."""
        kept_at, items, ordered = kept
        if ordered:
            return items
        items = sorted(items, key=list_order)  # a copy: another page may be reading the kept one
        with self.lock:
            if snapshot in self.snapshots:
                self.snapshots[snapshot] = (kept_at, items, True)
        return items

    def _keep(self, items: list[dict], ordered: bool) -> str:
        """Keep a list's items (`ordered`: sorted already) for the pages after its first."""
        snapshot = uuid.uuid4().hex[:12]
        with self.lock:
            self.snapshots[snapshot] = (time.time(), items, ordered)
            while len(self.snapshots) > LIST_SNAPSHOTS_KEPT:
                del self.snapshots[next(iter(self.snapshots))]
        return snapshot

    @staticmethod
    def _continue(next_rv: int, page: list[dict], snapshot: str) -> str:
        last = page[-1]["metadata"]
        return encode_continue(next_rv, (last.get("namespace", ""), last["name"]), snapshot)

    @staticmethod
    def _remaining(query: dict[str, str], remaining: int) -> int | None:
        # etcd counts what is left only when nothing is filtered out
        unfiltered = not query.get("labelSelector") and not query.get("fieldSelector")
        return remaining if unfiltered else None


def list_order(obj: dict) -> tuple[str, str]:
    """The order of a list's items: etcd's, by key (namespace, then name)."""
    metadata = obj["metadata"]
    return metadata.get("namespace", ""), metadata["name"]


def to_version(info: ResourceInfo, obj: dict) -> dict:
    """Stored (canonical) object -> the representation of ``info``'s group/version."""
    if info.group == "events.k8s.io":
        return core_event_to_v1(obj)
    obj = dict(obj)
    obj["kind"], obj["apiVersion"] = info.kind, info.api_version
    # JSON field order like the real server: kind/apiVersion first
    return dict(
        [("kind", obj.pop("kind")), ("apiVersion", obj.pop("apiVersion"))] + list(obj.items())
    )


class WatchView:
    """What one watch shows its client: the objects its namespace and selectors match, which of
    them the client has seen, and how each event is written (the object, its metadata or a Table)."""

    def __init__(
        self,
        store: Store,
        render: Representation,
        info: ResourceInfo,
        ns: str | None,
        query: dict[str, str],
        accept: str,
    ):
        self.store = store
        self.render = render
        self.info = info
        self.query = query
        self.ns_filter = ns if info.namespaced else None
        self.lsel = LabelSelector(query.get("labelSelector", ""))
        self.fsel = FieldSelector(query.get("fieldSelector", ""))
        self.mode = render.wants(accept)
        self.first_table = True
        self.seen: set[tuple[str, str]] = set()  # (namespace, name) the client holds

    def matches(self, obj: dict) -> bool:
        if self.ns_filter and obj["metadata"].get("namespace") != self.ns_filter:
            return False
        return self.lsel.matches(obj["metadata"].get("labels")) and self.fsel.matches(obj)

    def start(self, rv_param: str, send_initial: bool) -> tuple[list[dict], int, bool]:
        """The initial objects to send, the resourceVersion to follow from, and whether that one is
        compacted away (410)."""
        store = self.store
        initial: list[dict] = []
        with store.lock:
            if send_initial or rv_param in ("", "0"):
                objs, cursor = store.list(self.info.store, self.ns_filter)
                initial = [o for o in objs if self.matches(o)]
                for o in initial:
                    self.seen.add((o["metadata"].get("namespace", ""), o["metadata"]["name"]))
                return initial, cursor, False
            try:
                cursor = int(rv_param)
            except ValueError:
                raise err_bad_request(f'invalid resource version "{rv_param}"') from None
            if cursor < store.compacted_rv:
                return [], cursor, True
            objs, _ = store.list(self.info.store, self.ns_filter)
            for o in objs:
                if self.matches(o) and int(o["metadata"]["resourceVersion"]) <= cursor:
                    self.seen.add((o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            return [], cursor, False

    def translate(self, events: list[tuple[int, str, str, dict]]) -> bytes:
        """The store's events as this client sees them: an object that comes to match is ADDED, one
        that stops matching is DELETED."""
        out = bytearray()
        for _, etype, sname, obj in events:
            if sname != self.info.store:
                continue
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            ok = self.matches(obj)
            if etype == "ADDED":
                if ok:
                    self.seen.add(key)
                    out += self.encode("ADDED", obj)
            elif etype == "MODIFIED":
                if ok:
                    out += self.encode("MODIFIED" if key in self.seen else "ADDED", obj)
                    self.seen.add(key)
                elif key in self.seen:
                    self.seen.discard(key)
                    out += self.encode("DELETED", obj)
            elif etype == "DELETED":
                if key in self.seen or ok:
                    self.seen.discard(key)
                    out += self.encode("DELETED", obj)
        return bytes(out)

    def encode(self, etype: str, obj: dict) -> bytes:
        if etype in ("BOOKMARK", "ERROR"):
            o = obj
        elif self.mode == "table":
            o = self.render.table(
                self.info,
                [obj],
                self.query,
                obj["metadata"]["resourceVersion"],
                headers=self.first_table,
            )
            self.first_table = False
        elif self.mode == "metadata":
            o = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        else:
            o = to_version(self.info, obj)
        return json.dumps({"type": etype, "object": o}, separators=(",", ":")).encode() + b"\n"

    def bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        metadata: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        kind = self.info.kind if self.mode != "table" else "Table"
        api = self.info.api_version if self.mode != "table" else "meta.k8s.io/v1"
        return (
            json.dumps(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": kind, "apiVersion": api, "metadata": metadata},
                },
                separators=(",", ":"),
            ).encode()
            + b"\n"
        )


NOT_FOUND_MESSAGE = "the server could not find the requested resource"
NOT_ALLOWED_MESSAGE = "the server does not allow this method on the requested resource"

# The body of an injected error status code, worded as the real server's.
INJECTED_ERRORS = {
    500: ("InternalError", 'an error on the server ("") has prevented the request from succeeding'),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: (
        "Timeout",
        "the server was unable to return a response in the time allotted, "
        "but may still be processing the request",
    ),
    429: (
        "TooManyRequests",
        "the server has received too many requests and has asked us to try again later",
    ),
    # As a validating admission webhook that denies the object answers (a registry policy, here).
    403: (
        "Forbidden",
        'admission webhook "registries.policy.example" denied the request: image is '
        "not from an allowed registry",
    ),
}


def not_found() -> ApiError:
    return ApiError(404, "NotFound", NOT_FOUND_MESSAGE, {})


def not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", NOT_ALLOWED_MESSAGE, {})


def is_true(value: str | None) -> bool:
    """A boolean query parameter as the API server reads it."""
    return value in ("true", "1", "True")


class UserInfo:
    """An authenticated user: name, UID and groups, as authentication.k8s.io/v1 UserInfo."""

    def __init__(self, name: str, groups: list[str], rules: list[dict] | None = None):
        self.name = name
        self.uid = str(uuid.uuid5(uuid.NAMESPACE_URL, "kube-emulator-user:" + name))
        self.groups = list(groups) + ["system:authenticated"]
        self.rules = rules  # RBAC PolicyRules granted; None: everything (system:masters)

    def info(self) -> dict:
        return {"username": self.name, "uid": self.uid, "groups": list(self.groups)}


# What any authenticated user may do without a grant of its own: the bootstrap ClusterRoles
# system:discovery, system:public-info-viewer and system:basic-user.
BASIC_USER_RESOURCES = {
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
}
ADMIN_BASIC_AUTH = "Basic " + base64.b64encode(b"admin:emulator").decode()


class Authenticator:
    """Who sent a request: a bearer token names a user made with `add_user` (as a token file does),
    the admin's basic credentials (the emulator's own kubeconfig) name the admin, and a request
    with no credentials at all (the tests' own raw reads) is the admin's too; any other
    credentials answer 401 Unauthorized."""

    def __init__(self) -> None:
        self.admin = UserInfo("admin", ["system:masters"])
        self.tokens: dict[str, UserInfo] = {}

    def add(self, name: str, groups: list[str], rules: list[dict] | None) -> str:
        token = "emulator-" + uuid.uuid4().hex
        self.tokens[token] = UserInfo(name, groups, rules)
        return token

    def authenticate(self, header: str | None) -> UserInfo:
        if not header or header == ADMIN_BASIC_AUTH:
            return self.admin
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and credential.strip() in self.tokens:
            return self.tokens[credential.strip()]
        raise ApiError(401, "Unauthorized", "Unauthorized", {})


class RequestAttributes:
    """What RBAC decides on (k8s.io/apiserver RequestInfoFactory): verb, API group, resource,
    subresource, namespace and name; `resource` None for a path outside the resource APIs."""

    # Subresources of a namespace itself, not resources inside it.
    NAMESPACE_SUBRESOURCES = ("status", "finalize")

    def __init__(self, method: str, path: str, is_watch: bool):
        self.group, self.resource, self.subresource, self.namespace, self.name = (
            "",
            None,
            "",
            "",
            "",
        )
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            self.group, rest = parts[1], parts[3:]
        else:
            rest = []
        if rest and rest[0] == "namespaces" and len(rest) > 1:
            self.namespace = rest[1]
            if len(rest) > 2 and rest[2] not in self.NAMESPACE_SUBRESOURCES:
                rest = rest[2:]
        if rest:
            self.resource = rest[0]
            self.name = rest[1] if len(rest) > 1 else ""
            self.subresource = rest[2] if len(rest) > 2 else ""
        collection = {"GET": "list", "HEAD": "list", "POST": "create", "DELETE": "deletecollection"}
        one = {"GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        self.verb = (
            "watch" if is_watch else (one if self.name else collection).get(method, method.lower())
        )
        if self.subresource in ("eviction", "proxy") and method == "POST":
            self.verb = (
                "create"  # an Eviction is created on its pod's subresource; so is a POST proxied
            )

    def allowed_by(self, rules: list[dict]) -> bool:
        resource = self.resource + ("/" + self.subresource if self.subresource else "")
        return any(
            self.group in (r.get("apiGroups") or []) or "*" in (r.get("apiGroups") or [])
            for r in rules
            if (resource in (r.get("resources") or []) or "*" in (r.get("resources") or []))
            and (self.verb in (r.get("verbs") or []) or "*" in (r.get("verbs") or []))
        )

    def forbidden(self, user: str) -> ApiError:
        """403 worded as the API server's (responsewriters.forbiddenMessage)."""
        qualified_resource = self.resource + ("." + self.group if self.group else "")
        label = f'{qualified_resource} "{self.name}"' if self.name else qualified_resource
        resource = self.resource + ("/" + self.subresource if self.subresource else "")
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        details: dict[str, Any] = {"kind": self.resource}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        return ApiError(
            403,
            "Forbidden",
            f'{label} is forbidden: User "{user}" cannot {self.verb} resource "{resource}" in API '
            f'group "{self.group}" {scope}',
            details,
        )


class Authorizer:
    """RBAC's answer for a user: system:masters may do anything; any user may use the discovery
    paths and review itself; anyone else only what its rules grant."""

    @staticmethod
    def check(user: UserInfo, method: str, path: str, is_watch: bool) -> None:
        if user.rules is None:
            return
        attributes = RequestAttributes(method, path, is_watch)
        if (
            attributes.resource is None
            or (attributes.group, attributes.resource) in BASIC_USER_RESOURCES
        ):
            return
        if not attributes.allowed_by(user.rules):
            raise attributes.forbidden(user.name)


class SelfReview:
    """POST selfsubjectreviews (`kubectl auth whoami`): the request's own user, as
    authentication.k8s.io/v1 serves it from 1.28 and v1beta1 in 1.27; older servers have none."""

    def __init__(self, emu: Emulator):
        self.emu = emu

    def versions(self) -> list[str]:
        if self.emu.v >= (1, 28):
            return ["v1"]
        return ["v1beta1"] if self.emu.v >= (1, 27) else []

    def serve(self, h: _Handler, path: str, user: UserInfo) -> int | None:
        parts = [p for p in path.split("/") if p]
        if (
            len(parts) != 4
            or parts[:2] != ["apis", "authentication.k8s.io"]
            or parts[3] != "selfsubjectreviews"
            or parts[2] not in self.versions()
        ):
            return None
        if h.command != "POST":
            raise not_allowed()
        return send_json(
            h,
            201,
            {
                "kind": "SelfSubjectReview",
                "apiVersion": "authentication.k8s.io/" + parts[2],
                "metadata": {"creationTimestamp": fmt_time(self.emu.api_now())},
                "status": {"userInfo": user.info()},
            },
        )


class RequestFaults:
    """The faults a request meets before it is routed: latency, RBAC refusals and injected errors."""

    def __init__(self, emu: Emulator):
        self.emu = emu

    def answer(
        self, h: _Handler, path: str, query: dict[str, str], is_watch: bool, user: str = "admin"
    ) -> int | None:
        """Delay the request as the faults ask, and answer it when a fault refuses it (else None)."""
        faults = self.emu.faults
        latency = faults.timing("api_latency", 0.0)
        if latency > 0:
            limit = parse_go_duration(query.get("timeout")) if not is_watch else None
            if limit is not None and limit < latency:
                time.sleep(limit)
                raise ApiError(
                    504,
                    "Timeout",
                    "Timeout: request did not complete within requested timeout "
                    "- context deadline exceeded",
                    {},
                )
            time.sleep(latency)
        for resource in faults.value("forbidden") or ():
            # RBAC without a grant for this resource (core group, cluster scope), as the real message reads.
            found = re.search(rf"^/api/v1/{re.escape(resource)}(?:/([^/]+))?$", path)
            if found:
                verb = {"GET": "watch" if is_watch else ("get" if found.group(1) else "list")}.get(
                    h.command, h.command.lower()
                )
                named = resource if not found.group(1) else f'{resource} "{found.group(1)}"'
                message = (
                    f'{named} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                    'in API group "" at the cluster scope'
                )
                return send_json(
                    h, 403, ApiError(403, "Forbidden", message, {"kind": resource}).status()
                )
        code = faults.take_request_error(
            path
            + ("?" + "&".join(f"{key}={value}" for key, value in query.items()) if query else "")
        )
        if code is not None:
            reason, msg = INJECTED_ERRORS.get(
                code,
                (
                    "InternalError",
                    "an error on the server has prevented the request from succeeding",
                ),
            )
            return send_json(h, code, ApiError(code, reason, msg, {}).status())
        return None


class Discovery:
    """The server's own documents: health, version, API groups, resource lists and OpenAPI."""

    def __init__(self, api: ApiServer):
        self.api = api
        self.emu = api.emu

    def serve(self, h: _Handler, path: str, query: dict[str, str]) -> int | None:
        """Answer a request for one of these documents; None when the path names none of them."""
        if path in ("/healthz", "/readyz", "/livez"):
            return send_bytes(h, 200, b"ok", "text/plain; charset=utf-8")
        if path == "/version":
            return send_json(h, 200, self.version())
        if path == "/api":
            return send_json(
                h,
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.api.port}"}
                    ],
                },
            )
        if path == "/apis":
            return send_json(
                h,
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [self.api_group(g) for g in self.groups()],
                },
            )
        if path.startswith("/openapi"):
            return self.openapi(h, path, query)
        parts = [p for p in path.split("/") if p]
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in self.groups():
            return send_json(
                h, 200, dict(self.api_group(parts[1]), kind="APIGroup", apiVersion="v1")
            )
        if parts == ["api", "v1"]:
            return send_json(h, 200, self.resource_list("", "v1"))
        if len(parts) == 3 and parts[0] == "apis" and (parts[1], parts[2]) in GROUP_VERSIONS:
            return send_json(h, 200, self.resource_list(parts[1], parts[2]))
        return None

    def version(self) -> dict:
        major, minor = version_tuple(self.emu.server_version)
        return {
            "major": str(major),
            "minor": str(minor),
            "emulationMajor": str(major),
            "emulationMinor": str(minor),
            "minCompatibilityMajor": str(major),
            "minCompatibilityMinor": str(minor - 1),
            "gitVersion": f"v{major}.{minor}.0",
            "gitCommit": hex64(f"v{major}.{minor}.0")[:40],
            "gitTreeState": "clean",
            "buildDate": "2025-04-23T13:00:00Z",
            "goVersion": "go1.24.2",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    @staticmethod
    def groups() -> list[str]:
        out: list[str] = []
        for g, _ in GROUP_VERSIONS:
            if g and g not in out:
                out.append(g)
        return out

    @staticmethod
    def api_group(group: str) -> dict:
        versions = [
            {"groupVersion": f"{group}/{v}", "version": v} for g, v in GROUP_VERSIONS if g == group
        ]
        return {"name": group, "versions": versions, "preferredVersion": versions[0]}

    @staticmethod
    def resource_list(group: str, version: str) -> dict:
        res = []
        for r in RESOURCES:
            if r.group != group or r.version != version:
                continue
            item: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(VERBS),
                "storageVersionHash": base64.b64encode(
                    hashlib.sha256(r.api_version.encode() + r.plural.encode()).digest()[:8]
                ).decode(),
            }
            if r.short_names:
                item["shortNames"] = list(r.short_names)
            if r.categories:
                item["categories"] = list(r.categories)
            res.append(item)
            for sub, verbs in r.subresources.items():
                res.append(
                    {
                        "name": f"{r.plural}/{sub}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind if sub != "log" else "Pod",
                        "verbs": verbs,
                    }
                )
        gv = version if not group else f"{group}/{version}"
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": res}

    def openapi(self, h: _Handler, path: str, query: dict[str, str]) -> int:
        server_version = self.emu.server_version
        if path == "/openapi/v2":
            accept = h.headers.get("Accept", "")
            if "protobuf" in accept:
                return send_bytes(
                    h,
                    200,
                    openapi_v2_protobuf(server_version),
                    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                )
            return send_json(
                h,
                200,
                {
                    "swagger": "2.0",
                    "info": {"title": "Kubernetes", "version": f"v{server_version}.0"},
                    "paths": {},
                    "definitions": {},
                },
            )
        if path == "/openapi/v3":
            paths = {}
            for g, v in GROUP_VERSIONS:
                gvp = "api/v1" if not g else f"apis/{g}/{v}"
                doc = json.dumps(openapi_v3_doc(g, v, server_version), sort_keys=True).encode()
                digest = hashlib.sha512(doc).hexdigest().upper()[:128]
                paths[gvp] = {"serverRelativeURL": f"/openapi/v3/{gvp}?hash={digest}"}
            return send_json(h, 200, {"paths": paths})
        rest = path[len("/openapi/v3/") :]
        for g, v in GROUP_VERSIONS:
            gvp = "api/v1" if not g else f"apis/{g}/{v}"
            if rest == gvp:
                headers = {
                    "Cache-Control": "public, immutable",
                    "Etag": f'"{query.get("hash", "")}"',
                }
                data = json.dumps(openapi_v3_doc(g, v, server_version), sort_keys=True).encode()
                return send_bytes(h, 200, data, "application/json", headers)
        raise not_found()


class Representation:
    """How objects are written for a client: in the asked group/version, as metadata only, or as a Table."""

    def __init__(self, emu: Emulator):
        self.emu = emu

    @staticmethod
    def wants(accept: str) -> str:
        if "as=Table" in accept:
            return "table"
        if "as=PartialObjectMetadata" in accept:
            return "metadata"
        return "object"

    def single(self, info: ResourceInfo, obj: dict, accept: str, query: dict[str, str]) -> dict:
        mode = self.wants(accept)
        if mode == "table":
            return self.table(info, [obj], query, str(obj["metadata"].get("resourceVersion", "")))
        if mode == "metadata":
            return {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        return to_version(info, obj)

    def table(
        self,
        info: ResourceInfo,
        objs: builtins.list[dict],
        query: dict[str, str],
        rv: str,
        cont: str | None = None,
        headers: bool = True,
    ) -> dict:
        include = query.get("includeObject", "Metadata")
        now = self.emu.api_now()
        rows = []
        for o in objs:
            row: dict[str, Any] = {"cells": table_row(info.store, o, now)}
            if include == "Object":
                row["object"] = to_version(info, o)
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                }
            rows.append(row)
        metadata: dict[str, Any] = {"resourceVersion": rv}
        if cont:
            metadata["continue"] = cont
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
            "columnDefinitions": table_columns(info.store) if headers else None,
            "rows": rows,
        }

    def list(
        self,
        info: ResourceInfo,
        page: builtins.list[dict],
        rv: str,
        cont: str | None,
        remaining: int | None,
        query: dict[str, str],
        accept: str,
    ) -> dict:
        """One page of a list as the client asked for it."""
        mode = self.wants(accept)
        if mode == "table":
            return self.table(info, page, query, rv, cont)
        metadata: dict[str, Any] = {"resourceVersion": rv}
        if cont:
            metadata["continue"] = cont
            if remaining is not None:
                metadata["remainingItemCount"] = remaining
        if mode == "metadata":
            return {
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
                "items": [
                    {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o["metadata"],
                    }
                    for o in page
                ],
            }
        out_items = []
        for o in page:
            v = to_version(info, o)
            v.pop("kind", None)
            v.pop("apiVersion", None)
            out_items.append(v)
        return {
            "kind": info.kind + "List",
            "apiVersion": info.api_version,
            "metadata": metadata,
            "items": out_items,
        }


class WatchServer:
    """Serves watches: the initial objects, then the store's events as the watch cache lets them through."""

    def __init__(self, api: ApiServer):
        self.api = api
        self.emu = api.emu
        self.store = api.store

    def serve(
        self, h: _Handler, info: ResourceInfo, ns: str | None, query: dict[str, str], accept: str
    ) -> int:
        emu = self.emu
        view = WatchView(self.store, self.api.render, info, ns, query, accept)
        bookmarks = is_true(query.get("allowWatchBookmarks"))
        send_initial = is_true(query.get("sendInitialEvents"))
        rv_param = query.get("resourceVersion", "")
        if send_initial and query.get("resourceVersionMatch") != "NotOlderThan":
            raise err_invalid(
                ListOptionsInfo,
                "",
                [
                    (
                        "sendInitialEvents",
                        "FieldValueForbidden",
                        "Forbidden: sendInitialEvents is forbidden for watch unless the "
                        "resourceVersionMatch is set to NotOlderThan",
                    )
                ],
            )
        timeout = None
        if query.get("timeoutSeconds"):
            timeout = float(query["timeoutSeconds"])
        deadline = time.time() + (timeout if timeout is not None else 1800 + random.random() * 1800)
        initial, cursor, expired = view.start(rv_param, send_initial)
        start_chunked(h, "application/json")
        gen = self.api.generation
        try:
            if expired:
                emu.watches_expired += 1
                err = ApiError(
                    410,
                    "Expired",
                    f"too old resource version: {rv_param} ({self.store.compacted_rv})",
                )
                write_chunk(h, view.encode("ERROR", err.status()))
                end_chunked(h)
                return 200
            for o in initial:
                write_chunk(h, view.encode("ADDED", o))
            if send_initial and bookmarks:
                write_chunk(h, view.bookmark(cursor, initial_end=True))
            self._follow(h, view, info, cursor, deadline, bookmarks, gen)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return 200
        end_chunked(h)
        return 200

    def _follow(
        self,
        h: _Handler,
        view: WatchView,
        info: ResourceInfo,
        cursor: int,
        deadline: float,
        bookmarks: bool,
        gen: int,
    ) -> None:
        """Send the store's events after `cursor` (and bookmarks) until the watch ends."""
        emu, store = self.emu, self.store
        last_bookmark = time.time()
        interval = float(emu.timing["bookmark_interval"])
        while True:
            now = time.time()
            if (
                now >= deadline
                or self.api.generation != gen
                or emu._stopping.is_set()
                or client_gone(h)
            ):
                break
            with store.cond:
                try:
                    events = store.events_since(cursor)
                except Expired:
                    err = ApiError(
                        410,
                        "Expired",
                        f"too old resource version: {cursor} ({store.compacted_rv})",
                    )
                    events = None
                    emu.watches_expired += 1
                if events == []:
                    store.cond.wait(min(0.5, max(0.01, deadline - now)))
                    events = store.events_since(cursor) if cursor >= store.compacted_rv else []
            if events is None:
                write_chunk(h, view.encode("ERROR", err.status()))
                break
            events, held = emu.reads.visible(info.store, events)
            if held and not events:
                time.sleep(0.05)  # the watch cache has not taken these in yet
            if events:
                cursor = events[-1][0]
            out = view.translate(events)
            if out:
                write_chunk(h, out)
            if bookmarks and time.time() - last_bookmark >= interval:
                write_chunk(h, view.bookmark(cursor))
                last_bookmark = time.time()


class LogServer:
    """Serves pod logs: which container run, tail, limit, since and timestamps, and following a log."""

    def __init__(self, api: ApiServer):
        self.api = api
        self.emu = api.emu

    def serve(
        self, h: _Handler, info: ResourceInfo, ns: str, name: str, query: dict[str, str]
    ) -> int:
        emu = self.emu
        pod = self.api.get_object(info, ns, name)
        run = self.container_run(pod, query)
        if emu.faults.applies("log_gone", emu.truth_record.pod_index(pod["metadata"]["uid"])):
            # The kubelet has sent its headers (status 200) before it asks the runtime for the
            # container, so the runtime's failure arrives as the body.
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            container_id = statuses[0].get("containerID") or "containerd://" + "0" * 64
            return send_bytes(
                h,
                200,
                b"unable to retrieve container logs for " + container_id.encode(),
                "text/plain",
            )
        tail = int(query["tailLines"]) if query.get("tailLines") not in (None, "") else None
        limit_bytes = (
            int(query["limitBytes"]) if query.get("limitBytes") not in (None, "") else None
        )
        since = None
        if query.get("sinceSeconds"):
            since = emu.api_now() - float(query["sinceSeconds"])
        elif query.get("sinceTime"):
            since = parse_time(query["sinceTime"])
        skew = emu.api_skew() + emu.node_offset(pod["spec"].get("nodeName"))
        timestamps = is_true(query.get("timestamps"))

        def render(lines: list[tuple[float, bytes]]) -> bytes:
            out = bytearray()
            for t, line in lines:
                if since is not None and t + skew < since:
                    continue
                if timestamps:
                    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(t + skew)))
                    out += (f"{ts}.{int(((t + skew) % 1) * 1e9):09d}Z ").encode()
                out += line
            return bytes(out)

        with run.cond:
            lines = list(run.lines)
            # A follow goes on from exactly the lines taken here, read under the same lock,
            # so a line written meanwhile is neither skipped nor sent twice.
            pos = len(lines)
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        data = render(lines)
        if limit_bytes is not None:
            data = data[:limit_bytes]
        if not is_true(query.get("follow")):
            return send_bytes(h, 200, data, "text/plain")
        start_chunked(h, "text/plain")
        gen = self.api.generation
        try:
            write_chunk(h, data)
            self._follow(h, run, pos, render, len(data), limit_bytes, gen)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return 200
        end_chunked(h)
        return 200

    def _follow(
        self,
        h: _Handler,
        run: ContainerLog,
        pos: int,
        render: Callable[[list[tuple[float, bytes]]], bytes],
        sent: int,
        limit_bytes: int | None,
        gen: int,
    ) -> None:
        """Send the lines the run writes after `pos` until it ends, the limit is reached or the client leaves."""
        while limit_bytes is None or sent < limit_bytes:
            with run.cond:
                if pos >= len(run.lines) and not run.closed:
                    run.cond.wait(0.5)
                new = run.lines[pos:]
                pos += len(new)
                closed = run.closed and pos >= len(run.lines)
            if new:
                chunk = render(new)
                if limit_bytes is not None:
                    chunk = chunk[: limit_bytes - sent]
                write_chunk(h, chunk)
                sent += len(chunk)
            if (
                closed
                or self.api.generation != gen
                or self.emu._stopping.is_set()
                or client_gone(h)
            ):
                break

    def container_run(self, pod: dict, query: dict[str, str]) -> ContainerLog:
        """The container run whose log is asked for (the current or the previous one), as the kubelet finds it."""
        emu = self.emu
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        cname = query.get("container")
        if not cname:
            if len(containers) != 1:
                raise err_bad_request(
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(containers)}]"
                )
            cname = containers[0]
        if cname not in containers:
            raise err_bad_request(f"container {cname} is not valid for pod {name}")
        node = pod["spec"].get("nodeName")
        if not node:
            raise err_bad_request(f"pod {name} does not have a host assigned")
        idx = emu.truth_record.pod_index(pod["metadata"]["uid"])
        if emu.faults.applies("unreadable_logs", idx):
            host_ip = (pod.get("status") or {}).get("hostIP") or emu.node_ip(node)
            msg = (
                f'Get "https://{host_ip}:10250/containerLogs/{ns}/{name}/{cname}": '
                f"dial tcp {host_ip}:10250: connect: connection refused"
            )
            raise ApiError(500, "", msg)
        runs = emu.logs.get((pod["metadata"]["uid"], cname)) or []
        if is_true(query.get("previous")):
            if len(runs) < 2:
                raise err_bad_request(
                    f'previous terminated container "{cname}" in pod "{name}" not found'
                )
            return runs[-2]
        if not runs:
            reason = "ContainerCreating"
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if cs.get("name") == cname and (cs.get("state") or {}).get("waiting"):
                    reason = cs["state"]["waiting"].get("reason") or reason
            raise err_bad_request(
                f'container "{cname}" in pod "{name}" is waiting to start: {reason}'
            )
        return runs[-1]


# --------------------------------------------------------------------------
# pods/proxy: a request relayed to a pod, as the API server's ProxyREST relays
# it (pkg/registry/core/pod: ResourceLocation; k8s.io/apimachinery/pkg/util/
# proxy: UpgradeAwareHandler, Transport; Go's httputil.ReverseProxy)
# --------------------------------------------------------------------------

# Hop-by-hop headers, which a proxy never relays (httputil.ReverseProxy), either way.
HOP_BY_HOP = frozenset(
    (
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    )
)
# The API server's authentication takes the client's credentials off the request; the body is
# read here whole, so its length and any 100-continue are this side's own.
PROXY_REQUEST_DROPPED = HOP_BY_HOP | {"authorization", "content-length", "expect"}
# The proxy transport takes the backend's CORS headers off its answer.
PROXY_RESPONSE_DROPPED = HOP_BY_HOP | {
    "content-length",
    "access-control-allow-credentials",
    "access-control-allow-headers",
    "access-control-allow-methods",
    "access-control-allow-origin",
}
PROXY_DIAL_SECONDS = 30.0  # the proxy transport's dialer timeout


class ProxyTarget:
    """What a pods/proxy request names: the namespace, the pod's id (NAME, NAME:PORT or
    SCHEME:NAME:PORT) and the path after `proxy`, cleaned as path.Join cleans it (empty when
    the request names no path at all; a trailing slash kept)."""

    def __init__(self, namespace: str, pod_id: str, path: str):
        self.namespace, self.pod_id, self.path = namespace, pod_id, path

    @staticmethod
    def parse(raw_path: str) -> ProxyTarget | None:
        parts = raw_path.split("/")
        if not (
            len(parts) >= 8
            and parts[1:4] == ["api", "v1", "namespaces"]
            and parts[5] == "pods"
            and parts[7] == "proxy"
            and parts[4]
            and parts[6]
        ):
            return None
        rest = unquote("/".join(parts[8:]))
        trailing = raw_path.endswith("/") and len(parts) > 8
        path = clean_path(rest) if rest or trailing else ""
        if trailing and not path.endswith("/"):
            path += "/"
        return ProxyTarget(unquote(parts[4]), unquote(parts[6]), path)

    def split_id(self) -> tuple[str, str, str]:
        """(scheme, name, port) as utilnet.SplitSchemeNamePort reads the id; 400 when it cannot."""
        parts = self.pod_id.split(":")
        scheme, name, port = "", "", ""
        if len(parts) == 3:
            scheme, name, port = parts
        elif len(parts) < 3:
            name, port = parts[0], ":".join(parts[1:])
        if not name or scheme not in ("", "http", "https"):
            raise err_bad_request(f'invalid pod request "{self.pod_id}"')
        return scheme or "http", name, port


def clean_path(path: str) -> str:
    """Go's path.Clean of an absolute path: no empty, `.` or `..` segments left."""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            kept = kept[:-1]
        elif segment not in ("", "."):
            kept.append(segment)
    return "/" + "/".join(kept)


def first_container_port(pod: dict) -> str:
    """The port a proxy request that names none goes to: the first port its containers declare."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("ports"):
            return str(container["ports"][0].get("containerPort", ""))
    return ""


def declares_ports(pod: dict) -> bool:
    """Whether any of the pod's containers declares a port: its pod IP must then be reachable."""
    spec = pod.get("spec") or {}
    return any(
        c.get("ports") for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
    )


def global_unicast(ip: str) -> bool:
    """net.IP.IsGlobalUnicast, which ResourceLocation asks of the pod's IP: not unspecified,
    loopback, multicast, link-local or the IPv4 broadcast address (private ranges are fine)."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return not (
        address.is_unspecified
        or address.is_loopback
        or address.is_multicast
        or address.is_link_local
        or address == ipaddress.ip_address("255.255.255.255")
    )


class PodProxy:
    """The pods/proxy subresource: GET, POST, PUT, PATCH, DELETE, HEAD and OPTIONS relayed to
    http(s)://PODIP:PORT/PATH with the query, the body and the end-to-end headers, the pod's
    answer relayed back (status, headers, body; chunked when the pod gave no length) on the
    client's kept-alive connection.

    As the API server: an id it cannot read answers 400 `invalid pod request "ID"`, a missing
    pod 404, a pod without an IP fit to proxy to 400 `address not allowed`, a pod that cannot be
    reached 503 `error trying to reach service: <Go's dial error>`, and a request that names no
    path (GET or HEAD) a 301 to the same path with a slash. Unlike the API server, which refuses
    loopback pod IPs, the emulator relays to the loopback IPs it gives pods that declare ports
    (`LoopbackPodIPs`); no packet goes anywhere else: any other pod IP is answered as the pod's
    node answers a port nothing listens on, connection refused."""

    def __init__(self, api: ApiServer):
        self.api = api
        self.emu = api.emu

    def serve(self, h: _Handler, target: ProxyTarget, raw_query: str, body: bytes) -> int:
        scheme, name, port = target.split_id()
        pod = self.api.get_object(CANONICAL["pods"], target.namespace, name)
        port = port or first_container_port(pod) or ("443" if scheme == "https" else "80")
        ip = (((pod.get("status") or {}).get("podIPs") or [{}])[0]).get("ip") or ""
        if not (global_unicast(ip) or self.emu.pod_ips.holds(ip)):
            raise err_bad_request("address not allowed")
        request_path = unquote(urlsplit(h.path).path)
        if not target.path and h.command in ("GET", "HEAD"):
            location = request_path + "/" + ("?" + raw_query if raw_query else "")
            return send_bytes(h, 301, b"", "text/plain", {"Location": location})
        # The path before the pod's own (the proxy transport's PathPrepend): X-Forwarded-Uri
        # starts with it, and a redirect the pod answers is pointed back through it.
        suffix = target.path + (
            "/" if request_path.endswith("/") and not target.path.endswith("/") else ""
        )
        prefix = request_path
        if suffix and request_path.endswith(suffix):
            prefix = request_path[: len(request_path) - len(suffix)]
        conn = self._dial(scheme, ip, port)
        try:
            try:
                self._send(conn, h, target.path, prefix, raw_query, body)
                answer = conn.getresponse()
            except (OSError, http.client.HTTPException) as error:
                lost = isinstance(error, http.client.RemoteDisconnected)
                raise unreachable("EOF" if lost else str(error)) from None
            return self._relay(h, answer, prefix, f"{ip}:{port}")
        finally:
            conn.close()

    def _dial(self, scheme: str, ip: str, port: str) -> http.client.HTTPConnection:
        """A connection to the pod, as the proxy transport's dialer makes it (30 s to connect)."""
        if not port.isdigit():
            try:
                port = str(socket.getservbyname(port, "tcp"))
            except OSError:
                raise unreachable(f"dial tcp: lookup tcp/{port}: unknown port") from None
        where = f"{ip}:{port}"
        if not self.emu.pod_ips.holds(ip):
            raise unreachable(f"dial tcp {where}: connect: connection refused")
        if scheme == "https":
            import ssl

            # The API server does not verify a pod's certificate.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                ip, int(port), timeout=PROXY_DIAL_SECONDS, context=context
            )
        else:
            conn = http.client.HTTPConnection(ip, int(port), timeout=PROXY_DIAL_SECONDS)
        try:
            conn.connect()
        except socket.timeout:
            raise unreachable(f"dial tcp {where}: i/o timeout") from None
        except OSError as error:
            reason = os.strerror(error.errno).lower() if error.errno else str(error)
            raise unreachable(f"dial tcp {where}: connect: {reason}") from None
        assert conn.sock is not None
        conn.sock.settimeout(None)  # the proxy waits for the pod's answer as long as it takes
        return conn

    @staticmethod
    def _send(
        conn: http.client.HTTPConnection,
        h: _Handler,
        path: str,
        prefix: str,
        raw_query: str,
        body: bytes,
    ) -> None:
        """The client's request, relayed: its end-to-end headers, X-Forwarded-For and -Uri added."""
        target = quote(path or "/", safe="/!$&'()*+,;=:@") + ("?" + raw_query if raw_query else "")
        conn.putrequest(h.command, target, skip_host=True, skip_accept_encoding=True)
        listed = connection_tokens(h.headers.get_all("Connection") or [])
        forwarded_for = []
        for key, value in h.headers.items():
            lower = key.lower()
            if lower == "x-forwarded-for":
                forwarded_for.append(value)
            elif lower not in PROXY_REQUEST_DROPPED and lower not in listed:
                conn.putheader(key, value)
        if "Host" not in h.headers:
            conn.putheader("Host", f"{conn.host}:{conn.port}")
        conn.putheader("X-Forwarded-For", ", ".join([*forwarded_for, h.client_address[0]]))
        forwarded_uri = clean_path(prefix + "/" + path) + ("/" if path.endswith("/") else "")
        conn.putheader("X-Forwarded-Uri", forwarded_uri)
        if body or h.command in ("POST", "PUT", "PATCH"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)

    @staticmethod
    def _relay(h: _Handler, answer: http.client.HTTPResponse, prefix: str, pod_host: str) -> int:
        """The pod's answer, relayed to the client: status, end-to-end headers, the body."""
        code = answer.status
        entry = getattr(h, "request_entry", None)
        if entry is not None:
            entry["status"] = code  # before a byte leaves, as _Handler.send_response notes it
        h.send_response_only(code, answer.reason)
        h.send_header("Audit-Id", str(uuid.uuid4()))
        h.send_header("Cache-Control", "no-cache, private")
        listed = connection_tokens(answer.headers.get_all("Connection") or [])
        for key, value in answer.getheaders():
            lower = key.lower()
            if lower in PROXY_RESPONSE_DROPPED or lower in listed:
                continue
            if lower == "location":
                value = rewrite_location(value, prefix, pod_host, h.headers.get("Host") or "")
            h.send_header(key, value)
        if "Date" not in answer.headers:
            h.send_header("Date", h.date_time_string())
        length = answer.getheader("Content-Length")
        if h.command == "HEAD" or code in (204, 304) or code < 200:
            if length is not None:
                h.send_header("Content-Length", length)  # of the body a GET would have had
            h.end_headers()
            h.wfile.flush()
            return code
        chunked = length is None or answer.chunked
        h.send_header(
            *(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", length))
        )
        h.end_headers()
        try:
            while True:
                data = answer.read1(1 << 16)
                if not data:
                    break
                if chunked:
                    write_chunk(h, data)
                else:
                    h.wfile.write(data)
            if chunked:
                h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (OSError, http.client.HTTPException):
            # The pod or the client went away mid-answer: the answer is cut, as the API server
            # aborts it, and the client's connection closed.
            h.close_connection = True
        return code


def unreachable(why: str) -> ApiError:
    """503 as the proxy transport answers a pod it could not reach, quoting Go's error."""
    return ApiError(503, "ServiceUnavailable", f"error trying to reach service: {why}")


def connection_tokens(values: list[str]) -> set[str]:
    """The header names a Connection header lists (hop-by-hop for this hop alone)."""
    return {
        token.strip().lower() for value in values for token in value.split(",") if token.strip()
    }


def rewrite_location(location: str, prefix: str, pod_host: str, request_host: str) -> str:
    """A redirect the pod answers, pointed back through the proxy (proxy.Transport.rewriteURL):
    an absolute path on the pod's own host gains the proxy's prefix; anything else is kept."""
    url = urlsplit(location)
    if (url.netloc and url.netloc not in (pod_host, request_host)) or not url.path.startswith("/"):
        return location
    path = url.path
    if not path.startswith(prefix):
        path = prefix.rstrip("/") + path
    return (
        path + ("?" + url.query if url.query else "") + ("#" + url.fragment if url.fragment else "")
    )


class ApiServer:
    """The REST layer: listening, the request log, routing and the verbs on resources."""

    def __init__(self, emu: Emulator):
        self.emu = emu
        self.store = emu.store
        self.connections: set[socket.socket] = set()
        self.httpd: _HTTPServer | None = None
        # Users' credentials travel over TLS only (client-go sends no token over plain HTTP):
        # the port `add_user` kubeconfigs name, and the server certificate it presents.
        self.tls_httpd: _HTTPServer | None = None
        self.tls_port = 0
        self.tls_context: Any | None = None
        self.thread: threading.Thread | None = None
        self.port = 0
        self.generation = 0
        self.request_faults = RequestFaults(emu)
        self.authenticator = Authenticator()
        self.self_review = SelfReview(emu)
        self.discovery = Discovery(self)
        self.render = Representation(emu)
        self.watches = WatchServer(self)
        self.logs = LogServer(self)
        self.proxy = PodProxy(self)

    # -- lifecycle --------------------------------------------------------
    def listen(self, port: int = 0) -> None:
        self.httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self.httpd.api = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="kube-emulator-http",
            daemon=True,
        )
        self.thread.start()

    def listen_tls(self, context: Any, port: int = 0) -> None:
        """Serve the same API over TLS as well (for users with tokens), on `port` or a free one."""
        import ssl

        self.tls_context = context
        httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        httpd.api = self  # type: ignore[attr-defined]
        assert isinstance(context, ssl.SSLContext)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        self.tls_httpd = httpd
        self.tls_port = httpd.server_address[1]
        threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="kube-emulator-https",
            daemon=True,
        ).start()

    def close(self) -> None:
        self.generation += 1
        for httpd in (self.httpd, self.tls_httpd):
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
        self.httpd = self.tls_httpd = None
        for conn in list(self.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.store.cond:
            self.store.cond.notify_all()

    # -- plumbing ---------------------------------------------------------
    def handle(self, h: _Handler) -> None:
        t0 = time.time()
        url = urlsplit(h.path)
        path = url.path.rstrip("/") or "/"
        qs = parse_qs(url.query, keep_blank_values=True)
        query = {k: v[-1] for k, v in qs.items()}
        body = read_body(h)
        is_watch = is_true(query.get("watch"))
        entry: dict[str, Any] = {
            "at": t0,
            "method": h.command,
            "path": path,
            "query": query,
            "status": None,
            "user_agent": h.headers.get("User-Agent", ""),
            "watch": is_watch,
            "accept": h.headers.get("Accept", ""),
            "content_type": h.headers.get("Content-Type", ""),
        }
        with self.emu._req_lock:
            self.emu.requests.append(entry)
        h.request_entry = entry  # type: ignore[attr-defined]
        try:
            user = self.authenticator.authenticate(h.headers.get("Authorization"))
            entry["user"] = user.name
            Authorizer.check(user, h.command, path, is_watch)
            code = self.request_faults.answer(h, path, query, is_watch, user.name)
            if code is None:
                code = self.self_review.serve(h, path, user)
            if code is None:
                code = self.route(h, path, query, body, is_watch)
        except ApiError as e:
            code = send_json(h, e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            code = 499
        except Exception as e:  # pragma: no cover - surfaced as a 500 like a real server
            traceback.print_exc()
            code = send_json(
                h, 500, ApiError(500, "InternalError", f"Internal error occurred: {e}").status()
            )
        entry["status"] = code

    # -- routing ----------------------------------------------------------
    def route(
        self, h: _Handler, path: str, query: dict[str, str], body: bytes, is_watch: bool
    ) -> int:
        url = urlsplit(h.path)
        proxied = ProxyTarget.parse(url.path)
        if proxied is not None:
            return self.proxy.serve(h, proxied, url.query, body)
        code = self.discovery.serve(h, path, query)
        if code is not None:
            return code
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise not_found()
        if (group, version) not in GROUP_VERSIONS or not rest:
            raise not_found()
        info, ns, name, sub = self._parse_resource_path(group, version, rest)
        return self._serve_resource(h, h.command, info, ns, name, sub, query, body, is_watch)

    def _parse_resource_path(
        self, group: str, version: str, rest: list[str]
    ) -> tuple[ResourceInfo, str | None, str | None, str | None]:
        def need(plural: str) -> ResourceInfo:
            info = find_resource(group, version, plural)
            if info is None:
                raise not_found()
            return info

        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and find_resource(group, version, rest[2]) is not None
            and find_resource(group, version, rest[2]).namespaced
        ):
            info = need(rest[2])
            ns = rest[1]
            name = rest[3] if len(rest) > 3 else None
            sub = rest[4] if len(rest) > 4 else None
            if len(rest) > 5:
                raise not_found()
            return info, ns, name, sub
        info = need(rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if len(rest) > 3:
            raise not_found()
        return info, None, name, sub

    # -- resources --------------------------------------------------------
    def _serve_resource(
        self,
        h: _Handler,
        method: str,
        info: ResourceInfo,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        body: bytes,
        is_watch: bool,
    ) -> int:
        if info.namespaced is False and ns is not None:
            raise not_found()
        if sub is not None and sub not in info.subresources:
            raise not_found()
        accept = h.headers.get("Accept", "")
        if method in ("GET", "HEAD"):
            return self._read(h, info, ns, name, sub, query, accept, is_watch)
        if method == "DELETE":
            return self._delete(h, info, ns, name, query, body, accept)
        if sub == "eviction" and name:
            if method != "POST":
                raise not_allowed()
            status = self.emu.writes.api_evict(ns or "", name, self.decode_body(h, body))
            return send_json(h, 201, status)
        if method not in ("POST", "PUT", "PATCH"):
            raise not_allowed()
        if (method == "POST") != (
            name is None
        ):  # POST names a collection, PUT and PATCH one object
            raise not_allowed()
        writes = self.emu.writes
        if method == "POST":
            obj, warnings = writes.api_create(info, ns, self.decode_body(h, body), query)
            escaped = [w.replace('"', '\\"') for w in warnings]
            headers = {"Warning": ", ".join(f'299 - "{w}"' for w in escaped)} if warnings else None
            return send_json(h, 201, self.render.single(info, obj, accept, query), headers)
        if method == "PUT":
            obj = writes.api_update(info, ns, name, sub, self.decode_body(h, body), query)
        else:
            ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip()
            try:
                patch = json.loads(body or b"null")
            except ValueError as e:
                raise err_bad_request(f"error decoding patch: {e}") from None
            obj = writes.api_patch(info, ns, name, sub, ctype, patch, query)
        return send_json(h, 200, self.render.single(info, obj, accept, query))

    def _read(
        self,
        h: _Handler,
        info: ResourceInfo,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        accept: str,
        is_watch: bool,
    ) -> int:
        """GET: a list, a watch, a pod's log or one object."""
        if name is None:
            if is_watch:
                return self.watches.serve(h, info, ns, query, accept)
            return send_json(h, 200, self.list_response(info, ns, query, accept))
        if sub == "log":
            return self.logs.serve(h, info, ns or "", name, query)
        if is_watch:  # deprecated watch on a single object
            q = dict(query, fieldSelector=f"metadata.name={name}")
            return self.watches.serve(h, info, ns, q, accept)
        obj = self.get_object(info, ns, name)
        return send_json(h, 200, self.render.single(info, obj, accept, query))

    def _delete(
        self,
        h: _Handler,
        info: ResourceInfo,
        ns: str | None,
        name: str | None,
        query: dict[str, str],
        body: bytes,
        accept: str,
    ) -> int:
        """DELETE of one object, or of every object a list would return (deletecollection)."""
        writes = self.emu.writes
        opts: dict[str, Any] = {}
        if body:
            try:
                opts = json.loads(body)
            except ValueError:
                raise err_bad_request("the body of the request was in an unknown format") from None
        if "propagationPolicy" in query:
            opts["propagationPolicy"] = query["propagationPolicy"]
        if "gracePeriodSeconds" in query:
            opts["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
        if "dryRun" in query:
            opts["dryRun"] = [query["dryRun"]]
        if name is None:
            items = sorted(self.list_objects(info, ns, query), key=list_order)
            for it in items:
                try:
                    writes.api_delete(
                        info, it["metadata"].get("namespace"), it["metadata"]["name"], opts
                    )
                except ApiError:
                    pass
            return send_json(
                h, 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
            )
        code, out = writes.api_delete(info, ns, name, opts)
        if out.get("kind") != "Status":
            out = self.render.single(info, out, accept, query)
        return send_json(h, code, out)

    def decode_body(self, h: _Handler, body: bytes) -> dict:
        ctype = (h.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if "protobuf" in ctype:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json, application/yaml",
                {},
            )
        try:
            obj = json.loads(body or b"{}")
        except ValueError as e:
            raise err_bad_request(f"couldn't get version/kind; json parse error: {e}") from None
        if not isinstance(obj, dict):
            raise err_bad_request(
                "couldn't get version/kind; json parse error: json: cannot unmarshal "
                "array into Go value of type struct"
            )
        return obj

    def get_object(self, info: ResourceInfo, ns: str | None, name: str) -> dict:
        obj = self.store.get(info.store, ns if info.namespaced else None, name)
        if obj is None:
            raise err_not_found(info, name)
        return obj

    def list_objects(self, info: ResourceInfo, ns: str | None, query: dict[str, str]) -> list[dict]:
        """The matching objects as stored, not copied (the store replaces, never mutates, what it
        holds: copying every object for every page made a list of tens of thousands of events
        slower than a request may take), in no order: a list sorts what it returns (list_order)."""
        objs = self.store.list_raw(info.store, ns if info.namespaced else None)
        if not query.get("labelSelector") and not query.get("fieldSelector"):
            return objs
        lsel = LabelSelector(query.get("labelSelector", ""))
        fsel = FieldSelector(query.get("fieldSelector", ""))
        return [o for o in objs if lsel.matches(o["metadata"].get("labels")) and fsel.matches(o)]

    def list_response(
        self, info: ResourceInfo, ns: str | None, query: dict[str, str], accept: str
    ) -> dict:
        self.emu.reads.before_list(info, query)

        def current() -> tuple[list[dict], str]:
            with self.store.lock:
                return self.list_objects(info, ns, query), str(self.store.rv)

        page, rv, cont, remaining = self.emu.reads.page(info, query, current)
        return self.render.list(info, page, rv, cont, remaining, query, accept)


ListOptionsInfo = ResourceInfo("meta.k8s.io", "v1", "listoptions", "ListOptions", False)


def parse_go_duration(text: str | None) -> float | None:
    """Parse Go durations like '30s', '1m0s', '250ms'."""
    if not text:
        return None
    total = 0.0
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    for num, unit in re.findall(r"([0-9.]+)(h|ms|us|µs|ns|m|s)", text):
        total += float(num) * units[unit]
    return total if total > 0 else None


# --------------------------------------------------------------------------
# controller plumbing
# --------------------------------------------------------------------------


class WorkQueue:
    """A de-duplicating delayed work queue (like client-go's delaying queue)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Any]] = []
        self._due: dict[Any, float] = {}
        self._seq = 0

    def add(self, key: Any, delay: float = 0.0) -> None:
        due = time.time() + max(0.0, delay)
        with self._cond:
            cur = self._due.get(key)
            if cur is not None and cur <= due:
                return
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float) -> Any:
        end = time.time() + timeout
        with self._cond:
            while True:
                now = time.time()
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    return key
                if now >= end:
                    return None
                wait = end - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                self._cond.wait(max(wait, 0.001))


class Controller:
    """Base class: a worker thread draining a WorkQueue, plus periodic resync."""

    name = "controller"

    def __init__(self, emu: Emulator):
        self.emu = emu
        self.store = emu.store
        self.queue = WorkQueue()
        self.thread = threading.Thread(target=self._loop, name="emu-" + self.name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        last_resync = 0.0
        while not self.emu._stopping.is_set():
            if time.time() - last_resync >= float(self.emu.timing["resync"]):
                last_resync = time.time()
                try:
                    self.resync()
                except Exception:
                    traceback.print_exc()
            key = self.queue.get(0.1)
            if key is None:
                continue
            try:
                self.sync(key)
            except Exception:
                traceback.print_exc()

    def on_event(self, etype: str, store: str, obj: dict) -> None:
        """Store listener (called with the store lock held): enqueue only."""

    def resync(self) -> None:
        """Periodic full resync."""

    def sync(self, key: Any) -> None:
        """Reconcile one key."""


def owner_refs(obj: dict) -> list[dict]:
    return obj.get("metadata", {}).get("ownerReferences") or []


def controller_ref(obj: dict) -> dict | None:
    for r in owner_refs(obj):
        if r.get("controller"):
            return r
    return None


def pod_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# --------------------------------------------------------------------------
# Job controller
# --------------------------------------------------------------------------


class JobSync:
    """One pass of the Job controller over one Job: what it read and what it has counted so far."""

    def __init__(self, job: dict, pods: list[dict], now: float):
        self.job = job
        metadata = job["metadata"]
        self.ns, self.name, self.uid = metadata["namespace"], metadata["name"], metadata["uid"]
        self.spec: dict = job.get("spec") or {}
        self.status: dict = clone(job.get("status") or {})
        self.conds: list[dict] = self.status.setdefault("conditions", [])
        self.now = now
        self.pods = pods
        self.indexed = self.spec.get("completionMode") == "Indexed"
        self.per_index = self.indexed and self.spec.get("backoffLimitPerIndex") is not None
        self.done_idx: set[int] = set(parse_index_list(self.status.get("completedIndexes", "")))
        self.failed_idx: set[int] = set(parse_index_list(self.status.get("failedIndexes") or ""))
        self.fail_job_message: str | None = None  # a pod failure policy's FailJob rule matched
        self.succeeded = 0
        self.failed = 0
        self.active = [
            p for p in pods if not pod_terminal(p) and not p["metadata"].get("deletionTimestamp")
        ]
        self.terminating = [
            p for p in pods if not pod_terminal(p) and p["metadata"].get("deletionTimestamp")
        ]
        self.ready = sum(
            1 for p in self.active if cond_true((p.get("status") or {}).get("conditions"), "Ready")
        )


class JobController(Controller):
    """batch/v1 Job controller (NonIndexed and Indexed completion modes)."""

    name = "job-controller"
    COMPLETE_MSG = "Reached expected number of succeeded pods"

    def __init__(self, emu: Emulator):
        super().__init__(emu)
        self.counted: dict[str, set[str]] = {}
        self.last_failure: dict[str, float] = {}
        self.create_backoff: dict[str, tuple[float, int]] = {}
        # (job uid, index) -> (counted failures, ignored failures, last counted failure time): what the
        # real controller reads from the replaced pod's annotations when it creates the next one.
        self.index_failures: dict[tuple[str, int], tuple[int, int, float]] = {}

    def on_event(self, etype: str, store: str, obj: dict) -> None:
        metadata = obj["metadata"]
        if store == "jobs":
            self.queue.add((metadata.get("namespace", ""), metadata["name"]), 0.0)
        elif store == "pods":
            ref = controller_ref(obj)
            if ref and ref.get("kind") == "Job":
                self.queue.add((metadata.get("namespace", ""), ref["name"]), self._status_lag())
                if (
                    etype != "DELETED"
                    and JOB_TRACKING_FINALIZER in (metadata.get("finalizers") or [])
                    and self.store.by_uid(ref.get("uid", "")) is None
                ):
                    self.queue.add(("orphan", metadata.get("namespace", ""), metadata["name"]), 0.0)

    def resync(self) -> None:
        self.resync_orphans()
        for j in self.store.list_raw("jobs"):
            self.queue.add((j["metadata"]["namespace"], j["metadata"]["name"]), self._status_lag())

    def _status_lag(self) -> float:
        return self.emu.faults.timing("job_status_lag", self.emu.t("job_status_lag"))

    # ---------------------------------------------------------------
    def sync(self, key: tuple) -> None:
        if key[0] == "orphan":
            self._sync_orphan_pod(key[1], key[2])
            return
        stalled = self.emu.faults.value("job_controller_stalled")
        if stalled is True:
            return  # kube-controller-manager down: no pods, no conditions, no deadline
        ns, name = key
        job = self.store.get("jobs", ns, name)
        if job is None:
            return
        uid = job["metadata"]["uid"]
        pods = [
            p
            for p in self.store.list_raw("pods", ns)
            if any(r.get("uid") == uid and r.get("controller") for r in owner_refs(p))
        ]
        if stalled and len(pods) >= int(stalled):
            return  # stalls once it has made this many pods: they run on, the Job stays unfinished
        js = JobSync(job, pods, self.emu.api_now())
        self._account_finished(js)
        if not (cond_true(js.conds, "Complete") or cond_true(js.conds, "Failed")):
            self._advance(key, js)
        self._write_status(js)

    def _account_finished(self, js: JobSync) -> None:
        """Count the finished pods not yet counted (by the pod failure policy, if any) and drop their
        tracking finalizers."""
        emu, spec, uid = self.emu, js.spec, js.uid
        counted = self.counted.setdefault(uid, set())
        policy = spec.get("podFailurePolicy")
        new_succ = new_fail = 0
        for p in js.pods:
            pod_metadata = p["metadata"]
            phase = (p.get("status") or {}).get("phase")
            finished = phase in ("Succeeded", "Failed") or bool(
                pod_metadata.get("deletionTimestamp")
            )
            if not finished or (policy is not None and phase not in ("Succeeded", "Failed")):
                # With a podFailurePolicy only a terminal pod counts (isPodFailed). Once the Job met
                # its success criteria, a pod still running (a straggler it deletes) loses its
                # finalizer uncounted, as canRemoveFinalizer lets it: it is no failure.
                if cond_true(js.conds, "SuccessCriteriaMet") and JOB_TRACKING_FINALIZER in (
                    pod_metadata.get("finalizers") or []
                ):
                    self.store.update(
                        "pods", js.ns, pod_metadata["name"], _drop_finalizer(JOB_TRACKING_FINALIZER)
                    )
                continue
            if pod_metadata["uid"] not in counted and JOB_TRACKING_FINALIZER in (
                pod_metadata.get("finalizers") or []
            ):
                counted.add(pod_metadata["uid"])
                if phase == "Succeeded":
                    new_succ += 1
                    if js.indexed:
                        js.done_idx.add(
                            int(
                                (pod_metadata.get("annotations") or {}).get(
                                    "batch.kubernetes.io/job-completion-index", "0"
                                )
                            )
                        )
                elif (
                    policy is None and not js.per_index and pod_metadata["uid"] in emu.replaced_uids
                ):
                    pass  # replace_pod fault: treated like podFailurePolicy Ignore on DisruptionTarget
                elif policy is not None or js.per_index:
                    message, count_failed, action = match_pod_failure_policy(policy, p)
                    if action == "FailJob" and js.fail_job_message is None:
                        js.fail_job_message = message
                    if count_failed:
                        new_fail += 1
                        self.last_failure[uid] = time.time()
                    if js.per_index:
                        ix = int(
                            (pod_metadata.get("annotations") or {}).get(
                                "batch.kubernetes.io/job-completion-index", "0"
                            )
                        )
                        fails, ignored = index_failure_counts(p)
                        if action == "FailIndex" or (
                            count_failed and fails >= spec["backoffLimitPerIndex"]
                        ):
                            js.failed_idx.add(ix)
                        self.index_failures[(uid, ix)] = (
                            (fails + 1, ignored, time.time())
                            if count_failed
                            else (
                                fails,
                                ignored + 1,
                                self.index_failures.get((uid, ix), (0, 0, 0.0))[2],
                            )
                        )
                else:
                    new_fail += 1
                    self.last_failure[uid] = time.time()
            if JOB_TRACKING_FINALIZER in (pod_metadata.get("finalizers") or []):
                self.store.update(
                    "pods", js.ns, pod_metadata["name"], _drop_finalizer(JOB_TRACKING_FINALIZER)
                )
        js.succeeded = len(js.done_idx) if js.indexed else js.status.get("succeeded", 0) + new_succ
        js.failed = js.status.get("failed", 0) + new_fail

    def _advance(self, key: tuple, js: JobSync) -> None:
        """An unfinished Job: finish it once its pods are gone, mark success or failure, or make pods."""
        namespace, name = key
        spec, status, conds, job = js.spec, js.status, js.conds, js.job
        if not status.get("startTime") and not spec.get("suspend"):
            status["startTime"] = fmt_time(js.now)
        if cond_true(conds, "FailureTarget"):
            self._delete_pods(job, js.active)
            if not js.active and not js.terminating:
                target = find_condition(conds, "FailureTarget") or {}
                self._finish(
                    job, conds, "Failed", target.get("reason"), target.get("message"), status
                )
            return
        if cond_true(conds, "SuccessCriteriaMet"):
            # Complete takes the reason and message of the criteria met (CompletionsReached or SuccessPolicy)
            # once every pod left running has terminated.
            met = find_condition(conds, "SuccessCriteriaMet") or {}
            self._delete_pods(job, js.active)
            if not js.active and not js.terminating:
                self._finish(
                    job,
                    conds,
                    "Complete",
                    met.get("reason") or "CompletionsReached",
                    met.get("message") or self.COMPLETE_MSG,
                    status,
                )
            return
        completions = spec.get("completions")
        fail_reason, fail_msg = self._failure(js)
        policy_met = self._success_policy_met(js) if not fail_reason else None
        if completions is not None:
            success = js.succeeded >= completions
        else:
            success = js.succeeded > 0 and not js.active
        new_ver = self.emu.v >= (1, 31)
        if fail_reason:
            js.active = self._delete_pods(job, js.active) or []
            if new_ver:
                set_condition(
                    conds,
                    condition("FailureTarget", "True", js.now, fail_reason, fail_msg, probe=True),
                )
                self.emu.truth_record.note("jobs", f"{namespace}/{name}", "failure_target")
                self.queue.add(key, 0.05)
            else:
                self._finish(job, conds, "Failed", fail_reason, fail_msg, status)
        elif policy_met is not None:
            # Enough indexes succeeded: the rest are stopped, never counted as the Job's failure,
            # and the Job is Complete once they have all terminated.
            js.active = self._delete_pods(job, js.active) or []
            set_condition(
                conds,
                condition(
                    "SuccessCriteriaMet", "True", js.now, "SuccessPolicy", policy_met, probe=True
                ),
            )
            self.emu.truth_record.note("jobs", f"{namespace}/{name}", "success_criteria_met")
            self.queue.add(key, 0.05)
        elif success:
            if new_ver:
                set_condition(
                    conds,
                    condition(
                        "SuccessCriteriaMet",
                        "True",
                        js.now,
                        "CompletionsReached",
                        self.COMPLETE_MSG,
                        probe=True,
                    ),
                )
                self.emu.truth_record.note("jobs", f"{namespace}/{name}", "success_criteria_met")
                self.queue.add(key, 0.05)
            else:
                self._finish(job, conds, "Complete", None, None, status)
        elif spec.get("suspend"):
            self._suspend(job, js)
        elif not job["metadata"].get("deletionTimestamp"):
            self._resume(job, js)
            need = self._pods_wanted(js) - len(js.active)
            if need > 0:
                self._create_pods(
                    job,
                    need,
                    js.active,
                    js.done_idx,
                    js.failed,
                    js.failed_idx if js.per_index else None,
                )

    def _suspend(self, job: dict, js: JobSync) -> None:
        """spec.suspend, as the real controller's manageJob: every running pod deleted and none
        made, and the Suspended condition. The deleted pods count as failures at the next pass
        (isPodFailed), so a Job without retries then fails, as on a real cluster."""
        js.active = self._delete_pods(job, js.active)
        suspended = condition("Suspended", "True", js.now, "JobSuspended", "Job suspended", True)
        if set_condition(js.conds, suspended):
            self.emu.events.record(job, "Normal", "Suspended", "Job suspended", "job-controller")

    def _resume(self, job: dict, js: JobSync) -> None:
        """A suspended Job resumed: its Suspended condition False, its start time (and with it
        activeDeadlineSeconds's count) from now."""
        if not cond_true(js.conds, "Suspended"):
            return
        resumed = condition("Suspended", "False", js.now, "JobResumed", "Job resumed", True)
        set_condition(js.conds, resumed)
        js.status["startTime"] = fmt_time(js.now)
        self.emu.events.record(job, "Normal", "Resumed", "Job resumed", "job-controller")

    def _success_policy_met(self, js: JobSync) -> str | None:
        """The message of the first successPolicy rule the succeeded indexes meet (matchSuccessPolicy),
        else None; only for an Indexed Job, on a version that knows the field."""
        policy = js.spec.get("successPolicy")
        if not js.indexed or policy is None or not js.done_idx or self.emu.v < (1, 31):
            return None
        completions = js.spec.get("completions") or 0
        for number, rule in enumerate(policy.get("rules") or []):
            count = rule.get("succeededCount")
            if rule.get("succeededIndexes") is not None:
                wanted = {i for i in parse_index_list(rule["succeededIndexes"]) if i < completions}
                if not wanted:
                    continue
                done = len(wanted & js.done_idx)
                if done == len(wanted) or (count is not None and done >= count):
                    return f"Matched rules at index {number}"
            elif count is not None and len(js.done_idx) >= count:
                return f"Matched rules at index {number}"
        return None

    @staticmethod
    def _failure(js: JobSync) -> tuple[str | None, str | None]:
        """Why the Job fails now (reason, message), first match wins, else (None, None)."""
        spec = js.spec
        active_deadline = spec.get("activeDeadlineSeconds")
        start = parse_time(js.status.get("startTime"))
        if js.fail_job_message is not None:
            return "PodFailurePolicy", js.fail_job_message
        if (
            active_deadline is not None
            and start is not None
            and not spec.get("suspend")  # a suspended Job's deadline does not count
            and js.now - start >= active_deadline
        ):
            return "DeadlineExceeded", "Job was active longer than specified deadline"
        if js.failed > spec.get("backoffLimit", 6):
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        if (
            js.per_index
            and spec.get("maxFailedIndexes") is not None
            and len(js.failed_idx) > spec["maxFailedIndexes"]
        ):
            return (
                "MaxFailedIndexesExceeded",
                "Job has exceeded the specified maximal number of failed indexes",
            )
        if (
            js.per_index
            and js.failed_idx
            and len(js.failed_idx) + len(js.done_idx) >= (spec.get("completions") or 0)
        ):
            return "FailedIndexes", "Job has failed indexes"
        return None, None

    @staticmethod
    def _pods_wanted(js: JobSync) -> int:
        """How many pods should be active now."""
        spec = js.spec
        completions = spec.get("completions")
        parallelism = spec.get("parallelism", 1)
        if js.per_index:
            want = min(parallelism, (completions or 0) - js.succeeded - len(js.failed_idx))
        elif completions is None:
            want = parallelism if js.succeeded == 0 else 0
        else:
            want = min(parallelism, completions - js.succeeded)
        if spec.get("podReplacementPolicy") == "Failed":
            want -= len(js.terminating)
        return want

    def _write_status(self, js: JobSync) -> None:
        """Store the counters, indexes and conditions when they changed."""
        status = js.status
        status["active"] = len(js.active)
        status["ready"] = js.ready
        status["succeeded"] = js.succeeded
        status["failed"] = js.failed
        if self.emu.v >= (1, 29):
            status["terminating"] = len(js.terminating)
        status["uncountedTerminatedPods"] = {}
        if js.indexed:
            status["completedIndexes"] = format_index_list(sorted(js.done_idx))
        if js.per_index:
            status["failedIndexes"] = format_index_list(sorted(js.failed_idx))
        for k in ("active", "succeeded", "failed"):
            if not status.get(k):
                status.pop(k, None)
        if not js.conds:
            status.pop("conditions", None)
        if status != (js.job.get("status") or {}):
            self.store.update("jobs", js.ns, js.name, lambda o: o.__setitem__("status", status))

    def _sync_orphan_pod(self, ns: str, name: str) -> None:
        """Pods whose Job is gone lose their tracking finalizer (like syncOrphanPod)."""
        pod = self.store.get("pods", ns, name)
        if pod is None:
            return
        ref = controller_ref(pod)
        if ref and ref.get("kind") == "Job" and self.store.by_uid(ref.get("uid", "")) is not None:
            return
        self.store.update("pods", ns, name, _drop_finalizer(JOB_TRACKING_FINALIZER))

    def resync_orphans(self) -> None:
        for p in self.store.list_raw("pods"):
            ref = controller_ref(p)
            if (
                ref
                and ref.get("kind") == "Job"
                and JOB_TRACKING_FINALIZER in (p["metadata"].get("finalizers") or [])
                and self.store.by_uid(ref.get("uid", "")) is None
            ):
                self.queue.add(("orphan", p["metadata"]["namespace"], p["metadata"]["name"]), 0)

    # ---------------------------------------------------------------
    def _finish(
        self,
        job: dict,
        conds: list[dict],
        ctype: str,
        reason: str | None,
        message: str | None,
        status: dict,
    ) -> None:
        emu = self.emu
        now = emu.api_now()
        set_condition(conds, condition(ctype, "True", now, reason, message, probe=True))
        key = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
        if ctype == "Complete":
            status["completionTime"] = fmt_time(now)
            emu.truth_record.note("jobs", key, "complete")
            emu.events.record(job, "Normal", "Completed", "Job completed", "job-controller")
        else:
            emu.truth_record.note("jobs", key, "failed")
            emu.events.record(job, "Warning", reason or "Failed", message or "", "job-controller")

    def _delete_pods(self, job: dict, pods: list[dict]) -> list[dict]:
        for p in pods:
            try:
                self.emu.writes.api_delete(
                    CANONICAL["pods"],
                    p["metadata"]["namespace"],
                    p["metadata"]["name"],
                    {"propagationPolicy": "Background"},
                )
                self.emu.events.record(
                    job,
                    "Normal",
                    "SuccessfulDelete",
                    f"Deleted pod: {p['metadata']['name']}",
                    "job-controller",
                )
            except ApiError:
                pass
        return []

    def _create_pods(
        self,
        job: dict,
        need: int,
        active: list[dict],
        done_idx: set[int],
        failed: int,
        failed_idx: set[int] | None = None,
    ) -> None:
        emu = self.emu
        uid = job["metadata"]["uid"]
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        now = time.time()
        # pod failure back-off (10s, 20s, ... capped at 6 min) before replacements; with
        # backoffLimitPerIndex each index backs off on its own counted failures
        if failed and uid in self.last_failure and failed_idx is None:
            delay = min(emu.t("job_backoff_base") * (2 ** (failed - 1)), 360.0)
            wait = self.last_failure[uid] + delay - now
            if wait > 0:
                self.queue.add(key, wait)
                return
        nb, attempts = self.create_backoff.get(uid, (0.0, 0))
        if now < nb:
            self.queue.add(key, nb - now)
            return
        spec = job["spec"]
        indexes: list[int | None] = [None] * need
        if spec.get("completionMode") == "Indexed":
            busy = {
                int(
                    (p["metadata"].get("annotations") or {}).get(
                        "batch.kubernetes.io/job-completion-index", -1
                    )
                )
                for p in active
            }
            free = [
                i
                for i in range(spec.get("completions") or 0)
                if i not in done_idx and i not in busy and i not in (failed_idx or ())
            ]
            if failed_idx is not None:
                waits = {
                    i: self.index_failures[(uid, i)][2]
                    + min(
                        emu.t("job_backoff_base") * 2 ** (self.index_failures[(uid, i)][0] - 1),
                        360.0,
                    )
                    - now
                    for i in free
                    if self.index_failures.get((uid, i), (0, 0, 0.0))[0] > 0
                }
                later = [w for w in waits.values() if w > 0]
                if later:
                    self.queue.add(key, min(later))
                free = [i for i in free if waits.get(i, 0) <= 0]
            indexes = list(free[:need])
        for idx in indexes:
            pod = self._pod_from_template(job, idx)
            if failed_idx is not None and idx is not None:
                fails, ignored, _ = self.index_failures.get((uid, idx), (0, 0, 0.0))
                annotations = pod["metadata"].setdefault("annotations", {})
                annotations["batch.kubernetes.io/job-index-failure-count"] = str(fails)
                if ignored:
                    annotations["batch.kubernetes.io/job-index-ignored-failure-count"] = str(
                        ignored
                    )
            try:
                created, _ = emu.writes.api_create(
                    CANONICAL["pods"],
                    job["metadata"]["namespace"],
                    pod,
                    {"fieldValidation": "Ignore"},
                )
            except ApiError as e:
                attempts += 1
                delay = min(emu.t("create_retry_base") * (2 ** (attempts - 1)), 10.0)
                self.create_backoff[uid] = (time.time() + delay, attempts)
                emu.events.record(
                    job,
                    "Warning",
                    "FailedCreate",
                    f"Error creating: {e.message}",
                    "job-controller",
                )
                self.queue.add(key, delay)
                return
            self.create_backoff.pop(uid, None)
            emu.events.record(
                job,
                "Normal",
                "SuccessfulCreate",
                f"Created pod: {created['metadata']['name']}",
                "job-controller",
            )

    @staticmethod
    def _pod_from_template(job: dict, index: int | None) -> dict:
        tmpl = clone(job["spec"].get("template") or {})
        template_metadata = tmpl.get("metadata") or {}
        name = job["metadata"]["name"]
        metadata: dict[str, Any] = {
            "generateName": f"{name}-" if index is None else f"{name}-{index}-",
            "namespace": job["metadata"]["namespace"],
            "labels": dict(template_metadata.get("labels") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": [JOB_TRACKING_FINALIZER],
        }
        if template_metadata.get("annotations"):
            metadata["annotations"] = dict(template_metadata["annotations"])
        spec = tmpl.get("spec") or {}
        if index is not None:
            metadata.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = (
                str(index)
            )
            metadata["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
            spec.setdefault("hostname", f"{name}-{index}")
            for c in spec.get("containers") or []:
                c.setdefault("env", []).append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {
                            "fieldRef": {
                                "apiVersion": "v1",
                                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
                            }
                        },
                    }
                )
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def match_pod_failure_policy(policy: dict | None, pod: dict) -> tuple[str | None, bool, str | None]:
    """(FailJob message, count the failure?, action) of a failed pod, as matchPodFailurePolicy: the
    first rule that matches wins; exit code 0 never matches; no match counts the failure."""
    status = pod.get("status") or {}
    pod_key = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
    for number, rule in enumerate((policy or {}).get("rules") or []):
        action = rule.get("action")
        on_codes = rule.get("onExitCodes")
        matched = None
        if on_codes is not None:
            for cs in (status.get("containerStatuses") or []) + (
                status.get("initContainerStatuses") or []
            ):
                term = (cs.get("state") or {}).get("terminated")
                if term is None or (on_codes.get("containerName") not in (None, cs.get("name"))):
                    continue
                code = term.get("exitCode", 0)
                listed = code in (on_codes.get("values") or [])
                if code != 0 and listed == (on_codes.get("operator") == "In"):
                    matched = (
                        f"Container {cs.get('name')} for pod {pod_key} failed with exit code "
                        f"{code} matching {action} rule at index {number}"
                    )
                    break
        else:
            for cond in status.get("conditions") or []:
                if any(
                    cond.get("type") == pattern.get("type")
                    and cond.get("status") == pattern.get("status", "True")
                    for pattern in rule.get("onPodConditions") or []
                ):
                    matched = (
                        f"Pod {pod_key} has condition {cond.get('type')} matching {action} rule "
                        f"at index {number}"
                    )
                    break
        if matched is not None:
            return (matched if action == "FailJob" else None), action != "Ignore", action
    return None, True, None


def index_failure_counts(pod: dict) -> tuple[int, int]:
    """The pod's job-index-failure-count and job-index-ignored-failure-count annotations (0 when absent)."""
    annotations = pod["metadata"].get("annotations") or {}

    def number(key: str) -> int:
        try:
            return max(0, int(annotations.get(key, "0")))
        except ValueError:
            return 0

    return (
        number("batch.kubernetes.io/job-index-failure-count"),
        number("batch.kubernetes.io/job-index-ignored-failure-count"),
    )


def _drop_finalizer(fin: str) -> Callable[[dict], bool | None]:
    def mutate(o: dict) -> bool | None:
        fins = o["metadata"].get("finalizers") or []
        if fin not in fins:
            return False
        fins = [f for f in fins if f != fin]
        if fins:
            o["metadata"]["finalizers"] = fins
        else:
            o["metadata"].pop("finalizers", None)
        return True

    return mutate


def parse_index_list(text: str) -> list[int]:
    out: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def format_index_list(idx: list[int]) -> str:
    """As the Job controller writes completedIndexes and failedIndexes: "1,3-5,7", three or more
    consecutive indexes as a range, two as themselves ("1,2")."""
    parts: list[str] = []
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(f"{idx[i]}-{idx[j]}" if j - i >= 2 else ",".join(map(str, idx[i : j + 1])))
        i = j + 1
    return ",".join(parts)


# --------------------------------------------------------------------------
# scheduler
# --------------------------------------------------------------------------


class Scheduler(Controller):
    """default-scheduler: least-loaded node, PodScheduled, Scheduled event (events.k8s.io)."""

    name = "default-scheduler"

    def __init__(self, emu: Emulator):
        super().__init__(emu)
        # Pod uid -> node of every bound pod not yet finished, kept from the store's events:
        # counting them by listing every pod for every pod scheduled is quadratic at scale.
        self.bound: dict[str, str] = {}

    def on_event(self, etype: str, store: str, obj: dict) -> None:
        if store != "pods":
            return
        uid, node = obj["metadata"].get("uid", ""), (obj.get("spec") or {}).get("nodeName")
        if etype == "DELETED" or pod_terminal(obj) or not node:
            self.bound.pop(uid, None)
        else:
            self.bound[uid] = node
        if etype != "DELETED" and self._eligible(obj):
            metadata = obj["metadata"]
            self.queue.add((metadata["namespace"], metadata["name"]), self.emu.t("schedule_delay"))

    @staticmethod
    def _eligible(pod: dict) -> bool:
        spec = pod.get("spec") or {}
        return (
            not spec.get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
            and spec.get("schedulerName", "default-scheduler") == "default-scheduler"
            and not pod_terminal(pod)
        )

    def resync(self) -> None:
        for p in self.store.list_raw("pods"):
            if self._eligible(p):
                self.queue.add((p["metadata"]["namespace"], p["metadata"]["name"]), 0)

    def sync(self, key: tuple[str, str]) -> None:
        emu = self.emu
        ns, name = key
        pod = self.store.get("pods", ns, name)
        if pod is None or not self._eligible(pod):
            return
        load: dict[str, int] = {n: 0 for n in emu.node_names}
        with self.store.lock:
            for n in self.bound.values():
                if n in load:
                    load[n] += 1
        node = min(emu.node_names, key=lambda n: (load[n], random.random()))
        now = emu.api_now()

        bound_at: list[float] = []

        def bind(o: dict) -> bool | None:
            if o["spec"].get("nodeName"):
                return False
            o["spec"]["nodeName"] = node
            st = o.setdefault("status", {})
            set_condition(st.setdefault("conditions", []), condition("PodScheduled", "True", now))
            bound_at.append(time.time())
            return True

        new = self.store.update("pods", ns, name, bind)
        if new is None or new["spec"].get("nodeName") != node:
            return
        # One clock reading for the record and the event: the scheduler stamps its event at
        # the binding, so the two are the same moment. Taken as the binding is written, before
        # the kubelet can hear of it: however loaded the machine, the node takes the pod up after.
        scheduled_at = bound_at[-1]
        emu.truth_record.note("pods", f"{ns}/{name}", "scheduled", scheduled_at)
        emu.truth_record.note("pods", f"{ns}/{name}", "node", node, raw=True)
        emu.events.record_scheduled(
            new, f"Successfully assigned {ns}/{name} to {node}", scheduled_at
        )


# --------------------------------------------------------------------------
# garbage collector
# --------------------------------------------------------------------------


class GarbageCollector(Controller):
    """Owner-reference based deletion: Background, Foreground and Orphan."""

    name = "garbage-collector"

    def on_event(self, etype: str, store: str, obj: dict) -> None:
        metadata = obj["metadata"]
        if etype == "DELETED":
            self.queue.add(("dangling", metadata.get("uid")), 0.02)
            for r in owner_refs(obj):
                self.queue.add(("owner-uid", r.get("uid")), 0.02)
        elif metadata.get("deletionTimestamp") and set(metadata.get("finalizers") or []) & {
            FOREGROUND_FINALIZER,
            ORPHAN_FINALIZER,
        }:
            self.queue.add(("owner", store, metadata.get("namespace", ""), metadata["name"]), 0.02)
        elif metadata.get("deletionTimestamp"):
            for r in owner_refs(obj):
                self.queue.add(("owner-uid", r.get("uid")), 0.02)

    def resync(self) -> None:
        for store in list(self.store.objects):
            for o in self.store.list_raw(store):
                metadata = o["metadata"]
                if metadata.get("deletionTimestamp") and set(metadata.get("finalizers") or []) & {
                    FOREGROUND_FINALIZER,
                    ORPHAN_FINALIZER,
                }:
                    self.queue.add(
                        ("owner", store, metadata.get("namespace", ""), metadata["name"]), 0
                    )
                for r in owner_refs(o):
                    if self.store.by_uid(r.get("uid", "")) is None:
                        self.queue.add(("dangling", r.get("uid")), 0)

    def _dependents(self, uid: str) -> list[tuple[str, dict]]:
        out = []
        with self.store.lock:
            for store, buckets in self.store.objects.items():
                for bucket in buckets.values():
                    for o in bucket.values():
                        if any(r.get("uid") == uid for r in owner_refs(o)):
                            out.append((store, clone(o)))
        return out

    def sync(self, key: tuple) -> None:
        emu = self.emu
        if key[0] == "owner-uid":
            loc = self.store.by_uid(key[1] or "")
            if loc:
                self.queue.add(("owner", loc[0], loc[1], loc[2]), 0)
            return
        if key[0] == "dangling":
            uid = key[1]
            for store, dep in self._dependents(uid):
                owners_alive = [
                    r for r in owner_refs(dep) if self.store.by_uid(r.get("uid", "")) is not None
                ]
                if not owners_alive and not dep["metadata"].get("deletionTimestamp"):
                    try:
                        emu.writes.api_delete(
                            CANONICAL[store],
                            dep["metadata"].get("namespace"),
                            dep["metadata"]["name"],
                            {"propagationPolicy": "Background"},
                        )
                    except ApiError:
                        pass
            return
        _, store, ns, name = key
        owner = self.store.get(store, ns, name)
        if owner is None or not owner["metadata"].get("deletionTimestamp"):
            return
        uid = owner["metadata"]["uid"]
        fins = owner["metadata"].get("finalizers") or []
        deps = self._dependents(uid)
        if ORPHAN_FINALIZER in fins:
            for dstore, dep in deps:

                def strip(o: dict, uid: str = uid) -> bool | None:
                    refs = [r for r in owner_refs(o) if r.get("uid") != uid]
                    if refs:
                        o["metadata"]["ownerReferences"] = refs
                    else:
                        o["metadata"].pop("ownerReferences", None)
                    return True

                self.store.update(
                    dstore, dep["metadata"].get("namespace"), dep["metadata"]["name"], strip
                )
            self.store.update(store, ns, name, _drop_finalizer(ORPHAN_FINALIZER))
            return
        if FOREGROUND_FINALIZER in fins:
            blocking = 0
            for dstore, dep in deps:
                if not dep["metadata"].get("deletionTimestamp"):
                    try:
                        emu.writes.api_delete(
                            CANONICAL[dstore],
                            dep["metadata"].get("namespace"),
                            dep["metadata"]["name"],
                            {"propagationPolicy": "Foreground"},
                        )
                    except ApiError:
                        pass
                if any(
                    r.get("uid") == uid and r.get("blockOwnerDeletion") for r in owner_refs(dep)
                ):
                    blocking += 1
            if blocking:
                self.queue.add(key, 0.1)
            else:
                self.store.update(store, ns, name, _drop_finalizer(FOREGROUND_FINALIZER))


# --------------------------------------------------------------------------
# namespace controller (+ root CA publisher)
# --------------------------------------------------------------------------


class NamespaceController(Controller):
    """Deletes the content of terminating namespaces and finalizes them."""

    name = "namespace-controller"

    def on_event(self, etype: str, store: str, obj: dict) -> None:
        metadata = obj["metadata"]
        if store == "namespaces":
            if etype == "ADDED":
                self.queue.add(("rootca", metadata["name"]), 0.005)
            if metadata.get("deletionTimestamp") and etype != "DELETED":
                self.queue.add(("delete", metadata["name"]), 0.0)
        elif metadata.get("namespace") and etype == "DELETED":
            self.queue.add(("delete", metadata["namespace"]), 0.05)

    def resync(self) -> None:
        for n in self.store.list("namespaces")[0]:
            if n["metadata"].get("deletionTimestamp"):
                self.queue.add(("delete", n["metadata"]["name"]), 0)

    def sync(self, key: tuple[str, str]) -> None:
        kind, name = key
        ns = self.store.get("namespaces", None, name)
        if ns is None:
            return
        if kind == "rootca":
            self._publish_root_ca(ns)
        else:
            self._finalize(key, ns)

    def _publish_root_ca(self, ns: dict) -> None:
        """Every live namespace gets the kube-root-ca.crt ConfigMap (the root CA publisher)."""
        name = ns["metadata"]["name"]
        if ns["metadata"].get("deletionTimestamp") or self.store.get(
            "configmaps", name, "kube-root-ca.crt"
        ):
            return
        try:
            self.emu.writes.create_object(
                CANONICAL["configmaps"],
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": "kube-root-ca.crt",
                        "namespace": name,
                        "annotations": {
                            "kubernetes.io/description": "Contains a CA bundle that can be "
                            "used to verify the kube-apiserver when using internal endpoints "
                            "such as the internal service IP or kubernetes.default.svc. No "
                            "other usage is guaranteed across distributions of Kubernetes "
                            "clusters."
                        },
                    },
                    "data": {"ca.crt": EMULATOR_CA},
                },
            )
        except ApiError:
            pass

    def _finalize(self, key: tuple[str, str], ns: dict) -> None:
        """A terminating namespace: delete its content, report what remains, drop its finalizer once empty."""
        emu = self.emu
        name = ns["metadata"]["name"]
        if not ns["metadata"].get("deletionTimestamp"):
            return
        if "kubernetes" not in ((ns.get("spec") or {}).get("finalizers") or []):
            return
        remaining: dict[str, int] = {}
        finalizers: dict[str, int] = {}
        for store in NAMESPACED_STORES:
            info = CANONICAL[store]
            for o in self.store.list(store, name)[0]:
                if store == "events":
                    self.store.remove("events", name, o["metadata"]["name"])
                    continue
                label = f"{info.plural}.{info.group}"
                remaining[label] = remaining.get(label, 0) + 1
                for f in o["metadata"].get("finalizers") or []:
                    finalizers[f] = finalizers.get(f, 0) + 1
                if not o["metadata"].get("deletionTimestamp"):
                    try:
                        emu.writes.api_delete(
                            info, name, o["metadata"]["name"], {"propagationPolicy": "Background"}
                        )
                    except ApiError:
                        pass
        conds = namespace_deletion_conditions(remaining, finalizers, emu.api_now())

        def set_conds(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            changed = False
            old = st.get("conditions") or []
            for c in conds:
                if set_condition(old, c):
                    changed = True
            st["conditions"] = old
            if not remaining:
                o["spec"]["finalizers"] = [
                    f for f in o["spec"].get("finalizers") or [] if f != "kubernetes"
                ]
                changed = True
            return changed

        self.store.update("namespaces", None, name, set_conds)
        if remaining:
            self.queue.add(key, 0.2)


def namespace_deletion_conditions(
    remaining: dict[str, int], finalizers: dict[str, int], now: float
) -> list[dict]:
    """A terminating namespace's conditions, given its remaining objects per resource and finalizers."""

    def ns_cond(ctype: str, status: str, reason: str, message: str) -> dict:
        return {
            "type": ctype,
            "status": status,
            "lastTransitionTime": fmt_time(now),
            "reason": reason,
            "message": message,
        }

    def counted(
        ctype: str,
        counts: dict[str, int],
        some: tuple[str, str, Callable[[str, int], str]],
        none: tuple[str, str],
    ) -> dict:
        """True with the counts per resource when there are any, else False."""
        if not counts:
            return ns_cond(ctype, "False", *none)
        reason, message, each = some
        listing = ", ".join(each(what, count) for what, count in sorted(counts.items()))
        return ns_cond(ctype, "True", reason, message + listing)

    conds = [
        ns_cond(ctype, "False", reason, message)
        for ctype, reason, message in (
            (
                "NamespaceDeletionDiscoveryFailure",
                "ResourcesDiscovered",
                "All resources successfully discovered",
            ),
            (
                "NamespaceDeletionGroupVersionParsingFailure",
                "ParsedGroupVersions",
                "All legacy kube types successfully parsed",
            ),
            (
                "NamespaceDeletionContentFailure",
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization",
            ),
        )
    ]
    conds.append(
        counted(
            "NamespaceContentRemaining",
            remaining,
            (
                "SomeResourcesRemain",
                "Some resources are remaining: ",
                lambda what, count: f"{what} has {count} resource instances",
            ),
            ("ContentRemoved", "All content successfully removed"),
        )
    )
    conds.append(
        counted(
            "NamespaceFinalizersRemaining",
            finalizers,
            (
                "SomeFinalizersRemain",
                "Some content in the namespace has finalizers remaining: ",
                lambda what, count: f"{what} in {count} resource instances",
            ),
            ("ContentHasNoFinalizers", "All content-preserving finalizers finished"),
        )
    )
    return conds


EMULATOR_CA = (
    "-----BEGIN CERTIFICATE-----\nMIIBkTCB+wIJAKHBfpegPjMCMA0GCSqGSIb3DQEBCwUAMBExDzANBgNVBAMMBmt1\n"
    "YmUtZW11bGF0b3IwHhcNMjUwMTAxMDAwMDAwWhcNMzUwMTAxMDAwMDAwWjARMQ8w\n"
    "DQYDVQQDDAZrdWJlLWVtdWxhdG9yMFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAMPk\n"
    "-----END CERTIFICATE-----\n"
)


# --------------------------------------------------------------------------
# kubelet: sandboxes, containers (bubblewrap), logs
# --------------------------------------------------------------------------


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration prints one truncated to milliseconds, as the kubelet's
    Pulled message does: ``0s``, ``850ms``, ``1.5s``, ``1m2.5s``, ``1h0m0s``."""
    ms = int(seconds * 1000)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3600000)
    minutes, rest = divmod(rest, 60000)
    whole, frac = divmod(rest, 1000)
    text = (f"{whole}.{frac:03d}").rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


# The guide's image as containerd names it, and its size as a kubelet's Pulled event gives it.
GUIDE_IMAGE = "docker.io/library/python:3.12-alpine"
GUIDE_IMAGE_BYTES = 19203584
# The nodes' images unless told otherwise: the guide's image on every node (and in the registry),
# and nothing else, so a reference no registry has (`pyton:3.12-alpine`) fails to pull as a
# kubelet's does (ErrImagePull, then ImagePullBackOff) instead of running as if present.
GUIDE_IMAGE_ONLY: dict = {
    "registry": {GUIDE_IMAGE: GUIDE_IMAGE_BYTES},
    "present": {GUIDE_IMAGE: True},
}
# For a test or a local cluster that runs images it does not name: every reference is present.
ANY_IMAGE: dict = {"any": True}


def present_images(references: list[str]) -> dict:
    """The images option that makes these references, and no other, present on every node (none
    to pull from a registry): `local_cluster.py --emulator --images A,B`."""
    return {"present": {reference: True for reference in references}}


class ImageStore:
    """Each node's images, and the registry they are pulled from (Emulator option ``images``).

    Without the option every image is present on every node, as before. With it::

        {"registry": {reference: size in bytes, ...},   # what can be pulled
         "present": {reference: [node, ...] or true},   # already on those nodes (true: every node)
         "pull_bytes_per_second": 50e6,                 # a pull takes size / this
         "max_parallel_image_pulls": None,              # None: one pull at a time per node
         "any": False}                                  # true: every reference present (ANY_IMAGE)

    As the kubelet (serializeImagePulls true by default; maxParallelImagePulls when set): a node
    pulls one image at a time and every other pull waits its turn; a pull whose image another
    pod's pull brought meanwhile finds it at once (as containerd finds its layers). A reference
    neither present nor in the registry does not exist: its pull fails as a registry's NotFound.
    References are compared as containerd names them (``python:3`` is
    ``docker.io/library/python:3``)."""

    # A pull that finds every layer already there still resolves the manifest.
    FOUND_SECONDS = 0.02

    def __init__(self, config: dict | None, nodes: list[str]):
        # None, as ANY_IMAGE: no store, every reference present.
        self.enabled = config is not None and not config.get("any")
        config = dict(config or {})
        unknown = set(config) - {
            "registry",
            "present",
            "pull_bytes_per_second",
            "max_parallel_image_pulls",
            "any",
        }
        if unknown:
            raise ValueError(f"unknown images option(s): {', '.join(sorted(unknown))}")
        self.registry = {
            normalize_image(ref)[1]: int(size)
            for ref, size in (config.get("registry") or {}).items()
        }
        self.rate = float(config.get("pull_bytes_per_second") or 50e6)
        self.present: dict[str, set[str]] = {node: set() for node in nodes}
        for ref, where in (config.get("present") or {}).items():
            for node in nodes if where is True else where:
                self.present[node].add(normalize_image(ref)[1])
        slots = config.get("max_parallel_image_pulls") or 1
        self.slots = {node: threading.Semaphore(int(slots)) for node in nodes}
        self.lock = threading.Lock()

    def has(self, node: str, image: str) -> bool:
        if not self.enabled:
            return True
        with self.lock:
            return normalize_image(image)[1] in self.present[node]

    def exists(self, image: str) -> bool:
        return normalize_image(image)[1] in self.registry

    def size(self, image: str) -> int:
        return self.registry.get(normalize_image(image)[1], 0)

    def pull(self, node: str, image: str, stopped: Callable[[], bool]) -> tuple[float, int] | None:
        """One pull on `node` once its turn comes: (seconds pulling, bytes), or None when `stopped()`
        said so first. False-y existence is the caller's to check before."""
        slot = self.slots[node]
        while not slot.acquire(timeout=0.02):
            if stopped():
                return None
        try:
            started = time.time()
            if self.has(node, image):
                seconds = self.FOUND_SECONDS
            else:
                seconds = self.size(image) / self.rate
            end = started + seconds
            while time.time() < end:
                if stopped():
                    return None
                time.sleep(min(0.02, max(0.0, end - time.time())))
            with self.lock:
                self.present[node].add(normalize_image(image)[1])
            return time.time() - started, self.size(image)
        finally:
            slot.release()


class ContainerRunner(threading.Thread):
    """Runs one container of a pod (with fault injection) and keeps its status."""

    def __init__(self, worker: PodWorker, container: dict):
        super().__init__(name=f"ctr-{worker.name}-{container.get('name')}", daemon=True)
        self.worker = worker
        self.emu = worker.emu
        self.container = container
        self.cname = container["name"]
        repo, full = normalize_image(container.get("image", ""))
        self.image_ref = full
        self.image_id = f"{repo}@sha256:{hex64(full)}"
        self.proc: subprocess.Popen | None = None
        self.proc_lock = threading.Lock()
        self.exit_codes: list[int] = []
        self.started_once = False
        self.last_terminated: dict | None = None
        self.image_ready = False
        self.image_missing = False

    # -- status helpers ----------------------------------------------------
    def set_state(self, state: dict, **extra: Any) -> None:
        def fn(cs: dict) -> None:
            cs["state"] = state
            cs.update(extra)

        self.worker.update_container(self.cname, fn)

    def event(self, etype: str, reason: str, message: str) -> None:
        pod = self.emu.store.get("pods", self.worker.ns, self.worker.name)
        if pod is not None:
            self.emu.events.record(
                pod,
                etype,
                reason,
                message,
                "kubelet",
                host=self.worker.kubelet.node,
                field_path=f"spec.containers{{{self.cname}}}",
            )

    # -- main --------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            traceback.print_exc()

    def ensure_image(self) -> bool:
        """The kubelet's first step for a container: pull the image or find it present (an event
        either way). False when the pod is stopped meanwhile."""
        image = self.container.get("image", "")
        self.image_ready = True
        store, node = self.emu.images, self.worker.kubelet.node
        if not store.enabled and self.container.get("imagePullPolicy", "IfNotPresent") == "Always":
            self.event("Normal", "Pulling", f'Pulling image "{image}"')
            if self.worker.sleep(0.05):
                return False
            self.event(
                "Normal",
                "Pulled",
                f'Successfully pulled image "{image}" in 52ms (52ms including waiting). '
                "Image size: 19203584 bytes.",
            )
        elif self.container.get("imagePullPolicy", "IfNotPresent") != "Always" and store.has(
            node, image
        ):
            # The kubelet of 1.35 adds that the pod may use it (seen on kubelet v1.35.4).
            accessible = " and can be accessed by the pod" if self.emu.v >= (1, 35) else ""
            self.event(
                "Normal",
                "Pulled",
                f'Container image "{image}" already present on machine{accessible}',
            )
        elif not store.exists(image) and not store.has(node, image):
            self.image_missing = (
                True  # the runner's own thread fails its pulls, as the kubelet retries them
            )
        else:
            # As the kubelet's image manager: the Pulling event, then the pull in the node's queue; its
            # Pulled message gives the pull's own time, then the time including the wait for its turn.
            self.event("Normal", "Pulling", f'Pulling image "{image}"')
            asked = time.time()
            pulled = store.pull(node, image, self.worker.pull_stopped)
            if pulled is None:
                return False
            seconds, size = pulled
            self.event(
                "Normal",
                "Pulled",
                f'Successfully pulled image "{image}" in {go_duration(seconds)} '
                f"({go_duration(time.time() - asked)} including waiting). "
                f"Image size: {size} bytes.",
            )
        return True

    def _run(self) -> None:
        emu, w = self.emu, self.worker
        idx = w.index
        image = self.container.get("image", "")
        if emu.faults.applies("image_pull_backoff", idx):
            self._image_pull_backoff(image)
            return
        if not self.image_ready and not self.ensure_image():
            return
        if self.image_missing:
            self._image_pull_backoff(image)
            return
        uid, gid, err = self._identity()
        env = None
        if not err:
            env, err = self._env()
        while err:
            self.set_state({"waiting": {"reason": "CreateContainerConfigError", "message": err}})
            self.event("Warning", "Failed", f"Error: {err}")
            if w.sleep(1.0):
                return
        attempts = 2 if emu.faults.applies("restart_container", idx) else 1
        for attempt in range(attempts):
            if w.stop_requested():
                return
            argv = self._attempt_argv(attempt < attempts - 1, env or {})
            if argv is None:
                code = self._run_emitted(env or {}, attempt)
            else:
                code = self._run_once(
                    argv, env or {}, uid, gid, attempt, restarting=attempt < attempts - 1
                )
            if code is None:
                return
            if attempt < attempts - 1 and w.sleep(emu.t("restart_delay")):
                return

    def _attempt_argv(self, crash_first: bool, env: dict[str, str]) -> list[str] | None:
        """What an attempt runs: a fault's stand-in, the container's command, or None (the lightweight kubelet)."""
        faults, idx = self.emu.faults, self.worker.index
        if faults.applies("replace_pod", idx):
            # The pod is replaced while it runs, so it must still be running then
            # whatever the machine's load: it holds until evicted.
            return [
                "python",
                "-c",
                "import time; print('emulator: held until evicted (replace_pod)',"
                " flush=True); time.sleep(3600)",
            ]
        if faults.applies("fail_pods", idx):
            return [
                "python",
                "-c",
                "import sys; print('emulator: injected container failure (fail_pods)',"
                " flush=True); sys.exit(3)",
            ]
        if crash_first:
            return [
                "python",
                "-c",
                "import sys; print('emulator: injected crash before restart "
                "(restart_container)', flush=True); sys.exit(1)",
            ]
        if faults.lightweight():
            return None
        return self._argv(env)

    def mark_started(self, true_start: float) -> None:
        """The kubelet's Started event, the truth's first container start, and the pod's start time."""
        # The kubelet of 1.35 no longer names the container (the event's fieldPath does).
        self.event(
            "Normal",
            "Started",
            "Container started" if self.emu.v >= (1, 35) else f"Started container {self.cname}",
        )
        if not self.started_once:
            self.emu.truth_record.note("pods", self.worker.key, "container_started", true_start)
            self.started_once = True
        self.worker.started_at = true_start

    def _created(self, attempt: int) -> tuple[str, ContainerLog]:
        """The Created event of this run, its container ID and its new (registered) log."""
        emu, w = self.emu, self.worker
        cid = hex64(f"{w.uid}/{self.cname}/{attempt}")
        self.event(
            "Normal",
            "Created",
            "Container created"
            if emu.v >= (1, 35)
            else f"Created container: {self.cname}"
            if emu.v >= (1, 32)
            else f"Created container {self.cname}",
        )
        log = ContainerLog(emu.workdir / "logs" / (f"{w.ns}_{w.name}_{self.cname}-{attempt}.log"))
        emu.logs.setdefault((w.uid, self.cname), []).append(log)
        return cid, log

    def _exited(
        self, code: int, cid: str, start: float, exited_at: float, finished_at: float
    ) -> None:
        """Keep a run's exit: its code, the truth's container end and the terminated state it leaves."""
        emu, w = self.emu, self.worker
        self.exit_codes.append(code)
        emu.truth_record.note("pods", w.key, "container_finished", exited_at, first=False)
        emu.truth_record.note("pods", w.key, "exit_code", code, raw=True)
        self.last_terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": fmt_time(start),
            "finishedAt": fmt_time(finished_at),
            "containerID": "containerd://" + cid,
        }

    def _run_once(
        self,
        argv: list[str],
        env: dict[str, str],
        uid: int,
        gid: int,
        attempt: int,
        restarting: bool = False,
    ) -> int | None:
        """One run of the container's process in the sandbox: its exit code, None when the pod stopped first."""
        emu, w = self.emu, self.worker
        cid, log = self._created(attempt)
        mounts, ro_root = w.mounts_for(self.container)
        cmd = build_bwrap_argv(
            uid,
            gid,
            w.hostname,
            mounts,
            ro_root,
            self.container.get("workingDir") or "/",
            argv,
            str(emu.bindir),
            share_net=declares_ports(w.pod),
        )
        start = emu.node_now(w.kubelet.node)
        # The true start is taken before the process is spawned: on a loaded machine the
        # spawn and the Started event can take a while, and the container runs meanwhile.
        true_start = time.time()
        try:
            with self.proc_lock:
                if w.stop_requested():
                    log.close()
                    return None
                self.proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    close_fds=True,
                )
        except OSError as e:
            log.close()
            self._start_failed(e, cid, start)
            return 128
        self.mark_started(true_start)
        self._set_running(start, attempt, cid)
        reader = threading.Thread(target=self._pump, args=(self.proc, log), daemon=True)
        reader.start()
        rc = self.proc.wait()
        exited_at = time.time()
        reader.join(5)
        log.close()
        code = rc if rc >= 0 else 128 - rc
        # The runtime reports the exit's own moment, however long the log took to drain since.
        self._exited(code, cid, start, exited_at, emu.node_now(w.kubelet.node, exited_at))
        self._report_exit(restarting)
        with self.proc_lock:
            self.proc = None
        return code

    def _start_failed(self, error: OSError, cid: str, start: float) -> None:
        """The status and event of a container whose process could not be started."""
        msg = (
            "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
            f"runc create failed: unable to start container process: {error}"
        )
        self.set_state(
            {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": msg,
                    "startedAt": "1970-01-01T00:00:00Z",
                    "finishedAt": fmt_time(start),
                    "containerID": "containerd://" + cid,
                }
            },
            ready=False,
            started=False,
        )
        self.event("Warning", "Failed", f"Error: {msg}")

    def _set_running(self, start: float, attempt: int, cid: str) -> None:
        """The running state of this run, the previous run's end kept as the last state."""

        def running(cs: dict) -> None:
            last = cs.get("state", {}).get("terminated") or (cs.get("lastState") or {}).get(
                "terminated"
            )
            cs["state"] = {"running": {"startedAt": fmt_time(start)}}
            cs["ready"] = True
            cs["started"] = True
            cs["restartCount"] = attempt
            cs["image"] = self.image_ref
            cs["imageID"] = self.image_id
            cs["containerID"] = "containerd://" + cid
            if attempt and last:
                cs["lastState"] = {"terminated": last}

        self.worker.update_container(self.cname, running)

    def _report_exit(self, restarting: bool) -> None:
        """The state a run's exit leaves: terminated, or waiting to restart."""
        w = self.worker
        assert self.last_terminated is not None
        if restarting and not w.stop_requested():
            # One status update from running to CrashLoopBackOff, as a kubelet that restarts
            # the container reports it: never a terminated state that would make the pod Failed.
            self.set_state(
                {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off 10s restarting failed container={self.cname} "
                        f"pod={w.name}_{w.ns}({w.uid})",
                    }
                },
                ready=False,
                started=False,
                lastState={"terminated": dict(self.last_terminated)},
            )
        else:
            self.set_state({"terminated": dict(self.last_terminated)}, ready=False, started=False)

    def _run_emitted(self, env: dict[str, str], attempt: int) -> int | None:
        """The lightweight kubelet: the built-in worker's events with its timing, no process."""
        emu, w = self.emu, self.worker
        timing = emu.faults.lightweight() or {}
        jitter = timing["jitter"]

        def delay(key: str) -> float:
            return timing[key] * random.uniform(1 - jitter, 1 + jitter)

        cid, log = self._created(attempt)
        start = emu.node_now(w.kubelet.node)
        true_start = time.time()
        self.mark_started(true_start)

        def running(cs: dict) -> None:
            cs["state"] = {"running": {"startedAt": fmt_time(start)}}
            cs.update(
                ready=True,
                started=True,
                restartCount=attempt,
                image=self.image_ref,
                imageID=self.image_id,
                containerID="containerd://" + cid,
            )

        w.update_container(self.cname, running)
        episode = env.get("EPISODE_ID", "")
        # /proc start times are clock ticks of 10 ms.
        process_started = round(true_start + delay("process_start"), 2)
        imports_done = process_started + delay("imports")
        ready_at = imports_done + delay("write_task")
        stopped = w.sleep(max(0.0, ready_at - time.time()))
        if not stopped:
            log.append(
                on_node_clock(
                    (
                        json.dumps(
                            {
                                "event": "ready",
                                "at": time.time(),
                                "episode_id": episode,
                                "imports_done_at": imports_done,
                                "process_started_at": process_started,
                                "modules_before_ready": 31,
                                "import_seconds": imports_done - process_started,
                            }
                        )
                        + "\n"
                    ).encode(),
                    emu.node_offset(w.kubelet.node),
                )
            )
            stopped = w.sleep(delay("episode_work"))
        if not stopped:
            log.append(
                on_node_clock(
                    (
                        json.dumps(
                            {
                                "event": "reward",
                                "at": time.time(),
                                "episode_id": episode,
                                "reward": 1,
                                "baseline_exit": 1,
                                "tests_exit": 0,
                                "tests_output": LIGHTWEIGHT_TESTS_OUTPUT,
                            }
                        )
                        + "\n"
                    ).encode(),
                    emu.node_offset(w.kubelet.node),
                )
            )
            stopped = w.sleep(delay("exit"))
        log.close()
        # The built-in episode installs no SIGTERM handler: as PID 1 it is killed (SIGKILL).
        code = 137 if stopped else 0
        self._exited(code, cid, start, time.time(), emu.node_now(w.kubelet.node))
        self.set_state({"terminated": dict(self.last_terminated)}, ready=False, started=False)
        return None if stopped else code

    def _pump(self, proc: subprocess.Popen, log: ContainerLog) -> None:
        mode = self.emu.faults.for_pod("log_tamper", self.worker.index)
        ahead = self.emu.node_offset(self.worker.kubelet.node)
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            for out in tamper_line(mode, on_node_clock(line, ahead)):
                log.append(out)

    def kill(self, sig: int) -> None:
        """SIGKILL ends the container's every process; any other signal goes to its first process
        alone, and only if that handles it, as to a container's PID 1 (signal_container)."""
        with self.proc_lock:
            if self.proc is not None and self.proc.poll() is None:
                if sig == signal.SIGKILL:
                    signal_tree(self.proc, sig)
                else:
                    signal_container(self.proc, sig)

    def alive(self) -> bool:
        with self.proc_lock:
            return self.proc is not None and self.proc.poll() is None

    # -- pieces --------------------------------------------------------------
    def _image_pull_backoff(self, image: str) -> None:
        repo_ref = self.image_ref
        # containerd 2's words for a reference its registry does not have (as kubelet v1.35.4 with
        # containerd v2.4.2 reports it); the back-off's message repeats the pull's error after it.
        err = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{repo_ref}": '
            f"failed to resolve image: {repo_ref}: not found"
        )
        # The kubelet's back-off doubles after each failed pull (10 s, 20 s, ... up to 300 s): here
        # from twice the emulator's own unit of time, up to thirty times that.
        backoff = first_backoff = 2 * self.emu.t("image_pull_backoff")
        while not self.worker.stop_requested():
            self.event("Normal", "Pulling", f'Pulling image "{image}"')
            self.event("Warning", "Failed", f'Failed to pull image "{image}": {err}')
            self.event("Warning", "Failed", "Error: ErrImagePull")
            self.set_state({"waiting": {"reason": "ErrImagePull", "message": err}})
            if self.worker.sleep(self.emu.t("image_pull_backoff")):
                return
            self.event("Normal", "BackOff", f'Back-off pulling image "{image}"')
            self.event("Warning", "Failed", "Error: ImagePullBackOff")
            self.set_state(
                {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}": ErrImagePull: {err}',
                    }
                }
            )
            if self.worker.sleep(backoff):
                return
            backoff = min(backoff * 2, first_backoff * 30)

    def _identity(self) -> tuple[int, int, str | None]:
        pod = self.worker.pod
        pod_security = (pod.get("spec") or {}).get("securityContext") or {}
        container_security = self.container.get("securityContext") or {}
        uid = container_security.get("runAsUser", pod_security.get("runAsUser"))
        gid = container_security.get("runAsGroup", pod_security.get("runAsGroup"))
        nonroot = container_security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        fmt_pod = f'"{self.worker.name}_{self.worker.ns}({self.worker.uid})"'
        err = None
        if nonroot:
            if uid is None:
                err = (
                    "container has runAsNonRoot and image will run as root "
                    f"(pod: {fmt_pod}, container: {self.cname})"
                )
            elif uid == 0:
                err = (
                    "container's runAsUser breaks non-root policy "
                    f"(pod: {fmt_pod}, container: {self.cname})"
                )
        return int(uid or 0), int(gid if gid is not None else 0), err

    def _env(self) -> tuple[dict[str, str], str | None]:
        w = self.worker
        pod = w.store_pod()
        env: dict[str, str] = {
            "PATH": SANDBOX_PATH,
            "HOSTNAME": w.hostname,
            "HOME": "/",
            "LANG": "C.UTF-8",
        }
        if (pod.get("spec") or {}).get("enableServiceLinks", True):
            env.update(
                {
                    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                    "KUBERNETES_SERVICE_PORT": "443",
                    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
                    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                    "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
                    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                    "KUBERNETES_PORT_443_TCP_PORT": "443",
                    "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
                }
            )
        missing = self._env_from(env)
        if missing:
            return env, missing
        for e in self.container.get("env") or []:
            name = e.get("name")
            if "value" in e or not e.get("valueFrom"):
                env[name] = expand_vars(str(e.get("value", "")), env)
                continue
            value_from = e["valueFrom"]
            if value_from.get("fieldRef"):
                val = resolve_field_ref(pod, value_from["fieldRef"].get("fieldPath", ""))
                if val is None:
                    return env, f"unsupported fieldPath: {value_from['fieldRef'].get('fieldPath')}"
                env[name] = val
            elif value_from.get("configMapKeyRef"):
                ref = value_from["configMapKeyRef"]
                cm = self.emu.store.get("configmaps", w.ns, ref.get("name", ""))
                if cm is None or ref.get("key") not in (cm.get("data") or {}):
                    if ref.get("optional"):
                        continue
                    if cm is None:
                        return env, f'configmap "{ref.get("name")}" not found'
                    return (
                        env,
                        f"couldn't find key {ref.get('key')} in ConfigMap {w.ns}/{ref.get('name')}",
                    )
                env[name] = cm["data"][ref["key"]]
            elif value_from.get("resourceFieldRef"):
                ref = value_from["resourceFieldRef"]
                res = ref.get("resource", "")
                kind, _, what = res.partition(".")
                val = ((self.container.get("resources") or {}).get(kind) or {}).get(what)
                if val is None:
                    val = "8" if what == "cpu" else str(32 * 1024**3)
                else:
                    q = parse_quantity(val)
                    div = parse_quantity(ref.get("divisor", "1"))
                    import math

                    val = str(int(math.ceil(q / div)))
                env[name] = val
            elif value_from.get("secretKeyRef"):
                ref = value_from["secretKeyRef"]
                secret = self.emu.store.get("secrets", w.ns, ref.get("name", ""))
                data = (secret or {}).get("data") or {}
                if ref.get("key") in data:
                    env[name] = base64.b64decode(data[ref["key"]]).decode("utf-8", "replace")
                elif ref.get("optional"):
                    continue
                elif secret is None:
                    return env, f'secret "{ref.get("name")}" not found'
                else:
                    return (
                        env,
                        f"couldn't find key {ref.get('key')} in Secret {w.ns}/{ref.get('name')}",
                    )
        return env, None

    def _env_from(self, env: dict[str, str]) -> str | None:
        """envFrom, as kubelet 1.35's makeEnvironmentVariables reads it: each Secret's or
        ConfigMap's keys (behind the prefix) before `env`, which wins; a key that is not a variable
        name skipped with an InvalidEnvironmentVariableNames event; a missing source the
        container's config error unless optional."""
        w = self.worker
        for source in self.container.get("envFrom") or []:
            kind, ref = (
                ("Secret", source["secretRef"])
                if source.get("secretRef")
                else ("ConfigMap", source.get("configMapRef") or {})
            )
            store = "secrets" if kind == "Secret" else "configmaps"
            found = self.emu.store.get(store, w.ns, ref.get("name", ""))
            if found is None:
                if ref.get("optional"):
                    continue
                return f'{kind.lower()} "{ref.get("name")}" not found'
            data = dict(found.get("data") or {})
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}
            invalid = []
            for key, value in data.items():
                key = (source.get("prefix") or "") + key
                if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", key):
                    invalid.append(key)
                    continue
                env[key] = value
            if invalid:
                self.event(
                    "Warning",
                    "InvalidEnvironmentVariableNames",
                    f"Keys [{', '.join(sorted(invalid))}] from the EnvFrom {kind.lower()} "
                    f"{w.ns}/{ref.get('name')} were skipped since they are considered invalid "
                    f"environment variable names.",
                )
        return None

    def _argv(self, env: dict[str, str]) -> list[str]:
        command = self.container.get("command") or []
        args = self.container.get("args") or []
        argv = list(command) + list(args) if command else (list(args) if args else ["python3"])
        return [expand_vars(a, env) for a in argv]


def tamper_line(mode: str | None, line: bytes) -> list[bytes]:
    """log_tamper fault: rewrite what a container's log contains."""
    if not mode:
        return [line]
    try:
        obj = json.loads(line)
    except ValueError:
        return [line]
    if not isinstance(obj, dict):
        return [line]
    ev = obj.get("event")
    if mode == "duplicate_ready" and ev == "ready":
        return [line, line]
    if mode == "drop_reward" and ev == "reward":
        return []
    if mode == "wrong_id" and ev == "ready":
        obj["episode_id"] = "impostor-" + random_suffix()
        return [json.dumps(obj).encode() + b"\n"]
    if mode == "junk_lines":
        return [
            b"emulator junk line: this is not JSON {\n",
            line,
            b"Traceback (emulated junk, not an event)\n",
        ]
    return [line]


# The clock readings the built-in worker prints: on a node whose clock is off, all of them are.
WORKER_CLOCK_FIELDS = ("at", "process_started_at", "imports_done_at")


def on_node_clock(line: bytes, ahead: float) -> bytes:
    """A worker event line as a process on a node whose clock runs `ahead` seconds would print it."""
    if not ahead:
        return line
    try:
        obj = json.loads(line)
    except ValueError:
        return line
    if not isinstance(obj, dict) or "event" not in obj:
        return line
    for field in WORKER_CLOCK_FIELDS:
        value = obj.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            obj[field] = value + ahead
    return json.dumps(obj).encode() + b"\n"


def write_config_map_volume(
    directory: Path, volume: str, ref: dict, config_map: dict | None
) -> None:
    """A configMap volume's files (the items named, else every key) with their modes, as a kubelet writes them."""
    if config_map is None and not ref.get("optional"):
        raise MountError(
            f'MountVolume.SetUp failed for volume "{volume}" : '
            f'configmap "{ref.get("name")}" not found'
        )
    directory.mkdir(parents=True, exist_ok=True)
    data = dict((config_map or {}).get("data") or {})
    binary = {
        k: base64.b64decode(b) for k, b in ((config_map or {}).get("binaryData") or {}).items()
    }
    mode = ref.get("defaultMode", 0o644)
    items = ref.get("items")
    pairs = (
        [(it["key"], it["path"], it.get("mode", mode)) for it in items]
        if items
        else [(k, k, mode) for k in list(data) + list(binary)]
    )
    for key, path, file_mode in pairs:
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(binary[key] if key in binary else data.get(key, "").encode())
        os.chmod(target, file_mode)
    os.chmod(directory, 0o755)


def write_secret_volume(directory: Path, volume: str, ref: dict, secret: dict | None) -> None:
    """A secret volume's files (its data decoded), with their modes, as a kubelet writes them."""
    if secret is None and not ref.get("optional"):
        raise MountError(
            f'MountVolume.SetUp failed for volume "{volume}" : '
            f'secret "{ref.get("secretName")}" not found'
        )
    decoded_as_binary = {"binaryData": dict((secret or {}).get("data") or {})}
    write_config_map_volume(directory, volume, ref, decoded_as_binary)


# The volume types a kubelet mounts read-only whatever the container's volumeMount says.
READ_ONLY_VOLUMES = ("configMap", "secret", "projected", "downwardAPI")


def write_downward_api_files(pod: dict, directory: Path, items: list[dict]) -> None:
    """The pod's fields a downwardAPI volume (or projection) names, one file each."""
    for it in items:
        val = resolve_field_ref(pod, (it.get("fieldRef") or {}).get("fieldPath", "")) or ""
        (directory / it["path"]).write_text(val)


def told_of_removal(kind: str, worker: Any) -> bool:
    """On a pod's DELETED event, tell its worker (if it has one) that the pod is gone; True for that event."""
    if kind != "DELETED":
        return False
    if worker is not None:
        worker.on_removed()
    return True


def link_python(bindir: Path, python: str) -> None:
    """`python` and `python3` in `bindir`, for the sandbox's PATH, link to the interpreter's real file."""
    for n in ("python", "python3"):
        link = bindir / n
        if link.is_symlink() or link.exists():
            link.unlink()
        # The real file, not a virtualenv's link to it: the sandbox shows the host's
        # root read-only but a fresh /tmp, where a venv (or a CI checkout) may live.
        link.symlink_to(os.path.realpath(python))


class PodWorker(threading.Thread):
    """The kubelet's per-pod worker: sandbox, volumes, containers, termination."""

    def __init__(self, kubelet: Kubelet, pod: dict):
        metadata = pod["metadata"]
        super().__init__(name=f"pod-{metadata['name']}", daemon=True)
        self.kubelet = kubelet
        self.emu = kubelet.emu
        self.pod = pod
        self.ns, self.name, self.uid = metadata["namespace"], metadata["name"], metadata["uid"]
        self.key = f"{self.ns}/{self.name}"
        self.index = self.emu.truth_record.pod_index(self.uid)
        self.hostname = (pod.get("spec") or {}).get("hostname") or self.name
        self.deleting = threading.Event()
        self.removed = threading.Event()
        self.grace = 30.0
        self.runners: list[ContainerRunner] = []
        self.done = False
        self.dir = self.emu.workdir / "pods" / self.uid
        self.volumes: dict[str, tuple[str, str]] = {}
        self.started_at: float | None = None
        self.active_since: float | None = (
            None  # its status.startTime, held to the nanosecond as a kubelet does
        )
        self.evicted = False
        # Past its activeDeadlineSeconds: the pod's phase is Failed from then on.
        self.deadline_exceeded = False
        # The pod worker has stopped the pod (its containers, then its sandbox): only then does the
        # status it writes carry a terminal phase.
        self.pod_stopped = False
        self._status_lock = threading.Lock()

    # -- signals from the kubelet -----------------------------------------
    def on_deletion(self, pod: dict) -> None:
        g = pod["metadata"].get("deletionGracePeriodSeconds")
        self.grace = float(g) if g is not None else 30.0
        self.deleting.set()

    def on_removed(self) -> None:
        self.removed.set()
        self.grace = 0.0
        self.deleting.set()

    def stop_requested(self) -> bool:
        return self.deleting.is_set() or self.emu._stopping.is_set() or self.evicted

    def sleep(self, seconds: float) -> bool:
        end = time.time() + seconds
        while True:
            if self.stop_requested():
                return True
            left = end - time.time()
            if left <= 0:
                return False
            self.deleting.wait(min(left, 0.1))

    # -- status ----------------------------------------------------------------
    def store_pod(self) -> dict:
        return self.emu.store.get("pods", self.ns, self.name) or self.pod

    def update(self, fn: Callable[[dict], bool | None]) -> dict | None:
        with self._status_lock:

            def guarded(o: dict) -> bool | None:
                if o["metadata"].get("uid") != self.uid:
                    return False
                return fn(o)

            return self.emu.store.update("pods", self.ns, self.name, guarded)

    def update_container(self, cname: str, fn: Callable[[dict], None]) -> None:
        def mutate(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            for cs in st.get("containerStatuses") or []:
                if cs["name"] == cname:
                    fn(cs)
            self.recompute(o)
            return True

        self.update(mutate)

    def recompute(self, o: dict) -> None:
        emu = self.emu
        st = o.setdefault("status", {})
        container_statuses = st.get("containerStatuses") or []
        now = emu.node_now(self.kubelet.node)
        conds = st.setdefault("conditions", [])
        terminated = [cs for cs in container_statuses if (cs.get("state") or {}).get("terminated")]
        running = [cs for cs in container_statuses if (cs.get("state") or {}).get("running")]
        if st.get("reason") == "Evicted" or self.deadline_exceeded:
            phase = "Failed"
        elif container_statuses and len(terminated) == len(container_statuses):
            phase = (
                "Succeeded"
                if all(cs["state"]["terminated"].get("exitCode") == 0 for cs in container_statuses)
                else "Failed"
            )
        elif running or st.get("phase") == "Running":
            phase = "Running"
        else:
            phase = "Pending"
        terminal = phase in ("Succeeded", "Failed")
        # As kubelet 1.35's generateAPIPodStatus: the conditions follow the phase the containers
        # give, but until the pod worker has stopped the pod the phase written stays what it was,
        # without the pod's reason: a container that ended on its own first shows terminated in a
        # Running pod whose sandbox is still ready, and a pod past its deadline first goes unready
        # (PodFailed) with its container still running.
        held = terminal and not self.pod_stopped and st.get("reason") != "Evicted"
        if held:
            st["phase"] = (
                st.get("phase") if st.get("phase") in ("Pending", "Running") else "Pending"
            )
        else:
            st["phase"] = phase
        if self.deadline_exceeded and not held:
            st["reason"] = "DeadlineExceeded"
            st["message"] = DEADLINE_MESSAGE
        if emu.v >= (1, 34) and o["metadata"].get("generation"):
            st["observedGeneration"] = o["metadata"]["generation"]
        unready = [cs["name"] for cs in container_statuses if not cs.get("ready")]
        for ctype in ("ContainersReady", "Ready"):
            if terminal:
                # As the 1.35 kubelet (status/generate.go): PodFailed on a Failed pod, whatever its
                # containers' readiness (they may still be stopping).
                c = condition(
                    ctype, "False", now, "PodFailed" if phase == "Failed" else "PodCompleted"
                )
            elif not unready and container_statuses:
                c = condition(ctype, "True", now)
            else:
                c = condition(
                    ctype,
                    "False",
                    now,
                    "ContainersNotReady",
                    f"containers with unready status: [{' '.join(unready)}]",
                )
            set_condition(conds, c)
        if terminal and find_condition(conds, "Initialized"):
            # A pod whose every container succeeded is Initialized because it completed.
            reason = "PodCompleted" if phase == "Succeeded" else None
            set_condition(conds, condition("Initialized", "True", now, reason))
        if terminal and not held and emu.v >= (1, 29):
            set_condition(conds, condition("PodReadyToStartContainers", "False", now))
        elif running and emu.v >= (1, 29) and emu.faults.on("sandbox_status_with_running"):
            # A real kubelet writes the status it computed before starting the pod's containers,
            # so the sandbox's readiness usually first reaches the API in the same update as the
            # running container, stamped with that update's time.
            ready = [c for c in conds if c.get("type") == "PodReadyToStartContainers"]
            if not ready or ready[0].get("status") != "True":
                set_condition(conds, condition("PodReadyToStartContainers", "True", now))
        # As the 1.35 kubelet merges its status (mergePodStatus): the conditions it does not own
        # (DisruptionTarget, from the Eviction API or a preemption) first, as the pod had them,
        # then its own in the order it generates them.
        order = {
            "PodReadyToStartContainers": 0,
            "Initialized": 1,
            "Ready": 2,
            "ContainersReady": 3,
            "PodScheduled": 4,
        }
        conds.sort(key=lambda c: order.get(c["type"], -1))

    # -- lifecycle ---------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            traceback.print_exc()
        finally:
            self.done = True
            self._maybe_final_delete()

    def _run(self) -> None:
        """The pod's life on its node, step by step; a step returns False when the pod stopped meanwhile."""
        containers = (self.store_pod().get("spec") or {}).get("containers") or []
        if not (
            self._initial_status(containers)
            and self._mount_volumes()
            and self._wait_for_watch()
            and self._start_sandbox()
            and self._start_containers(containers)
        ):
            return
        self._supervise()
        for r in self.runners:
            r.join(10)
        if self.deleting.is_set() and not pod_terminal(self.store_pod() or {}):
            # A container that gave up waiting (an image that never pulled) as the pod was deleted
            # ended before the loop saw the deletion: the pod still ends Failed, as a kubelet's does.
            self._terminate_all()
        if not self.pod_stopped:
            # The containers ended on their own: the pod worker stops the sandbox, and the status
            # it writes then has the terminal phase.
            self.pod_stopped = True

            def stop(o: dict) -> bool | None:
                self.recompute(o)
                return True

            self.update(stop)
        self._deadline_after_success()

    def _deadline_after_success(self) -> None:
        """A pod that Succeeded turns Failed, reason DeadlineExceeded, with a Normal DeadlineExceeded
        event and Ready PodFailed, once its deadline passes while it is still there, its
        containers' states unchanged. Kubelet 1.35's activeDeadlineHandler.ShouldEvict has no
        terminal check, but a real node flips the pod only when its status is written again after
        the deadline (seen once in two runs of tests/support/compare_nodes.py: when the deadline passed
        while the kubelet was still finishing the pod); this kubelet always does, the case a
        reader of the pod must handle."""
        limit = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        pod = self.store_pod() or {}
        if limit is None or self.active_since is None:
            return
        if (pod.get("status") or {}).get("phase") != "Succeeded":
            return
        while not self.deleting.is_set() and not self.emu._stopping.is_set():
            left = self.active_since + limit - time.time()
            if left <= 0:
                break
            self.deleting.wait(min(left, 0.5))
        else:
            return
        self.emu.events.record(
            self.store_pod(),
            "Normal",
            "DeadlineExceeded",
            DEADLINE_MESSAGE,
            "kubelet",
            host=self.kubelet.node,
        )

        def mark(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            if st.get("phase") != "Succeeded":
                return False
            self.deadline_exceeded = True
            self.recompute(o)
            return True

        self.update(mark)

    def _initial_status(self, containers: list[dict]) -> bool:
        """The status a kubelet first writes: Pending on this node, every container creating."""
        emu = self.emu
        now = emu.node_now(self.kubelet.node)

        def init(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            st["phase"] = "Pending"
            st["hostIP"] = self.kubelet.ip
            st["hostIPs"] = [{"ip": self.kubelet.ip}]
            st["startTime"] = fmt_time(now)
            self.active_since = time.time()
            conds = st.setdefault("conditions", [])
            if emu.v >= (1, 29):
                set_condition(conds, condition("PodReadyToStartContainers", "False", now))
            set_condition(conds, condition("Initialized", "True", now))
            st["containerStatuses"] = [
                {
                    "name": c["name"],
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                    "lastState": {},
                    "ready": False,
                    "restartCount": 0,
                    "image": c.get("image", ""),
                    "imageID": "",
                    "started": False,
                }
                for c in containers
            ]
            self.recompute(o)
            return True

        return self.update(init) is not None

    def _mount_volumes(self) -> bool:
        """Mount the pod's volumes, retrying (with a FailedMount event) until they mount or the pod stops."""
        # Volumes are mounted before the sandbox is asked for (the kubelet waits for them first),
        # so the kubelet's first container event follows the sandbox at once.
        while True:
            try:
                self._prepare_volumes(self.store_pod())
                return True
            except MountError as e:
                self.emu.events.record(
                    self.store_pod(),
                    "Warning",
                    "FailedMount",
                    str(e),
                    "kubelet",
                    host=self.kubelet.node,
                )
                if self.sleep(1.0):
                    self._terminate_all()
                    return False

    def _wait_for_watch(self) -> bool:
        """With the sandbox_after_watch fault: hold the sandbox until a client watches this Job's pods."""
        emu = self.emu
        if emu.faults.on("sandbox_after_watch"):
            # Fired by a state, not a timer: the sandbox starts once a client watches this
            # pod's Job's pods, so a client that was slow to start its watch still sees every
            # transition, however fast the episode and however loaded the machine.
            labels = (self.store_pod() or {}).get("metadata", {}).get("labels") or {}
            while labels.get("job-name") and not emu.pods_watched(self.ns, labels):
                if self.sleep(0.02):
                    self._terminate_all()
                    return False
        return True

    def _start_sandbox(self) -> bool:
        """The sandbox's start (after its delay): the pod's IP and, on newer nodes, PodReadyToStartContainers."""
        emu = self.emu
        delay = emu.faults.timing("sandbox_delay", emu.t("sandbox_delay")) + random.uniform(
            0, max(0.0, emu.faults.timing("sandbox_jitter", emu.t("sandbox_jitter")))
        )
        emu.truth_record.note("pods", self.key, "sandbox_delay", delay, raw=True)
        if self.sleep(delay):
            self._terminate_all()
            return False
        pod_ip = self.kubelet.pod_ip(self)
        # RunPodSandbox has returned: the sandbox is ready now, whenever its status reaches the API.
        sandbox_ready_at = time.time()

        def sandbox(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            st["podIP"] = pod_ip
            st["podIPs"] = [{"ip": pod_ip}]
            if emu.v >= (1, 29) and not emu.faults.on("sandbox_status_with_running"):
                set_condition(
                    st.setdefault("conditions", []),
                    condition("PodReadyToStartContainers", "True", emu.node_now(self.kubelet.node)),
                )
            self.recompute(o)
            return True

        if self.update(sandbox) is None:
            return False
        emu.truth_record.note("pods", self.key, "sandbox_ready", sandbox_ready_at)
        return True

    def _start_containers(self, containers: list[dict]) -> bool:
        """A runner per container, the first one's image pulled at once, then every runner started."""
        self.pod = self.store_pod()
        self.runners = [ContainerRunner(self, c) for c in containers]
        # As the kubelet does, in the same step that saw the sandbox ready: the first container's
        # image is pulled or found at once, so its event follows the sandbox by milliseconds.
        if self.runners and not self.emu.faults.applies("image_pull_backoff", self.index):
            if not self.runners[0].ensure_image():
                if self._past_active_deadline() and not self.stop_requested():
                    self._stop_at_deadline()  # the kubelet enforces the deadline on a pod still pulling
                else:
                    self._terminate_all()
                return False
        for r in self.runners:
            r.start()
        return True

    def _supervise(self) -> None:
        """While containers run: stop them on deletion, and evict for the replace_pod fault or a full emptyDir."""
        emu = self.emu
        last_size_check = 0.0
        while any(r.is_alive() for r in self.runners):
            if self.deleting.is_set() or emu._stopping.is_set():
                self._terminate_all()
                break
            if (
                emu.faults.applies("replace_pod", self.index)
                and self.started_at is not None
                and time.time() - self.started_at >= emu.t("replace_after")
                and not self.evicted
            ):
                self._evict(
                    "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, "
                    "available: 512Mi. ",
                    replaced=True,
                )
                break
            if time.time() - last_size_check >= 0.25:
                last_size_check = time.time()
                over = self._size_limit_exceeded()
                if over:
                    self._evict(over)
                    break
            if self._past_active_deadline():
                self._stop_at_deadline()
                break
            # A thousand pods polling every 50 ms would starve the API server of the GIL;
            # the lightweight kubelet's containers report their own end, so a slow poll loses nothing.
            self.deleting.wait(0.5 if emu.faults.lightweight() else 0.05)

    def _terminate_all(self) -> None:
        """Graceful stop: SIGTERM, wait min(grace, grace_cap), SIGKILL. The pod worker is stopping the
        pod: the status that shows its containers stopped has its terminal phase."""
        self.pod_stopped = True
        alive = [r for r in self.runners if r.alive()]
        if alive and not self.removed.is_set():
            for r in alive:
                r.event("Normal", "Killing", f"Stopping container {r.cname}")
        for r in alive:
            r.kill(signal.SIGTERM)
        end = time.time() + min(self.grace, self.emu.t("grace_cap"))
        while time.time() < end and any(r.alive() for r in alive):
            time.sleep(0.02)
        for r in alive:
            r.kill(signal.SIGKILL)
        for r in self.runners:
            r.join(10)
        # containers that never ran: mark them terminated so the pod can reach a terminal phase
        now = self.emu.node_now(self.kubelet.node)

        def fin(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            for cs in st.get("containerStatuses") or []:
                if not (cs.get("state") or {}).get("terminated"):
                    cs["state"] = {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "ContainerStatusUnknown",
                            "message": "The container could not be located when the pod "
                            "was terminated",
                            "startedAt": None,
                            "finishedAt": fmt_time(now),
                        }
                    }
                    cs["ready"] = False
                    cs["started"] = False
            self.recompute(o)
            return True

        if not self.removed.is_set():
            self.update(fin)

    def pull_stopped(self) -> bool:
        """A pull (or its wait for the node's queue) ends early: the pod stopped, or outlived its deadline."""
        return self.stop_requested() or self._past_active_deadline()

    def _past_active_deadline(self) -> bool:
        """The pod has been active on this node for its activeDeadlineSeconds (from its start)."""
        limit = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        return (
            limit is not None
            and self.active_since is not None
            and time.time() - self.active_since >= limit
        )

    def _stop_at_deadline(self) -> None:
        """As the kubelet's active deadline handler: a Normal DeadlineExceeded event, the pod unready
        (PodFailed) while its containers still run, the containers stopped with the pod's grace
        period, and the pod Failed with reason DeadlineExceeded (no condition of its own: no
        DisruptionTarget). The terminal phase and the reason reach the API only once the
        containers have stopped."""
        self.emu.events.record(
            self.store_pod(),
            "Normal",
            "DeadlineExceeded",
            DEADLINE_MESSAGE,
            "kubelet",
            host=self.kubelet.node,
        )
        self.grace = float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        self.evicted = True  # stops the pod's steps as an eviction does
        self.deadline_exceeded = True

        def mark(o: dict) -> bool | None:
            self.recompute(o)
            return True

        self.update(mark)
        self._terminate_all()

    def _evict(self, message: str, replaced: bool = False) -> None:
        emu = self.emu
        if replaced:
            emu.replaced_uids.add(self.uid)
        self.evicted = True
        pod = self.store_pod()
        emu.events.record(pod, "Warning", "Evicted", message, "kubelet", host=self.kubelet.node)
        now = emu.node_now(self.kubelet.node)

        def mark(o: dict) -> bool | None:
            st = o.setdefault("status", {})
            st["reason"] = "Evicted"
            st["message"] = message
            set_condition(
                st.setdefault("conditions", []),
                condition("DisruptionTarget", "True", now, "TerminationByKubelet", message),
            )
            self.recompute(o)
            return True

        self.update(mark)
        self.grace = 0.0
        self._terminate_all()

    def _maybe_final_delete(self) -> None:
        pod = self.emu.store.get("pods", self.ns, self.name)
        if (
            pod is not None
            and pod["metadata"].get("uid") == self.uid
            and pod["metadata"].get("deletionTimestamp")
        ):
            self.kubelet.final_delete(self.ns, self.name, self.uid)

    # -- volumes -----------------------------------------------------------
    def _prepare_volumes(self, pod: dict) -> None:
        """Mount each of the pod's volumes not mounted yet (a MountError says which one cannot be)."""
        for v in (pod.get("spec") or {}).get("volumes") or []:
            if v["name"] not in self.volumes:
                self.volumes[v["name"]] = self._mount(pod, v)

    def _mount(self, pod: dict, v: dict) -> tuple[str, str]:
        """One volume, written under the pod's directory as its type asks: (its host path, its type)."""
        name = v["name"]
        d = self.dir / "volumes" / name
        if v.get("configMap") is not None:
            ref = v["configMap"]
            write_config_map_volume(
                d, name, ref, self.emu.store.get("configmaps", self.ns, ref.get("name", ""))
            )
            return str(d), "configMap"
        if v.get("emptyDir") is not None:
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o777)
            return str(d), "emptyDir"
        if v.get("projected") is not None:
            d.mkdir(parents=True, exist_ok=True)
            for src in v["projected"].get("sources") or []:
                self._project(pod, d, name, src)
            for f in d.iterdir():
                os.chmod(f, 0o644)
            return str(d), "projected"
        if v.get("downwardAPI") is not None:
            d.mkdir(parents=True, exist_ok=True)
            write_downward_api_files(pod, d, v["downwardAPI"].get("items") or [])
            return str(d), "downwardAPI"
        if v.get("hostPath") is not None:
            return v["hostPath"].get("path", "/"), "hostPath"
        if v.get("secret") is not None:
            ref = v["secret"]
            secret = self.emu.store.get("secrets", self.ns, ref.get("secretName", ""))
            write_secret_volume(d, name, ref, secret)
            return str(d), "secret"
        raise MountError(
            f'MountVolume.SetUp failed for volume "{name}" : volume type not supported by '
            "the emulator"
        )

    def _project(self, pod: dict, d: Path, name: str, src: dict) -> None:
        """One source of a projected volume: the token, the root CA, configMap keys or downward API fields."""
        if src.get("serviceAccountToken"):
            (d / src["serviceAccountToken"].get("path", "token")).write_text(
                f"emulator-token-{self.uid}"
            )
        if src.get("configMap") and src["configMap"].get("name") == "kube-root-ca.crt":
            for it in src["configMap"].get("items") or []:
                (d / it["path"]).write_text(EMULATOR_CA)
        elif src.get("configMap"):
            ref = src["configMap"]
            cm = self.emu.store.get("configmaps", self.ns, ref.get("name", ""))
            if cm is None and not ref.get("optional"):
                raise MountError(
                    f'MountVolume.SetUp failed for volume "{name}" : '
                    f'configmap "{ref.get("name")}" not found'
                )
            data = dict((cm or {}).get("data") or {})
            pairs = (
                [(it["key"], it["path"]) for it in ref["items"]]
                if ref.get("items")
                else [(k, k) for k in data]
            )
            for key, path in pairs:
                if key not in data and cm is not None:
                    raise MountError(
                        f'MountVolume.SetUp failed for volume "{name}" : configmap references '
                        f"non-existent config key: {key}"
                    )
                target = d / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data.get(key, ""))
        if src.get("downwardAPI"):
            write_downward_api_files(pod, d, src["downwardAPI"].get("items") or [])

    def mounts_for(self, container: dict) -> tuple[list[tuple[str, str, bool]], bool]:
        out = []
        for mount in container.get("volumeMounts") or []:
            src, kind = self.volumes.get(mount["name"], ("", ""))
            if not src:
                continue
            if mount.get("subPath"):
                src = os.path.join(src, mount["subPath"])
                if not os.path.exists(src):
                    os.makedirs(src, exist_ok=True)
            ro = bool(mount.get("readOnly")) or kind in READ_ONLY_VOLUMES
            out.append((src, mount["mountPath"], ro))
        sc = container.get("securityContext") or {}
        return out, bool(sc.get("readOnlyRootFilesystem"))

    def _size_limit_exceeded(self) -> str | None:
        for v in (self.pod.get("spec") or {}).get("volumes") or []:
            empty_dir = v.get("emptyDir")
            if empty_dir is None or not empty_dir.get("sizeLimit") or v["name"] not in self.volumes:
                continue
            limit = parse_quantity(empty_dir["sizeLimit"])
            used = 0
            for root, _, files in os.walk(self.volumes[v["name"]][0]):
                for f in files:
                    try:
                        used += os.lstat(os.path.join(root, f)).st_blocks * 512
                    except OSError:
                        pass
            if used > limit:
                self.emu.truth_record.note("pods", self.key, "size_limit_exceeded", used, raw=True)
                return (
                    f'Usage of EmptyDir volume "{v["name"]}" exceeds the limit '
                    f'"{empty_dir["sizeLimit"]}". '
                )
        return None


class LoopbackPodIPs:
    """The pod IPs of pods that declare ports: loopback addresses 127.B.H.L, from a block B that
    this emulator holds alone among the machine's emulators while it runs (B is never 0, where
    127.0.0.1 and a resolver's 127.0.0.53 live). The block is claimed by binding an abstract
    unix socket named after it: atomic, and released when the emulator stops or its process
    dies. Such a pod shares the host's network (every 127/8 address is the host's own), binds
    its address, and is reached there by pods/proxy; other pods have a network of their own
    with nothing in it."""

    def __init__(self) -> None:
        self.claim: socket.socket | None = None
        self.block = 0
        self.given = 0
        self.lock = threading.Lock()

    def take(self) -> str:
        with self.lock:
            if self.claim is None:
                self._claim()
            high, low = divmod(self.given, 254)  # .0 and .255 last are skipped: they read oddly
            if high > 255:
                raise RuntimeError(f"all 65,024 loopback pod IPs of 127.{self.block}/16 are given")
            self.given += 1
            return f"127.{self.block}.{high}.{low + 1}"

    def holds(self, ip: str) -> bool:
        """Whether `ip` is one of this emulator's loopback pod IPs."""
        return self.claim is not None and ip.startswith(f"127.{self.block}.")

    def release(self) -> None:
        with self.lock:
            if self.claim is not None:
                self.claim.close()
                self.claim = None

    def _claim(self) -> None:
        first = random.randrange(254)
        for offset in range(254):
            block = (first + offset) % 254 + 1
            claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                claim.bind(f"\0rldemo-emulator-pod-ips-127.{block}")
            except OSError:
                claim.close()
                continue
            self.claim, self.block = claim, block
            return
        raise RuntimeError("every block of loopback pod IPs, 127.1/16 to 127.254/16, is held")


class Kubelet:
    """One emulated node: starts a PodWorker per bound pod, deletes finished pods.

    The store's listener only queues the node's pod events; the kubelet's sync loop takes them
    in order and starts, signals and finishes the pod workers, outside the store's lock.
    """

    def __init__(self, emu: Emulator, node: str, index: int):
        self.emu = emu
        self.node = node
        self.index = index
        self.ip = emu.node_ip(node)
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self._ip_seq = 1
        self._ips: dict[str, str] = {}
        self.finalq = WorkQueue()
        self.pod_events: queue.Queue[tuple[str, dict]] = queue.Queue()
        self.thread = threading.Thread(target=self._final_loop, name="kubelet-" + node, daemon=True)
        self.sync_thread = threading.Thread(
            target=self._sync_loop, name="kubelet-sync-" + node, daemon=True
        )

    def start(self) -> None:
        self.thread.start()
        self.sync_thread.start()

    def on_event(self, etype: str, store: str, obj: dict) -> None:
        """Store listener (called with the store lock held): queue this node's pod events only."""
        if store == "pods" and (obj.get("spec") or {}).get("nodeName") == self.node:
            self.pod_events.put((etype, obj))

    def _sync_loop(self) -> None:
        while not self.emu._stopping.is_set():
            try:
                etype, pod = self.pod_events.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._sync_pod(etype, pod)
            except Exception:
                traceback.print_exc()

    def _sync_pod(self, etype: str, obj: dict) -> None:
        metadata = obj["metadata"]
        uid = metadata["uid"]
        with self.lock:
            w = self.workers.get(uid)
            if told_of_removal(etype, w):
                return
            if w is None:
                if pod_terminal(obj):
                    if metadata.get("deletionTimestamp"):
                        self.finalq.add((metadata["namespace"], metadata["name"], uid), 0)
                    return
                if self.emu._stopping.is_set():
                    return
                w = PodWorker(self, obj)
                self.workers[uid] = w
                w.start()
        if metadata.get("deletionTimestamp"):
            w.on_deletion(obj)
            if w.done:
                self.finalq.add((metadata["namespace"], metadata["name"], uid), 0)

    def pod_ip(self, w: PodWorker) -> str:
        """A pod's IP: a loopback one it can serve on when it declares ports, else a made-up
        10.244.N.M that nothing reaches (its network has no route)."""
        with self.lock:
            ip = self._ips.get(w.uid)
            if ip is None:
                if declares_ports(w.pod):
                    ip = self.emu.pod_ips.take()
                else:
                    self._ip_seq += 1
                    ip = f"10.244.{self.index}.{self._ip_seq % 250 + 2}"
                self._ips[w.uid] = ip
            return ip

    def final_delete(self, ns: str, name: str, uid: str) -> None:
        self.finalq.add((ns, name, uid), 0)

    def _final_loop(self) -> None:
        while not self.emu._stopping.is_set():
            key = self.finalq.get(0.2)
            if key is None:
                continue
            ns, name, uid = key
            pod = self.emu.store.get("pods", ns, name)
            if (
                pod is None
                or pod["metadata"]["uid"] != uid
                or not pod["metadata"].get("deletionTimestamp")
            ):
                continue
            if not pod_terminal(pod) and not pod["metadata"].get("deletionGracePeriodSeconds") == 0:
                w = self.workers.get(uid)
                if w is not None and not w.done:
                    continue
            try:
                self.emu.writes.api_delete(
                    CANONICAL["pods"],
                    ns,
                    name,
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                )
            except ApiError:
                pass

    def stop(self) -> None:
        if self.sync_thread.is_alive():
            self.sync_thread.join(2)  # no worker starts after this
        for w in list(self.workers.values()):
            w.deleting.set()
            for r in w.runners:
                r.kill(signal.SIGKILL)
        for w in list(self.workers.values()):
            w.join(5)


# --------------------------------------------------------------------------
# defaulting, admission and validation
# --------------------------------------------------------------------------

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CM_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_BASE64_PREFIX = re.compile(r"[A-Za-z0-9+/]*")


def default_pod_spec(spec: dict) -> None:
    """SetDefaults_PodSpec / Container (the parts clients can observe)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})
        if "imagePullPolicy" not in c:
            image = c.get("image", "")
            last = image.rsplit("/", 1)[-1]
            tagged = ":" in last and not last.endswith(":latest")
            c["imagePullPolicy"] = "IfNotPresent" if (tagged or "@" in image) else "Always"
        for e in c.get("env") or []:
            if (e.get("valueFrom") or {}).get("fieldRef") is not None:
                e["valueFrom"]["fieldRef"].setdefault("apiVersion", "v1")
    for v in spec.get("volumes") or []:
        for item in (v.get("downwardAPI") or {}).get("items") or []:
            if item.get("fieldRef") is not None:
                item["fieldRef"].setdefault("apiVersion", "v1")
        if v.get("configMap") is not None:
            v["configMap"].setdefault("defaultMode", 420)
        if v.get("projected") is not None:
            v["projected"].setdefault("defaultMode", 420)


def validate_pod_spec(spec: dict, path: str) -> list[tuple[str, str, str]]:
    errs: list[tuple[str, str, str]] = []
    containers = spec.get("containers") or []
    if not containers:
        errs.append((f"{path}.containers", "FieldValueRequired", "Required value"))
    vols = {v.get("name") for v in spec.get("volumes") or []}
    seen: set[str] = set()
    for i, c in enumerate(containers):
        cp = f"{path}.containers[{i}]"
        if not c.get("name"):
            errs.append((f"{cp}.name", "FieldValueRequired", "Required value"))
        elif c["name"] in seen:
            errs.append((f"{cp}.name", "FieldValueDuplicate", f'Duplicate value: "{c["name"]}"'))
        seen.add(c.get("name", ""))
        if not c.get("image"):
            errs.append((f"{cp}.image", "FieldValueRequired", "Required value"))
        for j, mount in enumerate(c.get("volumeMounts") or []):
            if mount.get("name") not in vols:
                errs.append(
                    (
                        f"{cp}.volumeMounts[{j}].name",
                        "FieldValueNotFound",
                        f'Not found: "{mount.get("name")}"',
                    )
                )
            if not mount.get("mountPath"):
                errs.append(
                    (
                        f"{cp}.volumeMounts[{j}].mountPath",
                        "FieldValueRequired",
                        "Required value",
                    )
                )
        res = c.get("resources") or {}
        for kind in ("limits", "requests"):
            for rname, q in (res.get(kind) or {}).items():
                try:
                    parse_quantity(q)
                except ValueError as e:
                    errs.append(
                        (
                            f"{cp}.resources.{kind}[{rname}]",
                            "FieldValueInvalid",
                            f'Invalid value: "{q}": {e}',
                        )
                    )
    for i, v in enumerate(spec.get("volumes") or []):
        empty_dir = v.get("emptyDir")
        if empty_dir and empty_dir.get("sizeLimit") is not None:
            try:
                parse_quantity(empty_dir["sizeLimit"])
            except ValueError as e:
                errs.append(
                    (
                        f"{path}.volumes[{i}].emptyDir.sizeLimit",
                        "FieldValueInvalid",
                        f'Invalid value: "{empty_dir["sizeLimit"]}": {e}',
                    )
                )
    restart_policy = spec.get("restartPolicy")
    if restart_policy not in ("Always", "OnFailure", "Never"):
        errs.append(
            (
                f"{path}.restartPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: "{restart_policy}": supported values: "Always", "OnFailure", "Never"',
            )
        )
    return errs


def qos_class(spec: dict) -> str:
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    any_set = False
    guaranteed = True
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        lim = {
            k: parse_quantity(v)
            for k, v in (res.get("limits") or {}).items()
            if k in ("cpu", "memory")
        }
        req = {
            k: parse_quantity(v)
            for k, v in (res.get("requests") or {}).items()
            if k in ("cpu", "memory")
        }
        if lim or req:
            any_set = True
        for k in ("cpu", "memory"):
            if k not in lim or req.get(k, lim.get(k)) != lim.get(k):
                guaranteed = False
        requests.update(req)
        limits.update(lim)
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def validate_pod(body: dict) -> list[tuple[str, str, str]]:
    """A pod's field errors: its spec's."""
    return validate_pod_spec(body.get("spec") or {}, "spec")


def validate_job(body: dict) -> list[tuple[str, str, str]]:
    """A Job's field errors: its pod template's, its counts and completion mode's, its pod failure policy's."""
    spec = body.get("spec") or {}
    tspec = (spec.get("template") or {}).get("spec") or {}
    errs = validate_pod_spec(tspec, "spec.template.spec")
    restart_policy = tspec.get("restartPolicy")
    if restart_policy not in ("OnFailure", "Never"):
        errs = [e for e in errs if e[0] != "spec.template.spec.restartPolicy"]
        errs.append(
            (
                "spec.template.spec.restartPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: "{restart_policy}": supported values: "OnFailure", "Never"',
            )
        )
    errs += _job_count_errors(spec)
    policy = spec.get("podFailurePolicy")
    if policy is not None:
        if restart_policy != "Never":
            errs.append(
                (
                    "spec.template.spec.restartPolicy",
                    "FieldValueInvalid",
                    f'Invalid value: "{restart_policy}": only "Never" is supported when podFailurePolicy '
                    "is specified",
                )
            )
        errs += _pod_failure_policy_errors(policy, spec.get("backoffLimitPerIndex"))
    errs += _success_policy_errors(spec)
    return errs


def _success_policy_errors(spec: dict) -> list[tuple[str, str, str]]:
    """A success policy's errors: Indexed only, at least one rule, each count within completions."""
    policy = spec.get("successPolicy")
    if policy is None:
        return []
    if spec.get("completionMode") != "Indexed":
        return [
            (
                "spec.successPolicy",
                "FieldValueInvalid",
                f"Invalid value: {json.dumps(policy)}: requires indexed completion mode",
            )
        ]
    rules = policy.get("rules") or []
    if not rules:
        return [
            (
                "spec.successPolicy.rules",
                "FieldValueRequired",
                "Required value: at least one rules must be specified when the successPolicy is specified",
            )
        ]
    errs: list[tuple[str, str, str]] = []
    completions = spec.get("completions") or 0
    for number, rule in enumerate(rules):
        path = f"spec.successPolicy.rules[{number}]"
        count = rule.get("succeededCount")
        if count is None and rule.get("succeededIndexes") is None:
            errs.append(
                (
                    path,
                    "FieldValueRequired",
                    "Required value: at least one of succeededCount or succeededIndexes must be specified",
                )
            )
        elif count is not None and (not isinstance(count, int) or count < 0 or count > completions):
            errs.append(
                (
                    path + ".succeededCount",
                    "FieldValueInvalid",
                    f"Invalid value: {count}: must be less than or equal to {completions} "
                    "(the number of specified completions)",
                )
            )
    return errs


def _job_count_errors(spec: dict) -> list[tuple[str, str, str]]:
    """A Job spec's errors in its counts, deadline, completion mode and per-index limits."""
    errs: list[tuple[str, str, str]] = []
    for f in ("parallelism", "completions", "backoffLimit"):
        if spec.get(f) is not None and (not isinstance(spec[f], int) or spec[f] < 0):
            errs.append(
                (
                    f"spec.{f}",
                    "FieldValueInvalid",
                    f"Invalid value: {spec[f]}: must be greater than or equal to 0",
                )
            )
    active_deadline = spec.get("activeDeadlineSeconds")
    if active_deadline is not None and (
        not isinstance(active_deadline, int) or active_deadline <= 0
    ):
        errs.append(
            (
                "spec.activeDeadlineSeconds",
                "FieldValueInvalid",
                f"Invalid value: {active_deadline}: must be greater than or equal to 1",
            )
        )
    if spec.get("completionMode") not in ("NonIndexed", "Indexed"):
        errs.append(
            (
                "spec.completionMode",
                "FieldValueNotSupported",
                f'Unsupported value: "{spec.get("completionMode")}": '
                'supported values: "NonIndexed", "Indexed"',
            )
        )
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        errs.append(
            (
                "spec.completions",
                "FieldValueRequired",
                "Required value: when completion mode is Indexed",
            )
        )
    per_index = spec.get("backoffLimitPerIndex")
    if per_index is not None and spec.get("completionMode") != "Indexed":
        errs.append(
            (
                "spec.backoffLimitPerIndex",
                "FieldValueForbidden",
                "Forbidden: requires indexed completion mode",
            )
        )
    if spec.get("maxFailedIndexes") is not None and per_index is None:
        errs.append(
            (
                "spec.backoffLimitPerIndex",
                "FieldValueRequired",
                "Required value: when maxFailedIndexes is specified",
            )
        )
    if (
        spec.get("maxFailedIndexes") is not None
        and spec.get("completions") is not None
        and spec["maxFailedIndexes"] > spec["completions"]
    ):
        errs.append(
            (
                "spec.maxFailedIndexes",
                "FieldValueInvalid",
                f"Invalid value: {spec['maxFailedIndexes']}: "
                "must be less than or equal to completions",
            )
        )
    return errs


def _pod_failure_policy_errors(policy: dict, per_index: Any) -> list[tuple[str, str, str]]:
    """A pod failure policy's errors: each rule's action and exit codes."""
    errs: list[tuple[str, str, str]] = []
    for number, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        if action not in ("Count", "FailIndex", "FailJob", "Ignore"):
            errs.append(
                (
                    f"spec.podFailurePolicy.rules[{number}].action",
                    "FieldValueNotSupported",
                    f'Unsupported value: "{action}": supported values: "Count", "FailIndex", '
                    '"FailJob", "Ignore"',
                )
            )
        elif action == "FailIndex" and per_index is None:
            errs.append(
                (
                    f"spec.podFailurePolicy.rules[{number}].action",
                    "FieldValueInvalid",
                    'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set',
                )
            )
        codes = rule.get("onExitCodes")
        if codes is not None and codes.get("operator") == "In" and 0 in (codes.get("values") or []):
            errs.append(
                (
                    f"spec.podFailurePolicy.rules[{number}].onExitCodes"
                    f".values[{codes['values'].index(0)}]",
                    "FieldValueInvalid",
                    "Invalid value: 0: must not be 0 for the In operator",
                )
            )
    return errs


def validate_config_map(body: dict) -> list[tuple[str, str, str]]:
    """A ConfigMap's (or a Secret's) field errors: its keys, and values that are not strings."""
    errs: list[tuple[str, str, str]] = []
    for k in list(body.get("data") or {}) + list(body.get("binaryData") or {}):
        if not _CM_KEY.match(k):
            errs.append(
                (
                    f"data[{k}]",
                    "FieldValueInvalid",
                    f'Invalid value: "{k}": a valid config key must consist of alphanumeric '
                    "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', "
                    "regex used for validation is '[-._a-zA-Z0-9]+')",
                )
            )
    for k, v in (body.get("data") or {}).items():
        if not isinstance(v, str):
            errs.append((f"data[{k}]", "FieldValueInvalid", "Invalid value: must be a string"))
    return errs


def validate_runtime_class(body: dict) -> list[tuple[str, str, str]]:
    """A RuntimeClass's field errors: it names a handler."""
    return [] if body.get("handler") else [("handler", "FieldValueRequired", "Required value")]


# The resources whose creates are validated, by store.
VALIDATORS: dict[str, Callable[[dict], list[tuple[str, str, str]]]] = {
    "pods": validate_pod,
    "jobs": validate_job,
    "configmaps": validate_config_map,
    "secrets": validate_config_map,
    "runtimeclasses": validate_runtime_class,
}


def validation_errors(info: ResourceInfo, body: dict) -> list[tuple[str, str, str]]:
    """The field errors a create of `body` answers 422 with (pods, Jobs, ConfigMaps, RuntimeClasses)."""
    validate = VALIDATORS.get(info.store)
    return validate(body) if validate else []


def _delete_path(obj: dict, path: str) -> None:
    """Remove the field at a dotted path with [i] list indexes (unknown fields are dropped)."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    cur: Any = obj
    for p in parts[:-1]:
        if p.startswith("["):
            cur = cur[int(p[1:-1])]
        else:
            cur = cur.get(p)
        if cur is None:
            return
    last = parts[-1]
    if isinstance(cur, dict):
        cur.pop(last, None)


# --------------------------------------------------------------------------
# the write path, the event recorder, the truth record and the emulator
# --------------------------------------------------------------------------


class WritePath:
    """Writes as the API server takes them: decoding checks, admission, defaulting, validation and
    storage for create, update, patch and delete (used by the REST layer and the controllers)."""

    def __init__(
        self, store: Store, faults: Faults, clock: Callable[[], float], version: tuple[int, int]
    ):
        self.store = store
        self.faults = faults
        self.clock = clock
        self.version = version
        self.booted = False  # the bootstrap objects are made; faults apply from here on

    def api_create(
        self, info: ResourceInfo, ns: str | None, body: dict, query: dict[str, str]
    ) -> tuple[dict, list[str]]:
        body = clone(body)
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if not kind:
            raise err_bad_request(
                f"Object 'Kind' is missing in '{json.dumps(body, separators=(',', ':'))[:300]}'"
            )
        if api_version != info.api_version:
            raise err_bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({info.api_version})"
            )
        if kind != info.kind:
            raise err_bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({info.kind})"
            )
        fv = query.get("fieldValidation") or "Warn"
        warnings: list[str] = []
        if info.group != "events.k8s.io":
            unknown = unknown_fields(info.kind, body)
            if unknown:
                listing = ", ".join(f'unknown field "{u}"' for u in unknown)
                if fv == "Strict":
                    raise err_bad_request(
                        f'{info.kind} in version "{info.version}" cannot be handled as a '
                        f"{info.kind}: strict decoding error: {listing}"
                    )
                if fv == "Warn":
                    warnings = [f'unknown field "{u}"' for u in unknown]
                for u in unknown:
                    _delete_path(body, u)
        else:
            body = v1_event_to_core(body)
        metadata = body.setdefault("metadata", {})
        if info.namespaced:
            if metadata.get("namespace") and metadata["namespace"] != ns:
                raise err_bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            metadata["namespace"] = ns
        else:
            metadata.pop("namespace", None)
        dry = query.get("dryRun") == "All"
        created = self.create_object(info, body, dry_run=dry)
        warnings += self._pod_security_warnings(info, ns, created)
        return created, warnings

    def _pod_security_warnings(self, info: ResourceInfo, ns: str | None, obj: dict) -> list[str]:
        """`would violate PodSecurity` warnings for the namespace's warn level (pods and Job templates)."""
        if info.store == "pods":
            spec = obj.get("spec") or {}
        elif info.store == "jobs":
            spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        else:
            return []
        nsobj = self.store.get("namespaces", None, ns or "")
        policy = pod_security_policy(((nsobj or {}).get("metadata") or {}).get("labels"), "warn")
        message = pod_security_message(policy, spec) if policy else None
        return ["would violate" + message[len("violates") :]] if message else []

    def create_object(self, info: ResourceInfo, body: dict, dry_run: bool = False) -> dict:
        """Admission + defaulting + validation + storage (used by the REST layer and controllers)."""
        canon = CANONICAL[info.store]
        body = clone(body)
        body["kind"], body["apiVersion"] = canon.kind, canon.api_version
        body = dict(
            [("kind", body.pop("kind")), ("apiVersion", body.pop("apiVersion"))]
            + list(body.items())
        )
        metadata = body.setdefault("metadata", {})
        for k in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
            "generation",
        ):
            metadata.pop(k, None)
        err_name = metadata.get("name") or metadata.get("generateName") or ""
        if not metadata.get("name") and not metadata.get("generateName"):
            raise err_invalid(
                canon,
                "",
                [
                    (
                        "metadata.name",
                        "FieldValueRequired",
                        "Required value: name or generateName is required",
                    )
                ],
            )
        ns = metadata.get("namespace")
        if canon.namespaced:
            self._check_namespace(canon, ns or "", err_name)
        admit = getattr(self, "_admit_" + canon.store, None)
        if admit is not None:
            admit(body, err_name)
        generated = not metadata.get("name")
        for _ in range(20):
            if generated:
                metadata["name"] = metadata["generateName"] + random_suffix()
            name = metadata["name"]
            pattern = _DNS1123_LABEL if canon.store == "namespaces" else _DNS1123_SUBDOMAIN
            limit = 63 if canon.store == "namespaces" else 253
            if canon.store != "events" and (not pattern.match(name) or len(name) > limit):
                what = "RFC 1123 label" if canon.store == "namespaces" else "RFC 1123 subdomain"
                dots = "" if canon.store == "namespaces" else " or '.'"
                example = "my-name" if canon.store == "namespaces" else "example.com"
                rx = (
                    "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                    if canon.store == "namespaces"
                    else "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                )
                raise err_invalid(
                    canon,
                    name,
                    [
                        (
                            "metadata.name",
                            "FieldValueInvalid",
                            f'Invalid value: "{name}": a lowercase {what} must consist of '
                            f"lower case alphanumeric characters, '-'{dots}, and must start and "
                            f"end with an alphanumeric character (e.g. '{example}', regex used "
                            f"for validation is '{rx}')",
                        )
                    ],
                )
            if canon.store == "namespaces":
                metadata.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            errs = validation_errors(canon, body)
            if errs:
                raise err_invalid(canon, name, errs)
            if dry_run:
                if self.store.get(canon.store, ns if canon.namespaced else None, name) is not None:
                    raise err_already_exists(canon, name)
                metadata.setdefault("uid", str(uuid.uuid4()))
                metadata["creationTimestamp"] = fmt_time(self.clock())
                return body
            try:
                return self.store.create(canon.store, body)
            except KeyError:
                if generated:
                    continue
                raise err_already_exists(canon, name) from None
        raise err_already_exists(canon, metadata.get("name", ""))

    def _check_namespace(self, info: ResourceInfo, ns: str, err_name: str) -> None:
        nsobj = self.store.get("namespaces", None, ns)
        if nsobj is None:
            raise err_not_found(CANONICAL["namespaces"], ns)
        if (
            nsobj["metadata"].get("deletionTimestamp")
            or (nsobj.get("status") or {}).get("phase") == "Terminating"
        ):
            raise err_forbidden(
                info,
                err_name,
                f"unable to create new content in namespace {ns} because it is being terminated",
                [
                    {
                        "reason": "NamespaceTerminating",
                        "message": f"namespace {ns} is being terminated",
                        "field": "metadata.namespace",
                    }
                ],
            )

    # admission / defaulting per resource ----------------------------------
    def _admit_namespaces(self, body: dict, err_name: str) -> None:
        body["spec"] = {"finalizers": ["kubernetes"]}
        body["status"] = {"phase": "Active"}
        if self.booted and self.faults.on("stuck_terminating"):
            fins = body["metadata"].setdefault("finalizers", [])
            if STUCK_FINALIZER not in fins:
                fins.append(STUCK_FINALIZER)

    def _admit_jobs(self, body: dict, err_name: str) -> None:
        metadata = body["metadata"]
        spec = body.setdefault("spec", {})
        tmpl = spec.setdefault("template", {})
        template_metadata = tmpl.setdefault("metadata", {})
        tspec = tmpl.setdefault("spec", {})
        if spec.get("completions") is None and spec.get("parallelism") is None:
            spec["completions"] = 1
            spec["parallelism"] = 1
        if spec.get("parallelism") is None:
            spec["parallelism"] = 1
        spec.setdefault("completionMode", "NonIndexed")
        if spec.get("backoffLimit") is None:
            spec["backoffLimit"] = 6 if spec.get("backoffLimitPerIndex") is None else 2147483647
        spec.setdefault("suspend", False)
        if self.version >= (1, 29):
            spec.setdefault(
                "podReplacementPolicy",
                "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed",
            )
        metadata["uid"] = str(uuid.uuid4())
        name = metadata.get("name") or metadata.get("generateName", "")
        if not spec.get("manualSelector"):
            spec.setdefault("manualSelector", False)
            spec["selector"] = {
                "matchLabels": {"batch.kubernetes.io/controller-uid": metadata["uid"]}
            }
            labels = template_metadata.setdefault("labels", {})
            labels.update(
                {
                    "batch.kubernetes.io/controller-uid": metadata["uid"],
                    "batch.kubernetes.io/job-name": name,
                    "controller-uid": metadata["uid"],
                    "job-name": name,
                }
            )
        default_pod_spec(tspec)
        # A Job without labels takes its template's, selector labels included: the API server
        # defaults them to the template's label map before it adds those to that same map.
        if not metadata.get("labels"):
            metadata["labels"] = dict(template_metadata.get("labels") or {})
        body["status"] = {}
        metadata["generation"] = 1

    def _admit_pods(self, body: dict, err_name: str) -> None:
        spec = body.setdefault("spec", {})
        default_pod_spec(spec)
        if self.version >= (1, 33):
            body["metadata"]["generation"] = 1
        nsobj = self.store.get("namespaces", None, body["metadata"].get("namespace") or "")
        policy = pod_security_policy(((nsobj or {}).get("metadata") or {}).get("labels"), "enforce")
        if policy:
            violation = pod_security_message(policy, spec)
            if violation:
                raise err_forbidden(CANONICAL["pods"], err_name, violation)
        rc_name = spec.get("runtimeClassName")
        if rc_name:
            rc = self.store.get("runtimeclasses", None, rc_name)
            if rc is None:
                raise err_forbidden(
                    CANONICAL["pods"],
                    err_name,
                    f'pod rejected: RuntimeClass "{rc_name}" not found',
                )
            fixed = (rc.get("overhead") or {}).get("podFixed")
            if fixed:
                if spec.get("overhead") and spec["overhead"] != fixed:
                    raise err_forbidden(
                        CANONICAL["pods"],
                        err_name,
                        "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
                    )
                spec["overhead"] = dict(fixed)
        spec.setdefault("serviceAccountName", "default")
        spec["serviceAccount"] = spec["serviceAccountName"]
        if spec.get("automountServiceAccountToken") is not False:
            vname = "kube-api-access-" + random_suffix()
            spec.setdefault("volumes", []).append(
                {
                    "name": vname,
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                }
            )
            for c in spec.get("containers") or []:
                c.setdefault("volumeMounts", []).append(
                    {
                        "name": vname,
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                )
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append(
                    {
                        "key": key,
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 300,
                    }
                )
        spec.setdefault("priority", 0)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        try:
            qos = qos_class(spec)
        except ValueError:
            qos = "BestEffort"
        body["status"] = {"phase": "Pending", "qosClass": qos}

    def _admit_secrets(self, body: dict, err_name: str) -> None:
        """As the v1 Secret decodes: data is base64, stringData is merged into it; type Opaque."""
        data = body.get("data") or {}
        for value in data.values():
            if not isinstance(value, str) or not _BASE64.match(value) or len(value) % 4:
                at = len(_BASE64_PREFIX.match(value).group(0)) if isinstance(value, str) else 0
                raise err_bad_request(
                    'Secret in version "v1" cannot be handled as a Secret: illegal base64 data '
                    f"at input byte {at}"
                )
        for key, value in (body.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        if data:
            body["data"] = data
        body.setdefault("type", "Opaque")

    def _admit_networkpolicies(self, body: dict, err_name: str) -> None:
        body.setdefault("spec", {}).setdefault(
            "policyTypes",
            ["Ingress"] + (["Egress"] if body["spec"].get("egress") is not None else []),
        )
        body["metadata"]["generation"] = 1

    # update / patch ---------------------------------------------------------
    def api_update(
        self,
        info: ResourceInfo,
        ns: str | None,
        name: str,
        sub: str | None,
        body: dict,
        query: dict[str, str],
    ) -> dict:
        if info.group == "events.k8s.io":
            body = v1_event_to_core(body)
        store_ns = ns if info.namespaced else None
        cur = self.store.get(info.store, store_ns, name)
        if cur is None:
            raise err_not_found(info, name)
        body_metadata = body.get("metadata") or {}
        if body_metadata.get("name") and body_metadata["name"] != name:
            raise err_bad_request(
                f"the name of the object ({body_metadata['name']}) does not match the name on the URL "
                f"({name})"
            )
        if (
            sub is None
            and info.group != "events.k8s.io"
            and query.get("fieldValidation") == "Strict"
        ):
            unknown = unknown_fields(info.kind, body)
            if unknown:
                listing = ", ".join(f'unknown field "{u}"' for u in unknown)
                raise err_bad_request(
                    f'{info.kind} in version "{info.version}" cannot be handled as a {info.kind}: '
                    f"strict decoding error: {listing}"
                )
        expect = body_metadata.get("resourceVersion") or None
        if query.get("dryRun") == "All":
            return cur
        has_status = "status" in info.subresources

        def mutate(o: dict) -> bool | None:
            stored_metadata = o["metadata"]
            if sub == "status":
                o["status"] = body.get("status") or {}
                return True
            if sub == "finalize":
                o.setdefault("spec", {})["finalizers"] = (body.get("spec") or {}).get(
                    "finalizers"
                ) or []
                return True
            new_md = dict(body_metadata)
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
                "resourceVersion",
            ):
                if k in stored_metadata:
                    new_md[k] = stored_metadata[k]
                else:
                    new_md.pop(k, None)
            if stored_metadata.get("deletionTimestamp"):
                added = set(new_md.get("finalizers") or []) - set(
                    stored_metadata.get("finalizers") or []
                )
                if added:
                    raise err_invalid(
                        info,
                        name,
                        [
                            (
                                "metadata.finalizers",
                                "FieldValueForbidden",
                                "Forbidden: no new finalizers can be added if the object is "
                                f"being deleted, found new finalizers {sorted(added)}",
                            )
                        ],
                    )
            old_spec = o.get("spec")
            status = o.get("status")
            o.clear()
            o.update(clone(body))
            o["kind"], o["apiVersion"] = (
                CANONICAL[info.store].kind,
                CANONICAL[info.store].api_version,
            )
            o["metadata"] = new_md
            if has_status or info.store == "namespaces":
                if status is not None:
                    o["status"] = status
                else:
                    o.pop("status", None)
            if info.store == "namespaces":
                o["spec"] = old_spec
            if "generation" in new_md and o.get("spec") != old_spec:
                new_md["generation"] = new_md["generation"] + 1
            return True

        try:
            new = self.store.update(
                info.store, store_ns, name, mutate, expect_rv=expect, removes=False
            )
        except ValueError:
            raise err_conflict(info, name) from None
        if new is None:
            raise err_not_found(info, name)
        if self.store.finalized(info.store, new):
            # The update took the last finalizer of an object being deleted: the registry deletes
            # it, and answers the update with it (200), not NotFound.
            self.store.remove(info.store, store_ns, name)
        return new

    def api_patch(
        self,
        info: ResourceInfo,
        ns: str | None,
        name: str,
        sub: str | None,
        ctype: str,
        patch: Any,
        query: dict[str, str],
    ) -> dict:
        store_ns = ns if info.namespaced else None
        cur = self.store.get(info.store, store_ns, name)
        if cur is None:
            raise err_not_found(info, name)
        doc = to_version(info, cur)
        if ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise err_bad_request(
                    "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
                )
            new = json_patch(doc, patch)
        elif ctype == "application/merge-patch+json":
            new = merge_patch(doc, patch)
        elif ctype == "application/strategic-merge-patch+json":
            new = strategic_merge_patch(doc, patch)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json-patch+json, application/merge-patch+json, "
                "application/strategic-merge-patch+json",
                {},
            )
        if not (isinstance(patch, dict) and (patch.get("metadata") or {}).get("resourceVersion")):
            new.setdefault("metadata", {}).pop("resourceVersion", None)
        return self.api_update(info, ns, name, sub, new, query)

    # delete -------------------------------------------------------------------
    def api_evict(self, ns: str, name: str, eviction: Any) -> dict:
        """POST pods/NAME/eviction, as kube-apiserver 1.35 with no PodDisruptionBudget: the pod gets
        the condition DisruptionTarget (EvictionByEvictionAPI, "Eviction API: evicting") in an
        update of its own, then is deleted with the Eviction's deleteOptions (its grace period by
        default); the kubelet stops it as for any deletion, and it ends Failed."""
        info = CANONICAL["pods"]
        options = (eviction.get("deleteOptions") if isinstance(eviction, dict) else None) or {}
        if self.store.get("pods", ns, name) is None:
            raise err_not_found(info, name)
        now = self.clock()

        def disrupt(o: dict) -> bool | None:
            conds = o.setdefault("status", {}).setdefault("conditions", [])
            changed = set_condition(
                conds,
                condition(
                    "DisruptionTarget",
                    "True",
                    now,
                    "EvictionByEvictionAPI",
                    "Eviction API: evicting",
                ),
            )
            return changed

        self.store.update("pods", ns, name, disrupt)
        self.api_delete(info, ns, name, options)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "code": 201,
        }

    def api_delete(
        self, info: ResourceInfo, ns: str | None, name: str, opts: dict
    ) -> tuple[int, dict]:
        store = info.store
        store_ns = ns if info.namespaced else None
        cur = self.store.get(store, store_ns, name)
        if cur is None:
            raise err_not_found(info, name)
        if (
            store == "namespaces" and name in IMMORTAL_NAMESPACES
        ):  # admission, before the registry's checks
            raise err_forbidden(info, name, "this namespace may not be deleted")
        policy = self._deletion_policy(info, name, cur, opts)
        now = self.clock()
        if "All" in (opts.get("dryRun") or []):
            out = clone(cur)
            out["metadata"]["deletionTimestamp"] = fmt_time(now)
            return 200, to_version(info, out)
        if store == "namespaces":
            return 200, self._terminate_namespace(info, cur, policy, now)
        grace = self._pod_grace(cur, opts) if store == "pods" else 0
        fins = list(cur["metadata"].get("finalizers") or [])
        if policy == "Foreground" and FOREGROUND_FINALIZER not in fins:
            fins.append(FOREGROUND_FINALIZER)
        if policy == "Orphan" and ORPHAN_FINALIZER not in fins:
            fins.append(ORPHAN_FINALIZER)
        if not fins and grace == 0:
            if store == "pods" and cur["metadata"].get("deletionTimestamp"):
                # A pod already being deleted is first updated to the shorter grace period, then
                # removed: watchers see it MODIFIED with deletionGracePeriodSeconds 0, then DELETED.
                def shorten(o: dict) -> bool | None:
                    if o["metadata"].get("deletionGracePeriodSeconds") == 0:
                        return False
                    o["metadata"]["deletionTimestamp"] = fmt_time(now)
                    o["metadata"]["deletionGracePeriodSeconds"] = 0
                    return True

                # (The registry writes the shorter grace period as an update of its own, then
                # deletes: the store must not remove the object on that update already.)
                self.store.update(store, store_ns, name, shorten, removes=False)
            final = self.store.remove(store, store_ns, name)
            if final is None:
                raise err_not_found(info, name)
            return 200, final if store == "pods" else deleted_status(
                info, name, cur["metadata"]["uid"]
            )

        def mark(o: dict) -> bool | None:
            stored_metadata = o["metadata"]
            changed = False
            if fins != list(stored_metadata.get("finalizers") or []):
                stored_metadata["finalizers"] = list(fins)
                changed = True
            if not stored_metadata.get("deletionTimestamp") or grace < (
                stored_metadata.get("deletionGracePeriodSeconds") or 0
            ):
                stored_metadata["deletionTimestamp"] = fmt_time(now + grace)
                stored_metadata["deletionGracePeriodSeconds"] = grace
                changed = True
            if not stored_metadata.get("finalizers"):
                stored_metadata.pop("finalizers", None)
            return changed

        new = self.store.update(store, store_ns, name, mark)
        if new is None:
            raise err_not_found(info, name)
        if self.store.get(store, store_ns, name) is None:
            return 200, deleted_status(info, name, cur["metadata"]["uid"])
        code = 202 if policy == "Foreground" and opts.get("orphanDependents") is False else 200
        return code, new

    @staticmethod
    def _deletion_policy(info: ResourceInfo, name: str, cur: dict, opts: dict) -> str:
        """Check the delete's preconditions; its propagation policy, defaulted as the resource's strategy does."""
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
            raise uid_precondition_failed(info, name, pre["uid"], cur["metadata"]["uid"])
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != cur["metadata"]["resourceVersion"]
        ):
            raise err_conflict(info, name)
        policy = opts.get("propagationPolicy")
        if policy is None and opts.get("orphanDependents") is not None:
            policy = "Orphan" if opts["orphanDependents"] else "Background"
        if policy is None:
            policy = "Orphan" if info.store == "jobs" else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise err_invalid(
                info,
                name,
                [
                    (
                        "propagationPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{policy}": supported values: "Foreground", '
                        '"Background", "Orphan", "nil"',
                    )
                ],
            )
        return policy

    def _terminate_namespace(self, info: ResourceInfo, cur: dict, policy: str, now: float) -> dict:
        """A namespace is not removed at once: it turns Terminating for the namespace controller."""
        name = cur["metadata"]["name"]
        if cur["metadata"].get("deletionTimestamp"):
            return cur

        def terminate(o: dict) -> bool | None:
            o["metadata"]["deletionTimestamp"] = fmt_time(now)
            o["metadata"]["deletionGracePeriodSeconds"] = 0
            o.setdefault("status", {})["phase"] = "Terminating"
            if policy == "Orphan":
                fins = o["metadata"].setdefault("finalizers", [])
                if ORPHAN_FINALIZER not in fins:
                    fins.append(ORPHAN_FINALIZER)
            return True

        new = self.store.update("namespaces", None, name, terminate)
        return new if new is not None else cur

    @staticmethod
    def _pod_grace(pod: dict, opts: dict) -> int:
        """The grace period a pod's deletion gives its kubelet: none when it is unbound or finished."""
        if not (pod.get("spec") or {}).get("nodeName") or pod_terminal(pod):
            return 0
        if opts.get("gracePeriodSeconds") is not None:
            return int(opts["gracePeriodSeconds"])
        return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))


def uid_precondition_failed(info: ResourceInfo, name: str, wanted: str, found: str) -> ApiError:
    """409 for a delete whose UID precondition does not hold, worded as kube-apiserver 1.35 words it:
    the namespace registry checks it itself, every other resource's store in its own words."""
    if info.store == "namespaces":
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on namespaces "{name}": Precondition failed: '
            f"UID in precondition: {wanted}, UID in object meta: {found}",
            {"name": name, "kind": "namespaces"},
        )
    details: dict[str, Any] = {"name": name, "kind": info.kind}
    if info.group:
        details["group"] = info.group
    kind = info.kind + ("." + info.group if info.group else "")
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {kind} "{name}": the UID in the precondition ({wanted}) '
        f"does not match the UID in record ({found}). The object might have been deleted and then "
        "recreated",
        details,
    )


# The NamespaceLifecycle admission plugin refuses to delete these.
IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")


def deleted_status(info: ResourceInfo, name: str, uid: str) -> dict:
    """The Status a delete answers when the object is gone at once."""
    details: dict[str, Any] = {"name": name, "kind": info.plural, "uid": uid}
    if info.group:
        details["group"] = info.group
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


class EventRecorder:
    """Records core/v1 Events for the controllers and kubelets, as client-go's recorders do."""

    def __init__(
        self,
        store: Store,
        writes: WritePath,
        clock: Callable[[], float],
        skew: Callable[[], float],
        node_ahead: Callable[[str | None], float] = lambda node: 0.0,
    ):
        self.store = store
        self.writes = writes
        self.clock = clock
        self.skew = skew
        self.node_ahead = node_ahead  # how far a node's clock runs ahead of the API server's
        self._event_index: dict[tuple, tuple[str, str]] = {}
        # Aggregate key -> (first seen, the distinct messages since): client-go's EventAggregator.
        self._event_similar: dict[tuple, tuple[float, set]] = {}

    def record(
        self,
        obj: dict,
        etype: str,
        reason: str,
        message: str,
        component: str,
        host: str | None = None,
        field_path: str | None = None,
    ) -> None:
        """core/v1 event like client-go's EventRecorder: a repeat bumps its event's count; from the
        10th event in 10 minutes that differs only by message (a Job's SuccessfulCreate per pod),
        one combined event stands for them all, "(combined from similar events): <latest message>"."""
        metadata = obj.get("metadata") or {}
        ns = metadata.get("namespace") or "default"
        io: dict[str, Any] = {
            "kind": obj.get("kind"),
            "name": metadata.get("name"),
            "uid": metadata.get("uid"),
            "apiVersion": obj.get("apiVersion"),
            "resourceVersion": metadata.get("resourceVersion"),
        }
        if metadata.get("namespace"):
            io["namespace"] = metadata["namespace"]
        if field_path:
            io["fieldPath"] = field_path
        key = (metadata.get("uid"), field_path, reason, message, component, host, etype)
        similar = (metadata.get("uid"), field_path, reason, component, host, etype)
        first, messages = self._event_similar.get(similar) or (time.time(), set())
        if time.time() - first > EVENT_AGGREGATE_SECONDS:
            first, messages = time.time(), set()
        messages.add(message)
        self._event_similar[similar] = (first, messages)
        if len(messages) >= EVENT_AGGREGATE_AFTER:
            key, message = similar, "(combined from similar events): " + message
        if component == "kubelet" and host:
            # A kubelet's recorder names and stamps its events on its node's clock.
            ahead = self.skew() + self.node_ahead(host)
            named_ns = time.time_ns() + int(round(ahead * 1e9))
            now = time.time() + ahead
        else:
            named_ns, now = time.time_ns(), self.clock()
        existing = self._event_index.get(key)
        if existing and self.store.get("events", existing[0], existing[1]) is not None:

            def bump(o: dict) -> bool | None:
                o["count"] = o.get("count", 1) + 1
                o["lastTimestamp"] = fmt_time(now)
                o["message"] = message
                return True

            self.store.update("events", existing[0], existing[1], bump)
            return
        src: dict[str, Any] = {"component": component}
        if host:
            src["host"] = host
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{metadata.get('name')}.{named_ns:x}", "namespace": ns},
            "involvedObject": io,
            "reason": reason,
            "message": message,
            "source": src,
            "firstTimestamp": fmt_time(now),
            "lastTimestamp": fmt_time(now),
            "count": 1,
            "type": etype,
            "eventTime": None,
            "reportingComponent": component,
            "reportingInstance": host or "",
        }
        try:
            created = self.writes.create_object(CANONICAL["events"], ev)
            self._event_index[key] = (ns, created["metadata"]["name"])
        except ApiError:
            pass

    def record_scheduled(self, pod: dict, note: str, at: float) -> None:
        """The scheduler records through events.k8s.io/v1: eventTime (µs), no first/lastTimestamp."""
        metadata = pod["metadata"]
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{metadata['name']}.{int(at * 1e9):x}",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "kind": "Pod",
                "namespace": metadata["namespace"],
                "name": metadata["name"],
                "uid": metadata["uid"],
                "apiVersion": "v1",
                "resourceVersion": metadata["resourceVersion"],
            },
            "reason": "Scheduled",
            "message": note,
            "source": {},
            "firstTimestamp": None,
            "lastTimestamp": None,
            "type": "Normal",
            "eventTime": fmt_micro(at + self.skew()),
            "action": "Binding",
            "reportingComponent": "default-scheduler",
            "reportingInstance": "default-scheduler-emu-control-plane",
        }
        try:
            self.writes.create_object(CANONICAL["events"], ev)
        except ApiError:
            pass


class TruthRecord:
    """What really happened and when, by the emulator's own clock (tests compare the tool's view
    with it): per pod, Job and namespace, and each pod's creation index, which faults name pods by."""

    def __init__(self, store: Store):
        self.store = store
        self._truth: dict[str, dict[str, dict[str, Any]]] = {
            "pods": {},
            "jobs": {},
            "namespaces": {},
        }
        self._lock = threading.Lock()
        self._pod_index: dict[str, int] = {}
        self._pod_counter = 0

    def snapshot(self) -> dict:
        with self._lock:
            return clone(self._truth)

    def pod_index(self, uid: str) -> int | None:
        with self._lock:
            return self._pod_index.get(uid)

    def note(
        self,
        section: str,
        key: str,
        field: str,
        value: Any = None,
        raw: bool = False,
        first: bool = True,
    ) -> None:
        """Note a field (default: now); unless `raw`, only its first value counts unless `first` is False."""
        with self._lock:
            d = self._truth[section].setdefault(key, {})
            if raw:
                d[field] = value
            elif not first or field not in d:
                d[field] = time.time() if value is None else value

    def on_store_event(self, etype: str, store: str, obj: dict) -> None:
        """Store listener: creation, termination and deletion of pods, Jobs and namespaces."""
        if store not in ("pods", "jobs", "namespaces"):
            return
        metadata = obj["metadata"]
        key = (
            f"{metadata.get('namespace')}/{metadata['name']}"
            if metadata.get("namespace")
            else metadata["name"]
        )
        if etype == "ADDED":
            with self._lock:
                self._truth[store][key] = {
                    "created": self.store.created_wall.pop(metadata["uid"], time.time())
                }
                if store == "pods":
                    self._pod_index[metadata["uid"]] = self._pod_counter
                    self._truth[store][key]["index"] = self._pod_counter
                    self._pod_counter += 1
        elif etype == "DELETED":
            self.note(store, key, "deleted")
        elif metadata.get("deletionTimestamp"):
            self.note(store, key, "terminating")


class Emulator:
    """A Kubernetes API server + controllers + kubelets in one process.

    The composition root: it builds the store, the faults, the read and write paths, the API
    server, the event recorder, the truth record, the controllers and the kubelets, wires the
    store's listeners, and starts and stops them; the tests' handle on all of it.
    """

    def __init__(
        self,
        workdir: Any,
        faults: dict | None = None,
        nodes: int = 3,
        server_version: str = "1.33",
        python: str = sys.executable,
        timing: dict | None = None,
        images: dict | None = GUIDE_IMAGE_ONLY,
    ):
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.faults = Faults(faults)
        self.timing: dict[str, float] = dict(DEFAULT_TIMING)
        self.timing.update(timing or {})
        self.nodes = int(nodes)
        self.server_version = str(server_version).lstrip("v")
        self.v = version_tuple(self.server_version)
        self.python = python
        self.context = "kube-emulator"
        self.requests: list[dict[str, Any]] = []
        self.watches_expired = 0  # watches answered 410 Gone: their client fell behind the history
        self._req_lock = threading.Lock()
        self._stopping = threading.Event()
        self._started = False
        self._stopped = False
        self.store = Store(self.api_now, int(self.timing["watch_history"]))
        self.reads = ReadPath(self)
        self.api = ApiServer(self)
        self.logs: dict[tuple[str, str], list[ContainerLog]] = {}
        self.truth_record = TruthRecord(self.store)
        self.writes = WritePath(self.store, self.faults, self.api_now, self.v)
        self.events = EventRecorder(
            self.store, self.writes, self.api_now, self.api_skew, self.node_offset
        )
        self.replaced_uids: set[str] = set()
        self.kubeconfig = self.workdir / "kubeconfig"
        self.truth_path = self.workdir / "truth.json"
        self.bindir = self.workdir / "bin"
        self.node_names = [f"emu-node-{i + 1}" for i in range(self.nodes)]
        self.images = ImageStore(images, self.node_names)  # each node's images (see ImageStore)
        self.controllers: list[Controller] = [
            JobController(self),
            Scheduler(self),
            GarbageCollector(self),
            NamespaceController(self),
        ]
        self.pod_ips = LoopbackPodIPs()
        self.kubelets = [Kubelet(self, n, i + 1) for i, n in enumerate(self.node_names)]
        self.store.listeners.append(self.truth_record.on_store_event)
        self.store.listeners.append(self._on_store_event)

    # ---------------------------------------------------------------- public
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api.port}"

    def start(self) -> Emulator:
        if self._started:
            return self
        self._started = True
        (self.workdir / "logs").mkdir(exist_ok=True)
        (self.workdir / "pods").mkdir(exist_ok=True)
        (self.workdir / "home").mkdir(exist_ok=True)
        self.bindir.mkdir(exist_ok=True)
        link_python(self.bindir, self.python)
        self.api.listen(0)
        self._write_kubeconfig()
        self._bootstrap()
        self.writes.booted = True
        for c in self.controllers:
            c.start()
        for k in self.kubelets:
            k.start()
        return self

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        env["HOME"] = str(self.workdir / "home")
        return env

    def add_user(
        self, name: str, groups: tuple[str, ...] = (), rules: builtins.list[dict] | None = None
    ) -> Path:
        """A kubeconfig for a new user `name` (a bearer token of its own), context `self.context`;
        with `rules` (RBAC PolicyRules) the user may do only what they grant, else anything."""
        token = self.api.authenticator.add(name, list(groups), rules)
        ca = self._serve_tls()
        path = self.workdir / (f"user-{name}.kubeconfig")
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [
                {
                    "name": self.context,
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.api.tls_port}",
                        "certificate-authority": str(ca),
                    },
                }
            ],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [
                {
                    "name": self.context,
                    "context": {"cluster": self.context, "user": name, "namespace": "default"},
                }
            ],
            "current-context": self.context,
        }
        path.write_text(json.dumps(cfg, indent=2))
        return path

    def truth(self) -> dict:
        return self.truth_record.snapshot()

    def set_faults(self, **kw: Any) -> None:
        self.faults.set(**kw)
        if "missing_runtimeclass" in kw:
            if kw["missing_runtimeclass"] and self.store.get("runtimeclasses", None, "cube"):
                self.store.remove("runtimeclasses", None, "cube")
            elif not kw["missing_runtimeclass"] and not self.store.get(
                "runtimeclasses", None, "cube"
            ):
                self._create_runtimeclass()

    def restart_api(self, down_seconds: float = 1.0) -> None:
        port, tls_port, tls_context = self.api.port, self.api.tls_port, self.api.tls_context
        self.api.close()
        time.sleep(down_seconds)
        deadline = time.time() + 10
        while True:
            try:
                self.api.listen(port)
                if tls_context is not None:
                    self.api.listen_tls(tls_context, tls_port)
                return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)

    def _serve_tls(self) -> Path:
        """Start the TLS listener once, with a CA and a server certificate made by `openssl`; the CA's path."""
        pki = self.workdir / "pki"
        if self.api.tls_httpd is None:
            import ssl
            from control_plane import make_ca, make_cert

            pki.mkdir(exist_ok=True)
            make_ca(pki)
            cert, key = make_cert(
                pki,
                "apiserver",
                "/CN=kube-emulator",
                server_names=("localhost",),
                server_ips=("127.0.0.1",),
            )
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(cert), str(key))
            self.api.listen_tls(context)
        return pki / "ca.crt"

    def get(self, kind_plural: str, namespace: str | None, name: str) -> dict | None:
        info = self._info_for(kind_plural)
        obj = self.store.get(info.store, namespace if info.namespaced else None, name)
        return to_version(info, obj) if obj is not None else None

    def list(self, kind_plural: str, namespace: str | None = None) -> builtins.list[dict]:
        info = self._info_for(kind_plural)
        objs, _ = self.store.list(info.store, namespace if info.namespaced else None)
        return [to_version(info, o) for o in objs]

    def stop(self) -> None:
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        self._stopping.set()
        for k in self.kubelets:
            k.stop()
        self.api.close()
        self.pod_ips.release()
        for c in self.controllers:
            c.thread.join(2)
        try:
            self.truth_path.write_text(json.dumps(self.truth(), indent=2, sort_keys=True))
        except OSError:
            pass

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---------------------------------------------------------------- helpers
    def api_skew(self) -> float:
        return self.faults.timing("api_clock_skew", 0.0)

    def api_now(self) -> float:
        return time.time() + self.api_skew()

    def node_offset(self, node: str | None) -> float:
        """How far this node's clock runs ahead of the API server's (node_clock_offset)."""
        return float((self.faults.value("node_clock_offset") or {}).get(node or "", 0))

    def node_now(self, node: str | None, moment: float | None = None) -> float:
        """The node's clock now (or at `moment`): what its kubelet stamps and names events with."""
        return (
            (time.time() if moment is None else moment) + self.api_skew() + self.node_offset(node)
        )

    def t(self, key: str) -> float:
        return float(self.timing[key])

    def node_ip(self, node: str) -> str:
        try:
            i = self.node_names.index(node)
        except ValueError:
            i = 0
        return f"172.18.0.{i + 2}"

    def pods_watched(self, ns: str, labels: dict[str, str]) -> bool:
        """Has a client asked to watch pods with these labels (by its job-name label, or the label
        that names a batch of several Jobs: every term of its equality selector among them)?"""
        path = f"/api/v1/namespaces/{ns}/pods"
        pairs = {f"{key}={value}" for key, value in labels.items()}
        with self._req_lock:
            return any(
                r["watch"]
                and r["path"] == path
                and r["query"].get("labelSelector")
                and set(r["query"]["labelSelector"].split(",")) <= pairs
                for r in self.requests
            )

    def _info_for(self, plural: str) -> ResourceInfo:
        if plural in CANONICAL:
            return CANONICAL[plural]
        for r in RESOURCES:
            if plural in (r.plural, r.kind.lower(), r.singular) or plural in r.short_names:
                return r
        raise KeyError(plural)

    def _on_store_event(self, etype: str, store: str, obj: dict) -> None:
        for c in self.controllers:
            c.on_event(etype, store, obj)
        for k in self.kubelets:
            k.on_event(etype, store, obj)

    def _write_kubeconfig(self) -> None:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [{"name": self.context, "cluster": {"server": self.url}}],
            "users": [
                {"name": self.context, "user": {"username": "admin", "password": "emulator"}}
            ],
            "contexts": [
                {
                    "name": self.context,
                    "context": {
                        "cluster": self.context,
                        "user": self.context,
                        "namespace": "default",
                    },
                }
            ],
            "current-context": self.context,
        }
        self.kubeconfig.write_text(json.dumps(cfg, indent=2))

    def _create_runtimeclass(self) -> None:
        self.writes.create_object(
            CANONICAL["runtimeclasses"],
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "cube"},
                "handler": "cube",
                "overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}},
            },
        )

    def _bootstrap(self) -> None:
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.writes.create_object(
                CANONICAL["namespaces"],
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )
        import platform

        for i, n in enumerate(self.node_names):
            now = self.api_now()

            def nc(t: str, s: str, r: str, m: str) -> dict:  # called in this turn only
                return {
                    "type": t,
                    "status": s,
                    "lastHeartbeatTime": fmt_time(now),  # noqa: B023
                    "lastTransitionTime": fmt_time(now),  # noqa: B023
                    "reason": r,
                    "message": m,
                }

            res = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
            self.writes.create_object(
                CANONICAL["nodes"],
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": n,
                        "labels": {
                            "kubernetes.io/hostname": n,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "beta.kubernetes.io/os": "linux",
                            "beta.kubernetes.io/arch": "amd64",
                        },
                        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                    },
                    "spec": {
                        "podCIDR": f"10.244.{i + 1}.0/24",
                        "podCIDRs": [f"10.244.{i + 1}.0/24"],
                        "providerID": f"emulator://{n}",
                    },
                    "status": {
                        "capacity": dict(res),
                        "allocatable": dict(res),
                        "conditions": [
                            nc(
                                "MemoryPressure",
                                "False",
                                "KubeletHasSufficientMemory",
                                "kubelet has sufficient memory available",
                            ),
                            nc(
                                "DiskPressure",
                                "False",
                                "KubeletHasNoDiskPressure",
                                "kubelet has no disk pressure",
                            ),
                            nc(
                                "PIDPressure",
                                "False",
                                "KubeletHasSufficientPID",
                                "kubelet has sufficient PID available",
                            ),
                            nc("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                        ],
                        "addresses": [
                            {"type": "InternalIP", "address": self.node_ip(n)},
                            {"type": "Hostname", "address": n},
                        ],
                        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                        "nodeInfo": {
                            "machineID": hex64(n)[:32],
                            "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, n)),
                            "bootID": str(uuid.uuid4()),
                            "kernelVersion": platform.release(),
                            "osImage": "Emulated Linux (bubblewrap)",
                            "containerRuntimeVersion": "containerd://1.7.27",
                            "kubeletVersion": f"v{self.server_version}.0",
                            "kubeProxyVersion": "",
                            "operatingSystem": "linux",
                            "architecture": "amd64",
                        },
                    },
                },
            )
        if not self.faults.on("missing_runtimeclass"):
            self._create_runtimeclass()


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run the Kubernetes API emulator until SIGINT/SIGTERM."
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--faults", default=None, help="JSON object of fault knobs")
    parser.add_argument("--timing", default=None, help="JSON object of timing knobs")
    parser.add_argument(
        "--images",
        default=None,
        help="JSON object: the nodes' images and their registry (ImageStore; default: the "
        "guide's image alone)",
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--server-version", default="1.33")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    emu = Emulator(
        args.workdir,
        faults=json.loads(args.faults) if args.faults else None,
        nodes=args.nodes,
        server_version=args.server_version,
        python=args.python,
        timing=json.loads(args.timing) if args.timing else None,
        images=json.loads(args.images) if args.images else GUIDE_IMAGE_ONLY,
    )
    # A list, not an Event: the handler may run inside Event.wait() while the main thread holds
    # the event's lock, and an Event.set() there would wait for that lock for ever.
    stopping: builtins.list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    emu.start()
    print(f"KUBECONFIG={emu.kubeconfig}", flush=True)
    try:
        while not stopping:
            time.sleep(0.1)
    finally:
        emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
