"""The `pool` action and open_pool(): live sandboxes from a warm pool on a plain Job, claimed by a
trainer that drives each turn by turn; the run's records, as any run's."""

from __future__ import annotations

import asyncio
import csv
import io
import http.client
import concurrent.futures
import dataclasses
import json
import os
import secrets
import sys
import threading
import time
import urllib.parse
from typing import Any, Callable, Sequence, TypeVar

from .constants import (
    COMMAND_TEXT_MOST,
    DEFAULT_IMAGE,
    LOG_READERS,
    DEFAULT_RUNTIME,
    LIST_PAGE_SIZE,
    COMMANDS_FILE,
    CONFIGMAP_NAME,
    POOL_JOB_NAME,
    RESULTS_FILE,
    RUN_LABEL,
    REWARDS_FILE,
    SERVER_KEY,
    SERVER_SOURCE,
    TOKEN_HEADER,
    TOKEN_SECRET,
)
from .model import Caller, DemoError, PoolShape, RunPlan, RunRequest, Spelling, Task, UsageError
from .stats import percentile, rounded
from .parse import parse_time
from .timing import WHOLE_SECOND
from .files import cleanup_command, write_json, write_text
from .render import plural
from .manifests import (
    namespace_manifest,
    parallelism_shares,
    pool_job_manifest,
    pool_network_policy_manifest,
    rewrite_image,
    token_secret_manifest,
)
from .kube import KubectlError
from .metrics import push_saved_metrics
from .telemetry import RunTracer, finish_trace, open_tracer
from .pooltelemetry import (
    POOL_POINTS,
    PoolTelemetry,
    pod_to_ready,
    sandbox_start,
    pool_episode,
    pool_episodes,
    pool_timeline_svg,
    trace_episode,
    write_pool_metrics,
)
from .sandboxes import (
    PROBE_INTERVAL_SECONDS,
    PROBE_MOST_SECONDS,
    REQUEST_GRACE_SECONDS,
    RETRY_SECONDS,
    CommandResult,
    CommandTimeout,
    PodView,
    PodWatch,
    PoolState,
    ProxyAnswer,
    ProxyClient,
    SandboxLost,
    command_text,
    container_started,
    encoded_stdin,
    sandbox_path,
)
from .follow import RunContext
from .preflight import check_capacity, check_runtime_class, save_run_records
from .lifecycle import cleanup_namespace
from .kueue import check_queue, check_shared_namespace, queue_word, stop_queued
from .tenancy import queued_job, run_suffix, shared_jobs, shared_setup
from .podspec import episode_pod, secret_copy_manifest
from .secretcopy import ReadSecrets, filled, read_secret, read_secrets
from .run import (
    close,
    create_namespace,
    create_object,
    open_proxy,
    prepull,
    start_run,
    stamp_origin,
)

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
