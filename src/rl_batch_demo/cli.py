"""Command line: the parser, its checks, and `main`."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any, Callable, Sequence

from .constants import (
    CLIENT_GRACE_SECONDS,
    DEADLINE_GROWS_ABOVE_EPISODES,
    DEFAULT_COUNT,
    DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_IMAGE,
    DEFAULT_JOB_DEADLINE_SECONDS,
    DEFAULT_MAX_EPISODES,
    DEFAULT_RUNTIME,
    DELETE_WAIT_SECONDS,
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    LIST_PAGE_SIZE,
    TASK_FILE_ENV,
    __version__,
)
from .model import (
    COMMAND_LINE,
    Caller,
    DemoError,
    PoolShape,
    RunRequest,
    Spelling,
    Task,
    UsageError,
)
from .files import program_name
from .parse import parse_duration
from .manifests import image_groups, parallelism_shares, parse_image_map, parse_tasks, rewrite_image
from .podspec import episode_pod
from .lifecycle import cleanup, list_runs
from .run import exit_at_once, run_command, signals_interrupt
from .pool import pool_request, read_turns, run_pool, GUIDE_TURNS
from .report import compare, report
from .attach import attach_action


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
