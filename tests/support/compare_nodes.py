#!/usr/bin/env python3
"""Run the same small pod scenarios on one kind of node; print what kubectl showed, normalised.

    python3 tests/support/compare_nodes.py --side emulator|agent|kubelet --out FILE [--kubectl PATH]
    python3 tests/support/compare_nodes.py --diff FILE_A FILE_B

`emulator` is the tests' API emulator and its kubelet, `agent` the real control
plane with tests/support/node_agent.py, `kubelet` the real control plane with a real
kubelet, containerd and runc (tests/support/real_node.py, as root: run it under
`flock /tmp/real-node.lock`; `agent` under `flock /tmp/real-cluster.lock`).
Each scenario is one pod: it ends well, fails, is deleted while running, runs
past its activeDeadlineSeconds, ends well before its deadline and is read after
it, names an image no registry has, is evicted through the Eviction API; and a
Job of one pod. For every pod the file holds each status its watch delivered
(phase, reason, conditions, container states, deletion), its events in order,
and its last pod object. `--diff` prints a unified diff of two sides' files, then
the stand-ins' known differences from a real cluster that no scenario shows
(`KNOWN_DIFFERENCES`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

SUPPORT_DIR = Path(__file__).resolve().parent
TESTS_DIR = SUPPORT_DIR.parent  # local_cluster.py
sys.path[:0] = [str(SUPPORT_DIR), str(TESTS_DIR), str(TESTS_DIR.parent)]

import prereqs  # noqa: E402

IMAGE = "python:3.12-alpine"
MISSING_IMAGE = "python:0.0-absent"
NAMESPACE = "nodecmp"
SLEEP = ["python", "-c", "import time; time.sleep(600)"]
# What runs to the end, and what is stopped before it: pod name -> (command, spec fields).
SCENARIOS: Dict[str, Any] = {
    "ok": (["python", "-c", "print('done')"], {}),
    "fail": (["python", "-c", "import sys; print('bad'); sys.exit(3)"], {}),
    "deleted": (SLEEP, {"terminationGracePeriodSeconds": 2}),
    "deadline": (SLEEP, {"activeDeadlineSeconds": 8, "terminationGracePeriodSeconds": 2}),
    "deadline-after-ok": (["python", "-c", "print('quick')"], {"activeDeadlineSeconds": 6}),
    "pull": (["python", "-c", "print(1)"], {"image": MISSING_IMAGE}),
    "evicted": (SLEEP, {"terminationGracePeriodSeconds": 2}),
}


# Where a stand-in does otherwise than a real cluster (API server and kubelet v1.35) on purpose,
# in what the scenarios above do not show; each says why, and what the real one does.
KNOWN_DIFFERENCES: Dict[str, List[str]] = {
    "emulator": [
        "pods/proxy relays to the loopback pod IPs (127.B.H.L, a block of the emulator's own) it "
        "gives pods that declare ports; the real API server refuses a loopback or link-local pod "
        "IP (400 'address not allowed'), which no real pod has",
        "a pod that declares ports shares the host's network namespace, its loopback address its "
        "own: it reaches every such pod and the host's loopback services; every other pod has an "
        "empty network namespace of its own (127/8 there is its own loopback) and reaches no pod, "
        "where a real pod network lets every pod reach every other and no host service",
        "pods/proxy to any other pod IP (the made-up 10.244.N.M) answers 503 'connection refused' "
        "without a packet sent; an ended pod's loopback address refuses at once too, where on a "
        "real node the address has left the bridge and a dial finds no host",
        "pods/proxy neither rewrites the links of a text/html answer nor relays an upgrade "
        "(WebSocket, SPDY): the Upgrade header is dropped as hop-by-hop",
        "NetworkPolicies are stored and never enforced (a pod's empty network namespace reaches "
        "nothing anyway), and hostAliases are not written into a pod's /etc/hosts: a real node "
        "with a policy plugin enforces the one, and its kubelet writes the other",
        "there is no Kueue: no Workload, LocalQueue or ClusterQueue is served and nothing "
        "suspends a labelled Job, so a --queue run's admission (queue_wait, Pending messages, "
        "eviction) is proven on the real control plane with Kueue v0.17.0's own manager alone",
    ],
    "agent": [
        "pods that declare ports share one network namespace (tests/support/pod_network.py), each "
        "on its own 10.246.B.H: a server that binds 0.0.0.0 holds its port for all of them",
        "pods without ports have made-up IPs (10.244.N.M) nothing routes: the real API server "
        "would send a pods/proxy request for one out through the host's default route; the "
        "tests never ask it to",
        "NetworkPolicies are not enforced and hostAliases not written into /etc/hosts (the pods "
        "run with the host's resolver); envFrom and the rest of a pod's environment are as the "
        "kubelet makes them",
    ],
}


def pod_manifest(name: str, command: List[str], extra: Dict[str, Any]) -> Dict[str, Any]:
    spec = {k: v for k, v in extra.items() if k != "image"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"scenario": name}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "c",
                    "image": extra.get("image", IMAGE),
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                }
            ],
            **spec,
        },
    }


def job_manifest() -> Dict[str, Any]:
    pod = pod_manifest("job", ["python", "-c", "print('job')"], {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "job"},
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"labels": {"scenario": "job"}}, "spec": pod["spec"]},
        },
    }


# -- what a status looks like, without names, times and addresses -------------------------------


def normalise(text: str) -> str:
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", text)
    text = re.sub(
        r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<uid>", text
    )
    text = re.sub(r"\b[0-9a-f]{64}\b", "<hex>", text)
    text = re.sub(r"\b\d+(\.\d+)?(ms|s)\b", "<dur>", text)
    text = re.sub(r"\b(\d{1,3}\.){3}\d{1,3}(:\d+)?\b", "<ip>", text)
    text = re.sub(r"job-[bcdfghjklmnpqrstvwxz2456789]{5}\b", "job-<x>", text)
    return re.sub(r"(emu-node|rldemo-node)(-\d+)?", "<node>", text)


def container_summary(status: Dict[str, Any]) -> str:
    (state, fields), *_ = (status.get("state") or {"none": {}}).items()
    shown = [state]
    for key in ("reason", "exitCode", "message", "signal"):
        if key in fields:
            shown.append(f"{key}={fields[key]!r}")
    for key in ("startedAt", "finishedAt"):
        if key in fields:
            shown.append(f"{key}={'set' if fields[key] else fields[key]!r}")
    shown.append(f"ready={status.get('ready')} started={status.get('started')}")
    return " ".join(shown)


def pod_summary(pod: Dict[str, Any]) -> List[str]:
    """The lines that say what a pod's status is at one moment."""
    status, metadata = pod.get("status") or {}, pod["metadata"]
    lines = [f"phase={status.get('phase')}"]
    for key in ("reason", "message"):
        if key in status:
            lines.append(f"{key}={status[key]!r}")
    if metadata.get("deletionTimestamp"):
        lines.append(f"deleting grace={metadata.get('deletionGracePeriodSeconds')}")
    if metadata.get("finalizers"):
        lines.append(f"finalizers={metadata['finalizers']}")
    for c in status.get("conditions") or []:
        text = f"condition {c['type']}={c['status']}"
        for key in ("reason", "message"):
            if c.get(key):
                text += f" {key}={c[key]!r}"
        lines.append(text)
    for c in status.get("containerStatuses") or []:
        lines.append(f"container {c['name']}: {container_summary(c)}")
    return [normalise(line) for line in lines]


