"""Tests of tests/support/kube_emulator.py driven by REAL kubectl binaries.

kubectl 1.27, 1.33 and 1.35 and bubblewrap are found the way every test file finds
them (tests/conftest.py): a missing one skips its tests, or fails them when $CI is set.
"""

from __future__ import annotations

import calendar
import http.client as http_client
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prereqs  # noqa: E402
from conftest import require_prerequisites  # noqa: E402
from e2e_support import (  # noqa: E402
    SANDBOX_PORT,
    assert_kubelet_135_messages,
    assert_proxy_refusals,
    assert_sandbox_served,
    kubectl_proxy,
    proxied,
    sandbox_manifests,
    status_body,
    unplaced_pod,
    wait_for,
    wait_proxied_ready,
    wait_sandbox_serving,
)
from kube_emulator import ADMIN_BASIC_AUTH, CANONICAL, Emulator, check_faults  # noqa: E402


# --------------------------------------------------------------------------- prerequisites
# One way of finding kubectl and bwrap for every test file: the suite's own (what
# tests/run_tests.py found or fetched), which skips -- or fails under CI -- when one is missing.
KUBECTL_VERSIONS = prereqs.KUBECTL_VERSIONS


def kubectl_of(version: str) -> str:
    path = require_prerequisites(version, bwrap=False)
    assert path is not None
    return path


def default_kubectl() -> str:
    path = require_prerequisites(bwrap=False)
    assert path is not None
    return path


def need_bwrap() -> None:
    require_prerequisites(kubectl=False)


# --------------------------------------------------------------------------- helpers
class Kubectl:
    """Runs a real kubectl against an emulator, the way the product does."""

    def __init__(self, emu: Emulator, binary: str):
        self.emu = emu
        self.binary = binary

    def __call__(
        self, *args: str, input: Optional[str] = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess:
        cmd = [self.binary, "--context", self.emu.context, "--request-timeout=30s", *args]
        p = subprocess.run(
            cmd, input=input, capture_output=True, text=True, env=self.emu.env(), timeout=timeout
        )
        if check and p.returncode != 0:
            raise AssertionError(
                "kubectl %s failed (%d): %s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr)
            )
        return p

    def create(self, obj: dict, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
        return self("create", "-f", "-", *extra, input=json.dumps(obj), check=check)


def job_condition(emu: Emulator, ns: str, name: str, ctype: str) -> bool:
    job = emu.get("jobs", ns, name)
    return bool(job) and any(
        c["type"] == ctype and c["status"] == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def namespace(name: str, **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


EPISODE = r"""
import json, os, socket, sys, time
eid = os.environ["EPISODE_ID"]
r = {"event": "ready", "at": time.time(), "episode_id": eid, "uid": os.getuid(), "gid": os.getgid(),
     "node": os.environ.get("NODE"), "ns": os.environ.get("NS"), "label": os.environ.get("APP")}
try:
    open("/demo/x", "w"); r["demo_ro"] = False
except OSError:
    r["demo_ro"] = True
with open("/workspace/f.txt", "w") as f:
    f.write("ok")
r["ws_rw"] = open("/workspace/f.txt").read() == "ok"
for p in ("/tmp/t", "/root-file"):
    try:
        open(p, "w").write("x"); r["w" + p.replace("/", "_")] = True
    except OSError:
        r["w" + p.replace("/", "_")] = False
try:
    socket.create_connection(("1.1.1.1", 53), timeout=1); r["net"] = True
except OSError:
    r["net"] = False
print(json.dumps(r), flush=True)
print("a plain line", flush=True)
print(json.dumps({"event": "reward", "at": time.time(), "episode_id": eid, "reward": 1}), flush=True)
"""


def job_manifest(
    ns: str,
    count: int = 3,
    parallelism: Optional[int] = None,
    command: Optional[List[str]] = None,
    backoff_limit: int = 0,
    harden: bool = False,
    size_limit: Optional[str] = None,
) -> dict:
    ctr_sc: Dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if harden:
        ctr_sc["readOnlyRootFilesystem"] = True
    ws: Dict[str, Any] = {"name": "workspace", "emptyDir": {}}
    if size_limit:
        ws["emptyDir"]["sizeLimit"] = size_limit
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout", "namespace": ns},
        "spec": {
            "completions": count,
            "parallelism": parallelism or count,
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": 240,
            "template": {
                "metadata": {"labels": {"app": "rl-batch-demo"}},
                "spec": {
                    "runtimeClassName": "cube",
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "runAsNonRoot": True,
                    },
                    "containers": [
                        {
                            "name": "episode",
                            "image": "python:3.12-alpine",
                            "imagePullPolicy": "IfNotPresent",
                            "command": command or ["python", "-B", "/demo/episode.py"],
                            "env": [
                                {
                                    "name": "EPISODE_ID",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                },
                                {
                                    "name": "NODE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                },
                                {
                                    "name": "NS",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                },
                                {
                                    "name": "APP",
                                    "valueFrom": {
                                        "fieldRef": {"fieldPath": "metadata.labels['app']"}
                                    },
                                },
                            ],
                            "securityContext": ctr_sc,
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "64Mi"},
                                "limits": {"cpu": "500m", "memory": "128Mi"},
                            },
                            "volumeMounts": [
                                {"name": "demo", "mountPath": "/demo", "readOnly": True},
                                {"name": "workspace", "mountPath": "/workspace"},
                            ],
                        }
                    ],
                    "volumes": [{"name": "demo", "configMap": {"name": "episode"}}, ws],
                },
            },
        },
    }


def setup_namespace(kubectl: Kubectl, ns: str, episode: str = EPISODE) -> None:
    kubectl.create(namespace(ns, **{"agc-demo-run": "abc"}), "-o", "json")
    kubectl.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "episode", "namespace": ns},
            "data": {"episode.py": episode},
        },
        "-o",
        "json",
    )


def run_job(
    emu: Emulator,
    kubectl: Kubectl,
    ns: str,
    count: int = 3,
    episode: str = EPISODE,
    wait: Optional[str] = "Complete",
    **kw: Any,
) -> dict:
    setup_namespace(kubectl, ns, episode)
    kubectl.create(job_manifest(ns, count, **kw), "-o", "json")
    if wait:
        wait_for(
            lambda: (
                job_condition(emu, ns, "rollout", wait)
                or job_condition(emu, ns, "rollout", "Failed")
            ),
            seconds=120,
        )
    return emu.get("jobs", ns, "rollout")


def pod_names(emu: Emulator, ns: str) -> List[str]:
    return sorted(p["metadata"]["name"] for p in emu.list("pods", ns))


def log_events(text: str) -> List[dict]:
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "event" in obj:
            out.append(obj)
    return out


