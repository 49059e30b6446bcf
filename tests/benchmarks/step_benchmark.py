#!/usr/bin/env python3
"""What a training step pays for beside its episodes: stream_batch() step after step in one
process, against the same steps run the guide's way, on the Kubernetes API emulator.

    python3 tests/benchmarks/step_benchmark.py [--steps 20] [--kubectl PATH] [--before DIR] [--no-guide]
                                               [--pause SECONDS]

Each step is 4 tasks x group size 2 (8 episodes, an episode script that rewards at once) through
`stream_batch()` (cleanup=True, its default), in one trainer process that makes every step, as a
training loop does; the guide's way is one run of tests/support/guide_client.py per step (8 of the
built-in worker's episodes, every kubectl a process of its own), then its cleanup. Per step:

- head: the call (or the guide's start) to the Job's creation, by the emulator's own record;
- Job: the Job's creation to its end seen by the client (client.json's `observed_at`), and
  apart the Job's own run (its creation to its end, by the emulator's record) and the client's
  lag in seeing that end;
- tail: the end seen to the call's return (the guide: to the end of its cleanup);
- kubectl processes started (counted by a wrapper every kubectl is run through);
- CPU-s: the trainer's (or the guide's) own and its kubectl children's, in all over the steps,
  divided by them (a kubectl kept for the process's life is counted once it has ended).

The tool's own time of a step is head + tail. Targets (issue 42, item 12): at most 0.3 s of it
and at most 2 kubectl processes a step, in a process making many steps. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Sequence

SUPPORT_DIR = Path(__file__).resolve().parent.parent / "support"
REPO_ROOT = SUPPORT_DIR.parent.parent
for _path in (str(SUPPORT_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import prereqs  # noqa: E402  (needs the path above)
from e2e_support import TASK_EPISODE_HEAD  # noqa: E402
from kube_emulator import Emulator  # noqa: E402

GUIDE = SUPPORT_DIR / "guide_client.py"
EMULATOR_FAULTS = {"sandbox_delay": 0.4, "sandbox_jitter": 0.1}
TASKS = 4
GROUP_SIZE = 2
TARGET_OWN_SECONDS = 0.3
TARGET_PROCESSES = 2

# Every kubectl the clients start goes through this, which counts it on a line of its own.
COUNTING_KUBECTL = '#!/bin/sh\necho >> "{count}"\nexec "{kubectl}" "$@"\n'

# The trainer: the steps, one after another in one process, each line of figures on stdout.
TRAINER = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import rl_batch_demo
out, script, steps, count_file = sys.argv[2:6]
tasks = [{"id": f"task-{n}"} for n in range(int(os.environ["STEP_TASKS"]))]
def used():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime
def started():
    with open(count_file) as handle:
        return sum(1 for _ in handle)
for step in range(int(steps)):
    before, kids_before, processes_before = *used(), started()
    called = time.time()
    lines = list(rl_batch_demo.stream_batch(
        tasks, output=f"{out}/step-{step}", group_size=int(os.environ["STEP_GROUP"]),
        episode_script=script, kubectl=os.environ["STEP_KUBECTL"]))
    returned = time.time()
    after, kids_after = used()
    print(json.dumps({"called": called, "returned": returned, "lines": len(lines),
        "own_cpu": after - before, "children_cpu": kids_after - kids_before,
        "processes": started() - processes_before, "output": f"{out}/step-{step}"}), flush=True)
    time.sleep(float(os.environ["STEP_PAUSE"]))  # the trainer's own work between steps
"""


def counting_kubectl(directory: Path, kubectl: str, name: str) -> tuple[Path, Path]:
    """A kubectl that counts its starts in a file of its own: (its path, the count's file)."""
    count = directory / f"{name}.count"
    count.write_text("")
    wrapper = directory / f"kubectl-{name}"
    wrapper.write_text(COUNTING_KUBECTL.format(count=count, kubectl=kubectl))
    wrapper.chmod(0o755)
    return wrapper, count


def lines_in(path: Path) -> int:
    return len(path.read_text().splitlines())


