#!/usr/bin/env python3
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

This file is generated from the package src/rl_batch_demo/ by tools/bundle.py; edit the package, not this file.
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import bisect
import codecs
import collections
import concurrent.futures
import contextlib
import copy
import csv
import dataclasses
import datetime
import email.utils
import functools
import gc
import hashlib
import heapq
import http.client
import io
import ipaddress
import itertools
import json
import math
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
import urllib.error
import urllib.parse
import urllib.request
import warnings
from html import escape as html_escape
from pathlib import Path
from typing import (
    Any,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    NamedTuple,
    NoReturn,
    Sequence,
    TextIO,
    TypeVar,
    cast,
)

try:
    import resource
except ImportError:
    resource = None


# --------------------------------------------------------------------------
# src/rl_batch_demo/constants.py: Constants: defaults, limits, timeouts, and the names of what a run creates and saves.

__version__ = "0.1.0"

DEFAULT_COUNT = 10

DEFAULT_MAX_EPISODES = 20

DEFAULT_IMAGE = "python:3.12-alpine"

DEFAULT_RUNTIME = "cube"

DEFAULT_JOB_DEADLINE_SECONDS = 240

# Up to this many episodes the guide's deadline holds; a larger batch runs in more
# waves of pods, and its deadline grows with them.
DEADLINE_GROWS_ABOVE_EPISODES = 20

CLIENT_GRACE_SECONDS = 30

# --prepull reads its pods this often: its figure is that much coarser than the batch's.
PREPULL_POLL_SECONDS = 0.25

REQUEST_TIMEOUT_SECONDS = 30

CALL_TIMEOUT_SECONDS = 60

DELETE_WAIT_SECONDS = 120

FIRST_CONTACT_RETRY_SECONDS = 10

LOG_READERS = 8

POLL_INTERVAL_SECONDS = 1.0

WATCH_RESTARTS_BEFORE_POLLING = 3

# The most watch events decoded and waiting to be taken in: a client that falls behind stops
# reading its watches there, and the rest waits in their pipes (then in kubectl and the API
# server) instead of in its memory, a decoded pod taking about ten times its text.
WATCH_EVENTS_WAITING_MOST = 1000

# Lists are read in pages of kubectl's own default --chunk-size: each page is one
# call well inside the per-call limit, however many pods the batch has.
LIST_PAGE_SIZE = 500

# How long one page is asked again: a watch cache that is catching up answers
# "Too large resource version" (retry after 1 s) until it has.
PAGE_RETRY_SECONDS = 60

# Continue tokens expire when the API server compacts their revision; a list
# whose token expires this often is given up.
LIST_EXPIRIES = 3

COLLECT_RETRY_SECONDS = 10

# What a kubelet answers (status 200) in place of a log it can no longer find, the container
# already removed from its runtime: a notice, not the episode's output.
KUBELET_LOG_GONE = re.compile(r"unable to retrieve container logs for \S+\s*")

# After a Job's end, how long its pod watch is given to deliver each pod's final state, and
# then its event watch as many events as the API counted, before they are listed instead.
SETTLE_SECONDS = 2.0

PROXY_START_SECONDS = 10
# The merge patch that suspends a Job: its controller deletes its running pods and starts no more.
SUSPEND_PATCH = '{"spec":{"suspend":true}}'

# The private directory of each run's `kubectl proxy` socket carries the run's pid,
# so a later run can tell (and remove) the directory of a run that was killed.
PROXY_DIRECTORY_PREFIX = "rl-batch-demo-"

# What kubectl prints when the kubeconfig gives it no credentials and it asks instead.
CREDENTIALS_PROMPT = "Please enter Username"

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

JOB_NAME = "rollout"

WARMUP_JOB_NAME = "rollout-warmup"

CONFIGMAP_NAME = "episode"

CONTAINER_NAME = "episode"

WORKER_KEY = "episode.py"

# A rollout's launcher (EPISODE_LAUNCHER), beside the episode program in the same ConfigMap.
LAUNCHER_KEY = "launcher.py"

RUN_LABEL = "agc-demo-run"

APP_LABEL = "rl-batch-demo"

NAMESPACE_PREFIX = "agc-rl-"

# What each run's namespace says of itself, from its creation, so a run is found and
# reaped without its receipt. The domain prefix keeps these keys apart from anyone else's.
ANNOTATION_PREFIX = "rl-batch-demo.agc/"

RUN_ID_ANNOTATION = ANNOTATION_PREFIX + "run-id"

VERSION_ANNOTATION = ANNOTATION_PREFIX + "version"

HOST_ANNOTATION = ANNOTATION_PREFIX + "host"

OUTPUT_ANNOTATION = ANNOTATION_PREFIX + "output"

USER_ANNOTATION = ANNOTATION_PREFIX + "user"

EXPIRES_ANNOTATION = ANNOTATION_PREFIX + "expires-at"

# What the run plans, all its batches told (warm-up, rounds, a Job per image): its Jobs are made
# one batch at a time, so between two batches every Job there is has ended and only these tell a
# run that has more to do from one that is done.
JOBS_PLANNED_ANNOTATION = ANNOTATION_PREFIX + "jobs-planned"

EPISODES_PLANNED_ANNOTATION = ANNOTATION_PREFIX + "episodes-planned"

# Who follows the run: a lease as Kubernetes leader election keeps one (holder, renew time,
# duration), as JSON on the run's namespace, renewed every LEASE_RENEW_SECONDS while a client
# follows; `attach --force` takes over one not renewed for LEASE_STALE_PERIODS periods.
FOLLOWER_ANNOTATION = ANNOTATION_PREFIX + "follower"
LEASE_RENEW_SECONDS = 10
LEASE_STALE_PERIODS = 3

# `run --dry-run` asks the cluster nothing, so it cannot know who the run would be.
USER_UNKNOWN_BEFORE_RUN = "(kubectl auth whoami, at run time)"

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

# A run whose tasks name several images runs one Job per image: every Job and pod of one batch
# carries its batch's name under this label, and each Job's pods carry the run-wide index of each
# of its completion indexes under this annotation ("0-3,8-11": completion index 0 is episode 0,
# index 4 is episode 8).
BATCH_LABEL = ANNOTATION_PREFIX + "batch"

EPISODE_INDEXES_ANNOTATION = ANNOTATION_PREFIX + "episode-indexes"

# What an episode's pod's activeDeadlineSeconds is made of, as the run was given it
# ("--pull-timeout 60 + --episode-timeout 30"): a pod stopped at its deadline names them.
DEADLINE_ANNOTATION = ANNOTATION_PREFIX + "deadline"

# --prepull's pods (one per node and image, each running `python -c pass`) carry this label.
PREPULL_LABEL = ANNOTATION_PREFIX + "prepull"

PREPULL_FILE = "prepull.json"

# A rollout's pods (this annotation on each) run their episode through the launcher, which prints
# one event of this name when the program ends on its own with a failure or past its
# EPISODE_TIMEOUT_SECONDS, and then ends the pod 0: a pod of theirs that failed is never the episode's.
EPISODE_EXIT_ANNOTATION = ANNOTATION_PREFIX + "episode-exit"
EPISODE_EXIT_RECORDED = "recorded"
EPISODE_EXIT_EVENT = "episode_exit"
EPISODE_TIMEOUT_ENV = "EPISODE_TIMEOUT_SECONDS"

# What a rollout pod's activeDeadlineSeconds adds to --episode-timeout (and --pull-timeout): the
# launcher counts the episode's own time from its start, so the pod's deadline, a backstop that
# stops a pod the launcher could not, leaves this much for the pod to get there (sandbox, container
# and interpreter start). A pod stopped at it is the infrastructure's loss, which the Job retries.
EPISODE_TIMEOUT_SLACK_SECONDS = 30

# The Job controller keeps this finalizer on each pod until it has counted the pod's end.
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"

RECEIPT_FILE = "receipt.json"

RESULTS_FILE = "results.json"

SETTINGS_FILE = "run.json"

# One follower per output directory: its host, PID and process start, held while it follows.
LOCK_FILE = "follower.lock"

# Every Job of every batch the run plans, saved before the first is created: what `attach`
# creates of a run stopped between two batches.
PLANNED_JOBS_FILE = "jobs-planned.json"

# Kubectl's words for a 404 without a Kubernetes Status naming an object: the
# server does not know the URL at all (not a Kubernetes API, or not this API group).
UNSERVED_PATH_MESSAGE = "the server could not find the requested resource"

# Kubectl's own words for answers worth asking again: the request may not have
# reached a healthy API server, so the same read can succeed a moment later.
TRANSIENT_ERROR_MARKERS = (
    "connection refused",
    "connection reset",
    "i/o timeout",
    "tls handshake timeout",
    "eof",
    "unable to connect to the server",
    "the server is currently unable to handle the request",
    "serviceunavailable",
    "service unavailable",
    "internalerror",
    "internal error",
    "(internalerror)",
    "timeout",
    "timed out",
    "too many requests",
    "etcdserver",
    "http2: client connection lost",
    "the server was unable to return a response",
    "gateway",
)

EXIT_USAGE = 2

# A batch with failed episodes that --allow-failures accepted: results.json and
# rewards.jsonl are complete, and a script can tell this from a clean pass (0).
EXIT_PARTIAL = 3

EXIT_INTERRUPTED = 130

REWARDS_FILE = "rewards.jsonl"

TASK_FILE_ENV = "TASK_FILE"

TASKS_VOLUME = "tasks"

TASKS_MOUNT = "/tasks"

TASKS_CONFIGMAP_PREFIX = "tasks-"

# A ConfigMap holds at most 1 MiB (1,048,576 bytes) of data; each chunk of tasks stays under
# 1,000,000 bytes, which leaves room for the object's own fields.
TASKS_CONFIGMAP_BYTES = 1_000_000

# Tasks travel in at most this many ConfigMaps (about 16 MB), so the Job that mounts them all,
# and each pod's volume, stays a reasonable size.
TASKS_MAX_CONFIGMAPS = 16

INDEX_FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"

INDEX_IGNORED_FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-ignored-failure-count"

# backoffLimitPerIndex, maxFailedIndexes and the FailIndex action are GA (always on) from here.
RETRIES_MIN_SERVER = (1, 33)

FAILURE_CLASSES = ("infrastructure", "episode", "verifier")

# An episode the Job stopped because --need was met: no failure, and no sample to learn from.
CANCELLED = "cancelled"

# The classes whose line a trainer may learn from: the agent's own outcome.
VALID_CLASSES = (None, "episode")

# successPolicy and its SuccessCriteriaMet condition are GA (always on) from here.
NEED_MIN_SERVER = (1, 33)

# The reason of a Job's SuccessCriteriaMet (then Complete) condition when its successPolicy was met.
SUCCESS_POLICY_REASON = "SuccessPolicy"

# --need-groups K: once K whole groups have every member's valid line, the tool stamps each Job of
# the batch with this annotation (value K) as it suspends it, which stops the rest: such a Job has
# ended, "Complete", once none of its pods is left running (job_finished).
NEED_GROUPS_ANNOTATION = ANNOTATION_PREFIX + "need-groups-met"
NEED_GROUPS_REASON = "NeedGroupsMet"

# The kubelet's reason on a pod that outlived its activeDeadlineSeconds (--episode-timeout).
POD_DEADLINE_REASON = "DeadlineExceeded"

# Exit codes that are no verdict of the episode program: the runtime could not run its command
# (126, 127), or something outside killed it (137 SIGKILL: the OOM killer or the kubelet; 143
# SIGTERM: a pod being stopped). The Job API cannot tell an OOM kill from another SIGKILL, so
# an OOM kill is retried and classified as infrastructure like the rest.
INFRASTRUCTURE_EXIT_CODES = (126, 127, 137, 143)

INFRASTRUCTURE_POD_REASONS = (
    "Evicted",
    "NodeLost",
    "Preempting",
    "UnexpectedAdmissionError",
    "NodeAffinity",
    "OutOfcpu",
    "OutOfmemory",
    "Shutdown",
    "Terminated",
)

INFRASTRUCTURE_TERMINATED_REASONS = (
    "OOMKilled",
    "ContainerStatusUnknown",
    "StartError",
    "ContainerCannotRun",
)

# The built-in worker's own words when its baseline passes: its test did not check the bug.
BASELINE_PASSED_MESSAGE = "baseline must fail the boundary test"


# The episode program every pod runs, shipped in a ConfigMap.
WORKER_SOURCE = r'''"""One RL rollout episode: fix the code -> run the tests -> reward.

Prints one JSON event per stdout line: "ready" once the task is written,
"reward" once the patched code has been tested.
"""
import time

import os
import sys

IMPORTS_DONE_AT = time.time()
EPISODE_ID = os.environ.get("EPISODE_ID", "")

BUGGY_SOURCE = """def shipping(total):
    if total > 99:
        return 0
    return 10
"""

TEST_SOURCE = """import unittest

from shipping import shipping


class ShippingTest(unittest.TestCase):
    def test_under_threshold_pays(self):
        self.assertEqual(shipping(98), 10)

    def test_threshold_ships_free(self):
        self.assertEqual(shipping(99), 0)

    def test_over_threshold_ships_free(self):
        self.assertEqual(shipping(100), 0)


if __name__ == "__main__":
    unittest.main()
"""


def flat_json(value):
    """JSON for a flat event of strings and numbers, without importing json before "ready"."""
    if isinstance(value, dict):
        return "{" + ", ".join(flat_json(k) + ": " + flat_json(v) for k, v in value.items()) + "}"
    if isinstance(value, str):
        return '"' + "".join(c if c.isalnum() or c in "-_.:/ " else "\\u%04x" % ord(c)
                             for c in value) + '"'
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)


def emit(event, **fields):
    record = {"event": event, "at": time.time(), "episode_id": EPISODE_ID}
    record.update(fields)
    json = sys.modules.get("json")
    sys.stdout.write((json.dumps(record) if json else flat_json(record)) + "\n")
    sys.stdout.flush()


def process_started_at():
    """Wall-clock start of this process from /proc (10 ms ticks), or None."""
    try:
        with open("/proc/self/stat") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime_file:
            uptime = float(uptime_file.read().split()[0])
        now = time.time()
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return now - age
    except (OSError, ValueError, IndexError):
        return None


def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def run_tests():
    # Imported after "ready" so that environment preparation stays lean.
    import subprocess

    return subprocess.run(
        [sys.executable, "-B", "test_shipping.py"],
        capture_output=True, text=True, timeout=20,
    )


def main():
    os.chdir("/workspace")
    write("shipping.py", BUGGY_SOURCE)
    write("test_shipping.py", TEST_SOURCE)
    started_at = process_started_at()
    ready_fields = {"imports_done_at": IMPORTS_DONE_AT,
                    "process_started_at": started_at,
                    "modules_before_ready": len(sys.modules)}
    if started_at is not None:
        ready_fields["import_seconds"] = IMPORTS_DONE_AT - started_at
    emit("ready", **ready_fields)

    import json  # noqa: F401  (the reward's free text needs real JSON escaping)

    baseline = run_tests()
    if baseline.returncode == 0:
        sys.exit("baseline must fail the boundary test")
    with open("shipping.py") as handle:
        source = handle.read()
    write("shipping.py", source.replace("total > 99", "total >= 99"))
    patched = run_tests()
    emit("reward", reward=1 if patched.returncode == 0 else 0,
         baseline_exit=baseline.returncode, tests_exit=patched.returncode,
         tests_output=patched.stderr)
    if patched.returncode != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
'''

# Live sandboxes (`pool`, open_pool): a Job whose pods each serve one trainer's turns over HTTP.
POOL_JOB_NAME = "pool"
SANDBOX_CONTAINER = "sandbox"
SANDBOX_PORT = 8377
SANDBOX_OUTPUT_CAP_BYTES = (
    1 << 20
)  # what a command may print on each stream (the server's default too)
SERVER_KEY = "sandbox_server.py"
TOKEN_SECRET = "sandbox-token"
TOKEN_KEY = "token"
TOKEN_MOUNT = "/sandbox-token"
TOKEN_HEADER = "X-Sandbox-Token"
# Every answer of a sandbox server carries it: an answer without it came from the way there (`kubectl
# proxy` or the API server, e.g. 500 "connection refused" while the API server restarts).
ANSWER_HEADER = "X-Sandbox-Answer"
# What the sandbox server exits with once left idle: the pool's Job fails on it (podFailurePolicy
# FailJob), so no new pod follows a trainer that went away.
IDLE_EXIT_CODE = 75
DEFAULT_IDLE_TIMEOUT_SECONDS = 600
COMMANDS_FILE = "commands.jsonl"
COMMAND_TEXT_MOST = 200  # commands.jsonl keeps each command's first 200 characters

# The program every pool pod runs, shipped in the run's ConfigMap.
SERVER_SOURCE = r'''"""A live sandbox: runs the trainer's commands and file operations in its pod, over HTTP.

Shipped in the run's ConfigMap and run as the pod's one process. It listens on the pod's own
IP (POD_IP, from the downward API) and answers only requests that carry the run's token (the
X-Sandbox-Token header; the token is a file mounted from the run's Secret). Standard library
only: it runs on whatever Python the image has (3.8 or newer).

    GET  /ready             {"ready_at": when it began to listen, this pod's clock}
    POST /run               {"argv": [...]} or {"shell": "..."}, with "timeout", "cwd", "env",
                            "stdin" (base64): {"exit_code", "stdout", "stderr", "truncated",
                            "timed_out", "seconds"}
    PUT  /file?path=P       the body is the file's bytes; GET /file?path=P reads them back
    POST /reset             every process it started is killed, the workspace made pristine
    POST /finish            every process it started is killed, and it exits 0

A sandbox left alone for SANDBOX_IDLE_SECONDS exits with IDLE_EXIT_CODE, which the pool's Job
counts as its end (podFailurePolicy FailJob): a trainer that died leaks no pod past that.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import shutil
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

STARTED_AT = time.time()  # once the modules it needs are imported
PORT = int(os.environ.get("SANDBOX_PORT", "8377"))
TOKEN_FILE = os.environ.get("SANDBOX_TOKEN_FILE", "/sandbox-token/token")
WORKSPACE = os.environ.get("SANDBOX_WORKSPACE", "/workspace")
PRISTINE = os.environ.get("SANDBOX_PRISTINE", "/sandbox-pristine/workspace")
IDLE_SECONDS = float(os.environ.get("SANDBOX_IDLE_SECONDS", "600"))
IDLE_EXIT_CODE = 75  # EX_TEMPFAIL: the pool was left idle; its Job ends on it
OUTPUT_CAP_BYTES = int(os.environ.get("SANDBOX_OUTPUT_CAP_BYTES", str(1 << 20)))
CHUNK_BYTES = 1 << 16
OUTPUT_GRACE_SECONDS = 0.5
POLL_SECONDS = 0.01  # how often a command's end is asked for where no pidfd tells it
BODY_MOST_BYTES = 64 << 20  # a file written or a command's stdin
NOT_FOUND_EXIT_CODE = 127  # what a shell answers for a command it cannot find


class Sandbox:
    """What the server holds between requests: the token, the clock of the last request, and
    the process groups of the commands it started (each command leads a group of its own)."""

    def __init__(self, token: bytes) -> None:
        self.token = token
        self.last_request = time.monotonic()
        self.ready_at = 0.0  # when it began to listen, this pod's clock
        self.pristine = False  # a copy of the starting workspace is kept for /reset
        self.stopping = False  # SIGTERM: its pod is going; nothing more is answered
        self.in_flight = 0  # commands running: a sandbox running one is not idle
        self.groups: set[int] = set()
        self.lock = threading.Lock()
        # Set when a command ended: its orphans are reaped by the idle watcher's thread, off the
        # next request's way (a /proc scan took 3 ms where a host shows 160 processes).
        self.reap_wanted = threading.Event()

    def authorised(self, given: Optional[str]) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    def kill_everything(self) -> None:
        """Every process the sandbox's commands started, daemons among them: the server is
        their subreaper, so a daemon that left its command's group is still its descendant."""
        with self.lock:
            groups = set(self.groups)  # each stays listed until its request has reaped it
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass  # the group ended with its command
        for _round in range(50):
            left = descendants(os.getpid())
            if not left:
                reap_orphans(self)
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
            reap_orphans(self)


def processes() -> Dict[int, Tuple[int, bytes]]:
    """Every process this container sees: pid -> (parent pid, state), from /proc."""
    found: Dict[int, Tuple[int, bytes]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        found[int(entry)] = (int(fields[1]), fields[0])
    return found


def descendants(root: int) -> List[int]:
    """The live processes below `root`, from /proc's parent links."""
    children: Dict[int, List[int]] = {}
    for pid, (parent, state) in processes().items():
        if state != b"Z":
            children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap_orphans(sandbox: Sandbox) -> None:
    """Collect the ends of orphans handed to this subreaper, so none lingers as a zombie that still
    answers `kill -0`; never a command's own process (its request reaps it, for its exit code):
    the lock keeps a command from starting between the scan and the reaping."""
    me = os.getpid()
    with sandbox.lock:
        for pid, (parent, state) in processes().items():
            if parent == me and state == b"Z" and pid not in sandbox.groups:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass  # reaped meanwhile


def become_subreaper() -> None:
    """Orphans of the commands' processes come to this server, not to the node's init."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # not Linux: a daemon that left its group outlives finish until the pod ends


class Output:
    """A command's stdout and stderr as they are read: each stream's first OUTPUT_CAP_BYTES kept, the
    rest read and dropped (a command that prints 100 MB costs the sandbox no memory past the cap,
    and is never blocked on a full pipe)."""

    def __init__(self) -> None:
        self.kept: Dict[int, List[bytes]] = {}
        self.sizes: Dict[int, int] = {}
        self.truncated = False

    def take(self, fd: int, chunk: bytes) -> None:
        size = self.sizes.get(fd, 0)
        if size < OUTPUT_CAP_BYTES:
            self.kept.setdefault(fd, []).append(chunk[: OUTPUT_CAP_BYTES - size])
        self.truncated = self.truncated or size + len(chunk) > OUTPUT_CAP_BYTES
        self.sizes[fd] = size + len(chunk)

    def text(self, fd: int) -> bytes:
        return b"".join(self.kept.get(fd, []))


def process_handle(pid: int) -> Optional[int]:
    """A file descriptor readable once the process ends (Linux 5.3+), or None: then its end is
    asked for every POLL_SECONDS."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def collect_output(
    process: "subprocess.Popen[bytes]", deadline: Optional[float], output: Output
) -> bool:
    """Read the command's stdout and stderr to their ends in this one thread (no reader threads:
    each thread a command starts is a wakeup more on its round trip), killing its group at the
    deadline. A daemon the command left with its pipes keeps them open: once the command has
    ended, its output is waited for OUTPUT_GRACE_SECONDS more, no longer (the daemon lives on
    until reset or finish). Whether the command was killed at its deadline."""
    pipes = [process.stdout.fileno(), process.stderr.fileno()]  # type: ignore[union-attr]
    handle = process_handle(process.pid)
    ended_at: Optional[float] = None
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in pipes:
            selector.register(fd, selectors.EVENT_READ)
        if handle is not None:
            selector.register(handle, selectors.EVENT_READ)
        while any(fd in selector.get_map() for fd in pipes):
            now = time.monotonic()
            if ended_at is None and (handle is None and process.poll() is not None):
                ended_at = now
            if deadline is not None and not timed_out and ended_at is None and now >= deadline:
                kill_group(process.pid)
                timed_out = True
            if ended_at is not None and now >= ended_at + OUTPUT_GRACE_SECONDS:
                break
            waits = [ended_at + OUTPUT_GRACE_SECONDS - now] if ended_at is not None else []
            waits += [deadline - now] if deadline is not None and not timed_out else []
            waits += [POLL_SECONDS] if handle is None and ended_at is None else []
            for key, _mask in selector.select(max(0.0, min(waits)) if waits else None):
                if key.fd == handle:
                    selector.unregister(handle)
                    ended_at = time.monotonic()
                    continue
                chunk = os.read(key.fd, CHUNK_BYTES)
                if chunk:
                    output.take(key.fd, chunk)
                else:
                    selector.unregister(key.fd)
    if handle is not None:
        os.close(handle)
    return timed_out


def kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass  # the group ended meanwhile


def command_argv(request: Dict[str, Any]) -> Any:
    """The command a /run request names: a shell string, or a non-empty argv list."""
    shell = request.get("shell")
    argv: Any = shell if isinstance(shell, str) else request.get("argv")
    if isinstance(argv, str):
        return argv
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("give argv, a non-empty list of strings, or shell, a string")
    return argv


def start_command(request: Dict[str, Any], stdin: bytes) -> "subprocess.Popen[bytes]":
    """The command started, leading a process group (and session) of its own."""
    argv = command_argv(request)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    return subprocess.Popen(
        argv,
        shell=isinstance(argv, str),
        cwd=os.path.join(WORKSPACE, request.get("cwd") or ""),
        env=env,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def run_command(sandbox: Sandbox, request: Dict[str, Any]) -> Dict[str, Any]:
    """Run one command to its end, or to its timeout (then its whole group is killed). The orphans
    it left are reaped once its answer has gone (`reap_wanted`), off its round trip."""
    started = time.monotonic()
    cwd = os.path.join(WORKSPACE, request.get("cwd") or "")
    if not os.path.isdir(cwd):
        return outcome(126, b"", f"no directory {cwd}\n".encode(), False, False, started)
    stdin = base64.b64decode(request.get("stdin") or "")
    try:
        with sandbox.lock:  # listed before the reaper can see it end
            process = start_command(request, stdin)
            sandbox.groups.add(process.pid)
            sandbox.in_flight += 1
    except (FileNotFoundError, PermissionError, NotADirectoryError) as error:
        code = NOT_FOUND_EXIT_CODE if isinstance(error, FileNotFoundError) else 126
        return outcome(code, b"", f"{error}\n".encode(), False, False, started)
    if stdin:
        threading.Thread(target=feed, args=(process.stdin, stdin), daemon=True).start()
    timeout = request.get("timeout")
    output = Output()
    out, err = process.stdout.fileno(), process.stderr.fileno()  # type: ignore[union-attr]
    try:
        deadline = started + float(timeout) if timeout is not None else None
        timed_out = collect_output(process, deadline, output)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        timed_out = wait_command(process, None if timed_out else left) or timed_out
    finally:
        for pipe in (process.stdout, process.stderr):
            pipe.close()  # type: ignore[union-attr]
        with sandbox.lock:
            sandbox.groups.discard(process.pid)
            sandbox.in_flight -= 1
    return outcome(
        process.returncode, output.text(out), output.text(err), output.truncated, timed_out, started
    )


def wait_command(process: "subprocess.Popen[bytes]", timeout: Optional[float]) -> bool:
    """Wait for the command; past its timeout, kill its group (what it left running in the
    background after an ordinary end lives on for later turns). Whether it timed out."""
    try:
        process.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()
        return True


def feed(pipe: Any, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
        pipe.close()
    except OSError:
        pass  # the command ended without reading it all


def outcome(
    code: Optional[int], out: bytes, err: bytes, truncated: bool, timed_out: bool, started: float
) -> Dict[str, Any]:
    return {
        "exit_code": code,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "truncated": truncated,
        "timed_out": timed_out,
        "seconds": time.monotonic() - started,
    }


def reset_workspace() -> None:
    """The workspace as it was when the sandbox started."""
    for entry in os.listdir(WORKSPACE):
        path = os.path.join(WORKSPACE, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    for entry in os.listdir(PRISTINE):
        source, target = os.path.join(PRISTINE, entry), os.path.join(WORKSPACE, entry)
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.copytree(source, target, symlinks=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)


def workspace_path(query: str) -> str:
    """The file a request names (`path`), relative to the workspace unless absolute."""
    path = urllib.parse.parse_qs(query).get("path", [""])[0]
    if not path:
        raise ValueError("give ?path=")
    return os.path.join(WORKSPACE, path)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive: one connection serves a trainer's turns
    timeout = 300  # a connection silent this long mid-request is dropped
    # An answer's headers and body leave in one segment, at once: with Nagle's algorithm, a
    # body written after its headers waited for the client's delayed ACK (40 ms a request).
    disable_nagle_algorithm = True
    wbufsize = 1 << 16
    sandbox: Sandbox

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the pod's log is for what the sandbox says of itself

    def answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("X-Sandbox-Answer", "1")  # the way there (a proxy) answers without it
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def reply(self, status: int, value: Any) -> None:
        if self.sandbox.stopping:  # its pod is going: a command it killed is no outcome
            self.close_connection = True
            return
        self.answer(status, json.dumps(value).encode())

    def handle_one(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        if not self.sandbox.authorised(self.headers.get("X-Sandbox-Token")):
            self.close_connection = True  # its body is not read: nobody else's bytes are waited on
            self.reply(403, {"error": "forbidden"})
            return
        self.sandbox.last_request = time.monotonic()
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding") or length > BODY_MOST_BYTES:
            self.close_connection = True
            self.reply(413, {"error": f"a body of at most {BODY_MOST_BYTES} bytes, with a length"})
            return
        body = self.rfile.read(length)
        try:
            self.route(method, path, query, body)
        except (ValueError, TypeError) as error:
            self.reply(400, {"error": str(error)})
        except OSError as error:
            self.reply(
                404 if isinstance(error, FileNotFoundError) else 500,
                {"error": f"{type(error).__name__}: {error}"},
            )
        self.sandbox.last_request = time.monotonic()

    def route(self, method: str, path: str, query: str, body: bytes) -> None:
        if (method, path) == ("GET", "/ready"):
            self.reply(200, {"ready_at": self.sandbox.ready_at, "started_at": STARTED_AT})
        elif (method, path) == ("POST", "/run"):
            self.reply(200, run_command(self.sandbox, json.loads(body or b"{}")))
            self.sandbox.reap_wanted.set()
        elif (method, path) == ("PUT", "/file"):
            target = workspace_path(query)
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            with open(target, "wb") as file:
                file.write(body)
            self.reply(200, {"bytes": len(body)})
        elif (method, path) == ("GET", "/file"):
            with open(workspace_path(query), "rb") as file:
                self.answer(200, file.read(), "application/octet-stream")
        elif (method, path) == ("POST", "/reset") and not self.sandbox.pristine:
            self.reply(409, {"error": "no pristine copy of the workspace was kept"})
        elif (method, path) == ("POST", "/reset"):
            self.sandbox.kill_everything()
            reset_workspace()
            self.reply(200, {"reset": True})
        elif (method, path) == ("POST", "/finish"):
            self.sandbox.kill_everything()
            self.reply(200, {"finished": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()
        else:
            self.reply(404, {"error": f"no {method} {path}"})

    def do_GET(self) -> None:
        self.handle_one("GET")

    def do_POST(self) -> None:
        self.handle_one("POST")

    def do_PUT(self) -> None:
        self.handle_one("PUT")


def watch_idle(sandbox: Sandbox) -> None:
    """End the sandbox, and with it the pool's Job, once nobody has asked anything for so long."""
    while True:
        sandbox.reap_wanted.wait(min(IDLE_SECONDS, 1.0))
        sandbox.reap_wanted.clear()
        reap_orphans(sandbox)
        if sandbox.in_flight == 0 and time.monotonic() - sandbox.last_request > IDLE_SECONDS:
            sandbox.kill_everything()
            print(json.dumps({"event": "idle", "at": time.time()}), flush=True)
            os._exit(IDLE_EXIT_CODE)


def keep_pristine() -> bool:
    """The workspace as it starts, copied aside for /reset; False where it cannot be."""
    try:
        if os.path.isdir(PRISTINE):
            shutil.rmtree(PRISTINE)
        os.makedirs(os.path.dirname(PRISTINE), exist_ok=True)
        shutil.copytree(WORKSPACE, PRISTINE, symlinks=True)
        return True
    except OSError as error:
        print(json.dumps({"event": "no_pristine_copy", "error": str(error)}), flush=True)
        return False


def main() -> None:
    with open(TOKEN_FILE, "rb") as file:
        token = file.read().strip()
    pristine = keep_pristine()
    become_subreaper()
    sandbox = Sandbox(token)
    sandbox.pristine = pristine
    Handler.sandbox = sandbox
    server = ThreadingHTTPServer((os.environ.get("POD_IP") or "127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    sandbox.ready_at = time.time()

    def stopped(number: int, frame: Any) -> None:
        """SIGTERM (the pod deleted, its Job suspended): nothing it started outlives it."""
        sandbox.stopping = True
        sandbox.kill_everything()
        os._exit(128 + number)

    signal.signal(signal.SIGTERM, stopped)
    threading.Thread(target=watch_idle, args=(sandbox,), daemon=True).start()
    event = {"event": "server_ready", "at": sandbox.ready_at, "started_at": STARTED_AT}
    print(json.dumps(event), flush=True)
    server.serve_forever()
    # Finished: out at once. An interpreter's ordinary exit ends its daemon threads with
    # pthread_exit, which a minimal image without libgcc_s turns into a crash (exit 139): the
    # pod would fail where its sandbox finished well.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
'''

# The program that kills this process's kubectl process groups once it is gone (kube.Guardian).
GUARDIAN_SOURCE = r'''"""The guardian: kills a tool process's kubectl process groups once that process is gone.

Run as `python -I -S -c <this text>` with its standard input the far end of a socket the tool
holds. The tool (or each kubectl, just before it execs) writes "+GROUP\n" for each process group
it starts and "-GROUP\n" for each it has stopped and waited for. When the socket's last writer is
gone, however the tool ended (SIGKILL included), every group still named is killed.
"""

from __future__ import annotations

import os
import signal
from typing import Callable


def named_groups(read: Callable[[], bytes]) -> set[int]:
    """The groups still named once the stream ends: each "+N" adds N, each "-N" takes it away."""
    groups: set[int] = set()
    pending = b""
    while True:
        try:
            chunk = read()
        except OSError:
            break  # the stream broke: as good as ended
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            sign, number = line[:1], line[1:]
            if number.isdigit() and sign == b"+":
                groups.add(int(number))
            elif number.isdigit() and sign == b"-":
                groups.discard(int(number))
    return groups


def main() -> None:
    # Out of the terminal's reach already (a session of its own); a hang-up or Ctrl-C meant for
    # the tool must not end the one process that outlives it.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    for group in sorted(named_groups(lambda: os.read(0, 65536))):
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass  # that group has ended already


if __name__ == "__main__":
    main()
'''
# The variable that hands the guardian its program (its command line stays short).
GUARDIAN_VARIABLE = "RL_BATCH_DEMO_GUARDIAN"

# How a rollout's pod runs the episode program (`python -B /demo/launcher.py`, LAUNCHER_KEY in the
# ConfigMap): in this very process, so
# its /proc start time and import figures are its own; its own end recorded (see
# EPISODE_EXIT_ANNOTATION); in a Job of several, EPISODE_INDEX and TASK_FILE set first from the
# run-wide index of its completion index (which Kubernetes gives every pod of an Indexed Job as
# JOB_COMPLETION_INDEX), as in a run of one Job.
EPISODE_LAUNCHER = r'''"""How a rollout's pod runs its episode: the program's own end recorded, the pod's left to others.

The container runs `python -B -c <this text>`, which runs /demo/episode.py in this very process
(as __main__, sys.argv[0] its path), so the episode's start-up figures stay its own. In a Job of
several (one per image) it first sets EPISODE_INDEX and TASK_FILE from the run-wide indexes of
its Job's completion indexes (EPISODE_INDEXES).

When the program ends on its own with a failure (a non-zero exit, an uncaught exception,
os._exit) or is still running EPISODE_TIMEOUT_SECONDS after this process started, one JSON event
`episode_exit` on stdout says so (`exit_code`, or `timed_out` and `timeout_seconds`), and the
process exits 0. So the pod fails only when something outside the program ends it (an eviction,
an OOM kill, the Job's end, the pod's own deadline): a failed pod is the infrastructure's, which
the Job retries under backoffLimitPerIndex and counts under maxFailedIndexes, while the episode's
own failure is a sample. A program that handles SIGTERM (the kubelet's stop, as a suspended or
ended Job deletes its pod) and then ends, however it ends, was ended from outside: the process
exits 143, as if the signal had killed it, and records nothing of its own.

Written for whatever Python 3 an episode image holds: no f-strings, no annotations, and nothing
imported before the episode's own imports but os, runpy and sys (and _signal, loaded at start).
"""

import os
import runpy
import sys

LAUNCHER_PID = os.getpid()
REAL_EXIT = os._exit
EPISODE = "/demo/episode.py"
SIGTERM_EXIT = 128 + 15
# Set once a SIGTERM reached a handler the program installed (as PID 1 it ignores one it does not).
TERMINATED = []  # type: list[int]


def emit_exit(**fields):
    """The episode_exit event on stdout, after whatever the program printed."""
    import json
    import time

    record = {
        "event": "episode_exit",
        "at": time.time(),
        "episode_id": os.environ.get("EPISODE_ID", ""),
    }
    record.update(fields)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        os.write(1, (json.dumps(record) + "\n").encode("utf-8"))
    except OSError:
        pass


def exit_status(code):
    """The status a SystemExit's code ends a process with, its message printed as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:
        pass
    return 1


def ended(status):
    """The program ended with this status: a failure is recorded; either way the process ends 0,
    unless a SIGTERM came first (its stop is not the episode's end)."""
    if TERMINATED:
        sys.exit(SIGTERM_EXIT)
    if status != 0:
        emit_exit(exit_code=status)
    sys.exit(0)


def own_exit(code):
    """os._exit as the program calls it: in this process, recorded like any other end."""
    if os.getpid() == LAUNCHER_PID:
        if TERMINATED:
            REAL_EXIT(SIGTERM_EXIT)
        status = code & 0xFF
        if status != 0:
            emit_exit(exit_code=status)
        REAL_EXIT(0)
    REAL_EXIT(code)


def noting_sigterm(handler):
    """The program's SIGTERM handler, run after noting that the signal came (TERMINATED)."""

    def handle(signum, frame):
        TERMINATED.append(signum)
        return handler(signum, frame)

    handle.episode_handler = handler  # type: ignore[attr-defined]
    return handle


def watch_sigterm():
    """Every SIGTERM handler the program installs (signal.signal calls _signal.signal) noted."""
    try:
        import _signal  # type: ignore[import-not-found]  # loaded as Python starts: costs nothing
    except ImportError:  # a Python before 3.5, whose signal module is its C module itself
        return

    install, current = _signal.signal, _signal.getsignal

    def signal(signalnum, handler):
        if signalnum == _signal.SIGTERM and callable(handler):
            handler = noting_sigterm(getattr(handler, "episode_handler", handler))
        before = install(signalnum, handler)
        return getattr(before, "episode_handler", before)

    def getsignal(signalnum):
        handler = current(signalnum)
        return getattr(handler, "episode_handler", handler)

    _signal.signal, _signal.getsignal = signal, getsignal


def watch(seconds):
    """The episode's own time: past it, recorded as such, and the process ends at once."""
    import time

    time.sleep(seconds)
    emit_exit(timed_out=True, timeout_seconds=seconds)
    REAL_EXIT(0)


def run_wide_index():
    """In a Job of several: this pod's run-wide episode index, its task file named by it."""
    indexes = []  # type: list[int]
    for piece in os.environ["EPISODE_INDEXES"].split(","):
        first, _, last = piece.partition("-")
        indexes += range(int(first), int(last or first) + 1)
    index = indexes[int(os.environ["JOB_COMPLETION_INDEX"])]
    os.environ["EPISODE_INDEX"] = str(index)
    os.environ["TASK_FILE"] = "/tasks/%d.json" % index


def main():
    if "EPISODE_INDEXES" in os.environ:
        run_wide_index()
    timeout = os.environ.get("EPISODE_TIMEOUT_SECONDS")
    if timeout:
        import _thread

        _thread.start_new_thread(watch, (int(timeout),))
    os._exit = own_exit
    watch_sigterm()
    sys.argv, sys.path[0] = [EPISODE], os.path.dirname(EPISODE)
    try:
        runpy.run_path(EPISODE, run_name="__main__")
    except SystemExit as stop:
        ended(exit_status(stop.code))
    except BaseException:
        sys.excepthook(*sys.exc_info())
        ended(1)


if __name__ == "__main__":
    main()
'''


# --------------------------------------------------------------------------
# src/rl_batch_demo/model.py: Errors, and the records the modules share (`RunRequest`, `Caller`, `Settings`, `Task`, `RunPlan`).

class DemoError(Exception):
    """An expected failure: reported as one or a few lines, exit status 1."""


class UsageError(DemoError, ValueError):
    """A `run` setting out of bounds, named as its caller spelled it: a flag on the command
    line (main() then prints argparse's usage, exit 2), a keyword from run_batch()."""


class KeywordTypeError(UsageError, TypeError):
    """A run_batch() keyword of the wrong type (a TypeError, as Python's own would be)."""


class Spelling(NamedTuple):
    """How the caller names a `run` setting in an error: as a flag (`--count 24`) on the
    command line, as a keyword (`count=24`) from run_batch(). A request carries it (RunRequest)."""

    python: bool

    def name(self, dest: str) -> str:
        if dest == "tasks":
            return "tasks" if self.python else "--tasks"
        return f"{dest}=" if self.python else "--" + dest.replace("_", "-")

    def setting(self, dest: str, value: Any) -> str:
        return f"{dest}={value!r}" if self.python else f"{self.name(dest)} {value}"

    def switch(self, dest: str) -> str:
        """A setting that is on: `--prepull`, or `prepull=True`."""
        return f"{dest}=True" if self.python else self.name(dest)

    def option(self, dest: str, metavar: str) -> str:
        """How to pass a setting, as a hint: `--runtime NAME`, or `runtime=NAME`."""
        return f"{dest}={metavar}" if self.python else f"{self.name(dest)} {metavar}"


COMMAND_LINE = Spelling(python=False)

PYTHON_CALL = Spelling(python=True)


class VerificationError(DemoError):
    """An episode or the batch broke a rule of the honest-result checks.

    `failure_class` says whose fault it is: "episode" (the program broke the event
    protocol), "verifier" (the built-in checks of the result failed) or
    "infrastructure" (the container was restarted under it).
    """

    def __init__(self, message: str, failure_class: str = "episode") -> None:
        super().__init__(message)
        self.failure_class = failure_class


class Task(NamedTuple):
    """One line of a --tasks file: its id (the `id` field, else its line number, as a string), its JSON
    text, and the container image its `image` field names (None: the run's --image)."""

    task_id: str
    line: int
    text: str
    image: str | None = None


class ImageGroup(NamedTuple):
    """The episodes of one image: their Job runs `image`; `indexes` are their run-wide episode indexes,
    ascending (a task's group of episodes always together)."""

    image: str
    indexes: tuple[int, ...]


class RolloutPolicy(NamedTuple):
    """How a rollout batch treats failures: retries per episode and failed episodes accepted; with
    `need`, the Job ends as soon as that many episodes have succeeded (successPolicy)."""

    retries: int
    allow_failures: int
    need: int | None = None


class BatchEntry(NamedTuple):
    """One batch of a run, as run.json's `batches` lists it: its Job, whether it is measured (a
    warm-up is not), and its directory under the run's (`.` when the run has one batch); `jobs`:
    its Jobs when it has one per image (none: its one Job, `job`)."""

    job: str
    measured: bool
    dir: str
    jobs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """`run`'s checked arguments, one field per flag (named as its dest), made once by either front
    end (cli.run_request: the command line's flags, or run_batch()'s and stream_batch()'s keywords)
    and read by attribute. `spelling` is how they were given: an error names a setting as its
    caller wrote it, and a Python caller (spelling.python) has its results returned, not printed."""

    output: str
    count: int
    parallelism: int
    image: str
    image_map: tuple[str, ...]  # --image-map's FROM=TO rules, as given
    runtime: str
    context: str | None
    kubectl: str
    timeout: int | None  # None: grown with the batch (default_timeout)
    max_episodes: int
    chunk_size: int
    rounds: int
    warmup: bool
    episode_script: str | None
    tasks_file: str | None  # --tasks FILE; `(run_batch)`, `(stream_batch)`: a Python caller's list
    tasks: tuple[Task, ...] | None  # the tasks, parsed; None without any
    group_size: int
    retries: int | None
    allow_failures: int | None
    need: int | None
    episode_timeout: int | None
    prepull: bool
    pull_timeout: int | None
    dry_run: bool
    harden: bool
    cleanup: bool
    ttl: int | None  # seconds
    quiet: bool
    verbose: bool
    # Tasks, a rollout option, or a Python caller: a batch that writes rewards.jsonl.
    rollout: bool
    spelling: Spelling
    # --namespace: an existing namespace the run shares (None: a namespace of its own); --queue.
    namespace: str | None = None
    queue: str | None = None
    # What each episode's pod is given, as the caller wrote it (podspec checks and reads them).
    cpu: str | None = None
    memory: str | None = None
    env: tuple[str, ...] = ()
    env_from_secret: tuple[str, ...] = ()
    allow_egress: tuple[str, ...] = ()
    need_groups: int | None = None  # --need-groups K: the batch ends once K groups are whole
    otlp_endpoint: str | None = (
        None  # --otlp-endpoint; None: $OTEL_EXPORTER_OTLP_ENDPOINT's, if any
    )
    pushgateway: str | None = None  # --pushgateway
    detach: bool = False  # create everything, write the receipt, return: `attach` follows it


class EgressTarget(NamedTuple):
    """One --allow-egress, as given (`given`) and as its NetworkPolicy rule holds it: the CIDRs
    (a HOST's addresses, as the tool resolved them when the run started), and the TCP port (None:
    every port of a CIDR); `host` is the name a HOST entry pins to those addresses (hostAliases)."""

    given: str
    cidrs: tuple[str, ...]
    port: int | None = None
    host: str | None = None


class SecretSource(NamedTuple):
    """One --env-from-secret: the Secret `name` of `namespace` (None: the context's namespace),
    copied into the run's namespace under the same name."""

    name: str
    namespace: str | None = None


class EpisodePod(NamedTuple):
    """What every episode's pod is given beside its program: its CPU and memory as (request,
    limit) (--cpu, --memory), its environment (--env), Secrets whose keys become its environment
    (--env-from-secret), and under --harden the only places it may reach (--allow-egress)."""

    cpu: tuple[str, str] = ("100m", "500m")
    memory: tuple[str, str] = ("64Mi", "128Mi")
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[SecretSource, ...] = ()
    egress: tuple[EgressTarget, ...] = ()

    def saved(self) -> dict[str, Any]:
        """run.json's fields of what differs from the default pod (the guide's resources)."""
        saved: dict[str, Any] = {}
        default = EpisodePod()
        for name in ("cpu", "memory"):
            if getattr(self, name) != getattr(default, name):
                saved[name] = dict(zip(("request", "limit"), getattr(self, name)))
        if self.env:
            saved["env"] = dict(self.env)
        if self.secrets:
            saved["env_from_secret"] = [secret._asdict() for secret in self.secrets]
        if self.egress:
            saved["allow_egress"] = [target._asdict() for target in self.egress]
        return saved

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> EpisodePod:
        default = cls()
        cpu, memory = saved.get("cpu"), saved.get("memory")
        return cls(
            cpu=(cpu["request"], cpu["limit"]) if cpu else default.cpu,
            memory=(memory["request"], memory["limit"]) if memory else default.memory,
            env=tuple((saved.get("env") or {}).items()),
            secrets=tuple(SecretSource(**each) for each in saved.get("env_from_secret") or ()),
            egress=tuple(
                EgressTarget(**dict(each, cidrs=tuple(each["cidrs"])))
                for each in saved.get("allow_egress") or ()
            ),
        )


# The guide's episode pod: 100m/64Mi requested, 500m/128Mi the limits, nothing added.
GUIDE_POD = EpisodePod()


class PoolShape(NamedTuple):
    """What a pool's Jobs are made of, beside their image and counts."""

    runtime: str
    harden: bool
    reuse: bool
    idle_timeout: int


class Caller(NamedTuple):
    """What the caller of `run` hands in beside its request, none of it a flag: `on_reward`, told
    each rewards.jsonl line (run_batch's callback, or stream_batch's queue); `stop`, requested by
    stream_batch once its reader has gone; `exit_when_done`, from the console's entry points, which
    end the process the moment the run is done (exit_at_once)."""

    on_reward: Callable[[dict], None] | None = None
    stop: StopRequest | None = None
    exit_when_done: bool = False


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one run was asked to do, made once (run_settings(), from its RunRequest; or read back
    from run.json) and read by attribute.
    `saved()` is run.json's form of it, key for key."""

    count: int
    parallelism: int
    image: str = DEFAULT_IMAGE
    runtime: str = DEFAULT_RUNTIME
    timeout: int = DEFAULT_JOB_DEADLINE_SECONDS  # the Job's activeDeadlineSeconds
    rounds: int = 1
    warmup: bool = False
    harden: bool = False
    builtin: bool = True  # the built-in episode, not an --episode-script
    episode_script: str | None = None
    chunk_size: int = LIST_PAGE_SIZE
    episode_script_sha256: str | None = None
    ttl_seconds: int | None = None
    version: str | None = (
        None  # the tool's, as it started the run (none for a run of the guide's script)
    )
    # A rollout batch (--tasks, --retries, --allow-failures, --need, or a Python caller): rewards.jsonl.
    rollout: bool = False
    tasks_file: str | None = None
    group_size: int = 1
    retries: int | None = None  # None: not asked for (the guide's backoffLimit 0)
    allow_failures: int | None = None
    task_ids: tuple[str, ...] | None = None
    need: int | None = None
    need_groups: int | None = None
    episode_timeout: int | None = None
    # An image per task: each task's image (after --image-map, as `image` is), the map itself,
    # the pods' pull deadline, and whether the images are pre-pulled.
    task_images: tuple[str, ...] | None = None
    image_map: tuple[tuple[str, str], ...] = ()
    pull_timeout: int | None = None
    prepull: bool = False
    # Known once the run has named its context and namespace.
    context: str | None = None
    namespace: str | None = None
    batches: tuple[BatchEntry, ...] = ()
    shared_namespace: bool = False  # --namespace: the run shares a namespace it did not make
    queue: str | None = None  # --queue: its Jobs' Kueue LocalQueue
    pod: EpisodePod = GUIDE_POD  # --cpu, --memory, --env, --env-from-secret, --allow-egress

    def saved(self) -> dict[str, Any]:
        """run.json's fields: the rollout options only for a rollout, --need and --episode-timeout
        only when given."""
        saved: dict[str, Any] = {
            "version": self.version,
            "count": self.count,
            "parallelism": self.parallelism,
            "image": self.image,
            "runtime": self.runtime,
            "timeout": self.timeout,
            "rounds": self.rounds,
            "warmup": self.warmup,
            "harden": self.harden,
            "builtin": self.builtin,
            "episode_script": self.episode_script,
            "chunk_size": self.chunk_size,
            "episode_script_sha256": self.episode_script_sha256,
            "ttl_seconds": self.ttl_seconds,
        }
        if self.rollout:
            saved.update(
                {
                    "rollout": True,
                    "tasks_file": self.tasks_file,
                    "group_size": self.group_size,
                    "retries": self.retries,
                    "allow_failures": self.allow_failures,
                    "task_ids": None if self.task_ids is None else list(self.task_ids),
                }
            )
        if self.need is not None:
            saved["need"] = self.need
        if self.need_groups is not None:
            saved["need_groups"] = self.need_groups
        if self.episode_timeout is not None:
            saved["episode_timeout"] = self.episode_timeout
        if self.rollout and self.task_images is not None:
            saved["task_images"] = list(self.task_images)
        if self.image_map:
            saved["image_map"] = dict(self.image_map)
        if self.pull_timeout is not None:
            saved["pull_timeout"] = self.pull_timeout
        if self.prepull:
            saved["prepull"] = True
        saved.update(tenancy_saved(self.shared_namespace, self.queue))
        saved.update(self.pod.saved())
        saved.update(
            {
                "context": self.context,
                "namespace": self.namespace,
                "batches": [saved_entry(entry) for entry in self.batches],
            }
        )
        return saved

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> Settings:
        """A run's settings read back from its run.json; a field an older run did not record takes
        the value that run had. DemoError names a field the results cannot do without."""
        missing = [key for key in SAVED_SETTINGS_NEEDED if key not in saved]
        if missing:
            raise DemoError(
                f"run.json lacks {', '.join(map(repr, missing))}: not a run directory "
                f"this tool can report"
            )
        task_ids = saved.get("task_ids")
        return cls(
            count=saved["count"],
            parallelism=saved["parallelism"],
            image=saved["image"],
            runtime=saved["runtime"],
            timeout=saved.get("timeout", 0),
            rounds=saved.get("rounds") or 1,
            warmup=saved["warmup"],
            harden=saved.get("harden", False),
            builtin=saved.get("builtin", True),
            episode_script=saved.get("episode_script"),
            chunk_size=saved.get("chunk_size", LIST_PAGE_SIZE),
            episode_script_sha256=saved.get("episode_script_sha256"),
            ttl_seconds=saved.get("ttl_seconds"),
            version=saved.get("version"),
            rollout=bool(saved.get("rollout")),
            tasks_file=saved.get("tasks_file"),
            group_size=saved.get("group_size") or 1,
            retries=saved.get("retries"),
            allow_failures=saved.get("allow_failures"),
            task_ids=None if task_ids is None else tuple(task_ids),
            need=saved.get("need"),
            need_groups=saved.get("need_groups"),
            episode_timeout=saved.get("episode_timeout"),
            context=saved["context"],
            namespace=saved["namespace"],
            batches=tuple(
                BatchEntry(
                    entry["job"], entry["measured"], entry["dir"], tuple(entry.get("jobs") or ())
                )
                for entry in saved["batches"]
            ),
            task_images=None if saved.get("task_images") is None else tuple(saved["task_images"]),
            image_map=tuple((saved.get("image_map") or {}).items()),
            pull_timeout=saved.get("pull_timeout"),
            prepull=bool(saved.get("prepull")),
            **tenancy_fields(saved),
            pod=EpisodePod.from_saved(saved),
        )


def tenancy_saved(shared_namespace: bool, queue: str | None) -> dict[str, Any]:
    """run.json's --namespace and --queue: only for a run in a namespace it shares."""
    return {"shared_namespace": True, "queue": queue} if shared_namespace else {}


def tenancy_fields(saved: dict[str, Any]) -> dict[str, Any]:
    """run.json's --namespace and --queue as Settings' fields (absent: a namespace of its own)."""
    return {"shared_namespace": bool(saved.get("shared_namespace")), "queue": saved.get("queue")}


def saved_entry(entry: BatchEntry) -> dict[str, Any]:
    """A batch as run.json lists it: `jobs` only for a batch of one Job per image."""
    saved = entry._asdict()
    if not entry.jobs:
        del saved["jobs"]
    else:
        saved["jobs"] = list(entry.jobs)
    return saved


# What results.json cannot be made without: every other field of run.json has a default.
SAVED_SETTINGS_NEEDED = (
    "count",
    "parallelism",
    "image",
    "runtime",
    "warmup",
    "context",
    "namespace",
    "batches",
)


class RunPlan(NamedTuple):
    """Every object one run creates, built once: `--dry-run` prints them and `run` creates them."""

    namespace: dict | None  # None: the run shares a namespace it did not create
    setup: list[dict]  # the NetworkPolicy (--harden), the worker's ConfigMap, the tasks' ConfigMaps
    jobs: dict[
        str, list[dict]
    ]  # each batch's Jobs (one per image) by its name, in the order the batches run

    def objects(self) -> list[dict]:
        """In creation order."""
        own = [self.namespace] if self.namespace is not None else []
        return [*own, *self.setup, *(job for jobs in self.jobs.values() for job in jobs)]


class StreamClosed(Exception):
    """stream_batch()'s reader stopped before the batch ended: the run stops as on Ctrl-C."""


class StopRequest(threading.Event):
    """Set from another thread (stream_batch's reader gone: closed, dropped, interrupted) to stop
    a run at its next turn, saying why."""

    why = "stream_batch()'s reader stopped before the batch ended"

    def request(self, why: str) -> None:
        self.why = why
        self.set()

    def check(self) -> None:
        """StreamClosed once a stop was requested."""
        if self.is_set():
            raise StreamClosed(self.why)


# --------------------------------------------------------------------------
# src/rl_batch_demo/stats.py: Statistics: percentiles and their descriptions.

def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, index (n-1)*q (NumPy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    return sorted_percentile(sorted(values), q)


def sorted_percentile(ordered: Sequence[float], q: float) -> float:
    """percentile() of values already sorted: a hundred thousand of them are not copied again."""
    position = (len(ordered) - 1) * q
    lower = math.floor(position)
    upper = math.ceil(position)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def describe(
    values: Sequence[float], missing: int = 0, ordered: Sequence[float] | None = None
) -> dict:
    """P50/P95/P99/max/mean of a sample, with its size and how many were missing (`ordered`:
    the values sorted already)."""
    summary: dict[str, Any] = {"samples": len(values), "missing": missing}
    if values:
        ordered = sorted(values) if ordered is None else ordered
        summary.update(
            {
                "p50": rounded(sorted_percentile(ordered, 0.50)),
                "p95": rounded(sorted_percentile(ordered, 0.95)),
                "p99": rounded(sorted_percentile(ordered, 0.99)),
                "max": rounded(max(values)),
                "mean": rounded(sum(values) / len(values)),
            }
        )
    return summary


# --------------------------------------------------------------------------
# src/rl_batch_demo/files.py: Files, and the receipt: what a run created, and the proof that it is the run's own.

def write_text(path: str, text: str | Iterable[str | bytes]) -> None:
    """Write a file whole or not at all (a crash never leaves half a receipt); the text may
    come in pieces, so a large file is never held whole in memory, and a piece may be bytes
    (UTF-8), written as they are."""
    # One temporary name per writer: two threads saving the same file (a log read late while
    # it is read again) must not rename each other's half-written text into place.
    temporary = f"{path}.{threading.get_ident()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            if isinstance(text, str):
                handle.write(text)
            else:
                for piece in text:
                    if isinstance(piece, str):
                        handle.write(piece)
                    elif os.linesep == "\n":  # no line ends to translate: the bytes go as they are
                        handle.flush()
                        handle.buffer.write(piece)
                    else:
                        handle.write(piece.decode("utf-8"))
        os.replace(temporary, path)
    except OSError as error:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # never created, or the disk is beyond help: the error below says what failed
        raise DemoError(f"cannot write {path}: {error.strerror or error}") from None


# A list (or an object) longer than this is written one compact item per line: indenting
# makes json use its pure-Python encoder, ten times slower, which costs seconds for thousands of pods.
ONE_LINE_ITEMS_FROM = 100


class EncodedItems(NamedTuple):
    """The items of a JSON list already encoded one per text: as json.dumps writes them, or
    (`indented`) as json_pieces does at their place in the file; str, or bytes (UTF-8) that
    are written as they are."""

    texts: Callable[[], Iterator[str] | Iterator[bytes]]
    count: int  # type: ignore[assignment]  # the items', not tuple.count()
    indented: bool = False


# Where pods.json holds each pod: {"items": [pod, ...]} puts them two levels down.
POD_LIST_LEVEL = 2


def pod_json(pod: dict, indented: bool) -> str:
    """One pod's text in pods.json: compact (a long list's item), or indented at its place."""
    if not indented:
        return json.dumps(pod)
    # A pod holds no EncodedItems, so its pieces are all str.
    return "".join(cast(Iterator[str], json_pieces(pod, POD_LIST_LEVEL)))


# Items of a long list (or object) are written this many at a time: 500,000 events, each a piece
# of its own, took a second more to write.
ENCODED_ITEMS_A_PIECE = 1000


def json_pieces(value: Any, level: int = 0) -> Iterator[str | bytes]:
    """JSON indented by two spaces, as json.dumps(indent=2), but long lists and objects hold one
    item per line; in pieces, so a file of thousands of pods is written without one string of it
    all. Pieces of EncodedItems given as bytes are bytes."""
    pad = "  " * (level + 1)
    if (
        isinstance(value, EncodedItems)
        and value.count
        and (value.indented or value.count >= ONE_LINE_ITEMS_FROM)
    ):
        # Each text is json_pieces(item, level + 1) (indented) or json.dumps(item), as the list
        # branch below would make it; joined a thousand at a time, not piece by piece.
        yield "[\n"
        yield from joined_items(value.texts(), pad)
        yield "\n" + "  " * level + "]"
        return
    if isinstance(value, EncodedItems):  # a short list: written as the lists below are
        value = [json.loads(text) for text in value.texts()]
    if isinstance(value, dict) and len(value) >= ONE_LINE_ITEMS_FROM:
        # One line an item (observed.json's 100,000 pods), a thousand lines to a piece.
        yield "{\n"
        lines = (f"{json.dumps(str(key))}: {json.dumps(item)}" for key, item in value.items())
        yield from joined_items(lines, pad)
        yield "\n" + "  " * level + "}"
    elif isinstance(value, dict) and value:
        yield "{\n"
        for position, (key, item) in enumerate(value.items()):
            yield (",\n" if position else "") + f"{pad}{json.dumps(str(key))}: "
            yield from json_pieces(item, level + 1)
        yield "\n" + "  " * level + "}"
    elif isinstance(value, (list, tuple)) and len(value) >= ONE_LINE_ITEMS_FROM:
        # One line an item (results.json's rows), a thousand lines to a piece.
        yield "[\n"
        yield from joined_items((json.dumps(item) for item in value), pad)
        yield "\n" + "  " * level + "]"
    elif isinstance(value, (list, tuple)) and value:
        yield "[\n"
        for position, item in enumerate(value):
            yield ",\n" + pad if position else pad
            yield from json_pieces(item, level + 1)
        yield "\n" + "  " * level + "]"
    else:
        yield json.dumps(value)


def joined_items(texts: Iterable[str] | Iterable[bytes], pad: str) -> Iterator[str | bytes]:
    """Texts each after `pad`, joined by ",\n", ENCODED_ITEMS_A_PIECE to a piece; bytes stay
    bytes (hundreds of megabytes of spooled pods and events are not decoded to be written)."""
    remaining: Iterator[Any] = iter(texts)
    lead = pad
    while True:
        some: list = list(itertools.islice(remaining, ENCODED_ITEMS_A_PIECE))
        if not some:
            return
        if isinstance(some[0], bytes):
            yield lead.encode("utf-8") + (",\n" + pad).encode("utf-8").join(some)
        else:
            yield lead + (",\n" + pad).join(some)
        lead = ",\n" + pad


def write_json(path: str, data: Any) -> None:
    def pieces() -> Iterator[str | bytes]:
        yield from json_pieces(data)
        yield "\n"

    write_text(path, pieces())


def read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise DemoError(f"{what} not found: {path}") from None
    except (OSError, ValueError) as error:
        raise DemoError(f"{what} unreadable: {path}: {error}") from None


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def program_name() -> str:
    name = os.path.basename(sys.argv[0] or "")
    return name if name and not name.endswith(".py") else "python3 rl_batch_demo.py"


def kubeconfig_path() -> str:
    """The kubeconfig kubectl reads here: $KUBECONFIG (maybe a list), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or os.path.join(os.path.expanduser("~"), ".kube", "config")


def cleanup_command(output: str, kubectl_binary: str = "kubectl") -> str:
    extra = "" if kubectl_binary == "kubectl" else f" --kubectl {shlex.quote(kubectl_binary)}"
    return f"{program_name()} cleanup --output {shlex.quote(output)}{extra}"


def attach_command(output: str, kubectl_binary: str = "kubectl") -> str:
    """The command that picks a run up again, once its client is gone."""
    extra = "" if kubectl_binary == "kubectl" else f" --kubectl {shlex.quote(kubectl_binary)}"
    return f"{program_name()} attach --output {shlex.quote(output)}{extra}"


class Receipt:
    """receipt.json: the namespace and Jobs of one run and their UIDs, saved whole at every change.

    A run writes it before it changes anything in the cluster and adds each UID the
    moment the object exists, so an interruption at any point leaves a receipt that
    names everything created so far; cleanup deletes only what it proves.
    """

    def __init__(self, path: str, fields: dict[str, Any]) -> None:
        self.path = path
        self.fields = fields

    @classmethod
    def start(
        cls,
        output: str,
        context: str,
        namespace: str,
        run_id: str,
        kubeconfig: str | None = None,
        shared: bool = False,
    ) -> Receipt:
        """A new run's receipt, with the kubeconfig its context came from; written by its first
        `save()`. `shared`: the run's namespace is not its own (`--namespace`); cleanup deletes only
        the objects the receipt names, never the namespace."""
        fields: dict[str, Any] = {"context": context, "namespace": namespace, "run_id": run_id}
        if shared:
            fields.update(shared_namespace=True, objects=[])
        return cls(
            os.path.join(output, RECEIPT_FILE),
            dict(fields, kubeconfig=kubeconfig) if kubeconfig else fields,
        )

    @classmethod
    def read(cls, output: str) -> Receipt:
        """The receipt in a run's directory, written by this tool or by the guide's script."""
        path = os.path.join(output, RECEIPT_FILE)
        fields = read_json(path, "receipt")
        if not isinstance(fields, dict) or not all(
            isinstance(fields.get(k), str) and fields.get(k)
            for k in ("context", "namespace", "run_id")
        ):
            raise DemoError(
                f"receipt {path} lacks context, namespace or run_id; nothing was deleted"
            )
        if not fields["namespace"].startswith(NAMESPACE_PREFIX) and not fields.get(
            "shared_namespace"
        ):
            raise DemoError(
                f"receipt names namespace {fields['namespace']!r}, which this tool never "
                f"creates; nothing was deleted"
            )
        return cls(path, fields)

    @property
    def context(self) -> str:
        return self.fields["context"]

    @property
    def namespace(self) -> str:
        return self.fields["namespace"]

    @property
    def run_id(self) -> str:
        return self.fields["run_id"]

    @property
    def namespace_uid(self) -> str | None:
        """Ours under `namespace_uid`, the guide's under `uid`."""
        return self.fields.get("namespace_uid") or self.fields.get("uid")

    @property
    def shared(self) -> bool:
        """The run shares a namespace it did not create: only its named objects are its own."""
        return bool(self.fields.get("shared_namespace"))

    def save(self) -> None:
        write_json(self.path, self.fields)

    def record_object(self, kind: str, name: str, uid: str) -> None:
        """An object other than a Job made in a shared namespace (a ConfigMap, a Secret, a
        NetworkPolicy), its UID saved before the next object is made."""
        self.fields.setdefault("objects", []).append({"kind": kind, "name": name, "uid": uid})
        self.save()

    def objects(self) -> list[dict[str, str]]:
        """Every object of a shared-namespace run, Jobs last: {kind, name, uid}."""
        jobs = [
            {"kind": "Job", "name": name, "uid": uid or ""}
            for name, uid in (self.fields.get("jobs") or {}).items()
        ]
        return [dict(item) for item in self.fields.get("objects") or []] + jobs

    def record_namespace(self, uid: str) -> None:
        """The namespace's UID under the guide's key `uid`, and under our clearer name beside it."""
        self.fields["uid"] = self.fields["namespace_uid"] = uid
        self.save()

    def record_job(self, job_name: str, uid: str) -> None:
        """Every Job of the run under `jobs`; the guide's `job_uid` is only ever Job `rollout`'s,
        since the guide's cleanup deletes the Job of that name when its UID matches."""
        self.fields.setdefault("jobs", {})[job_name] = uid
        if job_name == JOB_NAME and not self.shared:
            self.fields["job_uid"] = uid
        self.save()

    def has_job(self, job_name: str) -> bool:
        return job_name in (self.fields.get("jobs") or {})

    def job_uids(self) -> dict[str, str | None]:
        """The UID of every Job the receipt names; an old receipt's Job `rollout` by its saved job.json."""
        expected = dict(self.fields.get("jobs") or {})
        if self.fields.get("job_uid"):
            expected.setdefault(JOB_NAME, self.fields["job_uid"])
        if JOB_NAME not in expected:
            saved = os.path.join(os.path.dirname(self.path), "job.json")
            if os.path.exists(saved):
                expected[JOB_NAME] = (read_json(saved, "job.json").get("metadata") or {}).get("uid")
        return expected

    def owns_namespace(self, live: dict | None) -> bool:
        """Whether a live namespace is this run's: it carries the run's label and, once the
        receipt holds a UID, that UID (a namespace deleted and made again under the name is not)."""
        metadata = (live or {}).get("metadata") or {}
        if (metadata.get("labels") or {}).get(RUN_LABEL) != self.run_id:
            return False
        return not self.namespace_uid or metadata.get("uid") == self.namespace_uid


# --------------------------------------------------------------------------
# src/rl_batch_demo/store.py: Holding a big batch in little memory: shared strings and byte spools.

class SharedStrings:
    """One object for each repeated value: each text (field names, nodes, images, reasons) and
    each dict or list equal to one seen before (a Job's pods share their spec, tolerations,
    volumes, owner, most conditions), so that what thousands of ended pods and events hold
    is mostly what differs between them.

    Thousands of decoded pods and events repeat the same texts and parts, each decoded anew;
    sharing them holds an ended pod in about a tenth of the memory. What is shared must never
    be changed in place (nothing here changes a pod or an event once read). A container is
    known by its kind and its items, each a shared text, a container (by identity: the
    table's entry keeps it alive, so no other object has its id meanwhile) or a number of
    its own type (True, 1 and 1.0 are told apart). One that holds a text seen for the first
    time (a pod's name, its uid) is equal to nothing yet and is not kept. The table is emptied
    when it grows large, so the texts seen only once (uids, revisions) never pile up.
    """

    def __init__(self, most: int = 200_000) -> None:
        self.most = most
        self.table: dict[Any, Any] = {}
        self._first_seen = 0  # texts taken into the table so far

    def share(self, value: Any) -> Any:
        if len(self.table) > self.most:
            self.table.clear()
        return self._share(value)

    def _share(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, dict):
            before = self._first_seen
            shared = {self._text(key): self._part(item) for key, item in value.items()}
            if self._first_seen != before:
                return shared  # it holds a text never seen before: no other is equal to it yet
            return self.table.setdefault(self._key(dict, shared.items(), True), shared)
        if isinstance(value, list):
            before = self._first_seen
            items = [self._part(item) for item in value]
            if self._first_seen != before:
                return items
            return self.table.setdefault(self._key(list, items, False), items)
        if isinstance(value, tuple):
            parts = [self._share(item) for item in value]
            return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
        return value

    def text(self, text: str) -> str:
        """The one object held for this text (a pod's name kept as a key of many tables)."""
        if len(self.table) > self.most:
            self.table.clear()
        return self._text(text)

    def _text(self, text: str) -> str:
        known = self.table.get(text)
        if known is None:
            self.table[text] = known = text
            self._first_seen += 1
        return known

    def _part(self, value: Any) -> Any:
        """A container's item: most are texts or numbers, taken without a call each."""
        if isinstance(value, str):
            known = self.table.get(value)
            if known is None:
                self.table[value] = known = value
                self._first_seen += 1
            return known
        if value is None or isinstance(value, (int, float)):
            return value
        return self._share(value)

    def texts(self, value: Any) -> Any:
        """The same value with only its texts shared: for values whose containers are all
        their own (an episode's figures), where keeping them to compare would cost memory."""
        if len(self.table) > self.most:
            self.table.clear()
        return self._texts(value)

    def _texts(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.table.setdefault(value, value)
        if isinstance(value, dict):
            return {self._texts(key): self._texts(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            parts = [self._texts(item) for item in value]
            if isinstance(value, list):
                return parts
            return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
        return value

    @staticmethod
    def _key(kind: type, items: Iterable[Any], pairs: bool) -> tuple:
        """What identifies a container whose items are shared already: its kind, then each item."""
        key: list[Any] = [kind]
        for entry in items:
            if pairs:
                key.append(entry[0])
                entry = entry[1]
            if isinstance(entry, (dict, list, tuple)):
                key += (type(entry), id(entry))  # the table's value holds it: its id is its own
            elif isinstance(entry, float):
                key += (float, entry.hex())  # 0.0 and -0.0 are equal, and print apart
            else:
                key += (type(entry), entry)
        return tuple(key)


SPOOL_BUFFER_BYTES = 1 << 20


class Spool:
    """Texts kept on disk by name, the newest of each: what is written whole at the end but
    need not be held in memory until then. `directory`: where (a run's own output directory,
    not a /tmp that may be memory), in a file removed as soon as it is made; `feeds`: the file
    the texts are kept for, named when the disk refuses them (the spool itself has no name)."""

    def __init__(self, directory: str | None = None, feeds: str = "the spool") -> None:
        self.feeds = os.path.join(directory, feeds) if directory else feeds
        try:
            # Texts of a few kilobytes each, put hundreds a second: a buffer of a megabyte makes
            # a write to the disk of every few hundred, where one of 8 kB made one of every two
            # (a system call each, 50 microseconds apiece on a shared VM).
            self._file = tempfile.TemporaryFile(dir=directory, buffering=SPOOL_BUFFER_BYTES)
        except OSError as error:
            raise DemoError(f"cannot write {self.feeds}: {error.strerror or error}") from None
        # name -> offset * 2**32 + length: one number, not a pair, for each of 100,000s of texts
        self._where: dict[str, int] = {}
        self._end = 0
        self._cut = False  # a write failed: the file may go on past _end
        self._unwritten = False  # texts wait in the buffer, not in the file yet
        self._held: dict[str, str] | None = None  # the texts, once moved into memory

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def put(self, name: str, text: str) -> None:
        data = text.encode("utf-8")
        try:
            if self._cut:
                self._file.seek(self._end)
                self._cut = False
            self._file.write(data)
        except OSError as error:
            # A failed write may have left part of the text in the file: the next one goes
            # back to the end as known and writes over it.
            self._cut = True
            raise DemoError(f"cannot write {self.feeds}: {error.strerror or error}") from None
        self._unwritten = True
        self._where[name] = self._end << 32 | len(data)
        self._end += len(data)

    def forget(self, name: str) -> None:
        self._where.pop(name, None)

    def hold_in_memory(self) -> None:
        """Read every text back and close the file: for a spool kept past its batch (its rows of
        episodes.csv while later rounds run), so that a run of many rounds does not keep a file
        and its megabyte of buffer open for each. No text is put after this."""
        if self._held is None:
            self._held = {name: self.get(name) for name in self._where}
            self._file.close()

    def get(self, name: str) -> str:
        if self._held is not None:
            return self._held[name]
        return self.get_bytes(name).decode("utf-8")

    def get_bytes(self, name: str) -> bytes:
        """The text as put, UTF-8 encoded: hundreds of megabytes of pods and events are written
        into their files as read, not decoded and encoded again."""
        if self._held is not None:
            return self._held[name].encode("utf-8")
        offset, length = self._where[name] >> 32, self._where[name] & 0xFFFFFFFF
        if self._unwritten:
            self._file.flush()
            self._unwritten = False
        if not hasattr(os, "pread"):  # Windows: the file's own position, put back for writing
            self._cut = True
            self._file.seek(offset)
            return self._file.read(length)
        # One call for the text alone: a buffered read after a seek reads a whole buffer,
        # and hundreds of thousands of events are read one by one for events.json.
        data = os.pread(self._file.fileno(), length, offset)
        while len(data) < length:
            more = os.pread(self._file.fileno(), length - len(data), offset + len(data))
            if not more:
                break
            data += more
        return data


# --------------------------------------------------------------------------
# src/rl_batch_demo/parse.py: Parsing what the cluster and the episodes said.

def index_ranges(indexes: Iterable[int]) -> str:
    """Indexes as a Job's index list: `0-3,8-11` (the format of its completedIndexes)."""
    ranges: list[list[int]] = []
    for index in sorted(set(indexes)):
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


# Thousands of pods and events share each whole second's stamp: each is parsed once.
@functools.lru_cache(maxsize=1 << 16)
def parse_time(text: str | None) -> float | None:
    """RFC 3339 (`2026-01-02T03:04:05Z`, optional fraction or offset) -> epoch seconds."""
    if not text:
        return None
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    if "." in value:
        head, rest = value.split(".", 1)
        digits = len(rest) - len(rest.lstrip("0123456789"))
        fraction, offset = rest[:digits], rest[digits:]
        value = f"{head}.{(fraction + '000000')[:6]}{offset}"
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def rfc3339(moment: float) -> str:
    """Epoch seconds -> RFC 3339 in UTC, whole seconds, as Kubernetes writes times."""
    return datetime.datetime.fromtimestamp(int(moment), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `2h`, `1d`, `1h30m` -> seconds (more than 0); ValueError naming the text otherwise."""
    value = text.strip().lower()
    if value.startswith("-"):
        raise ValueError(f"a duration is never negative: {text!r} (e.g. 90s, 30m, 2h, 1d, 1h30m)")
    parts = re.findall(r"(\d+)([smhd])", value)
    if not value or "".join(number + unit for number, unit in parts) != value:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 30m, 2h, 1d, 1h30m)")
    seconds = sum(int(number) * DURATION_UNITS[unit] for number, unit in parts)
    if seconds <= 0:
        raise ValueError(f"duration must be more than 0: {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> the two largest units, as kubectl shows an age: `45s`, `12m`, `3h5m`, `2d4h`."""
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s"
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size * (2 if unit == "d" else 1):
            rest = (whole % size) // smaller_size
            return f"{whole // size}{unit}" + (f"{rest}{smaller}" if rest else "")
    return f"{whole // 60}m"


def parse_events(lines: Iterable[str]) -> list[dict]:
    """The JSON events of an episode log; any other line is kept in the log and skipped here."""
    events = []
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("event"), str):
            events.append(record)
    return events


def iter_json_stream(chunks: Iterable[str]) -> Iterator[Any]:
    """Yield each JSON value of a stream of concatenated values (what `kubectl get -w -o json` prints)."""
    decoder = json.JSONDecoder()
    buffer = ""
    for chunk in chunks:
        buffer += chunk
        while True:
            stripped = buffer.lstrip()
            if not stripped:
                buffer = ""
                break
            try:
                value, end = decoder.raw_decode(stripped)
            except ValueError:
                buffer = stripped  # incomplete: wait for more text
                break
            buffer = stripped[end:]
            yield value


def condition(obj: dict, kind: str) -> dict | None:
    """The status condition of that type, if present."""
    for entry in (obj.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return None


def condition_true(obj: dict, kind: str) -> bool:
    entry = condition(obj, kind)
    return entry is not None and entry.get("status") == "True"


def job_finished(job: dict) -> str | None:
    """ "Complete" or "Failed" once the Job controller has said so, else None. A Job the tool
    stopped once --need-groups was met is "Complete" once none of its pods is left running,
    whatever its controller concluded of the pods that stopping deleted."""
    if cancelled_by_tool(job):
        status = job.get("status") or {}
        stopped = any(condition_true(job, kind) for kind in ("Suspended", "Complete", "Failed"))
        # Its pods still terminating are stopped all the same: the batch is over.
        return "Complete" if stopped and not status.get("active") else None
    for kind in ("Complete", "Failed"):
        if condition_true(job, kind):
            return kind
    return None


def cancelled_by_tool(job: dict) -> bool:
    """The tool stopped the Job's remaining episodes once --need-groups was met."""
    return NEED_GROUPS_ANNOTATION in ((job.get("metadata") or {}).get("annotations") or {})


def job_episode_indexes(job: dict) -> list[int] | None:
    """The run-wide index of each completion index of a Job of several (None: a batch's one Job)."""
    annotations = (((job.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
        "annotations"
    ) or {}
    text = annotations.get(EPISODE_INDEXES_ANNOTATION)
    return None if text is None else sorted(index_list(text))


def run_wide_indexes(job: dict, field: str) -> set[int]:
    """A Job's completedIndexes or failedIndexes as the run's episode indexes."""
    local = index_list(((job.get("status") or {}).get(field)) or "")
    mapping = job_episode_indexes(job)
    if mapping is None:
        return local
    return {mapping[index] for index in local if 0 <= index < len(mapping)}


def latest_condition(jobs: Sequence[dict], kind: str) -> dict | None:
    """The condition `kind` of the Job that reached it last, if every Job reached it (True)."""
    entries = [condition(job, kind) for job in jobs]
    if not entries or any(entry is None or entry.get("status") != "True" for entry in entries):
        return None
    return max(entries, key=lambda entry: parse_time(entry.get("lastTransitionTime")) or 0.0)  # type: ignore


def merged_job(batch: str, jobs: Sequence[dict], expected: int) -> dict:
    """The Jobs of one batch (one per image) read as the one Job the rest of the tool knows: created
    when the first was, its counts and index lists the sums and unions (as run-wide indexes), and
    ended only once all `expected` have: Complete if every one is, else Failed as the first that
    failed says (the latest end's time). `jobs`: as last seen, in creation order."""
    metadata = jobs[0].get("metadata") or {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": batch,
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "creationTimestamp": first_creation(jobs),
            "resourceVersion": newest_version(jobs),
            "labels": {BATCH_LABEL: batch},
            **merged_annotations(jobs),
        },
        "spec": merged_spec(jobs),
        "status": merged_status(jobs, expected),
    }


def merged_annotations(jobs: Sequence[dict]) -> dict[str, Any]:
    """Of the Jobs' annotations, the one that says the tool stopped them (--need-groups)."""
    for job in jobs:
        annotations = (job.get("metadata") or {}).get("annotations") or {}
        if NEED_GROUPS_ANNOTATION in annotations:
            return {"annotations": {NEED_GROUPS_ANNOTATION: annotations[NEED_GROUPS_ANNOTATION]}}
    return {}


def first_creation(jobs: Sequence[dict]) -> str | None:
    """The earliest creationTimestamp of the Jobs, as written."""
    return min(
        (
            job["metadata"].get("creationTimestamp")
            for job in jobs
            if job["metadata"].get("creationTimestamp")
        ),
        key=lambda t: parse_time(t) or 0.0,
        default=None,
    )


def newest_version(jobs: Sequence[dict]) -> str:
    """The highest resourceVersion of the Jobs."""
    versions = [str(job["metadata"].get("resourceVersion") or "") for job in jobs]
    return max(versions, key=lambda v: int(v) if v.isdigit() else -1)


def merged_spec(jobs: Sequence[dict]) -> dict[str, Any]:
    """The first Job's spec, its completions and parallelism the sums of all the Jobs'."""
    spec = dict(jobs[0].get("spec") or {})
    spec.update(
        completions=sum(int((job.get("spec") or {}).get("completions") or 0) for job in jobs),
        parallelism=sum(int((job.get("spec") or {}).get("parallelism") or 0) for job in jobs),
    )
    return spec


def merged_status(jobs: Sequence[dict], expected: int) -> dict[str, Any]:
    """The Jobs' status as one: counts summed, the first start, index lists joined (run-wide),
    and an end once all `expected` Jobs have ended."""
    statuses = [job.get("status") or {} for job in jobs]
    status: dict[str, Any] = {
        key: sum(int(s.get(key) or 0) for s in statuses)
        for key in ("active", "ready", "succeeded", "failed", "terminating")
        if any(key in s for s in statuses)
    }
    starts = [s["startTime"] for s in statuses if s.get("startTime")]
    if starts:
        status["startTime"] = min(starts, key=lambda t: parse_time(t) or 0.0)
    for field in ("completedIndexes", "failedIndexes"):
        indexes = set().union(*(run_wide_indexes(job, field) for job in jobs))
        if indexes or any(field in s for s in statuses):
            status[field] = index_ranges(indexes)
    ends = [job_finished(job) for job in jobs]
    if len(jobs) == expected and all(ends):
        status["conditions"] = merged_end(jobs, ends)
    return status


def merged_end(jobs: Sequence[dict], ends: Sequence[str | None]) -> list[dict]:
    """The conditions of Jobs that have all ended: Complete (and SuccessCriteriaMet) as the latest
    says if every one completed, else Failed as the first that failed says, at the latest end."""
    if all(end == "Complete" for end in ends):
        suspended = [
            condition(job, "Suspended") for job in jobs if condition_true(job, "Suspended")
        ]
        return [
            c
            for c in (
                latest_condition(jobs, "SuccessCriteriaMet"),
                latest_condition(jobs, "Complete"),
                # Those the tool stopped (--need-groups): the last of them to be.
                max(suspended, key=lambda c: parse_time((c or {}).get("lastTransitionTime")) or 0.0)
                if suspended
                else None,
            )
            if c is not None
        ]
    failed = next(job for job, end in zip(jobs, ends) if end == "Failed")
    last_end = max(
        (condition(job, end or "") or {}).get("lastTransitionTime") or ""
        for job, end in zip(jobs, ends)
    )
    return [dict(condition(failed, "Failed") or {}, lastTransitionTime=last_end)]


def container_status(pod: dict, name: str = CONTAINER_NAME) -> dict:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == name:
            return status
    return {}


def container_image(pod: dict) -> str | None:
    """The image the pod's episode container runs, as its spec names it."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == CONTAINER_NAME:
            return container.get("image")
    return containers[0].get("image") if containers else None


def container_terminated(pod: dict) -> dict | None:
    """The episode container's terminated state, if it has ended."""
    return (container_status(pod).get("state") or {}).get("terminated")


def pod_name(pod: dict) -> str:
    return pod["metadata"]["name"]


def event_object(event: dict) -> dict:
    """What an event is about: core/v1 says involvedObject, events.k8s.io/v1 says regarding."""
    return event.get("involvedObject") or event.get("regarding") or {}


class EventRecord(NamedTuple):
    """One Kubernetes event, the fields of it this tool reads, from core/v1 or events.k8s.io/v1
    alike: what every reader of events takes (event_record makes one from the event as the API
    gives it). The watch holds each event so, its whole text waiting on disk for events.json: a
    tuple of shared texts takes a third of the event's decoded dicts.

    Each field is the event's own value, None where it has none; what it is about (`kind`,
    `object_name`, `uid`, `field_path`) is its involvedObject's, else its regarding's."""

    name: str | None  # metadata.name: the recorder names it `<object>.<hex UnixNano>`
    created: str | None  # metadata.creationTimestamp: when the API server stored it
    kind: str | None
    object_name: str | None
    uid: str | None
    field_path: str | None
    reason: str | None
    type: str | None
    message: Any  # its message, else (events.k8s.io/v1) its note
    event_time: str | None
    last_timestamp: str | None
    count: Any
    reporting_instance: str | None
    component: str | None  # source.component
    host: str | None  # source.host

    @property
    def text(self) -> str:
        """Its message (or note) as text, "" for none."""
        return str(self.message or "")


def event_record(event: dict) -> EventRecord:
    """The fields of an event this tool reads (see EventRecord)."""
    metadata = event.get("metadata") or {}
    regarding = event_object(event)
    source = event.get("source") or {}
    return EventRecord(
        metadata.get("name"),
        metadata.get("creationTimestamp"),
        regarding.get("kind"),
        regarding.get("name"),
        regarding.get("uid"),
        regarding.get("fieldPath"),
        event.get("reason"),
        event.get("type"),
        event.get("message") or event.get("note"),
        event.get("eventTime"),
        event.get("lastTimestamp"),
        event.get("count"),
        event.get("reportingInstance"),
        source.get("component"),
        source.get("host"),
    )


def event_records(events: Iterable[dict]) -> list[EventRecord]:
    """Events as the API gives them (a list's items, events.json's), as their readers take them."""
    return [event_record(event) for event in events]


def pod_events(events: Iterable[EventRecord], reason: str) -> Iterator[tuple[EventRecord, str]]:
    """The events of `reason` about a Pod: (event, the pod's name)."""
    for event in events:
        if event.reason == reason and event.kind == "Pod":
            yield event, event.object_name or ""


def scheduled_event_times(events: Iterable[EventRecord]) -> dict[str, float]:
    """Pod name -> the scheduler's `Scheduled` eventTime (microsecond precision)."""
    times: dict[str, float] = {}
    for event, pod in pod_events(events, "Scheduled"):
        moment = parse_time(event.event_time)
        if moment is not None:
            times[pod] = moment
    return times


def batch_events(
    events: Iterable[EventRecord], job: dict | None, pods: Sequence[dict], first: bool
) -> list[EventRecord]:
    """The events of one batch of several in a namespace: about its Job or its pods, and
    (for the first batch) about whatever no Job owns, such as the ConfigMap."""
    job_name = ((job or {}).get("metadata") or {}).get("name", "")
    uids = {((job or {}).get("metadata") or {}).get("uid")} | {
        p["metadata"].get("uid") for p in pods
    }
    uids.discard(None)
    # A pod gone before the pods were listed is known by its name alone: <job>-[<index>-]<suffix>.
    own_pod = re.compile(re.escape(job_name) + r"-(\d+-)?[a-z0-9]{5}$")
    kept = []
    for event in events:
        kind, name = event.kind, event.object_name or ""
        if (
            event.uid in uids
            or (kind == "Job" and name == job_name)
            or (kind == "Pod" and own_pod.match(name))
            or (first and kind not in ("Job", "Pod"))
        ):
            kept.append(event)
    return kept


def events_table(events: Sequence[EventRecord]) -> str:
    """Events as a table in the order they were created, like `kubectl get events`, with the UTC time
    each was last seen (kubectl prints its age, which means nothing once the file is read later)."""
    return "".join(events_table_lines(events))


def events_table_lines(events: Sequence[EventRecord]) -> Iterator[str]:
    """events_table a thousand lines at a time, each with its line end: hundreds of thousands of
    events are written without one string of them all, nor one write each."""
    yield f"{'LAST SEEN (UTC)':<22}{'TYPE':<9}{'REASON':<26}{'OBJECT':<40}MESSAGE\n"
    lines = map(event_table_line, sorted(events, key=lambda e: e.created or ""))
    while True:  # as many lines to a piece as a long JSON list's items
        piece = "".join(itertools.islice(lines, ENCODED_ITEMS_A_PIECE))
        if not piece:
            return
        yield piece


def event_table_line(event: EventRecord) -> str:
    seen = event.last_timestamp or event.event_time or event.created
    about = ("" if event.kind is None else event.kind.lower()) + "/" + (event.object_name or "")
    return (
        f"{(seen or '')[:19] + 'Z':<22}{event.type or '':<9}{event.reason or '':<26}"
        f"{about:<40}{(event.message or '').strip()}\n"
    )


def image_cache_states(events: Iterable[EventRecord]) -> dict[str, str]:
    """Pod name -> "present" (the node had the image) or "pulled", from the kubelet's Pulled event."""
    states: dict[str, str] = {}
    for event, pod in pod_events(events, "Pulled"):
        if "already present on machine" in event.text:
            states[pod] = "present"
        elif "Successfully pulled" in event.text:
            states.setdefault(pod, "pulled")
    return states


GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")

GO_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

# The kubelet's words once an image is pulled (Kubernetes >= 1.30 adds the waiting and the size):
# `Successfully pulled image "X" in 1.234s (2.5s including waiting). Image size: 123 bytes.`
PULLED_MESSAGE = re.compile(
    r'Successfully pulled image "(?P<image>[^"]*)" in (?P<pull>\S+?)'
    r"(?: \((?P<total>\S+) including waiting\))?\.?"
    r"(?: Image size: (?P<size>\d+) bytes\.)?\s*$"
)


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration as time.Duration prints it (`1.5s`, `850ms`, `1m2.5s`, `0s`);
    ValueError for anything else."""
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    if body == "0":
        return 0.0
    parts = GO_DURATION_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"not a Go duration: {text!r}")
    return sign * sum(float(number) * GO_DURATION_UNITS[unit] for number, unit in parts)


class ImagePull(NamedTuple):
    """What the kubelet said of one pod's image: pulled or present, and for a pull its own figures
    (seconds pulling, seconds including the wait for earlier pulls on the node, bytes), None where
    its message does not say."""

    image: str
    pulled: bool
    pull_seconds: float | None = None
    total_seconds: float | None = None
    size_bytes: int | None = None

    @property
    def waiting_seconds(self) -> float | None:
        """How long the pull queued behind others (the kubelet pulls one image at a time by default)."""
        if self.pull_seconds is None or self.total_seconds is None:
            return None
        return max(0.0, self.total_seconds - self.pull_seconds)


# Every pod whose image was present says so in the same words: each is read once, into one record.
@functools.lru_cache(maxsize=1 << 12)
def parse_pulled_message(message: str) -> ImagePull | None:
    """A kubelet Pulled event's message read; None for one that is neither a pull nor a present image."""
    present = re.match(r'Container image "(?P<image>[^"]*)" already present on machine', message)
    if present:
        return ImagePull(present.group("image"), False)
    found = PULLED_MESSAGE.match(message.strip())
    if not found:
        return None

    def seconds(text: str | None) -> float | None:
        try:
            return None if text is None else parse_go_duration(text)
        except ValueError:
            return None

    size = found.group("size")
    return ImagePull(
        found.group("image"),
        True,
        seconds(found.group("pull")),
        seconds(found.group("total")),
        None if size is None else int(size),
    )


def image_pulls(events: Iterable[EventRecord]) -> dict[str, ImagePull]:
    """Pod name -> its episode container's image as the kubelet's Pulled event says (its first one)."""
    pulls: dict[str, ImagePull] = {}
    for event, pod in pod_events(events, "Pulled"):
        if event.field_path not in (None, EPISODE_FIELD_PATH):
            continue
        pull = parse_pulled_message(event.text)
        if pull is not None:
            pulls.setdefault(pod, pull)
    return pulls


def count_image_cache(states: Iterable[str | None]) -> dict[str, int]:
    """How many episodes found their image on the node, had it pulled, or left no trace of which."""
    counts = {"present": 0, "pulled": 0, "unknown": 0}
    for state in states:
        counts[state or "unknown"] += 1
    return counts


def warning_summary(events: Iterable[EventRecord]) -> dict[str, dict]:
    """Warning events per reason: how many, and which objects they named."""
    summary: dict[str, dict] = {}
    for event in events:
        if event.type != "Warning":
            continue
        entry = summary.setdefault(event.reason or "Unknown", {"count": 0, "objects": []})
        entry["count"] += int(event.count or 1)
        kind = "?" if event.kind is None else event.kind
        name = f"{kind}/{'?' if event.object_name is None else event.object_name}"
        if name not in entry["objects"]:
            entry["objects"].append(name)
    return summary


PULL_FAILURE_CHARS = 400


def pod_warnings(events: Iterable[EventRecord], most: int = 3) -> dict[str, list[str]]:
    """Pod name -> its first few distinct Warning events as `reason: message` (a kubelet says
    "Failed: Error: ErrImagePull"), each message cut to one short line."""
    warnings: dict[str, list[str]] = {}
    for event in events:
        if event.type == "Warning" and event.kind == "Pod":
            message = " ".join(event.text.split())
            # A failed pull is said whole enough to name the image and the registry's answer.
            cut = PULL_FAILURE_CHARS if message.startswith("Failed to pull image") else 120
            text = f"{event.reason or 'Unknown'}: {message[:cut]}".rstrip(": ")
            seen = warnings.setdefault(event.object_name or "", [])
            if text not in seen and len(seen) < most:
                seen.append(text)
    return warnings


def index_list(text: str) -> set[int]:
    """A Job's index list ("1,3-5") as a set; a malformed piece is skipped."""
    indexes: set[int] = set()
    for piece in text.split(","):
        first, _, last = piece.strip().partition("-")
        try:
            indexes.update(range(int(first), int(last or first) + 1))
        except ValueError:
            continue
    return indexes


# The kubelet's events about the episode's container name it so (others: an init container's).
EPISODE_FIELD_PATH = f"spec.containers{{{CONTAINER_NAME}}}"


# --------------------------------------------------------------------------
# src/rl_batch_demo/manifests.py: Manifests: plain dicts built from their arguments alone; and capacity: can the batch's pods all

class RunOrigin(NamedTuple):
    """Who starts a run, from where, and until when it may live: its namespace's annotations."""

    run_id: str
    version: str
    host: str
    output: str  # absolute
    user: str
    expires_at: float | None  # epoch seconds, from `run --ttl`


def origin_annotations(origin: RunOrigin) -> dict[str, str]:
    """The annotations that let `list` and `cleanup --stale` know a run without its receipt."""
    annotations = {
        RUN_ID_ANNOTATION: origin.run_id,
        VERSION_ANNOTATION: origin.version,
        HOST_ANNOTATION: origin.host,
        OUTPUT_ANNOTATION: origin.output,
        USER_ANNOTATION: origin.user,
    }
    if origin.expires_at is not None:
        annotations[EXPIRES_ANNOTATION] = rfc3339(origin.expires_at)
    return annotations


class PlannedWork(NamedTuple):
    """What a run plans, every batch told: its Jobs and their episodes (completions)."""

    jobs: int
    episodes: int


def planned_work(jobs: Mapping[str, Sequence[dict]]) -> PlannedWork:
    """The Jobs and episodes of every batch of a plan (RunPlan.jobs)."""
    manifests = [manifest for batch in jobs.values() for manifest in batch]
    return PlannedWork(
        len(manifests),
        sum(int(manifest["spec"].get("completions") or 1) for manifest in manifests),
    )


def planned_annotations(planned: PlannedWork) -> dict[str, str]:
    return {
        JOBS_PLANNED_ANNOTATION: str(planned.jobs),
        EPISODES_PLANNED_ANNOTATION: str(planned.episodes),
    }


def namespace_manifest(
    namespace: str,
    run_id: str,
    harden: bool = False,
    origin: RunOrigin | None = None,
    planned: PlannedWork | None = None,
) -> dict:
    """The run's own Namespace, labelled with the run id; annotated with its origin and with what
    it plans, when given (in the manifest itself, so the namespace never exists without them)."""
    labels = {RUN_LABEL: run_id}
    if harden:
        labels.update(
            {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            }
        )
    metadata: dict[str, Any] = {"name": namespace, "labels": labels}
    annotations = {
        **(origin_annotations(origin) if origin is not None else {}),
        **(planned_annotations(planned) if planned is not None else {}),
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def configmap_manifest(namespace: str, worker_source: str, launcher: bool = False) -> dict:
    """The ConfigMap that ships the episode program to every pod; a rollout's, the launcher too."""
    data = {WORKER_KEY: worker_source}
    if launcher:
        data[LAUNCHER_KEY] = EPISODE_LAUNCHER
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP_NAME, "namespace": namespace},
        "data": data,
    }


def network_policy_manifest(namespace: str) -> dict:
    """Deny all ingress and egress for every pod of the namespace."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all", "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }


def pool_network_policy_manifest(namespace: str) -> dict:
    """--harden for a pool: no egress at all, and no ingress but to the sandbox server's port.
    The API server's pod proxy reaches that port from a node's address, which no selector of pods
    or namespaces names (and a deny-all policy, enforced, would refuse it): the port is open to
    any source, the run's token keeping out every request but the pool's."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all-but-sandbox-port", "namespace": namespace},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]}],
        },
    }


def file_line(number: int) -> str:
    return f"line {number}"


def parse_tasks(lines: Iterable[str], place: Callable[[int], str] = file_line) -> list[Task]:
    """The tasks of a JSONL file: one JSON object per non-blank line; ValueError names a bad
    line as `place` says it (a file's line number, or a Python list's index)."""
    tasks = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError as error:
            raise ValueError(f"{place(number)} is not JSON ({error})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{place(number)} is not a JSON object")
        task_id = value.get("id", number)
        if isinstance(task_id, (dict, list)) or task_id is None:
            raise ValueError(f"{place(number)}: the task id must be a string or a number")
        image = value.get("image")
        if "image" in value and (
            not isinstance(image, str) or not image.strip() or image != image.strip()
        ):
            raise ValueError(
                f"{place(number)}: the task image must be a non-empty string without spaces "
                f"around it, got {image!r}"
            )
        # Always a string: a trainer joining rewards to tasks by id meets one type, not "a" and 3.
        tasks.append(
            Task(task_id if isinstance(task_id, str) else json.dumps(task_id), number, text, image)
        )
    if not tasks:
        raise ValueError("no tasks in it")
    ids = [task.task_id for task in tasks]
    if len(set(map(json.dumps, ids))) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"task id {duplicate!r} appears more than once")
    return tasks


def parse_image_map(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """--image-map FROM=TO, each given: (FROM, TO) pairs; ValueError names a malformed one."""
    pairs: list[tuple[str, str]] = []
    for text in texts:
        source, equals, target = text.partition("=")
        if (
            not equals
            or not source
            or not target
            or source != source.strip()
            or target != target.strip()
        ):
            raise ValueError(
                f"{text!r} is not FROM=TO (two image reference prefixes, e.g. "
                f"docker.io/swebench=registry.internal/swebench)"
            )
        if any(source == earlier for earlier, _ in pairs):
            raise ValueError(f"{source!r} is mapped twice")
        pairs.append((source, target))
    return tuple(pairs)


def names_registry(part: str) -> bool:
    """Whether a reference's first part is a registry host (a `.` or `:` in it, or `localhost`)."""
    return "." in part or ":" in part or part == "localhost"


def docker_hub_reference(image: str) -> str:
    """A reference in full, as containerd resolves it: a name whose first part names no registry
    host is Docker Hub's, `library/` for a bare one."""
    first, slash, _ = image.partition("/")
    if slash and names_registry(first):
        return image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


def prefix_matches(image: str, source: str) -> bool:
    """`source` begins `image` at a boundary of its parts: `docker.io/swebench` is a prefix of
    `docker.io/swebench/a:1` but not of `docker.io/swebench-extra/a:1`."""
    if not image.startswith(source):
        return False
    return source.endswith(("/", ":")) or image[len(source) : len(source) + 1] in (
        "",
        "/",
        ":",
        "@",
    )


def source_references(source: str) -> list[str]:
    """The full references a FROM of --image-map may stand for: itself when it starts with a
    registry host, else Docker Hub's (`swebench` is `docker.io/swebench`, `python` also
    `docker.io/library/python`)."""
    first, slash, _ = source.partition("/")
    if names_registry(first):
        return [source]
    return [f"docker.io/{source}"] + ([] if slash else [f"docker.io/library/{source}"])


def rewrite_image(image: str, image_map: Sequence[tuple[str, str]]) -> str:
    """An image reference with its prefix rewritten by the longest FROM it starts with (at most
    once), both read in full as containerd resolves them (Docker Hub's short forms `python:3` and
    `swebench/a:1` are `docker.io/library/python:3` and `docker.io/swebench/a:1`), and matched
    at a boundary of the reference's parts."""
    full = docker_hub_reference(image)
    matches = [
        (len(prefix), prefix, target)
        for source, target in image_map
        for prefix in source_references(source)
        if prefix_matches(full, prefix)
    ]
    if not matches:
        return image
    _, prefix, target = max(matches, key=lambda match: match[0])
    return target + full[len(prefix) :]


def task_images(
    tasks: Sequence[Task], default_image: str, image_map: Sequence[tuple[str, str]] = ()
) -> list[str]:
    """Each task's image: its own rewritten by the map, else `default_image` (--image, rewritten already)."""
    return [rewrite_image(task.image, image_map) if task.image else default_image for task in tasks]


def image_groups(
    tasks: Sequence[Task],
    count: int,
    group_size: int,
    default_image: str,
    image_map: Sequence[tuple[str, str]] = (),
) -> list[ImageGroup]:
    """The run's episodes by image, in order of the image's first appearance (see task_images);
    without tasks, every episode runs the default image."""
    if not tasks:
        return [ImageGroup(default_image, tuple(range(count)))]
    by_image: dict[str, list[int]] = {}
    for position, image in enumerate(task_images(tasks, default_image, image_map)):
        by_image.setdefault(image, []).extend(
            range(position * group_size, (position + 1) * group_size)
        )
    return [ImageGroup(image, tuple(indexes)) for image, indexes in by_image.items()]


def parallelism_shares(parallelism: int, sizes: Sequence[int]) -> list[int]:
    """--parallelism shared between the Jobs of one batch: each Job's share in proportion to its
    episodes, at least 1 and at most its episodes, the shares adding up to at most `parallelism`
    (largest remainders first); ValueError when there are more Jobs than pods at once."""
    if len(sizes) > parallelism:
        raise ValueError(f"{len(sizes)} images need at least one pod each at once")
    total = sum(sizes)
    exact = [parallelism * size / total for size in sizes]
    shares = [min(size, max(1, math.floor(share))) for size, share in zip(sizes, exact)]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
    while sum(shares) < parallelism and any(shares[i] < sizes[i] for i in by_remainder):
        for i in by_remainder:
            if sum(shares) < parallelism and shares[i] < sizes[i]:
                shares[i] += 1
    while sum(shares) > parallelism:  # the minimum of 1 each took more than its share
        widest = max(range(len(sizes)), key=lambda i: (shares[i], -i))
        shares[widest] -= 1
    return shares


def task_key(position: int) -> str:
    return f"task-{position}.json"


def task_configmaps(namespace: str, tasks: Sequence[Task]) -> list[dict]:
    """The ConfigMaps that carry the tasks, one key per task, split to stay under a ConfigMap's size."""
    chunks: list[dict[str, str]] = [{}]
    size = 0
    for position, task in enumerate(tasks):
        key = task_key(position)
        entry = len(key.encode("utf-8")) + len(task.text.encode("utf-8"))
        if entry > TASKS_CONFIGMAP_BYTES:
            raise DemoError(
                f"task on line {task.line} takes {entry} bytes; one task may take at most "
                f"{TASKS_CONFIGMAP_BYTES} bytes (a ConfigMap holds 1 MiB); nothing was created"
            )
        if size + entry > TASKS_CONFIGMAP_BYTES:
            chunks.append({})
            size = 0
        chunks[-1][key] = task.text
        size += entry
    if len(chunks) > TASKS_MAX_CONFIGMAPS:
        total = sum(len(t.text.encode("utf-8")) for t in tasks)
        raise DemoError(
            f"the tasks take {total} bytes, more than {TASKS_MAX_CONFIGMAPS} ConfigMaps of "
            f"{TASKS_CONFIGMAP_BYTES} bytes can carry; split them into several batches; "
            f"nothing was created"
        )
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{TASKS_CONFIGMAP_PREFIX}{number}", "namespace": namespace},
            "data": data,
        }
        for number, data in enumerate(chunks)
    ]


def tasks_volume(
    configmaps: Sequence[dict], group_size: int, indexes: Iterable[int] | None = None
) -> dict:
    """One volume with a file per episode, `<episode index>.json`, holding that episode's task:
    episodes g*G .. g*G+G-1 share task g, projected from its one ConfigMap key. With `indexes`
    (the episodes of one image's Job), only theirs."""
    wanted = None if indexes is None else set(indexes)
    sources = []
    for configmap in configmaps:
        items = []
        for key in configmap["data"]:
            position = int(key[len("task-") : -len(".json")])
            items += [
                {"key": key, "path": f"{index}.json"}
                for index in range(position * group_size, (position + 1) * group_size)
                if wanted is None or index in wanted
            ]
        if items:
            sources.append({"configMap": {"name": configmap["metadata"]["name"], "items": items}})
    return {"name": TASKS_VOLUME, "projected": {"sources": sources}}


def pod_failure_policy() -> dict:
    """Retry what is not the episode's doing; fail an episode at once on its own failure.

    A disruption (eviction, preemption, node loss) is counted against the episode's
    retries even when its container then exits with a code of its own; any other
    exit code of the episode container, save those of INFRASTRUCTURE_EXIT_CODES,
    is the episode's verdict and is never retried.
    """
    return {
        "rules": [
            {
                "action": "Count",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailIndex",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "NotIn",
                    "values": list(INFRASTRUCTURE_EXIT_CODES),
                },
            },
        ]
    }


class Launch(NamedTuple):
    """How a rollout's pod runs its episode: through EPISODE_LAUNCHER, which records the program's
    own end; in a Job of several (`several`: its run-wide indexes set from EPISODE_INDEXES), and
    with the episode's own time (`timeout`, seconds from the launcher's start) if it has one."""

    several: bool = False
    timeout: int | None = None


def episode_env(indexed: bool, tasks: dict | None, launch: Launch | None = None) -> list[dict]:
    """The episode's environment: its pod's name, and in an Indexed Job its index and its task file
    (in a Job of several, the run-wide indexes of its Job's completion indexes, which
    EPISODE_LAUNCHER reads); under the launcher, the episode's own time."""
    env: list[dict[str, Any]] = [
        {"name": "EPISODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    if launch is not None and launch.several:
        env.append(
            {
                "name": "EPISODE_INDEXES",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{EPISODE_INDEXES_ANNOTATION}']"
                    }
                },
            }
        )
    else:
        env += indexed_env(indexed, tasks)
    if launch is not None and launch.timeout is not None:
        env.append({"name": EPISODE_TIMEOUT_ENV, "value": str(launch.timeout)})
    return env


def indexed_env(indexed: bool, tasks: dict | None) -> list[dict]:
    """In an Indexed Job of its own: the episode's index, and the task file it names."""
    env: list[dict[str, Any]] = []
    if indexed:
        env.append(
            {
                "name": "EPISODE_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
                    }
                },
            }
        )
    if tasks:
        # $(EPISODE_INDEX) expands because it is defined earlier in the list.
        env.append({"name": TASK_FILE_ENV, "value": f"{TASKS_MOUNT}/$(EPISODE_INDEX).json"})
    return env


def episode_container(
    image: str,
    harden: bool,
    indexed: bool,
    tasks: dict | None,
    launch: Launch | None = None,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """The container that runs the episode program: unprivileged, the requests and limits of `pod`
    (small by default), its --env after the tool's own and its Secrets' keys (envFrom: the kubelet
    lets `env` win); a rollout's, through EPISODE_LAUNCHER (`launch`)."""
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if harden:
        security["readOnlyRootFilesystem"] = True
    mounts = [
        {"name": "demo", "mountPath": "/demo", "readOnly": True},
        {"name": "workspace", "mountPath": "/workspace"},
    ]
    if tasks:
        mounts.append({"name": TASKS_VOLUME, "mountPath": TASKS_MOUNT, "readOnly": True})
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", f"/demo/{LAUNCHER_KEY if launch else WORKER_KEY}"],
        "env": episode_env(indexed, tasks, launch)
        + [{"name": key, "value": value} for key, value in pod.env],
        "securityContext": security,
        "resources": pod_resources(pod),
        "volumeMounts": mounts,
    }
    if pod.secrets:
        container["envFrom"] = [{"secretRef": {"name": secret.name}} for secret in pod.secrets]
    return container


def pod_resources(pod: EpisodePod) -> dict:
    """A container's requests and limits from --cpu and --memory (the guide's by default)."""
    return {
        "requests": {"cpu": pod.cpu[0], "memory": pod.memory[0]},
        "limits": {"cpu": pod.cpu[1], "memory": pod.memory[1]},
    }


def host_aliases(targets: Sequence[EgressTarget]) -> list[dict]:
    """Each HOST of --allow-egress pinned to its resolved addresses in the pods' /etc/hosts: the
    deny-all leaves them no DNS, and the NetworkPolicy lets them reach those addresses alone."""
    names: dict[str, list[str]] = {}
    for target in targets:
        host = target.host
        if host is None:
            continue
        for cidr in target.cidrs:
            address = str(ipaddress.ip_network(cidr).network_address)
            if host not in names.setdefault(address, []):
                names[address].append(host)
    return [{"ip": address, "hostnames": hostnames} for address, hostnames in names.items()]


def episode_pod_spec(
    image: str,
    runtime: str,
    harden: bool,
    indexed: bool,
    tasks: dict | None,
    episode_timeout: int | None = None,
    launch: Launch | None = None,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """An episode's pod: in the sandbox runtime, never restarted, non-root, without a service account token;
    with `episode_timeout`, stopped by its kubelet that many seconds after the pod started; each
    host --allow-egress names pinned to its addresses."""
    volumes = [
        {"name": "demo", "configMap": {"name": CONFIGMAP_NAME}},
        {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"} if harden else {}},
    ]
    if tasks:
        volumes.append(tasks)
    deadline = {} if episode_timeout is None else {"activeDeadlineSeconds": episode_timeout}
    aliases = host_aliases(pod.egress)
    return {
        **deadline,
        **({"hostAliases": aliases} if aliases else {}),
        "runtimeClassName": runtime,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "runAsNonRoot": True,
        },
        "containers": [episode_container(image, harden, indexed, tasks, launch, pod)],
        "volumes": volumes,
    }


def job_manifest(
    namespace: str,
    count: int,
    parallelism: int,
    image: str,
    runtime: str,
    deadline_seconds: int = DEFAULT_JOB_DEADLINE_SECONDS,
    name: str = JOB_NAME,
    harden: bool = False,
    indexed: bool = False,
    tasks: dict | None = None,
    policy: RolloutPolicy | None = None,
    episode_timeout: int | None = None,
    batch: str | None = None,
    episode_indexes: Sequence[int] | None = None,
    launch: Launch | None = None,
    deadline_parts: str | None = None,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """The Job whose pods are the episodes: backoffLimit 0, so one failed episode fails the batch.

    `tasks` (a volume from tasks_volume) gives each episode its task file, named by
    TASK_FILE; `policy` replaces backoffLimit 0 with retries per episode
    (backoffLimitPerIndex), a number of failed episodes the Job tolerates
    (maxFailedIndexes) and the podFailurePolicy that tells whose failure it was; its
    `need` ends the Job once that many episodes succeeded (successPolicy), the rest
    stopped. `episode_timeout` is each pod's activeDeadlineSeconds, `deadline_parts` what it is
    made of (DEADLINE_ANNOTATION). `pod`: each pod's resources, environment and pinned hosts.

    `launch`: a rollout's pods run their episode through EPISODE_LAUNCHER, which records the
    episode's own failure and ends the pod 0, so that only a failure of the infrastructure fails a
    pod (and counts against the Job's limits). `batch` and `episode_indexes`: this Job is one of
    several in batch `batch` (one per image), its completion index i the run's episode
    episode_indexes[i] (always launched).
    """
    indexed_mode = bool(indexed or tasks or policy or episode_indexes is not None)
    if episode_indexes is not None:
        launch = (launch or Launch())._replace(several=True)
    spec: dict[str, Any] = {
        "completions": count,
        "parallelism": parallelism,
        "backoffLimit": 0,
        "activeDeadlineSeconds": deadline_seconds,
        "template": {
            "metadata": episode_pod_metadata(
                batch, episode_indexes, launch is not None, deadline_parts
            ),
            "spec": episode_pod_spec(
                image, runtime, harden, indexed_mode, tasks, episode_timeout, launch, pod
            ),
        },
    }
    if indexed_mode:
        spec["completionMode"] = "Indexed"
    if policy:
        # The Job-wide limit would end the batch at its first failure; each episode has its own.
        del spec["backoffLimit"]
        spec.update(rollout_policy_spec(policy))
    metadata = job_metadata(namespace, name, batch if episode_indexes is not None else None)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def job_metadata(namespace: str, name: str, batch: str | None) -> dict[str, Any]:
    """A Job's name and namespace; one of batch `batch`'s several Jobs, labelled with it."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if batch is not None:
        # The API server copies the template's labels onto a Job only when the Job has none: one
        # with labels of its own carries the tool's too, or list and cleanup --stale miss it.
        metadata["labels"] = {"app": APP_LABEL, BATCH_LABEL: batch}
    return metadata


def episode_pod_metadata(
    batch: str | None,
    episode_indexes: Sequence[int] | None,
    launched: bool = False,
    deadline_parts: str | None = None,
) -> dict:
    """The labels of every episode's pod; in one of a batch's several Jobs, its batch and the run's
    episode indexes too; under the launcher, that its episode's own end is recorded in its log;
    with a deadline, what it is made of."""
    metadata: dict[str, Any] = {"labels": {"app": APP_LABEL}}
    annotations = {}
    if episode_indexes is not None:
        metadata["labels"][BATCH_LABEL] = batch
        annotations[EPISODE_INDEXES_ANNOTATION] = index_ranges(episode_indexes)
    if launched:
        annotations[EPISODE_EXIT_ANNOTATION] = EPISODE_EXIT_RECORDED
    if deadline_parts is not None:
        annotations[DEADLINE_ANNOTATION] = deadline_parts
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def rollout_policy_spec(policy: RolloutPolicy) -> dict[str, Any]:
    """What a rollout's Job spec says of its failures: retries per episode, how many failed
    episodes it tolerates, whose failure a pod's was, and (--need) when enough have succeeded."""
    spec: dict[str, Any] = {
        "backoffLimitPerIndex": policy.retries,
        "maxFailedIndexes": policy.allow_failures,
        "podFailurePolicy": pod_failure_policy(),
    }
    if policy.need is not None:
        spec["successPolicy"] = {"rules": [{"succeededCount": policy.need}]}
    return spec


def list_manifest(items: Sequence[dict]) -> dict:
    """A `v1 List`, the shape kubectl prints for several objects."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": list(items)}


def prepull_pod_manifest(
    namespace: str,
    name: str,
    node: str,
    image: str,
    runtime: str,
    harden: bool,
    deadline_seconds: int,
) -> dict:
    """A pod that makes `image` present on `node` (--prepull): bound to the node, in the episodes' runtime
    and security settings, running `python -c pass` (every episode image already needs Python), stopped by
    its kubelet after `deadline_seconds`."""
    container = dict(
        episode_container(image, harden, False, None),
        name="prepull",
        command=["python", "-c", "pass"],
        env=[],
        volumeMounts=[],
    )
    spec = episode_pod_spec(image, runtime, harden, False, None, deadline_seconds)
    spec.update(nodeName=node, containers=[container], volumes=[])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": APP_LABEL, PREPULL_LABEL: "true"},
        },
        "spec": spec,
    }


def usable_nodes(nodes: Sequence[dict], runtime_class: dict | None) -> list[str]:
    """The nodes an episode's pod can run on: schedulable, with the RuntimeClass's node labels."""
    wanted = ((runtime_class or {}).get("scheduling") or {}).get("nodeSelector") or {}
    usable = []
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if schedulable(node) and all(labels.get(key) == value for key, value in wanted.items()):
            usable.append(node["metadata"]["name"])
    return sorted(usable)


def run_images(plan_jobs: dict[str, list[dict]]) -> list[str]:
    """Every image the run's Jobs name, in order of first appearance."""
    images: list[str] = []
    for jobs in plan_jobs.values():
        for job in jobs:
            image = job["spec"]["template"]["spec"]["containers"][0]["image"]
            if image not in images:
                images.append(image)
    return images


def prepull_failures(pods: Sequence[dict], events: Sequence[EventRecord] = ()) -> list[dict]:
    """Each --prepull pod that did not succeed: its node, image and why (the kubelet's words)."""
    warnings = pod_warnings(events)
    failures = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            continue
        state = (((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state")) or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        why = (
            f"{waiting.get('reason')}: {waiting.get('message', '')}"
            if waiting
            else f"{terminated.get('reason', 'ended')} with exit code {terminated.get('exitCode')}"
            if terminated
            else (pod.get("status") or {}).get("reason")
            or (pod.get("status") or {}).get("phase")
            or "not started"
        )
        warned = warnings.get(pod_name(pod))
        failures.append(
            {
                "pod": pod_name(pod),
                "node": (pod.get("spec") or {}).get("nodeName"),
                "image": container_image(pod),
                "why": f"{why}" + (f"; pod warnings: {'; '.join(warned)}" if warned else ""),
            }
        )
    return failures


QUANTITY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}


def parse_quantity(text: Any) -> float | None:
    """A Kubernetes quantity ("250m", "768Mi", "1e3", 2) as a number, or None if it is not one."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    match = re.fullmatch(
        r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]{0,2})\s*", str(text or "")
    )
    if not match or match.group(2) not in QUANTITY_SUFFIXES:
        return None
    return float(match.group(1)) * QUANTITY_SUFFIXES[match.group(2)]


def schedulable(node: dict) -> bool:
    """A node that takes new pods: Ready, not cordoned, no NoSchedule/NoExecute taint."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    if any(
        taint.get("effect") in ("NoSchedule", "NoExecute") for taint in spec.get("taints") or []
    ):
        return False
    return condition_true(node, "Ready")


def capacity_plan(
    nodes: Sequence[dict], runtime_class: dict | None, requests: dict, count: int, parallelism: int
) -> dict:
    """How many episodes fit at once on the nodes' allocatable CPU, memory and pod slots; pure.

    Counts allocatable resources, not what other pods already use, so it is an upper bound.
    """
    overhead = ((runtime_class or {}).get("overhead") or {}).get("podFixed") or {}
    need = {
        resource: (parse_quantity(requests.get(resource)) or 0.0)
        + (parse_quantity(overhead.get(resource)) or 0.0)
        for resource in ("cpu", "memory")
    }
    fits: dict[str, int] = {}
    for node in nodes:
        if not schedulable(node):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        room = [
            math.floor((parse_quantity(allocatable.get(resource)) or 0.0) / need[resource] + 1e-9)
            for resource in ("cpu", "memory")
            if need[resource] > 0
        ]
        pods = parse_quantity(allocatable.get("pods"))
        if pods is not None:
            room.append(int(pods))
        fits[node["metadata"]["name"]] = max(0, min(room))
    at_once = sum(fits.values())
    wanted = min(count, parallelism)
    return {
        "checked": True,
        "schedulable_nodes": len(fits),
        "nodes_seen": len(nodes),
        "per_episode": {
            "cpu": f"{requests.get('cpu', '0')} + overhead {overhead.get('cpu', '0')}",
            "memory": f"{requests.get('memory', '0')} + overhead {overhead.get('memory', '0')}",
            "cpu_cores": rounded(need["cpu"], 4),
            "memory_bytes": int(need["memory"]),
        },
        "episodes_fit_at_once": at_once,
        "episodes_fit_per_node": fits,
        "fits_at_once": at_once >= wanted,
        "expected_waves": math.ceil(count / max(1, min(wanted, at_once))) if at_once else None,
        "waves_at_parallelism": math.ceil(count / max(1, parallelism)),
        "note": "from the nodes' allocatable CPU, memory and pod slots and the RuntimeClass's podFixed "
        "overhead; pods other workloads already run are not subtracted",
    }


def capacity_warning(plan: dict, parallelism: int) -> str | None:
    """One warning when the batch's pods cannot all run at once, else None."""
    if not plan.get("checked"):
        return f"Warning: capacity check skipped ({plan.get('reason')})"
    if plan["fits_at_once"]:
        return None
    if not plan["episodes_fit_at_once"]:
        return (
            f"Warning: capacity: no schedulable node has room for one episode "
            f"({plan['per_episode']['cpu']} CPU, {plan['per_episode']['memory']} memory); "
            f"its pods will stay Pending"
        )
    return (
        f"Warning: capacity: the {plan['schedulable_nodes']} schedulable node(s) fit about "
        f"{plan['episodes_fit_at_once']} episodes at once ({plan['per_episode']['cpu']} CPU, "
        f"{plan['per_episode']['memory']} memory each), fewer than parallelism {parallelism}: "
        f"expect about {plan['expected_waves']} waves instead of {plan['waves_at_parallelism']}, "
        f"and pods Pending meanwhile"
    )


def token_secret_manifest(namespace: str, token: str) -> dict:
    """The run's sandbox token, which only its pods and this tool hold."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def server_container(
    image: str, harden: bool, idle_timeout: int, pod: EpisodePod = GUIDE_POD
) -> dict:
    """The container that serves a trainer's commands: the episode container's security, the
    requests and limits of `pod` (--cpu, --memory), listening on its pod's IP, with the run's
    token; its --env after the tool's own, and its Secrets' keys (envFrom)."""
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if harden:
        security["readOnlyRootFilesystem"] = True
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "SANDBOX_PORT", "value": str(SANDBOX_PORT)},
        {"name": "SANDBOX_IDLE_SECONDS", "value": str(idle_timeout)},
        {"name": "SANDBOX_TOKEN_FILE", "value": f"{TOKEN_MOUNT}/{TOKEN_KEY}"},
        # Set here, though they are the server's defaults: `env` beats `envFrom`, so no Secret's
        # key can move the server's workspace or its output cap.
        {"name": "SANDBOX_WORKSPACE", "value": "/workspace"},
        {"name": "SANDBOX_PRISTINE", "value": "/sandbox-pristine/workspace"},
        {"name": "SANDBOX_OUTPUT_CAP_BYTES", "value": str(SANDBOX_OUTPUT_CAP_BYTES)},
    ] + [{"name": key, "value": value} for key, value in pod.env]
    container: dict[str, Any] = {
        "name": SANDBOX_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", f"/demo/{SERVER_KEY}"],
        "env": env,
        "ports": [{"name": "sandbox", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        "securityContext": security,
        "resources": pod_resources(pod),
        "volumeMounts": [
            {"name": "demo", "mountPath": "/demo", "readOnly": True},
            {"name": "workspace", "mountPath": "/workspace"},
            {"name": "pristine", "mountPath": "/sandbox-pristine"},
            {"name": "token", "mountPath": TOKEN_MOUNT, "readOnly": True},
        ],
    }
    if pod.secrets:
        container["envFrom"] = [{"secretRef": {"name": secret.name}} for secret in pod.secrets]
    return container


def pool_job_manifest(
    namespace: str,
    name: str,
    size: int,
    episodes: int,
    image: str,
    settings: PoolShape,
    pod: EpisodePod = GUIDE_POD,
) -> dict:
    """One image's pool: `size` warm sandboxes at a time, `episodes` served in all (with reuse,
    each pod serves many and completes once). A sandbox left idle fails the Job, so a pool whose
    trainer went away makes no more pods; a pod lost to the cluster is replaced."""
    completions = size if settings.reuse else episodes
    spec = {
        "runtimeClassName": settings.runtime,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "runAsNonRoot": True,
        },
        "containers": [server_container(image, settings.harden, settings.idle_timeout, pod)],
        "volumes": [
            {"name": "demo", "configMap": {"name": CONFIGMAP_NAME}},
            {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"} if settings.harden else {}},
            {"name": "pristine", "emptyDir": {"sizeLimit": "64Mi"} if settings.harden else {}},
            {"name": "token", "secret": {"secretName": TOKEN_SECRET, "defaultMode": 0o440}},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": APP_LABEL}},
        "spec": {
            "completions": completions,
            "parallelism": min(size, completions),
            "backoffLimit": completions + size,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": SANDBOX_CONTAINER,
                            "operator": "In",
                            "values": [IDLE_EXIT_CODE],
                        },
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {"metadata": {"labels": {"app": APP_LABEL}}, "spec": spec},
        },
    }


# --------------------------------------------------------------------------
# src/rl_batch_demo/tenancy.py: A run inside a namespace it did not create (`--namespace`), and its Jobs handed to a Kueue queue

# The label Kueue's Job integration reads: the LocalQueue, in the Job's namespace, it queues in.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The label Kueue puts on a Job's Workload: the Job's UID.
WORKLOAD_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"

# The objects a run makes in a namespace it shares, and where the API serves each: deleting one
# by UID precondition is a DELETE on that path with a body.
OBJECT_PATHS = {
    "configmap": "/api/v1/namespaces/{namespace}/configmaps/{name}",
    "secret": "/api/v1/namespaces/{namespace}/secrets/{name}",
    "networkpolicy": "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}",
    "job": "/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
}


def object_path(kind: str, namespace: str, name: str) -> str:
    """The API path of one object a run makes in a shared namespace."""
    return OBJECT_PATHS[kind.lower()].format(namespace=namespace, name=name)


def run_suffix(run_id: str) -> str:
    """What every name a run gives in a shared namespace ends with, so two runs never collide."""
    return f"-{run_id}"


def owned_metadata(manifest: dict, run_id: str, extra: Mapping[str, str] | None = None) -> None:
    """Label and annotate one object with the run id (and `extra` annotations), in place."""
    metadata = manifest.setdefault("metadata", {})
    metadata.setdefault("labels", {})[RUN_LABEL] = run_id
    metadata.setdefault("annotations", {}).update({RUN_ID_ANNOTATION: run_id, **(extra or {})})


def renamed_config_maps(setup: Sequence[dict], suffix: str) -> dict[str, str]:
    """Each ConfigMap's (and NetworkPolicy's) name -> its name in a shared namespace."""
    return {
        manifest["metadata"]["name"]: manifest["metadata"]["name"] + suffix
        for manifest in setup
        if not manifest["metadata"]["name"].endswith(suffix)
    }


def rename_volumes(pod_spec: dict, renamed: Mapping[str, str]) -> None:
    """A pod spec's ConfigMap references (and its containers' Secrets, the copies the run makes),
    renamed in place."""
    for container in pod_spec.get("containers") or []:
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                name = source["secretRef"]["name"]
                source["secretRef"]["name"] = renamed.get(name, name)
    for volume in pod_spec.get("volumes") or []:
        if "configMap" in volume:
            volume["configMap"]["name"] = renamed.get(
                volume["configMap"]["name"], volume["configMap"]["name"]
            )
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "configMap" in source:
                source["configMap"]["name"] = renamed.get(
                    source["configMap"]["name"], source["configMap"]["name"]
                )


def shared_setup(setup: Sequence[dict], run_id: str) -> list[dict]:
    """The run's ConfigMaps (and --harden's NetworkPolicy) for a shared namespace: renamed after
    the run, labelled with it; the NetworkPolicy denies only the run's own pods."""
    suffix, owned = run_suffix(run_id), []
    for manifest in setup:
        manifest = copy.deepcopy(manifest)
        if not manifest["metadata"]["name"].endswith(suffix):
            manifest["metadata"]["name"] += suffix
        owned_metadata(manifest, run_id)
        if manifest["kind"] == "NetworkPolicy":
            manifest["spec"]["podSelector"] = {"matchLabels": {RUN_LABEL: run_id}}
        owned.append(manifest)
    return owned


def shared_job(
    job: dict,
    run_id: str,
    renamed: Mapping[str, str],
    annotations: Mapping[str, str],
    queue: str | None = None,
) -> dict:
    """One Job for a shared namespace: the run's label and annotations on it and on its pods
    (its template's labels copied onto it, as the API server does only for a Job without labels),
    its ConfigMaps renamed; with a queue, Kueue's queue label."""
    job = copy.deepcopy(job)
    template = job["spec"]["template"]
    template.setdefault("metadata", {}).setdefault("labels", {})[RUN_LABEL] = run_id
    labels = {**template["metadata"]["labels"], **(job["metadata"].get("labels") or {})}
    job["metadata"]["labels"] = labels
    owned_metadata(job, run_id, annotations)
    if queue:
        labels[QUEUE_LABEL] = queue
    rename_volumes(template["spec"], renamed)
    return job


def queued_job(job: dict, queue: str) -> dict:
    """One Job of a run in its own namespace handed to a queue: Kueue's label beside the template's."""
    job = copy.deepcopy(job)
    template_labels = (job["spec"]["template"].get("metadata") or {}).get("labels") or {}
    job["metadata"]["labels"] = {
        **template_labels,
        **(job["metadata"].get("labels") or {}),
        QUEUE_LABEL: queue,
    }
    return job


def shared_jobs(
    jobs: Mapping[str, Sequence[dict]],
    setup: Sequence[dict],
    run_id: str,
    origin: RunOrigin | None,
    planned: PlannedWork | None,
    queue: str | None = None,
) -> dict[str, list[dict]]:
    """Every batch's Jobs for a shared namespace: what the namespace's annotations say of a run in
    its own namespace (origin, planned work) is on each Job, where `list` reads it."""
    annotations = {
        **(origin_annotations(origin) if origin is not None else {}),
        **(planned_annotations(planned) if planned is not None else {}),
    }
    renamed = renamed_config_maps(setup, run_suffix(run_id))
    return {
        batch: [shared_job(job, run_id, renamed, annotations, queue) for job in batch_jobs]
        for batch, batch_jobs in jobs.items()
    }


def stamped_jobs(jobs: Mapping[str, Sequence[dict]], origin: RunOrigin) -> dict[str, list[dict]]:
    """A shared namespace's Jobs with the run's origin (who, where, until when) and planned work
    annotated on each, as a run's own namespace carries them."""
    annotations = {**origin_annotations(origin), **planned_annotations(planned_work(jobs))}
    stamped = {}
    for batch, batch_jobs in jobs.items():
        stamped[batch] = [copy.deepcopy(job) for job in batch_jobs]
        for job in stamped[batch]:
            job["metadata"].setdefault("annotations", {}).update(annotations)
    return stamped


# A ClusterQueue's quota, and a batch held against it.


class QuotaFit(NamedTuple):
    """How a batch's requests meet its queue's quota: the pods of its widest Job the quota admits
    at once (None: no quota limits them), and why a Job never fits, if one never does."""

    fits_at_once: int | None
    never: str | None  # a Job whose pods at once are beyond the quota, with figures
    quota: dict[str, float]  # resource -> the most one flavor offers (nominal + borrowing limit)


def cluster_queue_quota(cluster_queue: dict) -> dict[str, float]:
    """Each resource's quota in a ClusterQueue as one Job can have it: Kueue gives a Job's pods
    (its PodSet) one flavor per resource, so the most any one flavor offers; in a cohort, its
    nominal quota plus its borrowing limit (none: unbounded, as much as the cohort lends)."""
    spec = cluster_queue.get("spec") or {}
    in_cohort = bool(spec.get("cohortName") or spec.get("cohort"))
    quota: dict[str, float] = {}
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                nominal = parse_quantity(resource.get("nominalQuota"))
                if nominal is None:
                    continue
                borrowing = parse_quantity(resource.get("borrowingLimit"))
                if in_cohort:
                    nominal = float("inf") if borrowing is None else nominal + borrowing
                quota[resource["name"]] = max(quota.get(resource["name"], 0.0), nominal)
    return quota


def pod_requests(job: dict, overhead: Mapping[str, float] | None = None) -> dict[str, float]:
    """One pod's requests as Kueue counts them: every container summed, plus its RuntimeClass's
    overhead (podFixed), which Kueue adds to each pod of the Workload."""
    requests: dict[str, float] = dict(overhead or {})
    for container in job["spec"]["template"]["spec"].get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            amount = parse_quantity(value)
            if amount is not None:
                requests[name] = requests.get(name, 0.0) + amount
    return requests


def runtime_overhead(runtime_class: dict | None) -> dict[str, float]:
    """A RuntimeClass's overhead per pod (overhead.podFixed), as numbers."""
    fixed = ((runtime_class or {}).get("overhead") or {}).get("podFixed") or {}
    amounts = {name: parse_quantity(value) for name, value in fixed.items()}
    return {name: amount for name, amount in amounts.items() if amount is not None}


def quota_fit(
    quota: Mapping[str, float], jobs: Iterable[dict], overhead: Mapping[str, float] | None = None
) -> QuotaFit:
    """The pods of the widest Job that fit at once, and whether a Job never can be admitted. Kueue
    admits a Job whole, its parallelism's pods at once, and never one that asks for a resource
    its ClusterQueue does not cover ("resource X unavailable in ClusterQueue")."""
    fits: int | None = None
    never = None
    for job in jobs:
        name, parallelism = job["metadata"]["name"], int(job["spec"].get("parallelism") or 1)
        for resource, amount in pod_requests(job, overhead).items():
            if amount <= 0:
                continue
            if resource not in quota:
                never = never or (
                    f"Job {name} asks for {resource}, which the ClusterQueue has no quota of"
                )
                continue
            if quota[resource] == float("inf"):
                continue
            at_once = int(quota[resource] / amount + 1e-9)  # 1 / 0.1 is 9.999...
            fits = at_once if fits is None else min(fits, at_once)
            if at_once < parallelism and never is None:
                never = (
                    f"Job {name} runs {parallelism} pods at once, "
                    f"{format_amount(resource, amount * parallelism)} of {resource} "
                    f"({format_amount(resource, amount)} each), and the "
                    f"quota is {format_amount(resource, quota[resource])} "
                    f"({at_once} pods' worth)"
                )
    return QuotaFit(fits, never, dict(quota))


def format_amount(resource: str, amount: float) -> str:
    """A resource amount as people write it: CPU in millicores, memory in Mi, counts bare."""
    if resource == "cpu":
        return f"{amount * 1000:.0f}m"
    if resource == "memory" or resource.endswith("storage"):
        return f"{amount / 2**20:.0f}Mi"
    return f"{amount:g}"


def uids_of(objects: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """name -> UID of listed objects."""
    return {
        (item.get("metadata") or {}).get("name", ""): (item.get("metadata") or {}).get("uid", "")
        for item in objects
    }


def workload_condition(workload: dict | None, kind: str) -> dict | None:
    for found in ((workload or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return found
    return None


def wait_line(workload: dict | None) -> str:
    """What Kueue says of a Job it holds, in one line, from its Workload's conditions: the Pending
    message, Inadmissible, an eviction and its requeue, or quota reserved awaiting admission checks."""
    if workload is None:
        return "suspended, no Workload yet (Kueue has not taken the Job in)"
    evicted = workload_condition(workload, "Evicted")
    requeued = workload_condition(workload, "Requeued")
    reserved = workload_condition(workload, "QuotaReserved")
    admitted = workload_condition(workload, "Admitted")
    if admitted and admitted.get("status") == "True":
        return "admitted by Kueue, resuming"
    if evicted and evicted.get("status") == "True":
        again = (
            f"; requeued: {requeued.get('message')}"
            if requeued and requeued.get("status") == "True"
            else "; waiting to be requeued"
        )
        return f"evicted by Kueue ({evicted.get('reason')}: {evicted.get('message')}){again}"
    if reserved and reserved.get("status") == "True":
        checks = [
            f"{check.get('name')} {check.get('state')}"
            for check in (workload.get("status") or {}).get("admissionChecks") or []
        ]
        return "quota reserved, awaiting admission checks" + (
            f" ({', '.join(checks)})" if checks else ""
        )
    if reserved and reserved.get("reason") == "Inadmissible":
        return f"Inadmissible, Kueue will not admit it as things are: {reserved.get('message')}"
    if reserved:
        return f"queued: {reserved.get('message') or reserved.get('reason')}"
    return "queued, not yet considered by Kueue"


# Admission as a phase: when a queued Job was created, had its quota reserved, was admitted and
# resumed. The API server writes each condition's lastTransitionTime (and a creationTimestamp) in
# whole seconds, so each point is known to 1 s, and a phase between two of them to 1 s too.
ADMISSION_PRECISION_SECONDS = 1.0
ADMISSION_SOURCES = {
    "queued": "Job metadata.creationTimestamp",
    "quota_reserved": "Workload condition QuotaReserved lastTransitionTime",
    "admitted": "Workload condition Admitted lastTransitionTime",
    "resumed": "Job condition Suspended=False (JobResumed) lastTransitionTime",
}


def true_since(obj: dict | None, kind: str, status: str = "True") -> float | None:
    """When a condition of `kind` turned `status`, if it has that status now."""
    found = workload_condition(obj, kind)
    if not found or found.get("status") != status:
        return None
    return parse_time(found.get("lastTransitionTime"))


def job_admission(job: dict, workload: dict | None) -> dict[str, Any]:
    """One queued Job's points (epoch seconds, None where unknown) and its Workload's name."""
    metadata = job.get("metadata") or {}
    evicted = workload_condition(workload, "Evicted")
    return {
        "job": metadata.get("name"),
        "workload": ((workload or {}).get("metadata") or {}).get("name"),
        "queued_at": parse_time(metadata.get("creationTimestamp")),
        "quota_reserved_at": true_since(workload, "QuotaReserved"),
        "admitted_at": true_since(workload, "Admitted"),
        "resumed_at": true_since(job, "Suspended", "False"),
        "evicted": None
        if evicted is None
        else f"{evicted.get('reason')}: {evicted.get('message')}",
    }


def admission_figures(jobs: Sequence[dict], workloads: Sequence[dict]) -> dict[str, Any]:
    """A batch's admission (results.json `admission`): its first Job's creation (queued), and the
    last of its Jobs' quota reservations, admissions and resumes, since the batch runs whole only
    then; the phases queue_wait (queued to quota reserved) and admission_checks (reserved to
    admitted), each with its precision and the sources of its points."""
    by_uid = {
        ((w.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_JOB_UID_LABEL): w
        for w in workloads
    }
    per_job = [job_admission(job, by_uid.get(job["metadata"].get("uid"))) for job in jobs]

    def point(key: str, pick: Any) -> float | None:
        known = [row[key] for row in per_job]
        return None if not known or None in known else pick(known)

    points = {
        "queued_at": point("queued_at", min),
        "quota_reserved_at": point("quota_reserved_at", max),
        "admitted_at": point("admitted_at", max),
        "resumed_at": point("resumed_at", max),
    }

    def between(start: str, end: str) -> float | None:
        if points[start] is None or points[end] is None:
            return None
        return round(max(0.0, points[end] - points[start]), 3)  # type: ignore[operator]

    return {
        **points,
        "queue_wait_seconds": between("queued_at", "quota_reserved_at"),
        "admission_checks_seconds": between("quota_reserved_at", "admitted_at"),
        "resume_seconds": between("admitted_at", "resumed_at"),
        "precision_seconds": ADMISSION_PRECISION_SECONDS,
        "sources": dict(ADMISSION_SOURCES),
        "jobs": per_job,
    }


# --------------------------------------------------------------------------
# src/rl_batch_demo/podspec.py: What every episode's pod is given beside its program (--cpu, --memory, --env, --env-from-secret,

# The environment the tool sets itself: --env may not replace it (nor may a Secret's keys: the
# kubelet lets `env` win over `envFrom`).
RESERVED_ENV = (
    "EPISODE_ID",
    "EPISODE_INDEX",
    "EPISODE_INDEXES",
    TASK_FILE_ENV,
    EPISODE_TIMEOUT_ENV,
)

# An environment variable's name as every supported API server takes it (1.34 relaxed the rule).
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")

# A Secret's name (a DNS subdomain) and a namespace's (a DNS label).
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

HOST_NAME = re.compile(
    r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*\.?"
)

# A quantity as the API server writes one: a number and a suffix (decimal SI, binary, or exponent).
QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)([kMGTPE]|[KMGTPE]i|m|[eE][+-]?\d+)?")

# A Secret copied into the run's namespace names its source here ("NAMESPACE/NAME").
COPIED_FROM_ANNOTATION = ANNOTATION_PREFIX + "copied-from"

EGRESS_POLICY = "allow-egress"


def quantity(text: str, resource: str) -> str:
    """One CPU or memory quantity, positive and as the API server takes it; ValueError says why."""
    if not QUANTITY.fullmatch(text):
        example = "500m or 2" if resource == "cpu" else "256Mi or 1Gi"
        raise ValueError(f"{text!r} is not a quantity (e.g. {example})")
    if resource == "memory" and text.endswith("m"):
        # 128m is 0.128 bytes to Kubernetes: no container starts with it.
        raise ValueError(
            f"{text!r} is {text[:-1]} thousandths of a byte; did you mean {text[:-1]}Mi?"
        )
    if resource == "cpu" and text.endswith("i"):
        raise ValueError(f"{text!r}: CPU is counted in cores (e.g. 2) or millicores (500m)")
    if not parse_quantity(text):
        raise ValueError(f"{text!r} must be more than 0")
    return text


def resource_pair(text: str, resource: str) -> tuple[str, str]:
    """--cpu/--memory: Q (request and limit both Q), or REQUEST:LIMIT; ValueError says why."""
    request, split, limit = text.partition(":")
    request, limit = quantity(request, resource), quantity(limit if split else request, resource)
    if (parse_quantity(request) or 0) > (parse_quantity(limit) or 0):
        raise ValueError(f"the request {request} is over the limit {limit}")
    return request, limit


def env_pairs(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """--env KEY=VALUE, each KEY once and none the tool sets itself; ValueError says why."""
    pairs: dict[str, str] = {}
    for text in texts:
        key, split, value = text.partition("=")
        if not split:
            raise ValueError(f"{text!r} is not KEY=VALUE")
        if not ENV_NAME.fullmatch(key):
            raise ValueError(
                f"{key!r} is not an environment variable's name ([-._a-zA-Z][-._a-zA-Z0-9]*)"
            )
        if key in RESERVED_ENV:
            raise ValueError(f"{key} is set by the tool for every episode")
        if key in pairs:
            raise ValueError(f"{key} is given twice")
        pairs[key] = value
    return tuple(pairs.items())


def secret_sources(texts: Iterable[str]) -> tuple[SecretSource, ...]:
    """--env-from-secret [NAMESPACE/]NAME, each name once (its copy in the run's namespace keeps it)."""
    sources: dict[str, SecretSource] = {}
    for text in texts:
        namespace, split, name = text.rpartition("/")
        if not SECRET_NAME.fullmatch(name) or len(name) > 253:
            raise ValueError(f"{name!r} is not a Secret's name")
        if split and (not NAMESPACE_NAME.fullmatch(namespace) or len(namespace) > 63):
            raise ValueError(f"{namespace!r} is not a namespace's name")
        if name in sources:
            raise ValueError(
                f"two Secrets named {name}: their copies would share the run's namespace"
            )
        sources[name] = SecretSource(name, namespace or None)
    return tuple(sources.values())


def egress_target(text: str) -> EgressTarget:
    """--allow-egress CIDR (every port), IP:PORT or HOST:PORT (TCP; a HOST resolved later, by
    resolve_egress); ValueError says why."""
    if "/" in text:
        try:
            return EgressTarget(text, (str(ipaddress.ip_network(text, strict=False)),))
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR (e.g. 10.0.0.0/8)") from None
    host, split, port = text.rpartition(":")
    if not split or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is neither HOST:PORT (e.g. api.example.com:443) nor a CIDR")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not HOST_NAME.fullmatch(host):
            raise ValueError(f"{host!r} is not a host name or an IP address") from None
        return EgressTarget(text, (), int(port), host.rstrip("."))
    return EgressTarget(text, (str(ipaddress.ip_network(address)),), int(port))


def episode_pod(request: RunRequest) -> EpisodePod:
    """The request's pod settings, checked (a HOST of --allow-egress not yet resolved); UsageError
    names the setting as the caller wrote it."""
    parts: dict[str, Any] = {}
    for name in ("cpu", "memory"):
        given = getattr(request, name)
        try:
            if given is not None:
                parts[name] = resource_pair(given, name)
        except ValueError as error:
            raise UsageError(f"{request.spelling.setting(name, given)}: {error}") from None
    for name, dest, read in (
        ("env", "env", env_pairs),
        ("secrets", "env_from_secret", secret_sources),
        ("egress", "allow_egress", lambda texts: tuple(map(egress_target, texts))),
    ):
        try:
            parts[name] = read(getattr(request, dest))
        except ValueError as error:
            raise UsageError(f"{request.spelling.name(dest)}: {error}") from None
    if parts["egress"] and not request.harden:
        raise UsageError(
            f"{request.spelling.name('allow_egress')} needs {request.spelling.switch('harden')}: "
            f"without it nothing is denied, so there is nothing to allow"
        )
    return EpisodePod(**parts)


Resolver = Callable[..., Sequence[Any]]


def resolve_egress(
    pod: EpisodePod, spelling: Spelling = COMMAND_LINE, resolver: Resolver = socket.getaddrinfo
) -> EpisodePod:
    """Each HOST of --allow-egress as its addresses now, from this machine (a NetworkPolicy holds
    addresses, never names); DemoError names a host that does not resolve."""
    targets = []
    for target in pod.egress:
        if target.host is None or target.cidrs:
            targets.append(target)
            continue
        try:
            found = resolver(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise DemoError(
                f"{spelling.setting('allow_egress', target.given)}: cannot resolve {target.host} from this machine "
                f"({error}); give its addresses as a CIDR instead"
            ) from None
        addresses = sorted({str(ipaddress.ip_network(entry[4][0])) for entry in found})
        targets.append(target._replace(cidrs=tuple(addresses)))
    return pod._replace(egress=tuple(targets))


def egress_policy_manifest(namespace: str, targets: Sequence[EgressTarget]) -> dict:
    """Besides --harden's deny-all, the only egress the episodes' pods have: each target's
    addresses, on its TCP port (a CIDR's: every port). NetworkPolicies add up: what one allows, the
    deny-all does not take back."""
    rules = []
    for target in targets:
        rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": cidr}} for cidr in target.cidrs]}
        if target.port is not None:
            rule["ports"] = [{"protocol": "TCP", "port": target.port}]
        rules.append(rule)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": EGRESS_POLICY, "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": rules},
    }


def secret_copy_manifest(namespace: str, source: SecretSource, found: dict | None = None) -> dict:
    """The copy of a --env-from-secret Secret in the run's namespace: its data only once read
    (`found`, the Secret as the API server holds it), so a plan printed or saved never holds it."""
    where = f"{source.namespace}/{source.name}" if source.namespace else source.name
    if found is not None:
        where = f"{found['metadata'].get('namespace')}/{source.name}"
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": source.name,
            "namespace": namespace,
            "annotations": {COPIED_FROM_ANNOTATION: where},
        },
        "type": "Opaque",
    }
    if found is not None:
        manifest["data"] = dict(found.get("data") or {})
    return manifest


# --------------------------------------------------------------------------
# src/rl_batch_demo/timing.py: Measurement: what each episode went through, from the API and the worker: points, bounds,

# Resolution of each kind of source, in seconds.
WHOLE_SECOND = 1.0

EVENT_TIME = 1e-6

PROC_TICK = 0.01

# How long after the step it reports an event is named at most. The recorder stamps the name
# (`<object>.<hex UnixNano>`) when it is called, but that is after the step's own call has
# returned: the Job controller's pod create (the API server stamps the pod, writes it to etcd,
# answers), the kubelet's RunPodSandbox (then its sandbox status and image checks over the
# CRI), and then the goroutine's turn, which a loaded machine stretches (0.22 s for a Job
# controller's SuccessfulCreate at load 40 on two cores). The same allowance as the
# scheduler's eventTime after its binding, for the same reason.
EVENT_FOLLOWS_SECONDS = 0.5

# How long after the binding the scheduler takes its Scheduled eventTime at most. Not at once:
# it takes it once its bind request has returned (a round trip through the API server and
# etcd, then its goroutine's turn), which a loaded machine stretches (0.16 s after the node
# agent saw the binding, at load ~30 on two cores). Where this is looser, the PodScheduled
# condition's second bounds the binding instead: the API server stamps it in the binding.
SCHEDULED_FOLLOWS_BINDING_SECONDS = 0.5

# Clocks that disagree by more than this are reported loudly: it is the precision the
# sharpest cluster-side points claim.
CLOCK_TOLERANCE_SECONDS = 0.05

REFERENCE_CLOCK = "control plane"

POINTS = (
    "pod_created",
    "scheduled",
    "sandbox_ready",
    "container_started",
    "process_started",
    "imports_done",
    "ready",
    "reward",
    "container_finished",
)

POINT_SOURCES = {
    "pod_created": "the Job controller's SuccessfulCreate event name (ns), within Pod creationTimestamp's "
    "second, else the client's watch seeing the pod (upper bound) within that second and "
    "after the Job's creation",
    "scheduled": "scheduler's Scheduled event eventTime (microseconds); "
    "PodScheduled condition (whole seconds) if the event is gone",
    "sandbox_ready": "the kubelet's first container event (Pulling/Pulled) name (ns), which follows the "
    "sandbox at once; else PodReadyToStartContainers (whole seconds; Kubernetes >= 1.29) "
    "bounded by the client's watch",
    "container_started": "between the kubelet's Created and Started event names (ns), within startedAt's second",
    "process_started": "worker's /proc start time (10 ms ticks)",
    "imports_done": "worker clock after its imports (microseconds)",
    "ready": "worker's ready event (microseconds)",
    "reward": "worker's reward event (microseconds)",
    "container_finished": "after the reward and within finishedAt's second, up to the client's watch "
    "seeing the container terminated",
}

# Phase name -> (from point, to point). The chain covers an episode end to end;
# pod_to_ready is the guide's own figure (pod created -> episode ready), here from the sharpest points.
PHASES = {
    "scheduling": ("pod_created", "scheduled"),
    "sandbox_creation": ("scheduled", "sandbox_ready"),
    "container_start": ("sandbox_ready", "process_started"),
    "python_imports": ("process_started", "imports_done"),
    "imports_done_to_ready": ("imports_done", "ready"),
    "episode_work": ("ready", "reward"),
    "container_exit": ("reward", "container_finished"),
    "pod_to_ready": ("pod_created", "ready"),
    "pod_to_reward": ("pod_created", "reward"),
    # Part of container_start: the kubelet's Pulling to its Pulled event (the wait behind the node's
    # other pulls included); 0 for an image already present (a Pulled event alone).
    "image_pull": ("image_pull_started", "image_pulled"),
}

# The kubelet's events about a container, in the order it records them when it starts one:
# image pulled or found, container created, container started.
KUBELET_CONTAINER_REASONS = ("Pulling", "Pulled", "Created", "Started")


class Point(NamedTuple):
    """When one point of an episode happened, on the reference clock.

    `precision` is the width of the interval that holds the true moment given every
    source at hand; `at` lies inside it.
    """

    at: float
    precision: float
    source: str
    clock: str
    earliest: float | None = None  # the interval's start, when known


class Bound(NamedTuple):
    """What one source says about a moment, already on the reference clock: it happened
    at or after `lower` and at or before `upper` (None: no limit that side)."""

    lower: float | None
    upper: float | None
    source: str
    clock: str


# Nanoseconds since 1970 take 15 or 16 hex digits from 1972 to 2554: anything else is another name.
EVENT_NAME_TIME = re.compile(r"\.([0-9a-f]{15,16})$")


def event_name_time(event: EventRecord) -> float | None:
    """The moment an event's recorder named it, from `<object>.<hex UnixNano>` (on the recorder's clock)."""
    found = EVENT_NAME_TIME.search(event.name or "")
    return int(found.group(1), 16) / 1e9 if found else None


def kubelet_container_events(
    events: Iterable[EventRecord],
) -> dict[str, dict[str, tuple[float, str]]]:
    """Pod name -> reason -> (earliest name time, node) of the kubelet's container events."""
    found: dict[str, dict[str, tuple[float, str]]] = {}
    for event in events:
        reason = event.reason
        if reason not in KUBELET_CONTAINER_REASONS or event.kind != "Pod":
            continue
        if event.field_path not in (None, EPISODE_FIELD_PATH):
            continue
        moment = event_name_time(event)
        if moment is None:
            continue
        node = event.host or event.reporting_instance or ""
        reasons = found.setdefault(event.object_name or "", {})
        if reason not in reasons or moment < reasons[reason][0]:
            reasons[reason] = (moment, node)
    return found


def pod_creation_events(events: Iterable[EventRecord]) -> dict[str, float]:
    """Pod name -> name time of the Job controller's SuccessfulCreate event for it. An event the
    recorder combined with similar ones names no pod of its own and is skipped."""
    created: dict[str, float] = {}
    for event in events:
        if event.reason != "SuccessfulCreate":
            continue
        message = event.message or ""
        if (
            event.kind != "Job"
            or not message.startswith("Created pod: ")
            or int(event.count or 1) != 1
        ):
            continue
        moment = event_name_time(event)
        if moment is not None:
            created.setdefault(message[len("Created pod: ") :].strip(), moment)
    return created


def pod_observation(observed: dict[str, Any] | None, pod: dict, arrived: float) -> dict[str, Any]:
    """What this client saw of a pod so far (None: nothing), with this version of it, which reached
    it at `arrived` (its wall clock): when each transition first arrived, and the
    PodReadyToStartContainers stamp, kept since the kubelet turns the condition False again once
    the pod ends, so its True transition is only visible while the pod runs.

    A record is never changed once made: a version that adds to it gives a new one (the same one
    when it adds nothing), so whoever holds an earlier record (an episode's draft) holds what was
    seen by then, without a copy of its own.
    """
    observed = observed or {}
    times = observed.get("seen") or {}
    state = container_status(pod).get("state") or {}
    sandbox = condition(pod, "PodReadyToStartContainers")
    reached = {
        "added": True,
        "bound": bool((pod.get("spec") or {}).get("nodeName")),
        "sandbox_ready": sandbox is not None and sandbox.get("status") == "True",
        "running": bool(state.get("running") or state.get("terminated")),
        "terminated": bool(state.get("terminated")),
    }
    new_times = {
        transition: arrived
        for transition, happened in reached.items()
        if happened and transition not in times
    }
    stamp = (
        sandbox["lastTransitionTime"]
        if sandbox and sandbox.get("status") == "True" and sandbox.get("lastTransitionTime")
        else None
    )
    if not new_times and (stamp is None or observed.get("sandbox_ready") == stamp):
        return observed
    updated = dict(observed, seen={**times, **new_times})
    if stamp is not None:
        updated["sandbox_ready"] = stamp
    return updated


def record_job_observation(seen: dict[str, float], job: dict, arrived: float) -> None:
    """Note when this client first saw the Job and each of its conditions turn True."""
    seen.setdefault("added", arrived)
    for entry in (job.get("status") or {}).get("conditions") or []:
        if entry.get("status") == "True" and entry.get("type"):
            seen.setdefault(entry["type"], arrived)


def split_observed(observed: dict | None) -> tuple[dict[str, dict], dict[str, float]]:
    """observed.json -> (per pod, the Job's). Runs before watch times were kept saved the pods alone."""
    observed = observed or {}
    if isinstance(observed.get("pods"), dict):
        return observed["pods"], observed.get("job") or {}
    return observed, {}


# Each reading on another clock is moved onto the reference clock by `offset`, and widened
# each side by `slack`, how far that correction may be off.
def earlier_side(moment: float, offset: float, slack: float) -> float:
    """moment - offset - slack, and the very float when both are 0 (a moment of 0 aside, whose
    sign the sum may change): as every episode drafted with agreeing clocks has them, so that
    its points hold their sources' floats, not copies."""
    return moment if not offset and not slack and moment else moment - offset - slack


def later_side(moment: float, offset: float, slack: float) -> float:
    """moment - offset + slack, the very float when both are 0 (see earlier_side)."""
    return moment if not offset and not slack and moment else moment - offset + slack


def whole_second(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    """A Kubernetes stamp: truncated to the second, so the moment lies in [T, T+1)."""
    return (
        None
        if moment is None
        else Bound(
            earlier_side(moment, offset, slack),
            moment + WHOLE_SECOND - offset + slack,
            source,
            clock,
        )
    )


def upper(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    return None if moment is None else Bound(None, later_side(moment, offset, slack), source, clock)


def lower(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    return (
        None if moment is None else Bound(earlier_side(moment, offset, slack), None, source, clock)
    )


def followed_by_event(
    moment: float | None, source: str, clock: str, offset: float = 0.0, slack: float = 0.0
) -> Bound | None:
    """A step that an event reports as soon as it returns: at most EVENT_FOLLOWS_SECONDS before its name."""
    if moment is None:
        return None
    return Bound(
        moment - offset - EVENT_FOLLOWS_SECONDS - slack,
        later_side(moment, offset, slack),
        source,
        clock,
    )


@functools.lru_cache(maxsize=1 << 12, typed=True)
def precision_held(seconds: float) -> float:
    """A precision as one float for every point or phase that states it: thousands of episodes
    state the same few (a microsecond, a tick, a second and their sums)."""
    return seconds


def sharpest(bounds: Iterable[Bound | None], stamp: Bound | None = None) -> Point | None:
    """The narrowest interval all the sources allow, as a point.

    The point is the earliest moment known to follow it (an event named after it, a watch
    that saw it), or the start of the server's second when a stamp is all there is. Sources
    that contradict each other (clocks apart) leave the stamp alone to speak.
    """
    low = high = (
        None  # the first bound with the latest lower end, the first with the earliest upper end
    )
    for bound in itertools.chain(bounds, (stamp,)):
        if bound is None:
            continue
        if bound.lower is not None and (low is None or bound.lower > low.lower):  # type: ignore[operator]
            low = bound
        if bound.upper is not None and (high is None or bound.upper < high.upper):  # type: ignore[operator]
            high = bound
    if high is None:
        return None  # nothing shows it happened at all
    if low is not None and low.lower > high.upper:  # type: ignore[operator]
        if stamp is not None:
            return sharpest([], stamp)
        return Point(high.upper, math.inf, f"{high.source} (other sources disagree)", high.clock)  # type: ignore[arg-type]
    assert high is not None and high.upper is not None
    if low is None:
        return Point(high.upper, math.inf, high.source, high.clock)
    if high is stamp:  # nothing but the server's second above it: its start, the guide's reading
        at, named = low.lower, low
    else:
        at, named = high.upper, high
    source = named.source if low is high or named is low else f"{high.source}, after {low.source}"
    width = precision_held(round(high.upper - low.lower, 6))  # type: ignore[operator]
    return Point(at, width, source, named.clock, low.lower)  # type: ignore[arg-type]


def worker_time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class EpisodeClocks(NamedTuple):
    """The client's and the episode's node's clocks minus the control plane's, and how far each may be off."""

    client: float = 0.0
    client_slack: float = 0.0
    node: float = 0.0
    node_slack: float = 0.0


# What an episode is drafted with, as it ends: every clock read as the control plane's.
CLOCKS_AGREE = EpisodeClocks()


def kubelet_named(kubelet: dict[str, tuple[float, str]], reason: str) -> float | None:
    """When the kubelet named its event of that reason (on the node's clock), if it did."""
    return kubelet[reason][0] if reason in kubelet else None


def pod_created_point(
    created: Bound | None,
    seen: dict,
    created_event_at: float | None,
    created_after: Bound | None,
    clocks: EpisodeClocks,
) -> Point | None:
    """The pod's creation: its stamp's second, sharpened by the Job controller's event and this client's watch."""
    return sharpest(
        [
            followed_by_event(created_event_at, "SuccessfulCreate event name", REFERENCE_CLOCK),
            upper(
                seen.get("added"), "watch saw the pod", "client", clocks.client, clocks.client_slack
            ),
            created_after,
        ],
        created,
    )


def scheduled_point(pod: dict, scheduled_at: float | None) -> Point | None:
    """The pod's binding to a node: the scheduler's Scheduled eventTime, else its condition's second."""
    if scheduled_at is not None:
        return Point(scheduled_at, EVENT_TIME, "Scheduled event eventTime", REFERENCE_CLOCK)
    entry = condition(pod, "PodScheduled")
    return sharpest(
        [],
        whole_second(
            parse_time((entry or {}).get("lastTransitionTime")),
            "PodScheduled condition",
            REFERENCE_CLOCK,
        ),
    )


def sandbox_ready_stamp(pod: dict, observed: dict) -> float | None:
    """The PodReadyToStartContainers condition's time while it is True, else as this client's watch saw it."""
    sandbox_condition = condition(pod, "PodReadyToStartContainers") or {}
    stamp = (
        parse_time(sandbox_condition.get("lastTransitionTime"))
        if sandbox_condition.get("status") == "True"
        else None
    )
    return parse_time(observed.get("sandbox_ready")) if stamp is None else stamp


def sandbox_ready_point(
    pod: dict,
    observed: dict,
    kubelet: dict[str, tuple[float, str]],
    scheduled: Point | None,
    created: Bound | None,
    clocks: EpisodeClocks,
) -> Point | None:
    """The pod's sandbox ready: after its binding and creation, before the kubelet's first image or container event."""
    sandbox_stamp = sandbox_ready_stamp(pod, observed)
    sandbox_ready = sharpest(
        sandbox_ready_bounds(observed, kubelet, scheduled, created, clocks, sandbox_stamp)
    )
    if (
        sandbox_ready is not None
        and sandbox_stamp is not None
        and sandbox_ready.source.startswith("PodReadyToStartContainers")
    ):
        # Only the condition bounds it from above: read it as the condition says, as far as the
        # lower bound allows; the precision still spans everything before.
        sandbox_ready = sandbox_ready._replace(
            at=min(
                sandbox_ready.at,
                max(sandbox_stamp - clocks.node, sandbox_ready.at - sandbox_ready.precision),
            )
        )
    return sandbox_ready


def sandbox_ready_bounds(
    observed: dict,
    kubelet: dict[str, tuple[float, str]],
    scheduled: Point | None,
    created: Bound | None,
    clocks: EpisodeClocks,
    sandbox_stamp: float | None,
) -> list[Bound | None]:
    """What bounds the sandbox's readiness: from above the kubelet's events, the watch and the
    PodReadyToStartContainers condition; from below the pod's binding and its creation."""
    seen = observed.get("seen") or {}
    return [
        *kubelet_sandbox_bounds(kubelet, clocks),
        upper(
            seen.get("sandbox_ready"),
            "watch saw the sandbox ready",
            "client",
            clocks.client,
            clocks.client_slack,
        ),
        lower(
            scheduled.at if scheduled is not None and scheduled.precision <= EVENT_TIME else None,
            "Scheduled eventTime",
            REFERENCE_CLOCK,
        ),
        lower(
            created.lower if created is not None else None,
            "Pod creationTimestamp",
            REFERENCE_CLOCK,
        ),
        # The kubelet stamps this condition when its status update reports it, often together
        # with the running container: the sandbox was ready by then, maybe long before.
        upper(
            None if sandbox_stamp is None else sandbox_stamp + WHOLE_SECOND,
            "PodReadyToStartContainers condition",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
    ]


def kubelet_sandbox_bounds(
    kubelet: dict[str, tuple[float, str]], clocks: EpisodeClocks
) -> list[Bound | None]:
    """The kubelet's first image event (Pulling, else Pulled) and its Created event, each named
    once the sandbox was ready."""
    image_event = min((kubelet[r] for r in ("Pulling", "Pulled") if r in kubelet), default=None)
    return [
        followed_by_event(
            image_event[0] if image_event else None,
            f"kubelet {'Pulling' if 'Pulling' in kubelet else 'Pulled'} event name",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
        upper(
            kubelet_named(kubelet, "Created"),
            "kubelet Created event name",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
    ]


def container_started_point(
    state: dict,
    kubelet: dict[str, tuple[float, str]],
    seen: dict,
    clocks: EpisodeClocks,
) -> Point | None:
    """The container's start: its startedAt second, sharpened by the kubelet's events and the watch.

    Not by the worker's /proc start time: a real runtime (runc, crun) forks the container's first
    process when it creates the task, inside the kubelet's start call, and lets it run only when it
    starts the task, so the process's birth comes before the container's start there (and after it
    where the runtime spawns the process to start it)."""
    node, node_slack = clocks.node, clocks.node_slack
    running = state.get("terminated") or state.get("running") or {}
    return sharpest(
        [
            lower(
                kubelet_named(kubelet, "Created"),
                "kubelet Created event name",
                "node",
                node,
                node_slack,
            ),
            upper(
                kubelet_named(kubelet, "Started"),
                "kubelet Started event name",
                "node",
                node,
                node_slack,
            ),
            upper(
                seen.get("running"),
                "watch saw the container running",
                "client",
                clocks.client,
                clocks.client_slack,
            ),
        ],
        whole_second(
            parse_time(running.get("startedAt")), "container startedAt", "node", node, node_slack
        ),
    )


def container_finished_point(
    state: dict, reward: dict, seen: dict, clocks: EpisodeClocks
) -> Point | None:
    """The container's end: its finishedAt second, after the worker's reward, before this client's watch saw it."""
    return sharpest(
        [
            lower(
                worker_time(reward.get("at")),
                "worker reward event",
                "node",
                clocks.node,
                clocks.node_slack,
            ),
            upper(
                seen.get("terminated"),
                "watch saw the container terminated",
                "client",
                clocks.client,
                clocks.client_slack,
            ),
        ],
        whole_second(
            parse_time((state.get("terminated") or {}).get("finishedAt")),
            "container finishedAt",
            "node",
            clocks.node,
            clocks.node_slack,
        ),
    )


def worker_point(value: Any, precision: float, source: str, clocks: EpisodeClocks) -> Point | None:
    """A moment the worker read on the node's clock, moved onto the control plane's."""
    moment = worker_time(value)
    return (
        None
        if moment is None
        else Point(
            earlier_side(moment, clocks.node, 0.0),
            precision_held(round(precision + 2 * clocks.node_slack, 6)),
            source,
            "node",
        )
    )


def creation_stamp(pod: dict) -> Bound | None:
    """The pod's creationTimestamp, the second its creation fell in."""
    return whole_second(
        parse_time(pod["metadata"].get("creationTimestamp")),
        "Pod creationTimestamp",
        REFERENCE_CLOCK,
    )


def episode_points(
    pod: dict,
    ready: dict,
    reward: dict,
    scheduled_at: float | None,
    observed: dict | None = None,
    kubelet: dict[str, tuple[float, str]] | None = None,
    created_event_at: float | None = None,
    clocks: EpisodeClocks = CLOCKS_AGREE,
    created_after: Bound | None = None,
) -> dict[str, Point | None]:
    """When each point of one episode happened, from its sharpest sources, on the control plane's clock.

    `observed` is what this client's watch saw of the pod (when each transition first
    arrived, and stamps seen only while it ran); `kubelet` the kubelet's container events
    (reason -> name time, node); `clocks` the client's and this pod's node's clocks minus the
    control plane's, and how far each may be off: a point read on that clock is that much less
    precise (by default every clock reads as the control plane's). `created_after`:
    what else the pod was created after (its Job's creation, an earlier pod's end).
    """
    observed = observed or {}
    seen = observed.get("seen") or {}
    kubelet = kubelet or {}
    state = container_status(pod).get("state") or {}
    created = creation_stamp(pod)
    scheduled = scheduled_point(pod, scheduled_at)
    return {
        "pod_created": pod_created_point(created, seen, created_event_at, created_after, clocks),
        "scheduled": scheduled,
        "sandbox_ready": sandbox_ready_point(pod, observed, kubelet, scheduled, created, clocks),
        "container_started": container_started_point(state, kubelet, seen, clocks),
        "process_started": worker_point(
            ready.get("process_started_at"), PROC_TICK, "worker /proc start time", clocks
        ),
        "imports_done": worker_point(
            ready.get("imports_done_at"), EVENT_TIME, "worker imports_done_at", clocks
        ),
        "ready": worker_point(ready.get("at"), EVENT_TIME, "worker ready event", clocks),
        "reward": worker_point(reward.get("at"), EVENT_TIME, "worker reward event", clocks),
        "container_finished": container_finished_point(state, reward, seen, clocks),
        **image_pull_points(kubelet, clocks),
    }


def image_pull_points(
    kubelet: dict[str, tuple[float, str]], clocks: EpisodeClocks
) -> dict[str, Point | None]:
    """When the kubelet began and ended getting the image: its Pulling and Pulled event names (a present
    image: its Pulled event, both). Not in POINTS: they bound the phase image_pull alone."""
    pulled = kubelet_named(kubelet, "Pulled")
    started = kubelet_named(kubelet, "Pulling")
    if pulled is None:
        return {"image_pull_started": None, "image_pulled": None}
    points = {}
    for point, moment, reason in (
        ("image_pull_started", pulled if started is None else started, "Pulling"),
        ("image_pulled", pulled, "Pulled"),
    ):
        points[point] = sharpest(
            [
                followed_by_event(
                    moment,
                    f"kubelet {reason if started else 'Pulled'} event name",
                    "node",
                    clocks.node,
                    clocks.node_slack,
                )
            ]
        )
    return points


class ClockBounds:
    """What the evidence proves about one clock's reading minus the control plane's, in seconds."""

    def __init__(self) -> None:
        self.lowest: float | None = None  # the offset is above this
        self.highest: float | None = None  # and below this
        self.samples = 0

    def copy(self) -> ClockBounds:
        other = ClockBounds()
        other.lowest, other.highest, other.samples = self.lowest, self.highest, self.samples
        return other

    def at_least(self, value: float) -> None:
        self.lowest = value if self.lowest is None else max(self.lowest, value)
        self.samples += 1

    def at_most(self, value: float) -> None:
        self.highest = value if self.highest is None else min(self.highest, value)
        self.samples += 1

    def contradictory(self) -> bool:
        return self.lowest is not None and self.highest is not None and self.lowest > self.highest

    def apart(self) -> float:
        """The least the clocks are proven apart by (signed), 0 while they may agree."""
        if self.contradictory():
            return 0.0  # contradictory evidence: corrected by nothing, and said so
        value = 0.0 if self.lowest is None else max(0.0, self.lowest)
        return value if self.highest is None else min(value, self.highest)

    def corrected(self) -> bool:
        """Proven apart by more than a sharp point's precision: a lesser gap may be no more than
        the premises' allowances (an event named a little later than they say) and is left alone."""
        return abs(self.apart()) > CLOCK_TOLERANCE_SECONDS

    def offset(self) -> float:
        """The correction applied: none while the clocks may agree (the points then assume they do),
        else the middle of what the evidence allows, or its one known edge."""
        if not self.corrected():
            return 0.0
        if self.lowest is None or self.highest is None:
            return self.apart()
        return (self.lowest + self.highest) / 2

    def slack(self) -> float:
        """How far the applied correction may be off: half the evidence's interval, when corrected."""
        if not self.corrected() or self.lowest is None or self.highest is None:
            return 0.0
        return (self.highest - self.lowest) / 2

    def describe(self, what: str, evidence: str) -> tuple[dict, list[str]]:
        offset, apart = self.offset(), self.apart()
        entry = {
            "offset_seconds": rounded(offset, 6),
            "correction_slack_seconds": rounded(self.slack(), 6),
            "at_least_seconds": rounded(self.lowest, 6),
            "at_most_seconds": rounded(self.highest, 6),
            "uncertainty_seconds": None
            if self.lowest is None or self.highest is None
            else rounded(max(0.0, self.highest - self.lowest), 6),
            "samples": self.samples,
            "evidence": evidence,
        }
        warnings = []
        if self.contradictory():
            warnings.append(
                f"{what}: the evidence contradicts itself (offset at least {self.lowest:.3f} s and "
                f"at most {self.highest:.3f} s); no correction applied, sub-second points that mix "
                f"clocks may be wrong by that much"
            )
        elif abs(apart) > CLOCK_TOLERANCE_SECONDS and (self.lowest is None or self.highest is None):
            # One edge only: the correction is the least gap proven; how much more there is, nothing says.
            warnings.append(
                f"{what} disagree by at least {abs(apart):.3f} s (more than the "
                f"{CLOCK_TOLERANCE_SECONDS:g} s a sharp point claims); its times were corrected by "
                f"{-offset:+.3f} s, the least gap proven, but no evidence bounds the gap from the "
                f"other side: points on this clock may be off by more than their stated precision"
            )
        elif abs(apart) > CLOCK_TOLERANCE_SECONDS:
            warnings.append(
                f"{what} disagree by at least {abs(apart):.3f} s (more than the "
                f"{CLOCK_TOLERANCE_SECONDS:g} s a sharp point claims); its times were corrected by "
                f"{-offset:+.3f} s (+/- {self.slack():.3f} s, added to their precision) onto the "
                f"control plane's clock"
            )
        return entry, warnings


def client_clock_bounds(job: dict, job_observed: dict[str, float]) -> ClockBounds:
    """The client's clock as its Job says: its create call before the Job's stamp, its watch
    after each stamped change (each pod's are added by bound_clocks_by_pods)."""
    client = ClockBounds()
    job_created = parse_time(job["metadata"].get("creationTimestamp"))
    if job_created is not None and job_observed.get("submitted") is not None:
        client.at_least(job_observed["submitted"] - job_created - WHOLE_SECOND)
    if job_created is not None and job_observed.get("added") is not None:
        client.at_most(job_observed["added"] - job_created)
    for kind, seen_at in job_observed.items():
        stamp = parse_time((condition(job, kind) or {}).get("lastTransitionTime"))
        if stamp is not None and kind not in ("added", "submitted", "create_returned"):
            client.at_most(seen_at - stamp)
    return client


def kubelet_event_clocks(
    events: Sequence[EventRecord],
) -> tuple[dict[str, ClockBounds], dict[str, tuple[float, str]]]:
    """Each node's clock from its kubelet's events (named before they are stored), and each pod's first Started."""
    nodes: dict[str, ClockBounds] = {}
    started: dict[str, tuple[float, str]] = {}
    for event in events:
        node = event.host
        if not node or event.component != "kubelet":
            continue
        named = event_name_time(event)
        if named is None:
            continue
        stored = parse_time(event.created)
        if stored is not None and int(event.count or 1) == 1:
            nodes.setdefault(node, ClockBounds()).at_least(named - stored - WHOLE_SECOND)
        if event.reason == "Started" and event.kind == "Pod":
            started.setdefault(event.object_name or "", (named, node))
    return nodes, started


def bound_after(stamp: float | None, scheduled_at: float | None) -> float | None:
    """The earliest a pod can have been bound (control plane's clock): its PodScheduled second's
    start (`stamp`), or SCHEDULED_FOLLOWS_BINDING_SECONDS before the scheduler's eventTime if that
    is later."""
    after_event = None if scheduled_at is None else scheduled_at - SCHEDULED_FOLLOWS_BINDING_SECONDS
    known = [moment for moment in (stamp, after_event) if moment is not None]
    return max(known) if known else None


def bound_clocks_by_pods(
    client: ClockBounds,
    nodes: dict[str, ClockBounds],
    pods: Sequence[dict],
    observed_pods: dict[str, dict],
    scheduled: dict[str, float],
    kubelet: dict[str, dict[str, tuple[float, str]]],
    started: dict[str, tuple[float, str]],
) -> dict[str, float]:
    """What each pod says of the clocks, in one pass over the pods (at 10,000 pods, one for each
    clock took a tenth of a second). The client's clock from above: its watch sees a pod after its
    stamped creation and binding. Each node's from above: its kubelet acts on a pod only after the
    pod's creation and binding. Returned: node -> the most the client's clock reads ahead of it
    (the watch sees a container run after it Started)."""
    client_vs_node: dict[str, float] = {}
    for pod in pods:
        name = pod_name(pod)
        seen = (observed_pods.get(name) or {}).get("seen") or {}
        created = parse_time(pod["metadata"].get("creationTimestamp"))
        if created is not None and seen.get("added") is not None:
            client.at_most(seen["added"] - created)
        binding = parse_time((condition(pod, "PodScheduled") or {}).get("lastTransitionTime"))
        if binding is not None and seen.get("bound") is not None:
            client.at_most(seen["bound"] - binding)
        # Only a pod the scheduler bound (its event) is known to have waited for a binding here.
        bound = bound_after(binding, scheduled[name]) if name in scheduled else None
        reasons = kubelet.get(name)
        if bound is not None and reasons:
            named, node = min(reasons.values())  # its first container event
            nodes.setdefault(node, ClockBounds()).at_most(named - bound)
        started_on_node = parse_time((pod.get("status") or {}).get("startTime"))
        node_name = (pod.get("spec") or {}).get("nodeName")
        if bound is not None and started_on_node is not None and node_name:
            # The kubelet stamps the pod's startTime when it first takes the bound pod up: after the binding.
            nodes.setdefault(node_name, ClockBounds()).at_most(
                started_on_node + WHOLE_SECOND - bound
            )
        if name in started:
            named, node = started[name]
            if created is not None:
                nodes.setdefault(node, ClockBounds()).at_most(named - created)
            if seen.get("running") is not None:
                gap = seen["running"] - named
                client_vs_node[node] = min(client_vs_node.get(node, gap), gap)
    return client_vs_node


def describe_clocks(
    client: ClockBounds, nodes: dict[str, ClockBounds], client_vs_node: dict[str, float]
) -> dict:
    """The clocks entry: each clock's offset and evidence, and a warning for each that disagrees."""
    entry, warnings = client.describe(
        "the client's and the control plane's clocks",
        "the create call before the Job's creationTimestamp; the watch seeing "
        "stamped changes (pod created, bound, Job conditions) after their second",
    )
    result: dict[str, Any] = {"reference": REFERENCE_CLOCK, "client": entry, "nodes": {}}
    for node, bounds in sorted(nodes.items()):
        node_entry, node_warnings = bounds.describe(
            f"node {node}'s and the control plane's clocks",
            "kubelet event names before their creationTimestamp's second ends, after the pod's creation "
            "and after its binding (within its PodScheduled second, at most "
            f"{SCHEDULED_FOLLOWS_BINDING_SECONDS:g} s before the Scheduled eventTime); the pod's startTime "
            "after that binding",
        )
        result["nodes"][node] = node_entry
        warnings += node_warnings
        if node in client_vs_node:
            node_entry["client_minus_node_at_most_seconds"] = rounded(client_vs_node[node], 6)
            disagreement = (
                entry["offset_seconds"] - node_entry["offset_seconds"] - client_vs_node[node]
            )
            # A correction known only within its slack may account for that much of it.
            allowed = (
                CLOCK_TOLERANCE_SECONDS
                + entry["correction_slack_seconds"]
                + node_entry["correction_slack_seconds"]
            )
            if disagreement > allowed:
                warnings.append(
                    f"the client saw containers on node {node} running {disagreement:.3f} s before "
                    f"the node's own Started events (corrected clocks): the client's and the node's "
                    f"clocks disagree"
                )
    result["warnings"] = warnings
    return result


def clock_offsets(
    job: dict,
    pods: Sequence[dict],
    events: Sequence[EventRecord],
    observed_pods: dict[str, dict],
    job_observed: dict[str, float],
    kubelet: dict[str, dict[str, tuple[float, str]]] | None = None,
    scheduled: dict[str, float] | None = None,
    kubelet_clocks: tuple[dict[str, ClockBounds], dict[str, tuple[float, str]]] | None = None,
) -> dict:
    """Each clock's offset from the control plane's, bounded by transitions seen on both.

    A watch sees a change after it happened and a server stamp truncates it: the client's
    clock reads at most (seen - stamp) ahead. The client's create call precedes the Job's
    creation. A kubelet names an event before the API server stores it (the event's
    creationTimestamp) and after the pod exists; the client sees a container running only
    after the kubelet's Started event. The kubelet's first container event follows a sandbox
    it started only once the pod was bound, which lies in its PodScheduled second and at most
    SCHEDULED_FOLLOWS_BINDING_SECONDS before the scheduler's Scheduled eventTime; so does the
    pod's startTime, which the kubelet stamps as it takes the pod up (whole seconds, and its
    second's fraction differs from pod to pod, so a few pods pin the node's clock).
    """
    if scheduled is None:
        scheduled = scheduled_event_times(events)
    if kubelet is None:
        kubelet = kubelet_container_events(events)
    client = client_clock_bounds(job, job_observed)
    nodes, started = kubelet_clocks or kubelet_event_clocks(events)
    client_vs_node = bound_clocks_by_pods(
        client, nodes, pods, observed_pods, scheduled, kubelet, started
    )
    return describe_clocks(client, nodes, client_vs_node)


def phase_durations(points: dict[str, Any]) -> dict[str, tuple[float, float] | None]:
    """Phase -> (seconds, precision), or None when a source is missing.

    A phase's precision is the sum of its ends' (the interval of a difference). Its ends
    happen in this order, so a phase that comes out negative is shorter than its
    precision and is reported as 0.
    """
    durations: dict[str, tuple[float, float] | None] = {}
    for phase, (start, end) in PHASES.items():
        first, last = points.get(start), points.get(end)
        durations[phase] = (
            None
            if first is None or last is None
            else (max(0.0, last[0] - first[0]), precision_held(round(first[1] + last[1], 6)))
        )
    return durations


def phase_summary(
    episodes_durations: Sequence[Mapping[str, tuple[float, float] | None]],
    samples: dict[str, list[float]] | None = None,
) -> dict[str, dict]:
    """Per phase: P50/P95/P99/max/mean, sample and missing counts, stated precision. `samples`,
    if given, is filled with each phase's seconds, sorted (the CDF's lines are drawn from them)."""
    summary = {}
    known_of: dict[str, list[tuple[float, float]]] = {phase: [] for phase in PHASES}
    for durations in episodes_durations:  # one pass over the episodes, not one for each phase
        for phase, duration in durations.items():
            if duration is not None and phase in known_of:
                known_of[phase].append(duration)
    for phase, (start, end) in PHASES.items():
        known = known_of[phase]
        values = [value for value, _ in known]
        ordered = sorted(values)
        if samples is not None:
            samples[phase] = ordered
        entry = describe(values, missing=len(episodes_durations) - len(known), ordered=ordered)
        widest = max((p for _, p in known), default=None)
        # An end bounded on one side only has no finite precision: JSON has no infinity, so null.
        entry.update(
            {
                "from": start,
                "to": end,
                "precision_seconds": rounded(widest, 6)
                if widest is not None and math.isfinite(widest)
                else None,
            }
        )
        if not known:
            entry["why_missing"] = f"no episode had both {start} and {end}"
        summary[phase] = entry
    return summary


def difference(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def completion_gap(
    job: dict, pods: Sequence[dict], last_reward_at: float | None, client_observed_at: float | None
) -> dict:
    """What the time between the last reward and the client seeing the end is made of (from the
    last container's finish when no episode rewarded: a rollout whose every agent failed)."""
    finished = [parse_time((container_terminated(p) or {}).get("finishedAt")) for p in pods]
    finished_known = [t for t in finished if t is not None]
    last_finished = max(finished_known) if finished_known else None
    criteria = parse_time((condition(job, "SuccessCriteriaMet") or {}).get("lastTransitionTime"))
    end_kind = job_finished(job) or "Complete"
    end = parse_time((condition(job, end_kind) or {}).get("lastTransitionTime"))
    if last_reward_at is None:
        last_reward_at = last_finished if last_finished is not None else end or 0.0
    parts = completion_parts(last_reward_at, last_finished, criteria, end, client_observed_at)
    gap, bounds = parts_read(parts)
    gap.update(
        {
            "bounds_seconds": bounds,
            "precision_seconds": WHOLE_SECOND,
            "note": "container finish and Job conditions are whole-second Kubernetes times, each read no earlier "
            "than the moment before it; each part lies within its bounds_seconds; SuccessCriteriaMet "
            "exists on Kubernetes >= 1.31",
        }
    )
    return gap


class GapPart(NamedTuple):
    """A part of the completion gap: its earlier and later stamps, each with how far its moment
    may lie after it (the bounds), and the part as read."""

    first: float | None
    first_spread: float
    last: float | None
    last_spread: float
    seconds: float | None


def completion_parts(
    last_reward_at: float,
    last_finished: float | None,
    criteria: float | None,
    end: float | None,
    client_observed_at: float | None,
) -> dict[str, GapPart]:
    """The parts of the completion gap, from the last reward, the last container's finish, the
    Job's SuccessCriteriaMet and end conditions, and the client seeing the end."""
    # A Kubernetes time names the second its moment fell in. The moments happen in this order
    # (reward, container finished, the Job's conditions, the client seeing it), so each stamp
    # is read no earlier than the moment before it: every part is then 0 or more, where two
    # stamps' difference could read as a negative duration, and the parts still add up.
    finish_at = None if last_finished is None else max(last_finished, last_reward_at)
    after_finish = last_reward_at if finish_at is None else finish_at
    met_at = None if criteria is None else max(criteria, after_finish)
    end_at = None if end is None else max(end, after_finish)
    return {
        "last_reward_to_last_container_finished_seconds": GapPart(
            last_reward_at, 0.0, last_finished, WHOLE_SECOND, difference(finish_at, last_reward_at)
        ),
        "last_container_finished_to_success_criteria_met_seconds": GapPart(
            last_finished, WHOLE_SECOND, criteria, WHOLE_SECOND, difference(met_at, finish_at)
        ),
        "last_container_finished_to_job_complete_seconds": GapPart(
            last_finished, WHOLE_SECOND, end, WHOLE_SECOND, difference(end_at, finish_at)
        ),
        "job_complete_to_client_observed_seconds": GapPart(
            end, WHOLE_SECOND, client_observed_at, 0.0, difference(client_observed_at, end_at)
        ),
        "last_reward_to_client_observed_seconds": GapPart(
            last_reward_at,
            0.0,
            client_observed_at,
            0.0,
            difference(client_observed_at, last_reward_at),
        ),
    }


def parts_read(
    parts: dict[str, GapPart],
) -> tuple[dict[str, Any], dict[str, list[float | None]]]:
    """Each part's seconds as read (None where a stamp is missing), and its bounds."""
    gap: dict[str, Any] = {}
    bounds: dict[str, list[float | None]] = {}
    for name, (first, first_spread, last, last_spread, seconds) in parts.items():
        if first is None or last is None or seconds is None:
            gap[name] = None
            continue
        gap[name] = rounded(max(0.0, seconds))
        bounds[name] = [
            rounded(max(0.0, last - first - first_spread)),
            rounded(max(0.0, last + last_spread - first)),
        ]
    return gap, bounds


def node_distribution(pods: Iterable[dict]) -> dict[str, int]:
    """Episodes per node, from the pods."""
    return count_nodes((pod.get("spec") or {}).get("nodeName") for pod in pods)


def count_nodes(nodes: Iterable[str | None]) -> dict[str, int]:
    """Episodes per node name, sorted by name; a pod never scheduled counts as "(unscheduled)"."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node or "(unscheduled)"] = counts.get(node or "(unscheduled)", 0) + 1
    return dict(sorted(counts.items()))


START_PATH_PARTS = (("image", "image"), ("image", "image_cache"), ("runtime", "runtime_class"))


def start_path_phases(records: Sequence[dict]) -> dict[str, dict] | None:
    """When a batch mixes start paths (the image found on the node or pulled; the runtime class),
    the phases of each path apart: pooled, a pull's seconds would pass for a slow sandbox. A path
    is named by the parts that differ within the batch. None for one path."""
    varying = [
        (label, key)
        for label, key in START_PATH_PARTS
        if len({record.get(key) for record in records}) > 1
    ]
    if not varying:
        return None
    paths: dict[str, list] = {}
    for record in records:
        path = ", ".join(f"{label} {record.get(key) or 'unknown'}" for label, key in varying)
        paths.setdefault(path, []).append(record["phases"])
    return {path: phase_summary(durations) for path, durations in sorted(paths.items())}


def slot_freed_after(
    created_within: dict[str, tuple[float, float]], ended_after: dict[str, float], parallelism: int
) -> dict[str, float]:
    """Pod -> a moment it was created after, from its Job's parallelism.

    A Job runs at most `parallelism` pods at once, so a pod created after n others came only
    once n - parallelism + 1 of them had ended. `created_within`: each pod's creation lies in
    (earliest, latest); another pod was provably created before it when its latest precedes
    this one's earliest (a watch's order says less: its first listing comes in name order).
    `ended_after`: a moment each pod's container ended after; an earlier pod whose end is
    unknown leaves no bound.
    """
    found: dict[str, float] = {}
    by_latest = sorted(created_within.items(), key=lambda item: item[1][1])
    ends: list[float] = []
    earlier = 0
    unknown = False
    for name, (earliest, _) in sorted(created_within.items(), key=lambda item: item[1][0]):
        while earlier < len(by_latest) and by_latest[earlier][1][1] < earliest:
            other = by_latest[earlier][0]
            if other in ended_after:
                bisect.insort(ends, ended_after[other])
            else:
                unknown = True
            earlier += 1
        if earlier >= parallelism and not unknown:
            found[name] = ends[earlier - parallelism]
    return found


def job_creation(
    job: dict, job_observed: dict[str, float], client_offset: float, client_slack: float
) -> Point:
    """When the Job was truly created: inside the client's create call and its creationTimestamp's
    second; the client's moments widened by how far its clock's correction may be off."""
    stamp = whole_second(
        parse_time(job["metadata"].get("creationTimestamp")),
        "Job creationTimestamp",
        REFERENCE_CLOCK,
    )
    point = sharpest(
        [
            lower(
                job_observed.get("submitted"),
                "client's create call",
                "client",
                client_offset,
                client_slack,
            ),
            upper(
                job_observed.get("create_returned"),
                "client's create call",
                "client",
                client_offset,
                client_slack,
            ),
            upper(
                job_observed.get("added"),
                "watch saw the Job",
                "client",
                client_offset,
                client_slack,
            ),
        ],
        stamp,
    )
    assert point is not None and stamp is not None  # verify_batch checked the stamp
    return point


class EpisodeInputs(NamedTuple):
    """Everything besides its pod and log that an episode's points are made from (episode_points'
    arguments): equal inputs give equal points."""

    scheduled_at: float | None
    observed: dict | None
    kubelet: dict | None
    created_event_at: float | None
    clocks: EpisodeClocks
    created_after: Bound | None


class EpisodeDraft(NamedTuple):
    """One episode summarised as it ended, from the evidence known then: its verification, its row,
    its points and phases. summarise_batch takes what the final evidence leaves unchanged."""

    pod: dict
    log_text: str
    job_created: float
    builtin: bool
    ready: dict
    reward: dict
    row: dict
    inputs: EpisodeInputs
    points: dict[str, Point | None]
    phases: dict[str, tuple[float, float] | None]
    # Its row of episodes.csv after the batch, pod and index columns, kept in `csv` under its pod's
    # name, as made from these points, phases and row and the image as the events said then.
    csv: Spool | None = None
    image_cache: str | None = None
    image_pull: ImagePull | None = None

    def verified(self, pod: dict, log_text: str, job_created: float, builtin: bool) -> bool:
        """Verified already, from this very pod, log, Job creation and worker."""
        return (
            (self.pod is pod or self.pod == pod)
            and (self.log_text is log_text or self.log_text == log_text)
            and self.job_created == job_created
            and self.builtin == builtin
        )

    def points_for(
        self, pod: dict, ready: dict, inputs: EpisodeInputs
    ) -> tuple[dict[str, Point | None], dict[str, tuple[float, float] | None]] | None:
        """Its points and phases for these final inputs, if made from the same pod and log (None: to
        be made again). What else the pod was created after (an earlier pod's end freeing its slot,
        known for certain only once every earlier pod has ended) bears on its creation alone: should
        only that differ, only that point is made again."""
        if ready is not self.ready or not (self.pod is pod or self.pod == pod):
            return None
        if inputs == self.inputs:
            return self.points, self.phases
        if inputs._replace(created_after=None) != self.inputs._replace(created_after=None):
            return None
        seen = (inputs.observed or {}).get("seen") or {}
        points = dict(
            self.points,
            pod_created=pod_created_point(
                creation_stamp(pod),
                seen,
                inputs.created_event_at,
                inputs.created_after,
                inputs.clocks,
            ),
        )
        return points, phase_durations(points)


# --------------------------------------------------------------------------
# src/rl_batch_demo/outcomes.py: Outcomes: verification (the first violation fails the whole batch) and rollouts (every episode's

def verify_episode(
    pod: dict, events: list[dict], job_created: float, builtin: bool
) -> tuple[dict, dict]:
    """Check one episode; return its ready and reward events."""
    name = pod_name(pod)
    phase = (pod.get("status") or {}).get("phase")
    if phase != "Succeeded":
        raise VerificationError(f"pod {name}: phase is {phase}, not Succeeded")
    ready, reward = episode_events(name, events)
    check_reward(name, reward, builtin)
    check_times_in_order(name, pod, job_created, ready, reward)
    check_container_exit(name, pod)
    return ready, reward


def episode_events(name: str, events: list[dict]) -> tuple[dict, dict]:
    """The episode's one ready and one reward event, both naming its pod."""
    readies = [e for e in events if e["event"] == "ready"]
    rewards = [e for e in events if e["event"] == "reward"]
    if len(readies) != 1:
        raise VerificationError(
            f"pod {name}: expected exactly one ready event, found {len(readies)}"
        )
    if len(rewards) != 1:
        raise VerificationError(
            f"pod {name}: expected exactly one reward event, found {len(rewards)}"
        )
    ready, reward = readies[0], rewards[0]
    if ready.get("episode_id") != name:
        raise VerificationError(
            f"pod {name}: ready event has episode_id {ready.get('episode_id')!r}, not the pod name"
        )
    if reward.get("episode_id") != ready.get("episode_id"):
        raise VerificationError(
            f"pod {name}: reward event has episode_id {reward.get('episode_id')!r}, "
            f"not the ready event's {ready.get('episode_id')!r}"
        )
    return ready, reward


def check_reward(name: str, reward: dict, builtin: bool) -> None:
    """The built-in episode's reward is 1, its patched tests passed and its baseline failed; an
    episode script's reward is a finite number."""
    value = reward.get("reward")
    if not builtin:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise VerificationError(f"pod {name}: reward is {value!r}, not a number")
        return
    if value != 1 or isinstance(value, bool):
        raise VerificationError(f"pod {name}: reward is {value!r}, not 1", "verifier")
    tests_exit, baseline_exit = reward.get("tests_exit"), reward.get("baseline_exit")
    if tests_exit != 0 or isinstance(tests_exit, bool):
        raise VerificationError(f"pod {name}: tests_exit is {tests_exit!r}, not 0", "verifier")
    if (
        baseline_exit in (0, None)
        or not isinstance(baseline_exit, int)
        or isinstance(baseline_exit, bool)
    ):
        raise VerificationError(
            f"pod {name}: baseline_exit is {reward.get('baseline_exit')!r}; the baseline must fail",
            "verifier",
        )


def check_times_in_order(
    name: str, pod: dict, job_created: float, ready: dict, reward: dict
) -> None:
    """The Job created, then the pod, then ready, then the reward: every time known, none earlier
    than the one before."""
    pod_created = parse_time(pod["metadata"].get("creationTimestamp"))
    moments = [job_created, pod_created, ready.get("at"), reward.get("at")]
    numbers = [m for m in moments if isinstance(m, (int, float))]
    in_order = len(numbers) == len(moments) and all(a <= b for a, b in zip(numbers, numbers[1:]))
    if not in_order:
        raise VerificationError(
            f"pod {name}: times out of order (job created {moments[0]}, pod created {moments[1]}, "
            f"ready {moments[2]}, reward {moments[3]}): unsynchronised clocks or broken events",
            "verifier",
        )


def check_container_exit(name: str, pod: dict) -> None:
    """The episode's container ran once and exited 0."""
    status = container_status(pod)
    if status.get("restartCount", 0) != 0:
        raise VerificationError(
            f"pod {name}: container restarted {status.get('restartCount')} time(s)",
            "infrastructure",
        )
    terminated = container_terminated(pod)
    if terminated is None:
        raise VerificationError(f"pod {name}: container has no terminated state")
    if terminated.get("exitCode") != 0:
        raise VerificationError(f"pod {name}: container exited {terminated.get('exitCode')}, not 0")


def never_ran(pod: dict, job: dict, log_text: str = "") -> bool:
    """A pod of a Job that was suspended, deleted before any container of it was made: no
    episode ran in it. Kueue stops a Job it has just admitted when its Workload is not yet in its
    cache ("Missing Workload; unable to restore pod templates", kubernetes-sigs/kueue#8482) and
    resumes it, and an eviction can come before the pods start: the Job controller deletes the
    pods, which end Failed (ContainerStatusUnknown, never started), and makes others. A pod with a
    log, or whose container ran once (lastState), ran."""
    if not pod["metadata"].get("deletionTimestamp") or log_text.strip():
        return False
    conditions = (job.get("status") or {}).get("conditions") or []
    if not any(condition.get("type") == "Suspended" for condition in conditions):
        return False
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        terminated = state.get("terminated") or {}
        if status.get("containerID") or "running" in state or terminated.get("startedAt"):
            return False
        if (status.get("lastState") or {}).get("terminated"):  # a container that ran before
            return False
    return True


def verify_batch(
    count: int,
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    builtin: bool = True,
    drafts: Mapping[str, EpisodeDraft] | None = None,
) -> list[tuple[dict, dict, dict]]:
    """Every episode honest, or VerificationError naming the first that is not.

    Returns (pod, ready event, reward event) per pod, sorted by pod name. An episode drafted
    while waiting from this very pod, log and Job creation is not verified again.
    """
    if len(pods) != count:
        raise VerificationError(
            f"expected {count} pods for {count} episodes, found {len(pods)} "
            f"(a replaced or missing pod is a failure)"
        )
    job_created = parse_time(job["metadata"].get("creationTimestamp"))
    if job_created is None:
        raise VerificationError("the Job has no creationTimestamp")
    episodes = []
    for pod in sorted((succeeded_before_its_deadline(pod, job) for pod in pods), key=pod_name):
        name = pod_name(pod)
        draft = (drafts or {}).get(name)
        if draft is not None and draft.verified(pod, logs.get(name, ""), job_created, builtin):
            episodes.append((pod, draft.ready, draft.reward))
            continue
        events = parse_events(logs.get(name, "").splitlines())
        ready, reward = verify_episode(pod, events, job_created, builtin)
        episodes.append((pod, ready, reward))
    return episodes


def job_end_reason(job: dict | None) -> str | None:
    """The reason of the Job's Failed (or FailureTarget) condition, e.g. DeadlineExceeded."""
    for kind in ("Failed", "FailureTarget"):
        entry = condition(job or {}, kind)
        if entry and entry.get("status") == "True":
            return entry.get("reason")
    return None


TRACEBACK_START = re.compile(r'(Traceback \(most recent call last\):|  File ".*", line \d+)')

EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(: .*)?")


def traceback_tail(log_text: str) -> str | None:
    """The last line of the last Python traceback in a log (`ZeroDivisionError: division by
    zero`), what a failed episode's line quotes; a SyntaxError has no "Traceback" header, only
    its `File` lines, so either opens one."""
    last, in_trace = None, False
    for line in log_text.splitlines():
        if TRACEBACK_START.match(line):
            in_trace = True
        elif in_trace and not line[:1].isspace():
            in_trace = False
            if EXCEPTION_LINE.fullmatch(line.rstrip()):
                last = line.strip()
    return last


def with_traceback(why: str, log_text: str) -> str:
    tail = traceback_tail(log_text)
    return f"{why}: {tail}" if tail else why


def classify_attempt(
    pod: dict, log_text: str, job: dict, builtin: bool, warnings: Sequence[str] = ()
) -> tuple[str | None, str | None]:
    """(failure class, why) of one pod, or (None, None) for an episode that passed every check.

    Infrastructure: the pod was disrupted, never scheduled, never started its
    container, was killed from outside, or was stopped by the batch's end before it
    started. Episode: the program exited non-zero on its own, broke the event
    protocol, or was still running at the Job's deadline. Verifier: the built-in
    checks of the result failed (the baseline passed, the patched tests failed,
    reward not 1, times out of order). `warnings` (the pod's Warning event reasons)
    are named with an infrastructure failure: a pod stopped at the deadline while
    its image would not pull says so.
    """
    failure_class, why = classify_pod_state(pod, log_text, job, builtin)
    if failure_class == "infrastructure" and warnings:
        why = f"{why}; pod warnings: {'; '.join(warnings)}"
    return failure_class, why


def job_cut_short(job: dict | None) -> bool:
    """The Job's successPolicy (--need) was met, or the tool stopped it once --need-groups was:
    every episode still running is stopped."""
    if cancelled_by_tool(job or {}):
        return True
    for kind in ("SuccessCriteriaMet", "Complete"):
        entry = condition(job or {}, kind)
        if entry and entry.get("status") == "True" and entry.get("reason") == SUCCESS_POLICY_REASON:
            return True
    return False


def cut_short_by(job: dict | None) -> str:
    """What cut the batch short (job_cut_short): the flag, as a cancelled episode's line names it."""
    return "--need-groups" if cancelled_by_tool(job or {}) else "--need"


def succeeded_before_its_deadline(pod: dict, job: dict | None) -> dict:
    """The pod as it ended: one the kubelet marked Failed (DeadlineExceeded) after it had
    succeeded is given back as Succeeded, else the pod itself.

    A real kubelet keeps checking a pod's activeDeadlineSeconds as long as the pod is on its node,
    ended or not, so a pod that succeeded well before its deadline turns Failed with reason
    DeadlineExceeded once the deadline passes while the batch still runs (its container's exit
    code still 0). It had succeeded if the Job counted its index as completed, or if its every
    container had ended, with exit code 0, in a second before its deadline's."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed" or status.get("reason") != POD_DEADLINE_REASON:
        return pod
    ends = [
        (cs.get("state") or {}).get("terminated") or {}
        for cs in status.get("containerStatuses") or []
    ]
    if not ends or any(end.get("exitCode") != 0 for end in ends):
        return pod
    index = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        COMPLETION_INDEX_ANNOTATION, ""
    )
    counted = index.isdigit() and int(index) in index_list(
        ((job or {}).get("status") or {}).get("completedIndexes") or ""
    )
    started = parse_time(status.get("startTime"))
    limit = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    finished = [parse_time(end.get("finishedAt")) for end in ends]
    in_time = (
        started is not None
        and isinstance(limit, int)
        and all(moment is not None and moment < started + limit for moment in finished)
    )
    if not (counted or in_time):
        return pod
    kept = {key: value for key, value in status.items() if key not in ("reason", "message")}
    return dict(pod, status=dict(kept, phase="Succeeded"))


def classify_pod_state(
    pod: dict, log_text: str, job: dict, builtin: bool
) -> tuple[str | None, str | None]:
    """classify_attempt from the pod's status and log alone: the first step that explains the
    pod, in this order, says whose failure it was. A pod whose episode ran under the launcher
    (exit_recorded) has its episode's own end in its log: it Succeeded whatever that end, so a
    failed one is never the episode's."""
    pod = succeeded_before_its_deadline(pod, job)
    lost = lost_pod(pod)
    if lost is not None:
        return lost
    if (pod.get("status") or {}).get("phase") == "Succeeded":
        own = own_end(log_text, builtin) if exit_recorded(pod) else None
        return own or succeeded_pod(pod, log_text, job, builtin)
    state = container_status(pod).get("state") or {}
    stopped = stopped_pod(pod, job, state)
    if stopped is not None:
        return stopped
    unended = unended_container(pod, job, state)
    if unended is not None:
        return unended
    if exit_recorded(pod):
        return launcher_failed(state["terminated"], log_text)
    return ended_container(state["terminated"], log_text, builtin)


def exit_recorded(pod: dict) -> bool:
    """The pod ran its episode under the launcher, which records the episode's own end in its log."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(EPISODE_EXIT_ANNOTATION) == EPISODE_EXIT_RECORDED


def own_end(log_text: str, builtin: bool) -> tuple[str | None, str | None] | None:
    """The episode's own failure as the launcher recorded it (its last episode_exit event), whose
    fault a failure of its own is (episode, or the built-in checks': verifier); None when it
    recorded none (the program exited 0)."""
    ends = [e for e in parse_events(log_text.splitlines()) if e["event"] == EPISODE_EXIT_EVENT]
    if not ends:
        return None
    end = ends[-1]
    if end.get("timed_out"):
        return "episode", (
            f"ran out of time: still running {end.get('timeout_seconds')} s after it started "
            f"(--episode-timeout), stopped by its launcher"
        )
    return ended_container({"exitCode": end.get("exit_code")}, log_text, builtin)


def launcher_failed(terminated: dict, log_text: str) -> tuple[str | None, str | None]:
    """A failed pod whose episode ran under the launcher: stopped or killed from outside (137, 143,
    OOMKilled, ...), or the launcher could not run the episode at all; never the episode's own end."""
    code, reason = terminated.get("exitCode"), terminated.get("reason") or ""
    if reason in INFRASTRUCTURE_TERMINATED_REASONS or code in INFRASTRUCTURE_EXIT_CODES:
        return "infrastructure", f"container {reason or 'ended'} with exit code {code}"
    return "infrastructure", with_traceback(
        f"the episode launcher exited {code} (it records the episode's own end and exits 0: "
        f"this is its own failure, e.g. a Python it cannot run on)",
        log_text,
    )


def lost_pod(pod: dict) -> tuple[str | None, str | None] | None:
    """A pod disrupted before it finished, or one its node gave up (INFRASTRUCTURE_POD_REASONS)."""
    status = pod.get("status") or {}
    disrupted = condition(pod, "DisruptionTarget")
    # A disrupted pod whose program still finished (PID 1 ignores SIGTERM unless it handles it,
    # so an evicted episode often runs on to exit 0) Succeeded: the Job counts it, so do we.
    if disrupted and disrupted.get("status") == "True" and status.get("phase") != "Succeeded":
        return "infrastructure", (
            f"disrupted ({disrupted.get('reason', '?')}: "
            f"{(disrupted.get('message') or '').strip()})"
        ).replace(": )", ")")
    if status.get("reason") in INFRASTRUCTURE_POD_REASONS:
        return (
            "infrastructure",
            f"pod {status['reason']}: {(status.get('message') or '').strip()}".rstrip(": "),
        )
    return None


def succeeded_pod(
    pod: dict, log_text: str, job: dict, builtin: bool
) -> tuple[str | None, str | None]:
    """A pod that Succeeded: a pass if its episode verifies, else what stopped it or failed."""
    try:
        job_created = parse_time(job["metadata"].get("creationTimestamp"))
        verify_episode(pod, parse_events(log_text.splitlines()), job_created or 0.0, builtin)
    except VerificationError as error:
        if job_cut_short(job) and pod["metadata"].get("deletionTimestamp"):
            # Stopped by the Job once --need was met, it exited 0 before its reward was complete.
            return (
                CANCELLED,
                f"cancelled: {cut_short_by(job)} was met while it ran (it exited 0 before a complete "
                f"reward: {str(error).split(': ', 1)[-1]})",
            )
        end = job_end_reason(job)
        if pod["metadata"].get("deletionTimestamp") and end is not None and not log_text:
            # The Job's end deleted the pod while it ran; it ran on to exit 0 (its first process
            # ignores SIGTERM) and the kubelet removed it at once: its log went with it before it
            # could be read. Its outcome is unknown, not the episode's failure.
            return "infrastructure", (
                f"its log was gone before it could be read: deleted as the Job ended ({end}), "
                f"the pod was removed once it exited 0"
            )
        return error.failure_class, str(error).split(": ", 1)[-1]
    return None, None


def stopped_pod(pod: dict, job: dict, state: dict) -> tuple[str | None, str | None] | None:
    """A pod stopped from outside before its episode ended: by --need being met, by its own
    deadline, or by the Job's end."""
    status = pod.get("status") or {}
    started = "running" in state or bool((state.get("terminated") or {}).get("startedAt"))
    deleted = pod["metadata"].get("deletionTimestamp")
    if job_cut_short(job) and (deleted or status.get("phase") != "Failed"):
        # Stopped (or about to be) by the Job because enough episodes had succeeded.
        return (
            CANCELLED,
            f"cancelled: {cut_short_by(job)} was met while it ran"
            if started
            else f"cancelled: {cut_short_by(job)} was met before its container started",
        )
    if status.get("reason") == POD_DEADLINE_REASON:
        return past_pod_deadline(pod, started)
    end = job_end_reason(job)
    own_exit = (state.get("terminated") or {}).get("exitCode") not in (
        None,
        0,
    ) + INFRASTRUCTURE_EXIT_CODES
    if deleted and end is not None and not own_exit:
        # Stopped by the Job controller as the Job ended, not by anything of its own.
        if started and end == "DeadlineExceeded":
            return "episode", "still running at the Job's deadline"
        return "infrastructure", f"stopped when the Job ended ({end}) before it finished"
    return None


def past_pod_deadline(pod: dict, started: bool) -> tuple[str | None, str | None]:
    """A pod stopped at its activeDeadlineSeconds: the episode's fault once its container started,
    unless its launcher keeps the episode's own time (its pod's deadline is then a backstop). The
    message names what the deadline was made of, as the run was given it (DEADLINE_ANNOTATION)."""
    limit = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    parts = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEADLINE_ANNOTATION)
    # A pod of a run that did not record them: its activeDeadlineSeconds alone.
    made_of = parts or "its pod's activeDeadlineSeconds"
    if started and exit_recorded(pod):
        if "--episode-timeout" in made_of:
            why = (
                f"not by its launcher at the episode's own --episode-timeout: a slow start "
                f"(image {container_image(pod)})"
            )
        else:
            why = "the episode still running then"
        return "infrastructure", (
            f"stopped at its pod's deadline of {limit} s from its start on the node "
            f"({made_of}), {why}"
        )
    if started:
        return (
            "episode",
            f"ran out of time: still running {limit} s after its pod started (its deadline: "
            f"{made_of})",
        )
    return "infrastructure", (
        f"container never started within its pod's deadline of {limit} s from its "
        f"start ({made_of}): image {container_image(pod)} not pulled and started by then"
    )


def unended_container(pod: dict, job: dict, state: dict) -> tuple[str | None, str | None] | None:
    """A pod whose container never ended: never scheduled, never started, or still running."""
    if not (pod.get("spec") or {}).get("nodeName"):
        scheduled = condition(pod, "PodScheduled") or {}
        return (
            "infrastructure",
            f"never scheduled: {scheduled.get('message') or 'no node assigned'}",
        )
    if "waiting" in state:
        waiting = state["waiting"]
        return "infrastructure", (
            f"container never started ({waiting.get('reason', 'waiting')}: "
            f"{waiting.get('message', '')})"
        ).replace(": )", ")")
    if "running" in state:
        end = job_end_reason(job)
        if end == "DeadlineExceeded":
            return "episode", "still running at the Job's deadline"
        return "infrastructure", f"still running when the batch ended ({end or 'not finished'})"
    if state.get("terminated") is None:
        return "infrastructure", "container never started (no container status)"
    return None


def ended_container(
    terminated: dict, log_text: str, builtin: bool
) -> tuple[str | None, str | None]:
    """A container that ended on its own: its exit code and its log say whose failure it was."""
    code, reason = terminated.get("exitCode"), terminated.get("reason") or ""
    if (
        reason in INFRASTRUCTURE_TERMINATED_REASONS
        or code in INFRASTRUCTURE_EXIT_CODES
        or code == 0
    ):
        return "infrastructure", f"container {reason or 'ended'} with exit code {code}"
    if builtin and BASELINE_PASSED_MESSAGE in log_text:
        return "verifier", f"exited {code}: {BASELINE_PASSED_MESSAGE}"
    rewards = [e for e in parse_events(log_text.splitlines()) if e["event"] == "reward"]
    if builtin and len(rewards) == 1 and rewards[0].get("tests_exit") not in (0, None):
        return (
            "verifier",
            f"exited {code}: the patched code failed its tests (tests_exit {rewards[0]['tests_exit']})",
        )
    return "episode", with_traceback(f"exited {code}", log_text)


def pod_index(pod: dict) -> int | None:
    """The pod's episode index in the run: its completion index, which in a Job of several (one per
    image) is its Job's own and names the run-wide index through EPISODE_INDEXES_ANNOTATION."""
    annotations = pod["metadata"].get("annotations") or {}
    try:
        index = int(annotations.get(COMPLETION_INDEX_ANNOTATION, ""))
    except ValueError:
        return None
    if EPISODE_INDEXES_ANNOTATION not in annotations:
        return index
    indexes = sorted(index_list(annotations[EPISODE_INDEXES_ANNOTATION]))
    return indexes[index] if 0 <= index < len(indexes) else None


def attempts_recorded(pod: dict) -> int:
    """This pod's attempt number as the Job controller counts it: 1 + the index's earlier failures."""
    annotations = pod["metadata"].get("annotations") or {}
    total = 1
    for key in (INDEX_FAILURE_COUNT_ANNOTATION, INDEX_IGNORED_FAILURE_COUNT_ANNOTATION):
        try:
            total += max(0, int(annotations.get(key, "0")))
        except ValueError:
            pass
    return total


REWARD_ROW_FIELDS = (
    "index",
    "task_id",
    "image",
    "group",
    "pod",
    "attempts",
    "reward",
    "failure_class",
    "valid",
    "failure",
    "node",
    "pod_to_ready_seconds",
    "batch_to_ready_seconds",
    "batch_to_reward_seconds",
    "episode_seconds",
    "evidence",
    "earlier_attempts",
)


def reward_valid(failure_class: str | None) -> bool:
    """Whether a trainer may learn from the line: the agent's own outcome (a success, or the episode's
    own failure) is; a loss to the infrastructure, the verifier or a cancellation is masked."""
    return failure_class in VALID_CLASSES


def pods_by_index(pods: Iterable[dict], count: int) -> dict[int, list[dict]]:
    """Each completion index's pods (its attempts), oldest first."""
    by_index: dict[int, list[dict]] = {}
    for pod in pods:
        index = pod_index(pod)
        if index is not None and 0 <= index < count:
            by_index.setdefault(index, []).append(pod)
    for attempts in by_index.values():
        attempts.sort(
            key=lambda p: (
                parse_time(p["metadata"].get("creationTimestamp")) or 0.0,
                attempts_recorded(p),
                pod_name(p),
            )
        )
    return by_index


def episode_rows(
    count: int,
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    builtin: bool,
    task_ids: Sequence[Any] | None,
    group_size: int,
    events: Sequence[EventRecord] = (),
    images: Sequence[str | None] | None = None,
) -> list[dict]:
    """One row per episode (completion index), its final attempt's outcome; pure.

    Every index has a row, an episode whose pod was never created included.
    """
    warnings = pod_warnings(events)
    by_index = pods_by_index(pods, count)
    return [
        episode_row(
            index,
            by_index.get(index, []),
            job,
            logs,
            builtin,
            task_ids,
            group_size,
            warnings,
            images,
        )
        for index in range(count)
    ]


def group_images(settings: Settings) -> list[str]:
    """The image of each group of episodes (a task's; without tasks, each episode's)."""
    return list(settings.task_images or [settings.image] * settings.count)


def episode_row(
    index: int,
    attempts: Sequence[dict],
    job: dict,
    logs: dict[str, str],
    builtin: bool,
    task_ids: Sequence[Any] | None,
    group_size: int,
    warnings: dict[str, list[str]] | None = None,
    images: Sequence[str | None] | None = None,
) -> dict:
    """The row of one episode from its attempts (oldest first); pure. The final attempt is the pod
    that succeeded, else the newest one. `images`: each group's image (group_images)."""
    # Unknown, the batch's times are unknown: never counted from 1970.
    job_created = parse_time(job["metadata"].get("creationTimestamp"))
    group = index // group_size
    row: dict[str, Any] = {"index": index, "task_id": task_ids[group] if task_ids else None}
    if images is not None:
        row["image"] = images[group] if group < len(images) else None
    row["group"] = group
    if not attempts:
        row.update(never_created(job, index))
        return row
    outcomes = [
        (
            pod,
            *classify_attempt(
                pod,
                logs.get(pod_name(pod), ""),
                job,
                builtin,
                (warnings or {}).get(pod_name(pod), ()),
            ),
        )
        for pod in attempts
    ]
    final = next((o for o in outcomes if o[1] is None), outcomes[-1])
    row.update(final_attempt(final, outcomes, len(attempts), job_created, logs))
    return row


def never_created(job: dict, index: int | None = None) -> dict[str, Any]:
    """The outcome of an episode with no pod to read: cancelled, or stopped by the Job's end; or,
    when the Job counts its index as done, a pod that is gone (deleted before its outcome was
    read: a client that was not following, a suspension): what it did cannot be verified."""
    counted = next(
        (
            word
            for field, word in (("completedIndexes", "succeeded"), ("failedIndexes", "failed"))
            if index is not None and index in run_wide_indexes(job, field)
        ),
        None,
    )
    if counted is not None:
        return {
            "pod": None,
            "attempts": None,
            "reward": None,
            "failure_class": "infrastructure",
            "valid": False,
            "failure": f"cannot verify: the Job counts this episode {counted}, but its pod is "
            f"gone (deleted before its outcome was read), its log and reward with it",
            "evidence": "job.json",
        }
    if job_cut_short(job):
        failure_class = CANCELLED
        failure = f"cancelled: {cut_short_by(job)} was met before this episode's pod was created"
    else:
        failure_class = "infrastructure"
        failure = (
            f"never started: the Job ended ({job_end_reason(job) or 'unfinished'}) before "
            f"it created this episode's pod"
        )
    return {
        "pod": None,
        "attempts": 0,
        "reward": None,
        "failure_class": failure_class,
        "valid": False,
        "failure": failure,
        "evidence": "job.json",
    }


def final_attempt(
    final: tuple[dict, str | None, str | None],
    outcomes: Sequence[tuple[dict, str | None, str | None]],
    attempts: int,
    job_created: float | None,
    logs: dict[str, str],
) -> dict[str, Any]:
    """An episode's outcome from its final attempt, (pod, failure class, why): its reward and
    times as its worker reported them, and its other attempts' outcomes."""
    pod, failure_class, failure = final
    name = pod_name(pod)
    worker_events = parse_events(logs.get(name, "").splitlines())
    ready = next((e for e in worker_events if e["event"] == "ready"), {})
    reward = next((e for e in worker_events if e["event"] == "reward"), {})
    created = parse_time(pod["metadata"].get("creationTimestamp"))
    fields = {
        "pod": name,
        "attempts": max(attempts, attempts_recorded(pod)),
        "reward": reward.get("reward"),
        "failure_class": failure_class,
        "valid": reward_valid(failure_class),
        "failure": failure,
        "node": (pod.get("spec") or {}).get("nodeName"),
        "pod_to_ready_seconds": seconds_between(ready.get("at"), created),
        "batch_to_ready_seconds": seconds_between(ready.get("at"), job_created),
        "batch_to_reward_seconds": seconds_between(reward.get("at"), job_created),
        "episode_seconds": seconds_between(
            reward.get("at"), ready.get("at") if "at" in ready else None
        ),
        "evidence": f"{name}.log" if failure_class else None,
        "earlier_attempts": [
            {"pod": pod_name(p), "failure_class": c, "failure": f}
            for p, c, f in outcomes
            if p is not pod
        ],
    }
    for key, value in reward.items():
        if key in ("event", "reward"):
            continue
        fields[key if key not in REWARD_ROW_FIELDS else f"episode_{key}"] = value
    return fields


def seconds_between(later: Any, earlier: float | None) -> float | None:
    """The seconds from `earlier` to `later`, as a row shows them; None unless both are times."""
    ok = isinstance(later, (int, float)) and not isinstance(later, bool) and earlier is not None
    return rounded(later - earlier) if ok else None


def batch_job_whole(job: dict | None, count: int) -> bool:
    """Whether the batch's Job as seen so far is the whole batch's: every one of its Jobs seen (one
    per image: merged, their completions add up to the batch's `count`). Until then the batch's
    origin, its first Job's creation, may be unknown, and no episode's times can be counted."""
    spec = (job or {}).get("spec") or {}
    created = ((job or {}).get("metadata") or {}).get("creationTimestamp")
    return bool(created) and spec.get("completions") == count


def failure_settled(job: dict | None, index: int) -> bool:
    """The Job will not run this index again: it counts it among its failed indexes, or it has
    ended (or is ending: FailureTarget, SuccessCriteriaMet)."""
    status = (job or {}).get("status") or {}
    if cancelled_by_tool(job or {}):  # stopped by the tool (--need-groups): nothing more will run
        return True
    if any(
        condition_true(job or {}, kind)
        for kind in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")
    ):
        return True
    return index in index_list(status.get("failedIndexes") or "")


def settled_attempt(
    attempts: Sequence[dict], job: dict | None, index: int, logs: dict[str, str], may_retry: bool
) -> bool:
    """Whether an episode's outcome is final, from what was seen so far; pure.

    Its attempt that succeeded, else its newest, has ended and every attempt's log is read
    (`logs`: those read after their container ended). A success is final at once; a failure
    once the Job will not retry it: without retries at once, else when the Job says so
    (failure_settled). A failed pod being deleted waits for the Job's word too: whether the
    Job's end (or --need) stopped it, or something else did, decides its class.
    """
    if not attempts:
        return False
    final = next(
        (p for p in attempts if (p.get("status") or {}).get("phase") == "Succeeded"), attempts[-1]
    )
    phase = (final.get("status") or {}).get("phase")
    if phase not in ("Succeeded", "Failed") or any(pod_name(p) not in logs for p in attempts):
        return False
    if phase == "Succeeded":
        return True
    if may_retry or final["metadata"].get("deletionTimestamp"):
        return failure_settled(job, index)
    return True


class Delivery(NamedTuple):
    """One line of rewards.jsonl as it was written: when (the client's wall clock), and between which
    moments its episode's container ended (None where nothing bounds it)."""

    index: int  # type: ignore[assignment]  # the episode's, not tuple.index()
    success: bool
    written_at: float
    ended_after: float | None  # its reward event, or the start of its container's finishedAt second
    ended_before: (
        float | None
    )  # the end of that second, or the client's watch seeing it, the earlier
    streamed: bool  # written while the batch ran, not from the evidence read after its end
    seen_at: float | None = None  # the client's watch seeing the container terminated

    def saved(self) -> list:
        return list(self)


def container_end_bounds(
    pod: dict | None, log_text: str, seen_terminated: float | None
) -> tuple[float | None, float | None]:
    """Between which moments a pod's episode container ended: after its reward event (the episode's
    last act) and within its finishedAt second, before the client's watch saw it terminated."""
    if pod is None:
        return None, None
    terminated = container_terminated(pod) or {}
    finished = parse_time(terminated.get("finishedAt"))
    reward = next((e for e in parse_events(log_text.splitlines()) if e["event"] == "reward"), {})
    after = [t for t in (worker_time(reward.get("at")), finished) if t is not None]
    before = [
        t
        for t in (None if finished is None else finished + WHOLE_SECOND, seen_terminated)
        if t is not None
    ]
    return (max(after) if after else None), (min(before) if before else None)


def delivery_figures(
    deliveries: Sequence[Delivery],
    origin: float | None,
    origin_slack: float | None,
    need: int | None,
) -> dict:
    """When the rewards reached rewards.jsonl: the first (and with --need the K-th) success from the
    Job's creation, and each line's lag from its container's end; pure."""
    successes = sorted(d.written_at for d in deliveries if d.success)
    lags = [d.written_at - d.ended_after for d in deliveries if d.ended_after is not None]
    # The client's own part: from its watch seeing the container's end to the line written.
    own = [d.written_at - d.seen_at for d in deliveries if d.seen_at is not None]
    widths = [
        max(0.0, d.ended_before - d.ended_after)
        for d in deliveries
        if d.ended_after is not None and d.ended_before is not None
    ]

    def since_origin(moment: float | None) -> float | None:
        return None if moment is None or origin is None else rounded(moment - origin)

    figures: dict[str, Any] = {
        "first_reward_seconds": since_origin(successes[0] if successes else None),
        "reward_delivery_lag_p50_seconds": rounded(percentile(lags, 0.50)) if lags else None,
        "reward_delivery_lag_p99_seconds": rounded(percentile(lags, 0.99)) if lags else None,
        "reward_delivery_lag_max_seconds": rounded(max(lags)) if lags else None,
        "reward_delivery": {
            "lines": len(deliveries),
            "streamed": sum(1 for d in deliveries if d.streamed),
            "written_after_the_end": sum(1 for d in deliveries if not d.streamed),
            "lag_samples": len(lags),
            "seen_to_written_p50_seconds": rounded(percentile(own, 0.50)) if own else None,
            "seen_to_written_p99_seconds": rounded(percentile(own, 0.99)) if own else None,
            "lag_from": "the earliest moment the episode's container can have ended (its reward event, "
            "else its finishedAt second) to its line written to rewards.jsonl",
            "lag_precision_seconds": rounded(max(widths)) if widths else None,
            "times_from": "the Job's creation, as the start of the client's create call (up to "
            "origin_precision_seconds early)",
            "origin_precision_seconds": rounded(origin_slack) if origin_slack is not None else None,
        },
    }
    if need is not None:
        figures["kth_reward_seconds"] = since_origin(
            successes[need - 1] if len(successes) >= need else None
        )
    return figures


def rewards_jsonl(rows: Iterable[dict]) -> str:
    """rewards.jsonl: one JSON object per episode, in index order."""
    return "".join(json.dumps(row, sort_keys=False) + "\n" for row in rows)


def is_failure(row: dict) -> bool:
    """A failed episode: neither a success nor cancelled once --need was met."""
    return row["failure_class"] not in (None, CANCELLED)


def is_loss(row: dict) -> bool:
    """An episode lost to the infrastructure or the verifier: a failure whose line a trainer masks,
    the only kind --allow-failures counts. The episode's own failure is a sample, not a loss."""
    return is_failure(row) and row["failure_class"] not in VALID_CLASSES


def failure_counts(classes: Iterable[str | None]) -> dict[str, int]:
    """Failures by class; successes and cancelled episodes are no failures."""
    counts = {kind: 0 for kind in FAILURE_CLASSES}
    for kind in classes:
        if kind in counts:
            counts[kind] += 1
    return counts


def attempt_figures(rows: Sequence[dict]) -> dict:
    """First attempts and final outcomes counted apart: what retries bought."""
    first = [
        (
            row["earlier_attempts"][0]["failure_class"]
            if row.get("earlier_attempts")
            else row["failure_class"]
        )
        for row in rows
    ]
    final = [row["failure_class"] for row in rows]
    return {
        # An episode whose pod is gone (never_created) has attempts unknown: None, not counted.
        "attempts_total": sum(row["attempts"] or 0 for row in rows),
        "episodes_retried": sum(1 for row in rows if (row["attempts"] or 0) > 1),
        "first_attempt": {"succeeded": first.count(None), "failed": failure_counts(first)},
        "final": {
            "succeeded": final.count(None),
            "failed": failure_counts(final),
            "cancelled": final.count(CANCELLED),
        },
    }


def group_figures(rows: Sequence[dict], group_size: int) -> list[dict]:
    """Per group of G episodes sharing a task: complete or not, time until all G rewards are in
    (from the Job's creation), and the spread between its fastest and slowest reward."""
    groups = []
    for start in range(0, len(rows), group_size):
        members = rows[start : start + group_size]
        done = [
            row["batch_to_reward_seconds"]
            for row in members
            if row["failure_class"] is None and row["batch_to_reward_seconds"] is not None
        ]
        complete = len(done) == len(members)
        rewards = [row["reward"] for row in members if row["failure_class"] is None]
        groups.append(
            {
                "group": members[0]["group"],
                "task_id": members[0]["task_id"],
                "episodes": len(members),
                "rewards_in": len(done),
                "complete": complete,
                "all_rewards_seconds": max(done) if complete else None,
                "spread_seconds": rounded(max(done) - min(done)) if done else None,
                "reward_mean": rounded(sum(rewards) / len(rewards), 6)
                if rewards and all(isinstance(r, (int, float)) for r in rewards)
                else None,
            }
        )
    return groups


def censored_pod_to_ready(rows: Sequence[dict], job: dict, pods: Sequence[dict]) -> dict:
    """pod_to_ready over every episode: one that never became ready counts as ready at the Job's
    deadline (Job start + activeDeadlineSeconds, minus its pod's creation), so a slow tail of
    failures raises the percentiles instead of vanishing from them."""
    start = parse_time((job.get("status") or {}).get("startTime")) or parse_time(
        job["metadata"].get("creationTimestamp")
    )
    deadline = (start or 0.0) + ((job.get("spec") or {}).get("activeDeadlineSeconds") or 0)
    created = {pod_name(p): parse_time(p["metadata"].get("creationTimestamp")) for p in pods}
    values, censored = [], 0
    for row in rows:
        if row["failure_class"] == CANCELLED:
            continue  # stopped by the Job once --need was met: never late, just not needed
        if row.get("pod_to_ready_seconds") is not None:
            values.append(row["pod_to_ready_seconds"])
            continue
        censored += 1
        pod_created = created.get(row["pod"]) if row["pod"] else None
        values.append(deadline - (pod_created if pod_created is not None else (start or 0.0)))
    return {
        "p50": rounded(percentile(values, 0.50)),
        "p95": rounded(percentile(values, 0.95)),
        "max": rounded(max(values)),
        "samples": len(values),
        "censored": censored,
        "censored_at": "the Job's deadline: startTime + activeDeadlineSeconds - the pod's creation "
        "(the Job's start for an episode without a pod)",
    }


# --------------------------------------------------------------------------
# src/rl_batch_demo/summary.py: The batch's summary: throughput, slots, each episode's draft, the events' index,

class EventStore:
    """A namespace's events as a watch delivers them: a pure reducer of the watch's changes.

    Each event is held as its EventRecord (the fields this tool reads) for the summary, and its
    whole last version is kept on disk for events.json, so a batch of thousands of
    pods holds its tens of thousands of events in little memory.
    """

    def __init__(
        self,
        spool_dir: str | None = None,
        shared: SharedStrings | None = None,
        index: EventIndex | None = None,
    ) -> None:
        self.records: dict[str, EventRecord] = {}
        self._spool = Spool(spool_dir, "events.json")
        self._shared = shared or SharedStrings()
        # What the summary reads of the events held, kept up to date with them.
        self.index = index or EventIndex(self._shared)
        # The revision the events are known to be at least as new as, once a list has said so.
        self.resource_version: str | None = None

    def __len__(self) -> int:
        return len(self.records)

    def apply(self, change: str, event: dict) -> EventRecord | None:
        """One change a watch delivered: ADDED or MODIFIED keeps the event's newest version, DELETED
        forgets it. The record now held of it, if any."""
        name = (event.get("metadata") or {}).get("name")
        if not name:
            return None
        held = self.records.get(name)
        if change == "DELETED":
            if self.records.pop(name, None) is not None:
                self.index.changed()
            self._spool.forget(name)
            return None
        self._spool.put(name, json.dumps(event))
        record = self.records[name] = self._shared.share(event_record(event))
        if held is None:
            self.index.add(record)
        elif held != record:  # not an event told again as it was (a watch's restart lists all)
            self.index.replace(held, record)  # the drafts read the newest
        return record

    def forget_shared(self) -> None:
        self._shared.table.clear()

    def events(self, names: Iterable[str] | None = None) -> list[EventRecord]:
        """The events' records in the order a list gives them (by name)."""
        return [self.records[name] for name in sorted(self.records if names is None else names)]

    def whole(self, names: Iterable[str] | None = None) -> Iterator[bytes]:
        """Each event's last version as JSON text (UTF-8), in the order a list gives them."""
        for name in sorted(self.records if names is None else names):
            yield self._spool.get_bytes(name)


# Throughput: how fast the batch went through, from every episode's points.
RAMP_POINTS = ("pod_created", "scheduled", "sandbox_ready", "ready", "reward", "container_finished")


def per_whole_second_peak(moments: Sequence[float]) -> int:
    """The most moments that fall in one whole second (Kubernetes' own grain)."""
    return max(collections.Counter(map(math.floor, moments)).values(), default=0)


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals open at one moment (an end before a start that ties)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def throughput(batches: Sequence[tuple[str, BatchSummary]]) -> dict:
    """Pods created and sandboxes ready per second, and the most episodes running at once."""
    records = [record for _, summary in batches for record in summary.episodes]
    created = [r["points"]["pod_created"][0] for r in records if r["points"].get("pod_created")]
    sandboxes = [
        r["points"]["sandbox_ready"][0] for r in records if r["points"].get("sandbox_ready")
    ]
    first_job = min((summary.job_created for _, summary in batches), default=None)
    running = []
    for record in records:
        points = record["points"]
        start = (
            points.get("process_started") or points.get("container_started") or points.get("ready")
        )
        ends = [
            p[0] for p in (points.get("reward"), points.get("container_finished")) if p is not None
        ]
        if start is not None and ends:
            running.append((start[0], max(ends)))

    def mean_rate(moments: Sequence[float]) -> float | None:
        if not moments or first_job is None:
            return None
        # Whole-second times: a span shorter than their precision is read as one second.
        return rounded(len(moments) / max(WHOLE_SECOND, max(moments) - first_job), 2)

    return {
        "pods_created_per_second": mean_rate(created),
        "sandboxes_ready_per_second_mean": mean_rate(sandboxes),
        "sandboxes_ready_per_second_peak": per_whole_second_peak(sandboxes) if sandboxes else None,
        "max_episodes_running_at_once": most_at_once(running) if running else None,
        "sandboxes_ready_known": len(sandboxes),
        "note": "means: count / seconds from the first Job's creation to the last such moment (at least 1 s); "
        "peak: the most in one whole second (Kubernetes times are whole seconds); an episode runs "
        "from its process start to the later of its reward and its container's finish",
    }


def pod_row(pod: dict, ready: dict, reward: dict, job_created: float) -> dict:
    """One episode's row in `pods`: its seconds from the whole-second creationTimestamps, as the
    guide computes them."""
    created = parse_time(pod["metadata"]["creationTimestamp"])
    return {
        "pod": pod_name(pod),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "image_id": container_status(pod).get("imageID"),
        "reward": reward.get("reward"),
        "pod_to_ready_seconds": rounded(ready["at"] - created),
        "batch_to_ready_seconds": rounded(ready["at"] - job_created),
        "batch_to_reward_seconds": rounded(reward["at"] - job_created),
    }


def slots_freed(
    episodes: Sequence[tuple[dict, dict, dict]],
    clocks_of: Callable[[dict], EpisodeClocks],
    creations: dict[str, float],
    observed_pods: dict[str, dict],
    job_earliest: float | None,
    parallelism: int,
    replaces_terminating: bool = True,
) -> dict[str, float]:
    """Per pod, the latest moment an earlier pod's end provably freed the slot it was created into:
    each pod's creation bounded by its stamp, its creation event and the watch, each end by its
    reward on the node's clock (corrected, less its slack). Where the Job `replaces_terminating`
    pods (its podReplacementPolicy is not Failed), a pod asked to be deleted freed its slot at
    the request, maybe before its end, and its deletionTimestamp need not name that moment (a
    later, shorter delete moves it): its end is unknown."""
    created_within = {}
    for pod, _, _ in episodes:
        name = pod_name(pod)
        created_within[name] = creation_window(
            pod, job_earliest, creations.get(name), observed_pods.get(name), clocks_of(pod)
        )
    if not slots_may_have_waited(created_within, parallelism):
        return {}  # the ends are read only where some pod may have waited for a slot
    ended_after = {}
    for pod, _, reward in episodes:
        end = end_freeing_slot(pod, reward, clocks_of(pod), replaces_terminating)
        if end is not None:
            ended_after[pod_name(pod)] = end
    return slot_freed_after(created_within, ended_after, parallelism)


def creation_window(
    pod: dict,
    job_earliest: float | None,
    created_event_at: float | None,
    observed: dict | None,
    clocks: EpisodeClocks,
) -> tuple[float, float]:
    """(earliest, latest): the pod was created within its stamp's second, after its Job's
    earliest moment, no later than its creation event and the moment this client's watch saw it."""
    stamp = parse_time(pod["metadata"]["creationTimestamp"])
    assert stamp is not None  # the API server stamps every pod it creates
    seen = ((observed or {}).get("seen") or {}).get("added")
    latest = stamp + WHOLE_SECOND
    if created_event_at is not None:
        latest = min(latest, created_event_at)
    if seen is not None:
        latest = min(latest, seen - clocks.client + clocks.client_slack)
    return max(stamp, job_earliest or stamp), latest


def end_freeing_slot(
    pod: dict, reward: dict, clocks: EpisodeClocks, replaces_terminating: bool
) -> float | None:
    """A moment the pod's end freed its slot after: its reward on its node's clock (corrected,
    less its slack); None when that is unknown (no reward; a pod asked to be deleted, where the
    Job `replaces_terminating` pods, freed its slot at the request)."""
    reward_at = worker_time(reward.get("at"))
    if reward_at is None or (replaces_terminating and pod["metadata"].get("deletionTimestamp")):
        return None
    return reward_at - clocks.node - clocks.node_slack


def job_replaces_terminating(job: dict | None) -> bool:
    """Whether the Job creates a pod's replacement as soon as the pod is asked to be deleted
    (its podReplacementPolicy is not Failed)."""
    return ((job or {}).get("spec") or {}).get("podReplacementPolicy") != "Failed"


def created_after_bound(job_bound: Bound | None, slot: float | None) -> Bound | None:
    """What a pod was created after: its Job's creation, or an earlier pod's end freeing its
    slot, whichever is later."""
    if slot is None:
        return job_bound
    return max(
        [job_bound, lower(slot, "an earlier pod's end freeing its slot", REFERENCE_CLOCK)],
        key=lambda bound: -math.inf if bound is None or bound.lower is None else bound.lower,
    )


class SlotSweep:
    """slot_freed_after kept as the batch runs, for each episode's draft: told each pod as it is
    seen (`created`) and each end as its episode is drafted (`ended`), it says what an ended
    pod was created after (`slot_bound`).

    A pod created after n others came once n - parallelism + 1 of them had ended, all before it
    was created; by its own end those episodes are usually drafted, and any of the n still
    running then ends later than all of them. So the bound known at its end is mostly the one the
    final pass finds from every episode. Where it is not (an earlier episode's log read late, a
    pod failed or deleted after, a clock corrected), the final pass makes that point again: it
    takes a draft only where the two agree.
    """

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self._latest: dict[str, float] = {}  # each pod seen: the latest moment it was created
        self._waiting: list[tuple[float, str]] = []  # a heap: the pods not yet counted
        self._counted_below = -math.inf  # every pod seen created before this moment is counted
        self._counted: list[tuple[float, str]] = []  # (latest, pod), sorted
        self._ends: list[float] = []  # sorted: the known ends of the pods counted
        self._end_of: dict[str, float] = {}
        self._gone: set[str] = set()  # pods no episode of the summary stands for
        # The earliest latest moment of a pod whose end freed its slot at an unknown moment: the
        # summary bounds no pod created after it.
        self._unknown_from = math.inf

    def knows(self, name: str) -> bool:
        return name in self._latest

    def created(self, name: str, latest: float) -> None:
        """A pod seen, and the latest moment it was created (the first one told counts)."""
        if name in self._latest:
            return
        self._latest[name] = latest
        if latest >= self._counted_below:
            heapq.heappush(self._waiting, (latest, name))
            return
        bisect.insort(self._counted, (latest, name))  # seen after a later one was asked about
        if name in self._end_of:
            bisect.insort(self._ends, self._end_of[name])

    def forget(self, name: str) -> None:
        """A pod that is no episode of the summary (it failed, or failed verification): the
        summary counts only its episodes' pods."""
        if name in self._gone or name not in self._latest:
            return
        self._gone.add(name)
        latest = self._latest[name]
        if latest >= self._counted_below:
            return  # still waiting: left out as it would be counted
        del self._counted[bisect.bisect_left(self._counted, (latest, name))]
        if name in self._end_of:
            del self._ends[bisect.bisect_left(self._ends, self._end_of[name])]

    def end_unknown(self, name: str) -> None:
        """A pod whose end freed its slot at a moment not known (asked to be deleted, where its Job
        replaces terminating pods): no pod created after it is bounded."""
        if name in self._latest:
            self._unknown_from = min(self._unknown_from, self._latest[name])

    def ended(self, name: str, end: float) -> None:
        """A moment the pod's end freed its slot after (the first one told counts)."""
        if name in self._end_of or name in self._gone:
            return
        self._end_of[name] = end
        latest = self._latest.get(name)
        if latest is not None and latest < self._counted_below:
            bisect.insort(self._ends, end)

    def slot_bound(self, earliest: float) -> float | None:
        """For a pod created no earlier than `earliest`: the moment an earlier pod's end freed
        the slot it was created into, if the ends known say so."""
        if self._unknown_from < earliest:
            return None
        if earliest >= self._counted_below:
            while self._waiting and self._waiting[0][0] < earliest:
                latest, name = heapq.heappop(self._waiting)
                if name in self._gone:
                    continue
                self._counted.append((latest, name))
                if name in self._end_of:
                    bisect.insort(self._ends, self._end_of[name])
            self._counted_below = earliest
            return nth_smallest(self._ends, [], len(self._counted) - self.parallelism)
        # An earlier moment than one asked about before: the pods counted since are left out.
        counted = bisect.bisect_left(self._counted, (earliest, ""))
        later = sorted(self._end_of[n] for _, n in self._counted[counted:] if n in self._end_of)
        return nth_smallest(self._ends, later, counted - self.parallelism)


def nth_smallest(values: list[float], removed: list[float], n: int) -> float | None:
    """The n-th (from 0) smallest of sorted `values` less `removed` (sorted, and some of them),
    found by bisection: copying thousands of values for each pod cost more than its draft."""
    if n < 0 or n >= len(values) - len(removed):
        return None
    low, high = n, n + len(removed)
    while low < high:
        middle = (low + high) // 2
        value = values[middle]
        if bisect.bisect_right(values, value) - bisect.bisect_right(removed, value) > n:
            high = middle
        else:
            low = middle + 1
    return values[low]


def slots_may_have_waited(created_within: dict[str, tuple[float, float]], parallelism: int) -> bool:
    """Whether slot_freed_after can find any pod created after `parallelism` others. With no fewer
    slots than pods, only a pod created after every pod, itself too (its own bounds contradicting
    each other), would be: every pod's latest moment of creation before its earliest one."""
    if parallelism < len(created_within):
        return True
    return bool(created_within) and max(latest for _, latest in created_within.values()) < max(
        earliest for earliest, _ in created_within.values()
    )


@dataclasses.dataclass
class BatchSummary:
    """One batch verified and measured: `figures` are its own figures as results.json saves them
    (BatchOutcome.figures adds how long the client waited); the rest is what the CSV, the
    pictures and the pooling of rounds read, and nothing saves as such."""

    figures: dict[str, Any]
    episodes: list[
        dict
    ]  # per episode: pod, index, points, phases, image_cache, runtime_class, guide_pod_to_ready
    job_created: float  # the Job's creationTimestamp (whole seconds): where every time axis starts
    origin: (
        float  # the earliest moment its Job may have existed, within the second after job_created
    )
    # Accepted failures, each with its points as far as it got, for the timeline to draw:
    # pod (None when it never existed), points, phases, index, failure_class, failure.
    failed: list[dict] = dataclasses.field(default_factory=list)
    # A rollout's successful rewards as they reached rewards.jsonl (the client's wall clock), for ramp.svg.
    deliveries: list[float] = dataclasses.field(default_factory=list)
    drafts_taken: int = 0  # episodes whose points were taken from their drafts, made while waiting
    # Pod -> where its draft's row of episodes.csv is kept, for each episode taken whole from a
    # draft whose row the final evidence leaves as it was made (see episodes_csv_pieces).
    csv_rows: dict[str, Spool] = dataclasses.field(default_factory=dict)
    # Phase -> the seconds of its episodes, sorted: the figures' sample, which cdf.svg draws.
    phase_samples: dict[str, list[float]] = dataclasses.field(default_factory=dict)


# The cycle collector's full passes walk every object held: a batch's pods, events and drafts,
# which hold no cycles and live to the batch's end. Each pass freed nothing and took longer as the
# batch grew (of a 30,000-episode wait, 3.2 s on Python 3.13 and 8.7 s on 3.9). While a batch is
# followed, what is held by then is moved out of its sight this often (gc.freeze, which costs
# nothing), and given back once the batch is summarised, so that a finished batch's own cycles
# (a follower and the readers that call it back) are freed as ever. Only the command line does
# this: it owns its process. A freeze is the whole process's, so in a Python caller's (run_batch,
# stream_batch) it would also hide the caller's own garbage from the collector until the batch
# ended, and the unfreeze would undo a freeze the caller made meanwhile.
SPARE_HELD_SECONDS = 1.0


@contextlib.contextmanager
def held_objects_spared(spare: bool) -> Iterator[None]:
    """While one batch is followed and summarised: gc.unfreeze at its end, whatever its follower
    froze (BatchFollower.spare_held). Nothing when not `spare` (a Python caller's process), nor
    in a process that froze objects of its own: those stay as they are."""
    ours = spare and gc.get_freeze_count() == 0
    try:
        yield
    finally:
        if ours:
            gc.unfreeze()


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Hold Python's cycle collector while the summary builds its many small records: each of its
    passes would walk every pod and event still held, seconds at thousands of episodes, to free
    nothing (the records hold no cycles; reference counts free them)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class EventIndex:
    """What the summary reads of each event, kept as the watch delivers them, so that after the
    end neither the drafts nor the summary read every event again: per pod its Scheduled
    eventTime, its creation event's name time, its kubelet's container events, its first Started,
    its image as found or pulled; per node what its kubelet's events bound its clock by.

    A pure reducer (`add`, `replace`), each event taken as scheduled_event_times,
    pod_creation_events, kubelet_container_events, image_cache_states, image_pulls and
    kubelet_event_clocks take the events of a list in its order. It is `exact` while each event it
    was told is held as told (none deleted since, none changed since but one no reader took
    anything from) and the order they came in decided nothing: no pod had two events of a kind
    where the first or the last one counts, and no kubelet event tied another's moment. Then it
    is what those functions make of the events held, in any order, and the summary takes it
    instead of reading them all.
    """

    def __init__(self, shared: SharedStrings | None = None) -> None:
        self.scheduled: dict[str, float] = {}
        self.creations: dict[str, float] = {}
        self.kubelet: dict[str, dict[str, tuple[float, str]]] = {}
        self.started: dict[str, tuple[float, str]] = {}
        self.cache: dict[str, str] = {}
        self.pulls: dict[str, ImagePull] = {}
        self.nodes: dict[str, ClockBounds] = {}
        self.told = 0  # the events it was told, each once
        self.exact = True
        self._shared = shared or SharedStrings()

    def changed(self) -> None:
        """An event it was told changed or went: the index no longer says what the events held say."""
        self.exact = False

    def add(self, event: EventRecord) -> None:
        """One event, told once. Each reader is asked only of the events it reads (a reason of
        its own, a kubelet's): a few of hundreds of thousands are read by each."""
        self.told += 1
        self._take(event)

    def replace(self, held: EventRecord, event: EventRecord) -> None:
        """A newer version of an event told before. One that no reader took anything from is
        replaced exactly: the recorder's combined event (a Job creating thousands of pods has one,
        its message and count changed with each pod) names no pod, so the index stays exact."""
        if self.reads(held):
            self.changed()
        self._take(event)

    @staticmethod
    def reads(event: EventRecord) -> bool:
        """Whether any reader takes something from this event."""
        return (
            event.reason == "Scheduled"
            or event.component == "kubelet"
            or event.reason in KUBELET_CONTAINER_REASONS
            or bool(pod_creation_events((event,)))
        )

    def _take(self, event: EventRecord) -> None:
        if event.reason == "Scheduled":
            for pod, moment in scheduled_event_times((event,)).items():
                self._last(self.scheduled, pod, moment)
        elif event.reason == "SuccessfulCreate":
            for pod, moment in pod_creation_events((event,)).items():
                # The name read from the event's message: the text its pod's other tables key by.
                self._first(self.creations, self._shared.text(pod), moment)
        if event.component == "kubelet" or event.reason in KUBELET_CONTAINER_REASONS:
            self._add_kubelets(event)

    def _add_kubelets(self, event: EventRecord) -> None:
        """A kubelet's event, or one of a reason its container events have."""
        for pod, reasons in kubelet_container_events((event,)).items():
            known = self.kubelet.get(pod) or {}
            for reason, named in reasons.items():
                if reason in known and named[0] == known[reason][0] and named != known[reason]:
                    self.exact = False  # a tie: the first in the list's order would be kept
            earlier = {
                reason: named
                for reason, named in reasons.items()
                if reason not in known or named[0] < known[reason][0]
            }
            if earlier or pod not in self.kubelet:
                # A new dict, never one changed in place: a draft holds the one it was made from.
                self.kubelet[pod] = {**known, **earlier}
        nodes, started = kubelet_event_clocks((event,))
        for node, bounds in nodes.items():
            held = self.nodes.setdefault(node, ClockBounds())
            if bounds.lowest is not None:
                held.at_least(bounds.lowest)
        for pod, named in started.items():
            # The kubelet index's own record of the same Started event, where it is one.
            indexed = (self.kubelet.get(pod) or {}).get("Started")
            self._first(self.started, pod, indexed if indexed == named else named)
        if event.reason != "Pulled":
            return
        for pod, state in image_cache_states((event,)).items():
            if state == "present" or pod not in self.cache:
                self.cache[pod] = state
        for pod, pull in image_pulls((event,)).items():
            self._first(self.pulls, pod, pull)

    def _first(self, table: dict, key: str, value: Any) -> None:
        """The first value told counts (as the first in a list's order would)."""
        if key in table:
            self.exact = self.exact and table[key] == value
            return
        table[key] = value

    def _last(self, table: dict, key: str, value: Any) -> None:
        """The last value told counts (as the last in a list's order would)."""
        if key in table and table[key] != value:
            self.exact = False
        table[key] = value


class EpisodeDrafts:
    """Each episode summarised the moment it ends (its pod final, its log read), while the batch
    still runs: what the summary after the end takes as it is when the final evidence agrees.

    A pure reducer, as BatchState is: told each pod as it is seen (`saw`) and each ended episode
    (`draft`), it reads what the events said of its pod so far from `index` (which the follower's
    EventStore keeps up to date). A draft assumes the clocks agree, and takes the slot an earlier
    pod's end freed for it as the ends known then say (`slots`): the final pass makes again only
    the points whose inputs the final clocks and evidence change.
    """

    def __init__(
        self, builtin: bool, shared: SharedStrings | None = None, spool_dir: str | None = None
    ) -> None:
        self.builtin = builtin
        self.drafts: dict[str, EpisodeDraft] = {}
        # Each draft's row of episodes.csv (but its batch, pod and index), made as it ends: at
        # 100,000 episodes the rows took 4 s to make after the end, and take megabytes to hold.
        self.csv = Spool(spool_dir, "episodes.csv")
        # The follower's one table of shared texts: a pod's name, its node, its uid are the same
        # objects in its pod, its events, its drafts and every index of them.
        self.shared = shared or SharedStrings()
        self.index = EventIndex(self.shared)
        self._job_bound: Bound | None = None
        # Where the Job runs fewer pods at once than it has, the slots its pods were created into.
        self.slots: SlotSweep | None = None

    def saw(self, pod: dict, job: dict | None, observed: dict | None) -> None:
        """A pod of the batch seen (any version of it), for the slots later pods are created into."""
        if self.slots is None:
            spec = (job or {}).get("spec") or {}
            parallelism = int(spec.get("parallelism") or 1)
            if job is None or parallelism >= int(spec.get("completions") or 1):
                return
            self.slots = SlotSweep(parallelism)
        name = self.shared.text(pod_name(pod))
        if not self.slots.knows(name):
            _, latest = creation_window(
                pod, None, self.index.creations.get(name), observed, CLOCKS_AGREE
            )
            self.slots.created(name, latest)
        if (pod.get("status") or {}).get("phase") == "Failed":
            self.slots.forget(name)
        elif pod["metadata"].get("deletionTimestamp") and job_replaces_terminating(job):
            self.slots.end_unknown(name)

    def draft(
        self,
        pod: dict,
        log_text: str,
        job: dict | None,
        job_observed: dict[str, float],
        observed: dict | None,
    ) -> None:
        """Summarise one ended episode now; one that fails verification is left to the final pass,
        which says why."""
        name = self.shared.text(pod_name(pod))
        job_created = parse_time(((job or {}).get("metadata") or {}).get("creationTimestamp"))
        if job_created is None or (pod.get("status") or {}).get("phase") != "Succeeded":
            return
        assert job is not None  # it has a creationTimestamp
        inputs = self.inputs(name, pod, job, job_observed, observed)
        known = self.drafts.get(name)
        if known is not None and drafted_already(known, pod, log_text, job_created, inputs):
            # The ended pod's next version (the Job controller counted it): the same episode,
            # drafted already. Its draft now holds this version, which the summary will be given.
            self.drafts[name] = known._replace(pod=pod)
            return
        try:
            ready, reward = verify_episode(
                pod, parse_events(log_text.splitlines()), job_created, self.builtin
            )
        except VerificationError:
            self.drafts.pop(name, None)
            if self.slots is not None:
                self.slots.forget(name)
            return
        if self.slots is not None:
            end = end_freeing_slot(pod, reward, CLOCKS_AGREE, job_replaces_terminating(job))
            if end is not None:
                self.slots.ended(name, end)
        self.drafts[name] = made_draft(self, pod, log_text, job_created, ready, reward, inputs)

    def inputs(
        self, name: str, pod: dict, job: dict, job_observed: dict[str, float], observed: dict | None
    ) -> EpisodeInputs:
        """What an ended episode's points are made from, as the events and the slots say so far."""
        earliest = job_creation(job, job_observed, 0.0, 0.0).earliest
        job_bound = lower(earliest, "the Job's creation", REFERENCE_CLOCK)
        if job_bound != self._job_bound:  # the batch's drafts share one
            self._job_bound = job_bound
        index = self.index
        slot = None
        if self.slots is not None:
            window = creation_window(
                pod, earliest, index.creations.get(name), observed, CLOCKS_AGREE
            )
            slot = self.slots.slot_bound(window[0])
        return EpisodeInputs(
            index.scheduled.get(name),
            observed,  # the watch's record as it is now: a later sight makes a new one
            index.kubelet.get(name),  # replaced, never changed, by a later event
            index.creations.get(name),
            CLOCKS_AGREE,
            created_after_bound(self._job_bound, slot),
        )


def drafted_already(
    known: EpisodeDraft, pod: dict, log_text: str, job_created: float, inputs: EpisodeInputs
) -> bool:
    """Whether `known` is this very episode's draft: the same log, Job and inputs, its pod the
    same but for what the Job controller changes in an ended pod."""
    return (
        known.log_text is log_text
        and known.job_created == job_created
        and known.inputs == inputs
        and same_but_bookkeeping(known.pod, pod)
    )


def made_draft(
    drafts: EpisodeDrafts,
    pod: dict,
    log_text: str,
    job_created: float,
    ready: dict,
    reward: dict,
    inputs: EpisodeInputs,
) -> EpisodeDraft:
    """A verified episode's draft, its row of episodes.csv put in the drafts' spool."""
    name = drafts.shared.text(pod_name(pod))
    # Thousands of drafts repeat their field names, sources, nodes and the worker's words.
    share = drafts.shared.texts
    points = share(episode_points(pod, ready, reward, *inputs))
    phases = phase_durations(points)
    row = share(pod_row(pod, ready, reward, job_created))
    cache, pull = drafts.index.cache.get(name), drafts.index.pulls.get(name)
    record = {
        "points": points,
        "phases": phases,
        "image_cache": cache,
        "runtime_class": (pod.get("spec") or {}).get("runtimeClassName"),
        "image": container_image(pod),
        "image_pull": pull,
    }
    drafts.csv.put(name, csv_text(episode_csv_fields(row, record, job_created)))
    return EpisodeDraft(
        pod,
        log_text,
        job_created,
        drafts.builtin,
        summarised_fields(ready, READY_FIELDS_SUMMARISED),
        summarised_fields(reward, REWARD_FIELDS_SUMMARISED),
        row,
        inputs,
        points,
        phases,
        drafts.csv,
        cache,
        pull,
    )


# What the Job controller changes in an ended pod once it has counted it (its tracking finalizer
# removed): nothing an episode's verification, points or row read.
POD_BOOKKEEPING = ("resourceVersion", "finalizers", "managedFields")


def same_but_bookkeeping(earlier: dict, later: dict) -> bool:
    """Two versions of a pod that differ at most in POD_BOOKKEEPING."""
    if earlier.keys() != later.keys():
        return False
    for key, value in later.items():
        if key != "metadata":
            if earlier[key] != value:
                return False
            continue
        before, after = earlier[key], value
        if not isinstance(before, dict) or not isinstance(after, dict):
            if before != after:
                return False
            continue
        if {field: item for field, item in before.items() if field not in POD_BOOKKEEPING} != {
            field: item for field, item in after.items() if field not in POD_BOOKKEEPING
        }:
            return False
    return True


# What the summary reads of an episode's verified ready and reward events (its points, its row):
# a draft holds these alone, not the worker's other words.
READY_FIELDS_SUMMARISED = ("at", "process_started_at", "imports_done_at")

REWARD_FIELDS_SUMMARISED = ("at", "reward")


def summarised_fields(event: dict, fields: Sequence[str]) -> dict:
    """The fields of a worker's event the summary reads, those it has."""
    return {field: event[field] for field in fields if field in event}


class EventTables(NamedTuple):
    """What the batch's events say of each pod (by name), and what its kubelets' events bound
    each node's clock by, as the summary reads them."""

    scheduled: dict[str, float]  # its Scheduled eventTime
    cache: dict[str, str]  # its image, found present or pulled
    pulls: dict[str, ImagePull]  # what the kubelet said of its image's pull
    kubelet: dict[str, dict[str, tuple[float, str]]]  # its kubelet's container events
    creations: dict[str, float]  # its creation event's name time
    kubelet_clocks: tuple[dict[str, ClockBounds], dict[str, tuple[float, str]]]


def event_tables(events: Sequence[EventRecord], index: EventIndex | None) -> EventTables:
    """The events' tables: the watch's `index` where it is exact and of these very events, else
    the events read again."""
    if index is not None and index.exact and index.told == len(events):
        # Copies of the node bounds: clock_offsets adds the pods' bounds to them.
        nodes = {node: bounds.copy() for node, bounds in index.nodes.items()}
        return EventTables(
            index.scheduled,
            index.cache,
            index.pulls,
            index.kubelet,
            index.creations,
            (nodes, index.started),
        )
    return EventTables(
        scheduled_event_times(events),
        image_cache_states(events),
        image_pulls(events),
        kubelet_container_events(events),
        pod_creation_events(events),
        kubelet_event_clocks(events),
    )


def episode_clocks(clocks: dict) -> Callable[[dict], EpisodeClocks]:
    """Each pod's clocks, the client's and its node's corrections (each node's made once, not each
    pod's: its pods share them)."""
    client = clocks["client"]
    client_only = EpisodeClocks(client["offset_seconds"], client["correction_slack_seconds"])
    node_clocks = {
        node: client_only._replace(
            node=entry.get("offset_seconds") or 0.0,
            node_slack=entry.get("correction_slack_seconds") or 0.0,
        )
        for node, entry in clocks["nodes"].items()
        if entry
    }

    def clocks_of(pod: dict) -> EpisodeClocks:
        return node_clocks.get((pod.get("spec") or {}).get("nodeName") or "", client_only)

    return clocks_of


class BatchSources(NamedTuple):
    """What each episode of a batch is placed from besides its pod and log."""

    job_created: float  # the Job's creationTimestamp: where every time axis starts
    job_point: Point  # when the Job was truly created (job_creation)
    clocks: dict  # each clock's offset from the control plane's (clock_offsets)
    clocks_of: Callable[[dict], EpisodeClocks]  # a pod's clocks (episode_clocks)
    tables: EventTables
    observed_pods: dict[str, dict]  # what the watch saw of each pod, when
    job_bound: Bound | None  # the Job's creation, which every pod's follows
    slots: dict[str, float]  # pod -> when an earlier pod's end freed the slot it was created into

    def inputs(self, pod: dict) -> EpisodeInputs:
        """What an episode's points are made from, besides its pod and log."""
        name = pod_name(pod)
        return EpisodeInputs(
            self.tables.scheduled.get(name),
            self.observed_pods.get(name),
            self.tables.kubelet.get(name),
            self.tables.creations.get(name),
            self.clocks_of(pod),
            created_after_bound(self.job_bound, self.slots.get(name)),
        )


def batch_sources(
    job: dict,
    pods: Sequence[dict],
    count: int,
    episodes: Sequence[tuple[dict, dict, dict]],
    events: Sequence[EventRecord],
    observed: dict[str, dict] | None,
    index: EventIndex | None,
) -> BatchSources:
    """The events' tables, the clocks, the Job's creation and the slots (slots_freed, when every
    episode's pod is known) of a verified batch."""
    job_created = parse_time(job["metadata"]["creationTimestamp"])
    assert job_created is not None  # verify_batch checked it
    tables = event_tables(events, index)
    observed_pods, job_observed = split_observed(observed)
    clocks = clock_offsets(
        job,
        pods,
        events,
        observed_pods,
        job_observed,
        tables.kubelet,
        tables.scheduled,
        tables.kubelet_clocks,
    )
    client = clocks["client"]
    job_point = job_creation(
        job, job_observed, client["offset_seconds"], client["correction_slack_seconds"]
    )
    clocks_of = episode_clocks(clocks)
    slots = (
        slots_freed(
            episodes,
            clocks_of,
            tables.creations,
            observed_pods,
            job_point.earliest,
            int((job.get("spec") or {}).get("parallelism") or 1),
            job_replaces_terminating(job),
        )
        if len(pods) == count
        else {}
    )
    job_bound = lower(job_point.earliest, "the Job's creation", REFERENCE_CLOCK)
    return BatchSources(
        job_created, job_point, clocks, clocks_of, tables, observed_pods, job_bound, slots
    )


class SummarisedEpisode(NamedTuple):
    """One verified episode as the summary has it."""

    row: dict  # its row of `pods` in results.json
    record: dict  # what the CSV and the pictures read (BatchSummary.episodes)
    drafted: bool  # its points taken from its draft
    csv_row: Spool | None  # where its draft's row of episodes.csv is kept, if that row holds


def summarised_episode(
    sources: BatchSources, pod: dict, ready: dict, reward: dict, draft: EpisodeDraft | None
) -> SummarisedEpisode:
    """One verified episode's row and record: its draft's where the draft was made from these
    final inputs, else made again."""
    name, inputs = pod_name(pod), sources.inputs(pod)
    drafted = None if draft is None else draft.points_for(pod, ready, inputs)
    csv_row = None
    if drafted is not None and draft is not None:
        points, phases = drafted
        row = (
            draft.row
            if draft.job_created == sources.job_created
            else pod_row(pod, ready, reward, sources.job_created)
        )
        if (
            draft.csv is not None
            and points is draft.points
            and row is draft.row
            and sources.tables.cache.get(name) == draft.image_cache
            and sources.tables.pulls.get(name) == draft.image_pull
        ):
            csv_row = draft.csv  # its row of episodes.csv is made already
    else:
        points = episode_points(pod, ready, reward, *inputs)
        phases = phase_durations(points)
        row = pod_row(pod, ready, reward, sources.job_created)
    record = episode_record(pod, ready, points, phases, sources.tables)
    return SummarisedEpisode(row, record, drafted is not None, csv_row)


def episode_record(
    pod: dict,
    ready: dict,
    points: dict[str, Point | None],
    phases: dict[str, tuple[float, float] | None],
    tables: EventTables,
) -> dict:
    """A verified episode's record: its points and phases, its image and how it was found."""
    name = pod_name(pod)
    created = parse_time(pod["metadata"]["creationTimestamp"])
    return {
        "pod": name,
        "points": points,
        "phases": phases,
        "image_cache": tables.cache.get(name),
        "runtime_class": (pod.get("spec") or {}).get("runtimeClassName"),
        "index": None if pod_index(pod) is None else str(pod_index(pod)),
        "image": container_image(pod),
        "image_pull": tables.pulls.get(name),
        "guide_pod_to_ready": ready["at"] - created,
    }


def failed_record(
    sources: BatchSources, logs: dict[str, str], failed_pod: dict | None, row: dict
) -> dict:
    """An accepted failure's record for the timeline: its points as far as it got (none when its
    pod never existed)."""
    points: dict[str, Point | None] = {point: None for point in POINTS}
    if failed_pod is not None:
        name = pod_name(failed_pod)
        log_events = parse_events(logs.get(name, "").splitlines())
        ready, reward = (
            next((e for e in log_events if e["event"] == kind), {}) for kind in ("ready", "reward")
        )
        # Placed after the Job's creation alone: the slots are those of the verified episodes.
        inputs = sources.inputs(failed_pod)._replace(created_after=sources.job_bound)
        points = episode_points(failed_pod, ready, reward, *inputs)
    return {
        "pod": row["pod"],
        "points": points,
        "phases": phase_durations(points),
        "index": row["index"],
        "failure_class": row["failure_class"],
        "failure": row["failure"],
        # What its row of episodes.csv says beside its points.
        "task_id": row.get("task_id"),
        "valid": row.get("valid"),
        "node": row.get("node"),
        "reward": row.get("reward"),
        "image": row.get("image"),
    }


def reward_figures(rows: Sequence[dict], records: Sequence[dict], builtin: bool) -> dict:
    """The batch's rewards, its spans to the last ready and the last reward, and the guide's
    pod-to-ready figures."""
    guide = describe([record["guide_pod_to_ready"] for record in records])
    rewards = [r["reward"] for r in rows]
    return {
        "episodes": len(rows),
        "successful_episodes": sum(1 for r in rewards if r == 1) if builtin else len(rows),
        "reward_sum": sum(rewards),
        # A rollout whose every episode failed on its own has no successful one to measure.
        "reward_mean": rounded(sum(rewards) / len(rewards), 6) if rewards else None,
        "batch_to_all_ready_seconds": max(
            (r["batch_to_ready_seconds"] for r in rows), default=None
        ),
        "batch_to_all_rewards_seconds": max(
            (r["batch_to_reward_seconds"] for r in rows), default=None
        ),
        # The guide's figures, from the whole-second creationTimestamp as the guide computes them;
        # the pod_to_ready phase measures the same span from the sharpest points.
        "pod_to_ready_p50_seconds": guide.get("p50"),
        "pod_to_ready_p95_seconds": guide.get("p95"),
        "pod_to_ready_max_seconds": guide.get("max"),
    }


def ran_pods(
    job: dict, pods: Sequence[dict], logs: Mapping[str, str]
) -> tuple[list[dict], list[str]]:
    """The pods an episode may have run in, and the names of those a suspension of the Job
    deleted before any container was made (outcomes.never_ran): no episode, not counted."""
    unrun = {pod_name(pod) for pod in pods if never_ran(pod, job, logs.get(pod_name(pod), ""))}
    return [pod for pod in pods if pod_name(pod) not in unrun], sorted(unrun)


@cycle_collector_paused()
def summarise_batch(
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    events: Sequence[EventRecord],
    count: int,
    builtin: bool = True,
    client_observed_at: float | None = None,
    observed: dict[str, dict] | None = None,
    failed: Sequence[tuple[dict | None, dict]] = (),
    drafts: Mapping[str, EpisodeDraft] | None = None,
    index: EventIndex | None = None,
) -> BatchSummary:
    """Verify one batch and compute its figures and its phase breakdown; pure. `failed`: the
    accepted failures, (final pod or None, rewards row), placed as far as they got, from the
    same sources and clocks, for the timeline; no figure counts them. `drafts`: episodes
    summarised while the batch ran, each taken where its pod, log and inputs are the final ones
    (the result is the same as without them). `index`: the watch's index of the events, taken
    where it is exact and of these very events (else they are read again)."""
    drafts, (pods, unrun) = drafts or {}, ran_pods(job, pods, logs)
    episodes = verify_batch(count, job, pods, logs, builtin, drafts)
    sources = batch_sources(job, pods, count, episodes, events, observed, index)
    summarised = [
        summarised_episode(sources, pod, ready, reward, drafts.get(pod_name(pod)))
        for pod, ready, reward in episodes
    ]
    rows = [episode.row for episode in summarised]
    records = [episode.record for episode in summarised]
    phase_samples: dict[str, list[float]] = {}
    figures = reward_figures(rows, records, builtin)
    last_reward = max((reward["at"] for _, _, reward in episodes), default=None)
    figures.update(
        phases=phase_summary([record["phases"] for record in records], phase_samples),
        job_created=sources.job_point._asdict(),
        phases_by_start_path=start_path_phases(records),
        clocks=sources.clocks,
        completion_gap=completion_gap(job, pods, last_reward, client_observed_at),
        nodes=node_distribution(pods),
        image_cache=count_image_cache(record["image_cache"] for record in records),
        images=image_figures(records),
        warnings=warning_summary(events),
        pods=rows,
        **({"pods_that_never_ran": unrun} if unrun else {}),
    )
    # The Job may first have existed before the create call returned (its pods can be created
    # before): the timeline marks that moment on its axis, which starts at job_created.
    return BatchSummary(
        figures,
        records,
        sources.job_created,
        sources.job_point.earliest or sources.job_created,
        [failed_record(sources, logs, failed_pod, row) for failed_pod, row in failed],
        drafts_taken=sum(episode.drafted for episode in summarised),
        csv_rows={
            episode.record["pod"]: episode.csv_row
            for episode in summarised
            if episode.csv_row is not None
        },
        phase_samples=phase_samples,
    )


def image_figures(records: Sequence[dict], rows: Sequence[dict] = ()) -> dict[str, dict]:
    """Per image: its episodes (with `rows`, a rollout's every episode, and how many failed), how many
    of the summarised ones found it present or had it pulled, the image_pull phase of those pulled
    (the wait behind the node's other pulls included) and the kubelet's own figures: its wait, the
    image's size."""
    by_image: dict[str, list[dict]] = {}
    for record in records:
        by_image.setdefault(record.get("image") or "unknown", []).append(record)
    attempted: dict[str, list[dict]] = {}
    for row in rows:
        attempted.setdefault(row.get("image") or "unknown", []).append(row)
    figures = {}
    for image in list(by_image) + [image for image in attempted if image not in by_image]:
        summarised = by_image.get(image, [])
        pulled = [record for record in summarised if record.get("image_cache") == "pulled"]
        pull = describe(
            [
                record["phases"]["image_pull"][0]
                for record in pulled
                if (record["phases"] or {}).get("image_pull") is not None
            ]
        )
        reports = [
            record["image_pull"] for record in summarised if record.get("image_pull") is not None
        ]
        waiting = describe(
            [
                report.waiting_seconds
                for report in reports
                if report.pulled and report.waiting_seconds is not None
            ]
        )
        sizes = [report.size_bytes for report in reports if report.size_bytes is not None]
        entry: dict[str, Any] = {
            "episodes": len(attempted[image]) if rows else len(summarised),
            "pulled": len(pulled),
            "present": sum(1 for record in summarised if record.get("image_cache") == "present"),
            "image_pull_p50_seconds": pull.get("p50"),
            "image_pull_max_seconds": pull.get("max"),
            "image_pull_waiting_p50_seconds": waiting.get("p50"),
            "image_pull_waiting_max_seconds": waiting.get("max"),
            "image_size_bytes": max(sizes) if sizes else None,
        }
        if rows:
            entry["failed_episodes"] = sum(1 for row in attempted[image] if is_failure(row))
        figures[image] = entry
    return figures


def episodes_csv(batches: Sequence[tuple[str, BatchSummary]]) -> str:
    """One row per episode, a rollout's failed and cancelled ones included (after the others, in
    index order, their points as far as they got): every point (seconds after its Job's
    creationTimestamp, and as an absolute time with its source, clock and precision) and every
    phase with its precision; then its task and outcome (OUTCOME_COLUMNS). `index` (the
    completion index) is there for an Indexed Job; a default run's pods have none."""
    return "".join(episodes_csv_pieces(batches))


# The last columns of episodes.csv, after every column older files had (read by place too):
# the episode's task and its outcome, as its line of rewards.jsonl says them.
OUTCOME_COLUMNS = ["task_id", "failure_class", "failure", "valid"]


def outcome_fields(record: Mapping[str, Any]) -> list[str]:
    """An episode's OUTCOME_COLUMNS: a success's class and failure are empty, and it is valid."""
    task_id = record.get("task_id")
    return [
        "" if task_id is None else str(task_id),
        record.get("failure_class") or "",
        record.get("failure") or "",
        "false" if record.get("valid") is False else "true",
    ]


# episodes.csv is made in pieces of this many rows: 100,000 rows (about 90 MB) are written
# without one string of them all.
CSV_ROWS_A_PIECE = 1000


def episodes_csv_header(indexed: bool) -> list[str]:
    """The columns of episodes.csv, in their places (`index` only for an Indexed Job)."""
    return (
        ["batch", "pod", *(["index"] if indexed else []), "node", "reward"]
        + ["image_cache", "runtime_class"]
        + [f"{p}_after_job_seconds" for p in POINTS]
        + [f"{p}_precision_seconds" for p in POINTS]
        + [f"{phase}_seconds" for phase in PHASES]
        + [f"{p}_at" for p in POINTS]
        + [f"{p}_source" for p in POINTS]
        + [f"{p}_clock" for p in POINTS]
        + [f"{phase}_precision_seconds" for phase in PHASES]
        + ["image", "image_pull_waiting_seconds", "image_pull_kubelet_seconds", "image_size_bytes"]
        + OUTCOME_COLUMNS
    )


def episodes_csv_pieces(batches: Sequence[tuple[str, BatchSummary]]) -> Iterator[str]:
    """episodes.csv (see episodes_csv) a piece at a time."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    indexed = any(
        record.get("index") is not None
        for _, summary in batches
        for record in [*summary.episodes, *summary.failed]
    )
    writer.writerow(episodes_csv_header(indexed))
    for batch_name, summary in batches:
        rows = {row["pod"]: row for row in summary.figures["pods"]}
        job_created = summary.job_created
        for number, record in enumerate(summary.episodes):
            if number % CSV_ROWS_A_PIECE == 0:
                yield out.getvalue()
                out.seek(0)
                out.truncate()
            leading = [batch_name, record["pod"], *([record["index"] or ""] if indexed else [])]
            made = summary.csv_rows.get(record["pod"])
            if made is None:
                writer.writerow(
                    leading
                    + episode_csv_fields(rows[record["pod"]], record, job_created)
                    + outcome_fields(record)
                )
                continue
            # Its draft's row between the leading and the outcome fields, written as the writer
            # writes them: a row is its fields, each quoted or not on its own, joined by the delimiter.
            out.write(
                csv_text(leading)[:-1]
                + ","
                + made.get(record["pod"])[:-1]
                + ","
                + csv_text(outcome_fields(record))
            )
        for record in sorted(summary.failed, key=lambda failed: failed["index"]):
            leading = [batch_name, record["pod"] or "", *([record["index"]] if indexed else [])]
            writer.writerow(
                leading + episode_csv_fields(record, record, job_created) + outcome_fields(record)
            )
    yield out.getvalue()


def episode_csv_fields(row: dict, record: Mapping[str, Any], job_created: float) -> list[Any]:
    """An episode's fields of episodes.csv after its batch, pod and index: from its row in
    results.json and its record, all a draft has as it ends."""
    points = [record["points"][p] for p in POINTS]
    phases = [record["phases"][ph] for ph in PHASES]
    return (
        [
            row["node"] or "",
            "" if row["reward"] is None else row["reward"],
            record.get("image_cache") or "",
            record.get("runtime_class") or "",
        ]
        + ["" if point is None else f"{point[0] - job_created:.6f}" for point in points]
        + ["" if point is None else f"{point[1]:.6g}" for point in points]
        + ["" if phase is None else f"{phase[0]:.6f}" for phase in phases]
        + ["" if point is None else f"{point[0]:.6f}" for point in points]
        + ["" if point is None else getattr(point, "source", "") for point in points]
        + ["" if point is None else getattr(point, "clock", "") for point in points]
        + ["" if phase is None else f"{phase[1]:.6g}" for phase in phases]
        + image_columns(record)
    )


def csv_text(fields: Sequence[Any]) -> str:
    """One row of episodes.csv as its writer writes it, with its line end."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(fields)
    return out.getvalue()


def image_columns(record: Mapping[str, Any]) -> list[str]:
    """An episode's image and what the kubelet said of its pull: the wait, the pull alone, the size."""
    pull: ImagePull | None = record.get("image_pull")

    def number(value: float | None) -> str:
        return "" if value is None else f"{value:.6f}"

    if pull is None:
        return [record.get("image") or "", "", "", ""]
    if not pull.pulled:  # present: no pull, so no wait
        return [record.get("image") or "", number(0.0), number(0.0), ""]
    return [
        record.get("image") or "",
        number(pull.waiting_seconds),
        number(pull.pull_seconds),
        "" if pull.size_bytes is None else str(pull.size_bytes),
    ]


# --------------------------------------------------------------------------
# src/rl_batch_demo/render.py: Rendering: SVG timeline and charts, tables, the comparison.

PHASE_COLOURS = {
    "scheduling": "#9e9e9e",
    "sandbox_creation": "#f4a259",
    "container_start": "#e76f51",
    "python_imports": "#8e7dbe",
    "imports_done_to_ready": "#2a9d8f",
    "episode_work": "#4f86c6",
    "container_exit": "#c9c9c9",
}


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks."""
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def timeline_title(settings: Settings) -> str:
    """What the timeline shows: its episodes in all, and in how many rounds."""
    count, rounds = settings.count, settings.rounds
    episodes = (
        plural(count, "episode")
        if rounds == 1
        else f"{rounds} rounds of {plural(count, 'episode')} ({rounds * count} in all)"
    )
    return f"{episodes}, parallelism {settings.parallelism}, runtime {settings.runtime}"


# Every picture and episodes.csv count from the same zero as results.json's batch_to_* figures.
TIME_AXIS = "seconds after the Job's creationTimestamp (its whole second, as results.json and episodes.csv count)"


def timeline_svg(
    batches: Sequence[tuple[str, BatchSummary]],
    title: str,
    task_ids: Sequence[str] | None = None,
    group_size: int = 1,
    admission: dict | None = None,
) -> str:
    """One bar per episode on a shared axis from its Job's creationTimestamp, coloured by phase;
    each row named by its task and group when the run has tasks (`task_ids`, one per group of
    `group_size`), else by its pod."""
    episodes = timeline_episodes(batches)
    layout = timeline_layout(episodes)
    parts = timeline_head(layout, title) + timeline_axis(layout)
    if len(batches) == 1:
        parts += admission_bands(
            layout.x, layout.top - 4, layout.axis_y(), batches[0][1].job_created, admission
        )
    if len(batches) == 1 and batches[0][1].origin > batches[0][1].job_created:
        parts.append(job_created_line(layout, batches[0][1]))
    if not layout.labels:
        middle = f"{layout.top + layout.row_height * layout.rows / 2:.0f}"
        parts.append(
            f'<text x="{layout.left - 12}" y="{middle}" text-anchor="middle" '
            f'transform="rotate(-90 {layout.left - 12} {middle})">'
            f"{layout.rows} episodes, one row each</text>"
        )
    for row, (origin, record) in enumerate(episodes):
        label = episode_label(record, task_ids, group_size)
        parts += timeline_row(layout, row, origin, record, label)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def timeline_episodes(batches: Sequence[tuple[str, BatchSummary]]) -> list[tuple[float, dict]]:
    """Every episode, failed ones included, with its Job's creationTimestamp: the bars in the order
    the pods were created, batch after batch."""
    return [
        (summary.job_created, record)
        for _, summary in batches
        for record in sorted(
            summary.episodes + summary.failed,
            key=lambda r: (
                r["points"]["pod_created"][0] if r["points"].get("pod_created") else math.inf,
                r["pod"] or "",
            ),
        )
    ]


class TimelineKind(NamedTuple):
    """What a timeline's bars are: its phases (each from one point to another) in the order drawn,
    their colours, the legend's other entries (a meaning and its fill), and what its axis counts."""

    phases: Mapping[str, tuple[str, str]]
    colours: Mapping[str, str]
    legend: Sequence[tuple[str, str]]
    axis: str
    # Whether each phase begins where the one before ended (a run's). A pool's claim_wait begins
    # at the claim, which a cold claim makes before its sandbox is ready: its title says its own
    # length, its bar the part after the phase before.
    chained: bool = True


class TimelineLayout(NamedTuple):
    """Where the timeline's parts go: its size, its rows, its plot and its time axis."""

    width: int
    height: int
    rows: int  # one per episode
    row_height: int
    labels: bool  # each row named: rows tall enough to read
    left: int  # the plot's left edge
    plot_width: int
    top: int  # the first row's top, below the legend
    legend: list[str]  # the legend's parts
    step: float  # seconds between ticks
    axis_end: float  # seconds at the axis' right end
    kind: TimelineKind  # a run's episodes, or a pool's

    def x(self, seconds: float) -> float:
        """Where a moment `seconds` after the axis' start is drawn."""
        return self.left + self.plot_width * max(0.0, seconds) / self.axis_end

    def axis_y(self) -> int:
        """Where the time axis is drawn, below the last row."""
        return self.top + self.row_height * self.rows + 6


def timeline_layout(
    episodes: Sequence[tuple[float, dict]], kind: TimelineKind | None = None
) -> TimelineLayout:
    """The timeline's layout: rows as tall as its count allows, named where they are tall enough,
    and an axis to the latest point any episode reached; `kind` a run's unless given."""
    kind = kind or RUN_TIMELINE
    count = len(episodes)
    row_height = 18 if count <= 40 else max(3, min(12, 720 // max(count, 1)))
    labels = row_height >= 10
    left = 170 if labels else 60
    width, right = 1000, 30
    legend, legend_last_row = timeline_legend(left, width - right, kind)
    top = legend_last_row + 38
    span = max(
        [
            point[0] - origin
            for origin, record in episodes
            for point in record["points"].values()
            if point is not None
        ]
        + [1.0]
    )
    step = nice_step(span)
    return TimelineLayout(
        width,
        top + row_height * count + 80,
        count,
        row_height,
        labels,
        left,
        width - left - right,
        top,
        legend,
        step,
        math.ceil(span / step) * step,
        kind,
    )


def timeline_head(layout: TimelineLayout, title: str) -> list[str]:
    """The timeline's opening: its size, the hatching of unsplit phases, its title and legend."""
    width, height = layout.width, layout.height
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        '<defs><pattern id="unsplit" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f4a259"/>'
        '<rect width="3" height="6" fill="#e76f51"/></pattern>'
        '<pattern id="unrewarded" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#dbe6f4"/>'
        '<rect width="2" height="6" fill="#4f86c6"/></pattern></defs>',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{layout.left}" y="20" font-size="15" font-weight="bold">{html_escape(title)}</text>',
    ] + layout.legend


def timeline_axis(layout: TimelineLayout) -> list[str]:
    """The time axis: a gridline and a label per tick, the axis line and what it counts."""
    top, left, plot_width, axis_y = layout.top, layout.left, layout.plot_width, layout.axis_y()
    parts = []
    tick = 0.0
    while tick <= layout.axis_end + 1e-9:
        tx = layout.x(tick)
        parts.append(
            f'<line x1="{tx:.1f}" y1="{top - 4}" x2="{tx:.1f}" y2="{axis_y}" stroke="#e5e5e5"/>'
        )
        parts.append(f'<text x="{tx:.1f}" y="{axis_y + 16}" text-anchor="middle">{tick:g}</text>')
        tick += layout.step
    parts.append(
        f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_width}" y2="{axis_y}" stroke="black"/>'
    )
    parts.append(
        f'<text x="{left + plot_width / 2:.0f}" y="{axis_y + 36}" text-anchor="middle">'
        f"{html_escape(layout.kind.axis)}</text>"
    )
    return parts


def job_created_line(layout: TimelineLayout, summary: BatchSummary) -> str:
    """Where the Job may first have existed: its stamp only names the second it began in."""
    created_x = layout.x(summary.origin - summary.job_created)
    return (
        f'<line x1="{created_x:.1f}" y1="{layout.top - 4}" x2="{created_x:.1f}" '
        f'y2="{layout.axis_y()}" stroke="#888" stroke-dasharray="4 3"><title>the Job created, '
        f"at the earliest: {summary.origin - summary.job_created:.3f} s</title></line>"
    )


# The widest row name the timeline's left margin holds.
LABEL_CHARS = 26


def episode_label(record: dict, task_ids: Sequence[str] | None, group_size: int) -> str:
    """A timeline row's name: its task, group and place in the group (`task-7 g3.1`) when the run
    has tasks, a long task id shortened in its middle; else its pod's name, which starts with its
    Job's and so names the round too."""
    index = record.get("index")  # a succeeded episode's as episodes.csv holds it: a str
    if not task_ids or index is None or not str(index).isdigit():
        label = record["pod"] or f"episode {index}: no pod"
        return label[-LABEL_CHARS:]
    group, member = divmod(int(index), max(1, group_size))
    task = str(task_ids[group]) if group < len(task_ids) else "?"
    where = f" g{group}.{member}"
    room = LABEL_CHARS - len(where)
    if len(task) > room:
        task = task[: room // 2] + "…" + task[len(task) - (room - room // 2 - 1) :]
    return task + where


def timeline_row(
    layout: TimelineLayout, row: int, origin: float, record: dict, label: str
) -> list[str]:
    """One episode's row: its name (`label`) where rows are named, its phase bars, and the mark
    of a failed episode; `origin` its Job's creationTimestamp."""
    y = layout.top + row * layout.row_height
    failed = "failure_class" in record
    parts = []
    if layout.labels:
        parts.append(
            f"<g><title>{html_escape(record['pod'] or label)}</title>"
            f'<text x="{layout.left - 6}" y="{y + layout.row_height * 0.7:.1f}" text-anchor="end" '
            f'font-size="11"{FAILED_FILL if failed else ""}>{html_escape(label)}</text></g>'
        )

    def at(moment: float) -> float:
        return layout.x(moment - origin)

    parts += timeline_bars(record, at, y, layout.row_height, layout.kind)
    parts += unrewarded_bar(record, at, y, layout.row_height)
    if failed:
        parts.append(failed_marker(record, at, layout.left, y, layout.row_height))
    return parts


FAILED_FILL = ' fill="#c1121f"'

GAP_MEANING = "gap: a point not reported (e.g. by an episode script) or not measured"

FAILED_MEANING = "\u2715 failed (or cancelled) episode, drawn as far as it got"

UNREWARDED_MEANING = "ran, no reward (hung to its deadline, or crashed)"

RUN_TIMELINE = TimelineKind(
    PHASES,
    PHASE_COLOURS,
    (
        ("split below its precision", 'fill="url(#unsplit)"'),
        (UNREWARDED_MEANING, 'fill="url(#unrewarded)"'),
        (FAILED_MEANING, FAILED_FILL.strip()),
        (GAP_MEANING, 'fill="white" stroke="#999"'),
    ),
    TIME_AXIS,
)

# The points an episode passes before its reward, in order: where its running time starts.
BEFORE_REWARD = (
    "pod_created",
    "scheduled",
    "sandbox_ready",
    "process_started",
    "imports_done",
    "ready",
)


def unrewarded_bar(record: dict, x: Callable[[float], float], y: int, row_height: int) -> list[str]:
    """The time a container ran with no reward to show for it, from the last point it reached
    to its end: a hung episode stopped by its deadline, or one that crashed. Without it a hung
    episode's row ended where its running began."""
    points = record["points"]
    finished = points.get("container_finished")
    if finished is None or points.get("reward") is not None:
        return []
    reached = [points[name][0] for name in BEFORE_REWARD if points.get(name) is not None]
    begin = max((moment for moment in reached if moment <= finished[0]), default=None)
    if begin is None or finished[0] <= begin:
        return []
    bar_gap = 1 if row_height >= 8 else 0
    x0, x1 = x(begin), x(finished[0])
    return [
        f'<rect x="{x0:.2f}" y="{y + bar_gap}" width="{x1 - x0:.2f}" '
        f'height="{row_height - 2 * bar_gap}" fill="url(#unrewarded)"><title>'
        f"{html_escape(record['pod'] or '')} ran with no reward: {finished[0] - begin:.3f} s"
        "</title></rect>"
    ]


def failed_marker(
    record: dict, x: Callable[[float], float], left: int, y: int, row_height: int
) -> str:
    """A failed episode's mark after the last point it reached (at the axis start if none), its
    class and why in the tooltip."""
    reached = [point[0] for point in record["points"].values() if point is not None]
    at = x(max(reached)) if reached else float(left)
    who = record["pod"] or f"episode {record['index']}"
    what = (
        "cancelled"
        if record["failure_class"] == CANCELLED
        else f"failed ({record['failure_class']})"
    )
    why = f"{who} {what}: {record['failure']}"
    return (
        f'<text x="{at + 2:.1f}" y="{y + row_height * 0.8:.1f}" font-size="{min(12, row_height + 2)}"'
        f"{FAILED_FILL}>\u2715<title>{html_escape(why)}</title></text>"
    )


def timeline_legend(left: int, right_edge: int, kind: TimelineKind) -> tuple[list[str], int]:
    """The timeline's legend, one swatch per phase, wrapped at `right_edge`; and its last row's y."""
    legend = [
        (phase.replace("_", " "), f'fill="{colour}"') for phase, colour in kind.colours.items()
    ]
    legend += kind.legend
    parts, legend_x, legend_y = [], left, 32
    for name, fill in legend:
        item_width = 16 + 7 * len(name) + 14
        if legend_x + item_width > right_edge and legend_x > left:
            legend_x, legend_y = left, legend_y + 18
        parts.append(f'<rect x="{legend_x}" y="{legend_y}" width="12" height="12" {fill}/>')
        parts.append(f'<text x="{legend_x + 16}" y="{legend_y + 10}">{name}</text>')
        legend_x += item_width
    return parts, legend_y


def timeline_bars(
    record: dict, x: Callable[[float], float], y: int, row_height: int, kind: TimelineKind
) -> list[str]:
    """One episode's row of phase bars; `x` places an absolute moment on the axis."""
    points = record["points"]
    # Thin rows are drawn edge to edge: a gap would leave a hairline of colour.
    bar_gap = 1 if row_height >= 8 else 0
    parts = []
    # Whole-second points can fall before the sub-second point drawn just before them;
    # such a phase cannot be split from the next one, so both are drawn as one hatched bar.
    cursor: float | None = None
    unsplit: list[str] = []
    for phase, colour in kind.colours.items():
        start, end = kind.phases[phase]
        if points.get(start) is None or points.get(end) is None:
            cursor, unsplit = None, []
            continue
        begin = points[start][0] if cursor is None else max(cursor, points[start][0])
        finish = points[end][0]
        if finish < begin:
            unsplit.append(phase)
            continue
        if finish == begin:
            continue
        names = "+".join(unsplit + [phase])
        fill = "url(#unsplit)" if unsplit else colour
        x0, x1 = x(begin), x(finish)
        said = f"{finish - begin:.3f} s"
        if not kind.chained and not unsplit and begin > points[start][0]:
            said = f"{finish - points[start][0]:.3f} s ({said} of it after the phase before)"
        parts.append(
            f'<rect x="{x0:.2f}" y="{y + bar_gap}" width="{x1 - x0:.2f}" '
            f'height="{row_height - 2 * bar_gap}" fill="{fill}"><title>{html_escape(record["pod"])} '
            f"{names}: {said}</title></rect>"
        )
        cursor, unsplit = finish, []
    return parts


# Pictures that read at any size: the ramp (cumulative counts over time) and the
# distributions (CDFs). Each line is thinned to a few hundred steps, so the file stays
# small and the browser quick however many episodes there are.
CHART_STEPS = 400

TIMELINE_MAX_ROWS = 200

RAMP_COLOURS = {
    "pod_created": "#9e9e9e",
    "scheduled": "#6c757d",
    "sandbox_ready": "#f4a259",
    "ready": "#2a9d8f",
    "reward": "#4f86c6",
    "container_finished": "#1d1d1d",
    "reward_delivered": "#d62828",
}

CDF_COLOURS = dict(
    PHASE_COLOURS, pod_to_ready="#d62828", pod_to_reward="#1d1d1d", image_pull="#b5651d"
)


def thinned(values: Sequence[float], steps: int = CHART_STEPS) -> list[tuple[float, int]]:
    """(value, how many values are <= it) at no more than `steps` evenly spaced ranks, the last included."""
    ordered = sorted(values)
    if not ordered:
        return []
    count = len(ordered)
    kept = min(steps, count)
    ranks = sorted({min(count, max(1, round(count * (i + 1) / kept))) for i in range(kept)})
    return [(ordered[rank - 1], rank) for rank in ranks]


def chart_svg(
    title: str,
    subtitle: str,
    series: Sequence[tuple[str, str, list[tuple[float, float]], bool, str]],
    x_label: str,
    y_label: str,
    y_max: float,
    y_ticks: Sequence[tuple[float, str]],
    x_min: float = 0.0,
    bands: Callable[[ChartLayout], list[str]] | None = None,
) -> str:
    """Step lines on shared axes; each series is (legend text, colour, [(x, y)] rising in x, bold?,
    tooltip); `bands`: what to shade behind them, drawn on the chart's layout."""
    layout = chart_layout(series, y_max, x_min)
    width, height, left = layout.width, layout.height, layout.left
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">{html_escape(title)}</text>',
        f'<text x="{left}" y="40" fill="#444">{html_escape(subtitle)}</text>',
    ]
    parts += chart_axes(layout, x_label, y_label, y_ticks)
    if bands is not None:
        parts += bands(layout)
    parts += chart_legend(layout, series)
    # The bold line is drawn last, so no other hides it.
    for _, colour, points, bold, tooltip in sorted(series, key=lambda line: line[3]):
        if points:
            parts.append(
                f'<path d="{step_path(layout, points)}" fill="none" stroke="{colour}" '
                f'stroke-width="{2.5 if bold else 1.5}"><title>{html_escape(tooltip)}</title></path>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


class ChartLayout(NamedTuple):
    """Where a chart's parts go: its size, its plot, and the values its axes span."""

    width: int
    height: int
    left: int  # the plot's left edge
    top: int  # the plot's top edge
    plot_w: int
    plot_h: int
    axis_start: float  # x at the plot's left edge
    axis_end: float  # x at its right edge
    step: float  # x between ticks
    y_max: float  # y at the plot's top edge

    def sx(self, value: float) -> float:
        """Where x `value` is drawn."""
        return self.left + self.plot_w * (value - self.axis_start) / (
            self.axis_end - self.axis_start
        )

    def sy(self, value: float) -> float:
        """Where y `value` is drawn."""
        return self.top + self.plot_h * (1 - value / max(self.y_max, 1e-9))


def chart_layout(
    series: Sequence[tuple[str, str, list[tuple[float, float]], bool, str]],
    y_max: float,
    x_min: float,
) -> ChartLayout:
    """A chart's layout: the legend right of the plot, the x axis from `x_min` to past the largest
    x, in round steps."""
    width, height = 1000, 560
    left, right, top, bottom = 70, 270, 56, 60
    x_max = max([x for _, _, points, _, _ in series for x, _ in points] + [x_min + 1.0])
    step = nice_step(x_max - x_min)
    return ChartLayout(
        width,
        height,
        left,
        top,
        width - left - right,
        height - top - bottom,
        math.floor(x_min / step) * step,
        math.ceil(x_max / step) * step,
        step,
        y_max,
    )


def chart_axes(
    layout: ChartLayout, x_label: str, y_label: str, y_ticks: Sequence[tuple[float, str]]
) -> list[str]:
    """A chart's gridlines and tick labels, its plot's frame and what each axis counts."""
    left, top, plot_w, plot_h = layout.left, layout.top, layout.plot_w, layout.plot_h
    sx, sy = layout.sx, layout.sy
    parts = []
    tick = layout.axis_start
    while tick <= layout.axis_end + 1e-9:
        parts.append(
            f'<line x1="{sx(tick):.1f}" y1="{top}" x2="{sx(tick):.1f}" y2="{top + plot_h}" stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text x="{sx(tick):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{tick:g}</text>'
        )
        tick += layout.step
    for value, text in y_ticks:
        parts.append(
            f'<line x1="{left}" y1="{sy(value):.1f}" x2="{left + plot_w}" y2="{sy(value):.1f}" '
            f'stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{sy(value) + 4:.1f}" text-anchor="end">{html_escape(text)}</text>'
        )
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>'
    )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{layout.height - 18}" text-anchor="middle">'
        f"{html_escape(x_label)}</text>"
    )
    parts.append(
        f'<text x="16" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + plot_h / 2:.0f})">{html_escape(y_label)}</text>'
    )
    return parts


def chart_legend(
    layout: ChartLayout, series: Sequence[tuple[str, str, list[tuple[float, float]], bool, str]]
) -> list[str]:
    """A chart's legend right of its plot: each series' line and text, in the order given."""
    right_of_plot = layout.left + layout.plot_w
    parts = []
    for index, (label, colour, _, bold, _) in enumerate(series):
        legend_y = layout.top + 8 + 20 * index
        parts.append(
            f'<line x1="{right_of_plot + 14}" y1="{legend_y}" x2="{right_of_plot + 38}" y2="{legend_y}" '
            f'stroke="{colour}" stroke-width="{3 if bold else 2}"/>'
        )
        parts.append(
            f'<text x="{right_of_plot + 44}" y="{legend_y + 4}">{html_escape(label)}</text>'
        )
    return parts


def step_path(layout: ChartLayout, points: Sequence[tuple[float, float]]) -> str:
    """A series' steps as a path's data: from 0 at its first x, up (or down) at each point."""
    sx, sy = layout.sx, layout.sy
    path = [f"M{sx(points[0][0]):.1f},{sy(0):.1f}"]
    previous_y = 0.0
    for x_value, y_value in points:
        path.append(f"L{sx(x_value):.1f},{sy(previous_y):.1f}L{sx(x_value):.1f},{sy(y_value):.1f}")
        previous_y = y_value
    return "".join(path)


def ramp_svg(
    batches: Sequence[tuple[str, BatchSummary]],
    title: str,
    figures: dict | None = None,
    admission: dict | None = None,
) -> str:
    """How many pods had been created, scheduled, ... finished, over time from their Job's
    creationTimestamp (as the timeline counts); `figures`: the batches' throughput, when already computed."""
    records = [
        (summary.job_created, record) for _, summary in batches for record in summary.episodes
    ]
    total = len(records)
    series = []
    for point in RAMP_POINTS:
        moments = [
            record["points"][point][0] - origin
            for origin, record in records
            if record["points"].get(point)
        ]
        known = "" if len(moments) == total else f" ({len(moments)} known)"
        series.append(
            (
                f"{point.replace('_', ' ')}{known}",
                RAMP_COLOURS[point],
                [(x, float(n)) for x, n in thinned(moments)],
                point == "ready",
                f"{point}: {plural(len(moments), 'episode')}",
            )
        )
    delivered = [
        moment - summary.job_created for _, summary in batches for moment in summary.deliveries
    ]
    if delivered:
        # A rollout's successful rewards as they reached rewards.jsonl (the client's clock).
        series.append(
            (
                "reward in rewards.jsonl",
                RAMP_COLOURS["reward_delivered"],
                [(x, float(n)) for x, n in thinned(delivered)],
                True,
                f"rewards delivered: {len(delivered)} lines",
            )
        )
    figures = figures if figures is not None else throughput(batches)
    failed = sum(len(summary.failed) for _, summary in batches)
    left_out = f" ({failed} failed or cancelled, not counted)" if failed else ""
    subtitle = (
        f"{plural(total, 'episode')}{left_out}; pods created "
        f"{figures['pods_created_per_second'] or '-'}/s; sandboxes ready "
        f"{figures['sandboxes_ready_per_second_mean'] or '-'}/s mean, "
        f"{figures['sandboxes_ready_per_second_peak'] or '-'} in the busiest second; "
        f"at most {plural(figures['max_episodes_running_at_once'] or None, 'episode')} running at once"
    )
    bands = ramp_bands(batches, admission)
    ticks = count_ticks(total)
    return chart_svg(title, subtitle, series, TIME_AXIS, RAMP_Y, max(total, 1), ticks, 0.0, bands)


RAMP_Y = "episodes (cumulative)"


def count_ticks(total: int) -> list[tuple[float, str]]:
    """The ramp's y ticks, up to `total` episodes in round steps."""
    y_step = nice_step(max(total, 1), ticks=5)
    ticks = []
    value = 0.0
    while value <= total + 1e-9:
        ticks.append((value, f"{value:g}"))
        value += y_step
    return ticks


def ramp_bands(
    batches: Sequence[tuple[str, BatchSummary]], admission: dict | None
) -> Callable[[ChartLayout], list[str]] | None:
    """The admission's bands behind one queued batch's ramp; none for several batches."""
    if len(batches) != 1 or not admission:
        return None
    origin = batches[0][1].job_created

    def bands(layout: ChartLayout) -> list[str]:
        bottom = layout.top + layout.plot_h
        return admission_bands(layout.sx, layout.top, bottom, origin, admission, axis_start=0.0)

    return bands


# --queue: the bands of a queued batch's admission, behind the timeline and the ramp.
ADMISSION_BANDS = (
    ("queued_at", "quota_reserved_at", "queue_wait", "#cfd8dc"),
    ("quota_reserved_at", "admitted_at", "admission_checks", "#ffe0b2"),
)


def admission_bands(
    x: Callable[[float], float],
    top: float,
    bottom: float,
    origin: float,
    admission: dict | None,
    axis_start: float | None = None,
) -> list[str]:
    """A band per admission phase of one batch (queue_wait, admission_checks), from its points'
    seconds after `origin` (the Job's creationTimestamp), each named with its figure and precision."""
    parts: list[str] = []
    for start, end, name, colour in ADMISSION_BANDS:
        begin, until = (admission or {}).get(start), (admission or {}).get(end)
        if begin is None or until is None or until <= begin:
            continue
        left = x(max(begin - origin, axis_start or 0.0))
        right = x(until - origin)
        precision = (admission or {}).get("precision_seconds")
        parts.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left, 1.0):.1f}" '
            f'height="{bottom - top:.1f}" fill="{colour}" fill-opacity="0.6">'
            f"<title>{name}: {until - begin:g} s (+/- {precision:g} s)</title></rect>"
        )
        parts.append(
            f'<text x="{(left + right) / 2:.1f}" y="{top + 12:.1f}" text-anchor="middle" '
            f'fill="#455a64">{name}</text>'
        )
    return parts


def cdf_svg(batches: Sequence[tuple[str, BatchSummary]], title: str) -> str:
    """The distribution of each phase's duration: the share of episodes done within x seconds."""
    records = [record for _, summary in batches for record in summary.episodes]
    series, lowest = [], 0.0
    for phase in PHASES:
        if all(phase in summary.phase_samples for _, summary in batches):
            # The summaries' own samples (sorted runs, merged by the sort below).
            values = [value for _, summary in batches for value in summary.phase_samples[phase]]
        else:
            values = [
                record["phases"][phase][0]
                for record in records
                if record["phases"].get(phase) is not None
            ]
        # Named apart from the guide's pod_to_ready, as the phase table names it.
        name = (SHARP_POD_TO_READY if phase == "pod_to_ready" else phase).replace("_", " ")
        if values:
            lowest = min(lowest, min(values))
            values.sort()  # once, for both percentiles and the line
            p50, p95 = sorted_percentile(values, 0.5), sorted_percentile(values, 0.95)
            label = f"{name}  {p50:.2f} / {p95:.2f}"
        else:
            label = f"{name}: no samples"
        series.append(
            (
                label,
                CDF_COLOURS[phase],
                [(x, n / len(values)) for x, n in thinned(values)],
                phase == "pod_to_ready",
                f"{phase}: {plural(len(values), 'episode')}",
            )
        )
    ticks = [(q / 4, f"{q * 25}%") for q in range(5)]
    subtitle = (
        f"{plural(len(records), 'episode')}; each line: the share of episodes whose phase took at most "
        f"x seconds; "
        f"legend: P50 / P95 in seconds"
    )
    return chart_svg(
        title, subtitle, series, "seconds", "share of episodes", 1.0, ticks, x_min=lowest
    )


def timeline_sample(
    batches: Sequence[tuple[str, BatchSummary]], limit: int = TIMELINE_MAX_ROWS
) -> tuple[list[tuple[str, BatchSummary]], str]:
    """At most `limit` episodes for the timeline, evenly spread in order of pod creation, and a note saying so."""
    total = sum(len(summary.episodes) + len(summary.failed) for _, summary in batches)
    if total <= limit:
        return list(batches), ""
    ordered = sorted(
        (
            (name, summary, record)
            for name, summary in batches
            for record in summary.episodes + summary.failed
        ),
        key=lambda item: (
            (item[2]["points"].get("pod_created") or (0.0,))[0],
            (item[2]["points"].get("ready") or (0.0,))[0],
        ),
    )
    keep = {round(i * (total - 1) / (limit - 1)) for i in range(limit)}
    chosen: dict[str, list] = {}
    for index, (name, _, record) in enumerate(ordered):
        if index in keep:
            chosen.setdefault(name, []).append(record)
    sampled = [
        (
            name,
            dataclasses.replace(
                summary,
                episodes=[r for r in chosen[name] if "failure_class" not in r],
                failed=[r for r in chosen[name] if "failure_class" in r],
            ),
        )
        for name, summary in batches
        if name in chosen
    ]
    return sampled, f" - {len(keep)} of {total} episodes, evenly spread in order of pod creation"


def printed_results(saved: dict, path: str | None = None) -> dict:
    """Results as printed, from their saved form: their summary, then `results_file` (`path`), the
    file that holds the rest. Every field of the guide's results.json but its per-pod rows, as the
    guide prints them, and of the rest each field that is one line's worth: a number, a string, a
    flag, an object of those, a list of strings (clock warnings); and the warning events, each
    naming its first few objects. Rows (per pod, episode, group),
    phases and clocks stay in the file: printed whole they ran to hundreds of lines. Each round
    and the warm-up are summarised alike."""
    kept: dict[str, Any] = {}
    for key, value in saved.items():
        if key == "rounds" and isinstance(value, list):
            kept[key] = [printed_results(round_) for round_ in value]
        elif key == "warmup" and isinstance(value, dict):
            kept[key] = printed_results(value)
        elif key == "warnings" and isinstance(value, dict):
            kept[key] = printed_warnings(value)
        elif key != "pods" and one_line_field(value):
            kept[key] = value
    if path is not None:
        kept["results_file"] = path
    return kept


# How many objects a printed warning names; the rest are counted (results.json names them all).
PRINTED_WARNING_OBJECTS = 3


def printed_warnings(warnings: dict[str, dict]) -> dict[str, dict]:
    """The warning events per reason, each naming its first few objects and counting the rest."""
    printed = {}
    for reason, entry in warnings.items():
        objects = list(entry.get("objects") or [])
        shown = objects[:PRINTED_WARNING_OBJECTS]
        if len(objects) > len(shown):
            shown.append(f"and {len(objects) - len(shown)} more")
        printed[reason] = {**entry, "objects": shown}
    return printed


def one_line_field(value: Any) -> bool:
    """A number, string, flag or null; an object of those; or a list of strings."""

    def plain(item: Any) -> bool:
        return item is None or isinstance(item, (str, int, float, bool))

    if isinstance(value, dict):
        return all(plain(item) for item in value.values())
    if isinstance(value, list):
        return bool(value) and all(isinstance(item, str) for item in value)
    return plain(value)


def throughput_line(figures: dict) -> str:
    """The throughput figures in one line for the terminal."""

    def shown(value: Any) -> str:
        return "-" if value is None else f"{value:g}"

    return (
        f"throughput: pods created {shown(figures.get('pods_created_per_second'))}/s, sandboxes ready "
        f"{shown(figures.get('sandboxes_ready_per_second_mean'))}/s mean and "
        f"{shown(figures.get('sandboxes_ready_per_second_peak'))} in the busiest second, "
        f"at most {plural(figures.get('max_episodes_running_at_once'), 'episode')} running at once"
    )


# The phase of the guide's name, measured between sharper points: named apart where printed.
SHARP_POD_TO_READY = "pod_to_ready (sharp)"


def phase_table(phases: dict[str, dict]) -> str:
    """A plain-text table of the phase breakdown."""
    lines = [
        f"{'phase':<24}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}{'n':>6}{'missing':>9}  precision"
    ]
    for phase, entry in phases.items():
        label = SHARP_POD_TO_READY if phase == "pod_to_ready" else phase
        precision = entry.get("precision_seconds")

        def cell(key: str) -> str:  # called for this row only, before the loop moves on
            return f"{figure(entry.get(key), precision):>8}"  # noqa: B023

        lines.append(
            f"{label:<24}{cell('p50')}{cell('p95')}{cell('p99')}{cell('max')}"
            f"{entry['samples']:>6}{entry['missing']:>9}  "
            f"{'-' if precision is None else f'{precision:.3g} s'}"
        )
    return "\n".join(lines)


def pod_to_ready_line(results: dict) -> str | None:
    """The two pod_to_ready P50s side by side, each named by how it is measured."""
    sharp = (results.get("phases") or {}).get("pod_to_ready") or {}
    guide = results.get("pod_to_ready_p50_seconds")
    if guide is None or sharp.get("p50") is None:
        return None
    counted = (
        " (failed episodes counted at the deadline)" if results.get("pod_to_ready_censored") else ""
    )
    return (
        f"pod_to_ready P50: {guide:.3f} s the guide's (from the pod's whole-second creationTimestamp; "
        f"pod_to_ready_p50_seconds{counted})\n"
        f"                  {figure(sharp['p50'], sharp.get('precision_seconds')):>5} s sharp (between the "
        f"sharpest points; phases.pod_to_ready)"
    )


def phase_tables(results: dict) -> str:
    """The phase table and the two pod_to_ready P50s, then one table per start path when the
    batch mixed them."""
    tables = [
        phase_table(results["phases"])
        + "".join(f"\n{line}" for line in [pod_to_ready_line(results)] if line)
    ]
    for path, phases in (results.get("phases_by_start_path") or {}).items():
        tables.append(f"start path: {path}\n{phase_table(phases)}")
    return "\n\n".join(tables)


# Figures are rounded to the millisecond: a finer precision is below what they show.
FIGURE_RESOLUTION = 0.001


def below_precision(value: Any, precision: float | None) -> bool:
    """A figure smaller than the precision it was measured with says only that it is that small."""
    return (
        isinstance(value, (int, float))
        and precision is not None
        and precision >= FIGURE_RESOLUTION
        and value < precision
    )


def figure(value: Any, precision: float | None) -> str:
    """A measured figure as printed: `< precision` when it is below it, `-` when missing."""
    if not isinstance(value, (int, float)):
        return "-"
    if below_precision(value, precision):
        return f"<{precision:.2g}"
    return f"{value:.3f}"


COMPARED_FIELDS = (
    "episodes",
    "failed_episodes",
    "parallelism",
    "reward_sum",
    "batch_to_all_ready_seconds",
    "batch_to_all_rewards_seconds",
    "client_job_complete_seconds",
    "pod_to_ready_p50_seconds",
    "pod_to_ready_p95_seconds",
    "pod_to_ready_max_seconds",
)

# What a run was, beside what it measured: two runs that differ here are not alike.
COMPARED_CONDITIONS = (
    "context",
    "image",
    "runtime",
    "cache_state",
    "harden",
    "episode_script_sha256",
)

# A run without the field failed no episode: it has results only if every episode passed.
COMPARED_DEFAULTS = {"failed_episodes": 0}


def compare_table(first: dict, second: dict, first_label: str, second_label: str) -> str:
    """Key figures of two runs side by side, with second/first ratios."""
    width = max(len(first_label), len(second_label), 12)
    lines = [f"{'metric':<32}{first_label:>{width}}  {second_label:>{width}}  {'B/A':>8}"]
    rows = [
        (
            field,
            first.get(field, COMPARED_DEFAULTS.get(field)),
            second.get(field, COMPARED_DEFAULTS.get(field)),
        )
        for field in COMPARED_FIELDS
    ]
    precise: dict[str, tuple[Any, Any]] = {}  # row -> the precision of each side's figure
    for row, a, b, precisions in phase_rows(first, second):
        rows.append((row, a, b))
        precise[row] = precisions
    rows += condition_rows(first, second)
    for name, a, b in rows:
        if any(isinstance(value, (str, bool)) for value in (a, b)):
            lines.append(condition_line(name, a, b, width))
        elif name in precise:
            lines.append(precise_line(name, a, b, width, precise[name]))
        else:
            ratio = (
                f"{b / a:.2f}"
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a
                else "-"
            )
            shown_a, shown_b = "-" if a is None else str(a), "-" if b is None else str(b)
            lines.append(f"{name:<32}{shown_a:>{width}}  {shown_b:>{width}}  {ratio:>8}")
    return "\n".join(lines)


def phase_rows(first: dict, second: dict) -> list[tuple[str, Any, Any, tuple[Any, Any]]]:
    """Each phase's median in either run: (row, first's, second's, the precision of each)."""
    rows = []
    for phase in PHASES:
        # The guide's figure of the same name counts from whole seconds; the phase is sharper.
        row = (
            f"{phase}_phase_p50_seconds"
            if f"{phase}_p50_seconds" in COMPARED_FIELDS
            else f"{phase}_p50_seconds"
        )
        entry_a = (first.get("phases") or {}).get(phase, {})
        entry_b = (second.get("phases") or {}).get(phase, {})
        a, b = entry_a.get("p50"), entry_b.get("p50")
        if a is not None or b is not None:
            precisions = (entry_a.get("precision_seconds"), entry_b.get("precision_seconds"))
            rows.append((row, a, b, precisions))
    return rows


def condition_rows(first: dict, second: dict) -> list[tuple[str, Any, Any]]:
    """What each run was (COMPARED_CONDITIONS) and how many of its episodes found their image
    present or pulled, where either run says."""
    conditions = [(field, first.get(field), second.get(field)) for field in COMPARED_CONDITIONS]
    conditions += [
        (
            f"image_{state}_episodes",
            (first.get("image_cache") or {}).get(state),
            (second.get("image_cache") or {}).get(state),
        )
        for state in ("present", "pulled")
    ]
    return [(name, a, b) for name, a, b in conditions if a is not None or b is not None]


def condition_line(name: str, a: Any, b: Any, width: int) -> str:
    """A row of texts or flags: whether the two runs had the same (a digest shown by its start)."""
    a, b = (
        value[:12] if isinstance(value, str) and len(value) == 64 else value for value in (a, b)
    )
    same = "same" if a == b else "differ"
    return (
        f"{name:<32}{'-' if a is None else a!s:>{width}}  {'-' if b is None else b!s:>{width}}  "
        f"{same:>8}"
    )


def precise_line(name: str, a: Any, b: Any, width: int, precisions: tuple[Any, Any]) -> str:
    """A row of phase figures measured with a precision: one below it is shown as such."""
    precision_a, precision_b = precisions
    # No ratio of a figure below its precision: it could be anything from 0 to that.
    ratio = (
        "-"
        if below_precision(a, precision_a)
        or below_precision(b, precision_b)
        or not a
        or a is None
        or b is None
        else f"{b / a:.2f}"
    )
    shown_a, shown_b = precise_figure(a, precision_a), precise_figure(b, precision_b)
    return f"{name:<32}{shown_a:>{width}}  {shown_b:>{width}}  {ratio:>8}"


def precise_figure(value: Any, precision: float | None) -> str:
    """A figure as compared: `< precision` when it is below it, `-` when missing, else as saved."""
    if value is None:
        return "-"
    return figure(value, precision) if below_precision(value, precision) else str(value)


def plural(number: Any, noun: str) -> str:
    """`1 episode`, `2 episodes`: a count with its noun (a missing count reads `-`)."""
    return f"{'-' if number is None else number} {noun}{'' if number == 1 else 's'}"


# --------------------------------------------------------------------------
# src/rl_batch_demo/metrics.py: metrics.prom: a run's figures in the OpenMetrics text format, and the push to a Pushgateway.

METRICS_FILE = "metrics.prom"
PREFIX = "rl_batch_demo"
# From 5 ms to 10 min: a phase's seconds span a sub-second scheduling and a long image pull.
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# An episode's class: its failure_class in rewards.jsonl, "ok" for none.
EPISODE_CLASSES = ("ok", "infrastructure", "episode", "verifier", "cancelled")
QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"), ("1", "max"))
PUSH_TIMEOUT_SECONDS = 10.0


def label_value(value: Any) -> str:
    """A label value as both text formats escape it: backslash, double quote and newline."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value: integers without a fraction, +Inf spelled as both formats spell it."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def labelled(name: str, labels: Mapping[str, Any], value: float) -> str:
    inside = ",".join(f'{key}="{label_value(val)}"' for key, val in labels.items())
    return f"{name}{{{inside}}} {number(value)}"


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def histogram(name: str, labels: Mapping[str, Any], values: Sequence[float]) -> list[str]:
    """One histogram's buckets (cumulative, +Inf last), count and sum."""
    lines = [
        labelled(f"{name}_bucket", {**labels, "le": number(bound)}, sum(v <= bound for v in values))
        for bound in PHASE_BUCKETS
    ]
    lines.append(labelled(f"{name}_bucket", {**labels, "le": "+Inf"}, len(values)))
    lines.append(labelled(f"{name}_count", labels, len(values)))
    lines.append(labelled(f"{name}_sum", labels, round(sum(values), 6)))
    return lines


def summary_lines(name: str, labels: Mapping[str, Any], values: Sequence[float]) -> list[str]:
    """A summary: the quantiles results.json gives (interpolated as its percentiles are), count, sum."""
    described = describe(values)
    lines = [
        labelled(name, {**labels, "quantile": quantile}, described[key])
        for quantile, key in QUANTILES
        if key in described
    ]
    lines.append(labelled(f"{name}_count", labels, len(values)))
    lines.append(labelled(f"{name}_sum", labels, round(sum(values), 6)))
    return lines


def episode_classes(batches: Sequence[tuple[str, BatchSummary]]) -> dict[str, int]:
    """How many episodes of the measured batches ended in each class."""
    counts = dict.fromkeys(EPISODE_CLASSES, 0)
    for _, summary in batches:
        counts["ok"] += len(summary.episodes)
        for record in summary.failed:
            kind = record.get("failure_class") or "ok"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def phase_values(batches: Sequence[tuple[str, BatchSummary]]) -> dict[str, list[float]]:
    """Each phase's seconds over every episode that has it (failed ones as far as they got)."""
    values: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _, summary in batches:
        for record in [*summary.episodes, *summary.failed]:
            for phase, measured in (record.get("phases") or {}).items():
                if measured is not None:
                    values.setdefault(phase, []).append(measured[0])
    return values


def figure_gauges(figures: Mapping[str, Any], run: Mapping[str, str]) -> list[str]:
    """The batch-wide figures of results.json that have a value, one gauge each."""
    lines: list[str] = []
    for key, help_text in (
        ("batch_to_all_ready_seconds", "Job created to the last episode ready (the guide's)."),
        ("batch_to_all_rewards_seconds", "Job created to the last reward (the guide's)."),
        ("client_job_complete_seconds", "Submission to the client seeing the Job end."),
        ("reward_mean", "Mean reward over the run's episodes (results.json's reward_mean)."),
    ):
        if figures.get(key) is not None:
            name = f"{PREFIX}_{key}"
            lines += family(name, "gauge", help_text, [labelled(name, run, figures[key])])
    return lines


def info_series(figures: Mapping[str, Any], run: Mapping[str, str]) -> list[str]:
    """The run's info series: what it ran, where, and with which version of the tool."""
    info = {
        **run,
        "image": figures.get("image") or "",
        "runtime_class": figures.get("runtime") or "",
        "namespace": figures.get("namespace") or "",
        "context": figures.get("context") or "",
        "version": __version__,
    }
    return family(
        f"{PREFIX}_run_info",
        "gauge",
        "The run: its id, image, runtime class, namespace, context and the tool's version.",
        [labelled(f"{PREFIX}_run_info", info, 1)],
    )


def class_series(classes: Mapping[str, int], run: Mapping[str, str]) -> list[str]:
    return family(
        f"{PREFIX}_episodes",
        "gauge",
        "Episodes of the run by class (rewards.jsonl's failure_class; ok for none).",
        [labelled(f"{PREFIX}_episodes", {**run, "class": k}, n) for k, n in classes.items()],
    )


def phase_series(values: Mapping[str, Sequence[float]], run: Mapping[str, str]) -> list[str]:
    """One histogram per phase, under one family (whose help a Pushgateway holds the same for
    every group pushed to it: a run's and a pool's say the same)."""
    lines = [
        line
        for phase, seconds in values.items()
        for line in histogram(f"{PREFIX}_phase_seconds", {**run, "phase": phase}, seconds)
    ]
    return family(
        f"{PREFIX}_phase_seconds",
        "histogram",
        "Each episode's phases (docs/measurement.md), seconds, from their sharpest points.",
        lines,
    )


def statistic_series(
    name: str, help_text: str, statistics: Mapping[str, Any], run: Mapping[str, str]
) -> list[str]:
    """A gauge per statistic of one figure (p50, p95, max...) that has a value."""
    samples = [
        labelled(f"{PREFIX}_{name}", {**run, "statistic": key}, value)
        for key, value in statistics.items()
        if value is not None
    ]
    return family(f"{PREFIX}_{name}", "gauge", help_text, samples)


def reward_series(rewards: Sequence[float], run: Mapping[str, str]) -> list[str]:
    return family(
        f"{PREFIX}_reward",
        "summary",
        "The rewards of the run's episodes that produced one.",
        summary_lines(f"{PREFIX}_reward", run, rewards),
    )


def metrics_text(
    figures: Mapping[str, Any], batches: Sequence[tuple[str, BatchSummary]], run_id: str
) -> str:
    """metrics.prom from what results.json is made of: its figures and its measured batches."""
    run = {"run_id": run_id}
    lines = info_series(figures, run) + class_series(episode_classes(batches), run)
    lines += phase_series(phase_values(batches), run)
    lines += statistic_series(
        "pod_to_ready_seconds",
        "Pod created to episode ready: results.json's pod_to_ready_<statistic>_seconds, the "
        "guide's figure (a rollout's failed episodes counted at the deadline).",
        {key: figures.get(f"pod_to_ready_{key}_seconds") for key in ("p50", "p95", "max")},
        run,
    )
    rewards = [row["reward"] for row in figures.get("pods") or () if row.get("reward") is not None]
    lines += reward_series(rewards, run)
    lines += figure_gauges(figures, run)
    return "\n".join([*lines, "# EOF", ""])


def redacted(url: str) -> str:
    """A URL fit to print and save: no user or password, no query."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def with_credentials(url: str, headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A URL's user and password (`https://user:pass@host/`) sent as HTTP basic auth, the URL
    without them: urllib would take them for part of the host, and its error then quotes them."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, dict(headers)
    given = (
        f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
    )
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port else ""
    bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    auth = "Basic " + base64.b64encode(given.encode("utf-8")).decode("ascii")
    return bare, {"Authorization": auth, **headers}


def push_url(gateway: str, run_id: str) -> str:
    """The Pushgateway's URL for this run's group: job rl_batch_demo, run_id the run's."""
    return (
        f"{gateway.rstrip('/')}/metrics/job/{PREFIX}/run_id/{urllib.parse.quote(run_id, safe='')}"
    )


def push_metrics(gateway: str, run_id: str, text: str) -> str | None:
    """PUT the run's metrics to a Pushgateway, replacing its group; what went wrong, or None."""
    # The classic text format, which the Pushgateway parses; `# EOF` is a comment to it.
    url, headers = with_credentials(
        push_url(gateway, run_id), {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )
    request = urllib.request.Request(url, data=text.encode("utf-8"), method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=PUSH_TIMEOUT_SECONDS) as response:
            response.read()
    except urllib.error.HTTPError as error:
        body = error.read().decode("utf-8", "replace").strip()[:300]
        return f"the Pushgateway answered {error.code} {error.reason}: {body}"
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        return f"cannot reach the Pushgateway at {redacted(gateway)}: {error}"
    return None


def write_metrics(
    output: str,
    figures: Mapping[str, Any],
    batches: Sequence[tuple[str, BatchSummary]],
    run_id: str,
) -> None:
    """metrics.prom in the run's directory, beside results.json and made of the same; left as it
    is when it says that already (`report` of a run that wrote it)."""
    write_metrics_text(output, metrics_text(figures, batches, run_id))


def write_metrics_text(output: str, text: str) -> None:
    """metrics.prom written, unless it holds `text` already."""
    path = os.path.join(output, METRICS_FILE)
    if not os.path.exists(path) or read_text(path) != text:
        write_text(path, text)


def push_saved_metrics(output: str, gateway: str, run_id: str) -> bool:
    """--pushgateway: the run's metrics.prom pushed; a failure is a warning, never the run's."""
    problem = push_metrics(gateway, run_id, read_text(os.path.join(output, METRICS_FILE)))
    if problem is not None:
        print(f"Warning: metrics not pushed: {problem}", file=sys.stderr)
    return problem is None


# --------------------------------------------------------------------------
# src/rl_batch_demo/telemetry.py: OpenTelemetry traces of a run over OTLP/HTTP with JSON encoding: standard library only.

SERVICE_NAME = "rl_batch_demo"
TRACES_PATH = "/v1/traces"
# OTEL_BSP_MAX_EXPORT_BATCH_SIZE's default: spans a request, so that one request stays small.
MAX_SPANS_PER_REQUEST = 512
# Each request: this many attempts at most, waiting between them as the server's Retry-After
# says (capped), else doubling from RETRY_FIRST_SECONDS.
MAX_ATTEMPTS = 5
RETRY_FIRST_SECONDS = 0.5
RETRY_AFTER_CAP_SECONDS = 30.0
OTLP_REQUEST_TIMEOUT_SECONDS = 10.0
# How long the end of the run waits for what is still queued before it counts it not exported.
CLOSE_WAIT_SECONDS = 60.0
RETRIED_STATUSES = (429, 502, 503, 504)
# Phases that are sums of others: the episode's own span already covers them.
SUMMED_PHASES = ("pod_to_ready", "pod_to_reward")
STATUS_ERROR = 2
SPAN_KIND_INTERNAL = 1


class OtlpConfig(NamedTuple):
    """Where spans go and what they say of their source; `headers` are secrets."""

    url: str  # the traces URL
    headers: dict[str, str]
    resource: dict[str, str]


def key_values(text: str | None) -> dict[str, str]:
    """`k1=v1,k2=v2` with URL-encoded values, as the OTEL_* variables write them; a pair
    without `=` is skipped."""
    pairs: dict[str, str] = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return pairs


def traces_url(base: str) -> str:
    """A base endpoint with /v1/traces added, unless it names it already."""
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def otlp_config(endpoint: str | None, environ: Mapping[str, str]) -> OtlpConfig | None:
    """The export's settings from the flag and the standard variables; None for no export."""
    if endpoint:
        url = traces_url(endpoint)
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        url = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = traces_url(environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    else:
        return None
    headers = key_values(environ.get("OTEL_EXPORTER_OTLP_HEADERS"))
    headers.update(key_values(environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")))
    resource = key_values(environ.get("OTEL_RESOURCE_ATTRIBUTES"))
    resource["service.name"] = (
        environ.get("OTEL_SERVICE_NAME") or resource.get("service.name") or SERVICE_NAME
    )
    resource.setdefault("service.version", __version__)
    return OtlpConfig(url, headers, resource)


def nanos(at: float) -> str:
    """Unix nanoseconds of a point, at the microsecond episodes.csv writes it (`%.6f`)."""
    return str(int(f"{at:.6f}".replace(".", "")) * 1000)


def attribute(key: str, value: Any) -> dict:
    """One OTLP attribute; bool before int, since a bool is an int to Python."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float) and math.isfinite(value):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def attributes(pairs: Mapping[str, Any]) -> list[dict]:
    return [attribute(key, value) for key, value in pairs.items() if value is not None]


def new_id(size: int) -> str:
    return os.urandom(size).hex()


def span(
    trace_id: str,
    parent: str | None,
    name: str,
    start: float,
    end: float,
    pairs: Mapping[str, Any],
    error: str | None = None,
) -> dict:
    """One span in OTLP JSON (ids as hex, times as decimal strings of nanoseconds)."""
    made = {
        "traceId": trace_id,
        "spanId": new_id(8),
        "name": name,
        "kind": SPAN_KIND_INTERNAL,
        "startTimeUnixNano": nanos(start),
        "endTimeUnixNano": nanos(max(start, end)),
        "attributes": attributes(pairs),
    }
    if parent is not None:
        made["parentSpanId"] = parent
    if error is not None:
        made["status"] = {"code": STATUS_ERROR, "message": error}
    return made


def point_attributes(points: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """Each known point's time (Unix seconds), precision and source."""
    pairs: dict[str, Any] = {}
    for name in names:
        point = points.get(name)
        if point is not None:
            pairs[f"point.{name}.at"] = round(point[0], 6)
            pairs[f"point.{name}.precision_seconds"] = float(f"{point[1]:.6g}")  # as the CSV
            pairs[f"point.{name}.source"] = getattr(point, "source", None)
    return pairs


def known_points(points: Mapping[str, Any], names: Sequence[str] = POINTS) -> list[float]:
    return [points[name][0] for name in names if points.get(name) is not None]


class PhaseTable(NamedTuple):
    """What an episode's spans are made of: its points in order, its phases (each from one point
    to another), and the phases that are sums of others (the episode's own span covers them)."""

    points: Sequence[str]
    phases: Mapping[str, tuple[str, str]]
    summed: Sequence[str]


RUN_PHASES = PhaseTable(POINTS, PHASES, SUMMED_PHASES)


def episode_spans(
    trace_id: str,
    parent: str,
    record: Mapping[str, Any],
    batch_start: float,
    table: PhaseTable | None = None,
) -> list[dict]:
    """An episode's span and its phases' spans; a failed episode's span is an error with its
    failure (one whose pod never existed has no points: a moment at its batch's start). `table`:
    the points and phases of another kind of episode (a pool's), else a run's."""
    table = table or RUN_PHASES
    points = record.get("points") or {}
    times = known_points(points, table.points)
    start, end = (min(times), max(times)) if times else (batch_start, batch_start)
    failure = record.get("failure")
    pairs = {
        "episode.index": None if record.get("index") is None else int(record["index"]),
        "episode.task": record.get("task_id"),
        "container.image.name": record.get("image"),
        "k8s.node.name": record.get("node"),
        "k8s.pod.name": record.get("pod"),
        "episode.class": record.get("failure_class") or "ok",
        "episode.valid": record.get("valid") is not False,
        "episode.reward": None if record.get("reward") is None else float(record["reward"]),
        **point_attributes(points, table.points),
    }
    if failure is not None:
        pairs["error.type"] = record.get("failure_class") or "failure"
    name = (
        f"episode {record.get('index') if record.get('index') is not None else record.get('pod')}"
    )
    episode = span(trace_id, parent, name, start, end, pairs, failure)
    spans = [episode]
    for phase, (first, last) in table.phases.items():
        measured = (record.get("phases") or {}).get(phase)
        if phase in table.summed or measured is None:
            continue
        if points.get(first) is None or points.get(last) is None:
            continue
        phase_pairs = {
            "phase.seconds": float(measured[0]),
            "phase.precision_seconds": float(f"{measured[1]:.6g}"),
            **point_attributes(points, (first, last)),
        }
        spans.append(
            span(trace_id, episode["spanId"], phase, points[first][0], points[last][0], phase_pairs)
        )
    return spans


def episode_records(summary: BatchSummary) -> list[dict]:
    """The batch's episodes, each with what its row of episodes.csv says beside its points."""
    rows = {row["pod"]: row for row in summary.figures.get("pods") or ()}
    records = []
    for record in summary.episodes:
        row = rows.get(record["pod"], {})
        records.append({**row, **record, "reward": row.get("reward"), "node": row.get("node")})
    return records + list(summary.failed)


def batch_spans(
    trace_id: str, parent: str, job: str, summary: BatchSummary, measured: bool
) -> list[dict]:
    """A batch's span (its Job's creation to its last episode's last point) and its episodes'."""
    created = summary.figures.get("job_created") or {}
    start = created.get("at", summary.job_created)
    records = episode_records(summary)
    ends = [at for record in records for at in known_points(record.get("points") or {})]
    batch = span(
        trace_id,
        parent,
        f"batch {job}",
        start,
        max([start, *ends]),
        {
            "k8s.job.name": job,
            "batch.measured": measured,
            "batch.episodes": len(records),
            "batch.failed_episodes": len(summary.failed),
            "point.job_created.precision_seconds": created.get("precision"),
        },
    )
    return [batch] + [
        s for r in records for s in episode_spans(trace_id, batch["spanId"], r, start)
    ]


def resource_spans(config: OtlpConfig, spans: Sequence[dict]) -> dict:
    """The body of one export request."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": attributes(config.resource)},
                "scopeSpans": [
                    {"scope": {"name": SERVICE_NAME, "version": __version__}, "spans": list(spans)}
                ],
            }
        ]
    }


def retry_after(value: str | None, attempt: int) -> float:
    """How long to wait before the next attempt: the server's Retry-After (seconds or an HTTP
    date), capped; else exponential backoff."""
    if value:
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError):
                seconds = RETRY_FIRST_SECONDS * 2**attempt
        return min(max(0.0, seconds), RETRY_AFTER_CAP_SECONDS)
    return RETRY_FIRST_SECONDS * 2**attempt


class Response(NamedTuple):
    status: int  # 0: no answer
    retry_after: str | None
    body: str


def post(url: str, headers: Mapping[str, str], body: bytes) -> Response:
    """POST one request; an HTTP error is a Response, no answer is status 0."""
    url, sent = with_credentials(url, {**headers, "Content-Type": "application/json"})
    request = urllib.request.Request(url, data=body, method="POST", headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=OTLP_REQUEST_TIMEOUT_SECONDS) as answer:
            return Response(answer.status, None, answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        text = error.read().decode("utf-8", "replace")
        return Response(error.code, error.headers.get("Retry-After"), text)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        # ValueError: a bad URL; HTTPException: a bad port, or the connection cut mid-answer
        reason = getattr(error, "reason", error)
        return Response(0, None, str(reason))


class ExportRecord:
    """What was exported and what was not, and why: results.json's `telemetry`."""

    def __init__(self, url: str) -> None:
        self.endpoint = redacted(url)
        self.spans = 0
        self.exported = 0
        self.not_exported = 0
        self.requests = 0
        self.retries = 0
        self.errors: list[str] = []

    def saved(self) -> dict[str, Any]:
        return {
            "otlp_endpoint": self.endpoint,
            "trace_id": None,
            "spans": self.spans,
            "exported_spans": self.exported,
            "not_exported_spans": self.not_exported,
            "requests": self.requests,
            "retries": self.retries,
            "errors": self.errors[:10],
        }


class SpanExporter:
    """Spans sent from a thread of their own, at most MAX_SPANS_PER_REQUEST a request, each
    request retried on 429/502/503/504 and on no answer, as Retry-After says. Once a request has
    failed for good the exporter gives up: what comes after is counted, not sent, so a collector
    gone away costs the run one request's retries, not one per batch."""

    def __init__(
        self,
        config: OtlpConfig,
        send: Callable[[str, Mapping[str, str], bytes], Response] = post,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config, self.send, self.sleep = config, send, sleep
        self.record = ExportRecord(config.url)
        self.given_up = False
        self.abandoned = False  # closed with a request in flight: close() counted what was left
        self.counting = threading.Lock()
        self.queue: queue.Queue[list[dict] | None] = queue.Queue()
        self.thread = threading.Thread(target=self.work, name="otlp-exporter", daemon=True)
        self.thread.start()

    def submit(self, spans: list[dict]) -> None:
        self.record.spans += len(spans)
        for first in range(0, len(spans), MAX_SPANS_PER_REQUEST):
            self.queue.put(spans[first : first + MAX_SPANS_PER_REQUEST])

    def work(self) -> None:
        while True:
            spans = self.queue.get()
            if spans is None:
                return
            sent = not self.given_up and self.export(spans)
            with self.counting:
                if self.abandoned:
                    return  # close() already counted these spans as not exported
                if sent:
                    self.record.exported += len(spans)
                else:
                    self.record.not_exported += len(spans)
                    self.given_up = True

    def export(self, spans: list[dict]) -> bool:
        """One request, retried; whether the collector took its spans (a partial success counts
        the spans it rejected as not exported)."""
        body = json.dumps(resource_spans(self.config, spans)).encode("utf-8")
        for attempt in range(MAX_ATTEMPTS):
            self.record.requests += 1
            answer = self.send(self.config.url, self.config.headers, body)
            if 200 <= answer.status < 300:
                self.count_rejected(answer.body)
                return True
            retried = answer.status == 0 or answer.status in RETRIED_STATUSES
            if not retried or attempt == MAX_ATTEMPTS - 1:
                said = "no answer" if answer.status == 0 else f"HTTP {answer.status}"
                self.record.errors.append(f"{said}: {answer.body.strip()[:200]}")
                return False
            self.record.retries += 1
            self.sleep(retry_after(answer.retry_after, attempt))
        return False

    def count_rejected(self, body: str) -> None:
        try:
            partial = (json.loads(body or "{}") or {}).get("partialSuccess") or {}
            rejected = int(partial.get("rejectedSpans") or 0)
        except (ValueError, AttributeError, TypeError):
            return
        if rejected:
            self.record.exported -= rejected
            self.record.not_exported += rejected
            self.record.errors.append(f"rejected {rejected}: {partial.get('errorMessage', '')}")

    def close(self, wait: float = CLOSE_WAIT_SECONDS) -> ExportRecord:
        """Wait (at most `wait` seconds) for what is queued; what is left is not exported."""
        self.queue.put(None)
        self.thread.join(wait)
        with self.counting:
            if self.thread.is_alive():
                # A request still in flight is counted not exported: whether it lands is unknown.
                self.given_up = self.abandoned = True
                left = self.record.spans - self.record.exported - self.record.not_exported
                self.record.not_exported += left
                self.record.errors.append(
                    f"{left} spans still queued or in flight after {wait:.0f} s"
                )
        return self.record


class RunTracer:
    """One run's trace: its batches' spans handed to the exporter as each batch is summarised,
    the run's root span at the end."""

    def __init__(
        self,
        config: OtlpConfig,
        run_id: str,
        exporter: SpanExporter | None = None,
        kind: str = "run",
    ) -> None:
        self.trace_id = new_id(16)
        self.root_id = new_id(8)
        self.run_id = run_id
        self.kind = kind  # the root span's name: "run <id>", or "pool <id>"
        self.exporter = exporter or SpanExporter(config)
        self.bounds: list[float] = []
        self.adding = threading.Lock()  # a pool's episodes end on many trainer threads

    def batch_done(self, job: str, summary: BatchSummary, measured: bool = True) -> None:
        self.add(batch_spans(self.trace_id, self.root_id, job, summary, measured))

    def add(self, spans: list[dict]) -> None:
        """Spans under the root sent now; the first's start and end widen the root's."""
        with self.adding:
            self.bounds += [
                int(spans[0][key]) / 1e9 for key in ("startTimeUnixNano", "endTimeUnixNano")
            ]
            self.exporter.submit(spans)

    def finish(self, figures: Mapping[str, Any] | None, failure: str | None = None) -> dict:
        """The root span sent, the exporter closed: what was exported, for results.json."""
        now = time.time()
        start, end = (min(self.bounds), max(self.bounds)) if self.bounds else (now, now)
        figures = figures or {}
        root = span(
            self.trace_id,
            None,
            f"{self.kind} {self.run_id}",
            start,
            end,
            {
                "run.id": self.run_id,
                "k8s.namespace.name": figures.get("namespace"),
                "container.image.name": figures.get("image"),
                "k8s.runtime_class": figures.get("runtime"),
                "run.episodes": figures.get("episodes"),
                "run.successful_episodes": figures.get("successful_episodes"),
            },
            failure,
        )
        root["spanId"] = self.root_id
        with self.adding:
            self.exporter.submit([root])
        saved = self.exporter.close().saved()
        saved["trace_id"] = self.trace_id
        return saved


def open_tracer(
    endpoint: str | None, run_id: str, environ: Mapping[str, str] = os.environ, kind: str = "run"
) -> RunTracer | None:
    """The run's tracer when an endpoint is set (flag or environment), else None; `kind` names
    its root span ("pool" for a pool's)."""
    config = otlp_config(endpoint, environ)
    return None if config is None else RunTracer(config, run_id, kind=kind)


def say_export(saved: Mapping[str, Any], quiet: bool = False) -> None:
    """A warning for what was not exported (whatever --quiet says); else a line, unless quiet."""
    if saved["not_exported_spans"]:
        reasons = "; ".join(saved["errors"][:3])
        print(
            f"Warning: traces: {saved['not_exported_spans']} of {saved['spans']} spans not "
            f"exported to {saved['otlp_endpoint']} ({reasons}); the run's files hold them all",
            file=sys.stderr,
        )
    elif not quiet:
        print(
            f"Traces: {saved['spans']} spans exported to {saved['otlp_endpoint']} "
            f"(trace {saved['trace_id']})",
            file=sys.stderr,
        )


def export_batches(
    tracer: RunTracer, batches: Sequence[tuple[str, BatchSummary]], figures: Mapping[str, Any]
) -> dict:
    """A saved run's trace (`report DIR --otlp-endpoint`): every measured batch, then the root."""
    for job, summary in batches:
        tracer.batch_done(job, summary)
    return tracer.finish(figures)


def finish_trace(
    tracer: RunTracer,
    output: str,
    figures: dict[str, Any] | None,
    failure: BaseException | None,
    quiet: bool,
) -> None:
    """The end of a run's trace: the root span (an error for a failed run) sent, what was not
    exported said, and recorded as `telemetry` in results.json (and the figures) when there is one."""
    saved = tracer.finish(figures, None if failure is None else str(failure).splitlines()[0])
    say_export(saved, quiet)
    if figures is None:
        return
    figures["telemetry"] = saved
    path = os.path.join(output, RESULTS_FILE)
    if os.path.exists(path):
        write_json(path, dict(read_json(path, RESULTS_FILE), telemetry=saved))


# --------------------------------------------------------------------------
# src/rl_batch_demo/pooltelemetry.py: A pool's episodes as points and phases, for its metrics.prom and its trace.

CLIENT_CLOCK = "client"
SERVER_CLOCK = "sandbox server"
# A pool's episodes.csv: each episode's sandbox start and its own claim, each point as an absolute
# time with its precision and source, and the phases between them with theirs.
POOL_POINTS = (
    ("pod_created", WHOLE_SECOND, "the pod's creationTimestamp"),
    ("container_started", WHOLE_SECOND, "the kubelet's container status"),
    ("server_ready", 0.0, "the sandbox server's clock"),
    ("claimed", 0.0, "the client's clock"),
    ("finished", 0.0, "the client's clock"),
)
POINT_CLOCKS = {
    "pod_created": REFERENCE_CLOCK,
    "container_started": REFERENCE_CLOCK,
    "server_ready": SERVER_CLOCK,
}
# The points a sandbox's start gives the first episode it serves.
SANDBOX_POINTS = ("pod_created", "container_started", "server_ready")
# Where the trainer asked for a sandbox: `claimed` less the claim's wait (episodes.csv's
# claim_wait_seconds), on the client's clock.
CLAIM_ASKED = "claim_asked"
POOL_PHASES = {
    "pod_start": ("pod_created", "container_started"),
    "server_start": ("container_started", "server_ready"),
    "pod_to_ready": ("pod_created", "server_ready"),
    "claim_wait": (CLAIM_ASKED, "claimed"),
    "episode_work": ("claimed", "finished"),
}
POOL_TABLE = PhaseTable(
    (*SANDBOX_POINTS, CLAIM_ASKED, "claimed", "finished"), POOL_PHASES, ("pod_to_ready",)
)


class PoolTelemetry(NamedTuple):
    """Where a pool's telemetry goes: its trace (--otlp-endpoint or the OTEL_* variables), its
    metrics.prom pushed at the close (--pushgateway), and whether to say where the spans went."""

    tracer: RunTracer | None = None
    pushgateway: str | None = None
    quiet: bool = True


def sandbox_start(
    pod: str, created: float | None, started: float | None, ready: float | None
) -> dict:
    """results.json's record of one sandbox's start: its points, and between the container's
    start and the server listening `server_start`, as precise as the coarser point."""
    return {
        "pod": pod,
        "pod_created_at": created,
        "container_started_at": started,
        "container_started_precision_seconds": WHOLE_SECOND,
        "server_ready_at": ready,
        "server_ready_source": "the sandbox server's clock",
        "server_start_seconds": round(ready - started, 6) if ready and started else None,
        "server_start_precision_seconds": WHOLE_SECOND,
    }


def pool_points(line: Mapping[str, Any], start: Mapping[str, Any], first_use: bool) -> dict:
    """An episode's points from its rewards.jsonl line and its sandbox's start (sandbox_points'
    record), each a Point at the time episodes.csv writes; the sandbox's only on its first use."""
    at = {
        "pod_created": start.get("pod_created_at"),
        "container_started": start.get("container_started_at"),
        "server_ready": start.get("server_ready_at"),
        "claimed": line.get("claimed_at"),
        "finished": line.get("finished_at"),
    }
    points = {}
    for name, precision, source in POOL_POINTS:
        moment = at[name]
        if moment is not None and (first_use or name not in SANDBOX_POINTS):
            points[name] = Point(moment, precision, source, POINT_CLOCKS.get(name, CLIENT_CLOCK))
    if line.get("claimed_at") is not None and line.get("claim_wait_seconds") is not None:
        asked = round(line["claimed_at"] - line["claim_wait_seconds"], 6)
        points[CLAIM_ASKED] = Point(
            asked, 0.0, "the client's clock, claimed less its wait", CLIENT_CLOCK
        )
    return points


def pool_phases(points: Mapping[str, Point]) -> dict[str, tuple[float, float]]:
    """Each phase with both its points: its seconds (0 for an end placed before its start, as
    two points closer than their precisions may be) and its precision (the coarser point's)."""
    phases = {}
    for phase, (first, last) in POOL_PHASES.items():
        if first in points and last in points:
            seconds = max(0.0, points[last].at - points[first].at)
            precision = max(points[first].precision, points[last].precision)
            phases[phase] = (round(seconds, 6), precision)
    return phases


def pool_episode(
    line: Mapping[str, Any], start: Mapping[str, Any], first_use: bool, node: str | None = None
) -> dict:
    """One episode of a pool as a run's episode record reads: what its span and metrics need."""
    points = pool_points(line, start, first_use)
    return {
        "index": line.get("index"),
        "task_id": line.get("task_id"),
        "image": line.get("image"),
        "node": node,
        "pod": line.get("sandbox"),
        "failure_class": line.get("failure_class"),
        "failure": line.get("failure"),
        "valid": line.get("valid"),
        "reward": line.get("reward"),
        "points": points,
        "phases": pool_phases(points),
    }


def first_uses(lines: Iterable[Mapping[str, Any]]) -> set[int]:
    """The index of each sandbox's first episode: a sandbox serves one claim at a time, and
    claims are numbered as they are given."""
    first: dict[str, int] = {}
    for line in lines:
        sandbox, index = line["sandbox"], line["index"]
        first[sandbox] = min(index, first.get(sandbox, index))
    return set(first.values())


def pool_episodes(
    lines: Sequence[Mapping[str, Any]], starts: Sequence[Mapping[str, Any]]
) -> list[dict]:
    """Every episode of a pool, in index order, from rewards.jsonl's lines and the sandboxes'
    starts."""
    by_pod = {start["pod"]: start for start in starts}
    firsts = first_uses(lines)
    return [
        pool_episode(line, by_pod.get(line["sandbox"]) or {}, line["index"] in firsts)
        for line in sorted(lines, key=lambda line: line["index"])
    ]


def pod_to_ready(starts: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each sandbox's pod created to its server listening, seconds."""
    return [
        round(start["server_ready_at"] - start["pod_created_at"], 6)
        for start in starts
        if start.get("server_ready_at") is not None and start.get("pod_created_at") is not None
    ]


def pool_metrics_text(figures: Mapping[str, Any], episodes: Sequence[dict], run_id: str) -> str:
    """A pool's metrics.prom, from its results.json and its episodes (pool_episodes)."""
    run = {"run_id": run_id}
    classes = dict.fromkeys(EPISODE_CLASSES, 0)
    for record in episodes:
        kind = record.get("failure_class") or "ok"
        classes[kind] = classes.get(kind, 0) + 1
    phases: dict[str, list[float]] = {phase: [] for phase in POOL_PHASES}
    for record in episodes:
        for phase, (seconds, _precision) in record["phases"].items():
            phases[phase].append(seconds)
    block = figures.get("pool") or {}
    lines = info_series(figures, run) + class_series(classes, run) + phase_series(phases, run)
    for name, help_text in (
        ("pod_to_ready_seconds", "A sandbox's pod created to its server listening."),
        ("claim_wait_seconds", "A claim asked to a sandbox given, as the trainer waited."),
        ("round_trip_seconds", "A command's round trip, as the client timed it."),
    ):
        given = block.get(name) or {}
        statistics = {k: v for k, v in given.items() if k == "max" or k[1:].isdigit()}
        lines += statistic_series(
            f"pool_{name}", f"{help_text} results.json's pool.{name}.", statistics, run
        )
    for name, help_text in (
        ("size", "The pool's size: its sandboxes at once."),
        ("commands_per_second", "Commands answered per second of the pool's use."),
    ):
        if block.get(name) is not None:
            metric = f"{PREFIX}_pool_{name}"
            lines += family(metric, "gauge", help_text, [labelled(metric, run, block[name])])
    rewards = [r["reward"] for r in episodes if r.get("valid") and r.get("reward") is not None]
    lines += reward_series(rewards, run)
    return "\n".join([*lines, "# EOF", ""])


def write_pool_metrics(
    output: str, figures: Mapping[str, Any], episodes: Sequence[dict], run_id: str
) -> None:
    """metrics.prom in the pool's directory, beside its results.json."""
    write_metrics_text(output, pool_metrics_text(figures, episodes, run_id))


def trace_episode(tracer: RunTracer, record: Mapping[str, Any]) -> None:
    """An episode's span and its phases' spans sent now, under the pool's root span."""
    points = record["points"]
    start = min((point.at for point in points.values()), default=None)
    if start is not None:
        tracer.add(episode_spans(tracer.trace_id, tracer.root_id, record, start, POOL_TABLE))


# A pool's timeline: each episode's sandbox starting, the trainer waiting for it, and its use; the
# blank between a sandbox's start and its claim is the sandbox warm, waiting to be claimed.
POOL_TIMELINE = TimelineKind(
    {
        phase: POOL_PHASES[phase]
        for phase in ("pod_start", "server_start", "claim_wait", "episode_work")
    },
    {
        "pod_start": "#f4a259",
        "server_start": "#e76f51",
        "claim_wait": "#9e9e9e",
        "episode_work": "#4f86c6",
    },
    (
        ("placed below its precision", 'fill="url(#unsplit)"'),
        (FAILED_MEANING.replace(" (or cancelled)", ""), FAILED_FILL.strip()),
        ("gap: the sandbox warm, not yet claimed", 'fill="white" stroke="#999"'),
    ),
    "seconds after the pool's first pod was created (its whole second)",
    chained=False,
)


def pool_row_label(record: Mapping[str, Any]) -> str:
    """A row's name: its task (shortened to fit) and the episode's index."""
    where = f" #{record['index']}"
    task = str(record.get("task_id") or record.get("pod") or "")
    room = LABEL_CHARS - len(where)
    return (task if len(task) <= room else task[: room - 1] + "\u2026") + where


def pool_timeline_svg(episodes: Sequence[dict], title: str) -> str:
    """timeline.svg of a pool: a row per episode (the first TIMELINE_MAX_ROWS by index), its
    phases as bars from the pool's first point, a failed one marked."""
    shown = list(episodes[:TIMELINE_MAX_ROWS])
    if len(episodes) > len(shown):
        title += f" (the first {len(shown)} episodes of {len(episodes)})"
    moments = [point.at for record in shown for point in record["points"].values()]
    origin = float(int(min(moments, default=0.0)))
    # The timeline marks an episode failed when its record names a failure class at all.
    rows = [(origin, {k: v for k, v in r.items() if k != "failure_class" or v}) for r in shown]
    layout = timeline_layout(rows, POOL_TIMELINE)
    parts = timeline_head(layout, title) + timeline_axis(layout)
    for row, (start, record) in enumerate(rows):
        parts += timeline_row(layout, row, start, record, pool_row_label(record))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------
# src/rl_batch_demo/runs.py: Runs in a cluster: what `list` shows and `cleanup --stale` decides, without receipts.

# What a run is doing: a Job of it has not ended, or fewer Jobs than it plans are there yet
# and none ended as a run stops (running; the latter between two batches), every Job not ended
# is suspended (suspended: an interrupted run stops its pods so; queued: each is a queue's Job
# that Kueue holds until it admits it, and has not started), all ended Complete
# (succeeded) or one Failed (failed), its namespace is being deleted (terminating), or
# no Job of the tool is in it yet (pending: a run starting, or one that stopped before
# it submitted its Job).
RUN_STATES = ("running", "suspended", "queued", "succeeded", "failed", "terminating", "pending")
# A Job handed to a Kueue LocalQueue carries this label; suspended and never started, it waits
# for Kueue's admission (queued).
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"

# The reason a Job ends Failed with failed indexes within its maxFailedIndexes (--allow-failures):
# a run accepts that batch and goes on to its next.
ACCEPTED_FAILURES_REASON = "FailedIndexes"


class ClusterRun(NamedTuple):
    """One run found in a cluster: its namespace, what the namespace says of the run, its Jobs' state."""

    namespace: str
    uid: str
    run_id: str  # the agc-demo-run label's value
    annotated_run_id: str | None  # the run-id annotation's; None on a run of the guide's script
    created_at: float | None
    state: str
    jobs: int  # Jobs of the tool in the namespace
    # The episodes the run plans, all told (a run without the annotation: its Jobs' completions).
    episodes: int
    succeeded: int
    user: str | None
    host: str | None
    output: str | None
    expires_at: float | None
    jobs_planned: int | None = None  # None: a guide's run, or one of a version that did not say
    between_batches: bool = False  # running, with every Job there ended and more to come
    last_ended_at: float | None = None  # when its last ended Job ended (None: none has)
    follower: dict | None = None  # the lease of the client that follows it (None: nobody)
    shared: bool = False  # in a namespace it shares (`--namespace`): its Jobs, not the namespace
    job_uids: tuple[tuple[str, str], ...] = ()  # a shared run's Jobs: (name, UID)

    @property
    def place(self) -> str:
        """Where the run is, as list and cleanup --stale name it: its namespace, and in a namespace
        it shares, its run id after it."""
        return f"{self.namespace}/{self.run_id}" if self.shared else self.namespace

    @property
    def guide(self) -> bool:
        """Made by the guide's script: its label, none of this tool's annotations."""
        return self.annotated_run_id is None

    def age(self, now: float) -> float:
        return max(0.0, now - self.created_at) if self.created_at is not None else 0.0


def planned_count(namespace: dict, key: str) -> int | None:
    """A count the run's namespace says it plans (None: not said, or not a count)."""
    text = ((namespace.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value >= 0 else None


def run_state(namespace: dict, jobs: Sequence[dict]) -> str:
    """One of RUN_STATES, from the namespace's phase, its Jobs' conditions, and how many Jobs the
    run plans: with fewer there, every one ended, and none failed as a run stops, the run is
    between two batches (running), or stopped there without a word (killed, crashed: only the
    time since its last Job ended tells, see stale_verdict)."""
    if (namespace.get("metadata") or {}).get("deletionTimestamp") or (
        namespace.get("status") or {}
    ).get("phase") == "Terminating":
        return "terminating"
    if not jobs:
        return "pending"
    ends = [job_finished(job) for job in jobs]
    if None in ends:
        unended = [job for job, end in zip(jobs, ends) if end is None]
        if not all((j.get("spec") or {}).get("suspend") for j in unended):
            return "running"
        return "queued" if all(awaits_admission(job) for job in unended) else "suspended"
    planned = planned_count(namespace, JOBS_PLANNED_ANNOTATION)
    if (
        planned is not None
        and len(jobs) < planned
        and all(
            end == "Complete"
            or (condition(job, "Failed") or {}).get("reason") == ACCEPTED_FAILURES_REASON
            for job, end in zip(jobs, ends)
        )
    ):
        return "running"
    return "failed" if "Failed" in ends else "succeeded"


def awaits_admission(job: dict) -> bool:
    """A Job of a queue that Kueue holds suspended and that never started (an interrupted run's
    Job, suspended by the run, has started)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    return QUEUE_NAME_LABEL in labels and not (job.get("status") or {}).get("startTime")


def job_ended_at(job: dict) -> float | None:
    """When a Job ended: its Complete or Failed condition's transition (else its completionTime)."""
    end = job_finished(job)
    if end is None:
        return None
    return parse_time((condition(job, end) or {}).get("lastTransitionTime")) or parse_time(
        (job.get("status") or {}).get("completionTime")
    )


def cluster_runs(namespaces: Iterable[dict], jobs: Iterable[dict]) -> list[ClusterRun]:
    """Every namespace with the run label, oldest first, with the tool's Jobs inside it
    (`jobs`: Jobs labelled app=rl-batch-demo, from every namespace); and every run in a namespace
    it shares (`--namespace`), found by its Jobs' run label."""
    by_namespace: dict[str, list[dict]] = {}
    for job in jobs:
        metadata = job.get("metadata") or {}
        if (metadata.get("labels") or {}).get("app") == APP_LABEL:
            by_namespace.setdefault(metadata.get("namespace", ""), []).append(job)
    runs, own = [], set()
    for namespace in namespaces:
        metadata = namespace.get("metadata") or {}
        if RUN_LABEL not in (metadata.get("labels") or {}):
            continue
        own.add(metadata.get("name", ""))
        runs.append(cluster_run(namespace, by_namespace.get(metadata.get("name", ""), [])))
    for name, inside in by_namespace.items():
        if name not in own:
            runs += [
                cluster_run(carrier, run_jobs, shared=True)
                for carrier, run_jobs in shared_runs(name, inside)
            ]
    return sorted(runs, key=lambda run: (run.created_at or 0.0, run.namespace))


def shared_runs(namespace: str, jobs: Sequence[dict]) -> list[tuple[dict, list[dict]]]:
    """The runs in a namespace they share, by their Jobs' run label: each as a stand-in for the
    namespace a run of its own would have (its first Job's labels and annotations) and its Jobs."""
    by_run: dict[str, list[dict]] = {}
    for job in jobs:
        run_id = ((job.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)
        if run_id:
            by_run.setdefault(run_id, []).append(job)
    found = []
    for run_id, run_jobs in by_run.items():
        first = min(run_jobs, key=lambda job: job["metadata"].get("creationTimestamp") or "")
        carrier = {
            "metadata": {
                "name": namespace,
                "uid": "",
                "labels": {RUN_LABEL: run_id},
                "annotations": first["metadata"].get("annotations") or {},
                "creationTimestamp": first["metadata"].get("creationTimestamp"),
            }
        }
        found.append((carrier, run_jobs))
    return found


def cluster_run(namespace: dict, inside: Sequence[dict], shared: bool = False) -> ClusterRun:
    """One run from its namespace (or, `shared`, its stand-in) and the tool's Jobs in it."""
    metadata = namespace.get("metadata") or {}
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    state = run_state(namespace, inside)
    ended = [job_ended_at(job) for job in inside if job_finished(job) is not None]
    planned_episodes = planned_count(namespace, EPISODES_PLANNED_ANNOTATION)
    return ClusterRun(
        namespace=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        run_id=labels[RUN_LABEL],
        annotated_run_id=annotations.get(RUN_ID_ANNOTATION),
        created_at=parse_time(metadata.get("creationTimestamp")),
        state=state,
        jobs=len(inside),
        episodes=planned_episodes
        if planned_episodes is not None
        else sum(int((job.get("spec") or {}).get("completions") or 1) for job in inside),
        succeeded=sum(int((job.get("status") or {}).get("succeeded") or 0) for job in inside),
        user=annotations.get(USER_ANNOTATION),
        host=annotations.get(HOST_ANNOTATION),
        output=annotations.get(OUTPUT_ANNOTATION),
        expires_at=parse_time(annotations.get(EXPIRES_ANNOTATION)),
        jobs_planned=planned_count(namespace, JOBS_PLANNED_ANNOTATION),
        between_batches=state == "running" and bool(inside) and len(ended) == len(inside),
        last_ended_at=max((at for at in ended if at is not None), default=None),
        follower=follower_lease(annotations.get(FOLLOWER_ANNOTATION)),
        shared=shared,
        job_uids=tuple(
            (
                (job.get("metadata") or {}).get("name", ""),
                (job.get("metadata") or {}).get("uid", ""),
            )
            for job in inside
        )
        if shared
        else (),
    )


def follower_lease(text: str | None) -> dict | None:
    """The follower lease's record (lease.lease_record), or None: none, or not one."""
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("host") else None


def follower_record(run: ClusterRun, now: float) -> dict | None:
    """Who follows the run, as `list -o json` prints it: host, PID, when the lease was last
    renewed, and whether that is older than LEASE_STALE_PERIODS periods (its client looks gone)."""
    lease = run.follower
    if lease is None:
        return None
    renewed = parse_time(str(lease.get("renewTime") or ""))
    period = lease.get("renewPeriodSeconds") or LEASE_RENEW_SECONDS
    return {
        "host": lease.get("host"),
        "pid": lease.get("pid"),
        "output": lease.get("output"),
        "renewed": lease.get("renewTime"),
        "stale": renewed is None or now - renewed >= LEASE_STALE_PERIODS * float(period),
    }


def follower_text(run: ClusterRun, now: float) -> str:
    record = follower_record(run, now)
    if record is None:
        return "-"
    return f"{record['host']}/{record['pid']}" + (" (stale)" if record["stale"] else "")


def run_record(run: ClusterRun, now: float) -> dict:
    """One run as `list -o json` prints it."""
    return {
        "namespace": run.namespace,
        "uid": run.uid,
        "run_id": run.annotated_run_id or run.run_id,
        "state": run.state,
        "age_seconds": round(run.age(now)),
        "episodes": run.episodes,
        "succeeded": run.succeeded,
        "user": run.user,
        "host": run.host,
        "output": run.output,
        "expires": rfc3339(run.expires_at) if run.expires_at is not None else None,
        "guide": run.guide,
        "jobs": run.jobs,
        "jobs_planned": run.jobs_planned,
        "between_batches": run.between_batches,
        "last_job_ended": rfc3339(run.last_ended_at) if run.last_ended_at is not None else None,
        "follower": follower_record(run, now),
        **({"shared_namespace": True} if run.shared else {}),
    }


def expiry_text(run: ClusterRun, now: float) -> str:
    if run.expires_at is None:
        return "-"
    if run.expires_at <= now:
        return f"expired {format_duration(now - run.expires_at)} ago"
    return f"in {format_duration(run.expires_at - now)}"


def runs_table(runs: Sequence[ClusterRun], now: float) -> str:
    """One line per run: namespace, state, age, episodes done of total, who and where from, expiry."""
    rows = [("NAMESPACE", "STATE", "AGE", "EPISODES", "USER", "FROM", "EXPIRES", "FOLLOWER")]
    for run in runs:
        where = "(guide's script)" if run.guide else f"{run.host or '?'}:{run.output or '?'}"
        rows.append(
            (
                run.place,
                run.state,
                format_duration(run.age(now)),
                f"{run.succeeded}/{run.episodes}",
                run.user or "-",
                where,
                expiry_text(run, now),
                follower_text(run, now),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


class Verdict(NamedTuple):
    """What `cleanup --stale` does with one run, and why."""

    delete: bool
    why: str


def stale_verdict(
    run: ClusterRun, now: float, stale_seconds: float, user: str, all_users: bool
) -> Verdict:
    """Delete a run of this tool, proven so, of `user` (or anyone's, with `all_users`), that is past
    its --ttl, or older than `stale_seconds` with every Job ended; leave anything else, saying why.
    A run between two batches (fewer Jobs than it plans, all ended) may be alive, about to make its
    next Job, or may have stopped there (killed, crashed): it is stale only once its last Job ended
    longer than `stale_seconds` ago."""
    spared = unproven_verdict(run, user, all_users)
    if spared is not None:
        return spared
    if run.expires_at is not None and run.expires_at <= now:
        state = f"{run.state} (between batches)" if run.between_batches else run.state
        return Verdict(
            True,
            f"{state}, past its --ttl (expired {format_duration(now - run.expires_at)} ago)",
        )
    if run.between_batches:
        return between_batches_verdict(run, now, stale_seconds)
    return age_verdict(run, now, stale_seconds)


def unproven_verdict(run: ClusterRun, user: str, all_users: bool) -> Verdict | None:
    """Why `cleanup --stale` leaves a run it may not take for its own: already being deleted, the
    guide's, not proven this tool's, or another user's; None for a run it may judge."""
    if run.state == "terminating":
        return Verdict(False, "already being deleted (Terminating)")
    if run.guide:
        return Verdict(
            False,
            "made by the guide's script (no run-id annotation): clean it up with its receipt "
            "(cleanup --output DIR)",
        )
    # A run in a namespace it shares is proven by its Jobs' label and annotation, each Job
    # deleted by the UID it was listed with; a run's own namespace by its name as well.
    own_name = run.shared or run.namespace == NAMESPACE_PREFIX + run.run_id
    if run.annotated_run_id != run.run_id or not own_name:
        return Verdict(
            False,
            f"its name, {RUN_LABEL} label ({run.run_id}) and run-id annotation "
            f"({run.annotated_run_id}) disagree: not proven a run of this tool",
        )
    if not run.jobs:
        return Verdict(
            False, f"no Job labelled app={APP_LABEL} inside: not proven a run of this tool"
        )
    if not all_users and run.user != user:
        return Verdict(
            False,
            f"started by {run.user}, not by you ({user}); --all-users reaps every user's runs",
        )
    return None


def between_batches_verdict(run: ClusterRun, now: float, stale_seconds: float) -> Verdict:
    """A run between two batches is stale once its last Job ended longer than `stale_seconds` ago."""
    made = f"{run.jobs} of {run.jobs_planned} Jobs made"
    if run.last_ended_at is None:
        return Verdict(
            False,
            f"between batches ({made}; no end time on its Jobs): may still make its next, "
            f"only its --ttl reaps it",
        )
    since = max(0.0, now - run.last_ended_at)
    if since < stale_seconds:
        return Verdict(
            False,
            f"between batches ({made}, the last ended {format_duration(since)} ago): may "
            f"still make its next; stale once its last Job ended longer ago than --stale "
            f"{format_duration(stale_seconds)}",
        )
    return Verdict(
        True,
        f"stopped between batches ({made}, the last ended {format_duration(since)} ago): "
        f"longer ago than --stale {format_duration(stale_seconds)}",
    )


def age_verdict(run: ClusterRun, now: float, stale_seconds: float) -> Verdict:
    """A run whose Jobs have all ended is stale once it is older than `stale_seconds`."""
    if run.state == "running":
        return Verdict(False, "still running (a Job has not ended)")
    if run.age(now) < stale_seconds:
        return Verdict(
            False,
            f"{run.state}, {format_duration(run.age(now))} old: younger than --stale "
            f"{format_duration(stale_seconds)}",
        )
    return Verdict(
        True,
        f"{run.state}, {format_duration(run.age(now))} old: older than --stale "
        f"{format_duration(stale_seconds)}",
    )


# --------------------------------------------------------------------------
# src/rl_batch_demo/kube.py: The one edge to the cluster: `Kubectl` runs every kubectl; `ApiProxy`; reads through them, lists

def list_path(
    resource_path: str,
    limit: int,
    selector: str | None = None,
    not_older_than: str | None = None,
    continue_token: str | None = None,
) -> str:
    """The API path of one page of a list.

    A continue token carries its list's revision and the API refuses a
    resourceVersion beside it, so only the first page names the oldest revision
    its answer may come from.
    """
    query = {"limit": str(limit)}
    if selector:
        query["labelSelector"] = selector
    if continue_token:
        query["continue"] = continue_token
    elif not_older_than:
        query["resourceVersion"] = not_older_than
        query["resourceVersionMatch"] = "NotOlderThan"
    return f"{resource_path}?{urllib.parse.urlencode(query)}"


def expired_continue(answer: str) -> str | None:
    """For an answer saying a list's continue token expired: the token the API offers to go on
    from its newest revision ("" when it offers none). None for any other answer."""
    try:
        status = json.loads(answer)
    except ValueError:
        return "" if "(Expired)" in answer else None
    if not isinstance(status, dict) or status.get("reason") != "Expired":
        return None
    return (status.get("metadata") or {}).get("continue") or ""


class PagedList:
    """One list read page by page: a pure reducer of the API's answers."""

    def __init__(
        self,
        resource_path: str,
        selector: str | None = None,
        not_older_than: str | None = None,
        limit: int = LIST_PAGE_SIZE,
    ) -> None:
        self.resource_path = resource_path
        self.selector = selector
        self.not_older_than = not_older_than
        self.limit = limit
        self.items: list[dict] = []
        self.resource_version: str | None = None
        self.continue_token: str | None = None
        self.done = False
        self.pages = 0
        self.expiries = 0

    def next_path(self) -> str:
        return list_path(
            self.resource_path, self.limit, self.selector, self.not_older_than, self.continue_token
        )

    def apply(self, page: dict) -> None:
        """One page: keep its items; its continue token asks for the next, none means it was the last."""
        self.pages += 1
        metadata = page.get("metadata") or {}
        if self.resource_version is None:
            self.resource_version = metadata.get("resourceVersion")
        self.items.extend(page.get("items") or [])
        self.continue_token = metadata.get("continue") or None
        self.done = self.continue_token is None

    def expired(self, token_to_go_on: str) -> None:
        """The continue token expired. Go on with the API's own token when it offers one (the
        rest then comes from a newer revision, still not older than asked), else start again."""
        self.expiries += 1
        if token_to_go_on:
            self.continue_token = token_to_go_on
        else:
            self.items, self.resource_version, self.continue_token = [], None, None


def unfinished_pods(pods: Iterable[dict]) -> list[str]:
    """Names of the pods that have not ended (phase neither Succeeded nor Failed), sorted."""
    return sorted(
        pod_name(pod)
        for pod in pods
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )


def with_fresh_pods(pods: Iterable[dict], fresh: dict[str, dict]) -> list[dict]:
    """The pods sorted by name, each replaced by its later reading where there is one."""
    return sorted((fresh.get(pod_name(pod), pod) for pod in pods), key=pod_name)


def with_vanished(listed: Iterable[dict], watched: Iterable[dict]) -> list[dict]:
    """The listed pods plus, as last seen, each pod the watch saw that the list no longer has:
    a pod deleted before the list was read is still part of the evidence."""
    pods = {pod_name(pod): pod for pod in watched}
    pods.update((pod_name(pod), pod) for pod in listed)
    return sorted(pods.values(), key=pod_name)


class PodReading(NamedTuple):
    """A Job's pods as read after its end, and how they were read."""

    pods: list[dict]
    # "list" (not older than the Job's end), "final watch" (the pod watch saw each pod's last
    # change), or "watch" when no list could be read
    source: str
    resource_version: str | None
    pages: int
    continue_expiries: int
    reread: list[str]  # pods read again on their own because they still looked unfinished


def pods_final(job: dict | None, pods: Iterable[dict]) -> bool:
    """Whether these pods, as a watch last saw them, are the Complete Job's pods for good, so
    that a list read now would show the same: each ended and was counted by the Job controller
    (which then removes its tracking finalizer, the pod's last change), and the Job counted
    no more pods than these."""
    if not job_counted(job, 0, whole=False):
        return False
    ended = 0
    for pod in pods:
        if not pods_final_one(pod):
            return False
        ended += 1
    return job_counted(job, ended)


def job_counted(job: dict | None, ended: int, whole: bool = True) -> bool:
    """The Job is Complete, with nothing active or uncounted, and (`whole`) it counted no more
    pods than the `ended` ones a watch saw final: what pods_final asks of the Job."""
    status = (job or {}).get("status") or {}
    uncounted = status.get("uncountedTerminatedPods") or {}
    if (
        job_finished(job or {}) != "Complete"
        or status.get("active")
        or uncounted.get("succeeded")
        or uncounted.get("failed")
    ):
        return False
    return not whole or ended >= (status.get("succeeded") or 0) + (status.get("failed") or 0)


def pods_final_one(pod: dict) -> bool:
    """The pod ended, the Job controller counted it, and it is not being deleted: no change is to come."""
    metadata = pod.get("metadata") or {}
    return (
        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        and JOB_TRACKING_FINALIZER not in (metadata.get("finalizers") or [])
        and not metadata.get("deletionTimestamp")
    )


class LogGone(DemoError):
    """A kubelet's answer that it no longer has a container's log (the container removed)."""


class KubectlError(DemoError):
    """A kubectl call that failed: its verb, exit code and stderr."""

    def __init__(self, verb: str, returncode: int | None, stderr: str) -> None:
        self.verb = verb
        self.returncode = returncode
        self.stderr = stderr
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else "no error message"
        try:
            # An API answer read through the proxy is a Status object; its message says it all.
            detail = str(json.loads(stderr)["message"])
        except (ValueError, KeyError, TypeError):
            pass
        status = "no answer" if returncode is None else f"exit {returncode}"
        super().__init__(f"kubectl {verb} failed ({status}): {detail}")

    @property
    def not_found(self) -> bool:
        return "(NotFound)" in self.stderr or " not found" in self.stderr

    @property
    def already_exists(self) -> bool:
        return "(AlreadyExists)" in self.stderr or "already exists" in self.stderr

    @property
    def transient(self) -> bool:
        """True when the same request may well succeed if asked again."""
        if self.returncode is None:
            return True
        text = self.stderr.lower()
        return any(marker in text for marker in TRANSIENT_ERROR_MARKERS)


@functools.lru_cache(maxsize=None)
def linux_prctl() -> Callable[..., int] | None:
    """libc's prctl(2) on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None


class Guardian:
    """One small process per tool process that kills the tool's kubectl process groups once the
    tool is gone, however it ends (a CI timeout's SIGKILL, the OOM killer run no cleanup code).

    PR_SET_PDEATHSIG alone does not do it: it reaches only the process the tool started, and not
    even that once it execs from a thread of its own. The Google Cloud SDK's kubectl is a
    dispatcher that execs the versioned kubectl from a Go thread, and the signal is lost with it:
    a killed tool left its watches and proxy running. So each kubectl starts in a session (and
    process group) of its own, which whatever it starts inherits, and names that group to the
    guardian before it execs (child_setup); the guardian (guardian.py) kills every group still
    named once the last writer of its socket, this process, is gone. Started once, on the first
    kubectl; it costs one Python start-up (about 20 ms) per tool process and one small write per
    kubectl.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._pid: int | None = None  # the guardian's
        self._owner: int | None = None  # the process it guards

    def socket(self) -> socket.socket | None:
        """The socket to name groups on, the guardian started (again) if this process has none
        alive; None where there can be none (then PR_SET_PDEATHSIG alone guards the children)."""
        with self._lock:
            if self._socket is not None and self._owner == os.getpid() and self._alive():
                return self._socket
            self._drop()
            if not guardian_possible():
                return None
            mine, theirs = socket.socketpair()
            try:
                self._pid = os.posix_spawn(
                    sys.executable,
                    [sys.executable, "-I", "-S", "-c", guardian_command(os.getpid())],
                    {**os.environ, GUARDIAN_VARIABLE: GUARDIAN_SOURCE},
                    file_actions=[(os.POSIX_SPAWN_DUP2, theirs.fileno(), 0)],
                    setsid=True,
                )
            except OSError:
                mine.close()
                return None
            finally:
                theirs.close()
            self._socket, self._owner = mine, os.getpid()
            return mine

    def _alive(self) -> bool:
        try:
            return self._pid is not None and os.waitpid(self._pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def _drop(self) -> None:
        """Forget the guardian: this process's copy of its socket closed (it ends once no other
        process holds one)."""
        if self._socket is not None:
            self._socket.close()
        self._socket = self._pid = self._owner = None

    def forget(self, group: int) -> None:
        """A group this process has stopped and waited for: the guardian leaves it alone."""
        guard = self._socket
        if guard is not None and self._owner == os.getpid():
            name_group(guard, b"-", group)

    def after_fork_in_child(self) -> None:
        """A child process forked otherwise than to exec a kubectl (multiprocessing, say) lets go of
        the socket, so that the guardian still sees this process's end; it starts a guardian of its
        own should it run kubectl."""
        self._lock = threading.Lock()  # another thread may have held it across the fork
        if getattr(SPAWNING, "kubectl", False):
            return  # a kubectl about to exec: its setup names its group on the socket first
        if self._socket is not None:
            self._socket.close()
        self._socket = self._pid = self._owner = None


def guardian_command(tool: int) -> str:
    """The guardian's `python -c` text: short, and saying what it is to whoever lists processes."""
    return f"import os; exec(os.environ[{GUARDIAN_VARIABLE!r}])  # rl-batch-demo guardian of {tool}"


def guardian_possible() -> bool:
    """A guardian can run here: POSIX process groups, a Python to run it with, and a socket that
    writes without SIGPIPE."""
    return (
        hasattr(os, "posix_spawn")
        and hasattr(os, "killpg")
        and hasattr(socket, "MSG_NOSIGNAL")
        and bool(sys.executable)
        and not getattr(sys, "frozen", False)
    )


def name_group(guard: socket.socket, sign: bytes, group: int) -> None:
    """Tell the guardian of a group ("+": to kill should this process end; "-": to leave alone)."""
    try:
        guard.send(sign + str(group).encode() + b"\n", socket.MSG_NOSIGNAL)
    except OSError:
        pass  # the guardian is gone: PR_SET_PDEATHSIG still stops the group's first process


GUARDIAN = Guardian()
# Set in the thread that is starting a kubectl, so that the fork handlers in its child know it.
SPAWNING = threading.local()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GUARDIAN.after_fork_in_child)


def child_setup(guard: socket.socket | None) -> Callable[[], None]:
    """A kubectl's pre-exec step: a session (and process group) of its own, named to the guardian,
    and killed by the kernel when this process dies (the group, should the guardian be gone)."""
    prctl = linux_prctl()
    parent = os.getpid()

    def setup() -> None:
        os.setsid()
        if guard is not None:
            name_group(guard, b"+", os.getpid())
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)

    return setup


def signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group has ended


class GroupedChild(subprocess.Popen[Any]):
    """A kubectl in a process group of its own: a signal goes to the group (to whatever kubectl
    started too); once it has been waited for, what is left of the group is killed and the
    guardian told to forget it."""

    _released = False

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            signal_group(self.pid, sig)

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None:
            self._release()
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._release()
        return code

    def _release(self) -> None:
        if not self._released:
            self._released = True
            # Its number stays the group's until no member is left, so it names no other group.
            signal_group(self.pid, signal.SIGKILL)
            GUARDIAN.forget(self.pid)


def start_kubectl(argv: list[str], **options: Any) -> GroupedChild:
    """Start one kubectl in a group of its own that dies with this process (Guardian)."""
    guard = GUARDIAN.socket()
    SPAWNING.kubectl = True
    try:
        return GroupedChild(argv, preexec_fn=child_setup(guard), **options)
    finally:
        SPAWNING.kubectl = False


class InterruptsAcrossForks:
    """Holds a Ctrl-C or SIGTERM back while the main thread starts a child, and raises it after.

    A pre-exec step (child_setup) makes the interpreter run its fork handlers in this
    process around the fork. A KeyboardInterrupt raised inside one is printed ("Exception
    ignored in ... _afterFork") and dropped, so the run went on as if never interrupted, and
    it leaves the lock that logging's handler holds over the fork taken, so the next child
    any other thread starts waits for it forever. On a loaded machine the main thread spends
    long enough in fork for both to happen. So while it starts a child, the handler only
    notes the signal; the start then stops that child and raises the interrupt.
    """

    def __init__(self) -> None:
        self.starting = False  # the main thread is starting a child
        self.held = False  # a signal came meanwhile

    def handle(self, signum: int, frame: Any) -> None:
        if self.starting:
            self.held = True
            return
        raise KeyboardInterrupt

    def start(self, starter: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        """The child `starter` starts, with any interrupt held back until it has (inside `holding`,
        until that block ends: whoever holds it stops the child)."""
        if threading.current_thread() is not threading.main_thread():
            return starter()  # signal handlers run in the main thread alone
        if self.starting:
            return starter()
        self.starting, self.held = True, False
        try:
            child = starter()
        except BaseException:
            self.starting = False
            if self.held:
                raise KeyboardInterrupt from None
            raise
        self.starting = False
        if self.held:
            child.kill()
            child.wait()
            raise KeyboardInterrupt
        return child

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """An interrupt held back while the block runs, and raised when it ends. A thread's start
        waits on a lock of the threading module's: an interrupt raised inside that wait leaves the
        lock released twice (RuntimeError) instead of stopping the run as Ctrl-C should."""
        if threading.current_thread() is not threading.main_thread() or self.starting:
            yield
            return
        self.starting, self.held = True, False
        try:
            yield
        except BaseException:
            self.starting = False
            if self.held:
                raise KeyboardInterrupt from None
            raise
        self.starting = False
        if self.held:
            raise KeyboardInterrupt


INTERRUPTS = InterruptsAcrossForks()


class Kubectl:
    """Runs kubectl against one context with bounded requests; counts what it started.

    With `verbose`, every command line (and every request through the proxy) is
    echoed on stderr before it is sent, for a user debugging on a bastion. Only
    argv is echoed, never what kubectl is given on stdin.
    """

    api: ApiProxy | None = None  # a ProxiedKubectl's proxy (watches go through it too)

    def __init__(self, binary: str, context: str | None = None, verbose: bool = False) -> None:
        self.binary = binary
        self.context = context
        self.verbose = verbose
        self.processes = 0
        self.retries = 0
        self._lock = threading.Lock()

    def echo(self, line: str) -> None:
        """Show what is about to be sent, when verbose; one whole line even from many threads."""
        if self.verbose:
            # On a terminal, first erase the progress line being updated there; it is redrawn below.
            erase = "\r\x1b[K" if sys.stderr.isatty() else ""
            with self._lock:
                sys.stderr.write(f"{erase}+ {line}\n")
                sys.stderr.flush()

    def echo_argv(self, argv: Sequence[str]) -> None:
        if self.verbose:
            self.echo(" ".join(shlex.quote(arg) for arg in argv))

    def argv(
        self, args: Sequence[str], request_timeout: str | None = f"{REQUEST_TIMEOUT_SECONDS}s"
    ) -> list[str]:
        argv = [self.binary]
        if self.context:
            argv += ["--context", self.context]
        if request_timeout:
            argv.append(f"--request-timeout={request_timeout}")
        return argv + list(args)

    def run(
        self,
        args: Sequence[str],
        input_text: str | None = None,
        retry_until: float | None = None,
        request_timeout: str | None = f"{REQUEST_TIMEOUT_SECONDS}s",
    ) -> str:
        """Run one request-and-answer call; retry transient failures until `retry_until` (monotonic)."""
        return self.retrying(lambda: self._run_once(args, input_text, request_timeout), retry_until)

    def retrying(self, call: Callable[[], str], retry_until: float | None) -> str:
        """Call, and on a transient failure call again with backoff until `retry_until`; count retries."""
        delay = 0.25
        while True:
            try:
                return call()
            except KubectlError as error:
                if (
                    retry_until is None
                    or not error.transient
                    or time.monotonic() + delay > retry_until
                ):
                    raise
            with self._lock:
                self.retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 4.0)

    def _run_once(
        self, args: Sequence[str], input_text: str | None, request_timeout: str | None
    ) -> str:
        verb = " ".join(a for a in args[:3] if not a.startswith("-"))
        with self._lock:
            self.processes += 1
        argv = self.argv(args, request_timeout)
        self.echo_argv(argv)
        completed = run_to_end(argv, verb, input_text)
        if completed.returncode != 0:
            raise failed_call(verb, completed, self.context)
        return completed.stdout

    def get_json(self, args: Sequence[str], **options: Any) -> Any:
        """Run a call with `-o json`; None when kubectl printed nothing (--ignore-not-found)."""
        text = self.run(list(args) + ["-o", "json"], **options)
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise DemoError(
                f"kubectl {' '.join(args[:2])} printed something that is not JSON"
            ) from None

    def get(
        self,
        kind: str,
        name: str,
        namespace: str | None = None,
        missing_ok: bool = False,
        retry_until: float | None = None,
    ) -> dict | None:
        """One object; None if it does not exist and `missing_ok` (else that is a KubectlError)."""
        args = ["get", kind, name] + (["-n", namespace] if namespace else [])
        return self.get_json(
            args + (["--ignore-not-found"] if missing_ok else []), retry_until=retry_until
        )

    def get_list(
        self, kind: str, namespace: str | None = None, *flags: str, retry_until: float | None = None
    ) -> dict | None:
        """Every object of a kind (that `flags` such as a label selector let through), as one List."""
        args = ["get", kind] + list(flags) + (["-n", namespace] if namespace else [])
        return self.get_json(args, retry_until=retry_until)

    def create(self, manifest: dict, retry_until: float | None = None) -> dict:
        """Create one object from its manifest; the object as the API server stored it."""
        return self.get_json(
            ["create", "-f", "-"], input_text=json.dumps(manifest), retry_until=retry_until
        )

    def delete(
        self,
        kind: str,
        name: str,
        namespace: str | None,
        *flags: str,
        retry_until: float | None = None,
    ) -> None:
        """Ask for one object's deletion; one already gone is no error."""
        args = ["delete", kind, name] + (["-n", namespace] if namespace else [])
        self.run(args + list(flags) + ["--ignore-not-found"], retry_until=retry_until)

    def stream(self, args: Sequence[str], seconds: int, stderr: Any = None) -> subprocess.Popen:
        """Start a long-lived call (a watch, the proxy) with requests bounded by `seconds`.

        Like every kubectl this tool starts, it is out of the terminal's reach (a session of its
        own), so Ctrl-C leaves it to this tool to stop, and it dies with this process.
        Its stderr goes to `stderr` (a file) when given, else nowhere anyone reads.
        """
        with self._lock:
            self.processes += 1
        argv = self.argv(args, f"{max(1, seconds)}s")
        self.echo_argv(argv)
        return start_child(argv, stderr or tempfile.TemporaryFile())


def run_to_end(argv: list[str], verb: str, input_text: str | None) -> subprocess.CompletedProcess:
    """Run one request-and-answer kubectl to its end, within CALL_TIMEOUT_SECONDS; it dies with
    this process, and with the call when an interrupt ends it."""
    try:
        process = INTERRUPTS.start(
            lambda: start_kubectl(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    except OSError as error:
        raise DemoError(f"cannot run kubectl {argv[0]!r}: {error.strerror or error}") from None
    with process:
        try:
            # Always an input, if only an empty one: kubectl must never wait on the terminal.
            stdout, stderr = process.communicate(input_text or "", timeout=CALL_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise KubectlError(verb, None, f"no answer within {CALL_TIMEOUT_SECONDS} s") from None
        except BaseException:  # an interrupt: the call ends with it
            process.kill()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def failed_call(
    verb: str, completed: subprocess.CompletedProcess, context: str | None
) -> DemoError:
    """The error of a kubectl call that exited non-zero: a kubeconfig that gives no credentials
    (kubectl asked for a username), else the call's KubectlError."""
    if CREDENTIALS_PROMPT in completed.stdout + completed.stderr:
        return DemoError(
            f"kubectl {verb}: the kubeconfig gives no credentials for context "
            f"{context or '(current)'} and kubectl asked for a username; "
            "log in or fix the kubeconfig's user"
        )
    return KubectlError(verb, completed.returncode, completed.stderr)


def start_child(argv: list[str], errors: Any) -> subprocess.Popen:
    """Start a long-lived kubectl (a watch, the proxy), its stderr to the file `errors`; it dies
    with this process."""
    return INTERRUPTS.start(
        lambda: start_kubectl(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, bufsize=0
        )
    )


def refusal(errors: Any) -> str | None:
    """The API server's "Forbidden" answer in what a finished kubectl wrote to `errors`, if any."""
    try:
        with errors:
            errors.seek(0)
            text = errors.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    refused = [line.strip() for line in text.splitlines() if "(Forbidden)" in line]
    return refused[-1] if refused else None


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: how this tool talks to its own `kubectl proxy`."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def remove_stale_proxy_directories() -> None:
    """Remove the socket directories that killed runs of this tool left behind.

    Only a directory of ours whose run is gone and that holds nothing but the
    socket is removed.
    """
    if os.name != "posix":
        return
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid_text = name[len(PROXY_DIRECTORY_PREFIX) :].split("-", 1)[0]
        if not name.startswith(PROXY_DIRECTORY_PREFIX) or not pid_text.isdigit():
            continue
        path = os.path.join(base, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or set(os.listdir(path)) - {"api.sock"}:
                continue
            os.kill(int(pid_text), 0)
            continue  # that run is still alive
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)


def proxy_listens(path: str) -> bool:
    """Whether a Unix socket accepts connections."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class ApiResource(NamedTuple):
    """Where one kind lives in the API, for the requests the proxy carries in kubectl's stead."""

    prefix: str  # /api/v1, /apis/GROUP/VERSION
    plural: str
    kind: str  # the kind of its objects, which a list's items do not carry
    namespaced: bool


# The kinds a run reads, creates and deletes, by the names kubectl is given for them.
API_RESOURCES = {
    "namespace": ApiResource("/api/v1", "namespaces", "Namespace", False),
    "configmap": ApiResource("/api/v1", "configmaps", "ConfigMap", True),
    "pod": ApiResource("/api/v1", "pods", "Pod", True),
    "pods": ApiResource("/api/v1", "pods", "Pod", True),
    "events": ApiResource("/api/v1", "events", "Event", True),
    "nodes": ApiResource("/api/v1", "nodes", "Node", False),
    "job": ApiResource("/apis/batch/v1", "jobs", "Job", True),
    "jobs": ApiResource("/apis/batch/v1", "jobs", "Job", True),
    "runtimeclass": ApiResource("/apis/node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    "networkpolicy": ApiResource(
        "/apis/networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True
    ),
}
# The kinds of the manifests a run creates, by the name kubectl is given for them.
CREATED_KINDS = {
    "Namespace": "namespace",
    "ConfigMap": "configmap",
    "Job": "job",
    "NetworkPolicy": "networkpolicy",
    "Pod": "pod",
}
# kubectl's reason for an HTTP answer that carries no Status of its own.
HTTP_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def resource_path(kind: str, namespace: str | None, name: str | None = None) -> str:
    """The API path of a kind's collection in a namespace, or of one named object in it."""
    resource = API_RESOURCES[kind]
    path = resource.prefix
    if resource.namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{resource.plural}"
    return f"{path}/{name}" if name else path


def proxied_list_flags(flags: Sequence[str]) -> bool:
    """A list's kubectl flags the proxy can say: a label selector and a page size, no more."""
    rest = list(flags)
    if rest[:1] == ["-l"]:
        rest = rest[2:]
    return all(flag.startswith("--chunk-size=") for flag in rest)


def proxied_delete_flags(flags: Sequence[str]) -> bool:
    """A deletion the proxy can ask for as kubectl would: not waited for, cascading as said."""
    return "--wait=false" in flags and set(flags) <= {
        "--wait=false",
        "--cascade=foreground",
        "--cascade=background",
    }


def server_error(status: int, body: str, creating: bool = False) -> str:
    """What kubectl prints on stderr for an API server's answer `status` with `body`, so that an
    error read through the proxy reads (and is judged: not_found, transient) as kubectl's would."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("kind") != "Status":
        answer = {}
    message = str(answer.get("message") or "") or (
        UNSERVED_PATH_MESSAGE if status == 404 else body.strip() or f"HTTP {status}"
    )
    reason = str(answer.get("reason") or HTTP_REASONS.get(status, "Unknown"))
    if reason == "Invalid" and isinstance(answer.get("details"), dict):
        return invalid_message(answer["details"], message)
    where = 'error when creating "STDIN": ' if creating else ""
    return f"Error from server ({reason}): {where}{message}\n"


def invalid_message(details: dict, message: str) -> str:
    """kubectl's words for an object the API server found invalid: its kind and name, then each
    cause (one on the line, several each on a line of its own)."""
    causes = [
        f"{cause.get('field')}: {cause.get('message')}"
        if cause.get("field")
        else cause.get("message")
        for cause in details.get("causes") or []
        if isinstance(cause, dict)
    ]
    said = f"The {details.get('kind')} {json.dumps(details.get('name') or '')} is invalid"
    if not causes:
        return f"{said}: {message}\n"
    if len(causes) == 1:
        return f"{said}: {causes[0]}\n"
    return f"{said}: \n" + "".join(f"* {cause}\n" for cause in causes)


def status_reason(body: str) -> str | None:
    """The reason of an API answer that is a Status; None for any other answer."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if isinstance(answer, dict) and answer.get("kind") == "Status":
        return str(answer.get("reason") or "")
    return None


class ApiProxy:
    """One `kubectl proxy` on a private Unix socket, for the many small reads of a batch.

    kubectl limits itself to 5 requests a second after a burst of 10 (so
    `kubectl logs -l` over 500 pods takes 100 s), and every kubectl process costs
    about 0.1 s of CPU. Through the proxy each log or list is one local HTTP
    request at the API server's own speed; authentication stays kubectl's.
    """

    owned = True  # False for a view of a shared proxy (shared_proxy): closing it closes nothing

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl
        remove_stale_proxy_directories()
        # mode 0700: ours alone
        self.directory = tempfile.mkdtemp(prefix=f"{PROXY_DIRECTORY_PREFIX}{os.getpid()}-")
        self.socket_path = os.path.join(self.directory, "api.sock")
        self.process = kubectl.stream(
            ["proxy", f"--unix-socket={self.socket_path}"], REQUEST_TIMEOUT_SECONDS
        )
        deadline = time.monotonic() + PROXY_START_SECONDS
        # The socket's file exists once it is bound, a moment before it listens: wait for both.
        while not proxy_listens(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise DemoError("kubectl proxy did not start")
            time.sleep(0.01)

    def get(self, path: str, retry_until: float | None = None) -> str:
        """GET one API path, retrying transient failures like any kubectl call."""
        return self.kubectl.retrying(lambda: self._get_once(path), retry_until)

    def _get_once(self, path: str) -> str:
        """GET one API path (bounded by the request timeout); KubectlError unless 200."""
        status, body = self.request("GET", path)
        if status is None:
            raise KubectlError(f"GET {path}", None, body)
        if status != 200:
            raise KubectlError(f"GET {path}", status, body)
        return body

    def request(
        self, method: str, path: str, body: str | None = None, content: str = "application/json"
    ) -> tuple[int | None, str]:
        """One request (bounded by the request timeout): its status and answer; status None and
        the error when no answer came (a timeout, or an answer cut off)."""
        separator = "&" if "?" in path else "?"
        target = f"{path}{separator}timeout={REQUEST_TIMEOUT_SECONDS}s"
        self.kubectl.echo(f"{method} {target}")
        connection = UnixHTTPConnection(self.socket_path, REQUEST_TIMEOUT_SECONDS)
        headers = {"Content-Type": content} if body is not None else {}
        try:
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            text = response.read().decode("utf-8", errors="replace")
        except (OSError, http.client.HTTPException) as error:
            return None, str(error)
        finally:
            connection.close()
        return response.status, text

    def call(
        self,
        verb: str,
        method: str,
        path: str,
        retry_until: float | None,
        body: str | None = None,
        absent_ok: bool = False,
        content: str = "application/json",
    ) -> str | None:
        """A request in a kubectl call's stead: its answer, retried as that call would be, failing
        with the error that call would give (`verb` names it); None for an object not found when
        `absent_ok`."""

        def once() -> str | None:
            status, text = self.request(method, path, body, content)
            if status is None:
                raise KubectlError(verb, None, text)
            if absent_ok and status == 404 and status_reason(text) is not None:
                return None
            if not 200 <= status < 300:
                raise KubectlError(verb, 1, server_error(status, text, method == "POST"))
            return text

        return self.kubectl.retrying(once, retry_until)  # type: ignore[arg-type]

    def watch(self, path: str, seconds: int, errors: Any) -> ProxyWatch:
        """A watch of `path` for up to `seconds`, in the shape of the kubectl watch it replaces."""
        return ProxyWatch(self, path, seconds, errors)

    def alive(self) -> bool:
        """The proxy runs and listens."""
        return self.process.poll() is None and proxy_listens(self.socket_path)

    def view(self, kubectl: Kubectl) -> ApiProxy:
        """This proxy as `kubectl`'s calls use it (their echo, retries and counts); closing the
        view leaves the proxy running."""
        seen = copy.copy(self)
        seen.kubectl, seen.owned = kubectl, False
        return seen

    def close(self) -> None:
        if not self.owned:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class ProxyWatch:
    """A watch read through the proxy, in the shape of the `kubectl get -w` process it replaces
    (stdout, poll, wait, terminate, kill), so that the same reader takes its events. Its request
    is sent at the first read, in the reader's thread; an answer other than 200 is written to
    `errors` as kubectl would print it, and the watch ends."""

    def __init__(self, proxy: ApiProxy, path: str, seconds: int, errors: Any) -> None:
        self.proxy = proxy
        self.path = f"{path}&timeoutSeconds={max(1, seconds)}"
        self.errors = errors
        self.connection = UnixHTTPConnection(proxy.socket_path, seconds + REQUEST_TIMEOUT_SECONDS)
        self.response: http.client.HTTPResponse | None = None
        self.returncode: int | None = None
        self.stdout = self

    def read(self, size: int) -> bytes:
        """Up to `size` bytes of the watch's events as they come; b"" once it has ended."""
        try:
            if self.response is None:
                if self.returncode is not None:
                    return b""
                self.proxy.kubectl.echo(f"GET {self.path}")
                self.connection.request("GET", self.path)
                self.response = self.connection.getresponse()
                if self.response.status != 200:
                    body = self.response.read().decode("utf-8", errors="replace")
                    self.errors.write(server_error(self.response.status, body).encode())
                    self.errors.flush()
                    self.returncode = 1
                    return b""
            return self.response.read1(size) if self.returncode is None else b""
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            # Stopped (terminate: http.client then finds its socket gone under it), or the
            # connection broke: the watch's end either way.
            return b""

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = 0
        self.connection.close()
        return self.returncode

    def terminate(self) -> None:
        """Stop the watch: its connection shut, so that a read waiting on it returns."""
        if self.returncode is None:
            self.returncode = -signal.SIGTERM
        sock = self.connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    kill = terminate


def read_log(
    kubectl: Kubectl, proxy: ApiProxy | None, namespace: str, pod: str, retry_until: float | None
) -> str:
    """One pod's episode log: through the proxy when there is one, else with `kubectl logs`.
    A kubelet's notice that the log is gone is no log: DemoError, as for any log not read."""
    if proxy is not None:
        text = proxy.get(
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log?container={CONTAINER_NAME}", retry_until
        )
    else:
        text = kubectl.run(
            ["logs", pod, "-c", CONTAINER_NAME, "-n", namespace], retry_until=retry_until
        )
    if KUBELET_LOG_GONE.fullmatch(text):
        raise LogGone(f"the kubelet no longer has the log ({text.strip()})")
    return text


def log_gone(error: DemoError) -> bool:
    """read_log failed because the cluster no longer has the log: the pod is gone (404), or its
    kubelet has removed the container."""
    return isinstance(error, LogGone) or (isinstance(error, KubectlError) and error.not_found)


def api_read(kubectl: Kubectl, proxy: ApiProxy | None, path: str, retry_until: float | None) -> str:
    """GET one API path: through the proxy when there is one, else with `kubectl get --raw`."""
    if proxy is not None:
        return proxy.get(path, retry_until)
    separator = "&" if "?" in path else "?"
    return kubectl.run(
        ["get", "--raw", f"{path}{separator}timeout={REQUEST_TIMEOUT_SECONDS}s"],
        retry_until=retry_until,
    )


def read_pages(
    kubectl: Kubectl, proxy: ApiProxy | None, listing: PagedList, retry_seconds: float | None
) -> PagedList:
    """Read a list to its last page; each page is one bounded call, asked again for up to retry_seconds."""
    while not listing.done:
        retry_until = None if retry_seconds is None else time.monotonic() + retry_seconds
        try:
            text = api_read(kubectl, proxy, listing.next_path(), retry_until)
        except KubectlError as error:
            token = expired_continue(error.stderr)
            if token is None or listing.continue_token is None or listing.expiries >= LIST_EXPIRIES:
                raise
            listing.expired(token)
            continue
        try:
            page = json.loads(text)
        except ValueError:
            raise DemoError(
                f"the list of {listing.resource_path} answered something that is not JSON"
            ) from None
        listing.apply(page)
    return listing


def reread_pods(
    kubectl: Kubectl,
    proxy: ApiProxy | None,
    namespace: str,
    names: Iterable[str],
    retry_seconds: float | None,
) -> dict[str, dict]:
    """Each named pod read again on its own (a GET reads the newest revision); unreadable ones are left out."""
    fresh = {}
    for name in names:
        retry_until = None if retry_seconds is None else time.monotonic() + retry_seconds
        try:
            pod = json.loads(
                api_read(kubectl, proxy, f"/api/v1/namespaces/{namespace}/pods/{name}", retry_until)
            )
        except (DemoError, ValueError):
            continue  # gone or unreadable: the earlier reading stays the evidence
        if isinstance(pod, dict) and pod.get("kind") == "Pod":
            fresh[name] = pod
    return fresh


def list_total(page: dict) -> int | None:
    """How many objects a list holds in all, from its first page: the page's items and, when
    more follow, the API's remainingItemCount (None when it does not say)."""
    items = len(page.get("items") or [])
    metadata = page.get("metadata") or {}
    if not metadata.get("continue"):
        return items
    remaining = metadata.get("remainingItemCount")
    return items + int(remaining) if isinstance(remaining, int) else None


def count_events(
    kubectl: Kubectl, proxy: ApiProxy | None, namespace: str, retry_until: float | None
) -> tuple[int | None, str | None]:
    """How many events the namespace holds now, and the revision that was: a list of one,
    read from the newest revision."""
    text = api_read(kubectl, proxy, f"/api/v1/namespaces/{namespace}/events?limit=1", retry_until)
    try:
        page = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(page, dict):
        return None, None
    return list_total(page), (page.get("metadata") or {}).get("resourceVersion")


def read_job_pods(
    kubectl: Kubectl,
    proxy: ApiProxy | None,
    namespace: str,
    job_name: str,
    not_older_than: str | None,
    retry_seconds: float | None,
    page_size: int = LIST_PAGE_SIZE,
    selector: str | None = None,
) -> PodReading:
    """The Job's pods (`selector`: a batch's pods, across its Jobs), listed in pages from a revision
    not older than `not_older_than` (the Job's end as this client saw it); a pod that still looks
    unfinished is read again on its own before anything is concluded from it."""
    listing = read_pages(
        kubectl,
        proxy,
        PagedList(
            f"/api/v1/namespaces/{namespace}/pods",
            selector or f"job-name={job_name}",
            not_older_than,
            page_size,
        ),
        retry_seconds,
    )
    # Items of a list carry no kind; give each the shape `kubectl get -o json` prints.
    pods = [{"apiVersion": "v1", "kind": "Pod", **pod} for pod in listing.items]
    fresh = reread_pods(kubectl, proxy, namespace, unfinished_pods(pods), retry_seconds)
    return PodReading(
        with_fresh_pods(pods, fresh),
        "list",
        listing.resource_version,
        listing.pages,
        listing.expiries,
        sorted(fresh),
    )


def read_events(
    kubectl: Kubectl,
    proxy: ApiProxy | None,
    namespace: str,
    page_size: int,
    retry_seconds: float | None,
) -> PagedList:
    """The namespace's events listed in pages: through the proxy when there is one, else (or
    should that fail) by kubectl."""
    path = f"/api/v1/namespaces/{namespace}/events"
    if proxy is not None:
        try:
            return read_pages(kubectl, proxy, PagedList(path, limit=page_size), retry_seconds)
        except DemoError:
            pass  # ask kubectl below
    return read_pages(kubectl, None, PagedList(path, limit=page_size), retry_seconds)


# --------------------------------------------------------------------------
# src/rl_batch_demo/proxied.py: Requests in kubectl's stead: a trainer's many steps through one `kubectl proxy` kept for the

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


# --------------------------------------------------------------------------
# src/rl_batch_demo/sandboxes.py: Live sandboxes over the API server's pod proxy: the pool's pods as the watch tells them, and

# How long a request to the proxy waits for its connection and its answer, beyond a command's own
# timeout; a command without one is bounded by this alone.
REQUEST_GRACE_SECONDS = 30.0
# A request that may be sent again (a file's read or write; a command with retry=True) is, while
# the pod still runs, for this long: an API server restarting is back within it.
RETRY_SECONDS = 30.0
# A pod's server is asked whether it listens this often, from its Running until it answers.
PROBE_INTERVAL_SECONDS = 0.02
PROBE_MOST_SECONDS = 120.0
# The pod watch asks the API server to end each watch after this long, and starts another.
WATCH_SECONDS = 240


class SandboxLost(DemoError):
    """The sandbox's pod went away (deleted, evicted, failed, or the API server could not reach
    it) while it was asked something. An infrastructure failure: the episode is not the agent's."""

    failure_class = "infrastructure"

    def __init__(self, pod: str, reason: str) -> None:
        super().__init__(f"sandbox {pod} lost: {reason}")
        self.pod = pod
        self.reason = reason


class CommandResult(NamedTuple):
    """A command's outcome: its exit code (None if it was killed at its timeout before it could
    give one), its output (each stream capped; `truncated` then), the seconds it took in the
    sandbox, and the request's round trip as this client timed it."""

    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    truncated: bool
    timed_out: bool = False
    round_trip_seconds: float = 0.0


class CommandTimeout(DemoError, TimeoutError):
    """A command ran past its timeout and was killed, with everything it started; `result` holds
    what it printed until then."""

    def __init__(self, message: str, result: CommandResult) -> None:
        super().__init__(message)
        self.result = result


class ProxyAnswer(NamedTuple):
    status: int
    body: bytes
    # Not the sandbox's answer: a Kubernetes Status, or an error of `kubectl proxy` (its 500 when
    # the API server cannot be reached), neither of which carries the sandbox's ANSWER_HEADER.
    from_api_server: bool


class OneWriteConnection(UnixHTTPConnection):
    """A request's head and body in one write. http.client sends them in two, and behind
    `kubectl proxy` and the API server the second part of a small request waited: a command's
    round trip through a real API server was 45 ms that way and 3 ms this way."""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if not isinstance(message_body, bytes) or encode_chunked:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        self._buffer.extend((b"", b""))  # type: ignore[attr-defined]
        head = b"\r\n".join(self._buffer)  # type: ignore[attr-defined]
        del self._buffer[:]  # type: ignore[attr-defined]
        self.send(head + message_body)


class ProxyClient:
    """Requests through the tool's `kubectl proxy`: one kept-alive connection per thread, so many
    trainer threads drive many sandboxes with no kubectl process of their own."""

    def __init__(self, socket_path: str, echo: Callable[[str], None]) -> None:
        self.socket_path = socket_path
        self.echo = echo
        self._local = threading.local()

    def _connection(self, timeout: float) -> UnixHTTPConnection:
        connection: UnixHTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = OneWriteConnection(self.socket_path, timeout)
            self._local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection

    def forget(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> ProxyAnswer:
        """One request on this thread's connection; OSError or HTTPException when it broke."""
        self.echo(f"{method} {path}")
        connection = self._connection(timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            # Broken, or left mid-request (Ctrl-C): the next request needs a fresh connection.
            self.forget()
            raise
        if (response.getheader("Connection") or "").lower() == "close":
            self.forget()
        on_the_way = is_status(data) or response.getheader(ANSWER_HEADER) is None
        return ProxyAnswer(response.status, data, response.status != 200 and on_the_way)


def is_status(data: bytes) -> bool:
    """Whether an answer is a Kubernetes Status: the API server's own word, not the sandbox's."""
    try:
        return bool(json.loads(data).get("kind") == "Status")
    except (ValueError, AttributeError):
        return False


@dataclasses.dataclass
class PodView:
    """What the pool knows of one pod: from the watch, and from its server's own answers."""

    name: str
    job: str
    created: str = ""
    phase: str = "Pending"
    ip: str = ""
    node: str = ""
    reason: str = ""  # why it is not (or no longer) usable, in the cluster's words
    deleted: bool = False
    probing: bool = False
    started_at: float | None = None  # its container started: the kubelet's status, whole seconds
    ready_at: float | None = None  # its server began to listen, its own clock
    warm_since: float | None = None  # this client's monotonic clock, when it answered
    claimed: bool = False
    ended_at: float | None = None  # this client's monotonic clock, when it finished or was lost
    traced: int = 0  # its episodes finished: the first one's spans carry its start

    @property
    def usable(self) -> bool:
        return not self.deleted and self.phase == "Running" and bool(self.ip)


def pod_view_update(view: PodView, pod: dict, deleted: bool) -> None:
    """Fold one watched state of a pod into its view."""
    status = pod.get("status") or {}
    view.created = (pod.get("metadata") or {}).get("creationTimestamp") or view.created
    view.phase = status.get("phase") or view.phase
    view.ip = status.get("podIP") or view.ip
    view.node = (pod.get("spec") or {}).get("nodeName") or view.node
    view.deleted = (
        view.deleted or deleted or bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    )
    view.reason = pod_reason(pod, view.deleted)
    view.started_at = container_started(pod) or view.started_at


def container_started(pod: dict) -> float | None:
    """When the pod's container started, as the kubelet's status says (running or ended)."""
    started = None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        stamp = (state.get("running") or state.get("terminated") or {}).get("startedAt")
        started = parse_time(stamp) if stamp else started
    return started


def pod_reason(pod: dict, deleted: bool) -> str:
    """Why a pod is not running, from its status: a waiting or terminated reason, or its phase."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        for kind in ("waiting", "terminated"):
            if state.get(kind):
                detail = state[kind]
                said = detail.get("reason") or kind
                code = detail.get("exitCode")
                return said + (f" (exit code {code})" if code is not None else "")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason')}: {condition.get('message', '')}".strip()
    if deleted:
        return "deleted"
    return status.get("reason") or status.get("phase") or "Pending"


class PoolState:
    """The pool's pods, told by the watch and the probes: which are warm (their server answers
    and nobody holds them), which are starting, which are lost. One lock, one condition."""

    def __init__(self) -> None:
        self.pods: dict[str, PodView] = {}
        self.condition = threading.Condition()
        self.closed = False
        self.warm_order: list[str] = []  # the oldest warm sandbox is claimed first

    def apply(self, pod: dict, deleted: bool, job: str) -> PodView | None:
        """One watched change; the pod's view when it became usable and wants a probe."""
        name = (pod.get("metadata") or {}).get("name") or ""
        with self.condition:
            view = self.pods.setdefault(name, PodView(name, job))
            pod_view_update(view, pod, deleted)
            if not view.usable and name in self.warm_order:
                self.warm_order.remove(name)
            probe = view.usable and view.ready_at is None and not view.probing
            if probe:
                view.probing = True
            self.condition.notify_all()
            return view if probe else None

    def forget_missing(self, listed: set) -> None:
        """A fresh list of the pods: any the pool knew that it lacks went while the watch was
        away (deleted, as a watch would have said)."""
        with self.condition:
            for name, view in self.pods.items():
                if name not in listed and not view.deleted:
                    view.deleted, view.reason = True, "deleted"
                    if name in self.warm_order:
                        self.warm_order.remove(name)
            self.condition.notify_all()

    def warmed(self, name: str, ready_at: float) -> None:
        with self.condition:
            view = self.pods[name]
            view.probing, view.ready_at, view.warm_since = False, ready_at, time.monotonic()
            if view.usable and not view.claimed:
                self.warm_order.append(name)
            self.condition.notify_all()

    def take(self, job: str) -> PodView | None:
        """The oldest warm sandbox of `job`'s pods, now held; None if none is warm."""
        for name in self.warm_order:
            view = self.pods[name]
            if view.job == job:
                self.warm_order.remove(name)
                view.claimed = True
                return view
        return None

    def give_back(self, name: str) -> None:
        """A reused sandbox, made pristine: warm again."""
        with self.condition:
            view = self.pods[name]
            view.claimed, view.warm_since = False, time.monotonic()
            if view.usable:
                self.warm_order.append(name)
            self.condition.notify_all()

    def counts(self, job: str) -> dict[str, int]:
        """How many of `job`'s pods are warm, held, starting, pending or gone."""
        counted = {"warm": 0, "held": 0, "starting": 0, "pending": 0, "gone": 0}
        for view in self.pods.values():
            if view.job != job:
                continue
            if view.deleted or view.phase in ("Succeeded", "Failed"):
                counted["gone"] += 1
            elif view.claimed:
                counted["held"] += 1
            elif view.name in self.warm_order:
                counted["warm"] += 1
            elif view.phase == "Running":
                counted["starting"] += 1
            else:
                counted["pending"] += 1
        return counted

    def waiting_reasons(self, job: str) -> list[str]:
        """The reasons the pods not yet warm give, most common first."""
        reasons: dict[str, int] = {}
        for view in self.pods.values():
            if view.job == job and not view.claimed and view.name not in self.warm_order:
                if not view.deleted and view.phase not in ("Succeeded", "Failed"):
                    reasons[view.reason] = reasons.get(view.reason, 0) + 1
        return [
            f"{count} x {reason}" for reason, count in sorted(reasons.items(), key=lambda r: -r[1])
        ]


def pods_path(namespace: str, query: dict[str, str]) -> str:
    return f"/api/v1/namespaces/{namespace}/pods?{urllib.parse.urlencode(query)}"


def sandbox_path(namespace: str, pod: str, action: str, query: str = "") -> str:
    """The pod proxy's path to one of a sandbox's requests."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{SANDBOX_PORT}/proxy/{action}"
    return path + (f"?{query}" if query else "")


def watch_lines(connection: UnixHTTPConnection, path: str) -> Iterator[dict]:
    """A watch's events, one JSON object a line, as the API server streams them."""
    connection.request("GET", path)
    response = connection.getresponse()
    if response.status != 200:
        raise DemoError(
            f"watch of the pool's pods answered {response.status}: {response.read()[:200]!r}"
        )
    for line in response:
        if line.strip():
            yield json.loads(line)


class PodWatch:
    """The pool's pods, listed then watched through the proxy (no kubectl process of its own),
    each change told to the state; a watch that ends is started again from where it was."""

    def __init__(
        self,
        socket_path: str,
        namespace: str,
        jobs: list[str],
        state: PoolState,
        probe: Callable[[PodView], None],
    ) -> None:
        self.socket_path, self.namespace, self.jobs = socket_path, namespace, jobs
        self.state, self.probe = state, probe
        self.stopped = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(
            target=self._follow, name="rl-batch-demo pool watch", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _tell(self, pod: dict, deleted: bool) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name") or ""
        if job in self.jobs:
            view = self.state.apply(pod, deleted, job)
            if view is not None:
                self.probe(view)

    def _follow(self) -> None:
        version = ""
        while not self.stopped.is_set():
            connection = UnixHTTPConnection(self.socket_path, WATCH_SECONDS + REQUEST_GRACE_SECONDS)
            try:
                if not version:
                    version = self._list(connection)
                query = {
                    "watch": "1",
                    "resourceVersion": version,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": str(WATCH_SECONDS),
                }
                for event in watch_lines(connection, pods_path(self.namespace, query)):
                    if self.stopped.is_set():
                        return
                    version = self._event(event, version)
            except (OSError, http.client.HTTPException, ValueError, DemoError) as error:
                self.error = str(error)
                if self.stopped.wait(0.2):
                    return
            finally:
                connection.close()

    def _list(self, connection: UnixHTTPConnection) -> str:
        connection.request("GET", pods_path(self.namespace, {}))
        response = connection.getresponse()
        listed = json.loads(response.read())
        if response.status != 200:
            raise DemoError(f"listing the pool's pods answered {response.status}")
        items = listed.get("items") or []
        for pod in items:
            self._tell(pod, False)
        self.state.forget_missing({(p.get("metadata") or {}).get("name") for p in items})
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _event(self, event: dict, version: str) -> str:
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            return ""  # expired (410 Gone): list again
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._tell(pod, kind == "DELETED")
        return str((pod.get("metadata") or {}).get("resourceVersion") or version)


def encoded_stdin(stdin: str | bytes | None) -> str:
    if stdin is None:
        return ""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return base64.b64encode(data).decode("ascii")


def command_text(command: str | Sequence[str]) -> str:
    """A command as one line, for commands.jsonl and errors."""
    if isinstance(command, str):
        return command
    return " ".join(part if part and " " not in part else json.dumps(part) for part in command)


# --------------------------------------------------------------------------
# src/rl_batch_demo/watch.py: Watching a batch: its Jobs as one, its watches and their queue, polling when they break, the

class BatchJobs:
    """The Jobs of one batch as they were last seen: its one Job, or one per image, which the
    follower and the evidence read as one (merged_job). `names`: in creation order."""

    def __init__(self, batch: str, names: Sequence[str]) -> None:
        self.batch = batch
        self.names = list(names)
        self.seen: dict[str, dict] = {}

    @property
    def several(self) -> bool:
        return len(self.names) > 1

    def see(self, job: dict) -> dict | None:
        """Take one Job as read; the batch's Job as it now stands (None: not one of the batch's)."""
        name = (job.get("metadata") or {}).get("name")
        if name not in self.names:
            return None
        self.seen[name] = job
        return self.view()

    def view(self) -> dict | None:
        """The batch's Job: the one Job as read, or the merge of those seen so far."""
        jobs = [self.seen[name] for name in self.names if name in self.seen]
        if not jobs:
            return None
        return merged_job(self.batch, jobs, len(self.names)) if self.several else jobs[0]

    def saved(self) -> dict | None:
        """job.json: the one Job, or every Job seen as a v1 List."""
        if not self.several:
            return self.view()
        return (
            list_manifest([self.seen[name] for name in self.names if name in self.seen])
            if self.seen
            else None
        )

    def job_selector(self) -> list[str]:
        """kubectl's arguments that list (or watch) the batch's Jobs and no other."""
        if self.several:
            return ["-l", f"{BATCH_LABEL}={self.batch}"]
        # A list watch, not `get job NAME -w`: for one named object kubectl drops its
        # watch's first event, losing any change made between its GET and its watch.
        return ["--field-selector", f"metadata.name={self.names[0]}"]

    def pod_selector(self) -> str:
        """The label selector of the batch's pods."""
        return f"{BATCH_LABEL}={self.batch}" if self.several else f"job-name={self.names[0]}"


def saved_batch_job(saved: dict, batch: str) -> dict:
    """The batch's Job from job.json as saved: the one Job, or the merge of a List of them."""
    if saved.get("kind") != "List":
        return saved
    jobs = BatchJobs(batch, [job["metadata"]["name"] for job in saved.get("items") or []])
    for job in saved.get("items") or []:
        jobs.see(job)
    return jobs.view() or {"metadata": {"name": batch}}


class LogRead(NamedTuple):
    """A pod's log was read after its container ended: its episode may be settled now."""

    pod: str


class WatchEvent(NamedTuple):
    """What a watch printed: of the Job, the pods or the events (`kind`), and when it arrived."""

    kind: str
    event: dict
    arrived: float


class WatchEnded(NamedTuple):
    """A watch's process ended; `refusal`: the API's refusal it printed, if it was one."""

    kind: str
    refusal: str | None


class WatchRoom:
    """Room for at most `most` watch events waiting in the queue: a watch's reader waits for room
    before it puts the next (and so stops reading its pipe), until its watch is stopped. The
    other items (a watch's end, a log read) take no room, so that no reader of logs ever waits."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.waiting = 0
        self._changed = threading.Condition()

    def enter(self, stopped: threading.Event) -> None:
        """Wait for room for one more event, or for this watch to be stopped (then its last
        events, at most what its pipe held, are taken in without waiting)."""
        with self._changed:
            while self.waiting >= self.most and not stopped.is_set():
                self._changed.wait()
            self.waiting += 1

    def leave(self) -> None:
        """One event was taken from the queue."""
        with self._changed:
            self.waiting = max(0, self.waiting - 1)
            self._changed.notify()

    def wake(self) -> None:
        """A watch was stopped: its reader, if waiting for room, waits no more."""
        with self._changed:
            self._changed.notify_all()


class WatchStream:
    """One batch's watches (`kubectl get -w` of its Job, its pods, the namespace's events): each
    process's output turned by a thread into queue items, a WatchEvent for each event and a
    WatchEnded at its end; and how often each broke in a row, for the restarts. At most `most`
    events wait in the queue (WatchRoom): `get` is how they are taken out."""

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        job_name: str,
        jobs: BatchJobs | None = None,
        most: int = WATCH_EVENTS_WAITING_MOST,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.job_name = job_name
        self.jobs = jobs or BatchJobs(job_name, [job_name])
        self.queue: queue.Queue[WatchEvent | WatchEnded | LogRead] = queue.Queue()
        self.room = WatchRoom(most)
        self.processes: dict[str, subprocess.Popen] = {}
        self._stopped: dict[str, threading.Event] = {}
        self.failures = {"job": 0, "pods": 0, "events": 0}

    def get(self, timeout: float | None) -> WatchEvent | WatchEnded | LogRead:
        """The next item, waiting up to `timeout` seconds (None: not at all); queue.Empty if none."""
        item = self.queue.get_nowait() if timeout is None else self.queue.get(timeout=timeout)
        if isinstance(item, WatchEvent):
            self.room.leave()
        return item

    def log_read(self, pod: str) -> None:
        """From a log reader's thread: a pod's log was read after its end. Its item, which takes no
        room, wakes the follower to settle the pod's episode."""
        self.queue.put(LogRead(pod))

    def __contains__(self, kind: str) -> bool:
        return kind in self.processes

    def __len__(self) -> int:
        return len(self.processes)

    def start(self, kind: str, client_deadline: float) -> None:
        seconds = math.ceil(client_deadline - time.monotonic())
        if kind == "job":
            args = ["get", "jobs", *self.jobs.job_selector()]
        elif kind == "events":
            args = ["get", "events"]
        else:
            args = ["get", "pods", "-l", self.jobs.pod_selector()]
        args += ["-n", self.namespace, "-o", "json", "--watch", "--output-watch-events"]
        errors = tempfile.TemporaryFile()
        # An interrupt comes once the watch is whole: its process, known to be stopped, and its reader.
        with INTERRUPTS.holding():
            try:
                process: Any = (
                    self.kubectl.stream(args, seconds, stderr=errors)
                    if self.kubectl.api is None
                    else self.kubectl.api.watch(self.api_path(kind), seconds, errors)
                )
            except OSError as error:
                errors.close()
                raise DemoError(f"cannot run kubectl {self.kubectl.binary!r}: {error}") from None
            self.processes[kind] = process
            stopped = self._stopped[kind] = threading.Event()
            threading.Thread(
                target=self._pump, args=(kind, process, errors, stopped), daemon=True
            ).start()

    def api_path(self, kind: str) -> str:
        """The API path that watches what `start` would have kubectl watch: from the objects there
        now (each an ADDED event first, as kubectl lists them) onwards."""
        if kind == "job":
            resource = f"/apis/batch/v1/namespaces/{self.namespace}/jobs"
            query = (
                {"labelSelector": f"{BATCH_LABEL}={self.jobs.batch}"}
                if self.jobs.several
                else {"fieldSelector": f"metadata.name={self.jobs.names[0]}"}
            )
        elif kind == "events":
            resource, query = f"/api/v1/namespaces/{self.namespace}/events", {}
        else:
            resource = f"/api/v1/namespaces/{self.namespace}/pods"
            query = {"labelSelector": self.jobs.pod_selector()}
        return f"{resource}?{urllib.parse.urlencode(dict(query, watch='1'))}"

    def _pump(
        self, kind: str, process: subprocess.Popen, errors: Any, stopped: threading.Event
    ) -> None:
        """Turn a watch's output into queue items, each once there is room; say when it ends."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def chunks() -> Iterator[str]:
            while True:
                data = process.stdout.read(65536)  # type: ignore[union-attr]
                if not data:
                    return
                yield decoder.decode(data)

        try:
            for value in iter_json_stream(chunks()):
                self.room.enter(stopped)
                self.queue.put(WatchEvent(kind, value, time.time()))
        except (OSError, ValueError):
            pass  # the pipe closed under us: reported as the watch's end below
        process.wait()
        self.queue.put(WatchEnded(kind, refusal(errors)))

    def restart(self, kind: str, client_deadline: float) -> None:
        """Start a broken watch again, after a pause that grows with its breaks in a row."""
        time.sleep(min(2.0, 0.2 * 2 ** self.failures[kind]))
        self.start(kind, client_deadline)

    def stop(self, keep: Sequence[str] = ()) -> None:
        stopping = {kind: process for kind, process in self.processes.items() if kind not in keep}
        for kind, process in stopping.items():
            if kind in self._stopped:
                self._stopped[kind].set()
            if process.poll() is None:
                process.terminate()
        self.room.wake()
        for kind, process in stopping.items():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
            del self.processes[kind]


class PollFallback:
    """Once the watches broke too often in a row to be worth restarting: the Job and its pods,
    read every POLL_INTERVAL_SECONDS instead."""

    def __init__(
        self, kubectl: Kubectl, namespace: str, job_name: str, jobs: BatchJobs | None = None
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.job_name = job_name
        self.jobs = jobs or BatchJobs(job_name, [job_name])
        self.active = False
        self.next_read = 0.0

    def start(self) -> None:
        """Poll from now on, the first read at once."""
        self.active = True
        self.next_read = time.monotonic()

    def due(self, now: float) -> bool:
        return self.active and now >= self.next_read

    def read(self, client_deadline: float) -> tuple[list[dict], list[dict], float]:
        """The batch's Jobs and its pods as read now, and when (the client's wall clock)."""
        retry_until = min(client_deadline, time.monotonic() + CALL_TIMEOUT_SECONDS)
        if self.jobs.several:
            jobs = (
                self.kubectl.get_list(
                    "jobs", self.namespace, *self.jobs.job_selector(), retry_until=retry_until
                )
                or {}
            ).get("items", [])
        else:
            jobs = [self.kubectl.get("job", self.job_name, self.namespace, retry_until=retry_until)]
        pods = self.kubectl.get_list(
            "pods", self.namespace, "-l", self.jobs.pod_selector(), retry_until=retry_until
        )
        return jobs, (pods or {}).get("items", []), time.time()

    def poll(self, client_deadline: float, apply: Callable[[str, str, dict, float], Any]) -> None:
        """Read the batch's Jobs and its pods now, and hand each to `apply` as a watch would have
        (kind, change, object, when it arrived); the next read follows once they are taken in."""
        jobs, pods, seen = self.read(client_deadline)
        for pod in pods:
            apply("pods", "ADDED", pod, seen)
        for job in jobs:
            apply("job", "MODIFIED", job, seen)
        self.taken_in()

    def taken_in(self) -> None:
        """The last read is taken in: the next one follows a whole interval later, however long
        thousands of pods took to apply."""
        self.next_read = time.monotonic() + POLL_INTERVAL_SECONDS


@dataclasses.dataclass
class WaitCost:
    """What following a Job cost the client: the kubectl processes it started while waiting, the
    watches it restarted, and the most watch items ever waiting to be handled (a client that
    keeps up keeps that small)."""

    processes: int = 0
    restarts: int = 0
    queue_peak: int = 0

    def took(self, waiting: int) -> None:
        """One watch item taken, with `waiting` more behind it."""
        self.queue_peak = max(self.queue_peak, waiting + 1)


class BatchWatching:
    """How one batch is watched: its watches (WatchStream) started, and one that broke restarted;
    after repeated breaks in a row, the Job and its pods polled instead (PollFallback), or the
    events, which can be listed after the end, given up; and what the waiting cost (WaitCost)."""

    def __init__(self, watches: WatchStream, poller: PollFallback, cost: WaitCost) -> None:
        self.watches = watches
        self.poller = poller
        self.cost = cost
        # The namespace's events are followed while waiting so that little is left to read at the
        # end; not watched (then listed at the end) when the watch is refused or broke for good.
        self.events_watched = True

    @property
    def polling(self) -> bool:
        """The watches gave up for good: the Job and its pods are read every POLL_INTERVAL_SECONDS."""
        return self.poller.active

    def start(self, client_deadline: float) -> None:
        """Start each watch not running yet (one may be, started before the proxy was opened),
        none of them broken yet."""
        self.watches.failures = {"job": 0, "pods": 0, "events": 0}
        for kind in ("job", "pods", "events"):
            if kind not in self.watches:
                self.watches.start(kind, client_deadline)

    def next_item(self, client_deadline: float) -> WatchEvent | WatchEnded | LogRead | None:
        """The watches' next item, should one come before the next poll; else (None) within a
        second, so that the progress is shown again even when nothing arrives."""
        wake = self.poller.next_read if self.polling else time.monotonic() + 1.0
        wait = min(client_deadline, wake) - time.monotonic()
        try:
            item = self.watches.get(timeout=max(0.01, wait))
        except queue.Empty:
            return None
        self.cost.took(self.watches.queue.qsize())
        return item

    def ended(
        self, kind: str, refusal: str | None, batch_ended: bool, client_deadline: float
    ) -> None:
        """A watch ended: restarted, or after repeated breaks polled instead (the events, which
        can be listed after the end, are given up instead). `batch_ended`: the Job's end was seen."""
        self.watches.processes.pop(kind, None)
        if kind == "events" and (
            refusal or self.watches.failures[kind] >= WATCH_RESTARTS_BEFORE_POLLING
        ):
            self._unwatch_events(refusal)
            return
        if batch_ended or self.polling:
            return
        if refusal:
            # Refused for good, unlike a broken connection: each restart would list and be
            # refused again, so say what is missing instead of looping.
            raise DemoError(f"cannot watch the {kind}: {refusal}")
        self.watches.failures[kind] += 1
        if self.watches.failures[kind] > WATCH_RESTARTS_BEFORE_POLLING:
            self.poller.start()
            self.watches.stop()
            return
        self.cost.restarts += 1
        self.watches.restart(kind, client_deadline)

    def _unwatch_events(self, refusal: str | None) -> None:
        """The events are listed after the end instead, as they can be without a watch; said
        once, since for thousands of pods that list is the slow part of the end."""
        if self.events_watched:
            why = refusal or f"it broke {self.watches.failures['events'] + 1} times in a row"
            print(
                f"Warning: cannot watch the events ({why}); they are listed after the Job "
                f"ends instead (grant watch on events to follow them)",
                file=sys.stderr,
                flush=True,
            )
        self.events_watched = False

    def followed(self, kind: str) -> bool:
        """The watch of `kind` runs and is what the follower goes by."""
        return (
            kind in self.watches and not self.polling and (kind != "events" or self.events_watched)
        )


def waiting_note(job: dict | None, elapsed: float) -> str:
    """What the client is waiting for once the Job has stopped running pods, else nothing."""
    job = job or {}
    failure = condition(job, "FailureTarget")
    if failure and failure.get("status") == "True":
        return (
            f"  ({failure.get('reason', 'failing')}: waiting for the pods to stop before Kubernetes "
            f"marks the Job Failed)"
        )
    success = condition(job, "SuccessCriteriaMet")
    if success and success.get("status") == "True":
        return "  (all succeeded: waiting for the pods to stop before Kubernetes marks the Job Complete)"
    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(deadline, int) and elapsed > deadline:
        return (
            f"  (past the Job's {deadline} s deadline: waiting up to {CLIENT_GRACE_SECONDS} s more for "
            f"the Job controller to end it)"
        )
    return ""


def status_line(job_name: str, count: int, job: dict | None, elapsed: float, polling: bool) -> str:
    """The progress shown while a Job is followed: its pods by state, the time since it was submitted,
    and what the client is waiting for once no pod runs."""
    status = (job or {}).get("status") or {}
    return (
        f"{job_name}: {elapsed:6.1f}s  "
        f"active {status.get('active', 0)}  ready {status.get('ready', 0)}  "
        f"succeeded {status.get('succeeded', 0)}/{count}  failed {status.get('failed', 0)}"
        + ("  (polling)" if polling else "")
        + waiting_note(job, elapsed)
    )


class LogReader:
    """The one place a batch's episode logs are read: each as its container ends (saved at once to
    the batch directory, so little is left to write at the end), and at collection whatever is missing."""

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        pool: concurrent.futures.ThreadPoolExecutor,
        proxy: ApiProxy | None = None,
        log_dir: str | None = None,
        on_read: Callable[[str], None] | None = None,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.pool = pool
        self.proxy = proxy
        self.log_dir = log_dir
        # Pod name -> (containerID, log) read after that container terminated: complete. Each is
        # saved as <pod>.log as it is read, but for the names in _unsaved (the disk refused it).
        self.early: dict[str, tuple[str, str]] = {}
        self._unsaved: set[str] = set()
        # Each pod's container whose log is read once (a restarted one's is read again), and the
        # reads not done yet: a done read's Future (a lock, a condition and their queue, a
        # kilobyte) is not kept.
        self._scheduled: dict[str, str] = {}
        self._reads: dict[tuple[str, str], concurrent.futures.Future] = {}
        # Told (from a reader's thread) the name of each pod whose log was read after its end.
        self.on_read = on_read

    def schedule(self, ended: Iterable[tuple[str, str]]) -> None:
        """Read the log of each ended container once; keyed by container, so a restarted one's is read again."""
        for key in ended:
            name, container_id = key
            if self._scheduled.get(name) != container_id:
                self._scheduled[name] = container_id
                self._reads[key] = read = self.pool.submit(self._read_early, *key)
                read.add_done_callback(functools.partial(self._read_done, key))

    def _read_done(self, key: tuple[str, str], read: concurrent.futures.Future) -> None:
        self._reads.pop(key, None)

    def _read_early(self, name: str, container_id: str) -> None:
        try:
            text = read_log(
                self.kubectl,
                self.proxy,
                self.namespace,
                name,
                time.monotonic() + COLLECT_RETRY_SECONDS,
            )
            # Unsaved before it is published: collect(), which may stop waiting for this read,
            # then saves the log itself rather than count on a write that may yet fail.
            self._unsaved.add(name)
            self.early[name] = (container_id, text)
            if self.log_dir is not None:
                write_text(os.path.join(self.log_dir, f"{name}.log"), text)
                self._unsaved.discard(name)
        except DemoError:
            return  # read again (and saved) when the batch's evidence is collected
        if self.on_read is not None:
            self.on_read(name)

    def collect(
        self, pods: Sequence[dict], batch_dir: str, retry_until: float | None, problems: list[str]
    ) -> dict[str, str]:
        """Each pod's episode log, read after its container ended (else read now) and saved in
        `batch_dir`; unreadable -> empty, and why goes to `problems`."""
        concurrent.futures.wait(list(self._reads.values()), timeout=CALL_TIMEOUT_SECONDS)
        logs: dict[str, str] = {}
        pending = {}
        for pod in pods:
            name = pod_name(pod)
            terminated = container_terminated(pod)
            read_early = self.early.get(name)
            if (
                terminated is not None
                and read_early
                and read_early[0] == terminated.get("containerID", "")
            ):
                logs[name] = read_early[1]
            else:
                pending[name] = self.pool.submit(
                    read_log, self.kubectl, self.proxy, self.namespace, name, retry_until
                )
        # A pod deleted (by the Job's end: a straggler --need cancelled, one cut short) takes its
        # log with it, sooner or later: that it is gone is no failure to save, and the episode's
        # row says how its pod ended.
        deleted = {pod_name(pod) for pod in pods if pod["metadata"].get("deletionTimestamp")}
        for name, future in pending.items():
            try:
                logs[name] = future.result()
            except DemoError as error:
                logs[name] = ""
                if name in deleted and log_gone(error):
                    continue
                problems.append(f"{name}.log: {error}")
        logs = dict(sorted(logs.items()))
        for name, text in logs.items():
            read_early = self.early.get(name)
            if read_early is None or read_early[1] is not text or name in self._unsaved:
                write_text(os.path.join(batch_dir, f"{name}.log"), text)
        return logs


def ended_logs(attempts: Sequence[dict], early: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The logs of these pods read after their container ended; an ended pod whose container never
    ran has none to read (empty)."""
    logs = {}
    for pod in attempts:
        name = pod_name(pod)
        terminated = container_terminated(pod)
        read = early.get(name)
        if terminated is not None and read and read[0] == terminated.get("containerID", ""):
            logs[name] = read[1]
        elif terminated is None and pod_terminal(pod):
            logs[name] = ""
    return logs


def pod_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# --------------------------------------------------------------------------
# src/rl_batch_demo/follow.py: Following a batch: the state its watches feed, its rewards, the follower, its evidence.

class Progress:
    """Live progress on stderr: one updating line on a terminal, a line every few seconds otherwise."""

    def __init__(self, quiet: bool, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = 0.2 if self.interactive else 5.0
        self._last = 0.0
        self._open_line = False

    def due(self) -> bool:
        """Whether an update now would be shown: the caller need not make the line otherwise."""
        return not self.quiet and time.monotonic() - self._last >= self.interval

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.quiet or (not force and now - self._last < self.interval):
            return
        self._last = now
        if self.interactive:
            self.stream.write("\r" + text + "\x1b[K")
            self._open_line = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def new_batch(self) -> None:
        """The next update is shown at once: each batch's progress starts with a line of its own."""
        self._last = 0.0

    def finish(self) -> None:
        if self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False


class StateChange(NamedTuple):
    """What one change did to a batch's state, as BatchState.apply returns it."""

    kind: str  # "job", "pods" or "events"
    pod: str | None = None  # the pod it was about (also when deleted)
    ended: tuple[
        tuple[str, str], ...
    ] = ()  # (pod, containerID) of each episode container it shows ended
    job_ended: bool = False  # this is the change that showed the Job's end


class BatchState:
    """What the watches of one Job have said: a pure reducer of their changes, with no
    thread, process or clock of its own; `apply` is the one way a change comes in.

    It holds the Job and each pod as last seen (a pod once, its repeated texts and parts
    shared once it has ended), the namespace's events, and when (the client's wall clock, given
    with each change) each transition first arrived: an upper bound on when it happened,
    kept for `report` as observed.json.
    """

    def __init__(
        self,
        indented_pods: bool = False,
        spool_dir: str | None = None,
        shared: SharedStrings | None = None,
        index: EventIndex | None = None,
    ) -> None:
        self.job: dict | None = None
        self.pods: dict[str, dict] = {}
        self._not_final: set[str] = set()  # the pods held whose version is not final
        self.deleted: set[str] = set()
        # One table of shared texts for the pods and the events (and the drafts, given theirs,
        # and the index of the events they read).
        self._shared = shared or SharedStrings()
        self.events = EventStore(spool_dir, self._shared, index)
        # pod name -> transition -> time, and the stamps seen only while it ran
        self.observed: dict[str, dict[str, Any]] = {}
        self.job_observed: dict[
            str, float
        ] = {}  # "added" or a condition type that turned True -> time
        self.end: str | None = None
        # The Job's resourceVersion when its end was seen: the evidence read afterwards
        # must be at least this new, however far behind the pod watch is.
        self.end_resource_version: str | None = None
        # Each pod's text for pods.json, encoded as soon as the pod looks final (ended, counted,
        # not being deleted) rather than all at the end; name -> the resourceVersion encoded.
        self._final_texts = Spool(spool_dir, "pods.json")
        self._final_versions: dict[str, str] = {}
        # A small batch's pods.json is indented (see pod_text), in pure Python: made as each pod
        # ends, that costs nothing after the end.
        self.indented_pods = indented_pods

    def apply(self, kind: str, change: str, obj: dict, arrived: float) -> StateChange:
        """One change a watch (or a poll) delivered about the Job ("job"), a pod ("pods") or an
        event ("events"): `change` is the watch's type (ADDED, MODIFIED, DELETED), `arrived`
        when it reached the client."""
        if kind == "job":
            return StateChange(kind, job_ended=self._on_job(obj, arrived))
        if kind == "events":
            self.events.apply(change, obj)
            return StateChange(kind)
        return self._on_pod(obj, change == "DELETED", arrived)

    def submitted(self, at: float) -> None:
        """The client's create call for the Job starts now (its wall clock)."""
        self.job_observed["submitted"] = at

    def created(self, at: float) -> None:
        """The client's create call for the Job returned (its wall clock)."""
        self.job_observed["create_returned"] = at

    def _on_job(self, job: dict, arrived: float) -> bool:
        """Take the Job as last seen; True when this is the change that showed its end."""
        self.job = job
        record_job_observation(self.job_observed, job, arrived)
        end = job_finished(job)
        if not end or self.end is not None:
            return False
        self.end_resource_version = job.get("metadata", {}).get("resourceVersion") or None
        self.end = end
        return True

    def _on_pod(self, pod: dict, deleted: bool, arrived: float) -> StateChange:
        name = (pod.get("metadata") or {}).get("name")
        if not name:
            return StateChange("pods", name)
        # The one object for the name, whichever version (or event) told it first: every table
        # keyed by the pod (its version held, what was seen, its log read, its draft) shares it.
        name = self._shared.text(name)
        if deleted:
            # Keep the last state seen: a pod that vanished is still part of the evidence.
            self.deleted.add(name)
            self._hold(name, self.pods.get(name, pod))
            return StateChange("pods", name)
        if pods_final_one(pod):
            # Its state from now on is what is held to the end: worth holding small (an ended
            # pod the Job controller has yet to count changes once more, at once).
            pod = self._shared.share(pod)
            self._final_texts.put(name, pod_json(pod, self.indented_pods))
            self._final_versions[name] = pod["metadata"].get("resourceVersion")
        self._hold(name, pod)
        seen_before = self.observed.get(name)
        seen_now = pod_observation(seen_before, pod, arrived)
        if seen_now is not seen_before:
            # Its texts shared: a stamp of one second is every pod's of that second.
            self.observed[name] = self._shared.texts(seen_now)
        terminated = container_terminated(pod)
        if terminated is None:
            return StateChange("pods", name)
        # Shared too: the log reader keeps it, and the pod's final version has it again.
        return StateChange(
            "pods", name, ((name, self._shared.text(terminated.get("containerID", ""))),)
        )

    def _hold(self, name: str, pod: dict) -> None:
        """Hold this version of a pod, noting whether it is final (pods_final_one): the watch
        asks after each change whether every pod is, which must not read each of 100,000."""
        self.pods[name] = pod
        if pods_final_one(pod):
            self._not_final.discard(name)
        else:
            self._not_final.add(name)

    def pod_text(self, pod: dict, indented: bool = False) -> bytes:
        """A pod as pods.json holds it (see pod_json), UTF-8: the text encoded while waiting when
        it is of this very version and in this form."""
        name = pod_name(pod)
        version = pod["metadata"].get("resourceVersion")
        if (
            version is not None
            and self._final_versions.get(name) == version
            and self.pods.get(name) is pod
            and indented == self.indented_pods
        ):
            return self._final_texts.get_bytes(name)
        return pod_json(pod, indented).encode("utf-8")

    def forget_shared(self) -> None:
        """Once nothing more is watched: the tables of shared strings are of no more use."""
        self._shared.table.clear()
        self.events.forget_shared()

    def pods_are_final(self) -> bool:
        """Each pod of the Complete Job was seen to its final state (see pods_final)."""
        # As pods_final(self.job, self.pods.values()), from what _hold noted of each pod.
        return (
            self.end == "Complete"
            and not self.deleted
            and not self._not_final
            and job_counted(self.job, len(self.pods))
        )

    def observations(self) -> dict:
        """What the watches saw and when, as saved in observed.json."""
        return {"clock": "client (time.time())", "pods": self.observed, "job": self.job_observed}


class RewardCallbackError(Exception):
    """The caller's on_reward callback raised: the run stops as an interruption does, and the
    callback's own exception (`original`) is raised to the caller."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"on_reward raised {type(original).__name__}: {original}")
        self.original = original


def whole_group(rows: dict[int, dict], index: int, size: int) -> set[int]:
    """{the episode's group} once every member of it has a valid line, else {}."""
    members = range(index // size * size, index // size * size + size)
    return {index // size} if all(rows.get(m, {}).get("valid") for m in members) else set()


class RewardStream:
    """rewards.jsonl while the batch runs: each episode's line is appended (and flushed) the moment its
    outcome is final, and never changed; at the end the file is rewritten whole, in index order, with
    the very same lines and those of the episodes settled only by the evidence read after the end.

    `judge` is told which pods changed (or whose log was read) and settles their episodes;
    `on_reward`, if given, is called with each line's row as it is written, from the thread that
    follows the batch (the one that called `run`): the following waits until it returns.
    """

    def __init__(
        self,
        path: str,
        settings: Settings,
        on_reward: Callable[[dict], None] | None = None,
        stop: StopRequest | None = None,
        stop_rest: Callable[[], None] | None = None,
        kept: Sequence[dict] = (),
    ) -> None:
        self.path = path
        # --need-groups K: called once, as soon as K groups are whole, to stop the rest.
        self.stop_rest = stop_rest
        self.count = settings.count
        self.settings = settings
        self.images = group_images(settings)
        self.may_retry = bool(settings.retries)
        self.on_reward = on_reward
        self.rows: dict[int, dict] = {}
        self.deliveries: list[Delivery] = []
        self.pods_of: dict[int, set[str]] = {}
        # An attempt of theirs ended: settled once the log or the Job says so.
        self.waiting: set[int] = set()
        self._handle: TextIO | None = open(path, "w", encoding="utf-8")
        # An attach's: the lines a client that is gone wrote, written again and never redelivered.
        for row in kept:
            self._handle.write(json.dumps(row) + "\n")
            self.rows[row["index"]] = row
        self._handle.flush()
        # Set from another thread (stream_batch's reader gone): the run stops at its next turn.
        self.stop = stop
        self.whole_groups: set[int] = set()  # the groups whose every member has a valid line
        for row in kept:  # an attach's: groups made whole before count toward --need-groups
            self.whole_groups |= whole_group(self.rows, row["index"], settings.group_size)

    def check_stop(self) -> None:
        """Stop the run (StreamClosed), as Ctrl-C would, once asked to from another thread."""
        if self.stop is not None:
            self.stop.check()

    def judge(
        self, state: BatchState, early: dict[str, tuple[str, str]], names: Iterable[str] | None
    ) -> None:
        """Settle the episodes of these pods (None: every episode waiting on the Job's word)."""
        if self.stop_rest and state.job is not None and not job_finished(state.job):
            # An attach's: K met by the lines of a client gone before it could stop the rest.
            self._stop_if_met()
        if names is None:
            indexes = set(self.waiting)
        else:
            indexes = set()
            for name in names:
                pod = state.pods.get(name)
                index = None if pod is None else pod_index(pod)
                if index is not None and 0 <= index < self.count and index not in self.rows:
                    self.pods_of.setdefault(index, set()).add(name)
                    indexes.add(index)
        for index in sorted(indexes):
            self._settle(index, state, early)

    def _settle(self, index: int, state: BatchState, early: dict[str, tuple[str, str]]) -> None:
        attempts = pods_by_index(
            (state.pods[name] for name in self.pods_of.get(index, ())), self.count
        ).get(index, [])
        logs = ended_logs(attempts, early)
        if not batch_job_whole(state.job, self.count):
            # Its pods may be seen before the Jobs are: its line waits for them (judge(None)).
            self.waiting.add(index)
            return
        if not settled_attempt(attempts, state.job, index, logs, self.may_retry):
            if any(pod_terminal(p) for p in attempts):
                self.waiting.add(index)
            return
        row = settled_row(index, attempts, state, logs, self.settings, self.images)
        final = next((p for p in attempts if pod_name(p) == row["pod"]), None)
        seen = terminated_seen_at(state.observed, row["pod"] or "")
        self.deliver(row, final, logs.get(row["pod"] or "", ""), seen, streamed=True)

    def deliver(
        self,
        row: dict,
        pod: dict | None,
        log_text: str,
        seen_terminated: float | None,
        streamed: bool,
    ) -> None:
        """Append one episode's line, once; then hand it to on_reward."""
        index = row["index"]
        if index in self.rows or self._handle is None:
            return
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()
        written = time.time()
        self.rows[index] = row
        self.waiting.discard(index)
        self.whole_groups |= whole_group(self.rows, index, self.settings.group_size)
        if streamed:
            self._stop_if_met()
        after, before = container_end_bounds(pod, log_text, seen_terminated)
        ok = row["failure_class"] is None
        self.deliveries.append(
            Delivery(index, ok, written, after, before, streamed, seen_terminated)
        )
        if self.on_reward is not None:
            try:
                self.on_reward(dict(row))
            except Exception as error:
                # Told once: the lines saved while the run stops are not handed to it again.
                self.on_reward = None
                raise RewardCallbackError(error) from error

    def _stop_if_met(self) -> None:
        """Once K groups are whole while the batch runs, the rest are stopped (--need-groups K)."""
        wanted, stop_rest = self.settings.need_groups, self.stop_rest
        if stop_rest and wanted is not None and len(self.whole_groups) >= wanted:
            self.stop_rest = None
            stop_rest()

    def finish(
        self,
        rows: Sequence[dict],
        pods: Sequence[dict],
        logs: dict[str, str],
        observed: dict[str, dict],
    ) -> list[dict]:
        """The batch's rows: each line already written as it was, the rest (from the evidence read
        after the end) appended; then the file rewritten atomically in index order."""
        by_name = {pod_name(pod): pod for pod in pods}
        for row in rows:
            name = row.get("pod") or ""
            seen = terminated_seen_at(observed, name)
            self.deliver(row, by_name.get(name), logs.get(name, ""), seen, streamed=False)
        self.close()
        final = [self.rows[index] for index in sorted(self.rows)]
        write_text(self.path, rewards_jsonl(final))
        return final

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def settled_row(
    index: int,
    attempts: Sequence[dict],
    state: BatchState,
    logs: dict[str, str],
    settings: Settings,
    images: Sequence[str | None],
) -> dict:
    """The rewards.jsonl row of an episode its attempts settled (episode_row)."""
    job = state.job or {"metadata": {}}
    terms = (settings.builtin, settings.task_ids, settings.group_size)
    row = episode_row(index, attempts, job, logs, *terms, images=images)
    classes = [row["failure_class"]] + [a["failure_class"] for a in row.get("earlier_attempts", [])]
    if "infrastructure" not in classes:
        return row
    # Only an infrastructure failure names its pod's warnings: the events are read for those alone.
    return episode_row(
        index, attempts, job, logs, *terms, pod_warnings(state.events.events()), images
    )


def terminated_seen_at(observed: dict[str, dict], name: str) -> float | None:
    """When the pod watch first showed this pod's container terminated (observed.json), if it did."""
    return ((observed.get(name) or {}).get("seen") or {}).get("terminated")


def batch_state(count: int, spool_dir: str | None, drafts: EpisodeDrafts | None) -> BatchState:
    """The state of a batch of `count` episodes: its pods.json indented if the batch is small, the
    texts kept for pods.json and events.json waiting on disk beside them (`spool_dir`), and the
    drafts' shared texts and index of the events its own, when there are drafts."""
    return BatchState(
        count < ONE_LINE_ITEMS_FROM,
        spool_dir,
        drafts.shared if drafts is not None else None,
        drafts.index if drafts is not None else None,
    )


class BatchIntake:
    """What each change to one batch's state calls for: a Job taken in as the batch's Job
    (BatchJobs: one Job of several is read with the others), the logs of the containers it shows
    ended read, the moment the Job's end was seen noted, and the episodes it may settle judged
    and summarised. Called from the one thread that follows the batch: a log reader's thread
    only queues its LogRead (WatchStream.log_read)."""

    def __init__(
        self,
        state: BatchState,
        jobs: BatchJobs,
        log_reader: LogReader,
        rewards: RewardStream | None = None,
        drafts: EpisodeDrafts | None = None,
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.log_reader = log_reader
        # A rollout's rewards.jsonl, each line written as its episode settles (a log read wakes the loop).
        self.rewards = rewards
        # Each episode summarised as it ends, so that little is left to do after the Job's end.
        self.drafts = drafts
        # When this client saw the Job's end, on both clocks (observed.json is what the watches saw).
        self.end_seen_monotonic: float | None = None
        self.end_seen_wall: float | None = None

    def apply(self, kind: str, change: str, obj: dict, arrived: float) -> StateChange:
        """One change into the state (BatchState.apply), then what it calls for."""
        if kind == "job":
            batch_job = self.jobs.see(obj)
            if batch_job is None:
                return StateChange(kind)  # not one of the batch's Jobs
            obj = batch_job
        changed = self.state.apply(kind, change, obj, arrived)
        self.log_reader.schedule(changed.ended)
        if changed.job_ended:
            self.end_seen_monotonic = time.monotonic()
            self.end_seen_wall = time.time()
        if kind == "job":
            self.judge(None)
        elif kind == "pods":
            self.settle(changed.pod or "")
        return changed

    def settle(self, name: str) -> None:
        """Judge and summarise this pod's episode: the pod changed, or its log was read."""
        self.judge([name])
        self.draft(name)

    def judge(self, names: Iterable[str] | None) -> None:
        """Write the rewards.jsonl line of each episode these pods settle (None: those waiting on the Job)."""
        if self.rewards is not None:
            self.rewards.judge(self.state, self.log_reader.early, names)

    def draft(self, name: str) -> None:
        """Summarise this pod's episode now if it has ended and its log was read after its end."""
        state = self.state
        pod = state.pods.get(name)
        if self.drafts is not None and pod is not None:
            self.drafts.saw(pod, state.job, state.observed.get(name))
        if self.drafts is None or pod is None or name in state.deleted or not pod_terminal(pod):
            return
        terminated = container_terminated(pod)
        read = self.log_reader.early.get(name)
        if terminated is None or read is None or read[0] != terminated.get("containerID", ""):
            return
        self.drafts.draft(pod, read[1], state.job, state.job_observed, state.observed.get(name))


class Submission(NamedTuple):
    """The one moment a Job was submitted: just before the client's create call, on both clocks."""

    wall: float
    monotonic: float


class BatchFollower:
    """Follows one Job and its pods until the Job ends, reading each log as its pod finishes;
    after the end, its watches still deliver what happened up to it (settle_watches).

    Watches (`kubectl get -w`) tell the end at once with no polling delay; a broken
    watch is restarted, and after repeated breaks the follower polls instead (BatchWatching).
    Every change, watched or polled, reaches the state through BatchIntake.apply.
    """

    def __init__(
        self,
        kubectl: Kubectl,
        namespace: str,
        job_name: str,
        count: int,
        progress: Progress,
        pool: concurrent.futures.ThreadPoolExecutor,
        proxy: ApiProxy | None = None,
        log_dir: str | None = None,
        rewards: RewardStream | None = None,
        watches: WatchStream | None = None,
        drafts: EpisodeDrafts | None = None,
        job_names: Sequence[str] | None = None,
        spare_held: bool = False,
    ) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.job_name = job_name
        self.count = count
        self.progress = progress
        self.proxy = proxy
        # The batch's Jobs (`job_names`: one per image, else the one named `job_name`), followed as one.
        self.jobs = BatchJobs(job_name, job_names or [job_name])
        # Given already started when its pod watch had to listen before the proxy was opened.
        self.watches = watches or WatchStream(kubectl, namespace, job_name, self.jobs)
        self.cost = WaitCost()
        poller = PollFallback(kubectl, namespace, job_name, self.jobs)
        self.watching = BatchWatching(self.watches, poller, self.cost)
        self.state = batch_state(count, log_dir, drafts)
        # A log read wakes the loop, when there is an episode to settle by it.
        on_read = self.watches.log_read if rewards is not None or drafts is not None else None
        self.log_reader = LogReader(kubectl, namespace, pool, proxy, log_dir, on_read)
        self.rewards, self.drafts = rewards, drafts
        self.intake = BatchIntake(self.state, self.jobs, self.log_reader, rewards, drafts)
        self.submission: Submission | None = None
        self._spared_at = 0.0  # when spare_held last froze what was held
        # The command line's process alone, if it froze nothing of its own (see held_objects_spared).
        self._may_freeze = spare_held and gc.get_freeze_count() == 0

    @property
    def polling(self) -> bool:
        """The watches gave up for good: the Job and its pods are read every POLL_INTERVAL_SECONDS."""
        return self.watching.polling

    @property
    def end_seen_monotonic(self) -> float | None:
        """When this client saw the Job's end (time.monotonic()), once it did."""
        return self.intake.end_seen_monotonic

    @property
    def end_seen_wall(self) -> float | None:
        """When this client saw the Job's end (time.time()), once it did."""
        return self.intake.end_seen_wall

    def observations(self) -> dict:
        return self.state.observations()

    def submit(self, create: Callable[[], dict]) -> dict:
        """Create the Job with `create`, the moment just before it taken as the submission's;
        the watches stop should it fail."""
        self.progress.new_batch()
        self.submission = Submission(time.time(), time.monotonic())
        self.state.submitted(self.submission.wall)
        try:
            created = create()
        except BaseException:
            self.stop_watches()
            raise
        self.state.created(time.time())
        return created

    def adopt(self) -> None:
        """Follow Jobs another client created (attach): the submission's moment is this
        client's start, and the state is told none (their creation call's moments are unknown)."""
        self.progress.new_batch()
        self.submission = Submission(time.time(), time.monotonic())

    def follow(self, client_deadline: float) -> str | None:
        """Wait until the Job is Complete or Failed ("Complete"/"Failed"), or None at the deadline."""
        # A watch started first is this wait's.
        processes_before = self.kubectl.processes - len(self.watches)
        try:
            self.watching.start(client_deadline)
            while self.state.end is None and time.monotonic() < client_deadline:
                if self.rewards is not None:
                    self.rewards.check_stop()
                if self.watching.poller.due(time.monotonic()):
                    self.watching.poller.poll(client_deadline, self.intake.apply)
                    if self.state.end is not None:
                        break
                item = self.watching.next_item(client_deadline)
                if item is not None:
                    self.take(item, client_deadline)
                self._show()
                self.spare_held()
        finally:
            # The pod and event watches go on while the evidence is read: they deliver what
            # happened up to the end, and should no pod list answer, what the pod watch saw
            # by then is all there is to go on.
            self.stop_watches(keep=("pods", "events") if self.state.end is not None else ())
            self.progress.finish()
            self.cost.processes = self.kubectl.processes - processes_before
        return self.state.end

    def spare_held(self) -> None:
        """What is held by now, out of the cycle collector's sight (see SPARE_HELD_SECONDS)."""
        now = time.monotonic()
        if self._may_freeze and now - self._spared_at >= SPARE_HELD_SECONDS:
            gc.freeze()
            self._spared_at = now

    def take(self, item: WatchEvent | WatchEnded | LogRead, client_deadline: float) -> None:
        """One queue item: a watch event, the end of a watch, or a log read."""
        if isinstance(item, WatchEnded):
            self.watching.ended(
                item.kind, item.refusal, self.state.end is not None, client_deadline
            )
            return
        if isinstance(item, LogRead):
            self.intake.settle(item.pod)
            return
        kind, event, arrived = item
        self.watches.failures[kind] = 0
        obj = event.get("object") if isinstance(event, dict) and "object" in event else event
        if not isinstance(obj, dict) or obj.get("kind") == "Status":
            return
        self.intake.apply(kind, event.get("type") or "ADDED", obj, arrived)

    def stop_watches(self, keep: Sequence[str] = ()) -> None:
        self.watches.stop(keep)

    def _show(self) -> None:
        if not self.progress.due():  # the line is made only when it is shown, not per change
            return
        elapsed = (
            time.monotonic() - self.submission.monotonic if self.submission is not None else 0.0
        )
        self.progress.update(
            status_line(self.job_name, self.count, self.state.job, elapsed, self.polling)
        )


# After the Job's end its pod and event watches still deliver what happened up to it.


def count_events_after_end(follower: BatchFollower, retry_until: float | None) -> int | None:
    """After the end: how many events the API holds (a list of one: its items and
    remainingItemCount), noting the revision that was. None when the events are not watched
    or could not be counted: then they are not waited for, but listed."""
    if not follower.watching.events_watched:
        return None
    try:
        events_expected, follower.state.events.resource_version = count_events(
            follower.kubectl, follower.proxy, follower.namespace, retry_until
        )
    except DemoError:
        return None
    return events_expected


def settle_watches(
    follower: BatchFollower, events_expected: int | None, seconds: float, pods: bool = True
) -> None:
    """After the end: take in what the watches still deliver until the pods are final (not
    `pods`: they are saved, or to be listed, already) and the events number
    `events_expected` (None: not waited for), for up to `seconds`. What the pod watch
    delivered before it was stopped is left untaken: pods.json is saved from it then."""
    watches = follower.watches
    deadline = time.monotonic() + seconds
    while not watches_settled(follower, events_expected, pods):
        try:
            item = watches.get(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() >= deadline:
                return
            continue
        while True:  # everything already delivered, before judging again
            if not (
                isinstance(item, (WatchEvent, WatchEnded))
                and item.kind == "pods"
                and "pods" not in watches
            ):
                follower.take(item, deadline)
            try:
                item = watches.get(None)
            except queue.Empty:
                break


def drain_pod_watch(follower: BatchFollower) -> None:
    """Stop the pod watch and take in everything it delivered since the Job ended."""
    watching = "pods" in follower.watches
    follower.stop_watches()
    deadline = time.monotonic() + 5
    while watching:
        try:
            item = follower.watches.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            return
        if isinstance(item, WatchEnded):
            if item.kind == "pods":
                return
            continue  # another watch's end: what follows the Job's end needs only the pods
        follower.take(item, deadline)


def watches_settled(
    follower: BatchFollower, events_expected: int | None, pods: bool = True
) -> bool:
    """Nothing more worth waiting for: each watch has delivered enough, or never will (not
    `pods`: the event watch alone)."""
    state = follower.state
    events_done = (
        events_expected is None
        or not follower.watching.followed("events")
        or events_caught_up(follower, events_expected)
    )
    pods_done = (
        not pods
        or not follower.watching.followed("pods")
        or state.end != "Complete"
        or bool(state.deleted)
        or watched_pods_final(follower)
    )
    return events_done and pods_done


def events_caught_up(follower: BatchFollower, events_expected: int | None) -> bool:
    """The event watch holds at least as many events as the API did after the end."""
    return (
        follower.watching.events_watched
        and not follower.polling
        and events_expected is not None
        and len(follower.state.events) >= events_expected
    )


def watched_pods_final(follower: BatchFollower) -> bool:
    """The pod watch saw each pod of the Complete Job to its final state (see pods_final)."""
    return not follower.polling and follower.state.pods_are_final()


class Evidence(NamedTuple):
    """What was saved of a finished batch, as its verification reads it."""

    job: dict | None  # None when the Job could not be read and the watch never saw it
    reading: PodReading
    logs: dict[str, str]  # pod name -> its log, empty when unreadable
    events: Sequence[EventRecord]  # this batch's events


class BatchEvidence:
    """The batch under way: its follower, and the saving of its evidence into its own directory.
    Each step that reads or saves a part of the evidence (read_batch_*, save_*) is given it."""

    def __init__(self, run: RunContext, follower: BatchFollower, batch_dir: str) -> None:
        self.follower = follower
        self.batch_dir = batch_dir
        self.kubectl = run.kubectl
        self.namespace = run.namespace
        self.settings = run.settings
        self.spelling = run.spelling
        self.silent = run.silent
        # How the events saved were read: "watch" (followed, as many as the API counted after
        # the end) or "list" (read in pages after the end).
        self.events_read = "list"

    @property
    def proxy(self) -> ApiProxy | None:
        """The run's proxy, as the follower reads through it."""
        return self.follower.proxy

    def event_index(self) -> EventIndex | None:
        """The watch's index of the events, when the events saved are the ones it followed."""
        return self.follower.state.events.index if self.events_read == "watch" else None

    def collect(self, job_name: str, retry: bool = True) -> Evidence:
        """Save job.json, pods.json, events.txt, events.json and one log per pod: the evidence of a batch.
        Without `retry`, each is read once, at once: no retries, no wait for the watches to settle."""
        follower = self.follower
        # Evidence is worth a few retries, not a long wait: a log that a kubelet
        # cannot serve now is saved empty and the episode fails verification.
        retry_until = time.monotonic() + COLLECT_RETRY_SECONDS if retry else None
        # Its own threads: the log readers' pool may still be busy with reads under way. Not
        # waited for on the way out: an interruption leaves a slow count to finish by itself.
        fetchers = concurrent.futures.ThreadPoolExecutor(4)
        try:
            # The events are counted while the pods settle and pods.json is written: an API
            # server busy with the Job's end may take a while to answer even a list of one.
            counting = (
                fetchers.submit(count_events_after_end, follower, retry_until)
                if retry and follower.watching.events_watched and not follower.polling
                else None
            )
            if retry:  # up to SETTLE_SECONDS for each pod's final state
                settle_watches(follower, None, SETTLE_SECONDS)
            watched_final = watched_pods_final(follower)
            pods_future = fetchers.submit(read_batch_pods, self, job_name, watched_final, retry)
            # Not counted: the events are listed, while the pods and logs are written.
            self.events_read = "list"
            if counting is None:
                events_future = fetchers.submit(read_batch_events, self, False, retry)
            problems: list[str] = []
            saved: tuple[PodReading, dict[str, str]] | None = None
            if watched_final:
                # Nothing the pod watch still delivers changes a final pod: pods.json and the
                # logs are saved now, and the event watch goes on.
                follower.stop_watches(keep=("events",))
                saved = save_pods_and_logs(self, pods_future, retry_until, problems)
            if counting is not None:
                # Then, once counted, up to SETTLE_SECONDS for as many events as the API held.
                events_expected = counting.result()
                settle_watches(follower, events_expected, SETTLE_SECONDS, pods=False)
                if events_caught_up(follower, events_expected):
                    self.events_read = "watch"
                events_future = fetchers.submit(
                    read_batch_events, self, self.events_read == "watch", retry
                )
            follower.stop_watches(keep=() if watched_final else ("pods",))
            if watched_final:
                follower.state.forget_shared()
            job_future = fetchers.submit(read_batch_job, self, job_name, retry_until)
            return save_evidence(
                self, job_future, saved or pods_future, events_future, retry_until, problems
            )
        finally:
            follower.stop_watches()  # already, unless something failed on the way
            fetchers.shutdown(wait=False)


def read_batch_job(batch: BatchEvidence, job_name: str, retry_until: float | None) -> dict | None:
    """The Job as its end was seen, else as read now, else as last watched."""
    state, jobs = batch.follower.state, batch.follower.jobs
    if state.end is not None and state.job is not None:
        return state.job
    if jobs.several:
        for name in jobs.names:
            try:
                job = batch.kubectl.get("job", name, batch.namespace, retry_until=retry_until)
                if job is not None:  # not missing_ok: a missing Job raised
                    jobs.see(job)
            except DemoError:
                pass  # as last watched, if it was
        return jobs.view() or state.job
    try:
        return batch.kubectl.get("job", job_name, batch.namespace, retry_until=retry_until)
    except DemoError:
        return state.job


def read_batch_pods(
    batch: BatchEvidence, job_name: str, watched_final: bool, retry: bool
) -> PodReading:
    """The Job's pods: as watched when each one's last change arrived, else listed."""
    state = batch.follower.state
    if watched_final:
        # Each pod's last change arrived: a list would show the very same pods.
        return PodReading(
            sorted(state.pods.values(), key=pod_name),
            "final watch",
            state.end_resource_version,
            0,
            0,
            [],
        )
    # Else never the watch's view: it may run behind. The list is at least as new as the
    # moment the Job's end was seen, and its pages are retried while a cache catches up.
    return read_job_pods(
        batch.kubectl,
        batch.proxy,
        batch.namespace,
        job_name,
        state.end_resource_version,
        PAGE_RETRY_SECONDS if retry else None,
        batch.settings.chunk_size,
        batch.follower.jobs.pod_selector(),
    )


def read_batch_events(
    batch: BatchEvidence, events_watched: bool, retry: bool
) -> PagedList | EventStore:
    """The namespace's events: as watched when the watch caught up with them all, else listed."""
    if events_watched:
        return batch.follower.state.events
    return read_events(
        batch.kubectl,
        batch.proxy,
        batch.namespace,
        batch.settings.chunk_size,
        COLLECT_RETRY_SECONDS if retry else None,
    )


def save_evidence(
    batch: BatchEvidence,
    job_future: concurrent.futures.Future,
    pods: tuple[PodReading, dict[str, str]] | concurrent.futures.Future,
    events_future: concurrent.futures.Future,
    retry_until: float | None,
    problems: list[str],
) -> Evidence:
    """Write what the fetches brought; fall back to the watch's view where a fetch failed.
    `pods`: the pods' reading and logs, saved already, or the fetch of the pods. What could
    not be saved is added to `problems`, and each kind of problem printed once."""
    follower = batch.follower
    job = job_future.result()
    if job is not None:
        # A batch of several Jobs saves each as read: job.json is then their List.
        write_json(
            os.path.join(batch.batch_dir, "job.json"),
            follower.jobs.saved() if follower.jobs.several else job,
        )
    # Unless saved already, the pods and logs are written while the events are read.
    reading, logs = (
        save_pods_and_logs(batch, pods, retry_until, problems)
        if isinstance(pods, concurrent.futures.Future)
        else pods
    )
    events = save_events(batch, events_future, job, reading.pods, problems)
    write_json(os.path.join(batch.batch_dir, "observed.json"), follower.observations())
    for line in summarised_problems(problems):
        print(f"Warning: could not save {line}", file=sys.stderr)
    return Evidence(job, reading, logs, events)


def save_pods_and_logs(
    batch: BatchEvidence,
    pods_future: concurrent.futures.Future,
    retry_until: float | None,
    problems: list[str],
) -> tuple[PodReading, dict[str, str]]:
    """pods.json, then one log per pod (their texts; unreadable -> empty, why in `problems`)."""
    reading = save_pods(batch, pods_future, retry_until)
    logs = batch.follower.log_reader.collect(reading.pods, batch.batch_dir, retry_until, problems)
    return reading, logs


def save_pods(
    batch: BatchEvidence, pods_future: concurrent.futures.Future, retry_until: float | None
) -> PodReading:
    """pods.json: the pods as listed (with any the list no longer shows), else as the pod watch
    saw them, each it saw unfinished read again."""
    follower = batch.follower
    try:
        reading = pods_future.result()
    except DemoError as error:
        reading = None
        print(
            f"Warning: could not list the pods ({error}); pods.json holds what the pod watch "
            f"saw, each pod it saw unfinished read again",
            file=sys.stderr,
        )
    if reading is None or reading.source != "final watch":
        drain_pod_watch(follower)
    watched = list(follower.state.pods.values())
    if reading is None:
        fresh = reread_pods(
            batch.kubectl,
            batch.proxy,
            batch.namespace,
            unfinished_pods(watched),
            None if retry_until is None else COLLECT_RETRY_SECONDS,
        )
        reading = PodReading(with_fresh_pods(watched, fresh), "watch", None, 0, 0, sorted(fresh))
    elif reading.source == "list":
        reading = reading._replace(pods=with_vanished(reading.pods, watched))
    pods = reading.pods
    indented = len(pods) < ONE_LINE_ITEMS_FROM
    texts = EncodedItems(
        lambda: (follower.state.pod_text(pod, indented) for pod in pods), len(pods), indented
    )
    write_json(
        os.path.join(batch.batch_dir, "pods.json"),
        dict(
            list_manifest([]),
            metadata={"resourceVersion": reading.resource_version or ""},
            items=texts,
        ),
    )
    return reading


def save_events(
    batch: BatchEvidence,
    events_future: concurrent.futures.Future,
    job: dict | None,
    pods: Sequence[dict],
    problems: list[str],
) -> list[EventRecord]:
    """events.txt and events.json, of this batch alone; the events, empty when unreadable.
    events.txt is kubectl's table with absolute times, not its ages, which mean nothing later."""
    events_path = os.path.join(batch.batch_dir, "events.json")
    events_listing: PagedList | EventStore | None = None
    try:
        events_listing = events_future.result()
        events = (
            events_listing.events()
            if isinstance(events_listing, EventStore)
            else event_records(events_listing.items)
        )
        write_events(events_path, events_listing, events, events_listing.resource_version or "")
    except DemoError as error:
        problems.append(f"events: {error}")
        events = []
    write_text(
        os.path.join(batch.batch_dir, "events.txt"),
        events_table_lines(events) if events else "",
    )
    batches = [entry.job for entry in batch.settings.batches]
    if len(batches) > 1 and events and events_listing is not None:
        # The namespace's events cover every batch so far; each batch keeps its own.
        events = batch_events(events, job, pods, first=batch.follower.job_name == batches[0])
        write_events(events_path, events_listing, events, None)
        write_text(os.path.join(batch.batch_dir, "events.txt"), events_table_lines(events))
    return events


def summarised_problems(problems: Sequence[str], shown: int = 3) -> list[str]:
    """A few problems in full and a count of the rest: 500 unreadable logs are one cause, not 500 lines."""
    if len(problems) <= shown + 1:
        return list(problems)
    return list(problems[:shown]) + [f"... and {len(problems) - shown} more (see the saved files)"]


def write_events(
    path: str,
    source: PagedList | EventStore,
    events: Sequence[EventRecord],
    resource_version: str | None,
) -> None:
    """events.json: the namespace's events as an EventList of the revision they were read at,
    or (`resource_version` None) a batch's share of them as a `v1 List`: `events`, each whole as
    read (the watch's waiting on disk), in the order read."""
    if isinstance(source, EventStore):
        names = [event.name or "" for event in events]
        items: Any = EncodedItems(lambda: source.whole(names), len(names))
    elif resource_version is None:
        kept = {event.name for event in events}
        items = [item for item in source.items if (item.get("metadata") or {}).get("name") in kept]
    else:
        items = list(source.items)
    if resource_version is None:
        write_json(path, dict(list_manifest([]), items=items))
    else:
        write_json(
            path,
            {
                "apiVersion": "v1",
                "kind": "EventList",
                "metadata": {"resourceVersion": resource_version},
                "items": items,
            },
        )


@dataclasses.dataclass
class RunContext:
    """What the steps of one `run` share: its settings and plan, its receipt, its open handles."""

    settings: Settings
    plan: RunPlan
    receipt: Receipt
    kubectl: Kubectl
    output: str
    progress: Progress
    pool: concurrent.futures.ThreadPoolExecutor
    cpu_start: float
    proxy: ApiProxy | None = None
    batch: BatchEvidence | None = None  # the batch under way: what an interruption saves
    touched_cluster: bool = False
    silent: bool = (
        False  # a quiet Python caller: its stdout and stderr carry only warnings and errors
    )
    spelling: Spelling = (
        COMMAND_LINE  # how its errors name the settings: flags, or run_batch()'s keywords
    )
    on_reward: Callable[[dict], None] | None = (
        None  # run_batch's caller, told each rewards.jsonl line
    )
    prepull: dict | None = None  # --prepull's figures, once it ran
    stop: StopRequest | None = None  # requested by stream_batch once its reader has gone
    # The command line, not a Python caller (run_batch, stream_batch): the process is the run's.
    owns_process: bool = False
    capacity: dict | None = None  # what check_capacity found the nodes can run: run.json keeps it
    # --queue: each batch's admission (by its directory), as Kueue's Workloads tell it
    admission: dict[str, dict] = dataclasses.field(default_factory=dict)
    tracer: Any = None  # telemetry.RunTracer with --otlp-endpoint: each batch's spans as it ends
    # --cleanup through the proxy: begun once the last batch's evidence is read (begin_cleanup),
    # its report's text the result; unstarted otherwise.
    cleanup_ahead: concurrent.futures.Future[str] | None = None
    lease: Any = None  # the FollowerLease this process holds on the run, released by close()
    detach: bool = False  # --detach: execute() returns once the first batch's Jobs exist

    @property
    def namespace(self) -> str:
        return self.receipt.namespace


# --------------------------------------------------------------------------
# src/rl_batch_demo/syntax.py: Checking an episode script's syntax before it is shipped, for the Python of its image.

# The newest Python whose syntax a script may hold (3.14: t-strings, `except A, B:`). The image's
# Python is not known before its pods run: a local Python at least this new refuses every error
# it finds; an older one refuses only what its tokenizer finds (broken_in_every_python).
NEWEST_SYNTAX_PYTHON = (3, 14)


def check_episode_syntax(script: str, source: str, named: str) -> None:
    """Refuse a script that does not compile before it costs a namespace and a Job; `named` is the
    setting that gave it, as its caller wrote it (`--episode-script FILE`, `episode_script='FILE'`).

    The image's Python may be newer than this one. On an older one, a script this Python cannot
    compile is refused only when it is broken in every version (broken_in_every_python); any
    other error may be newer syntax, so it is warned about and the script is shipped.
    """
    try:
        with warnings.catch_warnings():  # an invalid escape's SyntaxWarning: the image's to say
            warnings.simplefilter("ignore")
            compile(source, script, "exec", dont_inherit=True)
        return
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte, before 3.11
        found = error
    line = getattr(found, "lineno", None)
    where = named + (f", line {line}" if line else "")
    older = sys.version_info < NEWEST_SYNTAX_PYTHON
    if older and isinstance(found, SyntaxError) and not broken_in_every_python(source):
        print(
            f"Warning: {where} does not compile on Python {sys.version_info[0]}."
            f"{sys.version_info[1]} ({syntax_error_detail(found, source)}); the image's Python "
            f"may be newer, so it is shipped anyway",
            file=sys.stderr,
        )
        return
    raise DemoError(f"{where}: {syntax_error_detail(found, source)}; nothing was created")


def broken_in_every_python(source: str) -> bool:
    """Whether this Python's tokenizer refuses the source (an unclosed bracket or triple-quoted
    string, a dedent to no outer level, and from 3.12 an unclosed string or a NUL byte too), or
    a bracket is closed by another kind (`(1]`): wrong in every version.

    Before 3.12 the tokenizer reads an f-string that nests its own quote as strings that end
    early: one that nests an odd quote or a triple quote (`f"{'"'}"`) reads as unclosed, and is
    refused though 3.12 runs it.
    """
    try:
        with warnings.catch_warnings():  # 3.12's tokenizer warns of an invalid escape too
            warnings.simplefilter("ignore")
            opened: list[str] = []
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.OP and token.string in "([{":
                    opened.append(token.string)
                elif token.type == tokenize.OP and token.string in ")]}":
                    if not opened or BRACKETS[opened.pop()] != token.string:
                        return True
    except (tokenize.TokenError, SyntaxError, SystemError):  # SystemError: a NUL, on some 3.12+
        return True
    return False


BRACKETS = {"(": ")", "[": "]", "{": "}"}


def syntax_error_detail(error: SyntaxError | ValueError, source: str) -> str:
    """The error's message and the line it is on, as the script has it."""
    line = getattr(error, "lineno", None)
    lines = source.splitlines()
    text = lines[line - 1].strip() if line and 0 < line <= len(lines) else ""
    return f"{getattr(error, 'msg', None) or error}" + (f": {text}" if text else "")


# --------------------------------------------------------------------------
# src/rl_batch_demo/preflight.py: What `run` checks and records before it changes anything in the cluster.

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


# --------------------------------------------------------------------------
# src/rl_batch_demo/kueue.py: A run in a namespace it shares (`--namespace`), and its Jobs queued through Kueue (`--queue`),

# How often a queued batch's Jobs are read while Kueue has not admitted them: the admission's
# own moment comes from the Workload's conditions, not from this poll.
QUEUE_POLL_SECONDS = 1.0
# How long the Job controller may take to record a Job's resume once Kueue has unsuspended it.
RESUME_WAIT_SECONDS = 10.0
WORKLOADS_FILE = "workloads.json"


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
    record_labelled_jobs(kubectl, receipt)
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


def record_labelled_jobs(kubectl: Kubectl, receipt: Receipt) -> None:
    """The Jobs with the run's label that its receipt lacks (a SIGKILL came between a Job's
    creation and its record), recorded with the UIDs they have: the label is the run's own id, so
    they are the run's."""
    try:
        listed = kubectl.get_list(
            "jobs",
            receipt.namespace,
            "-l",
            f"{RUN_LABEL}={receipt.run_id}",
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except DemoError:
        return  # the receipt's own record is what is deleted
    for job in (listed or {}).get("items") or []:
        metadata = job["metadata"]
        mine = (metadata.get("labels") or {}).get(RUN_LABEL) == receipt.run_id  # checked here too
        if mine and not receipt.has_job(metadata["name"]):
            receipt.record_job(metadata["name"], metadata["uid"])


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


def local_queue_hint(namespace: str, queue: str) -> str:
    """How to make the LocalQueue that was not found, for the message that says so."""
    return (
        f"make one (its admin names the ClusterQueue): kubectl apply -f - <<<'"
        f'{{"apiVersion": "{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue", '
        f'"metadata": {{"name": "{queue}", "namespace": "{namespace}"}}, '
        f'"spec": {{"clusterQueue": "CLUSTER_QUEUE"}}}}'
        "'"
    )


def read_kueue(run: RunContext, kind: str, name: str, namespace: str | None) -> dict | None:
    """One Kueue object; None when the account may not read it (the caller says which figure it
    lacks). DemoError when it does not exist or the cluster does not serve Kueue's API."""
    try:
        return run.kubectl.get(
            f"{kind}.{KUEUE_VERSION}.{KUEUE_GROUP}",
            name,
            namespace,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        if "(Forbidden)" in error.stderr:
            return None
        if "the server doesn't have a resource type" in error.stderr:
            raise DemoError(
                f"context {run.kubectl.context!r} does not serve Kueue's {kind} "
                f"({KUEUE_GROUP}/{KUEUE_VERSION}): is Kueue installed? nothing was created"
            ) from None
        if error.not_found:
            where = f" in namespace {namespace}" if namespace else ""
            hint = local_queue_hint(namespace or "", name) if kind == "localqueues" else ""
            raise DemoError(
                f"{kind[:-1]} {name!r} not found{where} (context {run.kubectl.context!r}); "
                f"nothing was created" + (f"; {hint}" if hint else "")
            ) from None
        raise DemoError(f"cannot read {kind[:-1]} {name}: {error}; nothing was created") from None


def read_overhead(run: RunContext, plan: dict) -> dict[str, float]:
    """The RuntimeClass's overhead per pod, which Kueue counts against the quota; when it cannot be
    read, the plan says so (the figures then count the requests alone)."""
    try:
        runtime_class = run.kubectl.get(
            "runtimeclass",
            run.settings.runtime,
            missing_ok=True,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        plan["overhead_unknown"] = (
            f"RuntimeClass {run.settings.runtime} cannot be read ({error}): the quota check counts "
            f"the pods' requests without its overhead, which Kueue adds"
        )
        print(f"Warning: {plan['overhead_unknown']}", file=sys.stderr, flush=True)
        return {}
    overhead = runtime_overhead(runtime_class)
    plan["overhead_per_pod"] = overhead
    return overhead


def check_queue(run: RunContext, width: str = "parallelism") -> None:
    """--queue, in place of the nodes' capacity check: the LocalQueue exists, and every Job of the
    batch fits its ClusterQueue's quota; a Job that never can is refused, with the figures, before
    anything is made (`width`: the setting that says how many pods run at once, a pool's `size`).
    run.json keeps what was found (`capacity`, with `queue`)."""
    queue, namespace = run.settings.queue or "", run.namespace
    plan: dict = {"checked": False, "queue": queue}
    local = read_kueue(run, "localqueues", queue, namespace)
    cluster_queue = ((local or {}).get("spec") or {}).get("clusterQueue")
    plan["cluster_queue"] = cluster_queue
    found = read_kueue(run, "clusterqueues", cluster_queue, None) if cluster_queue else None
    if found is None:
        plan["reason"] = (
            f"reading LocalQueue {queue} is not permitted"
            if local is None
            else f"reading ClusterQueue {cluster_queue} is not permitted"
        )
        print(f"Warning: queue quota check skipped ({plan['reason']})", file=sys.stderr, flush=True)
    else:
        jobs = [job for batch in run.plan.jobs.values() for job in batch]
        overhead = read_overhead(run, plan)
        fit = quota_fit(cluster_queue_quota(found), jobs, overhead)
        plan.update(
            checked=True,
            quota={name: amount for name, amount in fit.quota.items() if amount != float("inf")},
            fits_at_once=fit.fits_at_once,
        )
        if fit.never:
            raise DemoError(
                f"the batch can never be admitted by queue {queue} (ClusterQueue {cluster_queue}): "
                f"{fit.never}; lower {run.spelling.name(width)} or ask for more quota; "
                f"nothing was created"
            )
    run.capacity = plan
    save_run_json(run)


def job_workload(kubectl: Kubectl, namespace: str, job_uid: str) -> dict | None:
    """The Workload Kueue made for a Job, found by its label `kueue.x-k8s.io/job-uid`; None when
    there is none yet. KubectlError when it cannot be read."""
    listing = kubectl.get_list(
        f"workloads.{KUEUE_VERSION}.{KUEUE_GROUP}",
        namespace,
        "-l",
        f"{WORKLOAD_JOB_UID_LABEL}={job_uid}",
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    items = (listing or {}).get("items") or []
    return items[0] if items else None


def set_workload_active(kubectl: Kubectl, namespace: str, job_uid: str, active: bool) -> str | None:
    """Stop (False) or let go (True) a queued Job the way Kueue wants it, through its Workload's
    `spec.active`: Kueue resumes a suspended Job whose Workload is admitted, so under a queue the
    Job's own `suspend` does not hold. Why it could not be done, or None."""
    try:
        workload = job_workload(kubectl, namespace, job_uid)
        if workload is None:
            return "Kueue has made no Workload for it yet"
        kubectl.run(
            ["patch", f"workloads.{KUEUE_VERSION}.{KUEUE_GROUP}", workload["metadata"]["name"]]
            + ["-n", namespace, "--type=merge", "-p", json.dumps({"spec": {"active": active}})],
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except DemoError as error:
        return f"{error}; grant patch on workloads.{KUEUE_GROUP}"
    return None


def stop_queued(kubectl: Kubectl, namespace: str, name: str, job_uid: str | None) -> None:
    """A queued Job just suspended, kept so: its Workload deactivated (else Kueue resumes it and
    its pods start again); a warning when that cannot be done."""
    said = (
        "its UID is not known"
        if not job_uid
        else set_workload_active(kubectl, namespace, job_uid, False)
    )
    if said:
        print(
            f"Warning: cannot deactivate the Kueue Workload of Job {name} ({said}): Kueue may "
            f"resume the Job and start its pods again; `cleanup` deletes it",
            file=sys.stderr,
            flush=True,
        )


def queue_word(kubectl: Kubectl, namespace: str, job: dict) -> str:
    """What Kueue says of a suspended Job now, from its Workload (wait_line)."""
    try:
        workload = job_workload(kubectl, namespace, job["metadata"]["uid"])
    except KubectlError as error:
        if "(Forbidden)" in error.stderr:
            return (
                "queued (its Workload may not be read: grant get/list on workloads.kueue.x-k8s.io)"
            )
        return f"queued (its Workload cannot be read: {error})"
    return wait_line(workload)


class Admitted(NamedTuple):
    """A queued batch once admitted: its first Job as created, and the client's wall clock just
    before and just after its create calls (the Job's creation lies between them)."""

    job: dict
    submitted: float
    created: float


def admit_batch(
    run: RunContext, create: Callable[[], dict], names: Sequence[str], batch: str
) -> Admitted:
    """--queue: the batch's Jobs made (suspended by Kueue until admitted), then waited for until
    Kueue has admitted every one (resumed it), saying on stderr what Kueue says while they wait:
    the Workload's Pending message, Inadmissible, an eviction or a requeue, never an episode's
    failure. The run's own deadline, as the Job's activeDeadlineSeconds does (the Job controller
    restarts a Job's startTime when it resumes), counts from the admission. The batch's
    admission (points, phases) goes in run.admission, its Workloads in workloads.json."""
    submitted = time.time()
    first = create()
    created = time.time()
    wait_admitted(run, names)
    record_admission(run, names, batch)
    return Admitted(first, submitted, created)


def wait_admitted(run: RunContext, names: Sequence[str]) -> None:
    """Until Kueue has admitted (resumed) every one of the Jobs, saying what it says meanwhile."""
    said = ""
    while True:
        if run.stop is not None:
            run.stop.check()
        jobs = read_jobs(run, names)
        waiting = [job for job in jobs if (job.get("spec") or {}).get("suspend")]
        if not waiting:
            break
        line = f"Job {waiting[0]['metadata']['name']}: {queue_word(run.kubectl, run.namespace, waiting[0])}"
        if line != said and not run.silent:
            print(line, file=sys.stderr, flush=True)
        said = line
        time.sleep(QUEUE_POLL_SECONDS)


def read_jobs(run: RunContext, names: Sequence[str]) -> list[dict]:
    """The batch's Jobs as they are now; DemoError when one is gone (deleted under the run)."""
    jobs = []
    for name in names:
        job = run.kubectl.get(
            "job",
            name,
            run.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
        if job is None:
            raise DemoError(f"Job {name} in {run.namespace} was deleted while it was queued")
        jobs.append(job)
    return jobs


def record_admission(run: RunContext, names: Sequence[str], batch: str) -> None:
    """Once the batch is admitted: its Workloads saved (workloads.json), and its points and phases
    in run.admission; the Jobs read again until the Job controller has recorded each resume
    (a few seconds at most), so that `resumed` is known."""
    deadline = time.monotonic() + RESUME_WAIT_SECONDS
    while True:
        jobs = read_jobs(run, names)
        resumed = all(true_since(job, "Suspended", "False") for job in jobs)
        if resumed or time.monotonic() >= deadline:
            break
        time.sleep(QUEUE_POLL_SECONDS / 4)
    workloads, unread = [], None
    for job in jobs:
        try:
            found = job_workload(run.kubectl, run.namespace, job["metadata"]["uid"])
        except KubectlError as error:
            unread = str(error)
            break
        if found is not None:
            workloads.append(found)
    batch_dir = os.path.normpath(os.path.join(run.output, batch))
    write_json(os.path.join(batch_dir, WORKLOADS_FILE), list_manifest(workloads))
    figures = admission_figures(jobs, workloads)
    if unread is not None:
        figures["unavailable"] = (
            f"the Workloads could not be read ({unread}): quota_reserved, admitted, queue_wait "
            f"and admission_checks are not known; grant get/list on workloads.kueue.x-k8s.io"
        )
        print(f"Warning: {figures['unavailable']}", file=sys.stderr, flush=True)
    run.admission[batch] = figures


# --------------------------------------------------------------------------
# src/rl_batch_demo/secretcopy.py: --env-from-secret at run time: each Secret found before anything is created, and copied into the

# The Secrets read for a run, by name: what their copies are made from.
ReadSecrets = dict[str, dict]


def read_secrets(run: RunContext) -> ReadSecrets:
    """Each --env-from-secret Secret, read before anything is created; DemoError names one that is
    missing or may not be read, and says that nothing was created."""
    found: ReadSecrets = {}
    for source in run.settings.pod.secrets:
        found[source.name] = read_secret(run, source)
    return found


def read_secret(run: RunContext, source: SecretSource) -> dict:
    given = run.spelling.setting(
        "env_from_secret",
        f"{source.namespace}/{source.name}" if source.namespace else source.name,
    )
    where = f"namespace {source.namespace}" if source.namespace else "the context's namespace"
    try:
        # Without -n, kubectl looks in the context's namespace, as the user's own kubectl would.
        secret = run.kubectl.get(
            "secret",
            source.name,
            source.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + FIRST_CONTACT_RETRY_SECONDS,
        )
    except KubectlError as error:
        if "forbidden" in error.stderr.lower():
            raise DemoError(
                f"{given}: may not get Secret {source.name} in {where} (the copy into the run's "
                f"namespace needs get on it, and create secrets); nothing was created"
            ) from None
        raise DemoError(
            f"{given}: cannot read Secret {source.name}: {error}; nothing was created"
        ) from None
    if secret is None:
        raise DemoError(
            f"{given}: no Secret {source.name} in {where}; nothing was created (make it with "
            f"kubectl create secret generic {source.name} --from-literal=KEY=VALUE)"
        )
    return secret


def filled(manifest: dict, secrets: ReadSecrets) -> dict:
    """A planned object as it is created: a Secret's copy (planned without its data) with the data
    of the Secret read; any other object as planned."""
    metadata = manifest.get("metadata") or {}
    if manifest.get("kind") != "Secret" or COPIED_FROM_ANNOTATION not in (
        metadata.get("annotations") or {}
    ):
        return manifest
    original = metadata["annotations"][COPIED_FROM_ANNOTATION].rpartition("/")[2]
    found = secrets[original]
    where = f"{found['metadata'].get('namespace')}/{original}"
    # As planned (its name after the run's in a namespace it shares, its labels), with the data.
    return {
        **manifest,
        "metadata": {
            **metadata,
            "annotations": {**metadata["annotations"], COPIED_FROM_ANNOTATION: where},
        },
        "data": dict(found.get("data") or {}),
    }


# --------------------------------------------------------------------------
# src/rl_batch_demo/results.py: results.json: a batch's figures, verified or rolled out, and the run's.

def describe_failure(
    job: dict | None,
    pods: Sequence[dict],
    job_name: str,
    limit_seconds: int,
    logs: dict[str, str] | None = None,
) -> list[str]:
    """Why a Job did not complete: its condition and each pod that did not succeed (a failed
    container's line quotes the end of the Python traceback in its log)."""
    lines = []
    failed = condition(job or {}, "Failed")
    if failed and failed.get("status") == "True":
        lines.append(
            f"Job {job_name}: Failed ({failed.get('reason', '?')}: {failed.get('message', '')})"
        )
    else:
        lines.append(f"Job {job_name}: not Complete within {limit_seconds} s")
    for pod in sorted(pods, key=pod_name):
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded":
            continue
        state = container_status(pod).get("state") or {}
        if "terminated" in state:
            detail = with_traceback(
                f"container exited {state['terminated'].get('exitCode')} "
                f"({state['terminated'].get('reason', '')})",
                (logs or {}).get(pod_name(pod), ""),
            )
        elif "waiting" in state:
            detail = f"{state['waiting'].get('reason', 'waiting')}: {state['waiting'].get('message', '')}".rstrip(
                ": "
            )
        elif "running" in state:
            detail = "still running"
        else:
            unscheduled = condition(pod, "PodScheduled")
            detail = (unscheduled or {}).get("message") or "no container status"
        lines.append(f"pod {pod_name(pod)}: {phase}, {detail}")
    return lines


def saved_evidence(
    job: dict | None, pods: Sequence[dict], logs: dict[str, str], events: Sequence[EventRecord]
) -> str:
    """Which evidence a failed batch left, so no one looks for logs that never existed."""
    written = sum(1 for text in logs.values() if text.strip())
    parts = [
        f"saved: job.json{'' if job else ' (unreadable)'}",
        f"pods.json ({plural(len(pods), 'pod')})",
        f"events.txt ({plural(len(events), 'event')})",
        f"{written} of {len(pods)} pod logs with content",
    ]
    if not pods:
        parts.append(
            "no pod is left to have a log (the Job controller deletes a Job's pods when it ends it "
            "for its deadline)"
        )
    return ", ".join(parts)


def verified_summary(batch: BatchEvidence, end: str | None, evidence: Evidence) -> BatchSummary:
    """The summary of a batch whose every episode must succeed; a batch that did not fails here."""
    job, reading, logs, events = evidence
    settings, pods, job_name = batch.settings, reading.pods, batch.follower.job_name
    if end != "Complete":
        raise DemoError(
            "\n  ".join(
                ["Job failed or timed out; inspect saved status/events/logs, then cleanup"]
                + describe_failure(
                    job, pods, job_name, settings.timeout + CLIENT_GRACE_SECONDS, logs
                )
                + [saved_evidence(job, pods, logs, events)]
            )
        )
    if reading.source == "watch" and len(pods) < settings.count:
        # A watch that saw fewer pods than episodes proves nothing about the others.
        raise DemoError(
            f"cannot verify the batch: the pods could not be listed and the pod watch saw "
            f"only {len(pods)} of {settings.count}"
        )
    assert job is not None  # its Complete condition was seen on it
    try:
        return summarise_batch(
            job,
            pods,
            logs,
            events,
            settings.count,
            settings.builtin,
            batch.follower.end_seen_wall,
            batch.follower.observations(),
            drafts=batch.follower.drafts.drafts if batch.follower.drafts else None,
            index=batch.event_index(),
        )
    except VerificationError as error:
        if reading.source == "watch":
            raise VerificationError(
                f"{error} (judged from the pods the watch saw, each unfinished one "
                f"read again: the pods could not be listed)"
            ) from None
        raise


def rollout_summary(batch: BatchEvidence, end: str | None, evidence: Evidence) -> BatchSummary:
    """Write rewards.jsonl with every episode; accept the batch if its failures are within
    --allow-failures, and summarise its successful episodes."""
    rows = rollout_rows(batch, evidence)
    failures = [row for row in rows if is_failure(row)]
    job = finished_rollout_job(batch, end, evidence)
    summary = summarised_rollout(batch, rows, job, evidence)
    rewards = batch.follower.rewards
    if rewards is not None:
        summary.figures.update(
            batch_delivery_figures(
                rewards.deliveries, batch.follower.state.job_observed, batch.settings.need
            )
        )
        summary.deliveries = [d.written_at for d in rewards.deliveries if d.success]
    if not batch.silent:  # a quiet Python caller reads all of it in the results
        say_rollout_outcome(batch, summary, failures)
    return summary


def rollout_rows(batch: BatchEvidence, evidence: Evidence) -> list[dict]:
    """Every episode's row, and rewards.jsonl with them all (the reward stream finishes its own)."""
    job, reading, logs, events = evidence
    settings, follower = batch.settings, batch.follower
    rows = episode_rows(
        settings.count,
        job or {"metadata": {}},
        reading.pods,
        logs,
        settings.builtin,
        settings.task_ids,
        settings.group_size,
        events,
        group_images(settings),
    )
    if follower.rewards is not None:
        return follower.rewards.finish(rows, reading.pods, logs, follower.state.observed)
    write_text(os.path.join(batch.batch_dir, REWARDS_FILE), rewards_jsonl(rows))
    return rows


def finished_rollout_job(batch: BatchEvidence, end: str | None, evidence: Evidence) -> dict:
    """The rollout batch's Job, once it finished and every pod was seen; else DemoError saying
    what was saved."""
    job, reading, logs, events = evidence
    settings, pods = batch.settings, reading.pods
    if end is None or job is None:
        raise DemoError(
            "\n  ".join(
                ["Job did not finish; inspect saved status/events/logs, then cleanup"]
                + describe_failure(
                    job,
                    pods,
                    batch.follower.job_name,
                    settings.timeout + CLIENT_GRACE_SECONDS,
                    logs,
                )
                + [
                    f"{REWARDS_FILE} lists every episode as last seen",
                    saved_evidence(job, pods, logs, events),
                ]
            )
        )
    if reading.source == "watch" and len(pods) < settings.count:
        raise DemoError(
            f"cannot verify the batch: the pods could not be listed and the pod watch saw "
            f"only {len(pods)} of {settings.count}"
        )
    return job


def summarised_rollout(
    batch: BatchEvidence, rows: Sequence[dict], job: dict, evidence: Evidence
) -> BatchSummary:
    """summarise_rollout over the batch's evidence; a batch it refuses says where the rest is."""
    _, reading, logs, events = evidence
    follower = batch.follower
    try:
        return summarise_rollout(
            rows,
            job,
            reading.pods,
            logs,
            events,
            batch.settings,
            follower.end_seen_wall,
            follower.observations(),
            batch.spelling,
            follower.drafts.drafts if follower.drafts else None,
            batch.event_index(),
        )
    except DemoError as error:
        raise DemoError(
            f"{error}\n  {REWARDS_FILE} lists every episode with its class; "
            f"{saved_evidence(job, reading.pods, logs, events)}"
        ) from None


def say_rollout_outcome(
    batch: BatchEvidence, summary: BatchSummary, failures: Sequence[dict]
) -> None:
    """On stderr: how --need was met, and which failures the batch accepted."""
    settings, count = batch.settings, batch.settings.count
    cancelled = summary.figures.get("cancelled_episodes") or 0
    need = batch.spelling.setting("need", settings.need)
    losses = [row for row in failures if is_loss(row)]
    own = [row for row in failures if not is_loss(row)]
    if settings.need_groups is not None:
        need = batch.spelling.setting("need_groups", settings.need_groups)
        print(
            f"{need} met: {cancelled} of {count} episodes cancelled, {len(losses)} lost",
            file=sys.stderr,
        )
    elif settings.need is not None:
        print(
            f"{need} met: {count - cancelled - len(failures)} of {count} episodes succeeded, "
            + (f"{len(own)} failed on their own (valid), " if own else "")
            + f"{cancelled} cancelled, {len(losses)} failed"
            + (f" ({failures_said(losses)})" if losses else ""),
            file=sys.stderr,
        )
    if losses:
        accepted = (
            f"Failures within {need}"
            if settings.need is not None or settings.need_groups is not None
            else "Accepted a partial batch"
        )
        print(
            "\n  ".join(
                [
                    f"{accepted}: {len(losses)} of {count} episodes failed "
                    f"({failures_said(losses)}); every episode is in {REWARDS_FILE}"
                ]
                + failure_lines(losses)
            ),
            file=sys.stderr,
        )
    if own:
        print(
            "\n  ".join(
                [
                    f"{len(own)} of {count} episodes failed on their own ({failures_said(own)}): "
                    f"valid samples, each in {REWARDS_FILE}"
                ]
                + failure_lines(own)
            ),
            file=sys.stderr,
        )


def batch_delivery_figures(
    deliveries: Sequence[Delivery], job_observed: dict[str, float], need: int | None
) -> dict:
    """delivery_figures from the moments the client's create call started and returned."""
    submitted, returned = job_observed.get("submitted"), job_observed.get("create_returned")
    slack = returned - submitted if submitted is not None and returned is not None else None
    return delivery_figures(deliveries, submitted, slack, need)


@cycle_collector_paused()
def save_results(run: RunContext, batches: Sequence[BatchOutcome]) -> Results:
    """results.json, episodes.csv and the pictures, from every batch's summary."""
    results = assemble_results(run.settings, batches, client_figures(run).saved(), run.capacity)
    if run.prepull is not None:
        results.figures["prepull"] = run.prepull
    if run.admission:  # --queue: one batch's admission, or each batch's by its directory
        admission = run.admission
        results.figures["admission"] = admission.get(".") or {"batches": admission}
    write_json(os.path.join(run.output, RESULTS_FILE), results.figures)
    write_text(os.path.join(run.output, "episodes.csv"), episodes_csv_pieces(results.batches))
    write_pictures(
        run.output,
        results.batches,
        run.settings,
        results.figures["throughput"],
        results.figures.get("admission"),
    )
    write_metrics(run.output, results.figures, results.batches, run.receipt.run_id)
    return results


class ClientCost(NamedTuple):
    """What the run cost on this machine (results.json's `client`)."""

    kubectl_processes: int
    api_retries: int
    cpu_seconds: float | None
    peak_rss_mib: float | None  # None where the platform cannot say: then left out

    def saved(self) -> dict[str, Any]:
        saved = self._asdict()
        if self.peak_rss_mib is None:
            del saved["peak_rss_mib"]
        return saved


def client_figures(run: RunContext) -> ClientCost:
    """What the run cost on this machine: kubectl processes, retries, CPU, peak memory."""
    return ClientCost(
        run.kubectl.processes,
        run.kubectl.retries,
        rounded(cpu_seconds() - run.cpu_start),
        peak_rss_mib(),
    )


def peak_rss_mib() -> float | None:
    """This process's own peak resident memory in MiB: Linux's VmHWM where there is one, since
    ru_maxrss carries over an exec the RSS of whatever spawned the tool (a large trainer's)."""
    try:
        with open("/proc/self/status", encoding="utf-8", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return rounded(int(line.split()[1]) / 1024, 1)  # in kB
    except (OSError, ValueError, IndexError):
        pass  # not Linux: ru_maxrss below
    if resource is None:
        return None
    # ru_maxrss is in KiB on Linux (bytes on macOS).
    scale = 1 if sys.platform == "darwin" else 1024
    return rounded(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20, 1)


def failures_said(failures: Sequence[dict]) -> str:
    """`1 infrastructure failure, 2 episode failures`: the failed episodes counted by class."""
    counts = failure_counts(row["failure_class"] for row in failures)
    return ", ".join(plural(number, f"{kind} failure") for kind, number in counts.items() if number)


def failure_lines(failures: Sequence[dict], most: int = 10) -> list[str]:
    """One line per failed episode (the first few): which, whose fault, why."""
    return [
        f"episode {row['index']} (task {row['task_id']!r}, pod {row['pod']}, "
        f"{plural(row['attempts'], 'attempt')}): {row['failure_class']}: {row['failure']}"
        for row in failures[:most]
    ] + ([f"... and {len(failures) - most} more"] if len(failures) > most else [])


def summarise_rollout(
    rows: Sequence[dict],
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    events: Sequence[EventRecord],
    settings: Settings,
    end_seen_at: float | None = None,
    observed: dict | None = None,
    spelling: Spelling = COMMAND_LINE,
    drafts: Mapping[str, EpisodeDraft] | None = None,
    index: EventIndex | None = None,
) -> BatchSummary:
    """A rollout batch's summary: the figures of its successful episodes, with failures, attempts and
    groups; DemoError when more episodes failed than --allow-failures accepts, or all did. Pure."""
    need = settings.need
    allowed = len(rows) - need if need is not None else settings.allow_failures or 0
    if settings.need_groups is not None:
        allowed = len(rows) - settings.need_groups * settings.group_size
    check_rollout_accepted(rows, need, allowed, spelling)
    check_groups_whole(rows, settings, spelling)
    successes = {row["pod"] for row in rows if row["failure_class"] is None}
    by_name = {pod_name(pod): pod for pod in pods}
    summary = summarise_batch(
        job,
        [pod for pod in pods if pod_name(pod) in successes],
        logs,
        events,
        len(successes),
        settings.builtin,
        end_seen_at,
        observed,
        # Cancelled episodes too: the timeline draws every episode.
        [(by_name.get(row["pod"]), row) for row in rows if row["failure_class"] is not None],
        drafts,
        index,
    )
    task_of = {row["pod"]: row["task_id"] for row in rows if row["failure_class"] is None}
    for record in summary.episodes:  # episodes.csv names each episode's task
        record["task_id"] = task_of.get(record["pod"])
    summary.figures.update(
        rollout_figures(rows, job, pods, settings.group_size, allowed, settings.retries or 0, need)
    )
    summary.figures["images"] = image_figures(summary.episodes, rows)
    if settings.need_groups is not None:  # the losses it absorbs make no partial batch
        summary.figures.update(need_groups=settings.need_groups, accepted_partial=False)
    return summary


def whole_groups(rows: Sequence[dict], group_size: int) -> list[int]:
    """The groups whose every member has a valid line."""
    return [
        start // group_size
        for start in range(0, len(rows), group_size)
        if all(row["valid"] for row in rows[start : start + group_size])
    ]


def check_groups_whole(rows: Sequence[dict], settings: Settings, spelling: Spelling) -> None:
    """--need-groups K: DemoError when fewer than K groups are whole."""
    wanted = settings.need_groups
    whole = whole_groups(rows, settings.group_size)
    if wanted is not None and len(whole) < wanted:
        losses = [row for row in rows if is_loss(row)]
        raise DemoError(
            "\n  ".join(
                [
                    f"{len(whole)} of {len(rows) // settings.group_size} groups have every "
                    f"member's valid line, fewer than {spelling.setting('need_groups', wanted)} "
                    f"({len(losses)} episodes lost: {failures_said(losses) or 'none'})"
                ]
                + failure_lines(losses)
            )
        )


def check_rollout_accepted(
    rows: Sequence[dict], need: int | None, allowed: int, spelling: Spelling
) -> None:
    """DemoError, naming the first failed episodes, when fewer than --need K episodes have a valid
    line (a success, or the episode's own failure: a sample all the same), more than `allowed` were
    lost (infrastructure, verifier), or none has a valid line. An episode's own failure never
    fails the batch: it is a sample, and --allow-failures counts only the losses."""
    failures = [row for row in rows if is_failure(row)]
    losses = [row for row in rows if is_loss(row)]
    valid = [row for row in rows if row["failure_class"] in VALID_CLASSES]
    if need is not None and len(valid) < need:
        raise DemoError(
            "\n  ".join(
                [
                    f"{len(valid)} of {len(rows)} episodes have a valid line, fewer than "
                    f"{spelling.setting('need', need)} ({len(losses)} lost: "
                    f"{failures_said(losses) or 'none'})"
                ]
                + failure_lines(failures)
            )
        )
    if len(losses) > allowed or not valid:
        allowance = (
            f"allow_failures={allowed} accepts no more"
            if spelling.python
            else f"--allow-failures accepts {allowed}"
        )
        accepts = allowance if len(losses) > allowed else "none has a valid line"
        own = len(failures) - len(losses)
        raise DemoError(
            "\n  ".join(
                [
                    f"{len(losses)} of {len(rows)} episodes failed "
                    f"({failures_said(losses)}"
                    + (f"; {own} more failed on their own, valid samples" if own else "")
                    + f"); {accepts}"
                ]
                + failure_lines(losses + [row for row in failures if not is_loss(row)])
            )
        )


ROLLOUT_FIELDS = (
    "failed_episodes",
    "lost_episodes",
    "failures_by_class",
    "failures",
    "accepted_partial",
    "allow_failures",
    "retries",
    "attempts",
    "group_size",
    "groups",
    "groups_complete",
    "group_all_rewards_seconds",
    "group_spread_seconds",
    "pod_to_ready_censored",
    "job_end",
    "need",
    "need_groups",
    "cancelled_episodes",
    "first_reward_seconds",
    "kth_reward_seconds",
    "reward_delivery_lag_p50_seconds",
    "reward_delivery_lag_p99_seconds",
    "reward_delivery_lag_max_seconds",
    "reward_delivery",
)


# What results.json keeps of each failed episode.
FAILURE_RECORD_KEYS = (
    "index",
    "task_id",
    "pod",
    "attempts",
    "failure_class",
    "failure",
    "evidence",
)


def rollout_figures(
    rows: Sequence[dict],
    job: dict,
    pods: Sequence[dict],
    group_size: int,
    allowed: int,
    retries: int,
    need: int | None = None,
) -> dict:
    """What a rollout batch adds to its summary: failures by class, attempts, groups; with --need,
    the episodes it cancelled (no failures: a run that got its K successes exits 0)."""
    failures = [row for row in rows if is_failure(row)]
    losses = [row for row in failures if is_loss(row)]
    figures: dict[str, Any] = {
        "episodes": len(rows),
        "failed_episodes": len(failures),
        "lost_episodes": len(losses),
        "failures_by_class": failure_counts(row["failure_class"] for row in failures),
        "failures": [{key: row[key] for key in FAILURE_RECORD_KEYS} for row in failures],
        # Partial: some lines are to be masked. The episodes' own failures are samples.
        "accepted_partial": bool(losses) and need is None,
        "allow_failures": allowed,
        "cancelled_episodes": sum(1 for row in rows if row["failure_class"] == CANCELLED),
        "retries": retries,
        "attempts": attempt_figures(rows),
        **group_summary_figures(rows, group_size),
        "job_end": {
            "condition": job_finished(job),
            "reason": NEED_GROUPS_REASON
            if cancelled_by_tool(job)
            else job_end_reason(job) or (SUCCESS_POLICY_REASON if job_cut_short(job) else None),
        },
    }
    if need is not None:
        figures["need"] = need
    if failures:
        figures.update(censored_pod_to_ready_figures(rows, job, pods))
    return figures


def group_summary_figures(rows: Sequence[dict], group_size: int) -> dict[str, Any]:
    """The groups of a rollout batch: each group, how many are complete, and their timing."""
    groups = group_figures(rows, group_size)
    complete = [g for g in groups if g["complete"]]
    return {
        "group_size": group_size,
        "groups": groups,
        "groups_complete": len(complete),
        "group_all_rewards_seconds": describe(
            [g["all_rewards_seconds"] for g in complete], missing=len(groups) - len(complete)
        ),
        "group_spread_seconds": describe(
            [g["spread_seconds"] for g in groups if g["spread_seconds"] is not None]
        ),
    }


def censored_pod_to_ready_figures(
    rows: Sequence[dict], job: dict, pods: Sequence[dict]
) -> dict[str, Any]:
    """pod_to_ready's percentiles over every episode, one that never became ready counted as ready
    at the Job's deadline, and how they were counted."""
    censored = censored_pod_to_ready(rows, job, pods)
    return {
        "pod_to_ready_p50_seconds": censored["p50"],
        "pod_to_ready_p95_seconds": censored["p95"],
        "pod_to_ready_max_seconds": censored["max"],
        "pod_to_ready_censored": censored,
    }


def write_pictures(
    output: str,
    measured: Sequence[tuple[str, BatchSummary]],
    settings: Settings,
    figures: dict | None = None,
    admission: dict | None = None,
) -> None:
    """timeline.svg (a sample of a large batch), ramp.svg and cdf.svg; `figures`: the throughput, if known."""
    title = timeline_title(settings)
    sampled, note = timeline_sample(measured)
    write_text(
        os.path.join(output, "timeline.svg"),
        timeline_svg(sampled, title + note, settings.task_ids, settings.group_size, admission),
    )
    write_text(
        os.path.join(output, "ramp.svg"), ramp_svg(measured, f"Ramp: {title}", figures, admission)
    )
    write_text(os.path.join(output, "cdf.svg"), cdf_svg(measured, f"Phase durations: {title}"))


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (kubectl), or 0 where unknown."""
    if resource is None:
        return 0.0
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class BatchOutcome(NamedTuple):
    """One batch as results.json pools them."""

    entry: BatchEntry  # its entry in run.json's `batches`
    summary: BatchSummary
    client_wait: (
        dict | None
    )  # client.json: how the client waited (none for a run of the guide's script)

    def figures(self) -> dict:
        """The batch's saved form; of how the client waited, it shows the one figure."""
        return dict(
            self.summary.figures,
            client_job_complete_seconds=(self.client_wait or {}).get("client_job_complete_seconds"),
        )


@dataclasses.dataclass
class Results:
    """A run's results: `figures` as results.json saves them (printed_results gives the printed
    form), and the measured batches they pool, for episodes.csv and the pictures."""

    figures: dict[str, Any]
    batches: list[tuple[str, BatchSummary]]  # each measured batch: its Job's name and its summary


def assemble_results(
    settings: Settings,
    batches: Sequence[BatchOutcome],
    client: dict | None,
    capacity: dict | None = None,
) -> Results:
    """results.json, top to bottom: the fields of every run, then a single batch's own or the
    rounds', the warm-up, what the run cost (`client`), the throughput, and the capacity plan
    check_capacity made (`capacity`, if it did)."""
    measured = [batch for batch in batches if batch.entry.measured]
    warmups = [batch for batch in batches if not batch.entry.measured]
    results = common_results(settings, measured)
    results.update(
        single_batch_results(measured[0]) if len(measured) == 1 else rounds_results(measured)
    )
    if warmups:
        results["warmup"] = warmups[0].figures()
    if client is not None:
        results["client"] = client
    pooled = [(batch.entry.job, batch.summary) for batch in measured]
    results["throughput"] = throughput(pooled)
    if capacity is not None:
        results["capacity"] = capacity
    return Results(results, pooled)


def latest(values: Iterable[float | None]) -> float | None:
    """The largest of the known values: None for a batch with no successful episode to measure
    (a rollout whose every agent failed on its own)."""
    return max((value for value in values if value is not None), default=None)


def common_results(settings: Settings, measured: Sequence[BatchOutcome]) -> dict[str, Any]:
    """The fields of every results.json: the measured batches pooled, and the run's settings."""
    figures = [batch.figures() for batch in measured]
    episodes = [record for batch in measured for record in batch.summary.episodes]
    rows = [
        dict(row, job=batch.entry.job) if len(measured) > 1 else row
        for batch in measured
        for row in batch.summary.figures["pods"]
    ]
    if len(measured) == 1:  # its own summary already pooled the same episodes
        phases, by_start_path = figures[0]["phases"], figures[0]["phases_by_start_path"]
    else:
        phases, by_start_path = (
            phase_summary([r["phases"] for r in episodes]),
            start_path_phases(episodes),
        )
    guide = describe([r["guide_pod_to_ready"] for r in episodes])
    client_seconds = [f.get("client_job_complete_seconds") for f in figures]
    known_seconds = [seconds for seconds in client_seconds if seconds is not None]
    return {
        "episodes": sum(f["episodes"] for f in figures),
        "successful_episodes": sum(f["successful_episodes"] for f in figures),
        "reward_sum": sum(f["reward_sum"] for f in figures),
        "batch_to_all_ready_seconds": latest(f["batch_to_all_ready_seconds"] for f in figures),
        "batch_to_all_rewards_seconds": latest(f["batch_to_all_rewards_seconds"] for f in figures),
        "pod_to_ready_p50_seconds": guide.get("p50"),
        "pod_to_ready_p95_seconds": guide.get("p95"),
        "pod_to_ready_max_seconds": guide.get("max"),
        "pods": rows,
        "context": settings.context,
        "namespace": settings.namespace,
        "image": settings.image,
        "runtime": settings.runtime,
        "parallelism": settings.parallelism,
        "cache_state": "warmed" if settings.warmup else "uncontrolled",
        "image_cache": count_image_cache(record.get("image_cache") for record in episodes),
        # A batch's own figures know a rollout's failed episodes too; rounds pool the summarised ones.
        "images": figures[0]["images"] if len(figures) == 1 else image_figures(episodes),
        # Every Job the run created: one per batch, or one per image and batch.
        "jobs": sum(len(entry.jobs or (entry.job,)) for entry in settings.batches),
        **({"image_map": dict(settings.image_map)} if settings.image_map else {}),
        "harden": settings.harden,
        "episode_script": settings.episode_script,
        "episode_script_sha256": settings.episode_script_sha256,
        "client_job_complete_seconds": max(known_seconds)
        if len(known_seconds) == len(client_seconds)
        else None,
        "reward_mean": rounded(
            sum(f["reward_sum"] for f in figures) / max(1, sum(f["episodes"] for f in figures)), 6
        ),
        "rounds_measured": len(figures),
        "phases": phases,
        "phases_by_start_path": by_start_path,
        "phase_points": POINT_SOURCES,
        "clock_warnings": [w for f in figures for w in f["clocks"]["warnings"]],
        "nodes": count_nodes(row["node"] for row in rows),
        "warnings": merge_warnings([f["warnings"] for f in figures]),
    }


def single_batch_results(batch: BatchOutcome) -> dict[str, Any]:
    """What results.json adds for one measured batch: its completion gap, clocks, Job creation and
    wait; for a rollout, its failures, attempts and groups (and the guide's pod_to_ready figures
    with its failed episodes counted at the deadline)."""
    figures = batch.figures()
    results = {
        "completion_gap": figures["completion_gap"],
        "clocks": figures["clocks"],
        "job_created": figures["job_created"],
        "client_wait": batch.client_wait,
    }
    if "failed_episodes" in figures:
        results.update(
            {
                key: figures[key]
                for key in ROLLOUT_FIELDS
                + (
                    "pod_to_ready_p50_seconds",
                    "pod_to_ready_p95_seconds",
                    "pod_to_ready_max_seconds",
                )
                if key in figures
            }
        )
    return results


def rounds_results(measured: Sequence[BatchOutcome]) -> dict[str, Any]:
    """What results.json adds for several measured rounds: each round's own figures."""
    return {
        "round_figures": (
            "batch_to_all_ready_seconds, batch_to_all_rewards_seconds and "
            "client_job_complete_seconds are the slowest round's; each round's "
            "are in rounds[], and the percentiles pool every round's episodes"
        ),
        "rounds": [dict(batch.figures(), job=batch.entry.job) for batch in measured],
    }


def merge_warnings(summaries: Iterable[dict]) -> dict:
    merged: dict[str, dict] = {}
    for summary in summaries:
        for reason, entry in summary.items():
            target = merged.setdefault(reason, {"count": 0, "objects": []})
            target["count"] += entry["count"]
            target["objects"] += [o for o in entry["objects"] if o not in target["objects"]]
    return merged


def warn_clocks(results: dict) -> None:
    """Clocks that disagree are said on stderr whatever --quiet says: every sub-second phase that
    mixes them is off by that much."""
    for warning in results.get("clock_warnings") or []:
        print(f"WARNING: clocks: {warning}", file=sys.stderr)


# --------------------------------------------------------------------------
# src/rl_batch_demo/lifecycle.py: The `cleanup` action, and `list` and `cleanup --stale`: the tool's runs in a cluster, found

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


# --------------------------------------------------------------------------
# src/rl_batch_demo/lease.py: One follower per run: a lock file in its output directory, and a lease on its namespace.

class Holder(NamedTuple):
    """A follower: its host, PID and its process's start (in clock ticks since boot, from
    /proc: a PID reused by another process is not the follower that held it)."""

    host: str
    pid: int
    process_started: str | None = None

    @property
    def identity(self) -> str:
        return f"{self.host}/{self.pid}"

    def said(self) -> str:
        return f"host {self.host} PID {self.pid}"


class FollowerBusy(DemoError):
    """Another live follower holds the run: its lock file or its namespace's lease."""


def process_start(pid: int) -> str | None:
    """A process's start time as /proc/PID/stat gives it (its 22nd field), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def this_holder() -> Holder:
    """This process as a follower."""
    return Holder(socket.gethostname(), os.getpid(), process_start(os.getpid()))


def holder_alive(holder: Holder) -> bool | None:
    """Whether the follower's process still runs: None when it runs on another host (unknown
    here); False when its PID is gone, or now belongs to a process started later."""
    if holder.host != socket.gethostname():
        return None
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has the PID: it exists
    started = process_start(holder.pid)
    return not (holder.process_started and started and started != holder.process_started)


def holder_of(record: dict | None) -> Holder | None:
    """The holder a lock file's or a lease's record names, or None when it names none."""
    if not isinstance(record, dict) or not record.get("host"):
        return None
    try:
        pid = int(record.get("pid"))  # type: ignore[arg-type]  # checked by the int() below
    except (TypeError, ValueError):
        return None
    started = record.get("process_started")
    return Holder(str(record["host"]), pid, str(started) if started else None)


def read_lock(path: str) -> dict | None:
    """The lock file's record; None when it cannot be read whole (being written, or damaged)."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def take_lock(output: str, replace_remote: bool = False) -> str:
    """Hold the output directory's lock file for this process: a lock of a dead process on this
    host is taken over, one of another host only when `replace_remote` (its lease is stale); a
    live holder's is refused with FollowerBusy naming it. The lock file's path."""
    path = os.path.join(output, LOCK_FILE)
    me = this_holder()
    record = dict(me._asdict(), since=time.time())
    for _ in range(3):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = read_lock(path)
            holder = holder_of(held)
            if holder is None and lock_age(path) < LEASE_RENEW_SECONDS:
                time.sleep(0.2)  # being written by a follower starting this moment
                continue
            alive = None if holder is None else holder_alive(holder)
            if holder is not None and (alive or (alive is None and not replace_remote)):
                raise FollowerBusy(lock_refusal(output, holder, held or {}, alive)) from None
            remove_quietly(path)  # stale: its holder is dead, or the lease says so
            continue
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
        except OSError as error:
            remove_quietly(path)
            raise DemoError(f"cannot write {path}: {error.strerror or error}") from None
        return path
    raise FollowerBusy(f"{output}: could not take {LOCK_FILE}; another follower is starting")


def lock_age(path: str) -> float:
    """Seconds since the lock file was last written or renewed (0 when it is gone)."""
    try:
        return max(0.0, time.time() - os.path.getmtime(path))
    except OSError:
        return 0.0


def lock_refusal(output: str, holder: Holder, record: dict, alive: bool | None) -> str:
    """Why a second follower of one output directory is refused, and what to do instead."""
    since = record.get("since")
    started = f", since {rfc3339_micro(since)}" if isinstance(since, (int, float)) else ""
    if alive:
        return (
            f"{output} is already followed by {holder.said()}{started}; one follower per run "
            f"(stop that process first, or wait for it)"
        )
    return (
        f"{output} is followed by {holder.said()}{started} (another host: its process cannot "
        f"be checked from here); attach --force takes over once its lease on the namespace "
        f"has not been renewed for {LEASE_STALE_PERIODS} periods"
    )


def release_lock(path: str) -> None:
    """Remove the lock file if it is still this process's."""
    holder = holder_of(read_lock(path))
    if holder is not None and (holder.host, holder.pid) == (socket.gethostname(), os.getpid()):
        remove_quietly(path)


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def rfc3339_micro(moment: float) -> str:
    """Epoch seconds -> RFC 3339 in UTC with microseconds, as a Lease's MicroTime."""
    stamp = datetime.datetime.fromtimestamp(moment, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_record(holder: Holder, acquired: float, renewed: float, output: str) -> dict:
    """The lease annotation's JSON: the fields of a coordination.k8s.io Lease, and who holds it."""
    return {
        "holderIdentity": holder.identity,
        "host": holder.host,
        "pid": holder.pid,
        "process_started": holder.process_started,
        "output": os.path.abspath(output),
        "acquireTime": rfc3339_micro(acquired),
        "renewTime": rfc3339_micro(renewed),
        "leaseDurationSeconds": LEASE_RENEW_SECONDS * LEASE_STALE_PERIODS,
        "renewPeriodSeconds": LEASE_RENEW_SECONDS,
    }


def lease_of(namespace: dict | None) -> dict | None:
    """The follower lease a namespace carries, or None (none, or not JSON)."""
    text = (((namespace or {}).get("metadata") or {}).get("annotations") or {}).get(
        FOLLOWER_ANNOTATION
    )
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def lease_renewed_at(record: dict) -> float | None:
    return parse_time(str(record.get("renewTime") or "")) or None


def lease_verdict(
    record: dict | None,
    me: Holder,
    now: float,
    force: bool,
    alive: Callable[[Holder], bool | None] = holder_alive,
) -> str | None:
    """None when `me` may hold the lease; else why not. Free: none, ours, its holder's process
    gone (this host), or (`force`) not renewed for LEASE_STALE_PERIODS periods. Pure but for
    `alive`, which looks at this host's processes."""
    holder = holder_of(record)
    if record is None or holder is None or holder.identity == me.identity:
        return None
    renewed = lease_renewed_at(record)
    period = float(record.get("renewPeriodSeconds") or LEASE_RENEW_SECONDS)
    age = None if renewed is None else max(0.0, now - renewed)
    living = alive(holder)
    if living is False:
        return None
    since = "never renewed" if age is None else f"last renewed {age:.0f} s ago"
    if living:
        return f"the run is followed by {holder.said()} ({since}); one follower per run"
    stale = age is None or age >= LEASE_STALE_PERIODS * period
    if stale and force:
        return None
    if stale:
        return (
            f"the run's lease is held by {holder.said()}, {since} (more than "
            f"{LEASE_STALE_PERIODS} periods of {period:.0f} s): that follower looks gone; "
            f"attach --force takes the lease over"
        )
    return (
        f"the run is followed by {holder.said()} ({since}, every {period:.0f} s); one "
        f"follower per run (attach --force takes over only a lease not renewed for "
        f"{LEASE_STALE_PERIODS} periods)"
    )


def conflict(error: KubectlError) -> bool:
    """The namespace changed since it was read (the resourceVersion precondition failed)."""
    return "Conflict" in error.stderr or "the object has been modified" in error.stderr


class FollowerLease:
    """This process's hold on one run: its lock file, renewed (touched) every
    LEASE_RENEW_SECONDS, and its namespace's lease, claimed as soon as the namespace exists
    and renewed with it, both by a thread of its own through a kubectl of its own (the run's
    counts its own processes). `release` gives both up."""

    def __init__(
        self, kubectl: Kubectl, receipt: Receipt, output: str, lock_path: str, force: bool = False
    ) -> None:
        self.kubectl = (
            kubectl.sibling()
            if isinstance(kubectl, ProxiedKubectl)
            else Kubectl(kubectl.binary, kubectl.context, kubectl.verbose)
        )
        self.receipt = receipt
        self.output = output
        self.lock_path = lock_path
        self.force = force
        self.me = this_holder()
        self.acquired: float | None = None
        self.lost: str | None = None  # why the lease was lost to another follower, if it was
        self.failing = False  # the last claim or renewal failed (and was said)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> FollowerLease:
        self._thread = threading.Thread(
            target=self._keep, name="rl-batch-demo follower lease", daemon=True
        )
        self._thread.start()
        return self

    def _keep(self) -> None:
        """Claim the lease once the namespace exists, then renew it and the lock every period."""
        while not self._stop.is_set():
            wait: float = LEASE_RENEW_SECONDS
            if self.lost is None and self.receipt.namespace_uid:
                try:
                    self.hold()
                    self.failing = False
                except FollowerBusy as error:
                    self.warn(f"Warning: the run's follower lease was taken over: {error}")
                except DemoError as error:
                    # Said once: a role without patch on namespaces keeps the lock file alone.
                    self.warn(
                        f"Warning: cannot hold the run's follower lease on namespace "
                        f"{self.receipt.namespace} ({error}); grant patch on namespaces"
                    )
                    wait = 1 if self.acquired is not None else LEASE_RENEW_SECONDS
            elif self.lost is None:
                wait = 0.5  # the namespace is about to be created
            try:
                os.utime(self.lock_path)
            except OSError:
                pass  # the directory went: nothing more to renew there
            self._stop.wait(wait)

    def warn(self, line: str) -> None:
        """One warning per spell of failures, not one a period."""
        if not self.failing:
            print(line, file=sys.stderr, flush=True)
        self.failing = True

    def hold(self, force: bool | None = None) -> None:
        """Claim or renew the lease: read the namespace, check who holds it, write ours with its
        resourceVersion as a precondition (a follower that wrote meanwhile wins, as in leader
        election). FollowerBusy when another holds it."""
        live = self.kubectl.get(
            "namespace",
            self.receipt.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
        if live is None or not self.receipt.owns_namespace(live):
            return
        now = time.time()
        why = lease_verdict(lease_of(live), self.me, now, self.force if force is None else force)
        if why is not None:
            if self.acquired is not None:
                self.lost = why
            raise FollowerBusy(why)
        self.acquired = self.acquired or now
        record = lease_record(self.me, self.acquired, now, self.output)
        self.patch(json.dumps(record), live["metadata"].get("resourceVersion"))

    def patch(self, value: str | None, resource_version: str | None) -> None:
        metadata: dict = {"annotations": {FOLLOWER_ANNOTATION: value}}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        try:
            merge_patch(
                self.kubectl,
                "namespace",
                self.receipt.namespace,
                None,
                {"metadata": metadata},
                retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
            )
        except KubectlError as error:
            if conflict(error):
                raise FollowerBusy(
                    "another follower wrote the run's lease at the same moment"
                ) from None
            if error.not_found:
                return  # the namespace went after it was read (cleanup): nothing left to hold
            raise

    def release(self) -> None:
        """Stop renewing; remove the lease if it is still ours, and the lock file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_SECONDS)
        if self.acquired is not None and self.lost is None:
            try:
                live = self.kubectl.get(
                    "namespace",
                    self.receipt.namespace,
                    missing_ok=True,
                    retry_until=time.monotonic() + 5,
                )
                held = holder_of(lease_of(live))
                if live is not None and held is not None and held.identity == self.me.identity:
                    self.patch(None, live["metadata"].get("resourceVersion"))
            except DemoError:
                pass  # it expires by itself: LEASE_STALE_PERIODS periods unrenewed
        release_lock(self.lock_path)


# --------------------------------------------------------------------------
# src/rl_batch_demo/run.py: The `run` action: `perform_run` -> `start_run` -> `execute`, its steps on one `RunContext`.

def default_timeout(count: int, parallelism: int) -> int:
    """The Job deadline: the guide's 240 s up to the default cap, then grown with the waves of pods."""
    if count <= DEADLINE_GROWS_ABOVE_EPISODES:
        return DEFAULT_JOB_DEADLINE_SECONDS
    waves = math.ceil(count / parallelism)
    return max(DEFAULT_JOB_DEADLINE_SECONDS, 120 + 20 * waves)


def batch_names(rounds: int, warmup: bool, suffix: str = "") -> list[tuple[str, bool]]:
    """(Job name, measured?) for every batch of a run; one measured batch is plain `rollout`
    (`suffix`: what a run in a shared namespace ends its names with)."""
    names = [(WARMUP_JOB_NAME, False)] if warmup else []
    if rounds == 1:
        names.append((JOB_NAME, True))
    else:
        names += [(f"{JOB_NAME}-{n}", True) for n in range(1, rounds + 1)]
    return [(name + suffix, measured) for name, measured in names]


def rollout_policy(settings: Settings) -> RolloutPolicy | None:
    """Retries and accepted failures, when either was asked for, or --need (which accepts the
    failures it over-provisions for: count - need); else the guide's backoffLimit 0."""
    if settings.need is not None:
        return RolloutPolicy(settings.retries or 0, settings.count - settings.need, settings.need)
    if settings.need_groups is not None:  # the tool stops the rest itself, once K are whole
        lost = settings.count - settings.need_groups * settings.group_size
        return RolloutPolicy(settings.retries or 0, lost)
    if settings.retries is None and settings.allow_failures is None:
        return None
    return RolloutPolicy(settings.retries or 0, settings.allow_failures or 0)


def image_job_policy(settings: Settings, episodes: int) -> RolloutPolicy | None:
    """The policy of one image's Job of `episodes`: --allow-failures K holds for the whole batch
    (the run counts every Job's failures against it), and a Job can fail no more than its own
    episodes, so its maxFailedIndexes is K or its episodes, the fewer (the API refuses more)."""
    policy = rollout_policy(settings)
    if policy is None:
        return None
    return policy._replace(allow_failures=min(policy.allow_failures, episodes))


def pod_deadline(settings: Settings) -> int | None:
    """Each pod's activeDeadlineSeconds, counted from its start on the node: --pull-timeout and
    --episode-timeout together, since one deadline bounds the pull and the episode after it. A
    rollout's launcher stops its episode at --episode-timeout itself: its pod's deadline, a backstop,
    leaves EPISODE_TIMEOUT_SLACK_SECONDS more for the pod to start."""
    known = [part for part in (settings.pull_timeout, settings.episode_timeout) if part is not None]
    if settings.rollout and settings.episode_timeout is not None:
        known.append(EPISODE_TIMEOUT_SLACK_SECONDS)
    return sum(known) if known else None


def pod_deadline_parts(settings: Settings) -> str | None:
    """What each pod's deadline (pod_deadline) is made of: the flags given, with their values."""
    parts = [
        f"{flag} {seconds}"
        for flag, seconds in (
            ("--pull-timeout", settings.pull_timeout),
            ("--episode-timeout", settings.episode_timeout),
        )
        if seconds is not None
    ]
    if settings.rollout and settings.episode_timeout is not None:
        parts.append(f"{EPISODE_TIMEOUT_SLACK_SECONDS} s for the pod to start")
    return " + ".join(parts) or None


def episode_launch(settings: Settings) -> Launch | None:
    """How a rollout's pods run their episode: through the launcher, with --episode-timeout."""
    return Launch(timeout=settings.episode_timeout) if settings.rollout else None


def batch_job(namespace: str, settings: Settings, name: str, task_maps: Sequence[dict]) -> dict:
    """The Job of one batch, from the run's settings and the ConfigMaps that carry its tasks."""
    return job_manifest(
        namespace,
        settings.count,
        settings.parallelism,
        settings.image,
        settings.runtime,
        settings.timeout,
        name=name,
        harden=settings.harden,
        # Rewards are kept per completion index: a rollout's pods need one, whatever they run.
        indexed=not settings.builtin or settings.rollout,
        tasks=tasks_volume(task_maps, settings.group_size) if task_maps else None,
        policy=rollout_policy(settings),
        episode_timeout=pod_deadline(settings),
        launch=episode_launch(settings),
        deadline_parts=pod_deadline_parts(settings),
        pod=settings.pod,
    )


def image_job_name(batch: str, number: int) -> str:
    """The Job of a batch's `number`th image (from 1)."""
    return f"{batch}-image-{number}"


def batch_jobs(
    namespace: str,
    settings: Settings,
    name: str,
    task_maps: Sequence[dict],
    groups: Sequence[ImageGroup],
) -> list[dict]:
    """The Jobs of one batch: its one Job, or one per image, --parallelism shared between them."""
    if len(groups) == 1:
        return [
            batch_job(
                namespace, dataclasses.replace(settings, image=groups[0].image), name, task_maps
            )
        ]
    shares = parallelism_shares(settings.parallelism, [len(group.indexes) for group in groups])
    return [
        job_manifest(
            namespace,
            len(group.indexes),
            share,
            group.image,
            settings.runtime,
            settings.timeout,
            name=image_job_name(name, number),
            harden=settings.harden,
            indexed=True,
            tasks=tasks_volume(task_maps, settings.group_size, group.indexes)
            if task_maps
            else None,
            policy=image_job_policy(settings, len(group.indexes)),
            episode_timeout=pod_deadline(settings),
            batch=name,
            episode_indexes=group.indexes,
            launch=episode_launch(settings),
            deadline_parts=pod_deadline_parts(settings),
            pod=settings.pod,
        )
        for number, (group, share) in enumerate(zip(groups, shares), start=1)
    ]


def plan_run(
    namespace: str,
    run_id: str,
    settings: Settings,
    worker_source: str,
    tasks: Sequence[Task] = (),
    origin: RunOrigin | None = None,
) -> RunPlan:
    """Every object `run` creates, from its settings (and the run's origin, once known) alone."""
    task_maps = task_configmaps(namespace, tasks) if tasks else []
    setup = [network_policy_manifest(namespace)] if settings.harden else []
    if settings.pod.egress:
        setup.append(egress_policy_manifest(namespace, settings.pod.egress))
    # Planned without their data: the Secrets are read when the run starts (secretcopy).
    setup += [
        secret_copy_manifest(namespace, source)
        for source in settings.pod.secrets
        # In a namespace the run shares, a Secret of that namespace is read where it is.
        if not (settings.shared_namespace and source.namespace == namespace)
    ]
    setup += [configmap_manifest(namespace, worker_source, settings.rollout), *task_maps]
    groups = image_groups(
        tasks, settings.count, settings.group_size, settings.image, settings.image_map
    )
    suffix = run_suffix(run_id) if settings.shared_namespace else ""
    jobs = {
        name: batch_jobs(namespace, settings, name, task_maps, groups)
        for name, _ in batch_names(settings.rounds, settings.warmup, suffix)
    }
    # What the run plans goes with its origin: a namespace without either is the guide's.
    planned = planned_work(jobs) if origin is not None else None
    if settings.shared_namespace:
        shared = shared_jobs(jobs, setup, run_id, origin, planned, settings.queue)
        return RunPlan(None, shared_setup(setup, run_id), shared)
    if settings.queue:
        jobs = {
            name: [queued_job(job, settings.queue) for job in each] for name, each in jobs.items()
        }
    return RunPlan(
        namespace_manifest(namespace, run_id, settings.harden, origin, planned), setup, jobs
    )


def planned_objects(
    namespace: str,
    run_id: str,
    settings: Settings,
    worker_source: str,
    tasks: Sequence[Task] = (),
    origin: RunOrigin | None = None,
) -> list[dict]:
    """Every object `run` creates, in creation order."""
    return plan_run(namespace, run_id, settings, worker_source, tasks, origin).objects()


def run_origin(run_id: str, output: str, user: str, ttl_seconds: int | None) -> RunOrigin:
    """This run's origin as of now: this host, the absolute output directory, the expiry `--ttl` sets."""
    return RunOrigin(
        run_id,
        __version__,
        socket.gethostname(),
        os.path.abspath(output),
        user,
        None if ttl_seconds is None else time.time() + ttl_seconds,
    )


def execute(run: RunContext) -> Results | None:
    """The steps of `run`, in order; each leaves on disk what a failure after it needs."""
    save_run_records(run)
    # The run's one follower, once its receipt is there: its lock file, then its lease.
    run.lease = FollowerLease(run.kubectl, run.receipt, run.output, take_lock(run.output)).start()
    check_runtime_class(run)
    if rollout_policy(run.settings):
        check_server_version(run)  # --need among them
    check_shared_namespace(run)
    if run.settings.queue:
        check_queue(run)  # the queue's quota, not the nodes, holds the batch
    else:
        check_capacity(run)
    secrets_read = read_secrets(run)  # --env-from-secret: held in memory alone
    stamp_origin(run)
    save_planned_jobs(run)
    create_namespace(run)
    try:
        for manifest in run.plan.setup:
            created = create_object(run, filled(manifest, secrets_read))
            if run.receipt.shared:  # its UID saved before the next object is made
                metadata = created["metadata"]
                run.receipt.record_object(manifest["kind"], metadata["name"], metadata["uid"])
    finally:
        secrets_read.clear()  # on a failure too: no traceback's frame keeps the values
    if run.settings.prepull:
        prepull(run)
    if run.detach:
        submit_detached(run)
        return None
    outcomes: list[BatchOutcome] = []
    for entry in run.settings.batches:
        for earlier in outcomes[-1:]:  # its drafted rows wait in memory, not in an open file
            for spool in set(earlier.summary.csv_rows.values()):
                spool.hold_in_memory()
        with held_objects_spared(run.owns_process):
            outcomes.append(run_one_batch(run, entry))
        if run.tracer is not None:
            run.tracer.batch_done(entry.job, outcomes[-1].summary, entry.measured)
    return save_results(run, outcomes)


def stamp_origin(run: RunContext) -> None:
    """Who starts the run, from where and until when, and what it plans, into the namespace about
    to be created."""
    origin = run_origin(
        run.receipt.run_id, run.output, current_user(run.kubectl), run.settings.ttl_seconds
    )
    if run.plan.namespace is None:  # a shared namespace: its Jobs carry the origin
        run.plan = run.plan._replace(jobs=stamped_jobs(run.plan.jobs, origin))
        return
    run.plan = run.plan._replace(
        namespace=namespace_manifest(
            run.namespace,
            origin.run_id,
            run.settings.harden,
            origin,
            planned_work(run.plan.jobs),
        )
    )


def submit_detached(run: RunContext) -> None:
    """--detach: the first batch's Jobs created (job-submitted.json, their UIDs in the receipt)
    and nothing followed: `attach` picks the run up from its files."""
    entry = run.settings.batches[0]
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    os.makedirs(batch_dir, exist_ok=True)
    manifests = run.plan.jobs[entry.job]
    save_submitted_jobs(run, batch_dir, manifests)
    create_batch_jobs(run, manifests)


def say_detached(run: RunContext) -> None:
    """What a detached run prints on stdout: its namespace and the command that follows it."""
    if not run.silent:
        print(f"Detached: attach with: {attach_command(run.output, run.kubectl.binary)}")


def detached_telemetry(run: RunContext, pushgateway: str | None) -> None:
    """A detached run has not ended: no root span is sent (its trace would say it ended with no
    episode), nothing is pushed; it says how to send both once `attach` has saved its results."""
    if run.tracer is None and not pushgateway:
        return
    if run.tracer is not None:
        run.tracer.exporter.close()  # nothing was submitted: nothing is sent
    report = f"{program_name()} report {shlex.quote(run.output)}"
    if run.tracer is not None:
        report += f" --otlp-endpoint {shlex.quote(redacted(run.tracer.exporter.config.url))}"
    if pushgateway:
        report += f" --pushgateway {shlex.quote(redacted(pushgateway))}"
    print(
        f"Note: a detached run sends no traces or metrics now; once attach has saved its "
        f"results, send them with: {report}",
        file=sys.stderr,
    )


def save_planned_jobs(run: RunContext) -> None:
    """jobs-planned.json: every Job of every batch, as a List, before any is created (what
    `attach` creates of a run stopped between two batches)."""
    jobs = [job for batch in run.plan.jobs.values() for job in batch]
    write_json(os.path.join(run.output, PLANNED_JOBS_FILE), list_manifest(jobs))


def create_namespace(run: RunContext) -> None:
    """The run's namespace, its UID in the receipt at once (a shared namespace: none is made)."""
    run.touched_cluster = True
    if run.plan.namespace is None:
        return
    created = create_object(run, run.plan.namespace)
    run.receipt.record_namespace(created["metadata"]["uid"])
    if not run.silent:
        print(f"Test namespace: {run.namespace}", flush=True)


def create_object(run: RunContext, manifest: dict) -> dict:
    """Create one object; a retry that finds it already there adopts it only if it is provably ours.
    A stop requested meanwhile (stream_batch closed) comes first: nothing more is created."""
    if run.stop is not None:
        run.stop.check()
    kubectl = run.kubectl
    retries_before = kubectl.retries
    try:
        return kubectl.create(manifest, retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS)
    except KubectlError as error:
        # Only a retried create may find its own first attempt already done.
        if not error.already_exists or kubectl.retries == retries_before:
            raise
    kind = manifest["kind"].lower()
    name = manifest["metadata"]["name"]
    existing = kubectl.get(
        kind,
        name,
        None if kind == "namespace" else run.namespace,
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    assert existing is not None  # not missing_ok: a missing object raised
    if kind == "namespace" and not run.receipt.owns_namespace(existing):
        raise DemoError(f"namespace {name} already exists and is not this run's")
    return existing


def prepull(run: RunContext) -> None:
    """--prepull: every image of the run made present on every node the batch can use, before its
    first Job: one pod per node and image, waited for until each ended (or its deadline passed).
    Leaves prepull.json (the step's figures and its pods); the figures go into results.json."""
    nodes = prepull_nodes(run)
    images = run_images(run.plan.jobs)
    deadline_seconds = run.settings.pull_timeout or run.settings.timeout
    pods = prepull_pods(run, nodes, images, deadline_seconds)
    started = time.monotonic()
    for pod in pods:
        create_object(run, pod)
    finished = wait_prepulled(run, len(pods), started + deadline_seconds + CLIENT_GRACE_SECONDS)
    seconds = time.monotonic() - started
    events = namespace_events(run)
    failures = prepull_failures(finished, events)
    run.prepull = {
        "seconds": rounded(seconds),
        "nodes": len(nodes),
        "images": len(images),
        "pods": len(pods),
        "failures": failures,
        "image_cache": count_image_cache(
            image_cache_states(events).get(pod_name(p)) for p in finished
        ),
    }
    write_json(
        os.path.join(run.output, PREPULL_FILE),
        dict(run.prepull, node_names=nodes, image_names=images, pod_states=list_manifest(finished)),
    )
    if not run.silent:
        say_prepulled(seconds, nodes, images, len(pods), failures)


def prepull_nodes(run: RunContext) -> list[str]:
    """The nodes --prepull pulls on: those the batch can use (schedulable, with the RuntimeClass's
    labels); DemoError when they cannot be listed, or there are none."""
    retry_until = time.monotonic() + FIRST_CONTACT_RETRY_SECONDS
    try:
        runtime_class = run.kubectl.get(
            "runtimeclass", run.settings.runtime, retry_until=retry_until
        )
        nodes = usable_nodes(
            (run.kubectl.get_list("nodes", None, retry_until=retry_until) or {}).get("items") or [],
            runtime_class,
        )
    except DemoError as error:
        raise DemoError(
            f"{run.spelling.switch('prepull')} needs to list the nodes (and get the "
            f"RuntimeClass): {error}"
        ) from None
    if not nodes:
        raise DemoError(
            f"{run.spelling.switch('prepull')} found no node the batch can use (schedulable, "
            f"with the RuntimeClass's labels)"
        )
    return nodes


def prepull_pods(
    run: RunContext, nodes: Sequence[str], images: Sequence[str], deadline_seconds: int
) -> list[dict]:
    """One --prepull pod manifest per image and node, named by their places in the two lists."""
    return [
        prepull_pod_manifest(
            run.namespace,
            f"prepull-{i}-{n}",
            node,
            image,
            run.settings.runtime,
            run.settings.harden,
            deadline_seconds,
        )
        for i, image in enumerate(images, start=1)
        for n, node in enumerate(nodes, start=1)
    ]


def namespace_events(run: RunContext) -> list[EventRecord]:
    """Every event in the run's namespace, read now."""
    listed = run.kubectl.get_list(
        "events", run.namespace, retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS
    )
    return event_records((listed or {}).get("items") or [])


def say_prepulled(
    seconds: float,
    nodes: Sequence[str],
    images: Sequence[str],
    pods: int,
    failures: Sequence[dict],
) -> None:
    """On stderr: what --prepull pulled where, how long it took, and the first pods that failed."""
    print(
        f"Pre-pulled {plural(len(images), 'image')} on {plural(len(nodes), 'node')} in {seconds:.1f} s"
        + (
            f"; {len(failures)} of {pods} pods failed: "
            + "; ".join(f"{f['image']} on {f['node']}: {f['why']}" for f in failures[:3])
            if failures
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )


def wait_prepulled(run: RunContext, count: int, deadline: float) -> list[dict]:
    """The --prepull pods once each has ended, or as they are at the deadline (polled: a short step)."""
    while True:
        listed = run.kubectl.get_list(
            "pods",
            run.namespace,
            "-l",
            f"{PREPULL_LABEL}=true",
            retry_until=min(deadline, time.monotonic() + CALL_TIMEOUT_SECONDS),
        )
        pods = (listed or {}).get("items") or []
        if (
            len(pods) >= count and all(pod_terminal(pod) for pod in pods)
        ) or time.monotonic() >= deadline:
            return sorted(pods, key=pod_name)
        time.sleep(PREPULL_POLL_SECONDS)


def open_proxy(run: RunContext) -> None:
    """The API proxy that reads logs and pages, once a run; without it, one kubectl per read."""
    if run.proxy is None:
        try:
            run.proxy = ApiProxy(run.kubectl)
        except DemoError as error:  # e.g. kubectl proxy forbidden here
            print(f"Warning: {error}; reading logs with one kubectl per pod", file=sys.stderr)


def run_one_batch(
    run: RunContext, entry: BatchEntry, kept: Sequence[dict] = (), adopt: bool = False
) -> BatchOutcome:
    """Submit one Job, follow it, save its evidence, verify and summarise it. `adopt`: its Jobs
    exist already (attach), and `kept` are the rewards.jsonl lines written before."""
    job_name = entry.job
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    os.makedirs(batch_dir, exist_ok=True)
    manifests = run.plan.jobs[job_name]
    job_names = [manifest["metadata"]["name"] for manifest in manifests]
    if not adopt:
        save_submitted_jobs(run, batch_dir, manifests)
    admitted = (
        admit_batch(run, lambda: create_batch_jobs(run, manifests), job_names, entry.dir)
        if run.settings.queue and not adopt
        else None
    )
    if run.settings.queue and adopt:  # attach: the Jobs made before, maybe queued still
        wait_admitted(run, job_names)
        record_admission(run, job_names, entry.dir)
    # The client's own deadline, which bounds its watches from their start; its measures start
    # at the submission, just before the create call.
    client_deadline = time.monotonic() + run.settings.timeout + CLIENT_GRACE_SECONDS
    watches = start_batch_watches(run, job_name, job_names, client_deadline)
    follower = batch_follower(run, job_name, job_names, batch_dir, watches, kept)
    run.batch = batch = BatchEvidence(run, follower, batch_dir)
    if adopt:
        follower.adopt()
    else:
        follower.submit(lambda: admitted.job if admitted else create_batch_jobs(run, manifests))
    if admitted:  # the Jobs were made before the queue's wait: the clocks take the true moments
        follower.state.submitted(admitted.submitted)
        follower.state.created(admitted.created)
    end = follower.follow(client_deadline)
    wait = client_wait(follower, end)
    evidence = batch.collect(job_name)
    follower.stop_watches()
    if entry == run.settings.batches[-1]:
        begin_cleanup(run)
    wait = wait._replace(
        pods_read=pods_read(evidence.reading, follower.state.end_resource_version),
        events_read=batch.events_read,
    )
    client_path = os.path.join(batch_dir, "client.json")
    summary, wait = summarise_followed_batch(batch, end, evidence, wait, client_path)
    assert (
        follower.end_seen_monotonic is not None
    )  # both summaries fail a batch whose end was not seen
    wait = wait._replace(
        episodes_summarised_while_waiting=summary.drafts_taken,
        post_completion_seconds=rounded(time.monotonic() - follower.end_seen_monotonic),
    )
    write_json(client_path, wait.saved())
    return BatchOutcome(entry, summary, wait.saved())


def begin_cleanup(run: RunContext) -> None:
    """--cleanup through the proxy (run.cleanup_ahead): the namespace's deletion begun once the
    last batch's evidence is read, while its summary is made, since the API server takes a tenth
    of a second or more to delete a Job; finish_run waits for it (cleaned_up). It cuts a
    trainer's step by that much (tests/benchmarks/step_benchmark.py)."""
    ahead = run.cleanup_ahead
    if ahead is None or not ahead.set_running_or_notify_cancel():
        return

    def clean() -> None:
        report = io.StringIO()
        try:
            cleanup_namespace(run.kubectl, run.receipt, report=report)
        except BaseException as error:  # raised where it is waited for
            ahead.set_exception(error)
        else:
            ahead.set_result(report.getvalue())

    threading.Thread(target=clean, name="rl-batch-demo cleanup", daemon=True).start()


def cleaned_up(run: RunContext, report: Any) -> None:
    """The run's namespace deleted (cleanup_namespace), what it said on `report`: waited for
    when begin_cleanup began it, else done now."""
    ahead = run.cleanup_ahead
    if ahead is None or not (ahead.running() or ahead.done()):
        cleanup_namespace(run.kubectl, run.receipt, report=report)
        return
    report.write(ahead.result())
    report.flush()


def save_submitted_jobs(run: RunContext, batch_dir: str, manifests: Sequence[dict]) -> None:
    """job-submitted.json: the batch's Job (a List of them when several, each checked first)."""
    write_json(
        os.path.join(batch_dir, "job-submitted.json"),
        manifests[0] if len(manifests) == 1 else list_manifest(manifests),
    )
    if len(manifests) > 1:
        check_jobs_accepted(run, manifests)


def start_batch_watches(
    run: RunContext, job_name: str, job_names: Sequence[str], client_deadline: float
) -> WatchStream:
    """The batch's watches with the pod watch started, and the API proxy open."""
    watches = WatchStream(run.kubectl, run.namespace, job_name, BatchJobs(job_name, job_names))
    # The pod watch first, so that it is listening by the time the Job's first pods are created
    # (and starts while the proxy does).
    watches.start("pods", client_deadline)
    try:
        open_proxy(run)
    except BaseException:
        watches.stop()
        raise
    return watches


def batch_follower(
    run: RunContext,
    job_name: str,
    job_names: Sequence[str],
    batch_dir: str,
    watches: WatchStream,
    kept: Sequence[dict] = (),
) -> BatchFollower:
    """What follows the batch, with its reward stream when it is a rollout."""
    stop_rest = (
        (lambda: stop_for_groups(run, job_names)) if run.settings.need_groups is not None else None
    )
    path = os.path.join(batch_dir, REWARDS_FILE)
    rewards = (
        RewardStream(path, run.settings, run.on_reward, run.stop, stop_rest, kept)
        if run.settings.rollout
        else None
    )
    return BatchFollower(
        run.kubectl,
        run.namespace,
        job_name,
        run.settings.count,
        run.progress,
        run.pool,
        run.proxy,
        batch_dir,
        rewards,
        watches,
        EpisodeDrafts(run.settings.builtin, spool_dir=batch_dir),
        job_names,
        spare_held=run.owns_process,
    )


def stop_for_groups(run: RunContext, job_names: Sequence[str]) -> None:
    """--need-groups K met: each Job of the batch stamped as stopped by the tool and suspended, so
    that its controller deletes its running pods and starts no more (the Job's own successPolicy
    cannot say "K whole groups"). A Job that has ended is stamped alone."""
    stamp = {"metadata": {"annotations": {NEED_GROUPS_ANNOTATION: str(run.settings.need_groups)}}}
    for name in job_names:
        ended = job_finished(run.batch.follower.jobs.seen.get(name) or {}) if run.batch else None
        patch = stamp if ended else dict(stamp, spec={"suspend": True})
        run.kubectl.run(
            ["patch", "job", name, "-n", run.namespace, "--type=merge", "-p", json.dumps(patch)],
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
        if run.settings.queue and not ended:  # else Kueue resumes it: the cancelled would run
            stop_queued(run.kubectl, run.namespace, name, run.receipt.job_uids().get(name))
    if not run.silent:
        print(
            f"{run.spelling.setting('need_groups', run.settings.need_groups)} met: the rest of "
            f"the batch stopped",
            file=sys.stderr,
            flush=True,
        )


def create_batch_jobs(run: RunContext, manifests: Sequence[dict]) -> dict:
    """The batch's Jobs in order, each UID in the receipt at once; the batch starts with the first."""
    created = []
    for manifest in manifests:
        created.append(create_object(run, manifest))
        run.receipt.record_job(manifest["metadata"]["name"], created[-1]["metadata"]["uid"])
    return created[0]


def summarise_followed_batch(
    batch: BatchEvidence, end: str | None, evidence: Evidence, wait: ClientWait, client_path: str
) -> tuple[BatchSummary, ClientWait]:
    """The batch verified (or rolled out) and summarised; a rollout's wait takes its reward
    deliveries, saved in client.json at once to be kept should the summary fail."""
    summarise = rollout_summary if batch.settings.rollout else verified_summary
    rewards = batch.follower.rewards
    try:
        summary = summarise(batch, end, evidence)
    finally:
        if rewards is not None:
            rewards.close()
            wait = wait._replace(reward_deliveries=[d.saved() for d in rewards.deliveries])
            write_json(client_path, wait.saved())
    return summary, wait


def check_jobs_accepted(run: RunContext, manifests: Sequence[dict]) -> None:
    """Each Job of a batch of several, as the API server would take it (a server-side dry run), before
    any is created: one refused (an invalid image reference) fails the run with none of them made,
    and the namespace made for them, empty of work, deleted."""
    for manifest in manifests:
        retry_until = time.monotonic() + CALL_TIMEOUT_SECONDS
        try:
            if run.kubectl.api is not None:
                api_create(run.kubectl.api, manifest, retry_until, dry_run=True)
            else:
                run.kubectl.run(
                    ["create", "--dry-run=server", "-f", "-", "-o", "name"],
                    input_text=json.dumps(manifest),
                    retry_until=retry_until,
                )
        except KubectlError as error:
            image = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
            raise DemoError(
                f"the API server refuses Job {manifest['metadata']['name']} (image {image}): "
                f"{error}; none of the batch's {len(manifests)} Jobs was created"
                f"{remove_unused_namespace(run)}"
            ) from None


def remove_unused_namespace(run: RunContext) -> str:
    """Delete the run's namespace before any Job of it exists (it holds the run's ConfigMaps, no
    work): what to add to the failure's words; nothing when it stays (cleanup says why then)."""
    try:
        cleanup_namespace(run.kubectl, run.receipt, report=io.StringIO())
    except DemoError:
        return ""
    run.touched_cluster = False  # nothing is left for cleanup to do
    return f"; its namespace {run.namespace} was deleted"


class ClientWait(NamedTuple):
    """How the client waited for one Job (client.json): when it saw the end, what the wait cost,
    how the evidence was read after it, and (a rollout) when each rewards.jsonl line was written."""

    job: str
    end: str | None  # Complete or Failed; None when the client gave up waiting
    submitted_at: float  # wall clock, just before the create call
    observed_at: float | None  # wall clock, when the client saw the end
    client_job_complete_seconds: float | None
    kubectl_processes_while_waiting: int
    watch_restarts: int
    watch_queue_peak: int
    wait_mode: str  # "watch", or "poll" once the watches gave up
    pods_read: dict | None = None  # pods_read(): known once the evidence is read
    events_read: str | None = None  # "watch" or "list" (BatchEvidence.events_read)
    reward_deliveries: list[list] | None = None  # a rollout's Delivery records, saved
    # How many episodes' points the summary took from their drafts, made while the batch ran.
    episodes_summarised_while_waiting: int | None = None
    post_completion_seconds: float | None = None  # from seeing the end to the summary made

    def saved(self) -> dict[str, Any]:
        """client.json's fields: the ones not known yet (or not a rollout's) left out."""
        return {
            key: value
            for key, value in self._asdict().items()
            if value is not None or key not in CLIENT_WAIT_LATER
        }


# What client.json gains as the batch is read and summarised; the fields before are there from the end.
CLIENT_WAIT_LATER = (
    "pods_read",
    "events_read",
    "reward_deliveries",
    "episodes_summarised_while_waiting",
    "post_completion_seconds",
)


def client_wait(follower: BatchFollower, end: str | None) -> ClientWait:
    """How the client waited for one Job, as of the end seen (or given up on)."""
    submission = follower.submission
    assert submission is not None  # followed only once submitted
    return ClientWait(
        job=follower.job_name,
        end=end,
        submitted_at=submission.wall,
        observed_at=follower.end_seen_wall,
        client_job_complete_seconds=rounded(follower.end_seen_monotonic - submission.monotonic)
        if follower.end_seen_monotonic is not None
        else None,
        kubectl_processes_while_waiting=follower.cost.processes,
        watch_restarts=follower.cost.restarts,
        watch_queue_peak=follower.cost.queue_peak,
        wait_mode="poll" if follower.polling else "watch",
    )


def pods_read(reading: PodReading, not_older_than: str | None) -> dict[str, Any]:
    """client.json's `pods_read`: how the Job's pods were read after its end."""
    return {
        "source": reading.source,
        "not_older_than": not_older_than,
        "resource_version": reading.resource_version,
        "pages": reading.pages,
        "continue_expiries": reading.continue_expiries,
        "read_again": reading.reread,
    }


def salvage(run: RunContext) -> list[str]:
    """After an interruption: complete the receipt, stop the batch's pods (suspend_batch), and
    save what can be saved quickly. The names of the Jobs suspended."""
    batch = run.batch
    if batch is not None:
        batch.follower.stop_watches()
    complete_receipt(run)
    suspended = suspend_batch(run)
    if batch is not None:
        try:
            batch.collect(batch.follower.job_name, retry=False)
        except (DemoError, OSError):
            pass  # whatever could be saved is saved
    return suspended


def complete_receipt(run: RunContext) -> None:
    """The namespace's and the batch's Jobs' UIDs in the receipt, should the interruption have
    come between their creation and their record."""
    batch = run.batch
    if run.touched_cluster and run.receipt.shared:
        complete_shared_receipt(run.kubectl, run.receipt, run.plan.setup)
    elif run.touched_cluster and not run.receipt.namespace_uid:
        try:
            live = run.kubectl.get("namespace", run.namespace, missing_ok=True)
        except DemoError:
            live = None
        if live and run.receipt.owns_namespace(live):
            run.receipt.record_namespace(live["metadata"]["uid"])
    for name in [] if batch is None else batch.follower.jobs.names:
        if run.receipt.has_job(name):
            continue
        try:
            live = run.kubectl.get("job", name, run.namespace, missing_ok=True)
        except DemoError:
            live = None
        if live:
            run.receipt.record_job(name, live["metadata"]["uid"])
    # Saved again even when nothing was added: the interruption may have come while it was written.
    run.receipt.save()


def suspend_batch(run: RunContext) -> list[str]:
    """Stop the pods of the batch under way: each of its Jobs the receipt names, not seen ended,
    suspended. The Job controller deletes its running pods and starts no more; the Job, its ended
    pods and their logs stay (evidence in the cluster, and a Job that could be resumed). Deleting
    the Jobs instead would take those with them. The names of the Jobs suspended; one that could
    not be is named on stderr."""
    batch = run.batch
    if batch is None:
        return suspend_queued(run) if run.settings.queue else []
    if batch.follower.state.end is not None:
        return []
    jobs, suspended = batch.follower.jobs, []
    for name in jobs.names:
        if not run.receipt.has_job(name) or job_finished(jobs.seen.get(name) or {}):
            continue
        if suspend_run_job(run, name):
            suspended.append(name)
    return suspended


def suspend_queued(run: RunContext) -> list[str]:
    """Interrupted while Kueue held the batch (or had just let it go): each Job the receipt names
    and the cluster has not seen end, suspended and its Workload deactivated."""
    names = []
    for name in run.receipt.job_uids():
        try:
            live = run.kubectl.get("job", name, run.namespace, missing_ok=True)
        except DemoError:
            live = None
        if live is not None and not job_finished(live) and suspend_run_job(run, name):
            names.append(name)
    return names


def suspend_run_job(run: RunContext, name: str) -> bool:
    """One Job suspended (its Workload deactivated too, under a queue); whether it was."""
    try:
        run.kubectl.run(
            ["patch", "job", name, "-n", run.namespace, "--type=merge", "-p", SUSPEND_PATCH],
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
    except DemoError as error:
        print(f"Warning: could not suspend Job {name}: {error}", file=sys.stderr)
        return False
    if run.settings.queue:  # else Kueue resumes it, its Workload being admitted
        stop_queued(run.kubectl, run.namespace, name, run.receipt.job_uids().get(name))
    return True


def close(run: RunContext) -> None:
    """Stop what the run started: watches, the proxy, idle log readers."""
    if run.batch is not None:
        run.batch.follower.stop_watches()
        if run.batch.follower.rewards is not None:
            run.batch.follower.rewards.close()
    if run.proxy is not None:
        run.proxy.close()
    run.pool.shutdown(wait=False)
    if run.lease is not None:
        run.lease.release()


def load_worker(request: RunRequest) -> tuple[str, bool]:
    """The episode program to ship and whether it is the built-in one."""
    script = request.episode_script
    if script is None:
        return WORKER_SOURCE, True
    named = request.spelling.setting("episode_script", script)
    try:
        with open(script, encoding="utf-8") as handle:
            source = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise DemoError(
            f"cannot read {named}: {getattr(error, 'strerror', None) or error}"
        ) from None
    check_episode_syntax(script, source, named)
    return source, False


def run_command(request: RunRequest, caller: Caller) -> int:
    """`run`: submit the batch(es), wait, save every record, verify, report."""
    return perform_run(request, caller)[0]


def perform_run(request: RunRequest, caller: Caller) -> tuple[int, Results | None]:
    """`run`: its exit status (0, or EXIT_PARTIAL for an accepted partial batch) and its results."""
    if request.dry_run:
        print(json.dumps(dry_run_listing(request), indent=2))
        return 0, None
    worker_source, builtin = load_worker(request)
    run = start_run(request, caller, worker_source, builtin)
    run.tracer = open_tracer(request.otlp_endpoint, run.receipt.run_id)
    if request.cleanup and run.kubectl.api is not None:
        run.cleanup_ahead = concurrent.futures.Future()
    cleanup_hint = cleanup_command(run.output, request.kubectl)
    failure: DemoError | None = None
    with signals_interrupt():
        try:
            results = execute(run)
        except KeyboardInterrupt:
            interrupted(run, request.cleanup, cleanup_hint)
            return EXIT_INTERRUPTED, None
        except StreamClosed as closed:
            interrupted(run, request.cleanup, cleanup_hint, f"{closed}.")
            return EXIT_INTERRUPTED, None
        except RewardCallbackError as error:
            # The caller's own code stopped the run: stopped as by Ctrl-C, its exception raised as it was.
            interrupted(run, request.cleanup, cleanup_hint, f"{error}; the run stopped.")
            raise error.original from None
        except DemoError as error:
            failure = error
        finally:
            close(run)
    if failure is None and results is None:  # --detach: `attach` follows the run
        say_detached(run)
        detached_telemetry(run, request.pushgateway)
        return 0, None
    if run.tracer is not None:
        finish_trace(
            run.tracer,
            run.output,
            None if failure or results is None else results.figures,
            failure,
            request.quiet,
        )
    if failure is None and results is not None and not request.spelling.python:
        # a Python caller has them returned
        print_results(results.figures, request.quiet, os.path.join(run.output, RESULTS_FILE))
    if failure is None and request.pushgateway:
        push_saved_metrics(run.output, request.pushgateway, run.receipt.run_id)
    finish_run(run, failure, request.cleanup, request.quiet, cleanup_hint)
    status = EXIT_PARTIAL if results is not None and results.figures.get("accepted_partial") else 0
    if caller.exit_when_done:
        exit_at_once(status)  # while the run is still held: freeing it is what would take the time
    return status, results


def exit_at_once(status: int) -> NoReturn:
    """End the process now, its output flushed. By then every file is written, every kubectl it
    started has been stopped and waited for, and nothing it holds is needed: freeing that (every
    pod, event and summary of the run: a quarter of a second at 2,000 episodes) and joining idle
    log readers is all a normal exit would add."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can be said on it
    os._exit(status)


def dry_run_listing(request: RunRequest) -> dict:
    """`run --dry-run`: the objects a run would create, as one v1 List; nothing is touched."""
    worker_source, builtin = load_worker(request)
    run_id = secrets.token_hex(6)
    namespace = request.namespace or NAMESPACE_PREFIX + run_id
    settings = run_settings(request, worker_source, builtin, None, namespace, run_id)
    origin = run_origin(run_id, request.output, USER_UNKNOWN_BEFORE_RUN, settings.ttl_seconds)
    return list_manifest(
        planned_objects(namespace, run_id, settings, worker_source, request.tasks or (), origin)
    )


def run_settings(
    request: RunRequest,
    worker_source: str,
    builtin: bool,
    context: str | None,
    namespace: str,
    run_id: str = "",
) -> Settings:
    """The run's settings, made once from its request, program, context (none: --dry-run), namespace."""
    rollout, tasks = request.rollout, request.tasks or ()
    suffix = run_suffix(run_id) if request.namespace else ""
    batches = batch_names(request.rounds, request.warmup, suffix)
    image_map = parse_image_map(request.image_map)
    # Rewritten once, here: every later use of an image takes the rewritten reference.
    image = rewrite_image(request.image, image_map)
    groups = image_groups(tasks, request.count, request.group_size, image, image_map)
    return Settings(
        version=__version__,
        count=request.count,
        parallelism=request.parallelism,
        image=image,
        runtime=request.runtime,
        timeout=request.timeout or default_timeout(request.count, request.parallelism),
        rounds=request.rounds,
        warmup=request.warmup,
        harden=request.harden,
        builtin=builtin,
        episode_script=request.episode_script,
        chunk_size=request.chunk_size,
        episode_script_sha256=None
        if builtin
        else hashlib.sha256(worker_source.encode("utf-8")).hexdigest(),
        ttl_seconds=request.ttl,
        rollout=rollout,
        # The rollout options are recorded (and read) only for a rollout batch.
        tasks_file=request.tasks_file if rollout else None,
        group_size=request.group_size if rollout else 1,
        retries=request.retries if rollout else None,
        allow_failures=request.allow_failures if rollout else None,
        task_ids=tuple(task.task_id for task in tasks) if rollout and tasks else None,
        need=request.need,
        need_groups=request.need_groups,
        episode_timeout=request.episode_timeout,
        context=context,
        namespace=namespace,
        batches=batch_entries(batches, len(groups), suffix),
        image_map=image_map,
        pull_timeout=request.pull_timeout,
        prepull=request.prepull,
        task_images=tuple(task_images(tasks, image, image_map)) if rollout and tasks else None,
        shared_namespace=request.namespace is not None,
        queue=request.queue,
        pod=shared_secrets(
            resolve_egress(episode_pod(request), request.spelling),  # each HOST resolved once
            request.namespace,
        ),
    )


def shared_secrets(pod: EpisodePod, namespace: str | None) -> EpisodePod:
    """With --namespace, a bare --env-from-secret NAME is that namespace's Secret, as a user given
    the namespace means it (the context's namespace otherwise)."""
    if namespace is None:
        return pod
    return pod._replace(
        secrets=tuple(s if s.namespace else s._replace(namespace=namespace) for s in pod.secrets)
    )


def batch_entries(
    batches: Sequence[tuple[str, bool]], images: int, suffix: str
) -> tuple[BatchEntry, ...]:
    """run.json's batches: each Job's name, and its directory (named without the run's suffix)."""
    return tuple(
        BatchEntry(
            name,
            measured,
            name[: len(name) - len(suffix)] if len(batches) > 1 else ".",
            tuple(image_job_name(name, n) for n in range(1, images + 1)) if images > 1 else (),
        )
        for name, measured in batches
    )


def start_run(request: RunRequest, caller: Caller, worker_source: str, builtin: bool) -> RunContext:
    """Claim the output directory and name the context, run id and namespace; nothing in the cluster changes."""
    output, spelling = request.output, request.spelling
    if os.path.lexists(output):
        raise DemoError(
            f"output directory {output} already exists; records are never overwritten, "
            f"choose a new {spelling.name('output')}"
        )
    # A Python caller runs step after step in one process: its requests go through the
    # process's one proxy, started once (a kubectl process per request cost most of a step).
    kind = ProxiedKubectl if spelling.python else Kubectl
    kubectl = kind(find_kubectl(request.kubectl, spelling), verbose=request.verbose)
    kubectl.context = resolve_context(kubectl, request.context, spelling)
    try:
        os.makedirs(output)
    except OSError as error:
        raise DemoError(
            f"cannot create output directory {output}: {error.strerror or error}"
        ) from None
    run_id = secrets.token_hex(6)
    namespace = request.namespace or NAMESPACE_PREFIX + run_id
    settings = run_settings(request, worker_source, builtin, kubectl.context, namespace, run_id)
    run = RunContext(
        settings,
        plan_run(namespace, run_id, settings, worker_source, request.tasks or ()),
        Receipt.start(
            output,
            kubectl.context,
            namespace,
            run_id,
            kubeconfig_path(),
            shared=settings.shared_namespace,
        ),
        kubectl,
        output,
        Progress(request.quiet),
        concurrent.futures.ThreadPoolExecutor(LOG_READERS),
        cpu_seconds(),
        proxy=shared_proxy(kubectl) if spelling.python else None,
        silent=request.quiet and spelling.python,
        spelling=spelling,
        on_reward=caller.on_reward,
        stop=caller.stop,
        owns_process=not spelling.python,
        detach=request.detach,
    )
    return run


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM interrupts as Ctrl-C does, so a stopped run saves its evidence, and neither lands inside
    a fork (InterruptsAcrossForks; main thread only: no other thread may set a signal handler)."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = (
        {
            signum: signal.signal(signum, INTERRUPTS.handle)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        if main_thread
        else {}
    )
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def interrupted(
    run: RunContext, clean_up: bool, cleanup_hint: str, why: str = "Interrupted."
) -> None:
    """After Ctrl-C or SIGTERM (or stream_batch closed, or an on_reward callback that raised): stop
    the batch's pods and salvage what is quick to save; then clean up if asked, else say how to."""
    run.progress.finish()
    suspended: list[str] = []
    try:
        suspended = salvage(run)
    except (KeyboardInterrupt, DemoError):
        pass
    not_cleaned = None
    if clean_up and run.touched_cluster:
        not_cleaned = cleanup_after_interrupt(run)
    print(
        interruption_message(run, why, suspended, clean_up, not_cleaned, cleanup_hint),
        file=sys.stderr,
    )


def cleanup_after_interrupt(run: RunContext) -> str | None:
    """`--cleanup` after an interruption: None once the namespace is gone, else why it is not."""
    report = io.StringIO() if run.silent else sys.stderr
    try:
        cleaned_up(run, report)
    except DemoError as error:
        return str(error)
    except KeyboardInterrupt:
        return "interrupted again"
    return None


def interruption_message(
    run: RunContext,
    why: str,
    suspended: Sequence[str],
    clean_up: bool,
    not_cleaned: str | None,
    cleanup_hint: str,
) -> str:
    """What an interrupted run says on stderr: why it stopped, what became of its pods, where its
    evidence is, and how to clean up (or that it did)."""
    lines = [f"{why} Evidence saved in {run.output}; receipt.json names namespace {run.namespace}."]
    if suspended:
        lines.append(
            f"Suspended Job {', '.join(suspended)}: its running pods were stopped and no more "
            "start; its ended pods and their logs stay."
        )
    elif run.receipt.fields.get("jobs") and (
        run.batch is None or run.batch.follower.state.end is None
    ):
        # Ctrl-C can read as "stop the batch": say so when the Job could not be stopped.
        lines.append(
            "The Job was not stopped: it runs on in the cluster, its namespace with it, until you "
            "clean up."
        )
    if clean_up and run.touched_cluster and not_cleaned is None:
        lines.append(f"Deleted test namespace: {run.namespace} ({run.spelling.switch('cleanup')}).")
    elif run.touched_cluster:
        if not_cleaned is not None:
            lines.append(f"{run.spelling.switch('cleanup')} failed: {not_cleaned}")
        if run.receipt.fields.get("jobs"):
            lines.append(f"Attach with: {attach_command(run.output, run.kubectl.binary)}")
        lines.append(f"Clean up with: {cleanup_hint}")
    return "\n".join(lines)


def print_results(results: dict, quiet: bool, path: str) -> None:
    """The results' summary (printed_results) on stdout, with `path`, the results.json that holds
    them all; the phase tables and throughput beside the progress on stderr."""
    print(json.dumps(printed_results(results, path), indent=2))
    if not quiet:
        print(phase_tables(results), file=sys.stderr)
        print(throughput_line(results["throughput"]), file=sys.stderr)
    warn_clocks(results)


def finish_run(
    run: RunContext, failure: DemoError | None, clean_up: bool, quiet: bool, cleanup_hint: str
) -> None:
    """`--cleanup` if asked, then one error naming why the run failed, its evidence and what to clean up."""
    if clean_up and run.touched_cluster:
        # stdout carries only the results; what cleanup says goes with the progress.
        report = io.StringIO() if run.silent else sys.stderr
        cleanup = run.spelling.switch("cleanup")
        print(f"Cleaning up ({cleanup}) after {'a failed' if failure else 'the'} run.", file=report)
        try:
            cleaned_up(run, report)
        except DemoError as error:
            # Never let a failed cleanup hide why the run failed or where its evidence is.
            why = (
                f"{failure}\n  evidence: {run.output}\n  {cleanup} failed too: " if failure else ""
            )
            raise DemoError(f"{why}{error}\n  clean up: {cleanup_hint}") from None
    if failure is not None:
        if not run.touched_cluster and release_output(run.output):
            raise DemoError(
                f"{failure}\n  {run.output} was removed again, so the same "
                f"{run.spelling.name('output')} can be reused"
            )
        if run.touched_cluster and not clean_up:
            raise DemoError(f"{failure}\n  evidence: {run.output}\n  clean up: {cleanup_hint}")
        raise DemoError(f"{failure}\n  evidence: {run.output}")
    if run.touched_cluster and not clean_up and not quiet:
        print(
            f"{stays(run)} for inspection; clean up with: {cleanup_hint}",
            file=sys.stderr,
        )


def stays(run: RunContext) -> str:
    """What a run leaves in the cluster for inspection: its namespace, or its objects in one it shares."""
    if run.receipt.shared:
        return f"The run's objects in namespace {run.namespace} stay"
    return f"The namespace {run.namespace} stays"


def release_output(output: str) -> bool:
    """Remove a run's directory that holds nothing but its receipt and settings: a run
    that created nothing in the cluster has nothing to trace, and its name stays free."""
    try:
        names = os.listdir(output)
        if RECEIPT_FILE not in names or not set(names) <= {RECEIPT_FILE, SETTINGS_FILE}:
            return False
        for name in names:
            os.remove(os.path.join(output, name))
        os.rmdir(output)
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------
# src/rl_batch_demo/pool.py: The `pool` action and open_pool(): live sandboxes from a warm pool on a plain Job, claimed by a

Result = TypeVar("Result")
# Claims wait this long by default for a sandbox to turn warm.
CLAIM_TIMEOUT_SECONDS = 300.0


@dataclasses.dataclass
class PoolRecords:
    """rewards.jsonl and commands.jsonl, a line each as it is known, from any thread."""

    output: str
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    rewards: list[dict] = dataclasses.field(default_factory=list)
    commands: list[dict] = dataclasses.field(default_factory=list)

    def command(self, line: dict) -> None:
        with self.lock:
            self.commands.append(line)
            with open(os.path.join(self.output, COMMANDS_FILE), "a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")

    def reward(self, line: dict) -> None:
        with self.lock:
            self.rewards.append(line)
            with open(os.path.join(self.output, REWARDS_FILE), "a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")


def pool_images(
    tasks: Sequence[Task], default: str, image_map: Sequence[tuple[str, str]]
) -> list[str]:
    """The images the pool serves, each once, in the tasks' order: a Job each. Any one may
    serve all the episodes; the pool hands out no more than its episodes in all."""
    images = [rewrite_image(task.image or default, image_map) for task in tasks] or [
        rewrite_image(default, image_map)
    ]
    return list(dict.fromkeys(images))


def pool_plan(run: RunContext, shape: PoolShape, token: str, tasks: Sequence[Task]) -> RunPlan:
    """Every object a pool creates: its namespace, the token's Secret, the server's ConfigMap, a
    Job per image (the pool's size shared between them as the episodes are). In a namespace it
    shares (--namespace): no namespace, each object named with the run's suffix and labelled
    with its id; with --queue, each Job carries Kueue's queue label."""
    settings, namespace, run_id = run.settings, run.namespace, run.receipt.run_id
    setup = [pool_network_policy_manifest(namespace)] if shape.harden else []
    if not settings.shared_namespace:  # a Secret of the shared namespace is read where it is
        setup += [secret_copy_manifest(namespace, source) for source in settings.pod.secrets]
    setup += [
        token_secret_manifest(namespace, token),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME, "namespace": namespace},
            "data": {SERVER_KEY: SERVER_SOURCE},
        },
    ]
    images = pool_images(tasks, settings.image, settings.image_map)
    sizes = parallelism_shares(settings.parallelism, [settings.count] * len(images))
    suffix = run_suffix(run_id) if settings.shared_namespace else ""
    jobs = [
        pool_job_manifest(
            namespace,
            (POOL_JOB_NAME if len(images) == 1 else f"{POOL_JOB_NAME}-{number}") + suffix,
            size,
            settings.count,
            image,
            shape,
            settings.pod,
        )
        for number, (image, size) in enumerate(zip(images, sizes))
    ]
    if settings.shared_namespace:
        shared = shared_jobs({POOL_JOB_NAME: jobs}, setup, run_id, None, None, settings.queue)
        for job in shared[POOL_JOB_NAME]:
            rename_token_volume(job, TOKEN_SECRET + suffix)
        return RunPlan(None, shared_setup(setup, run_id), shared)
    if settings.queue:
        jobs = [queued_job(job, settings.queue) for job in jobs]
    return RunPlan(
        namespace_manifest(namespace, run_id, shape.harden),
        setup,
        {POOL_JOB_NAME: jobs},
    )


def rename_token_volume(job: dict, secret: str) -> None:
    """A pool Job's token volume, pointed at the token's Secret by its name in a shared namespace."""
    for volume in job["spec"]["template"]["spec"]["volumes"]:
        if (volume.get("secret") or {}).get("secretName") == TOKEN_SECRET:
            volume["secret"]["secretName"] = secret


# The sandbox server's own environment, set by the tool or read by the server: --env may not
# replace it.
SERVER_ENV = (
    "POD_IP",
    "SANDBOX_PORT",
    "SANDBOX_IDLE_SECONDS",
    "SANDBOX_TOKEN_FILE",
    "SANDBOX_WORKSPACE",
    "SANDBOX_PRISTINE",
    "SANDBOX_OUTPUT_CAP_BYTES",
)


def check_pool_pod(request: RunRequest) -> None:
    """What a pool's sandboxes may be given beside the server: no --env of the server's own, no
    --allow-egress (a hardened pool lets nothing out), and in a shared namespace a Secret of that
    namespace (it is referenced where it is, not copied); UsageError says which."""
    spelling = request.spelling
    episode_pod(request)  # --cpu, --memory, --env, --env-from-secret as `run` checks them
    for text in request.env:
        key = text.partition("=")[0]
        if key in SERVER_ENV:
            raise UsageError(
                f"{spelling.name('env')}: {key} is set by the tool for the sandbox server"
            )
    if request.allow_egress:
        raise UsageError(f"{spelling.name('allow_egress')} is not a pool's setting")
    for text in request.env_from_secret if request.namespace else ():
        where, split, _name = text.rpartition("/")
        if split and where != request.namespace:
            raise UsageError(
                f"{spelling.setting('env_from_secret', text)}: with "
                f"{spelling.setting('namespace', request.namespace)} the pool reads a Secret of "
                f"that namespace where it is; give its name alone"
            )


class Pool:
    """A warm pool of live sandboxes: `claim()` hands out a sandbox whose server answers (waiting
    for one if none does), `close()` ends the pool and saves its records. Thread-safe: hundreds
    of claims may be in flight from one process; `aclaim()` is the same for asyncio."""

    def __init__(self, run: RunContext, shape: PoolShape, token: str) -> None:
        self.run, self.shape, self.token = run, shape, token
        self.records = PoolRecords(run.output)
        self.state = PoolState()
        self.jobs: dict[str, str] = {}  # image -> its Job's name
        self.images: dict[str, str] = {}  # Job's name -> its image
        self.claimed = 0  # episodes handed out that were not lost: at most the pool's episodes
        self.next_index = 0  # each claim's own index, never given twice
        self.first_claim: float | None = None
        self.opened_at = time.monotonic()
        self.closed_at: float | None = None
        self.refills: list[float] = []
        self.finished_at: dict[str, list[float]] = {}  # Job -> when its sandboxes were let go
        self.lock = threading.Lock()
        assert run.proxy is not None
        self.client = ProxyClient(run.proxy.socket_path, run.kubectl.echo)
        # A probe waits between its asks: a thread for each sandbox warming at once, up to 64.
        self.probes = concurrent.futures.ThreadPoolExecutor(
            max(8, min(64, run.settings.parallelism)), thread_name_prefix="rl-batch-demo probe"
        )
        self.watch: PodWatch | None = None
        self.results: dict = {}  # results.json with `rewards`, once closed
        self.cleanup = False  # delete the namespace once the records are saved
        self.stopped = threading.Event()  # set once the pool closes: its keep-alive ends
        self.telemetry = PoolTelemetry()  # its traces and pushed metrics, once it is open

    # -- the trainer's side ------------------------------------------------------------------

    def claim(self, task: dict | None = None, timeout: float | None = None) -> Sandbox:
        """A warm sandbox for `task` (its `image` picks the pool), held until finish(); waits up
        to `timeout` seconds for one (DemoError then, saying how many are ready, starting and
        pending, and why)."""
        asked = time.monotonic()
        job = self._job_for(task)
        deadline = asked + (CLAIM_TIMEOUT_SECONDS if timeout is None else timeout)
        with self.state.condition:
            view = self._wait_for_warm(job, deadline)
            if view is not None:
                index, self.next_index = self.next_index, self.next_index + 1
                self.claimed += 1
                self.first_claim = self.first_claim or asked
        if view is None:  # the Job's warnings are read with the lock let go
            queued = job_queued(self, job)
            if queued is not None:
                raise DemoError(
                    f"no sandbox became free in {time.monotonic() - asked:.0f} s: the pool's "
                    f"Job {job} is queued, not yet admitted by Kueue ({queued})"
                )
            raise claim_timeout(self.state, job, asked, job_warnings(self, job))
        waited = time.monotonic() - asked
        warm = view.warm_since is not None and view.warm_since <= asked
        return Sandbox(self, view, index, task, waited, warm)

    def _wait_for_warm(self, job: str, deadline: float) -> PodView | None:
        """With the state's lock held: a warm sandbox of `job`, taken; None past the deadline."""
        while True:
            if self.state.closed:
                raise DemoError("the pool is closed")
            if self.claimed >= self.run.settings.count:
                raise DemoError(f"the pool has served its {self.run.settings.count} episodes")
            view = self.state.take(job)
            if view is not None:
                return view
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.state.condition.wait(min(left, 1.0))

    async def aclaim(self, task: dict | None = None, timeout: float | None = None) -> Sandbox:
        return await in_thread(lambda: self.claim(task, timeout))

    def _job_for(self, task: dict | None) -> str:
        image = rewrite_image(
            (task or {}).get("image") or self.run.settings.image, self.run.settings.image_map
        )
        if image not in self.jobs:
            raise DemoError(
                f"no pool serves image {image!r}: the pool was opened for {sorted(self.jobs)}"
            )
        return self.jobs[image]

    # -- the pods' side ----------------------------------------------------------------------

    def probe(self, view: PodView) -> None:
        """Ask a pod that turned Running whether its server listens, until it does (then it is
        warm) or the pod is gone."""
        self.probes.submit(probe_until_warm, self, view.name)

    def released(self, view: PodView) -> None:
        """A sandbox of `view`'s Job let go: the next pod of the Job made after it refills it."""
        with self.lock:
            self.finished_at.setdefault(view.job, []).append(time.time())

    def request(
        self,
        pod: str,
        method: str,
        action: str,
        body: bytes | None,
        timeout: float,
        query: str = "",
    ) -> ProxyAnswer:
        """One request to a sandbox's server; SandboxLost when the pod cannot answer."""
        headers = {TOKEN_HEADER: self.token}
        if body is not None:
            headers["Content-Type"] = (
                "application/octet-stream" if action == "file" else "application/json"
            )
        path = sandbox_path(self.run.namespace, pod, action, query)
        try:
            answer = self.client.request(method, path, body, headers, timeout)
        except OSError as error:
            raise SandboxLost(
                pod, self.lost_reason(pod, f"{type(error).__name__}: {error}")
            ) from None
        except (http.client.HTTPException, ValueError) as error:  # the answer was cut off
            raise SandboxLost(
                pod, self.lost_reason(pod, f"{type(error).__name__}: {error}")
            ) from None
        if answer.from_api_server:
            raise SandboxLost(pod, self.lost_reason(pod, status_message(answer)))
        return answer

    def lost_reason(self, pod: str, said: str) -> str:
        """Why a pod could not answer: what the watch knows of it, else what the request said."""
        view = self.state.pods.get(pod)
        if view is not None and (view.deleted or not view.usable):
            return f"{view.reason}; {said}"
        return said

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> dict:
        """End the pool (its Jobs suspended, so no pod follows), save its records and results;
        the results, with `rewards`."""
        return close_pool(self)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        try:
            close_pool(self, kind is KeyboardInterrupt)
        finally:
            finish_pool_run(self)


class Sandbox:
    """One claimed sandbox: `run` its commands, `write_file` and `read_file` in its workspace,
    then `finish` it with the episode's reward. As a context manager, an episode left without
    finish() is finished as not valid (its exception named)."""

    def __init__(
        self, pool: Pool, view: PodView, index: int, task: dict | None, waited: float, warm: bool
    ) -> None:
        self.pool, self.view, self.index, self.task = pool, view, index, task
        self.pod = view.name
        self.claim_wait_seconds, self.warm = waited, warm
        self.claimed_at = time.time()  # this client's clock, for episodes.csv
        self.commands = 0
        self.command_seconds = 0.0
        self.finished = False
        self.lost: SandboxLost | None = None

    def run(
        self,
        command: str | Sequence[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
        retry: bool = False,
    ) -> CommandResult:
        """Run one command (an argv list, or a shell string) in the sandbox and return its result;
        CommandTimeout past `timeout` (it is killed, with all it started); SandboxLost if the pod
        went away. `retry=True` sends it again while the pod still runs when the request broke
        (the API server restarting): only for a command that may run twice, since the broken one
        may have run."""
        body = command_body(command, timeout, cwd, env, stdin)
        wait = (timeout or 0) + REQUEST_GRACE_SECONDS if timeout else 24 * 3600.0
        started = time.monotonic()
        answer = self._ask("POST", "run", body, wait, retry)
        round_trip = time.monotonic() - started
        if answer.status != 200:
            raise DemoError(
                f"sandbox {self.pod} refused the command ({answer.status}): {answer.body[:200]!r}"
            )
        told = json.loads(answer.body)
        result = CommandResult(
            told["exit_code"],
            told["stdout"],
            told["stderr"],
            told["seconds"],
            told["truncated"],
            told["timed_out"],
            round_trip,
        )
        self.commands += 1
        self.command_seconds += round_trip
        self.pool.records.command(command_line(self, command, result))
        if result.timed_out:
            raise CommandTimeout(
                f"{command_text(command)[:80]} ran past its timeout of {timeout} s "
                f"in sandbox {self.pod}, and was killed",
                result,
            )
        return result

    async def arun(self, command: str | Sequence[str], **options: Any) -> CommandResult:
        return await in_thread(lambda: self.run(command, **options))

    def write_file(self, path: str, data: str | bytes) -> None:
        """Write a file in the sandbox's workspace (a relative path is under it); binary-safe."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        answer = self._ask("PUT", "file", payload, REQUEST_GRACE_SECONDS, True, file_query(path))
        if answer.status != 200:
            raise DemoError(f"cannot write {path} in sandbox {self.pod}: {answer.body[:200]!r}")

    def read_file(self, path: str) -> bytes:
        """A file's bytes from the sandbox's workspace; FileNotFoundError if it has none."""
        answer = self._ask("GET", "file", None, REQUEST_GRACE_SECONDS, True, file_query(path))
        if answer.status == 404:
            raise FileNotFoundError(f"{path} in sandbox {self.pod}")
        if answer.status != 200:
            raise DemoError(f"cannot read {path} in sandbox {self.pod}: {answer.body[:200]!r}")
        return answer.body

    def finish(self, reward: float | None = None, valid: bool = True, info: Any = None) -> None:
        """The episode's end: its reward and whether a trainer may learn from it. The sandbox is
        let go (its pod ends and the Job makes a fresh one; with reuse, it is made pristine and
        serves the next claim)."""
        with self.pool.lock:
            if self.finished:
                return
            self.finished = True
            # Before the sandbox is let go: with reuse another claim may finish on it next.
            first_use, self.view.traced = self.view.traced == 0, self.view.traced + 1
        failure_class = "infrastructure" if self.lost else None
        given_back = False
        if self.lost is None:
            given_back = let_go(self)
        if not given_back:
            self.pool.released(self.view)
        if self.lost is not None:
            failure_class = "infrastructure"
            with self.pool.state.condition:
                self.pool.claimed -= 1  # a lost episode is served again on a fresh sandbox
            release_lost(self)
        line = episode_line(self, reward, valid and self.lost is None, info, failure_class)
        self.pool.records.reward(line)
        if self.pool.telemetry.tracer is not None:
            trace_finished(self, line, self.pool.telemetry.tracer, first_use)

    def _ask(
        self,
        method: str,
        action: str,
        body: bytes | None,
        timeout: float,
        retry: bool,
        query: str = "",
    ) -> ProxyAnswer:
        """One request; with `retry`, one that broke is sent again (backing off, for up to
        RETRY_SECONDS) while the watch still shows the pod usable: an API server restarting."""
        if self.lost is not None:
            raise self.lost
        deadline, pause = time.monotonic() + RETRY_SECONDS, 0.1
        while True:
            try:
                return self.pool.request(self.pod, method, action, body, timeout, query)
            except SandboxLost as error:
                usable = self.pool.state.pods[self.pod].usable and not self.pool.state.closed
                if not retry or not usable or time.monotonic() + pause > deadline:
                    self.lost = error
                    raise
            time.sleep(pause)
            pause = min(1.0, pause * 2)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if not self.finished:
            self.finish(
                None, valid=False, info=f"{kind.__name__}: {error}" if kind else "not finished"
            )


def episode_line(
    sandbox: Sandbox, reward: float | None, valid: bool, info: Any, failure_class: str | None
) -> dict:
    """rewards.jsonl's line for one episode of a pool."""
    task = sandbox.task or {}
    return {
        "index": sandbox.index,
        "task_id": task.get("id"),
        "group": None,
        "pod": sandbox.pod,
        "sandbox": sandbox.pod,
        "attempts": 1,
        "reward": reward,
        "valid": valid,
        "failure_class": failure_class,
        "failure": str(sandbox.lost) if sandbox.lost else None,
        "info": info,
        "image": sandbox.pool.images[sandbox.view.job],
        "claim_wait_seconds": rounded(sandbox.claim_wait_seconds, 6),
        "commands": sandbox.commands,
        "command_seconds": rounded(sandbox.command_seconds, 6),
        "warm": sandbox.warm,
        "claimed_at": rounded(sandbox.claimed_at, 6),
        "finished_at": rounded(time.time(), 6),
    }


def trace_finished(sandbox: Sandbox, line: dict, tracer: RunTracer, first_use: bool) -> None:
    """A finished episode's spans sent at once: its sandbox's start as the watch and the probe
    saw it (the same stamps pods.json holds at the close), when it is the sandbox's first."""
    view = sandbox.view
    trace_episode(tracer, pool_episode(line, watched_start(view), first_use, view.node or None))


def command_body(
    command: str | Sequence[str],
    timeout: float | None,
    cwd: str | None,
    env: dict[str, str] | None,
    stdin: str | bytes | None,
) -> bytes:
    """The sandbox server's /run request for one command."""
    spelled: dict[str, Any] = (
        {"shell": command} if isinstance(command, str) else {"argv": list(command)}
    )
    spelled.update(timeout=timeout, cwd=cwd, env=env or {}, stdin=encoded_stdin(stdin))
    return json.dumps(spelled).encode()


def command_line(sandbox: Sandbox, command: str | Sequence[str], result: CommandResult) -> dict:
    """commands.jsonl's line for one command."""
    return {
        "index": sandbox.index,
        "sandbox": sandbox.pod,
        "command": command_text(command)[:COMMAND_TEXT_MOST],
        "exit_code": result.exit_code,
        "server_seconds": rounded(result.seconds, 6),
        "round_trip_seconds": rounded(result.round_trip_seconds, 6),
        "timed_out": result.timed_out,
        "truncated": result.truncated,
    }


def let_go(sandbox: Sandbox) -> bool:
    """Let a sandbox go: made pristine and warm again (reuse), or ended, its Job making a fresh
    one. Whether it was given back; a reset that failed ends it instead (never handed out dirty)."""
    pool = sandbox.pool
    try:
        if pool.shape.reuse:
            answer = sandbox._ask("POST", "reset", b"{}", REQUEST_GRACE_SECONDS, True)
            if answer.status == 200:
                pool.state.give_back(sandbox.pod)
                return True
        sandbox._ask("POST", "finish", b"{}", REQUEST_GRACE_SECONDS, True)
    except SandboxLost:
        pass  # recorded on the sandbox
    return False


def release_lost(sandbox: Sandbox) -> None:
    """A sandbox lost to a passing error while its pod still runs: asked, once, to end, so that it
    holds no place of the pool's until its idle timeout."""
    view = sandbox.pool.state.pods.get(sandbox.pod)
    if view is not None and view.usable:
        try:
            sandbox.pool.request(sandbox.pod, "POST", "finish", b"{}", 5.0)
        except SandboxLost:
            pass  # gone indeed


def keep_alive(pool: Pool) -> None:
    """While the pool is open, ask each of its running sandboxes whether it listens a few times
    per idle timeout: a sandbox idles out only once its trainer has gone."""
    period = max(1.0, pool.shape.idle_timeout / 3)
    while not pool.stopped.wait(period):
        with pool.state.condition:
            names = [v.name for v in pool.state.pods.values() if v.usable and not v.probing]
        for name in names:
            try:
                pool.request(name, "GET", "ready", None, 5.0)
            except SandboxLost:
                pass  # the watch says why


def claim_timeout(
    state: PoolState, job: str, asked: float, job_warnings: Sequence[str] = ()
) -> DemoError:
    """A claim that waited in vain: how many of the Job's sandboxes are ready, held, starting and
    pending, and what the others' pods say (or, with no pod, what the Job's warnings say: a
    quota, an admission policy)."""
    counts = state.counts(job)
    why = "; ".join(state.waiting_reasons(job)[:3]) or "; ".join(job_warnings[-2:]) or "no pod yet"
    return DemoError(
        f"no sandbox became free in {time.monotonic() - asked:.0f} s: {counts['warm']} ready, "
        f"{counts['held']} held, {counts['starting']} starting, {counts['pending']} pending "
        f"({why})"
    )


def job_queued(pool: Pool, job: str) -> str | None:
    """What Kueue says of the pool's Job while it holds it suspended (--queue); None when the pool
    has no queue, the Job runs, or it cannot be read."""
    if not pool.run.settings.queue:
        return None
    try:
        live = proxy_json(pool, f"/apis/batch/v1/namespaces/{pool.run.namespace}/jobs/{job}")
    except (OSError, DemoError, http.client.HTTPException, ValueError):
        return None
    if not (live.get("spec") or {}).get("suspend") or pool.state.closed:
        return None
    return queue_word(pool.run.kubectl, pool.run.namespace, live)


def job_warnings(pool: Pool, job: str) -> list[str]:
    """The Job's own Warning events (FailedCreate: a quota, an admission policy), oldest first;
    none where they cannot be read."""
    query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.name={job}"})
    try:
        listed = proxy_json(pool, f"/api/v1/namespaces/{pool.run.namespace}/events?{query}")
    except (OSError, DemoError, http.client.HTTPException, ValueError):
        return []
    return [
        f"{event.get('reason')}: {event.get('message', '').strip()}"
        for event in listed.get("items") or []
        if event.get("type") == "Warning"
    ]


def probe_until_warm(pool: Pool, name: str) -> None:
    """Ask a pod's server whether it listens until it does (the pod is then warm, and refilled
    its Job if a sandbox of it was let go before) or the pod is no longer usable."""
    deadline = time.monotonic() + PROBE_MOST_SECONDS
    while time.monotonic() < deadline and not pool.state.closed:
        try:
            answer: ProxyAnswer | None = pool.request(name, "GET", "ready", None, 5.0)
        except SandboxLost:
            answer = None
        if answer is not None and answer.status == 200:
            pool.state.warmed(name, json.loads(answer.body)["ready_at"])
            note_refill(pool, name)
            return
        with pool.state.condition:
            view = pool.state.pods[name]
            if not view.usable:
                view.probing = False
                return
        time.sleep(PROBE_INTERVAL_SECONDS)
    with pool.state.condition:
        pool.state.pods[name].probing = False  # asked again at its next change


def note_refill(pool: Pool, name: str) -> None:
    """The seconds from the oldest sandbox of the pod's Job let go before the pod was made (its
    creation stamp, whole seconds) to this pod's answer; a pod of the pool's first fill refills
    nothing."""
    view = pool.state.pods[name]
    created = parse_time(view.created)
    with pool.lock:
        released = pool.finished_at.get(view.job) or []
        if released and created is not None and created >= int(released[0]):
            pool.refills.append(time.time() - released.pop(0))


def close_pool(pool: Pool, interrupted: bool = False) -> dict:
    """Close a pool once: its claims refused, its Jobs suspended, its watch and probes stopped,
    its evidence and results saved (`interrupted`: by Ctrl-C, which it says)."""
    with pool.state.condition:
        if pool.state.closed:
            return pool.results
        pool.state.closed = True
        pool.state.condition.notify_all()
    pool.stopped.set()
    pool.closed_at = time.monotonic()
    try:
        # While its sandboxes still run: their logs are there.
        pods = save_pool_evidence(pool, interrupted)
    finally:
        for name in pool.jobs.values():
            suspend_job(pool, name)
    if pool.watch is not None:
        pool.watch.stop()
    pool.probes.shutdown(wait=False, cancel_futures=True)
    points = sandbox_points(pool, pods)
    pool.results = pool_results(pool, points)
    write_text(
        os.path.join(pool.run.output, "episodes.csv"),
        pool_episodes_csv(pool.records.rewards, points),
    )
    write_json(os.path.join(pool.run.output, RESULTS_FILE), pool.results)
    pool_telemetry(pool, pool_episodes(pool.records.rewards, points))
    pool.results["rewards"] = list(pool.records.rewards)
    return pool.results


def pool_telemetry(pool: Pool, episodes: list[dict]) -> None:
    """metrics.prom and timeline.svg beside results.json; with --otlp-endpoint the pool's root
    span sent and `telemetry` recorded; with --pushgateway metrics.prom pushed. A failure to send
    or push is a warning."""
    run_id, telemetry = pool.run.receipt.run_id, pool.telemetry
    write_pool_metrics(pool.run.output, pool.results, episodes, run_id)
    settings = pool.run.settings
    title = (
        f"{plural(len(episodes), 'episode')} on a pool of {settings.parallelism} sandboxes, "
        f"runtime {settings.runtime}"
    )
    write_text(os.path.join(pool.run.output, "timeline.svg"), pool_timeline_svg(episodes, title))
    if telemetry.tracer is not None:
        telemetry.tracer.bounds.append(time.time())  # the root span ends as the pool closes
        finish_trace(telemetry.tracer, pool.run.output, pool.results, None, telemetry.quiet)
    if telemetry.pushgateway:
        push_saved_metrics(pool.run.output, telemetry.pushgateway, run_id)


def file_query(path: str) -> str:
    return urllib.parse.urlencode({"path": path})


def status_message(answer: ProxyAnswer) -> str:
    """A refusal in the words of whoever refused: a Status's message, or the proxy's own text."""
    try:
        said = str(json.loads(answer.body).get("message", ""))
    except (ValueError, AttributeError):
        said = answer.body[:200].decode("utf-8", "replace").strip()
    return f"{answer.status} {said}".strip()


async def in_thread(work: Callable[[], Result]) -> Result:
    """A blocking call off the event loop, on the loop's default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, work)


def suspend_job(pool: Pool, name: str) -> None:
    """Suspend one of the pool's Jobs: its pods are stopped and no new one is made."""
    path = f"/apis/batch/v1/namespaces/{pool.run.namespace}/jobs/{name}"
    body = json.dumps({"spec": {"suspend": True}}).encode()
    said = ""
    for _ in range(2):  # a broken connection once is no reason to leave the Job running
        try:
            answer = pool.client.request(
                "PATCH", path, body, {"Content-Type": "application/merge-patch+json"}, 30.0
            )
            said = "" if answer.status == 200 else status_message(answer)
            break
        except (OSError, http.client.HTTPException) as error:
            said = str(error) or type(error).__name__
    if said:
        print(
            f"Warning: could not suspend Job {name} ({said}); its sandboxes end at their idle "
            f"timeout, or with `cleanup`",
            file=sys.stderr,
        )
    elif pool.run.settings.queue:  # else Kueue resumes it, its Workload being admitted
        uid = pool.run.receipt.job_uids().get(name)
        stop_queued(pool.run.kubectl, pool.run.namespace, name, uid)


def proxy_json(pool: Pool, path: str) -> Any:
    answer = pool.client.request("GET", path, None, {}, 30.0)
    if answer.status != 200:
        raise DemoError(f"GET {path}: {answer.status}")
    return json.loads(answer.body)


def save_pool_evidence(pool: Pool, interrupted: bool = False) -> list[dict]:
    """job.json, pods.json, events.json and each pod's log, read through the proxy; the pods."""
    namespace, output = pool.run.namespace, pool.run.output
    # In a namespace the pool shares: its own Jobs and pods (its run label), their events.
    owned = (
        "?" + urllib.parse.urlencode({"labelSelector": f"{RUN_LABEL}={pool.run.receipt.run_id}"})
        if pool.run.settings.shared_namespace
        else ""
    )
    try:
        jobs = proxy_json(pool, f"/apis/batch/v1/namespaces/{namespace}/jobs{owned}")
        pods = proxy_json(pool, f"/api/v1/namespaces/{namespace}/pods{owned}")
        events = proxy_json(pool, f"/api/v1/namespaces/{namespace}/events")
    except (OSError, DemoError, http.client.HTTPException, ValueError) as error:
        print(f"Warning: the pool's evidence was not all saved: {error}", file=sys.stderr)
        return []
    if owned:
        names = {
            item["metadata"]["name"]
            for item in (jobs.get("items") or []) + (pods.get("items") or [])
        }
        events["items"] = [
            event
            for event in events.get("items") or []
            if (event.get("involvedObject") or {}).get("name") in names
        ]
    write_json(os.path.join(output, "job.json"), jobs)
    write_json(os.path.join(output, "pods.json"), pods)
    write_json(os.path.join(output, "events.json"), events)
    save_pod_logs(pool, [pod["metadata"]["name"] for pod in pods.get("items") or []], interrupted)
    return list(pods.get("items") or [])


def save_pod_logs(pool: Pool, names: Sequence[str], interrupted: bool) -> None:
    """Each pod's log as POD.log, LOG_READERS read at once. After Ctrl-C it says what it is doing,
    and a second Ctrl-C leaves the logs not yet read (the close goes on: Jobs, results, cleanup)."""
    if interrupted and names:
        print(
            f"Interrupted: saving the pool's evidence ({len(names)} pods' logs; Ctrl-C again "
            "to skip them)",
            file=sys.stderr,
            flush=True,
        )
    readers = concurrent.futures.ThreadPoolExecutor(LOG_READERS, "rl-batch-demo log")
    saved = 0
    try:
        # After Ctrl-C a read is bounded short: its thread is joined when the process exits.
        timeout = 5.0 if interrupted else 30.0
        texts = readers.map(lambda name: pod_log(pool, name, timeout), names)
        for name, text in zip(names, texts):
            write_text(os.path.join(pool.run.output, f"{name}.log"), text)
            saved += 1
    except KeyboardInterrupt:
        print(
            f"Warning: {len(names) - saved} of {len(names)} pods' logs not saved (interrupted)",
            file=sys.stderr,
            flush=True,
        )
    finally:
        readers.shutdown(wait=False, cancel_futures=True)


def pod_log(pool: Pool, name: str, timeout: float) -> str:
    """A pod's log through the proxy; empty when it has none (never started) or the read broke."""
    path = f"/api/v1/namespaces/{pool.run.namespace}/pods/{name}/log"
    try:
        answer = pool.client.request("GET", path, None, {}, timeout)
    except (OSError, http.client.HTTPException):
        return ""
    return answer.body.decode("utf-8", "replace") if answer.status == 200 else ""


POOL_EPISODE_COLUMNS = (
    ["index", "sandbox", "image", "reward", "warm", "commands", "command_seconds"]
    + [f"{name}_at" for name, _, _ in POOL_POINTS]
    + [f"{name}_precision_seconds" for name, _, _ in POOL_POINTS]
    + [f"{name}_source" for name, _, _ in POOL_POINTS]
    + ["server_start_seconds", "server_start_precision_seconds", "claim_wait_seconds"]
    + ["task_id", "failure_class", "failure", "valid"]
)


def pool_episodes_csv(rewards: Sequence[dict], sandboxes: Sequence[dict]) -> str:
    """episodes.csv of a pool: a row per episode (rewards.jsonl's lines, in index order) with its
    sandbox's start, `server_ready` and the phase `server_start` (container started to server
    listening, as precise as the container's start: whole seconds) among them."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(POOL_EPISODE_COLUMNS)
    started = {point["pod"]: point for point in sandboxes}
    for line in sorted(rewards, key=lambda line: line["index"]):
        point = started.get(line["sandbox"]) or {}
        at = {
            "pod_created": point.get("pod_created_at"),
            "container_started": point.get("container_started_at"),
            "server_ready": point.get("server_ready_at"),
            "claimed": line.get("claimed_at"),
            "finished": line.get("finished_at"),
        }
        writer.writerow(
            [line["index"], line["sandbox"], line["image"], line["reward"], line["warm"]]
            + [line["commands"], line["command_seconds"]]
            # At the microsecond, as a run's episodes.csv and the spans (telemetry.nanos) have it.
            + ["" if at[name] is None else f"{at[name]:.6f}" for name, _, _ in POOL_POINTS]
            + [precision for _, precision, _ in POOL_POINTS]
            + [source for _, _, source in POOL_POINTS]
            + [point.get("server_start_seconds"), WHOLE_SECOND, line["claim_wait_seconds"]]
            + [line.get("task_id"), line["failure_class"], line["failure"], line["valid"]]
        )
    return out.getvalue()


def distribution(values: list[float], quantiles: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    figures: dict[str, float | None] = {}
    for q in quantiles:
        figures[f"p{round(q * 100)}"] = rounded(percentile(ordered, q), 6) if ordered else None
    figures["max"] = rounded(ordered[-1], 6) if ordered else None
    return figures


def sandbox_points(pool: Pool, pods: list[dict]) -> list[dict]:
    """Each sandbox's start: its pod created and its container started (the pod's stamps, whole
    seconds, as pods.json holds them, or as the watch last saw a pod gone before the close) and
    its server listening (`server_ready`, the server's own clock)."""
    points = []
    for pod in pods:
        name = pod["metadata"]["name"]
        view = pool.state.pods.get(name)
        stamp = (pod.get("metadata") or {}).get("creationTimestamp")
        created = parse_time(stamp) if stamp else None
        ready = view.ready_at if view is not None else None
        points.append(sandbox_start(name, created, container_started(pod), ready))
    listed = {point["pod"] for point in points}
    with pool.state.condition:
        gone = [view for name, view in pool.state.pods.items() if name not in listed]
    return points + [watched_start(view) for view in gone]


def watched_start(view: PodView) -> dict:
    """A sandbox's start as the watch and its probe saw it."""
    created = parse_time(view.created) if view.created else None
    return sandbox_start(view.name, created, view.started_at, view.ready_at)


def pool_results(pool: Pool, sandboxes: list[dict]) -> dict:
    """results.json of a pool: its episodes and rewards, the `pool` block of its figures, and
    each sandbox's start."""
    rewards, commands = pool.records.rewards, pool.records.commands
    waits = [line["claim_wait_seconds"] for line in rewards]
    round_trips = [line["round_trip_seconds"] for line in commands]
    empty = [line["round_trip_seconds"] for line in commands if line["command"] in ("true", ":")]
    active = (pool.closed_at or time.monotonic()) - (pool.first_claim or pool.opened_at)
    warm = [line for line in rewards if line.get("warm")]
    settings = pool.run.settings
    return {
        "episodes": len(rewards),
        "successful_episodes": sum(1 for line in rewards if line["valid"] and line["reward"]),
        "reward_sum": sum(line["reward"] or 0 for line in rewards if line["valid"]),
        "namespace": pool.run.namespace,
        "context": pool.run.kubectl.context,
        "image": settings.image,
        "runtime": settings.runtime,
        "prepull": pool.run.prepull,
        "pool": {
            "size": settings.parallelism,
            "episodes": settings.count,
            "reused": pool.shape.reuse,
            "claim_wait_seconds": {
                **distribution(waits, (0.5, 0.95, 0.99)),
                "warm_share": rounded(len(warm) / len(rewards), 3) if rewards else None,
            },
            "round_trip_seconds": distribution(round_trips, (0.5, 0.95, 0.99)),
            "empty_command_round_trip_seconds": {
                k: v for k, v in distribution(empty, (0.5, 0.99)).items() if k != "max"
            },
            "commands_per_second": rounded(len(commands) / active, 3) if active > 0 else None,
            "server_start_seconds": {
                **{
                    k: v
                    for k, v in distribution(
                        [
                            p["server_start_seconds"]
                            for p in sandboxes
                            if p["server_start_seconds"] is not None
                        ],
                        (0.5, 0.95),
                    ).items()
                },
                "precision_seconds": WHOLE_SECOND,
            },
            "pod_to_ready_seconds": {
                **distribution(pod_to_ready(sandboxes), (0.5, 0.95)),
                "precision_seconds": WHOLE_SECOND,
            },
            "refill_seconds": {
                k: v for k, v in distribution(pool.refills, (0.5, 0.95)).items() if k != "max"
            },
        },
        "sandboxes": sandboxes,
    }


def open_pool_run(request: RunRequest, caller: Caller, shape: PoolShape) -> Pool:
    """Create the pool as `run` creates a batch (the receipt first, every UID recorded), and
    start following its pods; the pool, its sandboxes warming."""
    run = start_run(request, caller, SERVER_SOURCE, False)
    token = secrets.token_hex(32)
    run.plan = pool_plan(run, shape, token, request.tasks or ())
    pool: Pool | None = None
    try:
        save_run_records(run)
        check_runtime_class(run)
        open_proxy(run)
        if run.proxy is None:
            raise DemoError(
                "a pool talks to its sandboxes through `kubectl proxy`, which did not start; "
                "nothing was created"
            )
        pool = Pool(run, shape, token)
        check_pool_access(pool)
        make_pool_setup(run)
        pool.cleanup = request.cleanup
        if run.settings.prepull:
            prepull(run)  # the images present on the nodes before any sandbox waits for one
        jobs = run.plan.jobs[POOL_JOB_NAME]
        pool.watch = PodWatch(
            pool.client.socket_path,
            run.namespace,
            [j["metadata"]["name"] for j in jobs],
            pool.state,
            pool.probe,
        )
        pool.watch.start()
        threading.Thread(
            target=keep_alive, args=(pool,), name="rl-batch-demo keep-alive", daemon=True
        ).start()
        for job in jobs:
            created = create_object(run, job)
            run.receipt.record_job(job["metadata"]["name"], created["metadata"]["uid"])
            image = job["spec"]["template"]["spec"]["containers"][0]["image"]
            pool.jobs[image] = job["metadata"]["name"]
            pool.images[job["metadata"]["name"]] = image
        tracer = open_tracer(request.otlp_endpoint, run.receipt.run_id, kind="pool")
        if tracer is not None:
            tracer.bounds.append(time.time())  # the root span begins as the pool opens
        pool.telemetry = PoolTelemetry(tracer, request.pushgateway, request.quiet)
        return pool
    except BaseException:
        if pool is not None:
            for job in run.receipt.fields.get("jobs") or {}:  # those created: none runs on
                suspend_job(pool, job)
            if pool.watch is not None:
                pool.watch.stop()
            pool.cleanup = request.cleanup
            finish_pool_run(pool)
        else:
            close(run)
        raise


def make_pool_setup(run: RunContext) -> None:
    """Every check `run` makes before creating anything (a shared namespace's access, the queue's
    quota or the nodes' capacity, the Secrets), then the namespace and the pool's setup objects;
    in a shared namespace each object's UID is in the receipt before the next is made."""
    check_shared_namespace(run)
    if run.settings.queue:
        check_queue(run, "size")  # the queue's quota, not the nodes, holds the pool
    else:
        check_capacity(run)
    secrets_read = read_pool_secrets(run)
    stamp_origin(run)
    create_namespace(run)
    try:
        for manifest in run.plan.setup:
            created = create_object(run, filled(manifest, secrets_read))
            if run.receipt.shared:
                metadata = created["metadata"]
                run.receipt.record_object(manifest["kind"], metadata["name"], metadata["uid"])
    finally:
        secrets_read.clear()  # on a failure too: no traceback's frame keeps the values


def read_pool_secrets(run: RunContext) -> ReadSecrets:
    """--env-from-secret before anything is made: each Secret read to be copied into the pool's
    own namespace; in a namespace the pool shares, each found there (nothing to copy)."""
    if not run.settings.shared_namespace:
        return read_secrets(run)
    for source in run.settings.pod.secrets:
        read_secret(run, source._replace(namespace=run.namespace))
    return {}


# What a pool needs beyond a run: its token's Secret, its Jobs suspended at the end, and every
# request to a sandbox (GET /ready and files, POST commands, PUT files) through the pod proxy.
POOL_ACCESS = (
    ("create", "secrets", ""),
    ("patch", "jobs", ""),
    ("get", "pods", "proxy"),
    ("create", "pods", "proxy"),
    ("update", "pods", "proxy"),
)


def check_pool_access(pool: Pool) -> None:
    """Ask the API server (SelfSubjectAccessReview, through the proxy) whether this account may do
    what a pool does, and refuse plainly before anything is created when it may not; a server
    that does not answer such reviews is not asked again."""
    lacking = []
    for verb, resource, subresource in POOL_ACCESS:
        attributes = {"namespace": pool.run.namespace, "verb": verb, "resource": resource}
        if resource == "jobs":
            attributes["group"] = "batch"
        if subresource:
            attributes["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        answer = pool.client.request(
            "POST", path, json.dumps(review).encode(), {"Content-Type": "application/json"}, 30.0
        )
        if answer.status not in (200, 201):
            return  # no reviews here: the requests themselves will say what is refused
        if not (json.loads(answer.body).get("status") or {}).get("allowed"):
            lacking.append(
                f"{verb} {resource}/{subresource}" if subresource else f"{verb} {resource}"
            )
    if lacking:
        raise DemoError(
            f"a pool needs {', '.join(lacking)} in its namespace, which this account may not do "
            "(see the role in docs/operations.md); nothing was created"
        )


def finish_pool_run(pool: Pool) -> None:
    """The proxy and the run's handles closed; the namespace deleted when asked (the files stay)."""
    run = pool.run
    close(run)
    if pool.cleanup:
        try:
            with open(os.devnull, "w") as unheard:
                cleanup_namespace(
                    run.kubectl, run.receipt, report=unheard if run.silent else sys.stderr
                )
        except (DemoError, KubectlError) as error:
            print(f"Warning: cleanup failed: {error}", file=sys.stderr)


# The guide's episode as a trainer's turns: the buggy program and its tests written, the tests
# run (they fail), the fix applied, the tests run again; the reward is whether they passed.
GUIDE_BUGGY = "def shipping(total):\n    if total > 99:\n        return 0\n    return 10\n"
GUIDE_FIXED = GUIDE_BUGGY.replace("total > 99", "total >= 99")
GUIDE_TESTS = """import unittest

from shipping import shipping


class ShippingTest(unittest.TestCase):
    def test_under_threshold_pays(self):
        self.assertEqual(shipping(98), 10)

    def test_threshold_ships_free(self):
        self.assertEqual(shipping(99), 0)

    def test_over_threshold_ships_free(self):
        self.assertEqual(shipping(100), 0)


if __name__ == "__main__":
    unittest.main()
"""
GUIDE_TURNS: tuple[dict, ...] = (
    {"write": "shipping.py", "text": GUIDE_BUGGY},
    {"write": "test_shipping.py", "text": GUIDE_TESTS},
    {"run": ["python", "-B", "test_shipping.py"], "timeout": 20},
    {"write": "shipping.py", "text": GUIDE_FIXED},
    {"run": ["python", "-B", "test_shipping.py"], "timeout": 20},
)


def read_turns(path: str) -> tuple[dict, ...]:
    """--turns FILE: one JSON object a line, each a turn: {"write": PATH, "text": TEXT},
    {"run": [ARGV...]} or {"shell": "COMMAND"}, either with an optional "timeout" (seconds)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [(number, line) for number, line in enumerate(file, 1) if line.strip()]
    except OSError as error:
        raise UsageError(f"--turns {path}: {error.strerror or error}") from None
    turns = []
    for number, line in lines:
        try:
            turn = json.loads(line)
        except ValueError as error:
            raise UsageError(f"--turns {path}, line {number}: not JSON ({error})") from None
        if not isinstance(turn, dict) or not ({"write", "run", "shell"} & set(turn)):
            raise UsageError(f"--turns {path}, line {number}: give write, run or shell")
        turns.append(turn)
    if not turns:
        raise UsageError(f"--turns {path} holds no turn")
    return tuple(turns)


def play_turns(sandbox: Sandbox, turns: Sequence[dict]) -> float:
    """Drive one sandbox through the turns; the reward: 1 if the last command exited 0, else 0."""
    last: int | None = None
    for turn in turns:
        if "write" in turn:
            sandbox.write_file(turn["write"], turn.get("text", ""))
            continue
        command = turn["shell"] if "shell" in turn else turn["run"]
        try:
            last = sandbox.run(command, timeout=turn.get("timeout")).exit_code
        except CommandTimeout:
            last = None
    return 1.0 if last == 0 else 0.0


def serve_episodes(pool: Pool, turns: Sequence[dict], tasks: Sequence[Task]) -> None:
    """Every episode of the pool, `size` at a time, each on a sandbox claimed for it."""
    episodes, size = pool.run.settings.count, pool.run.settings.parallelism
    task_dicts = [json.loads(task.text) for task in tasks]
    attempts = 1 + (pool.run.settings.retries or 0)

    def episode(number: int) -> None:
        task = task_dicts[number % len(task_dicts)] if task_dicts else None
        for _attempt in range(attempts):  # a sandbox lost to the cluster, replaced (--retries)
            with pool.claim(task) as sandbox:
                try:
                    sandbox.finish(play_turns(sandbox, turns))
                    return
                except SandboxLost:
                    sandbox.finish(None, valid=False)

    workers = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="rl-batch-demo turns")
    try:
        for done in concurrent.futures.as_completed(
            [workers.submit(episode, n) for n in range(episodes)]
        ):
            done.result()
    except BaseException as error:
        # The claims waiting end at once; Ctrl-C does not wait for the episodes.
        close_pool(pool, isinstance(error, KeyboardInterrupt))
        raise
    finally:
        workers.shutdown(wait=False, cancel_futures=True)


def pool_request(
    output: str,
    size: int,
    episodes: int,
    tasks: Sequence[Task] | None,
    options: dict[str, Any],
    spelling: Spelling,
) -> RunRequest:
    """A pool's settings as the request a run takes: `episodes` is its count, `size` its
    parallelism; `options` are the run settings a pool shares (image, image_map, runtime,
    context, kubectl, harden, prepull, cleanup, ttl, quiet, verbose, namespace, queue, cpu,
    memory, env, env_from_secret, otlp_endpoint, pushgateway)."""
    request = RunRequest(
        output=output,
        count=episodes,
        parallelism=min(size, episodes),
        image=options.get("image") or DEFAULT_IMAGE,
        image_map=tuple(options.get("image_map") or ()),
        runtime=options.get("runtime") or DEFAULT_RUNTIME,
        context=options.get("context"),
        kubectl=options.get("kubectl") or "kubectl",
        timeout=None,
        max_episodes=episodes,
        chunk_size=LIST_PAGE_SIZE,
        rounds=1,
        warmup=False,
        episode_script=None,
        tasks_file=None,
        tasks=None if tasks is None else tuple(tasks),
        group_size=1,
        retries=options.get("retries"),
        allow_failures=None,
        need=None,
        episode_timeout=None,
        prepull=bool(options.get("prepull")),
        pull_timeout=None,
        dry_run=False,
        harden=bool(options.get("harden")),
        cleanup=bool(options.get("cleanup")),
        ttl=options.get("ttl"),
        quiet=bool(options.get("quiet")),
        verbose=bool(options.get("verbose")),
        rollout=True,
        spelling=spelling,
        namespace=options.get("namespace"),
        queue=options.get("queue"),
        cpu=options.get("cpu"),
        memory=options.get("memory"),
        env=tuple(options.get("env") or ()),
        env_from_secret=tuple(options.get("env_from_secret") or ()),
        otlp_endpoint=options.get("otlp_endpoint"),
        pushgateway=options.get("pushgateway"),
    )
    check_pool_pod(request)
    return request


def run_pool(request: RunRequest, shape: PoolShape, turns: Sequence[dict]) -> int:
    """`pool`: open the pool, play every episode's turns on its sandboxes, close it, and say
    how it went; exit status 0, or 1 when an episode was lost to the cluster (past its --retries)."""
    hint = f"Clean up with: {cleanup_command(request.output, request.kubectl)}"
    try:
        with open_pool_run(request, Caller(), shape) as pool:
            if not request.quiet:
                print(
                    f"Pool: {request.parallelism} sandboxes for {request.count} episodes",
                    file=sys.stderr,
                )
            serve_episodes(pool, turns, request.tasks or ())
    except KeyboardInterrupt:
        if not request.cleanup:
            print(hint, file=sys.stderr)
        raise
    figures = pool.results
    print(pool_summary(figures, request.output))
    if not request.cleanup:
        print(hint, file=sys.stderr)
    # A loss played again (--retries) on a fresh sandbox is no episode lost.
    kept = sum(1 for line in figures["rewards"] if line["failure_class"] != "infrastructure")
    return 0 if kept >= request.count else 1


def pool_summary(figures: dict, output: str) -> str:
    """What `pool` prints: its episodes, its rewards, the figures a trainer waits on."""
    block = figures["pool"]
    claim, trip = block["claim_wait_seconds"], block["round_trip_seconds"]
    return "\n".join(
        [
            f"Episodes: {figures['episodes']}, rewards {figures['reward_sum']}, "
            f"successful {figures['successful_episodes']}",
            f"Claim wait p50/p99: {seconds_text(claim['p50'])} / {seconds_text(claim['p99'])} "
            f"(warm share {claim['warm_share']})",
            f"Round trip p50/p99: {seconds_text(trip['p50'])} / {seconds_text(trip['p99'])}, "
            f"{block['commands_per_second']} commands/s",
            f"Results: {os.path.join(output, RESULTS_FILE)}",
        ]
    )


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


# --------------------------------------------------------------------------
# src/rl_batch_demo/report.py: `report` and `compare`: saved files only, no cluster.

class SavedBatch(NamedTuple):
    """What a batch's directory holds, as its summary reads it."""

    job: dict
    pods: list[dict]
    events: list[EventRecord]
    logs: dict[str, str]  # pod name -> its log
    client: dict  # client.json; empty when the run saved none


def load_saved_batch(directory: str, entry: BatchEntry, settings: Settings) -> BatchOutcome:
    """Recompute one batch's summary from its saved files."""
    saved = read_saved_batch(directory, entry)
    check_saved_job_finished(saved, settings)
    observed_path = os.path.join(directory, "observed.json")
    observed = read_json(observed_path, "observed.json") if os.path.exists(observed_path) else {}
    if settings.rollout:
        summary = saved_rollout_summary(saved, settings, observed)
    else:
        summary = summarise_batch(
            saved.job,
            saved.pods,
            saved.logs,
            saved.events,
            settings.count,
            settings.builtin,
            saved.client.get("observed_at"),
            observed,
        )
    return BatchOutcome(entry, summary, saved.client or None)


def read_saved_batch(directory: str, entry: BatchEntry) -> SavedBatch:
    """The batch's Job, pods, events, logs and client.json; DemoError when it saved no job.json."""
    job_path = os.path.join(directory, "job.json")
    if not os.path.exists(job_path):
        raise DemoError(
            f"no job.json in {directory}: the run stopped before its Job's status was saved "
            f"(it was interrupted or failed early); nothing to report"
        )
    job = saved_batch_job(read_json(job_path, "job.json"), entry.job)
    pods = read_json(os.path.join(directory, "pods.json"), "pods.json").get("items", [])
    events_path = os.path.join(directory, "events.json")
    events = event_records(
        read_json(events_path, "events.json").get("items", [])
        if os.path.exists(events_path)
        else []
    )
    logs = {
        pod_name(pod): read_text(os.path.join(directory, f"{pod_name(pod)}.log")) for pod in pods
    }
    client_path = os.path.join(directory, "client.json")
    client = read_json(client_path, "client.json") if os.path.exists(client_path) else {}
    return SavedBatch(job, pods, events, logs, client)


def check_saved_job_finished(saved: SavedBatch, settings: Settings) -> None:
    """DemoError when the saved Job never finished, or (all episodes must succeed) failed."""
    job, pods, logs = saved.job, saved.pods, saved.logs
    end = job_finished(job)
    job_name = job["metadata"].get("name", JOB_NAME)
    if end is None:
        # Saved while the Job was still running: the run was interrupted or gave up waiting.
        # Only the pods' states are evidence; how long the Job ran is not.
        raise DemoError(
            "\n  ".join(
                [
                    f"Job {job_name} never finished while the run watched it (the run was interrupted or gave up "
                    f"waiting: job.json has no Complete or Failed condition); nothing to report"
                ]
                + describe_failure(job, pods, job_name, 0, logs)[1:]
            )
        )
    if end != "Complete" and not settings.rollout:
        raise DemoError(
            "\n  ".join(
                ["the saved Job did not complete"]
                + describe_failure(job, pods, job_name, settings.timeout, logs)
            )
        )


def saved_rollout_summary(saved: SavedBatch, settings: Settings, observed: dict) -> BatchSummary:
    """A rollout batch's summary from its saved files, with its reward deliveries if it saved them."""
    job, pods, events, logs, client = saved
    rows = episode_rows(
        settings.count,
        job,
        pods,
        logs,
        settings.builtin,
        settings.task_ids,
        settings.group_size,
        events,
        group_images(settings),
    )
    summary = summarise_rollout(
        rows, job, pods, logs, events, settings, client.get("observed_at"), observed
    )
    if client.get("reward_deliveries") is not None:
        deliveries = [Delivery(*record) for record in client["reward_deliveries"]]
        summary.figures.update(
            batch_delivery_figures(deliveries, split_observed(observed)[1], settings.need)
        )
        summary.deliveries = [d.written_at for d in deliveries if d.success]
    return summary


def recompute(output: str) -> Results:
    """Results of a finished run from its saved files alone."""
    settings_path = os.path.join(output, SETTINGS_FILE)
    if os.path.exists(settings_path):
        saved_settings = read_json(settings_path, "run.json")
        settings, capacity = Settings.from_saved(saved_settings), saved_settings.get("capacity")
    else:  # a run saved by the guide's script, which keeps only the guide's files
        receipt = Receipt.read(output)
        saved = read_json(os.path.join(output, RESULTS_FILE), "results.json")
        settings = Settings(
            count=saved["episodes"],
            parallelism=saved["parallelism"],
            image=saved["image"],
            runtime=saved["runtime"],
            timeout=0,
            context=receipt.context,
            namespace=receipt.namespace,
            batches=(BatchEntry(JOB_NAME, True, "."),),
        )
        capacity = None
    batches = [
        load_saved_batch(os.path.normpath(os.path.join(output, entry.dir)), entry, settings)
        for entry in settings.batches
    ]
    previous = os.path.join(output, RESULTS_FILE)
    client = read_json(previous, "results.json").get("client") if os.path.exists(previous) else None
    results = assemble_results(settings, batches, client, capacity)
    saved_prepull = os.path.join(output, PREPULL_FILE)
    if os.path.exists(saved_prepull):
        results.figures["prepull"] = {
            key: value
            for key, value in read_json(saved_prepull, PREPULL_FILE).items()
            if key not in ("node_names", "image_names", "pod_states")
        }
    admission = saved_admission(output, settings)
    if admission:
        results.figures["admission"] = admission
    return results


def saved_admission(output: str, settings: Settings) -> dict | None:
    """--queue: each batch's admission from its saved Workloads (workloads.json, read once Kueue
    admitted the batch) and its Job (job.json), as the run measured it; None without them."""
    found = {}
    for entry in settings.batches:
        directory = os.path.normpath(os.path.join(output, entry.dir))
        workloads_path = os.path.join(directory, WORKLOADS_FILE)
        if not os.path.exists(workloads_path):
            continue
        saved_jobs = read_json(os.path.join(directory, "job.json"), "job.json")
        jobs = saved_jobs.get("items") or [saved_jobs]
        workloads = read_json(workloads_path, WORKLOADS_FILE).get("items") or []
        found[entry.dir] = admission_figures(jobs, workloads)
    return found.get(".") or ({"batches": found} if found else None)


def report(args: argparse.Namespace) -> int:
    """Recompute and reprint a finished run from its saved files; metrics.prom made again from
    them (and pushed, with --pushgateway)."""
    results = recompute(args.output)
    run_id = Receipt.read(args.output).run_id
    write_metrics(args.output, results.figures, results.batches, run_id)
    print_results(results.figures, args.quiet, os.path.join(args.output, RESULTS_FILE))
    if args.pushgateway:
        push_saved_metrics(args.output, args.pushgateway, run_id)
    tracer = open_tracer(args.otlp_endpoint, run_id)
    if tracer is not None:
        say_export(export_batches(tracer, results.batches, results.figures), args.quiet)
    return 0


def compare(args: argparse.Namespace) -> int:
    """Print the key figures of two finished runs side by side, with ratios."""
    first = read_json(os.path.join(args.first, RESULTS_FILE), "results.json")
    second = read_json(os.path.join(args.second, RESULTS_FILE), "results.json")
    print(
        compare_table(
            first,
            second,
            f"A: {os.path.basename(os.path.normpath(args.first))}",
            f"B: {os.path.basename(os.path.normpath(args.second))}",
        )
    )
    return 0


# --------------------------------------------------------------------------
# src/rl_batch_demo/attach.py: `attach`: follow a run whose client is gone, from its receipt, run.json and saved files.

class AttachRequest(NamedTuple):
    """`attach`'s arguments, from the command line or attach_batch()."""

    output: str
    force: bool = False
    kubectl: str = "kubectl"
    verbose: bool = False
    quiet: bool = False
    cleanup: bool = False
    spelling: Spelling | None = None


class FirstFollower(NamedTuple):
    """What is known of the client that followed the run before: the last moment it is proven
    alive (its lease renewed, its lock file touched, a line written), and by what."""

    alive_at: float | None
    evidence: str


# Client figures a crash makes unknowable for a batch another client began: why, in client.json.
UNKNOWN_SUBMISSION = (
    "the Job was created by the client that stopped: the moments of its create call went with it"
)
UNKNOWN_DELIVERIES = (
    "lines written by the client that stopped: when each was written went with it, and the "
    "lines written by the attach waited for nobody, so no lag is a client's"
)


def kept_lines(path: str, count: int) -> list[dict]:
    """The lines a client that is gone wrote to rewards.jsonl: each whole line (a last line
    torn by the crash is dropped), one per episode index, the first of each kept."""
    kept: dict[int, dict] = {}
    for line in read_text(path).splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            row = json.loads(line)
        except ValueError:
            continue
        index = row.get("index") if isinstance(row, dict) else None
        if isinstance(index, int) and 0 <= index < count and index not in kept:
            kept[index] = row
    return [kept[index] for index in sorted(kept)]


def batch_done(batch_dir: str) -> bool:
    """The batch was followed to its end and summarised: client.json has its last figure."""
    path = os.path.join(batch_dir, "client.json")
    if not os.path.exists(path):
        return False
    try:
        return "post_completion_seconds" in read_json(path, "client.json")
    except DemoError:
        return False


def first_follower(output: str, lease: dict | None) -> FirstFollower:
    """The latest proof that the client before was alive: its lease's renewal, its lock file's
    touch, or the last write to rewards.jsonl (each a moment it still ran)."""
    proofs: list[tuple[float, str]] = []
    renewed = lease_renewed_at(lease) if lease else None
    if renewed is not None:
        proofs.append((renewed, "its lease on the namespace, last renewed"))
    for name, what in ((LOCK_FILE, "its lock file, last touched"), (REWARDS_FILE, "a line")):
        for path in [os.path.join(output, name)] + (
            [os.path.join(root, name) for root, _, files in os.walk(output) if name in files]
            if name == REWARDS_FILE
            else []
        ):
            try:
                proofs.append((os.path.getmtime(path), what))
            except OSError:
                pass
    if not proofs:
        return FirstFollower(None, "nothing it left says when it stopped")
    at, what = max(proofs)
    return FirstFollower(at, f"{what}; it stopped after that, within a lease period of it")


def claim(
    request: AttachRequest, kubectl: Kubectl, receipt: Receipt
) -> tuple[dict | None, str, FirstFollower]:
    """The run's live namespace (None: gone), this attach's lock file, and what is known of the
    client before; FollowerBusy when a live follower holds the run (its lease, or its lock)."""
    live = kubectl.get(
        "namespace",
        receipt.namespace,
        missing_ok=True,
        retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
    )
    # A namespace the run shares is not its own (no run label, no lease on it): it need only be.
    if live is not None and not (receipt.shared or receipt.owns_namespace(live)):
        live = None
    lease = None if receipt.shared else lease_of(live)
    why = lease_verdict(lease, this_holder(), time.time(), request.force)
    if why is not None:
        raise FollowerBusy(f"{why}; nothing was changed")
    before = first_follower(request.output, lease)
    # A lock of another host is replaced only by --force, its lease found stale (or absent).
    return live, take_lock(request.output, replace_remote=request.force), before


def planned_jobs(output: str, entry: BatchEntry) -> list[dict]:
    """The Jobs of one batch as the run planned them (jobs-planned.json), else as it saved
    them when it submitted them (job-submitted.json)."""
    names = set(entry.jobs or (entry.job,))
    path = os.path.join(output, PLANNED_JOBS_FILE)
    if os.path.exists(path):
        items = read_json(path, PLANNED_JOBS_FILE).get("items") or []
        return [job for job in items if job["metadata"]["name"] in names]
    submitted_path = os.path.join(output, entry.dir, "job-submitted.json")
    if not os.path.exists(submitted_path):
        return []
    submitted = read_json(submitted_path, "job-submitted.json")
    return submitted.get("items") if submitted.get("kind") == "List" else [submitted]


def attached_context(
    request: AttachRequest, settings: Settings, receipt: Receipt, kubectl: Kubectl, caller: Caller
) -> RunContext:
    """The run's context as its client had it, rebuilt from its files; new lines reach the
    caller marked `replayed: false`."""
    plan = RunPlan(
        {}, [], {entry.job: planned_jobs(request.output, entry) for entry in settings.batches}
    )
    on_reward = caller.on_reward
    saved = read_json(os.path.join(request.output, SETTINGS_FILE), SETTINGS_FILE)
    python = request.spelling is not None and request.spelling.python
    run = RunContext(
        settings,
        plan,
        receipt,
        kubectl,
        request.output,
        Progress(request.quiet),
        concurrent.futures.ThreadPoolExecutor(LOG_READERS),
        cpu_seconds(),
        touched_cluster=True,
        silent=request.quiet and python,
        on_reward=None if on_reward is None else lambda line: on_reward(dict(line, replayed=False)),
        stop=caller.stop,
        owns_process=not python,
        capacity=saved.get("capacity"),
    )
    if request.spelling is not None:
        run.spelling = request.spelling
    return run


def existing_jobs(run: RunContext, entry: BatchEntry) -> list[dict]:
    """The batch's Jobs in the cluster now, each recorded in the receipt (a client stopped
    between a Job's creation and its record left it out); [] when none exists yet."""
    found = []
    for name in entry.jobs or (entry.job,):
        live = run.kubectl.get(
            "job", name, run.namespace, missing_ok=True, retry_until=time.monotonic() + 30
        )
        if live is None:
            continue
        if not run.receipt.has_job(name):
            run.receipt.record_job(name, live["metadata"]["uid"])
        found.append(live)
    return found


def resume(run: RunContext, jobs: Sequence[dict]) -> list[str]:
    """Resume each of the batch's Jobs an interrupted client suspended (and not ended). One the
    tool stopped once --need-groups was met stays stopped, even before its controller has said
    so (its Suspended condition, its pods gone): resumed, its cancelled episodes would run."""
    resumed = []
    for job in jobs:
        suspended = (job.get("spec") or {}).get("suspend")
        if job_finished(job) or not suspended or cancelled_by_tool(job):
            continue
        name = job["metadata"]["name"]
        if run.settings.queue:
            # Kueue holds a queued Job suspended until it admits it: its Workload is let go (the
            # interrupted client deactivated it), and Kueue resumes the Job once admitted.
            said = set_workload_active(run.kubectl, run.namespace, job["metadata"]["uid"], True)
            if said:
                raise DemoError(f"cannot let Kueue resume Job {name}: {said}")
        else:
            run.kubectl.run(
                ["patch", "job", name, "-n", run.namespace, "--type=merge", "-p"]
                + [SUSPEND_PATCH.replace("true", "false")],
                retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
            )
        resumed.append(name)
    return resumed


def replay(lines: Sequence[dict], on_reward: Callable[[dict], None] | None) -> None:
    """Hand the caller the lines written before the attach, each marked `replayed: true`."""
    if on_reward is not None:
        for row in lines:
            on_reward(dict(row, replayed=True))


def attach_batch_step(
    run: RunContext, entry: BatchEntry, caller: Caller, began: float, before: FirstFollower
) -> tuple[BatchOutcome, dict | None]:
    """One batch of the run: recomputed from its files if it was followed to its end, followed
    if its Jobs exist, else submitted as `run` would. The batch's record of the attach (None
    when nothing of it was unknown)."""
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    rewards_path = os.path.join(batch_dir, REWARDS_FILE)
    if batch_done(batch_dir):
        replay(kept_lines(rewards_path, run.settings.count), caller.on_reward)
        return load_saved_batch(batch_dir, entry, run.settings), None
    jobs = existing_jobs(run, entry)
    gone = [name for name in entry.jobs or (entry.job,) if run.receipt.has_job(name)]
    gone = [name for name in gone if name not in {job["metadata"]["name"] for job in jobs}]
    if gone:
        # Made again, its episodes would run twice: what it did is unknowable instead.
        raise evidence_gone(run, entry, f"Job {', '.join(gone)} of the receipt is gone")
    if not jobs:
        return run_one_batch(run, entry), None
    kept = kept_lines(rewards_path, run.settings.count) if run.settings.rollout else []
    ended_before = all(job_finished(job) for job in jobs)
    resumed = resume(run, jobs)
    replay(kept, caller.on_reward)
    outcome = run_one_batch(run, entry, kept, adopt=True)
    record = {
        # The client before stopped after this moment (within a lease period of it, if it held one).
        "first_follower_alive_at": before.alive_at,
        "first_follower_evidence": before.evidence,
        "attach_began_at": began,
        "job_ended_before_attach": ended_before,
        "resumed_jobs": resumed,
        "replayed_lines": len(kept),
    }
    return mark_unknown(outcome, batch_dir, record, ended_before), record


def mark_unknown(
    outcome: BatchOutcome, batch_dir: str, record: dict, ended_before: bool
) -> BatchOutcome:
    """A batch another client began: what its crash made unknowable is None, and client.json
    says why, never a figure made up."""
    unknown = {
        "submitted_at": UNKNOWN_SUBMISSION,
        "client_job_complete_seconds": UNKNOWN_SUBMISSION,
        "reward_deliveries": UNKNOWN_DELIVERIES,
    }
    if ended_before:
        unknown["observed_at"] = "the Job ended while no client followed it"
    client = dict(outcome.client_wait or {})
    client.update({key: None for key in unknown}, attached=record, unknown=unknown)
    write_json(os.path.join(batch_dir, "client.json"), client)
    figures = outcome.summary.figures
    for key in list(figures):
        if key.startswith("reward_delivery_lag") or key in (
            "first_reward_seconds",
            "kth_reward_seconds",
        ):
            figures[key] = None
    if isinstance(figures.get("reward_delivery"), dict):
        figures["reward_delivery"]["unknown"] = UNKNOWN_DELIVERIES
    return outcome._replace(client_wait=client)


def evidence_gone(run: RunContext, entry: BatchEntry, what: str) -> DemoError:
    """The batch's Jobs (or the namespace) are gone from the cluster: nothing can be followed
    or proven of the episodes without a line. attach.json says what is missing and why."""
    batch_dir = os.path.normpath(os.path.join(run.output, entry.dir))
    kept = kept_lines(os.path.join(batch_dir, REWARDS_FILE), run.settings.count)
    missing = sorted(set(range(run.settings.count)) - {row["index"] for row in kept})
    write_json(
        os.path.join(run.output, "attach.json"),
        {
            "verdict": "cannot verify",
            "batch": entry.job,
            "missing": what,
            "why": "deleted while no client followed the run (cleanup, cleanup --stale, a TTL, "
            "or by hand): its pods, logs and events went with it",
            "lines_kept": len(kept),
            "episodes_unknown": missing,
        },
    )
    return DemoError(
        f"cannot verify batch {entry.job}: {what} (deleted while no client followed it); "
        f"{REWARDS_FILE} keeps the {len(kept)} lines written before its client stopped, and "
        f"the outcomes of the other {len(missing)} episodes cannot be known; attach.json says so"
    )


def never_started(run: RunContext, live: dict | None) -> DemoError:
    """The run stopped before its first Job existed: nothing ran; its namespace (proven the
    run's own) is deleted, else `cleanup` is named."""
    if live is None:
        return DemoError(
            f"the run never started: no Job of it was created and its namespace "
            f"{run.namespace} is gone; nothing to follow or clean up"
        )
    try:
        cleanup_namespace(run.kubectl, run.receipt, report=io.StringIO())
    except DemoError as error:
        return DemoError(
            f"the run never started: no Job of it was created before its client stopped; "
            f"its namespace {run.namespace} could not be deleted ({error}); clean up with: "
            f"{cleanup_command(run.output, run.kubectl.binary)}"
        )
    return DemoError(
        f"the run never started: no Job of it was created before its client stopped; its "
        f"namespace {run.namespace} held no work and was deleted; run it again"
    )


def finished_results(output: str, settings: Settings, caller: Caller) -> tuple[int, Results]:
    """A run that wrote results.json: every line replayed, its results as they are."""
    figures = read_json(os.path.join(output, RESULTS_FILE), RESULTS_FILE)
    for entry in settings.batches:
        path = os.path.join(os.path.normpath(os.path.join(output, entry.dir)), REWARDS_FILE)
        replay(kept_lines(path, settings.count), caller.on_reward)
    return (EXIT_PARTIAL if figures.get("accepted_partial") else 0), Results(figures, [])


def attach_run(request: AttachRequest, caller: Caller) -> tuple[int, Results | None]:
    """`attach`: follow the run in `request.output` to its end as its client would have, its
    results saved; the exit status and the results."""
    began = time.time()
    receipt = Receipt.read(request.output)
    settings = Settings.from_saved(
        read_json(os.path.join(request.output, SETTINGS_FILE), SETTINGS_FILE)
    )
    if os.path.exists(os.path.join(request.output, RESULTS_FILE)):
        return finished_results(request.output, settings, caller)
    kubectl = Kubectl(find_kubectl(request.kubectl), receipt.context, verbose=request.verbose)
    require_receipt_context(kubectl, receipt)
    live, lock_path, before = claim(request, kubectl, receipt)
    run = attached_context(request, settings, receipt, kubectl, caller)
    run.lease = FollowerLease(kubectl, receipt, request.output, lock_path, request.force).start()
    first = settings.batches[0]
    if live is None and receipt.fields.get("jobs"):
        close(run)
        unfinished = [
            e for e in settings.batches if not batch_done(os.path.join(run.output, e.dir))
        ]
        gone = f"the run's namespace {receipt.namespace} is gone"
        raise evidence_gone(run, (unfinished or [first])[0], gone)
    if live is None or (not receipt.fields.get("jobs") and not existing_jobs(run, first)):
        close(run)
        raise never_started(run, live)
    return follow_attached(run, request, caller, began, before)


def follow_attached(
    run: RunContext, request: AttachRequest, caller: Caller, began: float, before: FirstFollower
) -> tuple[int, Results | None]:
    """Each batch of the attached run in order, then results.json; stopped as `run` stops."""
    hint = cleanup_command(run.output, run.kubectl.binary)
    failure: DemoError | None = None
    results: Results | None = None
    try:
        outcomes, records = [], []
        for entry in run.settings.batches:
            outcome, record = attach_batch_step(run, entry, caller, began, before)
            outcomes.append(outcome)
            records.append(record)
        results = save_results(run, outcomes)
        results.figures["attach"] = attach_figures(before, began, records)
        write_json(os.path.join(run.output, RESULTS_FILE), results.figures)
    except KeyboardInterrupt:
        interrupted(run, request.cleanup, hint)
        return EXIT_INTERRUPTED, None
    except StreamClosed as closed:
        interrupted(run, request.cleanup, hint, f"{closed}.")
        return EXIT_INTERRUPTED, None
    except RewardCallbackError as error:
        interrupted(run, request.cleanup, hint, f"{error}; the attach stopped.")
        raise error.original from None
    except DemoError as error:
        failure = error
    finally:
        close(run)
    python = request.spelling is not None and request.spelling.python
    if failure is None and results is not None and not python:
        print_results(results.figures, request.quiet, os.path.join(run.output, RESULTS_FILE))
    finish_run(run, failure, request.cleanup, request.quiet, hint)
    assert results is not None  # finish_run raised otherwise
    return (EXIT_PARTIAL if results.figures.get("accepted_partial") else 0), results


def attach_figures(before: FirstFollower, began: float, records: Sequence[dict | None]) -> dict:
    """results.json's `attach`: when the first client was last proven alive, when the attach
    began, and which batches it picked up (each batch's client.json says what is unknown)."""
    return {
        "first_follower_alive_at": before.alive_at,
        "first_follower_evidence": before.evidence,
        "attach_began_at": began,
        "batches_attached": sum(1 for record in records if record is not None),
        "client": "the attach's own cost; the first client's went with it",
    }


def attach_action(args: Any) -> int:
    """`attach --output DIR`: the command line's attach."""
    request = AttachRequest(
        args.output, args.force, args.kubectl, args.verbose, args.quiet, args.cleanup
    )
    return attach_run(request, Caller())[0]


# --------------------------------------------------------------------------
# src/rl_batch_demo/cli.py: Command line: the parser, its checks, and `main`.

def whole_number(text: str, minimum: int, wanted: str) -> int:
    """A command-line whole number no smaller than `minimum`; `wanted` says so in the error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return whole_number(text, 0, "0 or more")


def positive_int(text: str) -> int:
    return whole_number(text, 1, "at least 1")


def duration_seconds(text: str) -> int:
    """A command-line duration (`30m`, `2h`, `1h30m`) in seconds."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Name each default in the help, except where there is none to name; keep examples as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


def argument_set() -> argparse.ArgumentParser:
    """An empty parent parser: arguments several actions take alike, or one group of an action's;
    an action lists its sets as `parents`, in the order its help shows them."""
    return argparse.ArgumentParser(add_help=False)


def add_action(
    actions: Any,
    name: str,
    purpose: str,
    example: str,
    argument_sets: Sequence[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """One subcommand taking `argument_sets` in order, whose help opens with its purpose and ends
    with an example."""
    return actions.add_parser(
        name,
        help=purpose,
        description=purpose[0].upper() + purpose[1:] + ".",
        epilog=f"example:\n  {program_name()} {name} {example}",
        formatter_class=HelpFormatter,
        parents=argument_sets,
    )


def run_directory_arguments() -> argparse.ArgumentParser:
    """The run's output directory, named as DIR or as --output DIR: one way works everywhere."""
    arguments = argument_set()
    arguments.add_argument("directory", nargs="?", metavar="DIR", help="the run's output directory")
    arguments.add_argument("--output", metavar="DIR", help="the same, as `run` names it")
    return arguments


def context_arguments(said_first: str = "") -> argparse.ArgumentParser:
    """--context, the kube context; `said_first` opens its help where it only goes with another option."""
    arguments = argument_set()
    arguments.add_argument(
        "--context",
        default=None,
        metavar="NAME",
        help=f"{said_first}kube context (default: the current context)",
    )
    return arguments


def kubectl_arguments() -> argparse.ArgumentParser:
    """--kubectl, the binary every action that reaches the cluster runs."""
    arguments = argument_set()
    arguments.add_argument("--kubectl", default="kubectl", metavar="PATH", help="kubectl binary")
    return arguments


def quiet_arguments(unsaid: str) -> argparse.ArgumentParser:
    """--quiet, which keeps `unsaid` off stderr."""
    arguments = argument_set()
    arguments.add_argument("--quiet", action="store_true", help=f"no {unsaid} on stderr")
    return arguments


def verbose_arguments(
    echoed: str = "every kubectl command line (and request through its proxy)",
) -> argparse.ArgumentParser:
    """--verbose, which echoes on stderr what the action runs (`list` runs no proxy)."""
    arguments = argument_set()
    arguments.add_argument("--verbose", action="store_true", help=f"echo {echoed} on stderr")
    return arguments


def run_arguments() -> list[argparse.ArgumentParser]:
    """`run`'s arguments: the batch, the cluster, its bounds, what each episode runs, and how the
    run behaves."""
    return [
        batch_shape_arguments(),
        context_arguments(),
        kubectl_arguments(),
        bounds_arguments(),
        episode_arguments(),
        failure_arguments(),
        image_pull_arguments(),
        run_behaviour_arguments(),
        shared_cluster_arguments(),
        episode_pod_arguments(),
        quiet_arguments("progress"),
        verbose_arguments(),
        telemetry_arguments(),
    ]


def shared_cluster_arguments() -> argparse.ArgumentParser:
    """Where a shared cluster wants the run: a namespace it was given, a Kueue queue."""
    arguments = argparse.ArgumentParser(add_help=False)
    arguments.add_argument(
        "--namespace",
        default=None,
        metavar="NAME",
        help="run inside this existing namespace, making only the run's own objects there "
        "(each named and labelled after the run; cleanup deletes exactly those, never the "
        "namespace); default: a namespace of the run's own",
    )
    arguments.add_argument(
        "--queue",
        default=None,
        metavar="NAME",
        help="hand the Jobs to this Kueue LocalQueue of the namespace (label "
        "kueue.x-k8s.io/queue-name); the batch is held against its ClusterQueue's quota",
    )
    return arguments


def batch_shape_arguments() -> argparse.ArgumentParser:
    """`run`'s batch: where its records go, how many episodes, their image and their sandbox."""
    arguments = argument_set()
    arguments.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="new directory for every record of the run (must not exist)",
    )
    arguments.add_argument(
        "--count",
        type=int,
        default=None,
        metavar="N",
        help=f"episodes (Job completions) (default: {DEFAULT_COUNT}; with --tasks, "
        f"the tasks times --group-size)",
    )
    arguments.add_argument(
        "--parallelism",
        type=int,
        default=None,
        metavar="P",
        help="episodes at once (default: the count)",
    )
    arguments.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help="container image with python (a task's `image` field names its own)",
    )
    arguments.add_argument(
        "--image-map",
        action="append",
        default=None,
        metavar="FROM=TO",
        help="rewrite every image reference (--image and the tasks') that starts with FROM to "
        "start with TO instead, e.g. docker.io/swebench=registry.internal/swebench (a "
        "mirror); repeatable, the longest FROM wins",
    )
    arguments.add_argument(
        "--runtime",
        default=DEFAULT_RUNTIME,
        metavar="RUNTIMECLASS",
        help="RuntimeClass that sandboxes each episode",
    )
    return arguments


def bounds_arguments() -> argparse.ArgumentParser:
    """`run`'s bounds: the Job's deadline, the cap on episodes, the page size, the rounds."""
    arguments = argument_set()
    arguments.add_argument(
        "--timeout",
        type=positive_int,
        default=None,
        metavar="SECONDS",
        help=f"the Job's activeDeadlineSeconds; the client gives up "
        f"{CLIENT_GRACE_SECONDS} s later (default: {DEFAULT_JOB_DEADLINE_SECONDS}, "
        f"grown with the batch above {DEADLINE_GROWS_ABOVE_EPISODES} episodes)",
    )
    arguments.add_argument(
        "--max-episodes",
        type=positive_int,
        default=DEFAULT_MAX_EPISODES,
        metavar="N",
        help="safety cap on --count; raise it explicitly for large batches",
    )
    arguments.add_argument(
        "--chunk-size",
        type=positive_int,
        default=LIST_PAGE_SIZE,
        metavar="N",
        help="read lists (pods, events) in pages of N items, as kubectl --chunk-size",
    )
    arguments.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        metavar="R",
        help="measured batches, one after another in the same namespace",
    )
    arguments.add_argument(
        "--warmup",
        action="store_true",
        help="first run one unmeasured batch of the same shape (cache_state 'warmed')",
    )
    return arguments


def episode_arguments() -> argparse.ArgumentParser:
    """What each episode of `run` runs: its program, and its task with the episodes per task."""
    arguments = argument_set()
    arguments.add_argument(
        "--episode-script",
        default=None,
        metavar="FILE",
        help="ship this episode program instead of the built-in one",
    )
    arguments.add_argument(
        "--tasks",
        default=None,
        metavar="FILE",
        help=f"JSONL file, one task (JSON object) per line; each episode finds its own in "
        f"the file named by ${TASK_FILE_ENV}; the task id is its `id` field, else its "
        f"line number, its `image` field its container image (one Job per image; default "
        f"--image). rewards.jsonl lists every episode's outcome",
    )
    arguments.add_argument(
        "--group-size",
        type=positive_int,
        default=1,
        metavar="G",
        help="episodes per task (GRPO-style groups); needs --tasks",
    )
    return arguments


def failure_arguments() -> argparse.ArgumentParser:
    """Which failures of its episodes `run` retries or accepts, and when it stops an episode."""
    arguments = argument_set()
    arguments.add_argument(
        "--retries",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="retry each episode up to N times after an infrastructure failure (eviction, "
        "node loss, a killed container); an episode's own failure is never retried. "
        "Needs Kubernetes >= 1.33",
    )
    arguments.add_argument(
        "--allow-failures",
        type=non_negative_int,
        default=None,
        metavar="K",
        help=f"accept up to K episodes lost to the infrastructure (or the built-in checks): "
        f"results.json and rewards.jsonl list them with their class, and the run exits "
        f"{EXIT_PARTIAL}. An episode's own failure (a crash, a wrong answer, past "
        f"--episode-timeout) is a valid sample, never counted here and never the batch's end. "
        f"Needs Kubernetes >= 1.33",
    )
    arguments.add_argument(
        "--need",
        type=positive_int,
        default=None,
        metavar="K",
        help="over-provision: end the batch as soon as K of its --count episodes have "
        "a valid line (succeeded, or failed on their own: the Job's successPolicy); Kubernetes "
        "stops the rest, recorded as failure_class 'cancelled', and up to count - K lost "
        "episodes are absorbed (more fail the run, exit 1). 1 <= K < count; not with "
        "--group-size, --allow-failures, --rounds or --warmup, nor with tasks of several "
        "images (each image's Job counts only its own successes). Needs Kubernetes >= 1.33",
    )
    arguments.add_argument(
        "--need-groups",
        type=positive_int,
        default=None,
        metavar="K",
        help="with --tasks: end the batch as soon as K tasks' groups are whole, every member "
        "with a valid line; the tool then stops the rest (it suspends the Jobs), recorded as "
        "failure_class 'cancelled', and up to count - K x --group-size lost episodes are "
        "absorbed. 1 <= K < tasks; not with --need or --allow-failures. Needs Kubernetes >= 1.33",
    )
    arguments.add_argument(
        "--episode-timeout",
        type=positive_int,
        default=None,
        metavar="S",
        help="stop each episode S seconds after its program started (in a rollout, its "
        "launcher keeps the time): an episode past it is an 'episode' failure, a valid "
        "sample, never retried; the pod's own deadline (activeDeadlineSeconds) is S plus "
        "--pull-timeout plus 30 s for the pod to start, a pod stopped at it an "
        "infrastructure failure, retried under --retries. Without --tasks or another "
        "rollout option, the pod's deadline is S itself, image pull included",
    )
    return arguments


def image_pull_arguments() -> argparse.ArgumentParser:
    """How `run` has its images pulled: all of them beforehand, and how long one may take."""
    arguments = argument_set()
    arguments.add_argument(
        "--prepull",
        action="store_true",
        help="before the measured batch, make every image of the run present on every node "
        "the batch can use (one short pod per node and image, in the run's namespace), "
        "measured apart as results.json's `prepull`; needs list nodes",
    )
    arguments.add_argument(
        "--pull-timeout",
        type=positive_int,
        default=None,
        metavar="S",
        help="fail an episode whose pod has not pulled its image within S seconds of its "
        "start (the pod's activeDeadlineSeconds, with --episode-timeout and 30 s added), as "
        "an infrastructure failure the Job retries under --retries; the deadline bounds the "
        "whole pod, so without --episode-timeout an episode still running at S is stopped "
        "too, as infrastructure: give S room for the longest episode as well, or give "
        "--episode-timeout; without it an image that never pulls holds its episode until "
        "the Job's --timeout",
    )
    return arguments


def run_behaviour_arguments() -> argparse.ArgumentParser:
    """What `run` does to the cluster: nothing (--dry-run), hardened, and how its namespace ends."""
    arguments = argument_set()
    arguments.add_argument(
        "--dry-run",
        action="store_true",
        help="print the objects that would be created as a v1 List; touch nothing",
    )
    arguments.add_argument(
        "--harden",
        action="store_true",
        help="deny all network traffic, read-only root filesystem, workspace size "
        "limit, Pod Security 'restricted'",
    )
    arguments.add_argument(
        "--cleanup",
        action="store_true",
        help="after every file is saved, clean up as `cleanup` would (after Ctrl-C too)",
    )
    arguments.add_argument(
        "--detach",
        action="store_true",
        help="create everything, write the receipt, print the namespace and the attach "
        "command, and return at once (`attach --output DIR` follows the run)",
    )
    arguments.add_argument(
        "--ttl",
        type=duration_seconds,
        default=None,
        metavar="DURATION",
        help="the run may be deleted this long after it starts (e.g. 30m, 2h), ended or not, "
        "by `cleanup --stale`; recorded on its namespace",
    )
    return arguments


def episode_pod_arguments() -> argparse.ArgumentParser:
    """What each episode's pod is given: CPU and memory, environment, Secrets, egress."""
    arguments = sandbox_pod_arguments(argument_set())
    arguments.add_argument(
        "--allow-egress",
        action="append",
        default=None,
        metavar="HOST:PORT|CIDR",
        help="with --harden, let the episodes reach this TCP HOST:PORT (a name resolved once, "
        "as the run starts, and pinned in the pods' /etc/hosts) or CIDR (every port), and "
        "nothing else (a NetworkPolicy); repeatable",
    )
    return arguments


def sandbox_pod_arguments(arguments: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """CPU and memory, environment and Secrets of each episode's (or sandbox's) container."""
    for flag, what, example, default in (
        ("--cpu", "CPU", "1 or 250m:1", "100m:500m"),
        ("--memory", "memory", "512Mi or 256Mi:1Gi", "64Mi:128Mi"),
    ):
        arguments.add_argument(
            flag,
            default=None,
            metavar="Q|REQUEST:LIMIT",
            help=f"each episode's {what}: Q is its "
            f"request and its limit both, REQUEST:LIMIT sets them apart (e.g. {example}; default: "
            f"{default}); the capacity check counts the request",
        )
    arguments.add_argument(
        "--env",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="set KEY in each episode's environment; repeatable. Saved in run.json and job.json: "
        "pass secrets with --env-from-secret",
    )
    arguments.add_argument(
        "--env-from-secret",
        action="append",
        default=None,
        metavar="[NAMESPACE/]NAME",
        help="each key of your Secret NAME (in NAMESPACE, default the context's) becomes a variable "
        "of each episode's environment: the run copies it into its own namespace, which goes with "
        "it; its values are never printed or saved. Needs get on that Secret; repeatable",
    )
    return arguments


def pool_arguments() -> list[argparse.ArgumentParser]:
    """`pool`'s arguments: the pool, what each episode does, the cluster, and how it ends."""
    return [
        pool_shape_arguments(),
        pool_image_arguments(),
        shared_cluster_arguments(),
        sandbox_pod_arguments(argument_set()),
        context_arguments(),
        kubectl_arguments(),
        pool_behaviour_arguments(),
        telemetry_arguments(),
        quiet_arguments("progress"),
        verbose_arguments(),
    ]


def pool_shape_arguments() -> argparse.ArgumentParser:
    """How many sandboxes stay warm, how many episodes they serve, and what each episode does."""
    arguments = argument_set()
    arguments.add_argument("--output", required=True, metavar="DIR", help="the pool's records")
    arguments.add_argument(
        "--size", type=positive_int, required=True, metavar="P", help="warm sandboxes at once"
    )
    arguments.add_argument(
        "--episodes", type=positive_int, required=True, metavar="N", help="episodes to serve"
    )
    arguments.add_argument(
        "--tasks", metavar="FILE", help="JSONL tasks, used in turn; a task's `image` picks its pool"
    )
    arguments.add_argument(
        "--turns",
        metavar="FILE",
        help='each episode\'s turns, one JSON object a line: {"write": PATH, "text": TEXT}, '
        '{"run": [ARGV]} or {"shell": CMD}, with an optional "timeout"; the reward is 1 '
        "if the last command exits 0 (default: the guide's episode, as turns)",
    )
    arguments.add_argument(
        "--reuse",
        action="store_true",
        help="a finished sandbox serves the next episode of its image, its workspace made "
        "pristine, instead of its pod ending and the Job starting a fresh one",
    )
    arguments.add_argument(
        "--idle-timeout",
        type=positive_int,
        default=DEFAULT_IDLE_TIMEOUT_SECONDS,
        metavar="S",
        help="a sandbox asked nothing for S seconds ends, and with it the pool's Job "
        "(default: %(default)s)",
    )
    arguments.add_argument(
        "--retries",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="an episode whose sandbox was lost to the cluster (its pod deleted, evicted, "
        "unreachable) is played again from its first turn on a fresh sandbox, up to N times "
        "(default: %(default)s); each loss keeps its own line in rewards.jsonl",
    )
    return arguments


def pool_image_arguments() -> argparse.ArgumentParser:
    """What the sandboxes run on: their image, its rewrites, their runtime class."""
    arguments = argument_set()
    arguments.add_argument("--image", default=DEFAULT_IMAGE, help="default: %(default)s")
    arguments.add_argument(
        "--image-map",
        action="append",
        default=None,
        metavar="FROM=TO",
        help="rewrite image references that start with FROM (repeatable), as `run` does",
    )
    arguments.add_argument("--runtime", default=DEFAULT_RUNTIME, help="default: %(default)s")
    arguments.add_argument(
        "--prepull",
        action="store_true",
        help="before the pool's Jobs, make each of its images present on every node its "
        "sandboxes can use, as `run --prepull` does (prepull.json); needs list nodes",
    )
    return arguments


def pool_behaviour_arguments() -> argparse.ArgumentParser:
    """How the pool is locked down and how its namespace ends."""
    arguments = argument_set()
    arguments.add_argument(
        "--harden",
        action="store_true",
        help="no egress and no ingress but to the sandbox port (the pod proxy's way in; the "
        "token guards it), read-only root filesystem, workspace size limit, Pod Security "
        "'restricted'",
    )
    arguments.add_argument(
        "--cleanup", action="store_true", help="after every file is saved, clean up"
    )
    arguments.add_argument(
        "--ttl",
        type=duration_seconds,
        default=None,
        metavar="DURATION",
        help="the pool may be deleted this long after it starts, by `cleanup --stale`",
    )
    return arguments


def cleanup_arguments() -> list[argparse.ArgumentParser]:
    """`cleanup`'s arguments: the run's directory, the kubectl that deletes, and --stale's own."""
    return [
        run_directory_arguments(),
        kubectl_arguments(),
        stale_arguments(),
        context_arguments("with --stale: "),
        shared_namespace_arguments("with --stale: "),
        verbose_arguments(),
    ]


def stale_arguments() -> argparse.ArgumentParser:
    """How long `cleanup` waits, and --stale AGE with the options that go with it."""
    arguments = argument_set()
    arguments.add_argument(
        "--wait",
        type=positive_int,
        default=DELETE_WAIT_SECONDS,
        metavar="SECONDS",
        help="how long to wait for the Jobs, then the namespace, to disappear",
    )
    arguments.add_argument(
        "--stale",
        type=duration_seconds,
        default=None,
        metavar="AGE",
        help="instead of one run's receipt: delete every run of this tool in the cluster older "
        "than AGE (e.g. 2h) whose Jobs have all ended (a run between two batches: once its last "
        "Job ended longer than AGE ago), and every run past its --ttl",
    )
    arguments.add_argument(
        "--all-users", action="store_true", help="with --stale: every user's runs, not only yours"
    )
    arguments.add_argument(
        "--dry-run",
        action="store_true",
        help="with --stale: say what would be deleted; delete nothing",
    )
    return arguments


def list_arguments() -> list[argparse.ArgumentParser]:
    """`list`'s arguments: how to print, and the cluster."""
    return [
        list_format_arguments(),
        context_arguments(),
        shared_namespace_arguments(),
        kubectl_arguments(),
        verbose_arguments("every kubectl command line"),
    ]


def shared_namespace_arguments(said_first: str = "") -> argparse.ArgumentParser:
    """`list` and `cleanup --stale` in one namespace: the runs that share it."""
    arguments = argument_set()
    arguments.add_argument(
        "--namespace",
        default=None,
        metavar="NAME",
        help=f"{said_first}only the runs that share this namespace (run --namespace), found by "
        "their Jobs' labels there: needs list on its Jobs alone, no cluster-wide grant",
    )
    return arguments


def list_format_arguments() -> argparse.ArgumentParser:
    """`list -o`: a table for people or JSON for scripts."""
    arguments = argument_set()
    arguments.add_argument(
        "-o",
        dest="format",
        choices=("table", "json"),
        default="table",
        help="one line per run, or a JSON list for scripts",
    )
    return arguments


ATTACH_HELP = (
    "follow a run whose client is gone (killed, crashed, detached) to its end, from its files"
)


def attach_arguments() -> list[argparse.ArgumentParser]:
    """`attach`'s arguments: the run, whether to take over a stale lease, the cluster."""
    arguments = argument_set()
    arguments.add_argument(
        "--force",
        action="store_true",
        help="take over a follower lease not renewed for 3 periods (its client looks gone)",
    )
    arguments.add_argument(
        "--cleanup",
        action="store_true",
        help="after every file is saved, clean up as `cleanup` would",
    )
    return [
        run_directory_arguments(),
        arguments,
        kubectl_arguments(),
        quiet_arguments("progress or phase table"),
        verbose_arguments(),
    ]


def report_arguments() -> list[argparse.ArgumentParser]:
    """`report`'s arguments: the run's directory, and the phase table's --quiet."""
    return [run_directory_arguments(), quiet_arguments("phase table"), telemetry_arguments()]


def http_url(text: str) -> str:
    """A collector's or a Pushgateway's URL: http:// or https:// and a host."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http:// or https:// URL: {text!r}")
    return text


def telemetry_arguments() -> argparse.ArgumentParser:
    """Where the run's traces and metrics go, beside its files (docs/observability.md)."""
    arguments = argument_set()
    arguments.add_argument(
        "--otlp-endpoint",
        type=http_url,
        metavar="URL",
        help="export the run's episodes as OpenTelemetry traces over OTLP/HTTP JSON to this "
        "collector (its /v1/traces; default: $OTEL_EXPORTER_OTLP_ENDPOINT, else none)",
    )
    arguments.add_argument(
        "--pushgateway",
        type=http_url,
        metavar="URL",
        help="PUT metrics.prom to this Prometheus Pushgateway, grouped by job and run_id",
    )
    return arguments


def compare_arguments() -> list[argparse.ArgumentParser]:
    """`compare`'s arguments: the two runs."""
    arguments = argument_set()
    arguments.add_argument("first", metavar="DIR_A", help="the first run's output directory (A)")
    arguments.add_argument(
        "second", metavar="DIR_B", help="the second run's output directory (B; ratios are B/A)"
    )
    return [arguments]


def build_parser(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    """The command line: one subcommand per action, each with its own arguments, its purpose and an
    example (`parser_class` is every action's parser class too)."""
    parser = parser_class(
        prog=program_name() if program_name() != "python3 rl_batch_demo.py" else "rl_batch_demo.py",
        description="Measure how fast a Kubernetes cluster with a sandbox runtime runs a batch of "
        "RL rollout episodes.",
        epilog="`ACTION --help` describes each action, with an example.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add_action(
        actions,
        "run",
        "submit a batch of episodes, wait, verify and report",
        "--output runs/first --count 10",
        run_arguments(),
    )
    add_action(
        actions,
        "pool",
        "keep live sandboxes warm and drive each episode's turns over the API server's pod proxy",
        "--output runs/pool --size 4 --episodes 16",
        pool_arguments(),
    )
    add_action(
        actions,
        "cleanup",
        "delete what the run's receipt proves it created; with --stale AGE, the runs of "
        "this tool that ended longer than AGE ago, proven its own from the cluster alone",
        "--output runs/first",
        cleanup_arguments(),
    )
    add_action(
        actions,
        "list",
        "list the runs of this tool (and of the guide's script) in the context's cluster",
        "-o json",
        list_arguments(),
    )
    add_action(actions, "attach", ATTACH_HELP, "--output runs/first", attach_arguments())
    add_action(
        actions,
        "report",
        "recompute and reprint a finished run from its files",
        "runs/first",
        report_arguments(),
    )
    add_action(
        actions,
        "compare",
        "print the key figures of two runs side by side, with ratios",
        "runs/parallel runs/serial",
        compare_arguments(),
    )
    for action_parser in actions.choices.values():
        action_parser.set_defaults(action_parser=action_parser)
    return parser


def run_request(
    args: argparse.Namespace,
    spelling: Spelling = COMMAND_LINE,
    tasks: Sequence[Task] | None = None,
) -> RunRequest:
    """`run`'s parsed arguments as the checked request both front ends hand to perform_run: the
    tasks a Python caller gave, else those of --tasks; UsageError names a setting as `spelling`
    words it."""
    if tasks is None and args.tasks is not None:
        tasks = read_tasks(args.tasks, spelling)
    if args.episode_script is not None:
        check_readable(args.episode_script, spelling.setting("episode_script", args.episode_script))
    default_count = len(tasks) * args.group_size if tasks else DEFAULT_COUNT
    count = default_count if args.count is None else args.count
    request = RunRequest(
        output=args.output,
        count=count,
        parallelism=count if args.parallelism is None else args.parallelism,
        image=args.image,
        image_map=tuple(args.image_map or ()),
        runtime=args.runtime,
        context=args.context,
        kubectl=args.kubectl,
        timeout=args.timeout,
        max_episodes=args.max_episodes,
        chunk_size=args.chunk_size,
        rounds=args.rounds,
        warmup=args.warmup,
        episode_script=args.episode_script,
        tasks_file=args.tasks,
        tasks=None if tasks is None else tuple(tasks),
        group_size=args.group_size,
        retries=args.retries,
        allow_failures=args.allow_failures,
        need=args.need,
        need_groups=args.need_groups,
        episode_timeout=args.episode_timeout,
        prepull=args.prepull,
        pull_timeout=args.pull_timeout,
        dry_run=args.dry_run,
        harden=args.harden,
        cleanup=args.cleanup,
        ttl=args.ttl,
        quiet=args.quiet,
        verbose=args.verbose,
        **placement_arguments(args),
        otlp_endpoint=args.otlp_endpoint,
        pushgateway=args.pushgateway,
        # A trainer calling in always gets its rewards, one row per episode.
        rollout=bool(tasks)
        or args.retries is not None
        or args.allow_failures is not None
        or args.need is not None
        or spelling.python,
        spelling=spelling,
        **pod_arguments(args),
        detach=args.detach,
    )
    check_run_request(request)
    return request


def placement_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """Where a shared cluster wants the run: --namespace, --queue (RunRequest's fields)."""
    return {"namespace": args.namespace, "queue": args.queue}


def pod_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """What each episode's pod is given, as the request holds it (podspec reads them)."""
    return {
        "cpu": args.cpu,
        "memory": args.memory,
        **{name: tuple(getattr(args, name) or ()) for name in POD_LISTS},
    }


POD_LISTS = ("env", "env_from_secret", "allow_egress")


def read_tasks(path: str, spelling: Spelling) -> list[Task]:
    """The tasks of a --tasks file; UsageError names the file as the caller gave it."""
    where = spelling.setting("tasks", path)
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_tasks(handle)
    except OSError as error:
        raise UsageError(f"{where}: {error.strerror or error}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise UsageError(f"{where}: {error}") from None


def check_readable(path: str, named: str) -> None:
    """A file the run ships (--episode-script) can be read: else a usage error, as for any other
    argument, before anything is created (its text is read, and checked, once the run starts)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise UsageError(f"cannot read {named}: {error.strerror or error}") from None


def check_run_request(request: RunRequest) -> None:
    """1 <= parallelism <= count <= cap, else UsageError naming the settings as the caller spelled them."""
    name, say = request.spelling.name, request.spelling.setting
    check_rollout_request(request)
    count, cap = request.count, request.max_episodes
    if count < 1:
        raise UsageError(f"{name('count')} must be at least 1, got {count}")
    if count > cap:
        over = say("max_episodes", cap) if request.spelling.python else f"the cap of {cap} episodes"
        episodes = (
            f"{say('group_size', request.group_size)} with {len(request.tasks)} tasks is {count} "
            f"episodes, over {over}"
            if request.tasks
            else f"{say('count', count)} is over {over}"
        )
        raise UsageError(f"{episodes} (raise it with {say('max_episodes', count)})")
    if not 1 <= request.parallelism <= count:
        raise UsageError(
            f"{name('parallelism')} must be between 1 and the count ({count}), "
            f"got {request.parallelism}"
        )
    if request.tasks and request.episode_script is None:
        # The built-in episode never reads a task: its reward of 1 would pass for the task's.
        raise UsageError(
            f"{name('tasks')} needs {name('episode_script')}: the built-in "
            f"episode ignores tasks, so its rewards would not come from them; ship an episode "
            f"that reads its task from ${TASK_FILE_ENV}"
        )
    check_image_request(request)
    if request.queue is not None and request.namespace is None:
        # A LocalQueue lives in a namespace: one the run makes has none.
        raise UsageError(
            f"{name('queue')} needs {name('namespace')}: a Kueue LocalQueue lives in a namespace, "
            f"and a namespace the run makes for itself has none"
        )
    episode_pod(request)  # --cpu, --memory, --env, --env-from-secret, --allow-egress


def check_image_request(request: RunRequest) -> None:
    """--image-map well formed; with tasks of several images, a share of --parallelism for each
    image's Job, and no --need (a Job's successPolicy counts its own episodes, not its batch's)."""
    name = request.spelling.name
    try:
        image_map = parse_image_map(request.image_map)
    except ValueError as error:
        raise UsageError(f"{name('image_map')}: {error}") from None
    groups = image_groups(
        request.tasks or [],
        request.count,
        request.group_size,
        rewrite_image(request.image, image_map),
        image_map,
    )
    if len(groups) == 1:
        return
    if request.need is not None:
        raise UsageError(
            f"{name('need')} cannot hold with tasks of {len(groups)} images: each image runs its "
            f"own Job, and a Job's successPolicy counts only its own episodes"
        )
    try:
        parallelism_shares(request.parallelism, [len(group.indexes) for group in groups])
    except ValueError as error:
        raise UsageError(
            f"{request.spelling.setting('parallelism', request.parallelism)} is too few: the "
            f"tasks name {error} (one Job per image)"
        ) from None


def check_rollout_request(request: RunRequest) -> None:
    """--tasks sets the count (tasks x --group-size); the rollout options stand alone, one batch."""
    name, say = request.spelling.name, request.spelling.setting
    tasks, group_size = request.tasks, request.group_size
    if tasks and request.count != len(tasks) * group_size:
        raise UsageError(
            f"{say('count', request.count)} disagrees with {name('tasks')}: {len(tasks)} tasks x "
            f"{say('group_size', group_size)} = {len(tasks) * group_size} episodes (leave "
            f"{name('count')} out)"
        )
    if not tasks and group_size != 1:
        raise UsageError(
            f"{name('group_size')} needs {name('tasks')} ({group_size} episodes per task)"
        )
    if request.rollout and (request.rounds != 1 or request.warmup):
        runs = (
            "run_batch() runs"
            if request.spelling.python
            else "--tasks, --retries, --allow-failures and --need run"
        )
        raise UsageError(f"{runs} one batch: leave out {name('rounds')} and {name('warmup')}")
    check_need_request(request)
    # A count of 0, refused after these checks, counts here as the default.
    count = request.count or DEFAULT_COUNT
    if request.allow_failures is not None and request.allow_failures > count:
        raise UsageError(
            f"{say('allow_failures', request.allow_failures)} is more than the {count} episodes"
        )


def check_need_groups_request(request: RunRequest) -> None:
    """--need-groups K: with tasks, 1 <= K < tasks, and neither --need nor --allow-failures (the
    batch absorbs count - K x group size losses)."""
    wanted = request.need_groups
    if wanted is None:
        return
    name, say = request.spelling.name, request.spelling.setting
    if not request.tasks:
        raise UsageError(f"{name('need_groups')} needs {name('tasks')}: its groups are the tasks'")
    if wanted >= len(request.tasks):
        raise UsageError(
            f"{say('need_groups', wanted)} must be fewer than the {len(request.tasks)} tasks (it "
            f"over-provisions: run every task's group and keep the first K whole ones)"
        )
    for other in ("need", "allow_failures"):
        if getattr(request, other) is not None:
            raise UsageError(f"{name('need_groups')} cannot go with {name(other)}")


def check_need_request(request: RunRequest) -> None:
    """--need K: 1 <= K < count, and none of the options whose promise the first K of N would break."""
    check_need_groups_request(request)
    need = request.need
    if need is None:
        return
    name, say = request.spelling.name, request.spelling.setting
    count = request.count or DEFAULT_COUNT  # as check_rollout_request counts
    if need >= count:
        raise UsageError(
            f"{say('need', need)} must be fewer than the {count} episodes (it "
            f"over-provisions: run count > K episodes and keep the first K rewards)"
        )
    if request.group_size != 1:
        raise UsageError(
            f"{name('need')} cannot hold with {name('group_size')}: the Job stops whichever "
            f"episodes are still running once K succeeded, so groups would be cut short at random"
        )
    if request.allow_failures is not None:
        raise UsageError(
            f"{name('need')} already accepts count - K = {count - need} failed episodes: "
            f"leave out {name('allow_failures')}"
        )


def check_run_directory(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """DIR or --output DIR, exactly one of them; the directory ends up in args.output."""
    if args.directory is not None and args.output is not None:
        parser.error(
            f"name the run directory once: {args.directory} or --output {args.output}, not both"
        )
    if args.directory is None and args.output is None:
        parser.error("name the run's output directory: DIR or --output DIR")
    args.output = args.output if args.directory is None else args.directory


def pool_command(args: argparse.Namespace) -> int:
    """`pool`: its settings checked, then the pool run."""
    tasks = read_tasks(args.tasks, COMMAND_LINE) if args.tasks else None
    turns = read_turns(args.turns) if args.turns else GUIDE_TURNS
    options = {
        "image": args.image,
        "image_map": args.image_map,
        "runtime": args.runtime,
        "context": args.context,
        "kubectl": args.kubectl,
        "harden": args.harden,
        "prepull": args.prepull,
        "retries": args.retries,
        "cleanup": args.cleanup,
        "ttl": args.ttl,
        "quiet": args.quiet,
        "verbose": args.verbose,
        **placement_arguments(args),
        "cpu": args.cpu,
        "memory": args.memory,
        "env": args.env,
        "env_from_secret": args.env_from_secret,
        "otlp_endpoint": args.otlp_endpoint,
        "pushgateway": args.pushgateway,
    }
    request = pool_request(args.output, args.size, args.episodes, tasks, options, COMMAND_LINE)
    shape = PoolShape(request.runtime, request.harden, args.reuse, args.idle_timeout)
    return run_pool(request, shape, turns)


# The run settings a pool shares with `run`, by their names there.
POOL_RUN_OPTIONS = (
    "image",
    "image_map",
    "runtime",
    "context",
    "kubectl",
    "harden",
    "prepull",
    "cleanup",
    "ttl",
    "quiet",
    "verbose",
    "namespace",
    "queue",
    "cpu",
    "memory",
    "env",
    "env_from_secret",
)


def check_cleanup_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One run's directory, or --stale AGE for the cluster's runs; --stale's own options only with it."""
    if args.stale is None:
        for flag, given in (
            ("--all-users", args.all_users),
            ("--dry-run", args.dry_run),
            ("--context", args.context is not None),
            ("--namespace", args.namespace is not None),
        ):
            if given:
                parser.error(
                    f"{flag} goes with --stale AGE (a receipt names its own context and run)"
                )
        check_run_directory(parser, args)
    elif args.directory is not None or args.output is not None:
        parser.error("--stale finds the runs in the cluster: name no run directory with it")


DISPATCH: dict[str, Callable[[argparse.Namespace], int]] = {
    "pool": pool_command,
    "cleanup": cleanup,
    "list": list_runs,
    "report": report,
    "compare": compare,
    "attach": attach_action,
}


def option_strings(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """The flags of a parser and of its actions' parsers: (those that take one value, all)."""
    valued: set[str] = set()
    every: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                sub_valued, sub_every = option_strings(subparser)
                valued |= sub_valued
                every |= sub_every
        elif action.option_strings:
            every.update(action.option_strings)
            if action.nargs is None:
                valued.update(action.option_strings)
    return valued, every


def dash_values_joined(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--ttl -5m` as `--ttl=-5m`. argparse takes a value that starts with a dash (but a negative
    number) for a flag and says only "expected one argument"; joined, the value reaches the flag's
    own check, which says what is wrong with it. A flag's name stays a flag (`--ttl --quiet`)."""
    valued, every = option_strings(parser)
    joined: list[str] = []
    position = 0
    while position < len(argv):
        flag = argv[position]
        value = argv[position + 1] if position + 1 < len(argv) else None
        if (
            flag in valued
            and value is not None
            and value.startswith("-")
            and not value.startswith("--")
            and value not in every
        ):
            joined.append(f"{flag}={value}")
            position += 2
            continue
        joined.append(flag)
        position += 1
    return joined


def main(argv: Sequence[str] | None = None, exit_when_done: bool = False) -> int:
    """The command line; `exit_when_done` (the console's entry points) ends the process the moment
    its work is done (exit_at_once), not when Python has freed everything, so a caller running it
    every step waits for nothing after the run."""
    parser = build_parser()
    args = parser.parse_args(dash_values_joined(sys.argv[1:] if argv is None else argv, parser))
    request = None
    if args.action == "run":
        try:
            request = run_request(args)
        except UsageError as error:
            args.action_parser.error(str(error))
    elif args.action == "cleanup":
        check_cleanup_arguments(args.action_parser, args)
    elif args.action in ("report", "attach"):
        check_run_directory(args.action_parser, args)
    try:
        with signals_interrupt():
            if request is not None:
                return run_command(request, Caller(exit_when_done=exit_when_done))
            return DISPATCH[args.action](args)
    except DemoError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED


def cli() -> None:
    """Console-script entry point."""
    exit_at_once(main(exit_when_done=True))


# --------------------------------------------------------------------------
# src/rl_batch_demo/api.py: The Python API: `run_batch` and `stream_batch`, over the same settings as the command line.

class RaisingParser(argparse.ArgumentParser):
    """The parser of run_batch()'s `options`: a bad option is a UsageError, no usage block printed."""

    def error(self, message: str) -> Any:
        raise UsageError(f"options: {message}")


class RunKeyword(NamedTuple):
    """One `run` flag as a run_batch() keyword: its name, flag, type, default and help."""

    name: str
    flag: str
    kind: type
    path: bool  # a file or a program: an os.PathLike is taken too
    default: Any
    check: Callable[[str], Any] | None  # the flag's own argparse check, for the value's bounds
    help: str

    @property
    def annotation(self) -> str:
        spelled = (
            "str | os.PathLike"
            if self.path
            else "list[str]"
            if self.kind is list
            else self.kind.__name__
        )
        return spelled if self.default is not None else spelled + " | None"

    def value(self, given: Any) -> Any:
        """The keyword's value checked in Python's terms, as the parsed flag would hold it."""
        if given is None and self.default is None:
            return None
        if self.kind is list:  # a repeatable flag: a list of its values (`image_map=["a=b"]`)
            if (
                isinstance(given, str)
                or not isinstance(given, (list, tuple))
                or not all(isinstance(item, str) for item in given)
            ):
                raise KeywordTypeError(
                    f"{self.name}= must be a list of str, got {type(given).__name__} {given!r}"
                )
            return list(given)
        wanted = (str, os.PathLike) if self.path else self.kind
        if not isinstance(given, wanted) or (self.kind is int and isinstance(given, bool)):
            raise KeywordTypeError(
                f"{self.name}= must be {self.annotation}, got {type(given).__name__} {given!r}"
            )
        if self.path:
            return os.fspath(given)  # type: ignore[call-overload]  # a str or os.PathLike: checked above
        if self.check is not None and self.kind in (int, str):
            try:
                checked = self.check(str(given))
            except argparse.ArgumentTypeError as error:
                raise UsageError(f"{self.name}={given!r}: {error}") from None
            # A text the flag reads into something else (`ttl="2h"`: seconds) is held as the flag holds it.
            return checked if self.kind is str else given
        return given


# Where run_batch() and the command line differ: a trainer calling in every step wants no
# progress and no namespace left behind (the files stay); the command line keeps the guide's.
PYTHON_DEFAULTS = {"cleanup": True, "quiet": True}

# Not keywords: `output` is run_batch()'s own parameter and `tasks` its first argument.
NOT_KEYWORDS = {"help", "output", "tasks"}


def run_keywords() -> dict[str, RunKeyword]:
    """Every `run` flag as a keyword, read from the parser: a flag added to `run` is a keyword at once."""
    actions = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    keywords = {}
    for action in actions.choices["run"]._actions:
        if action.dest in NOT_KEYWORDS or not action.option_strings:
            continue
        kind = (
            list
            if isinstance(action, argparse._AppendAction)
            else bool
            if action.nargs == 0
            else int
            if action.type in (int, positive_int, non_negative_int)
            else str
        )
        keywords[action.dest] = RunKeyword(
            action.dest,
            action.option_strings[-1],
            kind,
            action.metavar in ("FILE", "PATH"),
            PYTHON_DEFAULTS.get(action.dest, action.default),
            action.type if callable(action.type) else None,
            " ".join((action.help or "").split()),
        )
    return keywords


def takes_run_keywords(function: Callable[..., Any]) -> Callable[..., Any]:
    """Show `run`'s flags as a batch function's typed keywords, in its signature and its
    docstring (for help() and editors); batch_arguments() checks them."""
    import inspect  # only to describe the signature
    import textwrap

    signature = inspect.signature(function)
    own = [
        parameter
        for parameter in signature.parameters.values()
        if parameter.kind != parameter.VAR_KEYWORD
    ]
    added = [
        inspect.Parameter(
            keyword.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=keyword.default,
            annotation=keyword.annotation,
        )
        for keyword in RUN_KEYWORDS.values()
    ]
    function.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
    lines = ["", "Keywords (each is the `run` flag of its name):"]
    for keyword in RUN_KEYWORDS.values():
        lines.append(
            f"    {keyword.name}: {keyword.annotation} = {keyword.default!r}  ({keyword.flag})"
        )
        lines += textwrap.wrap(keyword.help, 80, initial_indent=" " * 8, subsequent_indent=" " * 8)
    function.__doc__ = (function.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    return function


def python_tasks(tasks: Sequence[dict]) -> list[Task]:
    """A Python caller's tasks, each refused in Python's terms (tasks[i], not a file's line)."""
    if isinstance(tasks, (dict, bytes)) or not isinstance(tasks, Sequence):
        raise KeywordTypeError(
            f"tasks must be a list of dicts or a JSONL file's path, got {type(tasks).__name__}"
        )
    texts = []
    for position, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise KeywordTypeError(
                f"tasks[{position}] must be a dict, got {type(task).__name__} {task!r}"
            )
        try:
            texts.append(json.dumps(task))
        except (TypeError, ValueError) as error:
            raise UsageError(f"tasks[{position}] is not JSON: {error}") from None
    if not texts:
        raise UsageError("tasks is empty: give at least one task, or None and count=")
    try:
        return parse_tasks(texts, place=lambda number: f"tasks[{number - 1}]")
    except ValueError as error:
        raise UsageError(f"tasks: {error}") from None


def batch_arguments(
    function: str,
    tasks: Sequence[dict] | str | os.PathLike | None,
    output: str | os.PathLike,
    options: Sequence[str],
    keywords: dict[str, Any],
) -> RunRequest:
    """A Python call's `run` request, checked in Python's terms before anything is created;
    `function` is the one called (run_batch, stream_batch)."""
    unknown = sorted(set(keywords) - set(RUN_KEYWORDS))
    if unknown:
        raise KeywordTypeError(f"{function}() got an unexpected keyword argument {unknown[0]!r}")
    if isinstance(options, str) or not all(isinstance(option, str) for option in options):
        raise KeywordTypeError(f"options must be a list of strings, got {options!r}")
    flags = {option.split("=", 1)[0] for option in options if option.startswith("--")}
    for name in sorted(keywords):
        if RUN_KEYWORDS[name].flag in flags:
            raise UsageError(
                f"{name}= and options' {RUN_KEYWORDS[name].flag} both set {name}: give it once"
            )
    for own, flag in (("output", "--output"), ("tasks", "--tasks")):
        if flag in flags:
            raise UsageError(f"options' {flag}: give {own} as {function}()'s own argument")
    if not isinstance(output, (str, os.PathLike)):
        raise KeywordTypeError(
            f"output= must be str | os.PathLike, got {type(output).__name__} {output!r}"
        )
    if isinstance(keywords.get("env"), dict):  # env={"KEY": "VALUE"}, as os.environ reads
        keywords = dict(keywords, env=[f"{key}={value}" for key, value in keywords["env"].items()])
    parser = build_parser(RaisingParser)
    args = parser.parse_args(
        dash_values_joined(["run", "--output", os.fspath(output), *options], parser)
    )
    for name, keyword in RUN_KEYWORDS.items():
        if name in keywords:
            setattr(args, name, keyword.value(keywords[name]))
        elif name in PYTHON_DEFAULTS and keyword.flag not in flags:
            setattr(args, name, keyword.default)
    listed = None  # a list of tasks, not a file's
    if isinstance(tasks, (str, os.PathLike)):
        args.tasks = os.fspath(tasks)
    elif tasks is not None:
        listed, args.tasks = python_tasks(tasks), f"({function})"
    return run_request(args, PYTHON_CALL, listed)


RUN_KEYWORDS = run_keywords()


@takes_run_keywords
def run_batch(
    tasks: Sequence[dict] | str | os.PathLike | None = None,
    *,
    output: str | os.PathLike,
    options: Sequence[str] = (),
    on_reward: Callable[[dict], Any] | None = None,
    **keywords: Any,
) -> dict:
    """Run one batch in-process and return its results, with `rewards` (one row per episode).

    `tasks` are JSON objects (their `id` field, else their position from 1, is the
    task id), or the path of a JSONL file as `run --tasks` takes; without them,
    `count=` says how many episodes. Every `run` flag is a keyword of its name (listed
    below); `options` takes `run` flags as strings for the rest. Unlike the command
    line, run_batch() prints nothing (`quiet=False` shows the progress) and deletes the
    namespace once every file is saved, the files staying (`cleanup=False` keeps it).

    A bad argument raises UsageError (a DemoError and a ValueError; KeywordTypeError, also
    a TypeError, for a wrong type) before anything is created. An accepted partial
    batch returns with results["accepted_partial"] True; any other failure raises
    DemoError, the evidence kept in `output`; an interrupted run (Ctrl-C, SIGTERM)
    suspends its Job (its running pods stop), saves what it can, deletes the namespace
    (`cleanup=False` keeps it for `cleanup`) and raises KeyboardInterrupt.
    `dry_run=True` returns the objects a run would create, as a v1 List.

    `on_reward(line)` is called with each rewards.jsonl line (a dict) the moment it is
    written, while the batch runs, from the caller's own thread: the one that called
    run_batch(), which follows the batch (its watches, logs and lines) and calls on_reward
    between those steps. A slow callback therefore holds up the following of the batch: the
    later lines and the end of the run wait until it returns (hand slow work to a thread or
    queue of your own, or use stream_batch(), whose batch runs in a thread of the tool's).
    Should it raise, the run stops as on Ctrl-C and its exception is raised from run_batch
    as it was.
    """
    if on_reward is not None and not callable(on_reward):
        raise KeywordTypeError(
            f"on_reward= must be callable, got {type(on_reward).__name__} {on_reward!r}"
        )
    request = batch_arguments("run_batch", tasks, output, options, keywords)
    if request.dry_run:
        return dry_run_listing(request)
    return batch_run(request, Caller(on_reward=on_reward))


def batch_run(request: RunRequest, caller: Caller) -> dict:
    """run_batch()'s run of its checked request: the results with `rewards`."""
    status, results = perform_run(request, caller)
    if request.detach and status == 0 and results is None:
        return detached_results(request)
    if status not in (0, EXIT_PARTIAL) or results is None:
        # The run saved what it could and said how to clean up; the caller decides what an interrupt means.
        raise KeyboardInterrupt
    saved = dict(results.figures)
    rewards_path = os.path.join(request.output, REWARDS_FILE)
    saved["rewards"] = [
        json.loads(line) for line in read_text(rewards_path).splitlines() if line.strip()
    ]
    return saved


def detached_results(request: RunRequest) -> dict:
    """What run_batch(detach=True) returns: where the run is, and how to follow it."""
    receipt = read_json(os.path.join(request.output, RECEIPT_FILE), RECEIPT_FILE)
    return {
        "detached": True,
        "output": request.output,
        "namespace": receipt["namespace"],
        "attach": attach_command(request.output, request.kubectl),
    }


def batch_results(output: str | os.PathLike) -> dict:
    """What run_batch() returns, read back from a finished run's directory: results.json with
    `rewards`, the rows of rewards.jsonl (for a plain `for` loop over stream_batch())."""
    results = read_json(os.path.join(os.fspath(output), RESULTS_FILE), RESULTS_FILE)
    rewards = read_text(os.path.join(os.fspath(output), REWARDS_FILE))
    results["rewards"] = [json.loads(line) for line in rewards.splitlines() if line.strip()]
    return results


@takes_run_keywords
def stream_batch(
    tasks: Sequence[dict] | str | os.PathLike | None = None,
    *,
    output: str | os.PathLike,
    options: Sequence[str] = (),
    **keywords: Any,
) -> Generator[dict, None, dict]:
    """Run one batch as run_batch() does, with every argument of run_batch() but on_reward (the
    lines are what it yields), yielding each rewards.jsonl line (a dict) the moment it is
    written; the generator's return value (StopIteration.value, what
    `results = yield from stream_batch(...)` gives) is what run_batch() returns.

    A bad argument raises UsageError (KeywordTypeError) here, at the call, before the generator
    exists; everything else comes from next(). A plain `for` loop gets the results afterwards
    with batch_results(output). The batch runs in a thread of the tool's, which puts each line
    in an unbounded queue: a slow reader holds up nothing but its own reading. The run's errors
    (DemoError, KeyboardInterrupt, and the checks made once the run starts, such as an output
    directory already used) are raised here, where the lines are read. Closing the generator
    before the batch ends (break, an exception in the loop, close(), Ctrl-C, or the generator
    dropped) stops the run as on Ctrl-C and waits until it has: its Job suspended (its running
    pods stop), its evidence saved, its namespace deleted (`cleanup=False` keeps it, named on
    stderr).
    """
    if "on_reward" in keywords:
        raise KeywordTypeError(
            "stream_batch() yields each line itself and takes no on_reward=: iterate over it, "
            "or call run_batch(..., on_reward=...)"
        )
    request = batch_arguments("stream_batch", tasks, output, options, keywords)
    listing = dry_run_listing(request) if request.dry_run else None
    return streamed_lines(request, listing)


# Why a run stops when its stream_batch() generator is closed: close(), a `break` out of the loop
# over it, an exception in that loop, or the generator dropped (garbage collection closes it).
STREAM_CLOSED = "stream_batch() was closed before the batch ended"


def streamed_lines(request: RunRequest, listing: dict | None) -> Generator[dict, None, dict]:
    """stream_batch()'s generator over its checked request: the batch in a thread of its own,
    each line yielded as it lands; with --dry-run, the listing returned at once."""
    if listing is not None:
        return listing
    return (yield from threaded_lines(lambda caller: batch_run(request, caller), "stream_batch"))


def threaded_lines(work: Callable[[Caller], dict], function: str) -> Generator[dict, None, dict]:
    """The lines `work` hands its caller's on_reward, yielded as they land from a thread of
    the tool's, and what it returns as the generator's value; closed early, it stops `work` as
    Ctrl-C would and waits until it has."""
    lines: queue.Queue[tuple[str, Any]] = queue.Queue()
    stop = StopRequest()
    caller = Caller(on_reward=lambda line: lines.put(("line", line)), stop=stop)

    def run_in_thread() -> None:
        try:
            lines.put(("results", work(caller)))
        except BaseException as error:  # raised again in the reader's thread
            lines.put(("error", error))

    worker = threading.Thread(target=run_in_thread, name=f"rl-batch-demo {function}", daemon=True)
    worker.start()
    why = STREAM_CLOSED.replace("stream_batch", function)
    try:
        while True:
            kind, value = lines.get()
            if kind == "line":
                yield value
            elif kind == "error":
                raise value
            else:
                return value
    except KeyboardInterrupt:
        why = "Interrupted"
        raise
    except BaseException as error:
        if not isinstance(error, GeneratorExit):
            why = f"{function}()'s reader stopped on {type(error).__name__}"
        raise
    finally:
        if worker.is_alive():
            # The run stops its pods, saves its evidence and (cleanup) deletes its namespace.
            stop.request(why)
            worker.join()


def attach_batch(
    output: str | os.PathLike,
    *,
    force: bool = False,
    cleanup: bool = True,
    quiet: bool = True,
    kubectl: str | os.PathLike = "kubectl",
    verbose: bool = False,
) -> Generator[dict, None, dict]:
    """Follow the run in `output` whose client is gone (killed, crashed, detached), as
    stream_batch() follows one it starts: a generator yielding every episode's rewards.jsonl
    line exactly once, first those written before (each marked `replayed: True`), then the
    rest as they land (`replayed: False`); its return value (StopIteration.value) is what
    run_batch() returns. A second follower of the same run is refused (FollowerBusy, a
    DemoError, naming the holder's host and PID); `force=True` takes over a lease not renewed
    for 3 periods. `cleanup` (default True) deletes the namespace once every file is saved;
    closing the generator early stops the run as closing stream_batch() does."""
    if not isinstance(output, (str, os.PathLike)):
        raise KeywordTypeError(
            f"output= must be str | os.PathLike, got {type(output).__name__} {output!r}"
        )
    for name, value in (
        ("force", force),
        ("cleanup", cleanup),
        ("quiet", quiet),
        ("verbose", verbose),
    ):
        if not isinstance(value, bool):
            raise KeywordTypeError(f"{name}= must be bool, got {type(value).__name__} {value!r}")
    request = AttachRequest(
        os.fspath(output), force, os.fspath(kubectl), verbose, quiet, cleanup, PYTHON_CALL
    )
    return threaded_lines(lambda caller: attached_results(request, caller), "attach_batch")


def attached_results(request: AttachRequest, caller: Caller) -> dict:
    """attach_batch()'s attach of its request: the results with `rewards`."""
    status, results = attach_run(request, caller)
    if status not in (0, EXIT_PARTIAL) or results is None:
        raise KeyboardInterrupt
    return batch_results(request.output)


# open_pool()'s keywords beside its own, with their types: the run settings a pool shares.
POOL_KEYWORDS: dict[str, tuple[type, ...]] = {
    "image": (str,),
    "image_map": (list, tuple),
    "runtime": (str,),
    "context": (str, type(None)),
    "kubectl": (str, os.PathLike),
    "harden": (bool,),
    "prepull": (bool,),
    "cleanup": (bool,),
    "ttl": (int, type(None)),
    "quiet": (bool,),
    "verbose": (bool,),
    "namespace": (str, type(None)),
    "queue": (str, type(None)),
    "cpu": (str, type(None)),
    "memory": (str, type(None)),
    "env": (dict, list, tuple),
    "env_from_secret": (list, tuple),
    "otlp_endpoint": (str, type(None)),
    "pushgateway": (str, type(None)),
}


def open_pool(
    *,
    output: str | os.PathLike,
    size: int,
    episodes: int,
    tasks: Sequence[dict] | str | os.PathLike | None = None,
    reuse: bool = False,
    idle_timeout: int = DEFAULT_IDLE_TIMEOUT_SECONDS,
    **keywords: Any,
) -> Pool:
    """Open a pool of `size` live sandboxes serving `episodes` episodes; use it as a context
    manager (closing it saves its records and results, and deletes its namespace unless
    cleanup=False). Keywords: image, image_map, runtime, context, kubectl, harden, prepull,
    cleanup (default True), ttl (seconds), quiet (default True), verbose; namespace and queue
    (a namespace it shares, a Kueue LocalQueue), cpu, memory, env ({"KEY": "VALUE"} or
    ["KEY=VALUE"]) and env_from_secret for each sandbox; otlp_endpoint (each episode's spans
    sent as it is finished; default $OTEL_EXPORTER_OTLP_ENDPOINT's) and pushgateway
    (metrics.prom pushed at the close).

        with rl_batch_demo.open_pool(output="runs/step-3", size=64, episodes=512) as pool:
            with pool.claim(task) as sandbox:
                result = sandbox.run(["pytest", "-q"], timeout=60)
                sandbox.finish(reward=1.0)
    """
    for name, value in (("size", size), ("episodes", episodes), ("idle_timeout", idle_timeout)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise KeywordTypeError(f"{name}= must be int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise UsageError(f"{name}={value!r}: must be at least 1")
    options = {"cleanup": True, "quiet": True, **keywords}
    for name, value in keywords.items():
        if name not in POOL_KEYWORDS:
            raise KeywordTypeError(f"open_pool() got an unexpected keyword argument {name!r}")
        if not isinstance(value, POOL_KEYWORDS[name]) or (
            bool not in POOL_KEYWORDS[name] and isinstance(value, bool)
        ):
            raise KeywordTypeError(
                f"{name}= must be {POOL_KEYWORDS[name][0].__name__}, got {type(value).__name__} {value!r}"
            )
    if "kubectl" in options:
        options["kubectl"] = os.fspath(options["kubectl"])
    if isinstance(options.get("env"), dict):  # env={"KEY": "VALUE"}, as os.environ reads
        options["env"] = [f"{key}={value}" for key, value in options["env"].items()]
    if isinstance(tasks, (str, os.PathLike)):
        task_list: list[Task] | None = read_tasks(os.fspath(tasks), PYTHON_CALL)
    else:
        task_list = None if tasks is None else python_tasks(tasks)
    request = pool_request(os.fspath(output), size, episodes, task_list, options, PYTHON_CALL)
    return open_pool_run(
        request, Caller(), PoolShape(request.runtime, request.harden, reuse, idle_timeout)
    )


if __name__ == "__main__":
    cli()