def http(emu: Emulator, path: str, accept: str = "application/json", timeout: float = 10) -> Any:
    req = urllib.request.Request(emu.url + path, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


# --------------------------------------------------------------------------- fixtures
@pytest.fixture
def emu_factory(tmp_path: Path):
    made: List[Emulator] = []

    def make(**kw: Any) -> Emulator:
        e = Emulator(tmp_path / ("emu%d" % len(made)), **kw)
        made.append(e)
        return e.start()

    yield make
    for e in made:
        e.stop()


@pytest.fixture
def emu(emu_factory) -> Emulator:
    return emu_factory()


# --------------------------------------------------------------------------- the product's flow, per version
@pytest.mark.parametrize("version", KUBECTL_VERSIONS)
def test_full_flow(emu_factory, version: str) -> None:
    need_bwrap()
    emu = emu_factory()
    k = Kubectl(emu, kubectl_of(version))
    assert k("config", "current-context").stdout.strip() == "kube-emulator"
    rc = json.loads(k("get", "runtimeclass", "cube", "-o", "json").stdout)
    assert rc["handler"] == "cube" and rc["overhead"]["podFixed"]["memory"] == "768Mi"
    table = k("get", "runtimeclass", "cube").stdout.splitlines()
    assert table[0].split() == ["NAME", "HANDLER", "AGE"] and table[1].split()[:2] == [
        "cube",
        "cube",
    ]
    ns = "agc-rl-0123456789ab"
    created = json.loads(
        k.create(namespace(ns, **{"agc-demo-run": "0123456789ab"}), "-o", "json").stdout
    )
    assert created["metadata"]["uid"] and created["status"]["phase"] == "Active"
    assert created["metadata"]["labels"]["agc-demo-run"] == "0123456789ab"
    k.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "episode", "namespace": ns},
            "data": {"episode.py": EPISODE},
        },
        "-o",
        "json",
    )
    job = json.loads(k.create(job_manifest(ns, 3), "-o", "json").stdout)
    assert (
        job["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"]
        == job["metadata"]["uid"]
    )
    wait_for(lambda: job_condition(emu, ns, "rollout", "Complete"), seconds=120)
    job = json.loads(k("get", "job", "rollout", "-n", ns, "-o", "json").stdout)
    types = [c["type"] for c in job["status"]["conditions"]]
    assert types == ["SuccessCriteriaMet", "Complete"]
    assert job["status"]["succeeded"] == 3 and job["status"]["completionTime"].endswith("Z")
    pods = json.loads(k("get", "pods", "-n", ns, "-l", "job-name=rollout", "-o", "json").stdout)
    assert pods["kind"] == "List" and len(pods["items"]) == 3
    for p in pods["items"]:
        assert p["status"]["phase"] == "Succeeded"
        assert (
            p["metadata"]["name"].startswith("rollout-")
            and len(p["metadata"]["name"]) == len("rollout-") + 5
        )
        assert p["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
        assert p["spec"]["nodeName"].startswith("emu-node-")
        cs = p["status"]["containerStatuses"][0]
        assert (
            cs["imageID"].startswith("docker.io/library/python@sha256:")
            and len(cs["imageID"].split(":")[-1]) == 64
        )
        assert cs["state"]["terminated"]["exitCode"] == 0 and cs["restartCount"] == 0
        assert p["spec"]["overhead"] == {"cpu": "250m", "memory": "768Mi"}
    names = k("get", "pods", "-n", ns, "-o", "name").stdout.split()
    assert len(names) == 3 and all(n.startswith("pod/rollout-") for n in names)
    for n in names:
        pod = n.split("/", 1)[1]
        text = k("logs", "-n", ns, pod, "-c", "episode").stdout
        evs = log_events(text)
        assert [e["event"] for e in evs] == ["ready", "reward"] and "a plain line" in text
        ready = evs[0]
        assert ready["episode_id"] == pod and ready["uid"] == 1000 and ready["gid"] == 1000
        assert ready["demo_ro"] is True and ready["ws_rw"] is True and ready["net"] is False
        assert ready["w_tmp_t"] is True and ready["w_root-file"] is False
        assert (
            ready["ns"] == ns
            and ready["label"] == "rl-batch-demo"
            and ready["node"].startswith("emu-node-")
        )
    events = k(
        "get", "events", "-n", ns, "--sort-by=.metadata.creationTimestamp"
    ).stdout.splitlines()
    assert events[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    text = "\n".join(events)
    for reason in ("Scheduled", "Pulled", "Created", "Started", "SuccessfulCreate", "Completed"):
        assert reason in text
    assert "Successfully assigned %s/" % ns in text
    posts = [r for r in emu.requests if r["method"] == "POST"]
    assert posts and all(r["query"].get("fieldValidation") == "Strict" for r in posts)
    # cleanup like the product
    k("delete", "job", "rollout", "-n", ns, "--cascade=foreground", "--wait=false")
    wait_for(
        lambda: emu.get("jobs", ns, "rollout") is None and not emu.list("pods", ns), seconds=120
    )
    assert k("get", "job", "rollout", "-n", ns, "-o", "json", "--ignore-not-found").stdout == ""
    k("delete", "namespace", ns, "--wait=false")
    wait_for(lambda: emu.get("namespaces", None, ns) is None, seconds=120)
    assert k("get", "namespace", ns, "-o", "json", "--ignore-not-found").stdout == ""
    truth = emu.truth()
    tp = [truth["pods"][k_] for k_ in truth["pods"] if k_.startswith(ns + "/")]
    assert len(tp) == 3
    for p in tp:
        assert (
            p["created"]
            <= p["scheduled"]
            <= p["sandbox_ready"]
            <= p["container_started"]
            <= p["container_finished"]
            <= p["deleted"]
        )
    tj = truth["jobs"][ns + "/rollout"]
    assert tj["created"] <= tj["success_criteria_met"] <= tj["complete"] <= tj["deleted"]
    assert "deleted" in truth["namespaces"][ns]


def test_defaults_seen_on_a_real_api_server(emu_factory) -> None:
    """What kube-apiserver 1.35 fills in that clients can see (found by tests/benchmarks/compare_clusters.py)."""
    need_bwrap()
    emu = emu_factory(server_version="1.35")
    k = Kubectl(emu, kubectl_of("1.35"))
    ns = "defaults"
    setup_namespace(k, ns)
    job = json.loads(k.create(job_manifest(ns, 1), "-o", "json").stdout)
    # A Job without labels takes its template's, the selector labels the server adds included.
    uid = job["metadata"]["uid"]
    assert job["metadata"]["labels"] == job["spec"]["template"]["metadata"]["labels"]
    assert job["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
    assert job["metadata"]["labels"]["job-name"] == "rollout"
    assert job["spec"]["manualSelector"] is False
    field_ref = job["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["fieldRef"]
    assert field_ref == {"apiVersion": "v1", "fieldPath": "metadata.name"}
    pod = wait_for(
        lambda: [p for p in emu.list("pods", ns) if p["status"].get("phase") == "Succeeded"]
    )[0]
    assert pod["metadata"]["generation"] == 1 and pod["status"]["observedGeneration"] == 1
    events = json.loads(k("get", "events.v1.events.k8s.io", "-n", ns, "-o", "json").stdout)["items"]
    scheduled = [e for e in events if e["reason"] == "Scheduled"]
    assert scheduled and all(e["deprecatedSource"] == {} for e in scheduled)
    # The kubelet's words for the container's steps are kubelet v1.35.4's.
    assert_kubelet_135_messages(emu.list("events", ns))


@pytest.mark.parametrize("version", KUBECTL_VERSIONS)
def test_dry_run_client_list(emu, version: str) -> None:
    k = Kubectl(emu, kubectl_of(version))
    lst = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            namespace("dry"),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "episode", "namespace": "dry"},
                "data": {"episode.py": "print(1)"},
            },
            job_manifest("dry"),
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "deny-all", "namespace": "dry"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
            },
        ],
    }
    out = k("create", "--dry-run=client", "-f", "-", input=json.dumps(lst)).stdout
    assert "namespace/dry created (dry run)" in out and "job.batch/rollout created (dry run)" in out
    assert "networkpolicy.networking.k8s.io/deny-all created (dry run)" in out
    assert not any(r["method"] == "POST" for r in emu.requests)
    assert emu.get("namespaces", None, "dry") is None


