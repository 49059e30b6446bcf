#!/usr/bin/env python3
"""The guide's client method, re-implemented as the benchmark's baseline.

Usage:
    python3 tests/support/guide_client.py --output DIR [--count N] [--parallelism P]
                                  [--kubectl PATH] [--image IMAGE] [--runtime NAME]
    python3 tests/support/guide_client.py cleanup --output DIR [--kubectl PATH]

What the published guide's client does, step by step, with real kubectl:
create the Namespace, the ConfigMap and the Job (built by the product's own
manifest builders, so both clients submit the same objects); poll
`kubectl get job rollout -o json` once a second, a new kubectl process for
every poll, until the Job is Complete or Failed; only then fetch the pods, the
events and every log (four logs at a time). It saves the same files as the
product (job.json, pods.json, events.txt, one <pod>.log per pod), computes the
figures with the product's `summarise_batch`, and writes results.json.

It measures itself in the same fields the product uses, so the benchmark reads
both the same way: `client_wait.observed_at` (wall time the end was seen),
`client_wait.post_completion_seconds`, `client_wait.kubectl_processes_while_waiting`,
`client.cpu_seconds` (this process and its kubectl children) and
`client.kubectl_processes`. Its receipt and its cleanup are the guide's, so the
tests check that each tool cleans up after the other. `tests/benchmarks/benchmark.py` starts
its runs.
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import argparse
import concurrent.futures
import json
import resource
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import rl_batch_demo  # noqa: E402  (needs the path above)
from rl_batch_demo import (  # noqa: E402
    WORKER_SOURCE,
    configmap_manifest,
    job_manifest,
    namespace_manifest,
    summarise_batch,
)

POLL_INTERVAL_SECONDS = 1.0
LOG_READERS = 4
REQUEST_TIMEOUT = "30s"
CALL_TIMEOUT_SECONDS = 60
CLIENT_GRACE_SECONDS = 30


class GuideError(Exception):
    """A failed step: one line on stderr, exit status 1."""


class GuideKubectl:
    """kubectl against one context, one new process per call; counts the processes it started."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.context: str | None = None
        self.processes = 0

    def run(
        self,
        args: Sequence[str],
        input_text: str | None = None,
        timeout: float = CALL_TIMEOUT_SECONDS,
    ) -> str:
        argv = [self.binary]
        if self.context:
            argv += ["--context", self.context, f"--request-timeout={REQUEST_TIMEOUT}"]
        argv += list(args)
        self.processes += 1
        completed = subprocess.run(
            argv, input=input_text, capture_output=True, text=True, timeout=timeout
        )
        if completed.returncode != 0:
            raise GuideError(
                f"kubectl {' '.join(args[:2])} failed (exit {completed.returncode}): "
                f"{completed.stderr.strip()}"
            )
        return completed.stdout

    def json(self, args: Sequence[str], input_text: str | None = None) -> Any:
        return json.loads(self.run(list(args) + ["-o", "json"], input_text))


