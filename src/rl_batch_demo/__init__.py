"""Measure how fast a Kubernetes cluster with a sandbox runtime runs a batch of
RL rollout episodes for coding agents.

One Kubernetes Job, N pods, N episodes. Each episode writes a small buggy
program and its unit tests, proves the tests fail, applies a fixed patch (a
deterministic stand-in for a model's action), runs the tests again and reports
a reward. The tool waits for the Job, verifies every episode, and reports how
long environment preparation and the whole batch took.

Usage:
    python3 rl_batch_demo.py run --output DIR [--count N] [--parallelism P]
                                 [--image IMAGE] [--runtime RUNTIMECLASS]
    python3 rl_batch_demo.py cleanup --output DIR

Also: `report DIR`, `compare DIR_A DIR_B`, `list`, `cleanup --stale AGE`;
`run --help` lists every option.

The package's modules, lowest layer first: each imports only those above it here, and the
shipped single file holds them in this order, each part opening with its source path.
    worker: the episode program every pod runs, shipped in a ConfigMap as text.
    guardian: the program that kills a tool process's kubectl children once it is gone, shipped as text.
    launcher: how a rollout's pod runs that program, its own end recorded; shipped as text.
    constants: defaults, limits, timeouts, and the names of what a run creates and saves.
    model: errors, and the records the modules share (`RunRequest`, `Settings`, `Task`).
    stats: percentiles and their descriptions.
    files: writing and reading files; the receipt, the proof of what a run created.
    store: a big batch held in little memory: shared strings and byte spools.
    parse: parsing what the cluster and the episodes said.
    manifests: the objects a run creates, as plain dicts; capacity.
    tenancy: a run in a namespace it shares, and its Jobs queued: names, labels, a queue's quota.
    podspec: what each episode's pod is given (--cpu, --memory, --env, Secrets, egress), checked.
    timing: what each episode went through: points, bounds, clocks, phases.
    outcomes: verification and classification: every episode's outcome, none dropped.
    summary: the batch's summary: throughput, slots, drafts, the events' index, episodes.csv.
    render: SVG pictures, tables, the comparison.
    metrics: metrics.prom, the run's figures as OpenMetrics text; the push to a Pushgateway.
    telemetry: the run as OpenTelemetry traces over OTLP/HTTP JSON, sent from a thread of its own.
    pooltelemetry: a pool's episodes as points and phases, for its metrics.prom and its trace.
    runs: what `list` shows and `cleanup --stale` decides, without receipts.
    kube: the one edge to the cluster: `Kubectl`, `ApiProxy` (shared by a process's runs), paged reads.
    proxied: requests in kubectl's stead: a trainer's steps through one `kubectl proxy` kept for the process.
    sandboxes: live sandboxes' requests through the pod proxy, and the pool's pods as watched.
    watch: watching a batch: its Jobs as one, watches, polling, progress line, logs as pods end.
    follow: following a batch: its state, rewards, the follower, its evidence.
    syntax: an episode script's syntax, checked before it is shipped.
    preflight: what `run` checks and records before it changes the cluster.
    kueue: a shared namespace's objects deleted by UID; Kueue's queues and Workloads as read.
    secretcopy: --env-from-secret's Secrets read before anything is created, copied once it may be.
    results: results.json: a batch's figures and the run's.
    lifecycle: `cleanup`, `list` and `cleanup --stale`.
    lease: one follower per run: a lock file in its directory, a lease on its namespace.
    run: the `run` action: `perform_run` -> `start_run` -> `execute`.
    pool: the `pool` action and open_pool(): warm sandboxes claimed, driven and let go.
    report: `report` and `compare`: saved files only, no cluster.
    attach: `attach`: follow a run whose client is gone, from its receipt, run.json and files.
    cli: the parser, its checks, and `main`.
    api: `run_batch`, `stream_batch` and `attach_batch` for Python callers.

A run starts at cli.main() -> run_command() (or run_batch() / stream_batch() from Python)
-> perform_run(): start_run() makes its Settings and RunPlan; execute() calls its steps
in order; run_one_batch() submits each Job, follows it (BatchFollower) and saves its
evidence (BatchEvidence); save_results() writes results.json (assemble_results). `report`
recomputes the results from the saved files alone (recompute).
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

from .api import attach_batch, batch_results, open_pool, run_batch, stream_batch
from .cli import cli, main
from .constants import __version__
from .follow import RewardCallbackError
from .lease import FollowerBusy
from .kube import KubectlError
from .sandboxes import CommandResult, CommandTimeout, SandboxLost
from .model import DemoError, KeywordTypeError, StreamClosed, UsageError, VerificationError

__all__ = [
    "DemoError",
    "KeywordTypeError",
    "KubectlError",
    "FollowerBusy",
    "RewardCallbackError",
    "StreamClosed",
    "UsageError",
    "VerificationError",
    "CommandResult",
    "CommandTimeout",
    "SandboxLost",
    "__version__",
    "open_pool",
    "attach_batch",
    "batch_results",
    "cli",
    "main",
    "run_batch",
    "stream_batch",
]