@pytest.mark.parametrize("version", KUBECTL_VERSIONS)
def test_api_errors_like_a_real_server(emu, version: str) -> None:
    k = Kubectl(emu, kubectl_of(version))
    k.create(namespace("errs"))
    p = k.create(namespace("errs"), check=False)
    assert (
        p.returncode == 1
        and "(AlreadyExists)" in p.stderr
        and 'namespaces "errs" already exists' in p.stderr
    )
    bad = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "x", "namespace": "errs"},
        "spec": {
            "foo": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "a", "image": "b", "bar": 2}],
                }
            },
        },
    }
    p = k.create(bad, check=False)
    assert p.returncode == 1 and "(BadRequest)" in p.stderr
    assert (
        'strict decoding error: unknown field "spec.foo", unknown field '
        '"spec.template.spec.containers[0].bar"' in p.stderr
    )
    invalid = job_manifest("errs")
    invalid["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    p = k.create(invalid, check=False)
    assert (
        'The Job "rollout" is invalid: spec.template.spec.restartPolicy: Unsupported value: "Always"'
        in p.stderr
    )
    p = k.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "nope"}},
        check=False,
    )
    assert "(NotFound)" in p.stderr and 'namespaces "nope" not found' in p.stderr
    assert k("get", "namespace", "nope", "-o", "json", "--ignore-not-found").stdout == ""
    p = k("get", "job", "rollout", "-n", "errs", "-o", "json", check=False)
    assert p.returncode == 1 and 'jobs.batch "rollout" not found' in p.stderr
    statuses = [r["status"] for r in emu.requests]
    assert 409 in statuses and 400 in statuses and 422 in statuses and 404 in statuses