def watch_steps(stream: str) -> Dict[str, List[List[str]]]:
    """pod name -> each distinct status its watch delivered, in order (a repeat is dropped)."""
    decoder, index, out = json.JSONDecoder(), 0, {}  # type: ignore[var-annotated]
    while True:
        while index < len(stream) and stream[index].isspace():
            index += 1
        if index >= len(stream):
            return out
        try:
            event, index = decoder.raw_decode(stream, index)
        except ValueError:
            return out
        pod = event.get("object") or {}
        name = (pod.get("metadata") or {}).get("labels", {}).get("scenario")
        if not name:
            continue
        step = [event.get("type", "?")] + pod_summary(pod)
        steps = out.setdefault(name, [])
        if not steps or steps[-1][1:] != step[1:]:
            steps.append(step)


def event_lines(events: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """pod name (or Job) -> its events in the order they were first recorded."""
    out: Dict[str, List[str]] = {}
    ordered = sorted(
        events,
        key=lambda e: (e.get("firstTimestamp") or e.get("eventTime") or "", e["metadata"]["name"]),
    )
    for e in ordered:
        involved = e["involvedObject"]
        name = involved.get("name", "")
        key = "job" if name.startswith("job") else name
        line = " ".join(
            [
                involved.get("kind", ""),
                e.get("type", ""),
                e.get("reason", ""),
                (e.get("source") or {}).get("component") or e.get("reportingComponent") or "",
                involved.get("fieldPath", "-"),
                f"x{e.get('count') or 1}",
                repr(normalise(e.get("message", ""))),
            ]
        )
        out.setdefault(key, []).append(line)
    return out


# -- running the scenarios -------------------------------------------------------------------------


class Runner:
    def __init__(self, kubectl: str, env: Dict[str, str], namespace: str):
        self.kubectl, self.env, self.namespace = kubectl, env, namespace

    def run(self, *args: str, stdin: str = "", check: bool = True) -> str:
        done = subprocess.run(
            [self.kubectl, *args],
            input=stdin,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def pods(self) -> Dict[str, Dict[str, Any]]:
        items = json.loads(self.run("get", "pods", "-n", self.namespace, "-o", "json"))["items"]
        return {p["metadata"]["labels"]["scenario"]: p for p in items}


def running(pod: Optional[Dict[str, Any]]) -> bool:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and "running" in (statuses[0].get("state") or {})


def waiting_reason(pod: Optional[Dict[str, Any]]) -> str:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return (
        ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason", "")
        if statuses
        else ""
    )


def scenarios(
    kubectl: str, env: Dict[str, str], workdir: Path, namespace: str = NAMESPACE
) -> Dict[str, Any]:
    """Run every scenario at once in one namespace; what kubectl showed of each."""
    k = Runner(kubectl, env, namespace)
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    k.run("create", "-f", "-", stdin=json.dumps(manifest))
    for _ in range(60):
        if k.run("get", "serviceaccount", "default", "-n", namespace, check=False):
            break
        time.sleep(0.5)
    watch_file = workdir / "watch.json"
    with open(watch_file, "w") as sink:
        watch = subprocess.Popen(
            [kubectl, "get", "pods", "-n", namespace, "-o", "json", "-w", "--output-watch-events"],
            env=env,
            stdout=sink,
            stderr=subprocess.DEVNULL,
        )
    try:
        time.sleep(1.0)
        items = [pod_manifest(n, cmd, extra) for n, (cmd, extra) in SCENARIOS.items()]
        items.append(job_manifest())
        k.run(
            "create",
            "-n",
            namespace,
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        stopped: set = set()
        refused: List[str] = []
        started = time.monotonic()
        last: Dict[str, Dict[str, Any]] = {}
        while time.monotonic() - started < 90:
            pods = k.pods()
            last.update(pods)
            for name in ("deleted", "evicted"):
                if name not in stopped and running(pods.get(name)):
                    stopped.add(name)
                    if name == "deleted":
                        k.run("delete", "pod", name, "-n", namespace, "--wait=false")
                    else:
                        body = {
                            "apiVersion": "policy/v1",
                            "kind": "Eviction",
                            "metadata": {"name": name, "namespace": namespace},
                        }
                        try:
                            k.run(
                                "create",
                                "--raw",
                                f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                                "-f",
                                "-",
                                stdin=json.dumps(body),
                            )
                        except RuntimeError as error:
                            refused.append(normalise(str(error)))
                            k.run("delete", "pod", name, "-n", namespace, "--wait=false")
            ended = (
                all(
                    (pods.get(n) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")
                    for n in ("ok", "fail", "deadline", "deadline-after-ok", "job")
                    if n in pods
                )
                and "job" in pods
            )
            gone = stopped == {"deleted", "evicted"} and not {"deleted", "evicted"} & set(pods)
            pulled = waiting_reason(pods.get("pull")) == "ImagePullBackOff"
            if ended and gone and pulled and time.monotonic() - started > 20:
                break
            time.sleep(0.5)
        time.sleep(2.0)
        final = k.pods()
        events = json.loads(k.run("get", "events", "-n", namespace, "-o", "json"))["items"]
        job = json.loads(k.run("get", "job", "job", "-n", namespace, "-o", "json"))
    finally:
        watch.terminate()
        watch.wait(10)
    k.run("delete", "namespace", namespace, "--wait=false", check=False)
    steps = watch_steps(watch_file.read_text())
    by_pod = event_lines(events)
    record: Dict[str, Any] = {}
    for name in list(SCENARIOS) + ["job"]:
        record[name] = {
            "watch": steps.get(name, []),
            "events": by_pod.get(name, []),
            # A pod gone before the last read ends with what its watch last showed.
            "final": pod_summary(final[name])
            if name in final
            else (steps.get(name) or [["", "(none)"]])[-1][1:],
            "gone": name not in final,
        }
    record["evicted"]["eviction refused"] = refused
    record["job"]["job conditions"] = [
        normalise(f"{c['type']}={c['status']} {c.get('reason')} {c.get('message')!r}")
        for c in (job.get("status") or {}).get("conditions") or []
    ]
    return record


# -- what kubelet v1.35.4 showed (tests/support/real_node.py), which the stand-ins are held to -----------


def steps_with(record: Dict[str, Any], pod: str, *lines: str) -> List[List[str]]:
    """The watch steps of `pod` that hold every one of `lines`."""
    return [s for s in record[pod]["watch"] if all(line in s for line in lines)]


def kubelet_135_differences(
    record: Dict[str, Any], deadline_flip: Optional[bool] = None
) -> List[str]:
    """What a side's record shows otherwise than kubelet v1.35.4 did; empty when it agrees.

    A pod whose container ended well before its activeDeadlineSeconds ended three ways on the
    real node: Succeeded; Succeeded, then Failed (DeadlineExceeded); or Failed (DeadlineExceeded)
    without ever being Succeeded. It turned Failed when the deadline passed while the kubelet
    was still finishing the pod (a slow image pull delaying it), and stayed Succeeded when the
    kubelet had finished first. `deadline_flip` True requires Succeeded then Failed (the
    stand-ins always make it, the hardest case for a reader), False forbids the flip, None
    takes any of the three."""
    out: List[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            out.append(what)

    def final(pod: str) -> List[str]:
        return record[pod]["final"]

    ready = {
        "Succeeded": "condition Ready=False reason='PodCompleted'",
        "Failed": "condition Ready=False reason='PodFailed'",
    }
    for pod, phase, container in (
        ("ok", "Succeeded", "container c: terminated reason='Completed' exitCode=0"),
        ("fail", "Failed", "container c: terminated reason='Error' exitCode=3"),
    ):
        expect(f"phase={phase}" in final(pod), f"{pod}: not {phase}: {final(pod)}")
        expect(ready[phase] in final(pod), f"{pod}: Ready not False/{ready[phase]}")
        expect(
            any(line.startswith(container) for line in final(pod)), f"{pod}: container not ended"
        )
        # The container's end first shows with the phase the pod had (Running, or Pending when
        # the kubelet had not written Running yet), its sandbox still ready; the terminal phase
        # follows.
        expect(
            any(
                ("phase=Running" in s or "phase=Pending" in s)
                and "condition PodReadyToStartContainers=True" in s
                and any(line.startswith(container) for line in s)
                for s in record[pod]["watch"]
            ),
            f"{pod}: the container's end came with the terminal phase",
        )
    initialized = "condition Initialized=True reason='PodCompleted'"
    expect(initialized in final("ok"), "ok: Initialized without reason PodCompleted")
    expect(initialized not in final("fail"), "fail: Initialized with reason PodCompleted")

    killed = "container c: terminated reason='Error' exitCode=137 startedAt='set'"
    for pod in ("deleted", "evicted", "deadline"):
        last = record[pod]["watch"][-1] if record[pod]["watch"] else []
        expect("phase=Failed" in last, f"{pod}: last status not Failed: {last}")
        expect(any(line.startswith(killed) for line in last), f"{pod}: container not 137/Error")
        expect(ready["Failed"] in last, f"{pod}: Ready not PodFailed")
        expect(
            not any("ContainerStatusUnknown" in line for s in record[pod]["watch"] for line in s),
            f"{pod}: a container reported as not located",
        )
        expect(
            any(" Killing kubelet spec.containers{c} " in e for e in record[pod]["events"])
            and any("'Stopping container c'" in e for e in record[pod]["events"]),
            f"{pod}: no Killing event",
        )
    for pod in ("deleted", "evicted"):
        expect(record[pod]["gone"], f"{pod}: still there")
        expect(bool(steps_with(record, pod, "deleting grace=2")), f"{pod}: no graceful deletion")
        expect(bool(steps_with(record, pod, "deleting grace=0")), f"{pod}: not deleted for good")
    disrupted = (
        "condition DisruptionTarget=True reason='EvictionByEvictionAPI' "
        "message='Eviction API: evicting'"
    )
    expect(not record["evicted"].get("eviction refused"), "evicted: the Eviction API refused")
    expect(
        bool([s for s in steps_with(record, "evicted", disrupted) if "deleting grace=2" not in s]),
        "evicted: no DisruptionTarget before the deletion",
    )
    # The kubelet keeps the conditions it does not own first when it writes the pod's status.
    last = record["evicted"]["watch"][-1] if record["evicted"]["watch"] else []
    conditions = [line for line in last if line.startswith("condition ")]
    expect(
        bool(conditions) and conditions[0] == disrupted,
        f"evicted: DisruptionTarget not first once the kubelet wrote the status: {conditions}",
    )
    # The recorder's correlator: the same event again raises the count of the one it sent.
    for pod, lines in record.items():
        kubelet_events = [
            re.sub(r" x\d+ ", " ", e) for e in lines.get("events", []) if " kubelet " in e
        ]
        expect(
            len(kubelet_events) == len(set(kubelet_events)),
            f"{pod}: the same kubelet event recorded apart, not counted: {kubelet_events}",
        )

    deadline = "Pod Normal DeadlineExceeded kubelet - "
    message = "'Pod was active on the node longer than the specified deadline'"
    after = "deadline-after-ok"
    flipped = "phase=Failed" in final(after)
    if deadline_flip is not None:
        expect(flipped == deadline_flip, f"{after}: flipped {flipped}, expected {deadline_flip}")
    for pod in ("deadline", after) if flipped else ("deadline",):
        expect(
            any(e.startswith(deadline) and e.endswith(message) for e in record[pod]["events"]),
            f"{pod}: no DeadlineExceeded event",
        )
        expect(
            "reason='DeadlineExceeded'" in final(pod) and "phase=Failed" in final(pod),
            f"{pod}: not Failed with reason DeadlineExceeded: {final(pod)}",
        )
        expect(
            not [
                s
                for s in steps_with(record, pod, "reason='DeadlineExceeded'")
                if "phase=Failed" not in s
            ],
            f"{pod}: reason DeadlineExceeded before the phase is Failed",
        )
    # (The phase shown is the one the pod had: Pending when the kubelet had not written Running.)
    expect(
        any(
            "phase=Running" in s or "phase=Pending" in s
            for s in steps_with(
                record,
                "deadline",
                ready["Failed"],
                "container c: running startedAt='set' ready=True started=True",
            )
        ),
        "deadline: never unready (PodFailed) while still running",
    )
    if deadline_flip or not flipped:
        # (The real node also went from the ended container straight to Failed, never
        # Succeeded, when the deadline passed before it wrote the terminal phase.)
        expect(bool(steps_with(record, after, "phase=Succeeded")), f"{after}: never Succeeded")
    completed = any(
        line.startswith("container c: terminated reason='Completed' exitCode=0")
        for line in final(after)
    )
    if flipped:
        expect(
            completed and ready["Failed"] in final(after) and initialized not in final(after),
            f"{after}: not Failed with its container Completed: {final(after)}",
        )
    else:
        expect(
            completed
            and "phase=Succeeded" in final(after)
            and not any(e.startswith(deadline) for e in record[after]["events"]),
            f"{after}: neither Failed past its deadline nor plainly Succeeded: {final(after)}",
        )
    expect(not any(" Killing " in e for e in record[after]["events"]), f"{after}: a Killing event")

    absent = f"docker.io/library/{MISSING_IMAGE}"
    error = (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{absent}": '
        f"failed to resolve image: {absent}: not found"
    )
    waiting = "container c: waiting reason="
    # (The pod goes back and forth between the two; either may be the one last read.)
    expect(
        bool(
            steps_with(
                record,
                "pull",
                f"{waiting}'ImagePullBackOff' message='Back-off pulling image "
                f'"{MISSING_IMAGE}": ErrImagePull: {error}\' ready=False started=False',
            )
        ),
        "pull: no ImagePullBackOff with the pull's error",
    )
    expect(
        bool(
            steps_with(
                record,
                "pull",
                f"{waiting}'ErrImagePull' message='{error}' ready=False started=False",
            )
        ),
        "pull: no ErrImagePull with containerd's error",
    )
    for reason, text in (
        ("Failed", f"'Failed to pull image \"{MISSING_IMAGE}\": {error}'"),
        ("Failed", "'Error: ErrImagePull'"),
        ("BackOff", f"'Back-off pulling image \"{MISSING_IMAGE}\"'"),
        ("Failed", "'Error: ImagePullBackOff'"),
    ):
        expect(
            any(f" {reason} kubelet " in e and e.endswith(text) for e in record["pull"]["events"]),
            f"pull: no {reason} event {text}",
        )

    expect(
        bool(steps_with(record, "job", "finalizers=['batch.kubernetes.io/job-tracking']")),
        "job: no finalizer",
    )
    expect(
        not any(line.startswith("finalizers=") for line in final("job")),
        "job: the ended pod keeps the Job's tracking finalizer",
    )
    return out


def start_side(side: str, workdir: Path) -> Any:
    if side == "emulator":
        from kube_emulator import Emulator

        images = {"present": {IMAGE: True}, "registry": {IMAGE: 19203584}}
        return Emulator(workdir, server_version="1.35", images=images).start()
    import build_control_plane

    if side == "agent":
        from local_cluster import LocalCluster

        cluster = LocalCluster(workdir, build_control_plane.BIN_DIR).start()
        # The agent runs every image it is given: told which one no registry has, it fails its
        # pulls as the real node does.
        cluster.agent.absent_images.add(f"docker.io/library/{MISSING_IMAGE}")
        return cluster
    import build_node
    from real_node import RealNodeCluster

    return RealNodeCluster(workdir, build_control_plane.BIN_DIR, build_node.BIN_DIR).start()


def render(record: Dict[str, Any]) -> List[str]:
    lines = []
    for name, parts in record.items():
        lines.append(f"== {name}")
        for key, value in parts.items():
            if key == "watch":
                for i, step in enumerate(value):
                    lines.append(f"  watch {i}: {step[0]}")
                    lines.extend(f"    {s}" for s in step[1:])
            elif isinstance(value, list):
                lines.append(f"  {key}:")
                lines.extend(f"    {s}" for s in value)
            else:
                lines.append(f"  {key}: {value}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("emulator", "agent", "kubelet"))
    parser.add_argument("--out", help="where to write the side's record (JSON)")
    parser.add_argument("--diff", nargs=2, metavar="FILE", help="diff two sides' records")
    parser.add_argument("--kubectl", default=prereqs.find_kubectls().get("1.35"))
    args = parser.parse_args(argv)
    if args.diff:
        a, b = (json.loads(Path(f).read_text()) for f in args.diff)
        sys.stdout.writelines(
            line + "\n"
            for line in difflib.unified_diff(
                render(a), render(b), args.diff[0], args.diff[1], lineterm="", n=2
            )
        )
        for side, differences in KNOWN_DIFFERENCES.items():
            print(f"# known differences of the {side} (no scenario shows them):")
            print("".join(f"#   - {difference}\n" for difference in differences), end="")
        return 0
    if not args.side or not args.out:
        parser.error("--side and --out, or --diff")
    workdir = Path(tempfile.mkdtemp(prefix=f"rldemo-nodes-{args.side}-"))
    cluster = start_side(args.side, workdir / "cluster")
    try:
        record = scenarios(args.kubectl, cluster.env(), workdir)
    finally:
        cluster.stop()
    Path(args.out).write_text(json.dumps(record, indent=1))
    print("\n".join(render(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
