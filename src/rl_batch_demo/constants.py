"""Constants: defaults, limits, timeouts, and the names of what a run creates and saves."""

from __future__ import annotations

import re
from pathlib import Path

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


def embedded_text(name: str) -> str:
    """A program this package ships in a ConfigMap, as text (the bundle holds it inline)."""
    return Path(__file__).with_name(name).read_text(encoding="utf-8")


# The episode program every pod runs, shipped in a ConfigMap.
WORKER_SOURCE = embedded_text("worker.py")

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
SERVER_SOURCE = embedded_text("sandbox_server.py")

# The program that kills this process's kubectl process groups once it is gone (kube.Guardian).
GUARDIAN_SOURCE = embedded_text("guardian.py")
# The variable that hands the guardian its program (its command line stays short).
GUARDIAN_VARIABLE = "RL_BATCH_DEMO_GUARDIAN"

# How a rollout's pod runs the episode program (`python -B /demo/launcher.py`, LAUNCHER_KEY in the
# ConfigMap): in this very process, so
# its /proc start time and import figures are its own; its own end recorded (see
# EPISODE_EXIT_ANNOTATION); in a Job of several, EPISODE_INDEX and TASK_FILE set first from the
# run-wide index of its completion index (which Kubernetes gives every pod of an Indexed Job as
# JOB_COMPLETION_INDEX), as in a run of one Job.
EPISODE_LAUNCHER = embedded_text("launcher.py")