def test_status_bodies_and_discovery(emu) -> None:
    try:
        http(emu, "/apis/batch/v1/namespaces/default/jobs/nope")
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        assert e.code == 404
        assert body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'jobs.batch "nope" not found',
            "reason": "NotFound",
            "details": {"name": "nope", "group": "batch", "kind": "jobs"},
            "code": 404,
        }
    else:
        raise AssertionError("expected 404")
    version = json.loads(http(emu, "/version"))
    assert version["gitVersion"] == "v1.33.0"
    core = json.loads(http(emu, "/api/v1"))
    names = {r["name"]: r for r in core["resources"]}
    assert {"namespaces", "configmaps", "pods", "pods/log", "events", "nodes"} <= set(names)
    assert names["pods"]["shortNames"] == ["po"] and names["nodes"]["namespaced"] is False
    groups = json.loads(http(emu, "/apis"))
    assert {g["name"] for g in groups["groups"]} == {
        "batch",
        "node.k8s.io",
        "events.k8s.io",
        "networking.k8s.io",
    }
    v2 = urllib.request.urlopen(
        urllib.request.Request(
            emu.url + "/openapi/v2",
            headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"},
        )
    )
    assert (
        v2.headers["Content-Type"] == "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    )
    assert v2.read().startswith(b"\x0a\x032.0")
    idx = json.loads(http(emu, "/openapi/v3"))
    doc = json.loads(http(emu, idx["paths"]["apis/batch/v1"]["serverRelativeURL"]))
    patch = doc["paths"]["/apis/batch/v1/namespaces/{namespace}/jobs/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "Job"
    assert any(p["name"] == "fieldValidation" for p in patch["parameters"])


def test_server_side_tables(emu) -> None:
    need_bwrap()
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "tables", count=1)
    acc = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    expect = {
        "/api/v1/namespaces/tables/pods": [
            "Name",
            "Ready",
            "Status",
            "Restarts",
            "Age",
            "IP",
            "Node",
            "Nominated Node",
            "Readiness Gates",
        ],
        "/apis/batch/v1/namespaces/tables/jobs": [
            "Name",
            "Status",
            "Completions",
            "Duration",
            "Age",
            "Containers",
            "Images",
            "Selector",
        ],
        "/api/v1/namespaces/tables/events": [
            "Last Seen",
            "Type",
            "Reason",
            "Object",
            "Subobject",
            "Source",
            "Message",
            "First Seen",
            "Count",
            "Name",
        ],
        "/api/v1/namespaces": ["Name", "Status", "Age"],
        "/apis/node.k8s.io/v1/runtimeclasses": ["Name", "Handler", "Age"],
        "/api/v1/namespaces/tables/configmaps": ["Name", "Data", "Age"],
        "/api/v1/nodes": [
            "Name",
            "Status",
            "Roles",
            "Age",
            "Version",
            "Internal-IP",
            "External-IP",
            "OS-Image",
            "Kernel-Version",
            "Container-Runtime",
        ],
    }
    for path, cols in expect.items():
        t = json.loads(http(emu, path + "?includeObject=Object", accept=acc))
        assert t["kind"] == "Table" and t["apiVersion"] == "meta.k8s.io/v1"
        assert [c["name"] for c in t["columnDefinitions"]] == cols
        assert t["rows"] and all(len(r["cells"]) == len(cols) and "object" in r for r in t["rows"])
    jobs = json.loads(http(emu, "/apis/batch/v1/namespaces/tables/jobs", accept=acc))
    assert jobs["rows"][0]["cells"][1:3] == ["Complete", "1/1"]
    assert jobs["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    out = k("get", "jobs,pods", "-n", "tables").stdout
    assert "Complete" in out and "Completed" in out
    # the scheduler's event: events.k8s.io with microseconds; core view has no first/lastTimestamp
    evs = json.loads(http(emu, "/apis/events.k8s.io/v1/namespaces/tables/events"))["items"]
    sched = [e for e in evs if e.get("reason") == "Scheduled"][0]
    assert sched["reportingController"] == "default-scheduler" and len(sched["eventTime"]) == len(
        "2026-11-29T20:51:18.123456Z"
    )
    core = [e for e in emu.list("events", "tables") if e["reason"] == "Scheduled"][0]
    assert core["firstTimestamp"] is None and core["lastTimestamp"] is None and core["eventTime"]
    other = [e for e in emu.list("events", "tables") if e["reason"] == "Started"][0]
    assert other["source"]["component"] == "kubelet" and other["source"]["host"].startswith(
        "emu-node-"
    )
    assert other["involvedObject"]["fieldPath"] == "spec.containers{episode}"


# --------------------------------------------------------------------------- watch
@pytest.mark.parametrize("version", ("1.33", "1.35"))
def test_kubectl_watch(emu, version: str) -> None:
    need_bwrap()
    k = Kubectl(emu, kubectl_of(version))
    setup_namespace(k, "w")
    env = emu.env()
    base = [kubectl_of(version), "--context", emu.context, "--request-timeout=30s", "-n", "w"]
    # The pod watch is established before the Job exists, so it sees every change of
    # every pod however fast the pods run (a watch started later may see only the end).
    pp = subprocess.Popen(
        base
        + ["get", "pods", "-l", "job-name=rollout", "-o", "json", "-w", "--output-watch-events"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_for(
        lambda: any(r["watch"] and r["path"] == "/api/v1/namespaces/w/pods" for r in emu.requests),
        seconds=120,
    )
    k.create(job_manifest("w", 2))
    pj = subprocess.Popen(
        base + ["get", "job", "rollout", "-o", "json", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_for(lambda: job_condition(emu, "w", "rollout", "Complete"), seconds=120)
    # Both kubectl processes are stopped only once each has printed what the test reads (on a
    # loaded machine kubectl can take seconds to start and to print): the Job complete, a pod
    # succeeded.
    printed: dict = {pj: [], pp: []}

    def drain(process: subprocess.Popen) -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            printed[process].append(line)

    readers = [threading.Thread(target=drain, args=(p,), daemon=True) for p in (pj, pp)]
    for reader in readers:
        reader.start()
    wait_for(
        lambda: '"Complete"' in "".join(printed[pj]) and '"Succeeded"' in "".join(printed[pp]),
        120,
        "kubectl to print the complete Job and the succeeded pods",
    )
    for p in (pj, pp):
        p.send_signal(signal.SIGINT)
    for p in (pj, pp):
        p.wait(timeout=60)
    for reader in readers:
        reader.join(60)
    out_j, out_p = "".join(printed[pj]), "".join(printed[pp])
    decoder = json.JSONDecoder()
    objs, pos = [], 0
    s = out_j.strip()
    while pos < len(s):
        obj, end = decoder.raw_decode(s, pos)
        objs.append(obj)
        pos = end
        while pos < len(s) and s[pos].isspace():
            pos += 1
    assert objs[0]["kind"] == "Job"
    assert any(c["type"] == "Complete" for c in objs[-1]["status"].get("conditions", []))
    lines = [json.loads(line) for line in out_p.splitlines() if line.strip()]
    types = {ln["type"] for ln in lines}
    assert "ADDED" in types and "MODIFIED" in types
    assert any(ln["object"]["status"].get("phase") == "Succeeded" for ln in lines)
    watches = [r for r in emu.requests if r["watch"]]
    assert any(r["query"].get("labelSelector") == "job-name=rollout" for r in watches)
    assert any(r["query"].get("fieldSelector") == "metadata.name=rollout" for r in watches)


def _read_watch(emu: Emulator, path: str, timeout: float = 10) -> List[dict]:
    raw = http(emu, path, timeout=timeout)
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def test_watch_protocol(emu_factory) -> None:
    emu = emu_factory(timing={"watch_history": 30, "bookmark_interval": 0.2})
    k = Kubectl(emu, default_kubectl())
    k.create(namespace("wp"))
    rv = emu.get("namespaces", None, "wp")["metadata"]["resourceVersion"]
    for i in range(5):
        k.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "c%d" % i, "namespace": "wp"},
            }
        )
    evs = _read_watch(
        emu,
        "/api/v1/namespaces/wp/configmaps?watch=1&resourceVersion=%s&timeoutSeconds=1"
        "&allowWatchBookmarks=true&fieldSelector=metadata.name%%3Dc3" % rv,
    )
    assert [e["type"] for e in evs if e["type"] != "BOOKMARK"] == ["ADDED"]
    assert evs[0]["object"]["metadata"]["name"] == "c3"
    assert any(e["type"] == "BOOKMARK" for e in evs)
    t0 = time.time()
    evs = _read_watch(
        emu,
        "/api/v1/namespaces/wp/configmaps?watch=1&sendInitialEvents=true"
        "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
    )
    # It ends at its timeoutSeconds (1 s), not at the read's; the bound is only wide enough that
    # a loaded machine cannot reach it, and a server that ignored the timeout would pass it.
    assert time.time() - t0 < 30
    added = [e for e in evs if e["type"] == "ADDED"]
    assert len(added) == 6  # 5 + kube-root-ca.crt
    bm = [e for e in evs if e["type"] == "BOOKMARK"][0]
    assert bm["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    for i in range(40):
        k_ = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "d%d" % i, "namespace": "wp"},
        }
        emu.writes.create_object(emu._info_for("configmaps"), k_)
    evs = _read_watch(
        emu, "/api/v1/namespaces/wp/configmaps?watch=1&resourceVersion=2&timeoutSeconds=1"
    )
    assert evs[0]["type"] == "ERROR" and evs[0]["object"]["code"] == 410
    assert (
        evs[0]["object"]["reason"] == "Expired"
        and "too old resource version" in evs[0]["object"]["message"]
    )


def test_restart_api_breaks_watches(emu) -> None:
    k = Kubectl(emu, default_kubectl())
    port = emu.api.port
    proc = subprocess.Popen(
        [default_kubectl(), "--context", emu.context, "get", "namespaces", "-w", "-o", "name"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=emu.env(),
    )
    wait_for(lambda: any(r["watch"] for r in emu.requests), seconds=120)
    emu.restart_api(down_seconds=0.5)
    assert emu.api.port == port
    proc.wait(timeout=15)  # the broken watch ends kubectl get -w
    assert k("get", "namespace", "default", "-o", "name").stdout.strip() == "namespace/default"


# --------------------------------------------------------------------------- deletion semantics
@pytest.mark.parametrize("version", ("1.27", "1.35"))
def test_delete_with_wait_does_not_hang(emu, version: str) -> None:
    need_bwrap()
    k = Kubectl(emu, kubectl_of(version))
    sleeper = "import time; print('start', flush=True); time.sleep(60)"
    setup_namespace(k, "dw", sleeper)
    k.create(job_manifest("dw", 2, command=["python", "-c", sleeper]))
    wait_for(
        lambda: (
            all(p["status"].get("phase") == "Running" for p in emu.list("pods", "dw"))
            and len(emu.list("pods", "dw")) == 2
        ),
        seconds=120,
    )
    # Not hanging is each kubectl's own timeout (it fails the call), not a wall time here.
    k("delete", "job", "rollout", "-n", "dw", "--cascade=foreground", timeout=120)
    assert emu.get("jobs", "dw", "rollout") is None and not emu.list("pods", "dw")
    k("delete", "namespace", "dw", timeout=120)
    assert emu.get("namespaces", None, "dw") is None
    if version == "1.35":
        assert any(r["query"].get("sendInitialEvents") == "true" for r in emu.requests)


def test_a_pod_being_deleted_is_updated_to_grace_0_before_it_goes(tmp_path: Path) -> None:
    """The kubelet's final delete (grace 0) of a pod already being deleted: the registry writes the
    shorter grace period as an update of its own, then deletes, so watchers see MODIFIED with
    deletionGracePeriodSeconds 0, then DELETED (as kubelet v1.35.4's pods showed on the real API
    server). The store removed it on that update at once, and watchers saw only DELETED."""
    emu = Emulator(tmp_path / "emu")  # not started: the write path alone
    emu.store.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "deletionGracePeriodSeconds": 2,
            },
            "spec": {"nodeName": "emu-node-0"},
            "status": {"phase": "Failed"},
        },
    )
    code, _ = emu.writes.api_delete(CANONICAL["pods"], "ns", "p", {"gracePeriodSeconds": 0})
    assert code == 200 and emu.store.get("pods", "ns", "p") is None
    seen = [
        (kind, event["metadata"].get("deletionGracePeriodSeconds"))
        for _, kind, store, event in emu.store.events_since(0)
        if store == "pods"
    ]
    assert seen == [("ADDED", 2), ("MODIFIED", 0), ("DELETED", 0)]


def test_foreground_deletion_order(emu) -> None:
    need_bwrap()
    k = Kubectl(emu, default_kubectl())
    sleeper = "import time; time.sleep(60)"
    setup_namespace(k, "fg", sleeper)
    k.create(job_manifest("fg", 2, command=["python", "-c", sleeper]))
    wait_for(
        lambda: (
            len([p for p in emu.list("pods", "fg") if p["status"].get("phase") == "Running"]) == 2
        )
    )
    k("delete", "job", "rollout", "-n", "fg", "--cascade=foreground", "--wait=false")
    job = emu.get("jobs", "fg", "rollout")
    assert (
        job["metadata"]["deletionTimestamp"]
        and "foregroundDeletion" in job["metadata"]["finalizers"]
    )
    wait_for(lambda: emu.get("jobs", "fg", "rollout") is None, seconds=120)
    truth = emu.truth()
    pods = [v for key, v in truth["pods"].items() if key.startswith("fg/")]
    assert all(p["deleted"] <= truth["jobs"]["fg/rollout"]["deleted"] for p in pods)
    delete = [r for r in emu.requests if r["method"] == "DELETE"][0]
    assert delete["status"] == 200