def job_times(emulator: Emulator, namespace: str) -> tuple[float, float]:
    """When the emulator created the step's Job (the first, with several) and when it ended (the
    last), by its own record."""
    jobs = [
        record
        for key, record in emulator.truth()["jobs"].items()
        if key.split("/", 1)[0] == namespace and "created" in record
    ]
    ended = [record.get("complete") or record.get("failed") or 0.0 for record in jobs]
    return min(record["created"] for record in jobs), max(ended)


def product_steps(
    emulator: Emulator,
    work: Path,
    kubectl: str,
    steps: int,
    product: Path = REPO_ROOT,
    pause: float = 0.0,
) -> tuple[list[dict], float]:
    """The steps through stream_batch() in one trainer process, by the rl_batch_demo.py in
    `product`: each step's figures, and the CPU-s of the whole process tree (the trainer, every
    kubectl it started) over all of them."""
    label = "product" if product == REPO_ROOT else "before"
    wrapper, count = counting_kubectl(work, kubectl, label)
    script = work / "episode.py"
    script.write_text(TASK_EPISODE_HEAD + 'emit("reward", reward=1.0)\n')
    env = dict(emulator.env(), STEP_KUBECTL=str(wrapper), STEP_TASKS=str(TASKS))
    env.update(STEP_GROUP=str(GROUP_SIZE), STEP_PAUSE=str(pause))
    argv = [sys.executable, "-c", TRAINER, str(product), str(work / label), str(script)]
    argv += [str(steps), str(count)]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    rows = [json.loads(line) for line in process.stdout]
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or len(rows) != steps:
        raise SystemExit(f"Error: the trainer exited {status} after {len(rows)} steps; see above")
    for row in rows:
        output = Path(row["output"])
        row["namespace"] = json.loads((output / "receipt.json").read_text())["namespace"]
        row["observed"] = json.loads((output / "client.json").read_text())["observed_at"]
    total_cpu = usage.ru_utime + usage.ru_stime
    return [step_figures(emulator, row) for row in rows], total_cpu


def guide_steps(
    emulator: Emulator, work: Path, kubectl: str, steps: int
) -> tuple[list[dict], float]:
    """The same steps the guide's way: its script once per step, then its cleanup."""
    wrapper, count = counting_kubectl(work, kubectl, "guide")
    rows, total_cpu = [], 0.0
    for step in range(steps):
        output = work / "guide" / f"step-{step}"
        output.parent.mkdir(parents=True, exist_ok=True)
        processes_before = lines_in(count)
        called = time.time()
        cpu = 0.0
        for action in ("run", "cleanup"):
            argv = [sys.executable, str(GUIDE), action, "--output", str(output)]
            argv += ["--kubectl", str(wrapper)]
            if action == "run":
                argv += [
                    "--count",
                    str(TASKS * GROUP_SIZE),
                    "--parallelism",
                    str(TASKS * GROUP_SIZE),
                ]
            process = subprocess.Popen(
                argv, env=emulator.env(), stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL
            )
            _, status, usage = os.wait4(process.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"Error: the guide's {action} exited {status}; see above")
            cpu += usage.ru_utime + usage.ru_stime
        returned = time.time()
        results = json.loads((output / "results.json").read_text())
        total_cpu += cpu
        rows.append(
            step_figures(
                emulator,
                {
                    "called": called,
                    "returned": returned,
                    "namespace": results["namespace"],
                    "observed": results["client_wait"]["observed_at"],
                    "processes": lines_in(count) - processes_before,
                    "own_cpu": cpu,
                    "children_cpu": 0.0,
                },
            )
        )
    return rows, total_cpu


def step_figures(emulator: Emulator, row: dict) -> dict:
    """head, Job and tail of one step, with its processes and CPU."""
    created, ended = job_times(emulator, row["namespace"])
    return {
        "head": created - row["called"],
        "job": row["observed"] - created,
        "run": ended - created,
        "lag": row["observed"] - ended,
        "tail": row["returned"] - row["observed"],
        "own": created - row["called"] + row["returned"] - row["observed"],
        "wall": row["returned"] - row["called"],
        "processes": row["processes"],
        "cpu": row["own_cpu"] + row["children_cpu"],
    }


