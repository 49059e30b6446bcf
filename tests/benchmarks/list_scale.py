#!/usr/bin/env python3
"""How long reading a large Job's pods after its end takes: the tool's way and one kubectl call.

Usage:
    python3 tests/benchmarks/list_scale.py [--pods 10000] [--page-latency 3.5] [--kubectl PATH]

Starts the Kubernetes API emulator (tests/support/kube_emulator.py) and stores N
finished pods of a Job `rollout` directly in it (no container runs: the pods
are bound to a node no kubelet serves), every list answer delayed by
--page-latency seconds (the emulator's list_latency fault). Then it times

  * one `kubectl get pods -l job-name=rollout -o json`, as the tool used to
    read them: kubectl pages it by 500 itself, but the whole call has to fit
    the tool's per-call limit (60 s);
  * the tool's own read (rl_batch_demo.read_job_pods through its kubectl proxy):
    pages of 500 not older than the revision at the end, each page one bounded
    call.

Prints figures; not part of the pytest run. Standard library only.
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent.parent / "support"
REPO_ROOT = SUPPORT_DIR.parent.parent
for _path in (str(SUPPORT_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import prereqs  # noqa: E402  (needs the path above)
import rl_batch_demo as demo  # noqa: E402
from kube_emulator import Emulator, fmt_time  # noqa: E402

NAMESPACE = "agc-rl-listscale00"


def finished_pod(index: int, template: dict) -> dict:
    """A Succeeded pod of Job `rollout` as the API would hold it after the run (a few KB of JSON)."""
    name = f"rollout-{index}-{index:05x}"
    now = fmt_time(time.time())
    spec = json.loads(json.dumps(template["spec"]))
    spec["nodeName"] = "list-scale-node"  # no kubelet serves it: nothing runs
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {**template["metadata"]["labels"], "job-name": "rollout"},
            "annotations": {demo.COMPLETION_INDEX_ANNOTATION: str(index)},
        },
        "spec": spec,
        "status": {
            "phase": "Succeeded",
            "hostIP": "172.18.0.9",
            "podIP": f"10.244.{index // 250}.{index % 250}",
            "startTime": now,
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": kind,
                    "status": "False" if kind in ("Ready", "ContainersReady") else "True",
                    "lastTransitionTime": now,
                }
                for kind in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "containerStatuses": [
                {
                    "name": demo.CONTAINER_NAME,
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "image": "docker.io/library/python:3.12-alpine",
                    "imageID": "docker.io/library/python@sha256:" + "0" * 64,
                    "containerID": f"containerd://{index:064x}",
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": now,
                            "finishedAt": now,
                            "containerID": f"containerd://{index:064x}",
                        }
                    },
                }
            ],
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument(
        "--page-latency",
        type=float,
        default=3.5,
        help="seconds every list answer is delayed (default 3.5)",
    )
    parser.add_argument("--kubectl", default=None, help="kubectl binary (default: 1.35 if found)")
    args = parser.parse_args()
    kubectls = prereqs.find_kubectls()
    kubectl_path = (
        args.kubectl
        or kubectls.get("1.35")
        or prereqs.default_kubectl(kubectls)
        or shutil.which("kubectl")
    )
    if not kubectl_path:
        raise SystemExit("Error: no kubectl found; pass --kubectl PATH")
    workdir = Path(tempfile.mkdtemp(prefix="list-scale-"))
    emulator = Emulator(workdir, nodes=1, faults={"list_latency": {"pods": args.page_latency}})
    emulator.start()
    os.environ.update(emulator.env())  # the tool's kubectl calls inherit this environment
    try:
        emulator.writes.create_object(
            emulator._info_for("namespaces"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        )
        template = demo.job_manifest(
            NAMESPACE,
            1,
            1,
            demo.DEFAULT_IMAGE,
            demo.DEFAULT_RUNTIME,
            demo.DEFAULT_JOB_DEADLINE_SECONDS,
        )["spec"]["template"]
        for index in range(args.pods):
            emulator.store.create("pods", finished_pod(index, template))
        end_revision = str(emulator.store.rv)
        print(
            f"{args.pods} finished pods stored; every list answer {args.page_latency} s late; "
            f"kubectl {kubectl_path}",
            flush=True,
        )

        started = time.monotonic()
        kubectl_call = subprocess.run(
            [
                kubectl_path,
                "--context",
                emulator.context,
                "--request-timeout=30s",
                "get",
                "pods",
                "-l",
                "job-name=rollout",
                "-n",
                NAMESPACE,
                "-o",
                "json",
            ],
            env=emulator.env(),
            capture_output=True,
            text=True,
        )
        kubectl_seconds = time.monotonic() - started
        kubectl_items = (
            len(json.loads(kubectl_call.stdout)["items"]) if kubectl_call.returncode == 0 else 0
        )
        within = "within" if kubectl_seconds <= demo.CALL_TIMEOUT_SECONDS else "OVER"
        print(
            f"one kubectl get -o json: {kubectl_seconds:.1f} s for {kubectl_items} pods "
            f"({within} the {demo.CALL_TIMEOUT_SECONDS} s per-call limit)",
            flush=True,
        )

        kubectl = demo.Kubectl(kubectl_path, emulator.context)
        requests_before = len(emulator.requests)
        proxy = demo.ApiProxy(kubectl)
        try:
            started = time.monotonic()
            reading = demo.read_job_pods(
                kubectl, proxy, NAMESPACE, "rollout", end_revision, demo.PAGE_RETRY_SECONDS
            )
            tool_seconds = time.monotonic() - started
        finally:
            proxy.close()
        pages = [r for r in emulator.requests[requests_before:] if r["path"].endswith("/pods")]
        print(
            f"the tool's paged read: {tool_seconds:.1f} s for {len(reading.pods)} pods in {reading.pages} "
            f"pages of {demo.LIST_PAGE_SIZE} ({tool_seconds / max(1, reading.pages):.1f} s a page, each its "
            f"own call; {len(pages)} list requests), list revision {reading.resource_version} >= "
            f"end revision {end_revision}",
            flush=True,
        )
        return 0 if len(reading.pods) == args.pods else 1
    finally:
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