def test_namespace_termination_and_terminating_namespace(emu_factory) -> None:
    emu = emu_factory(faults={"stuck_terminating": True})
    k = Kubectl(emu, default_kubectl())
    k.create(namespace("stuck"))
    k("delete", "namespace", "stuck", "--wait=false")

    def conditioned() -> Optional[dict]:
        got = emu.get("namespaces", None, "stuck") or {}
        types = {c["type"] for c in got.get("status", {}).get("conditions", [])}
        return (
            got
            if {"NamespaceContentRemaining", "NamespaceDeletionDiscoveryFailure"} <= types
            else None
        )

    # The namespace controller's conditions, not a pause that a loaded machine can outlast.
    ns = wait_for(conditioned, 120, "the namespace's deletion conditions")
    assert ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    assert ns["metadata"]["finalizers"] == ["example.com/stuck"] and ns["spec"]["finalizers"] == []
    conds = {c["type"]: c for c in ns["status"]["conditions"]}
    assert conds["NamespaceContentRemaining"]["status"] == "False"
    assert conds["NamespaceDeletionDiscoveryFailure"]["reason"] == "ResourcesDiscovered"
    p = k.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "late", "namespace": "stuck"},
        },
        check=False,
    )
    assert "(Forbidden)" in p.stderr
    assert (
        "unable to create new content in namespace stuck because it is being terminated" in p.stderr
    )
    out = k("get", "namespace", "stuck").stdout
    assert "Terminating" in out


# --------------------------------------------------------------------------- kubelet behaviour
def test_logs_waiting_follow_and_previous(emu_factory) -> None:
    need_bwrap()
    # The sandbox waits for a watch on the Job's pods: the container is still being created
    # when its log is first asked for, however long kubectl takes to start.
    emu = emu_factory(
        faults={"sandbox_delay": 0.2, "sandbox_jitter": 0, "sandbox_after_watch": True}
    )
    k = Kubectl(emu, default_kubectl())
    prog = "import time\nfor i in range(3):\n    print('tick', i, flush=True); time.sleep(0.3)\n"
    setup_namespace(k, "lg", prog)
    k.create(job_manifest("lg", 1))
    pod = wait_for(lambda: pod_names(emu, "lg"))[0]
    p = k("logs", "-n", "lg", pod, "-c", "episode", check=False)
    assert p.returncode == 1
    assert (
        'container "episode" in pod "%s" is waiting to start: ContainerCreating' % pod in p.stderr
    )
    _read_watch(
        emu, "/api/v1/namespaces/lg/pods?watch=1&labelSelector=job-name%3Drollout&timeoutSeconds=1"
    )
    wait_for(lambda: emu.get("pods", "lg", pod)["status"].get("phase") == "Running", seconds=120)
    out = k("logs", "-n", "lg", pod, "-c", "episode", "-f", "--timestamps").stdout
    assert [ln.split(" ", 1)[1] for ln in out.splitlines()] == ["tick 0", "tick 1", "tick 2"]
    assert out.splitlines()[0].split(" ")[0].endswith("Z")
    p = k("logs", "-n", "lg", pod, "-c", "episode", "--previous", check=False)
    assert "previous terminated container" in p.stderr


def test_read_only_root_and_size_limit(emu) -> None:
    need_bwrap()
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "ro", count=1, harden=True)
    pod = pod_names(emu, "ro")[0]
    ready = log_events(k("logs", "-n", "ro", pod).stdout)[0]
    assert ready["w_tmp_t"] is False and ready["w_root-file"] is False and ready["ws_rw"] is True
    filler = (
        "open('/workspace/big', 'wb').write(b'x' * 3 * 1024 * 1024); import time; time.sleep(20)"
    )
    setup_namespace(k, "sz", filler)
    k.create(job_manifest("sz", 1, size_limit="1Mi", command=["python", "-c", filler]))
    pod = wait_for(
        lambda: [p for p in emu.list("pods", "sz") if p["status"].get("reason") == "Evicted"],
        seconds=120,
    )[0]
    assert pod["status"]["phase"] == "Failed"
    assert (
        'Usage of EmptyDir volume "workspace" exceeds the limit "1Mi"' in pod["status"]["message"]
    )
    wait_for(lambda: job_condition(emu, "sz", "rollout", "Failed"), seconds=120)


def test_run_as_non_root_violation(emu) -> None:
    need_bwrap()
    k = Kubectl(emu, default_kubectl())
    setup_namespace(k, "nr")
    job = job_manifest("nr", 1)
    del job["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    k.create(job)
    pod = wait_for(
        lambda: [
            p
            for p in emu.list("pods", "nr")
            if ((p["status"].get("containerStatuses") or [{}])[0].get("state") or {})
            .get("waiting", {})
            .get("reason")
            == "CreateContainerConfigError"
        ],
        seconds=120,
    )[0]
    msg = pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert msg.startswith("container has runAsNonRoot and image will run as root")
    assert "CreateContainerConfigError" in k("get", "pods", "-n", "nr").stdout


# --------------------------------------------------------------------------- fault knobs
def test_fault_missing_runtimeclass(emu_factory) -> None:
    emu = emu_factory(faults={"missing_runtimeclass": True}, timing={"create_retry_base": 0.1})
    k = Kubectl(emu, default_kubectl())
    p = k("get", "runtimeclass", "cube", check=False)
    assert p.returncode == 1 and 'runtimeclasses.node.k8s.io "cube" not found' in p.stderr
    run_job(emu, k, "mrc", wait=None)
    ev = wait_for(
        lambda: [e for e in emu.list("events", "mrc") if e["reason"] == "FailedCreate"], seconds=120
    )[0]
    assert ev["type"] == "Warning" and ev["source"]["component"] == "job-controller"
    assert (
        ev["message"]
        == 'Error creating: pods "rollout-" is forbidden: pod rejected: RuntimeClass "cube" not found'
    )
    assert not emu.list("pods", "mrc")
    emu.set_faults(missing_runtimeclass=False)
    wait_for(lambda: job_condition(emu, "mrc", "rollout", "Complete"), seconds=120)


def test_fault_fail_pods(emu_factory) -> None:
    need_bwrap()
    emu = emu_factory(faults={"fail_pods": [1]})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "fp", wait="Failed")
    job = emu.get("jobs", "fp", "rollout")
    conds = [(c["type"], c.get("reason")) for c in job["status"]["conditions"]]
    assert conds == [("FailureTarget", "BackoffLimitExceeded"), ("Failed", "BackoffLimitExceeded")]
    failed = [p for p in emu.list("pods", "fp") if p["status"]["phase"] == "Failed"]
    assert failed
    bad = [
        p
        for p in emu.list("pods", "fp")
        if p["metadata"]["name"]
        == [key for key, v in emu.truth()["pods"].items() if v.get("index") == 1][0].split("/")[1]
    ][0]
    assert bad["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert "injected container failure" in k("logs", "-n", "fp", bad["metadata"]["name"]).stdout
    assert "BackoffLimitExceeded" in k("get", "events", "-n", "fp").stdout


def test_fault_image_pull_backoff(emu_factory) -> None:
    need_bwrap()
    emu = emu_factory(faults={"image_pull_backoff": [0]}, timing={"image_pull_backoff": 0.2})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "ipb", count=1, wait=None)
    wait_for(lambda: any(e["reason"] == "BackOff" for e in emu.list("events", "ipb")), seconds=120)
    pod = emu.list("pods", "ipb")[0]
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] in (
        "ErrImagePull",
        "ImagePullBackOff",
    )
    reasons = {(e["type"], e["reason"], e["message"]) for e in emu.list("events", "ipb")}
    assert ("Warning", "Failed", "Error: ErrImagePull") in reasons
    assert ("Normal", "BackOff", 'Back-off pulling image "python:3.12-alpine"') in reasons
    out = k("get", "pods", "-n", "ipb").stdout
    assert "ErrImagePull" in out or "ImagePullBackOff" in out


