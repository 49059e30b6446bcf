"""The Python API: `run_batch` and `stream_batch`, over the same settings as the command line."""

from __future__ import annotations

import argparse
import json
import os
import queue
import threading
from typing import Any, Callable, Generator, NamedTuple, Sequence

from .constants import (
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    EXIT_PARTIAL,
    RECEIPT_FILE,
    RESULTS_FILE,
    REWARDS_FILE,
)
from .model import (
    Caller,
    KeywordTypeError,
    PoolShape,
    PYTHON_CALL,
    RunRequest,
    StopRequest,
    Task,
    UsageError,
)
from .files import attach_command, read_json, read_text
from .manifests import parse_tasks
from .run import dry_run_listing, perform_run
from .pool import Pool, open_pool_run, pool_request
from .attach import AttachRequest, attach_run
from .cli import (
    build_parser,
    dash_values_joined,
    non_negative_int,
    positive_int,
    read_tasks,
    run_request,
)


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