def cpu_seconds() -> float:
    """CPU time of this process and its finished kubectl children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=False)
    kubectl = GuideKubectl(args.kubectl)
    kubectl.context = kubectl.run(["config", "current-context"]).strip()
    run_id = secrets.token_hex(6)
    namespace = rl_batch_demo.NAMESPACE_PREFIX + run_id
    timeout = args.timeout or rl_batch_demo.default_timeout(args.count, args.parallelism)
    receipt = {"context": kubectl.context, "namespace": namespace, "run_id": run_id}
    write_json(output / "receipt.json", receipt)

    kubectl.run(["get", "runtimeclass", args.runtime, "-o", "name"])
    created_ns = kubectl.json(
        ["create", "-f", "-"], json.dumps(namespace_manifest(namespace, run_id))
    )
    receipt["uid"] = created_ns["metadata"]["uid"]
    print(f"Test namespace: {namespace}", flush=True)
    kubectl.json(["create", "-f", "-"], json.dumps(configmap_manifest(namespace, WORKER_SOURCE)))
    manifest = job_manifest(
        namespace, args.count, args.parallelism, args.image, args.runtime, timeout
    )
    write_json(output / "job-submitted.json", manifest)

    submitted_wall = time.time()
    submitted = time.monotonic()
    created_job = kubectl.json(["create", "-f", "-"], json.dumps(manifest))
    receipt["job_uid"] = created_job["metadata"]["uid"]
    write_json(output / "receipt.json", receipt)

    # The guide's wait: one `kubectl get job` per second, a new process each time.
    deadline = submitted + timeout + CLIENT_GRACE_SECONDS
    processes_before = kubectl.processes
    while True:
        job = kubectl.json(["get", "job", rl_batch_demo.JOB_NAME, "-n", namespace])
        end = rl_batch_demo.job_finished(job)
        if end is not None or time.monotonic() >= deadline:
            break
        time.sleep(POLL_INTERVAL_SECONDS)
    observed = time.monotonic()
    observed_wall = time.time()
    processes_while_waiting = kubectl.processes - processes_before

    # Only now: the pods, the events, and every log four at a time.
    write_json(output / "job.json", job)
    pods_text = kubectl.run(
        ["get", "pods", "-l", f"job-name={rl_batch_demo.JOB_NAME}", "-n", namespace, "-o", "json"]
    )
    write_text(output / "pods.json", pods_text)
    pods = json.loads(pods_text).get("items", [])
    write_text(
        output / "events.txt",
        kubectl.run(["get", "events", "-n", namespace, "--sort-by=.metadata.creationTimestamp"]),
    )

    def read_log(name: str) -> str:
        try:
            return kubectl.run(["logs", name, "-c", rl_batch_demo.CONTAINER_NAME, "-n", namespace])
        except GuideError:
            return ""

    names = [rl_batch_demo.pod_name(pod) for pod in pods]
    with concurrent.futures.ThreadPoolExecutor(LOG_READERS) as pool:
        logs = dict(zip(names, pool.map(read_log, names)))
    for name, text in logs.items():
        write_text(output / f"{name}.log", text)
    if end != "Complete":
        raise GuideError(f"Job {end or 'timed out'}; see {output}")

    summary = summarise_batch(job, pods, logs, [], args.count, True, observed_wall)
    results = dict(summary.figures)
    results.update(
        {
            "context": kubectl.context,
            "namespace": namespace,
            "image": args.image,
            "runtime": args.runtime,
            "parallelism": args.parallelism,
            "cache_state": "uncontrolled",
            "client_job_complete_seconds": round(observed - submitted, 3),
            "client_wait": {
                "job": rl_batch_demo.JOB_NAME,
                "end": end,
                "submitted_at": submitted_wall,
                "observed_at": observed_wall,
                "client_job_complete_seconds": round(observed - submitted, 3),
                "kubectl_processes_while_waiting": processes_while_waiting,
                "wait_mode": "poll",
                "post_completion_seconds": round(time.monotonic() - observed, 3),
            },
            "client": {
                "kubectl_processes": kubectl.processes,
                "cpu_seconds": round(cpu_seconds(), 3),
            },
        }
    )
    write_json(output / "results.json", results)
    return 0


def cleanup(args: argparse.Namespace) -> int:
    """The guide's cleanup: only the receipt's keys `context`, `namespace`, `run_id`, `uid`, `job_uid`."""
    receipt = json.loads((Path(args.output) / "receipt.json").read_text(encoding="utf-8"))
    kubectl = GuideKubectl(args.kubectl)
    kubectl.context = receipt["context"]
    namespace = receipt["namespace"]
    live = kubectl.run(["get", "namespace", namespace, "--ignore-not-found", "-o", "json"])
    if not live.strip():
        print("Namespace already absent")
        return 0
    metadata = json.loads(live)["metadata"]
    if (
        metadata["uid"] != receipt.get("uid")
        or metadata.get("labels", {}).get("agc-demo-run") != receipt["run_id"]
    ):
        raise GuideError(f"refusing to delete namespace {namespace}: it is not the receipt's")
    job = kubectl.run(
        ["get", "job", rl_batch_demo.JOB_NAME, "-n", namespace, "--ignore-not-found", "-o", "json"]
    )
    if job.strip():
        if json.loads(job)["metadata"]["uid"] != receipt.get("job_uid"):
            raise GuideError(
                f"refusing to delete Job {rl_batch_demo.JOB_NAME}: it is not the receipt's"
            )
        kubectl.run(
            [
                "delete",
                "job",
                rl_batch_demo.JOB_NAME,
                "-n",
                namespace,
                "--cascade=foreground",
                "--timeout=120s",
            ],
            timeout=150,
        )
    kubectl.run(["delete", "namespace", namespace, "--timeout=120s"], timeout=150)
    print(f"Deleted test namespace: {namespace}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="The guide's client method (benchmark baseline).")
    parser.add_argument(
        "action",
        nargs="?",
        choices=("run", "cleanup"),
        default="run",
        help="run a batch (default) or delete what a receipt names, as the guide does",
    )
    parser.add_argument(
        "--output", required=True, metavar="DIR", help="new directory for the run's files"
    )
    parser.add_argument("--count", type=int, default=rl_batch_demo.DEFAULT_COUNT, metavar="N")
    parser.add_argument("--parallelism", type=int, default=None, metavar="P")
    parser.add_argument("--kubectl", default="kubectl", metavar="PATH")
    parser.add_argument("--image", default=rl_batch_demo.DEFAULT_IMAGE)
    parser.add_argument("--runtime", default=rl_batch_demo.DEFAULT_RUNTIME)
    parser.add_argument(
        "--timeout",
        type=int,
        default=None,
        metavar="SECONDS",
        help="the Job's activeDeadlineSeconds (default: the product's)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.parallelism is None:
        args.parallelism = args.count
    try:
        return cleanup(args) if args.action == "cleanup" else run(args)
    except (GuideError, rl_batch_demo.DemoError, OSError, subprocess.TimeoutExpired) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