def test_fault_sandbox_delay_and_job_status_lag(emu_factory) -> None:
    need_bwrap()
    emu = emu_factory(faults={"sandbox_delay": 0.5, "sandbox_jitter": 0.3, "job_status_lag": 0.6})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "sd", count=2)
    truth = emu.truth()
    for key, p in truth["pods"].items():
        if key.startswith("sd/"):
            # The delay drawn lies in [delay, delay + jitter] and the sandbox is never
            # ready before it has passed; the loose upper bound only catches a delay
            # ignored altogether, whatever the machine's load.
            assert 0.5 <= p["sandbox_delay"] <= 0.8
            assert (
                p["sandbox_delay"] <= p["sandbox_ready"] - p["scheduled"] <= p["sandbox_delay"] + 5
            )
    last_finish = max(
        p["container_finished"] for key, p in truth["pods"].items() if key.startswith("sd/")
    )
    # the controller batches pod updates: status follows the last pod, within its lag (+ load)
    assert 0.0 < truth["jobs"]["sd/rollout"]["success_criteria_met"] - last_finish <= 0.6 + 5


def test_fault_api_clock_skew(emu_factory) -> None:
    emu = emu_factory(faults={"api_clock_skew": 3600})
    k = Kubectl(emu, default_kubectl())
    before = time.time()
    ns = json.loads(k.create(namespace("skew"), "-o", "json").stdout)
    after = time.time()
    created = (
        time.mktime(time.strptime(ns["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        - time.timezone
    )
    # Stamped an hour ahead (truncated to its second) during the create call, however long it took.
    assert before + 3600 - 1 <= created <= after + 3600, (created - before, after - before)
    assert before <= emu.truth()["namespaces"]["skew"]["created"] <= after


def test_fault_node_clock_offset(emu_factory) -> None:
    """One node's clock runs an hour ahead: its kubelet's stamps, event names and times, and its
    containers' clock readings are on it; the other nodes, the API server and the truth are not."""
    need_bwrap()
    emu = emu_factory(faults={"node_clock_offset": {"emu-node-1": 3600}})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "nodeclock", count=6, parallelism=6)
    truth = emu.truth()["pods"]
    pods = emu.list("pods", "nodeclock")
    assert {p["spec"]["nodeName"] for p in pods} > {"emu-node-1"}, (
        "the pods must spread over the nodes"
    )

    def epoch_seconds(text: str) -> float:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))

    # The hour is what is held; the minute's margin only absorbs the load between the moments compared.
    for pod in pods:
        name, ahead = (
            pod["metadata"]["name"],
            3600 if pod["spec"]["nodeName"] == "emu-node-1" else 0,
        )
        true = truth["nodeclock/" + name]
        assert 0 <= true["container_started"] < true["container_finished"] < time.time()
        assert abs(epoch_seconds(pod["status"]["startTime"]) - (true["scheduled"] + ahead)) < 60
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (
            abs(epoch_seconds(terminated["finishedAt"]) - (true["container_finished"] + ahead)) < 60
        )
        assert abs(epoch_seconds(pod["metadata"]["creationTimestamp"]) - true["created"]) < 60
        ready, reward = log_events(k("logs", "-n", "nodeclock", name).stdout)
        assert abs(ready["at"] - (true["container_started"] + ahead)) < 60
        assert abs(reward["at"] - (true["container_finished"] + ahead)) < 60
        for event in emu.list("events", "nodeclock"):
            if event["involvedObject"].get("name") != name:
                continue
            named = int(event["metadata"]["name"].rsplit(".", 1)[1], 16) / 1e9
            on_node = (event.get("source") or {}).get("component") == "kubelet"
            assert abs(named - (true["container_started"] + (ahead if on_node else 0))) < 60, event
            if on_node:
                assert abs(epoch_seconds(event["firstTimestamp"]) - named) < 60, event
                created = epoch_seconds(event["metadata"]["creationTimestamp"])
                assert abs(created - true["container_started"]) < 60, event
    with pytest.raises(ValueError, match="node_clock_offset takes"):
        check_faults({"node_clock_offset": 1.5})


def test_fault_api_latency_and_errors(emu_factory) -> None:
    emu = emu_factory(faults={"api_latency": 0.3})
    k = Kubectl(emu, default_kubectl())
    t0 = time.time()
    k("get", "namespace", "default", "-o", "name")
    assert time.time() - t0 >= 0.3
    emu.set_faults(
        api_latency=0, api_errors={"count": 1, "match": "/runtimeclasses/cube", "status": 503}
    )
    p = k("get", "runtimeclass", "cube", "-o", "json", check=False)
    assert p.returncode == 1 and "ServiceUnavailable" in p.stderr
    assert json.loads(k("get", "runtimeclass", "cube", "-o", "json").stdout)["handler"] == "cube"
    assert [r["status"] for r in emu.requests if "runtimeclasses/cube" in r["path"]] == [503, 200]


def test_fault_unreadable_logs(emu_factory) -> None:
    need_bwrap()
    emu = emu_factory(faults={"unreadable_logs": [0]})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "ul", count=2)
    idx0 = [key for key, v in emu.truth()["pods"].items() if v.get("index") == 0][0].split("/")[1]
    p = k("logs", "-n", "ul", idx0, "-c", "episode", check=False)
    assert p.returncode == 1 and 'Error from server: Get "https://' in p.stderr
    assert (
        ":10250/containerLogs/ul/%s/episode" % idx0 in p.stderr
        and "connect: connection refused" in p.stderr
    )
    other = [n for n in pod_names(emu, "ul") if n != idx0][0]
    assert log_events(k("logs", "-n", "ul", other, "-c", "episode").stdout)


def test_fault_restart_container(emu_factory) -> None:
    need_bwrap()
    emu = emu_factory(faults={"restart_container": [0]}, timing={"restart_delay": 0.1})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "rc", count=1)
    pod = emu.list("pods", "rc")[0]
    cs = pod["status"]["containerStatuses"][0]
    assert pod["status"]["phase"] == "Succeeded" and cs["restartCount"] == 1
    assert (
        cs["lastState"]["terminated"]["exitCode"] == 1
        and cs["state"]["terminated"]["exitCode"] == 0
    )
    assert cs["lastState"]["terminated"]["containerID"] != cs["state"]["terminated"]["containerID"]
    name = pod["metadata"]["name"]
    assert "injected crash" in k("logs", "-n", "rc", name, "--previous").stdout
    assert log_events(k("logs", "-n", "rc", name).stdout)[0]["event"] == "ready"
    assert "1 (" in k("get", "pods", "-n", "rc").stdout