class Column(NamedTuple):
    """One client's steps: its name, each step's figures, and the CPU-s of all its processes."""

    name: str
    steps: list[dict]
    cpu: float


def table(columns: Sequence[Column]) -> str:
    """The figures side by side (medians of the steps, the first step apart), then each other
    column's over the first's: above 1, the first is faster or leaner."""
    first = columns[0]
    figures: list[tuple[str, list[float], str]] = []
    for key, name in (
        ("head", "head: call -> Job created (s)"),
        ("job", "Job: created -> end seen (s)"),
        ("run", "  of which created -> ended (s)"),
        ("lag", "  and ended -> end seen (s)"),
        ("tail", "tail: end seen -> return (s)"),
        ("own", "tool's own time, head + tail (s)"),
        ("wall", "step wall time (s)"),
        ("processes", "kubectl processes started"),
    ):
        values = [statistics.median(r[key] for r in column.steps) for column in columns]
        figures.append((f"{name}, median", values, target(key, values[0])))
    for name, pick in (
        ("kubectl processes, max", lambda steps: max(r["processes"] for r in steps)),
        ("kubectl processes, steps 2.., max", lambda steps: max(r["processes"] for r in steps[1:])),
        ("first step: own time (s)", lambda steps: steps[0]["own"]),
    ):
        figures.append((name, [pick(column.steps) for column in columns], ""))
    steps = len(first.steps)
    cpu = [column.cpu / steps for column in columns]
    figures.append(("CPU-s per step, all processes", cpu, ""))
    ratios = [f"{column.name}/{first.name}" for column in columns[1:]]
    title = f"figure ({steps} steps of {TASKS * GROUP_SIZE} episodes)"
    head = f"{title:44}" + "".join(f"  {c.name:>9}" for c in columns)
    lines = [head + "".join(f"  {r:>15}" for r in ratios) + "  target"]
    lines.append("-" * len(lines[0]))
    for name, values, goal in figures:
        line = f"{name:44}" + "".join(f"  {value:9.3f}" for value in values)
        for value in values[1:]:
            ratio = f"{value / values[0]:.2f}" if values[0] else "inf" if value else "-"
            line += f"  {ratio:>15}"
        lines.append(f"{line}  {goal}".rstrip())
    return "\n".join(lines)


def target(key: str, value: float) -> str:
    if key == "own":
        return f"<= {TARGET_OWN_SECONDS} {'met' if value <= TARGET_OWN_SECONDS else 'MISSED'}"
    if key == "processes":
        return f"<= {TARGET_PROCESSES} {'met' if value <= TARGET_PROCESSES else 'MISSED'}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of each client (default 20)")
    parser.add_argument("--kubectl", help="the kubectl to run (default: the tests' kubectl 1.35)")
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="also the same steps by the rl_batch_demo.py in DIR (another version's, e.g. "
        "`git show BASE:rl_batch_demo.py > DIR/rl_batch_demo.py`), in the same run",
    )
    parser.add_argument("--no-guide", action="store_true", help="leave the guide's steps out")
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds the trainer waits between its steps, as its own work would (default 0)",
    )
    args = parser.parse_args()
    kubectl = args.kubectl or prereqs.find_kubectls(("1.35",)).get("1.35")
    if not kubectl:
        raise SystemExit("Error: no kubectl 1.35 found; pass --kubectl PATH")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="step-benchmark-") as directory:
        work = Path(directory)
        emulator = Emulator(work / "emulator", faults=dict(EMULATOR_FAULTS))
        emulator.start()
        try:
            steps = product_steps(emulator, work, kubectl, args.steps, REPO_ROOT, args.pause)
            columns = [Column("product", *steps)]
            if args.before:
                before = product_steps(
                    emulator, work, kubectl, args.steps, Path(args.before), args.pause
                )
                columns.append(Column("before", *before))
            if not args.no_guide:
                columns.append(Column("guide", *guide_steps(emulator, work, kubectl, args.steps)))
        finally:
            emulator.stop()
    print(
        f"emulator (faults {json.dumps(EMULATOR_FAULTS)}), kubectl {kubectl}; "
        f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(table(columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
