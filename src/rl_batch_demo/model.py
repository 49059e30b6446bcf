"""Errors, and the records the modules share (`RunRequest`, `Caller`, `Settings`, `Task`, `RunPlan`)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, NamedTuple

from .constants import DEFAULT_IMAGE, DEFAULT_JOB_DEADLINE_SECONDS, DEFAULT_RUNTIME, LIST_PAGE_SIZE


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