def test_fault_replace_pod(emu_factory) -> None:
    need_bwrap()
    emu = emu_factory(faults={"replace_pod": [0]}, timing={"replace_after": 0.2})
    k = Kubectl(emu, default_kubectl())
    slow = EPISODE + "\ntime.sleep(1)\n"
    run_job(emu, k, "rp", count=2, episode=slow)
    pods = emu.list("pods", "rp")
    assert len(pods) == 3
    evicted = [p for p in pods if p["status"].get("reason") == "Evicted"]
    assert len(evicted) == 1 and evicted[0]["status"]["phase"] == "Failed"
    assert any(c["type"] == "DisruptionTarget" for c in evicted[0]["status"]["conditions"])
    assert emu.get("jobs", "rp", "rollout")["status"]["succeeded"] == 2


def test_fault_log_tamper(emu_factory) -> None:
    need_bwrap()
    modes = {"0": "duplicate_ready", "1": "drop_reward", "2": "wrong_id", "3": "junk_lines"}
    emu = emu_factory(faults={"log_tamper": modes})
    k = Kubectl(emu, default_kubectl())
    run_job(emu, k, "lt", count=4, parallelism=4)
    by_index = {
        v["index"]: key.split("/")[1]
        for key, v in emu.truth()["pods"].items()
        if key.startswith("lt/")
    }
    logs = {i: k("logs", "-n", "lt", by_index[i]).stdout for i in range(4)}
    assert [e["event"] for e in log_events(logs[0])] == ["ready", "ready", "reward"]
    assert [e["event"] for e in log_events(logs[1])] == ["ready"]
    ev2 = log_events(logs[2])
    assert ev2[0]["episode_id"] != by_index[2] and ev2[1]["episode_id"] == by_index[2]
    assert "emulator junk line" in logs[3] and [e["event"] for e in log_events(logs[3])] == [
        "ready",
        "reward",
    ]


# --------------------------------------------------------------------------- CLI
# --------------------------------------------------------------------------- live sandboxes: pods/proxy
# A pod without ports, asking for the sandbox's address directly.
NEIGHBOUR = """
import os, socket
try:
    socket.create_connection((os.environ["SERVER_IP"], int(os.environ["SERVER_PORT"])), timeout=5)
    print("reached", flush=True)
except OSError as error:
    print("unreachable:", error.errno, error.strerror, flush=True)
"""


def neighbour_pod(ns: str, server_ip: str) -> dict:
    env = {"SERVER_IP": server_ip, "SERVER_PORT": str(SANDBOX_PORT)}
    container = {
        "name": "c",
        "image": "python:3.12-alpine",
        "command": ["python", "-c", NEIGHBOUR],
        "env": [{"name": k, "value": v} for k, v in env.items()],
    }
    spec = {"restartPolicy": "Never", "containers": [container]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "neighbour", "namespace": ns},
        "spec": spec,
    }


def test_a_live_sandbox_through_kubectl_proxy_and_the_pod_proxy(emu_factory, tmp_path) -> None:
    """The draft sandbox server as the tool will ship it, reached as the tool will reach it: kubectl
    proxy on a unix socket, the API server's pods/proxy, the pod's own loopback IP. The API server's
    answers when it cannot relay, and a pod being deleted (proxied until it is gone, then 404)."""
    need_bwrap()
    emu = emu_factory(server_version="1.35")
    kubectl = Kubectl(emu, default_kubectl())
    ns = "pool"
    kubectl.create(namespace(ns))
    for manifest in [*sandbox_manifests(ns), unplaced_pod(ns)]:
        kubectl.create(manifest)
    assert "Opaque" in kubectl("get", "secret", "sandbox-token", "-n", ns).stdout
    ip = wait_sandbox_serving(emu, ns, "sandbox")
    assert ipaddress.ip_address(ip).is_loopback and not ip.startswith("127.0."), ip
    assert emu.get("pods", ns, "unplaced")["status"].get("podIP") is None
    with kubectl_proxy(kubectl.binary, emu.env(), tmp_path / "proxy.sock") as connection:
        wait_proxied_ready(connection, ns, "sandbox")
        assert_sandbox_served(connection, ns, "sandbox")
        assert_proxy_refusals(connection, ns, "sandbox", ip, "unplaced")

        # Every other pod has a network of its own with nothing in it: 127/8 there is its own
        # loopback, where nothing listens, while from the host the sandbox is there.
        socket.create_connection((ip, SANDBOX_PORT), timeout=5).close()
        kubectl.create(neighbour_pod(ns, ip))
        wait_for(
            lambda: emu.get("pods", ns, "neighbour")["status"].get("phase") == "Succeeded",
            60,
            "the neighbour to end",
        )
        said = kubectl("logs", "-n", ns, "neighbour").stdout
        assert said.strip() == "unreachable: 111 Connection refused", said

        # A pod being deleted is still relayed to: its server, which ends on SIGTERM, no longer
        # listens (503, as the real server says of a dial refused); once it is gone, not found.
        ready = f"/api/v1/namespaces/{ns}/pods/sandbox:{SANDBOX_PORT}/proxy/ready"
        kubectl("delete", "pod", "sandbox", "-n", ns, "--grace-period=30", "--wait=false")
        assert emu.get("pods", ns, "sandbox")["metadata"].get("deletionTimestamp")
        wait_for(
            lambda: proxied(connection, "GET", ready)[0] in (503, 404), 30, "the server to stop"
        )
        wait_for(lambda: emu.get("pods", ns, "sandbox") is None, 60, "the pod to go")
        gone = status_body(
            404, "NotFound", 'pods "sandbox" not found', {"name": "sandbox", "kind": "pods"}
        )
        assert proxied(connection, "GET", ready) == (404, gone)


# Answers every method with what it was sent; /chunked answers without a length, /redirect
# with a Location on its own host, and every answer carries a CORS header and one of its own.
ECHO_SERVER = """
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer

class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"part1", b"part2"):
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(part), part))
            self.wfile.write(b"0\\r\\n\\r\\n")
            return
        seen = {"method": self.command, "path": self.path, "headers": self.headers.items(),
                "body": body.decode()}
        data = json.dumps(seen).encode()
        self.send_response(302 if self.path == "/redirect" else 200)
        if self.path == "/redirect":
            self.send_header("Location", "/elsewhere?x=1")
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("X-Echo", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = answer

HTTPServer((os.environ["POD_IP"], 8080), Echo).serve_forever()
"""


def echo_pod(ns: str) -> dict:
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    container = {
        "name": "echo",
        "image": "python:3.12-alpine",
        "command": ["python", "-c", ECHO_SERVER],
        "ports": [{"containerPort": 8080}],
        "env": [pod_ip],
    }
    spec = {"restartPolicy": "Never", "containers": [container]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "echo", "namespace": ns},
        "spec": spec,
    }


def test_the_pod_proxy_relays_as_the_api_server_does(emu_factory) -> None:
    """Method, path (cleaned), query, body and end-to-end headers reach the pod; the hop-by-hop
    headers and the client's credentials do not, X-Forwarded-For and -Uri are added; the pod's
    status, headers and body come back (chunked when it gave no length, CORS headers taken off, a
    redirect pointed back through the proxy), all on one kept-alive connection; a path-less GET is
    redirected; RBAC asks for pods/proxy with the method's verb."""
    need_bwrap()
    emu = emu_factory(server_version="1.35")
    kubectl = Kubectl(emu, default_kubectl())
    kubectl.create(namespace("relay"))
    kubectl.create(echo_pod("relay"))
    wait_sandbox_serving(emu, "relay", "echo")
    base = "/api/v1/namespaces/relay/pods/echo:8080/proxy"
    connection = http_client.HTTPConnection("127.0.0.1", emu.api.port, timeout=30)

    def call(method: str, path: str, body: Optional[bytes] = None, **headers: str) -> Any:
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        assert not answer.will_close
        return answer, data

    wait_for(lambda: call("GET", base + "/ready")[0].status == 200, 30, "the echo server")
    connection.close()
    connection.connect()
    kept = connection.sock
    headers = {"Authorization": ADMIN_BASIC_AUTH, "Keep-Alive": "timeout=5", "X-Token": "t"}
    answer, data = call("PATCH", base + "/a/c?x=1&path=zzz", b'{"a": 1}', **headers)
    seen = json.loads(data)
    sent = {k.lower(): v for k, v in seen["headers"]}
    assert (answer.status, seen["method"], seen["path"], seen["body"]) == (
        200,
        "PATCH",
        "/a/c?x=1&path=zzz",
        '{"a": 1}',
    )
    assert sent["x-token"] == "t" and sent["x-forwarded-for"] == "127.0.0.1", sent
    assert sent["x-forwarded-uri"] == "/api/v1/namespaces/relay/pods/echo:8080/proxy/a/c", sent
    assert not {"authorization", "keep-alive"} & set(sent), sent
    assert (
        answer.getheader("X-Echo") == "1"
        and answer.getheader("Access-Control-Allow-Origin") is None
    )
    for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS"):
        answer, data = call(method, base + "/m/")
        assert (answer.status, json.loads(data)["method"], json.loads(data)["path"]) == (
            200,
            method,
            "/m/",
        )
    assert json.loads(call("GET", base + "/a/./b/../c/")[1])["path"] == "/a/c/"
    answer, data = call("HEAD", base + "/h")
    assert answer.status == 200 and data == b"" and int(answer.getheader("Content-Length")) > 0
    answer, data = call("GET", base + "/chunked")
    assert (answer.status, answer.getheader("Transfer-Encoding"), data) == (
        200,
        "chunked",
        b"part1part2",
    )
    answer, _ = call("GET", base + "/redirect")
    assert (answer.status, answer.getheader("Location")) == (302, base + "/elsewhere?x=1")
    answer, _ = call("GET", base + "?q=1")
    assert (answer.status, answer.getheader("Location")) == (301, base + "/?q=1")
    answer, data = call("POST", base)
    assert (answer.status, json.loads(data)["path"]) == (200, "/")
    assert connection.sock is kept
    connection.close()

    # RBAC: a GET through the proxy is `get` on pods/proxy, a POST `create`, named NAME:PORT.
    rules = [{"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}]
    reader = emu.add_user("reader", rules=rules)
    as_reader = ["--kubeconfig", str(reader)]
    assert kubectl(*as_reader, "get", "--raw", base + "/r").returncode == 0
    refused = kubectl(
        *as_reader, "create", "--raw", base + "/r", "-f", "-", input="{}", check=False
    )
    assert (
        'pods "echo:8080" is forbidden: User "reader" cannot create resource "pods/proxy" in API '
        'group "" in the namespace "relay"'
    ) in refused.stderr, refused.stderr


def test_cli(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent / "kube_emulator.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), "--workdir", str(tmp_path / "cli"), "--nodes", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("KUBECONFIG=")
        env = dict(os.environ, KUBECONFIG=line.split("=", 1)[1], HOME=str(tmp_path / "clihome"))
        out = subprocess.run(
            [default_kubectl(), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        ).stdout.split()
        assert out == ["node/emu-node-1", "node/emu-node-2"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert (tmp_path / "cli" / "truth.json").exists()


def test_an_unknown_fault_is_refused_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault.*replace_pods"):
        Emulator(tmp_path / "typo", faults={"replace_pods": [0]})
    emu = Emulator(tmp_path / "known", faults={"replace_pod": [0]})
    with pytest.raises(ValueError, match="unknown fault.*api_latncy"):
        emu.set_faults(api_latncy=1.0)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0.0, "0s"),
        (0.0009, "0s"),
        (0.85, "850ms"),
        (1.5, "1.5s"),
        (62.5, "1m2.5s"),
        (3600.0, "1h0m0s"),
        (2.0, "2s"),
        (1.2345, "1.234s"),
    ],
)
def test_pull_durations_read_as_the_kubelet_prints_them(seconds: float, text: str) -> None:
    from kube_emulator import go_duration

    assert go_duration(seconds) == text


def test_image_store_knows_each_nodes_images() -> None:
    from kube_emulator import ImageStore

    store = ImageStore(
        {
            "registry": {"python:3.12": 10},
            "present": {"docker.io/library/python:3.12": ["n1"]},
            "pull_bytes_per_second": 1000,
        },
        ["n1", "n2"],
    )
    assert store.has("n1", "python:3.12") and not store.has("n2", "python:3.12")
    assert store.exists("docker.io/library/python:3.12") and not store.exists("nope:1")
    seconds, size = store.pull("n2", "python:3.12", lambda: False)
    assert size == 10 and store.has("n2", "python:3.12")
    assert ImageStore(None, ["n1"]).has(
        "n1", "anything:1"
    )  # without the option every image is present
    with pytest.raises(ValueError, match="unknown images option"):
        ImageStore({"registery": {}}, ["n1"])


def test_an_emulators_nodes_have_the_guides_image_alone_unless_told_otherwise(tmp_path) -> None:
    from kube_emulator import ANY_IMAGE, Emulator, ImageStore, present_images

    store = Emulator(tmp_path / "emu").images  # not started: its image store alone
    assert store.has("emu-node-1", "python:3.12-alpine")
    assert store.has("emu-node-3", "docker.io/library/python:3.12-alpine")
    # A typo is in no node's store and no registry: its pull fails, as on a real node.
    assert not store.has("emu-node-1", "pyton:3.12-alpine")
    assert not store.exists("pyton:3.12-alpine")
    assert ImageStore(ANY_IMAGE, ["n1"]).has("n1", "pyton:3.12-alpine")
    named = ImageStore(present_images(["busybox:1", "registry.local/agent:7"]), ["n1"])
    assert named.has("n1", "docker.io/library/busybox:1")
    assert named.has("n1", "registry.local/agent:7")
    assert not named.has("n1", "python:3.12-alpine") and not named.exists("python:3.12-alpine")


def test_pod_lifecycles_as_kubelet_135_shows_them(require_e2e, tmp_path):
    """The emulator's kubelet and API server against what kubelet v1.35.4 showed of the same pods
    (tests/support/compare_nodes.py): ended, failed, deleted, evicted through the Eviction API, past
    their deadline (running, and after succeeding), an image no registry has, a Job's pod."""
    import compare_nodes

    kubectl = require_e2e("1.35")
    emulator = compare_nodes.start_side("emulator", tmp_path / "emulator")
    try:
        record = compare_nodes.scenarios(kubectl, emulator.env(), tmp_path)
    finally:
        emulator.stop()
    (tmp_path / "record.json").write_text(json.dumps(record, indent=1))
    differences = compare_nodes.kubelet_135_differences(record, deadline_flip=True)
    assert differences == [], "\n".join(differences)


def test_a_client_gone_mid_request_leaves_no_traceback(tmp_path: Path, capfd: Any) -> None:
    import socket
    import struct

    emu = Emulator(tmp_path / "emu", nodes=1).start()
    port = int(emu.url.rsplit(":", 1)[1])
    reset = struct.pack("ii", 1, 0)  # SO_LINGER 0: close() sends a reset
    try:
        # One gone while the server reads its request's headers, others right after asking.
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        client.close()
        for _ in range(10):
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(b"GET /api/v1/namespaces?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
            client.close()
        time.sleep(0.5)
        assert json.loads(http(emu, "/api/v1/namespaces"))["items"]  # still serving
    finally:
        emu.stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err
