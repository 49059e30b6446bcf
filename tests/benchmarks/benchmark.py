#!/usr/bin/env python3
"""Benchmark the product's client against the guide's method on the emulator.

Usage:
    python3 tests/benchmarks/benchmark.py [--quick] [--kubectl PATH] [--cases 10,20,200,500]
                               [--reps N] [--guide-max N] [--keep]
    python3 tests/benchmarks/benchmark.py --scale [--scale-10000]
    python3 tests/benchmarks/benchmark.py --images
    ... [--loaded]    every case again under two busy loops per core, printed after the quiet figures
    python3 tests/benchmarks/benchmark.py --replay 10000@500,100000@2000
                      the cost model: the product followed against tests/support/replay_kubectl.py

For each case it starts a fresh Kubernetes API emulator (tests/support/kube_emulator.py,
pods run for real in bubblewrap), then runs, one after the other and in new
namespaces of that same emulator, the product (`rl_batch_demo.py run --quiet`)
and the guide's method (`tests/support/guide_client.py`: poll the Job once a second with
a new kubectl each time, then fetch pods, events and every log four at a time).
The emulator records the true moment each Job condition was set, so:

    completion lag        = client's observed_at (wall) - true time of Complete/Failed
    post-completion work  = results.json mtime - client's observed_at
    end -> exit           = the moment the client process had exited - true time of Complete/Failed
    kubectl while waiting = the client's own count of processes started while waiting
    CPU                   = rusage of the client process and its waited-for kubectl
                            children (os.wait4), plus the client's own share alone
    peak RSS              = the client process's own VmHWM at exit (kubectl excluded)
    largest process       = the highest VmHWM of the client and each kubectl it started
                            (children sampled every 20 ms, each at its last sample)

10- and 20-episode cases are repeated (--reps; medians reported; the two
clients alternate which goes first). Large cases (200 at parallelism 20, 500 at
parallelism 50) run the product once, and the guide once up to --guide-max
episodes. A separate pair of 10-episode runs with a 0.4 s and a 5 s sandbox
delay shows whether kubectl processes started while waiting grow with the wait.
The episode worker's start is measured with `python -X importtime`: modules
imported before `ready`, their import time, and spawn -> ready wall time, against
a straightforward worker (json and subprocess imported at the top).

Emulator timing: faults sandbox_delay 0.4 s, sandbox_jitter 0.1 s (as the
end-to-end tests use), 3 nodes, Kubernetes 1.33; everything else the
emulator's defaults (job status lag 0.2 s, scheduler 10 ms).

--scale measures the scale targets at 500 and 2,000 episodes (and 10,000 with
--scale-10000), parallelism 1,000, on the emulator's lightweight kubelet, whose
containers emit the built-in worker's events with realistic timing but spawn no
process (the client is the real one, with real kubectl): completion lag,
post-completion time, peak RSS, kubectl processes, API requests per episode from
the emulator's request log, and watches answered 410 Gone or restarted. Each size
is set against the smallest one measured in the same invocation.

--streaming measures streaming rollouts: 32 episodes of which 4 hang for 120 s (real
episodes in bubblewrap), run once with `--need 28` and once waiting for all: wall time,
the time from the Job's creation to the first and the 28th reward in rewards.jsonl; and the
delivery lag (each line's container end -> the line written, results.json's
reward_delivery_lag_*) at 2,000 episodes on the lightweight kubelet, with the client's CPU.

--images measures an image per task: 8 tasks x 8 episodes, each task its own 150 MB image (a
3 s cold pull), on 2 nodes of the lightweight kubelet, parallelism 16 shared by the 8 Jobs; a
fresh emulator for each of: every image cold with the kubelet's default of one pull at a time
per node, cold with 8 pulls at once (maxParallelImagePulls), with --prepull (pre-pull and batch
shown apart), and every image present (the baseline).

Not part of the pytest run. Standard library only.
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

SUPPORT_DIR = Path(__file__).resolve().parent.parent / "support"
REPO_ROOT = SUPPORT_DIR.parent.parent
for _path in (str(SUPPORT_DIR), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import prereqs  # noqa: E402  (needs the path above)
import rl_batch_demo  # noqa: E402
from e2e_support import TASK_EPISODE_HEAD  # noqa: E402
from kube_emulator import Emulator  # noqa: E402

PRODUCT = REPO_ROOT / "rl_batch_demo.py"
GUIDE = SUPPORT_DIR / "guide_client.py"

EMULATOR_FAULTS = {"sandbox_delay": 0.4, "sandbox_jitter": 0.1}
LONG_SANDBOX_DELAY = 5.0
WAIT_CHECK_COUNT = 10
SCALE_PARALLELISM = {200: 20, 500: 50}
RSS_SAMPLE_SECONDS = 0.02
WORKER_TIMING_RUNS = 9

TARGET_LAG_SECONDS = 0.2
TARGET_POST_SECONDS_20 = 0.5

# Scale on the emulator's lightweight kubelet: containers emit the built-in worker's events
# with realistic timing but spawn no process, so thousands of pods fit on two cores.
LIGHTWEIGHT_FAULTS = dict(EMULATOR_FAULTS, lightweight_kubelet=True)
LIGHTWEIGHT_PARALLELISM = 1000
LIGHTWEIGHT_SIZES = (500, 2000)
LIGHTWEIGHT_LONG_SIZE = 10000
LIGHTWEIGHT_DEADLINE_SECONDS = 3600
TARGET_POST_SECONDS = {2000: 1.0, 10000: 3.0}
# From the Job's true end to the process's exit, on a quiet machine.
TARGET_TAIL_SECONDS = {20: 0.1, 2000: 0.5, 10000: 2.0}
TARGET_PEAK_RSS_MB = (
    300  # for every process of the run at 10,000 episodes: the tool and each kubectl
)
# --loaded: the cases measured again with this many busy loops per core, to show what load costs.
BUSY_LOOPS_PER_CORE = 2
TARGET_REQUESTS_PER_EPISODE = 1.2

# Runs a script as __main__ and, at exit, writes the rusage of this process
# alone and of its finished children to the file named by argv[1]. Its peak memory is
# VmHWM, the high-water mark of its own address space: Linux starts ru_maxrss after an
# exec at the RSS of the process that spawned it (here the benchmark, with its emulator).
# The product ends with os._exit, which skips atexit: the report is written just before it.
RUSAGE_WRAPPER = """\
import atexit, json, os, resource, runpy, sys
usage_path, script = sys.argv[1], sys.argv[2]
def _exit_reporting(status, _exit=os._exit):
    _report()
    _exit(status)
os._exit = _exit_reporting
def _report():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kb = own.ru_maxrss
    try:
        with open("/proc/self/status") as status:
            peak_kb = int(status.read().split("VmHWM:")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    with open(usage_path, "w") as handle:
        json.dump({"self_cpu": own.ru_utime + own.ru_stime, "self_maxrss_kb": peak_kb,
                   "children_cpu": kids.ru_utime + kids.ru_stime}, handle)
atexit.register(_report)
sys.argv = sys.argv[2:]
sys.path[0] = __import__("os").path.dirname(script)
runpy.run_path(script, run_name="__main__")
"""

STRAIGHTFORWARD_WORKER = """\
import json
import os
import subprocess
import sys
import time

EPISODE_ID = os.environ.get("EPISODE_ID", "")
BUGGY_SOURCE = {buggy!r}
TEST_SOURCE = {tests!r}


def emit(event, **fields):
    print(json.dumps(dict(event=event, at=time.time(), episode_id=EPISODE_ID, **fields)), flush=True)


def run_tests():
    return subprocess.run([sys.executable, "-B", "test_shipping.py"],
                          capture_output=True, text=True, timeout=20)


def main():
    os.chdir({workspace!r})
    with open("shipping.py", "w") as handle:
        handle.write(BUGGY_SOURCE)
    with open("test_shipping.py", "w") as handle:
        handle.write(TEST_SOURCE)
    emit("ready")
    baseline = run_tests()
    if baseline.returncode == 0:
        sys.exit("baseline must fail the boundary test")
    with open("shipping.py") as handle:
        source = handle.read()
    with open("shipping.py", "w") as handle:
        handle.write(source.replace("total > 99", "total >= 99"))
    patched = run_tests()
    emit("reward", reward=1 if patched.returncode == 0 else 0, baseline_exit=baseline.returncode,
         tests_exit=patched.returncode, tests_output=patched.stderr)
    if patched.returncode != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
"""


class BenchmarkError(Exception):
    """A run that did not finish as it should: one line on stderr, exit status 1."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# One client run, measured from outside.


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started that still run (kubectl), from every thread of it that started one."""
    pids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                pids += [int(child) for child in handle.read().split()]
    except (OSError, ValueError):
        pass
    return pids


def high_water_kb(pid: int) -> int | None:
    """A process's VmHWM (its peak resident memory so far), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def sample_rss(
    pid: int,
    samples: list[tuple[float, int, int, float]],
    children_peak_kb: dict[int, int],
    stop: threading.Event,
) -> None:
    """(wall time, VmRSS kB, VmHWM kB, CPU seconds) of the process every few milliseconds until it ends,
    and each child's (kubectl's) VmHWM as last seen."""
    path = f"/proc/{pid}/status"
    ticks = os.sysconf("SC_CLK_TCK")
    while not stop.is_set():
        try:
            with open(path) as handle:
                fields = dict(
                    line.split(":", 1) for line in handle if line.startswith(("VmRSS", "VmHWM"))
                )
            with open(f"/proc/{pid}/stat") as handle:
                # utime and stime, after the command name (which may hold spaces) and 11 other fields
                stat = handle.read().rsplit(")", 1)[1].split()
            samples.append(
                (
                    time.time(),
                    int(fields["VmRSS"].split()[0]),
                    int(fields["VmHWM"].split()[0]),
                    (int(stat[11]) + int(stat[12])) / ticks,
                )
            )
        except (OSError, ValueError, KeyError, IndexError):
            return
        for child in child_pids(pid):
            peak = high_water_kb(child)
            if peak is not None:
                children_peak_kb[child] = max(peak, children_peak_kb.get(child, 0))
        stop.wait(RSS_SAMPLE_SECONDS)


def run_client(
    emulator: Emulator,
    kind: str,
    count: int,
    parallelism: int,
    kubectl: str,
    workdir: Path,
    label: str,
    extra: Sequence[str] = (),
) -> dict:
    """Run the product or the guide's client once; return its figures, measured from outside."""
    output = workdir / label
    usage_path = workdir / f"{label}.rusage.json"
    if kind == "product":
        script = PRODUCT
        args = [
            "run",
            "--quiet",
            "--count",
            str(count),
            "--parallelism",
            str(parallelism),
            "--max-episodes",
            str(max(count, rl_batch_demo.DEFAULT_MAX_EPISODES)),
            "--output",
            str(output),
            "--kubectl",
            kubectl,
            *extra,
        ]
    else:
        script = GUIDE
        args = [
            "--count",
            str(count),
            "--parallelism",
            str(parallelism),
            "--output",
            str(output),
            "--kubectl",
            kubectl,
        ]
    argv = [sys.executable, "-c", RUSAGE_WRAPPER, str(usage_path), str(script)] + args
    requests_before, expired_before = len(emulator.requests), emulator.watches_expired
    with (
        open(workdir / f"{label}.stdout", "wb") as stdout,
        open(workdir / f"{label}.stderr", "wb") as stderr,
    ):
        started = time.monotonic()
        process = subprocess.Popen(
            argv, env=emulator.env(), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
        )
        samples: list[tuple[float, int, int, float]] = []
        children_peak_kb: dict[int, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(
            target=sample_rss, args=(process.pid, samples, children_peak_kb, stop), daemon=True
        )
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        exited_at = time.time()
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - started
        stop.set()
        sampler.join()
    if process.returncode != 0:
        tail = (workdir / f"{label}.stderr").read_text(errors="replace").strip().splitlines()[-5:]
        raise BenchmarkError(f"{kind} run {label} exited {process.returncode}: {' | '.join(tail)}")
    results = json.loads((output / "results.json").read_text())
    wait = results["client_wait"]
    truth = emulator.truth()["jobs"][f"{results['namespace']}/{rl_batch_demo.JOB_NAME}"]
    end_truth = truth.get("complete") or truth.get("failed")
    own = json.loads(usage_path.read_text())
    # The run's API requests, timed from the moment it saw the end (kept with --keep, for diagnosis).
    requests = [
        dict(r, at=round(r["at"] - wait["observed_at"], 4))
        for r in list(emulator.requests)
        if f"/namespaces/{results['namespace']}/" in r["path"]
    ]
    (workdir / f"{label}.requests.json").write_text(json.dumps(requests, indent=1))
    # (seconds after the end was seen, VmRSS MB, VmHWM MB, CPU seconds) of the tool, to tell when memory grew.
    (workdir / f"{label}.rss.json").write_text(
        json.dumps(
            [
                [round(moment - wait["observed_at"], 3), rss // 1024, hwm // 1024, cpu]
                for moment, rss, hwm, cpu in samples
            ]
        )
    )
    at_end = [
        (rss, hwm, cpu) for moment, rss, hwm, cpu in samples if moment <= wait["observed_at"]
    ] or [(0, 0, 0.0)]
    return {
        "kind": kind,
        "count": count,
        "parallelism": parallelism,
        "wall_seconds": wall,
        "lag_seconds": wait["observed_at"] - end_truth,
        "post_seconds": os.path.getmtime(output / "results.json") - wait["observed_at"],
        "post_self_reported_seconds": wait.get("post_completion_seconds"),
        # The Job's true end to the moment the process had exited (its wait returned): what a
        # trainer that runs the tool every step waits for after the batch is done.
        "tail_seconds": exited_at - end_truth,
        "peak_child_rss_mb": max(children_peak_kb.values(), default=0) / 1024,
        "processes_while_waiting": wait["kubectl_processes_while_waiting"],
        "kubectl_processes": results["client"]["kubectl_processes"],
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "tool_cpu_seconds": own["self_cpu"],
        "kubectl_cpu_seconds": own["children_cpu"],
        "peak_rss_mb": own["self_maxrss_kb"] / 1024,
        "largest_process_mb": max([own["self_maxrss_kb"], *children_peak_kb.values()]) / 1024,
        "rss_at_end_mb": at_end[-1][0] / 1024,
        "peak_rss_at_end_mb": at_end[-1][1] / 1024,
        # The tool's own CPU after it saw the end: what the post-completion work costs on an idle machine.
        "post_cpu_seconds": own["self_cpu"] - at_end[-1][2],
        "wait_seconds": wait["observed_at"] - wait["submitted_at"],
        "truth_wait_seconds": end_truth - wait["submitted_at"],
        # Every request the run made, cluster-wide ones (nodes, discovery) included: nothing
        # else talks to the emulator over HTTP while it runs.
        "api_requests": len(emulator.requests) - requests_before,
        "watches_expired": emulator.watches_expired - expired_before,
        "watch_restarts": wait.get("watch_restarts", 0),
        "watch_queue_peak": wait.get("watch_queue_peak"),
        "pods_read_pages": (wait.get("pods_read") or {}).get("pages"),
    }


def median_of(runs: Sequence[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


# --------------------------------------------------------------------------
# The cases.


def with_emulator(workdir: Path, faults: dict, body: Callable[[Emulator], Any]) -> Any:
    emulator = Emulator(workdir / "emulator", faults=dict(faults))
    emulator.start()
    try:
        return body(emulator)
    finally:
        emulator.stop()


def repeated_case(count: int, reps: int, kubectl: str, root: Path) -> dict[str, list[dict]]:
    """`reps` runs of each client on one emulator, alternating which goes first."""
    workdir = root / f"case-{count}"
    workdir.mkdir()
    runs: dict[str, list[dict]] = {"product": [], "guide": []}

    def body(emulator: Emulator) -> None:
        for rep in range(reps):
            order = ("product", "guide") if rep % 2 == 0 else ("guide", "product")
            for kind in order:
                figures = run_client(
                    emulator, kind, count, count, kubectl, workdir, f"{kind}-{rep}"
                )
                runs[kind].append(figures)
                say(
                    f"  {count:>3} episodes, {kind:<7} run {rep + 1}/{reps}: lag {figures['lag_seconds']:.3f} s, "
                    f"post {figures['post_seconds']:.3f} s, wall {figures['wall_seconds']:.1f} s"
                )

    with_emulator(workdir, EMULATOR_FAULTS, body)
    return runs


def scale_case(
    count: int, parallelism: int, with_guide: bool, kubectl: str, root: Path
) -> dict[str, dict]:
    """One product run (and one guide run if asked) of a large batch."""
    workdir = root / f"scale-{count}"
    workdir.mkdir()
    runs: dict[str, dict] = {}

    def body(emulator: Emulator) -> None:
        for kind in ("product", "guide") if with_guide else ("product",):
            runs[kind] = run_client(emulator, kind, count, parallelism, kubectl, workdir, kind)
            say(
                f"  {count:>3} episodes (parallelism {parallelism}), {kind:<7}: "
                f"post {runs[kind]['post_seconds']:.3f} s, wall {runs[kind]['wall_seconds']:.1f} s"
            )

    with_emulator(workdir, EMULATOR_FAULTS, body)
    return runs


def lightweight_case(count: int, kubectl: str, root: Path) -> dict:
    """One product run of `count` episodes at parallelism 1,000 (or the count) on the lightweight kubelet."""
    workdir = root / f"lightweight-{count}"
    workdir.mkdir()

    def body(emulator: Emulator) -> dict:
        # The emulator, not the client, sets the pace (about 20 to 50 pods a second on two
        # loaded CPUs): the Job's deadline is the emulator's, not a cluster's.
        figures = run_client(
            emulator,
            "product",
            count,
            min(count, LIGHTWEIGHT_PARALLELISM),
            kubectl,
            workdir,
            "product",
            ["--timeout", str(LIGHTWEIGHT_DEADLINE_SECONDS)],
        )
        say(
            f"  {count:>5} episodes (parallelism {figures['parallelism']}, lightweight kubelet): lag "
            f"{figures['lag_seconds']:.3f} s, post {figures['post_seconds']:.3f} s, "
            f"wall {figures['wall_seconds']:.1f} s"
        )
        return figures

    return with_emulator(workdir, LIGHTWEIGHT_FAULTS, body)


STRAGGLER_COUNT, STRAGGLER_NEED, STRAGGLERS, STRAGGLER_HANG_SECONDS = 32, 28, 4, 120
DELIVERY_LAG_SIZE = 2000
TARGET_DELIVERY_LAG_P99_SECONDS = 0.5
# Reads its task; a straggler's task makes it hang before its reward.
HANGING_EPISODE = (
    TASK_EPISODE_HEAD
    + """\
time.sleep(task.get("hang", 0))
emit("reward", reward=1)
"""
)


def nth_reward_seconds(output: Path, n: int) -> float | None:
    """From the start of the create call to the n-th successful line written (client.json's deliveries)."""
    client = json.loads((output / "client.json").read_text())
    observed = json.loads((output / "observed.json").read_text())
    submitted = observed["job"]["submitted"]
    written = sorted(d[2] for d in client["reward_deliveries"] if d[1])
    return written[n - 1] - submitted if len(written) >= n else None


def straggler_case(kubectl: str, root: Path) -> dict[str, dict]:
    """32 episodes, 4 hanging 120 s: --need 28 against waiting for all, on one emulator."""
    workdir = root / "stragglers"
    workdir.mkdir()
    tasks = workdir / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": n, "hang": STRAGGLER_HANG_SECONDS if n % 8 == 3 else 0}) + "\n"
            for n in range(STRAGGLER_COUNT)
        )
    )
    script = workdir / "hanging_episode.py"
    script.write_text(HANGING_EPISODE)
    runs: dict[str, dict] = {}

    def body(emulator: Emulator) -> None:
        for label, extra in (
            ("need", ["--need", str(STRAGGLER_NEED)]),
            ("all", ["--allow-failures", "0"]),
        ):
            figures = run_client(
                emulator,
                "product",
                STRAGGLER_COUNT,
                STRAGGLER_COUNT,
                kubectl,
                workdir,
                label,
                ["--tasks", str(tasks), "--episode-script", str(script), *extra],
            )
            results = json.loads((workdir / label / "results.json").read_text())
            figures.update(
                first=results["first_reward_seconds"],
                kth=nth_reward_seconds(workdir / label, STRAGGLER_NEED),
                cancelled=results.get("cancelled_episodes"),
                lag_p99=results["reward_delivery_lag_p99_seconds"],
            )
            runs[label] = figures
            say(
                f"  {label}: wall {figures['wall_seconds']:.1f} s, 28th reward {figures['kth']:.2f} s"
            )

    with_emulator(workdir, EMULATOR_FAULTS, body)
    return runs


def delivery_lag_case(kubectl: str, root: Path) -> dict:
    """A 2,000-episode rollout on the lightweight kubelet: each line's delivery lag, and the client's CPU."""
    workdir = root / f"delivery-{DELIVERY_LAG_SIZE}"
    workdir.mkdir()

    def body(emulator: Emulator) -> dict:
        figures = run_client(
            emulator,
            "product",
            DELIVERY_LAG_SIZE,
            min(DELIVERY_LAG_SIZE, LIGHTWEIGHT_PARALLELISM),
            kubectl,
            workdir,
            "product",
            ["--timeout", str(LIGHTWEIGHT_DEADLINE_SECONDS), "--allow-failures", "0"],
        )
        results = json.loads((workdir / "product" / "results.json").read_text())
        figures.update(
            {
                key: results[key]
                for key in (
                    "reward_delivery_lag_p50_seconds",
                    "reward_delivery_lag_p99_seconds",
                    "reward_delivery_lag_max_seconds",
                    "first_reward_seconds",
                )
            },
            delivery=results["reward_delivery"],
        )
        return figures

    return with_emulator(workdir, LIGHTWEIGHT_FAULTS, body)


# --images: 8 tasks x 8 episodes, each task its own image of IMAGE_BYTES, on 2 nodes (lightweight
# kubelet: the episodes spawn no process, the pulls take the emulator's time from the image's size).
IMAGE_TASKS, IMAGE_GROUP, IMAGE_NODES, IMAGE_PARALLELISM = 8, 8, 2, 16
IMAGE_BYTES, IMAGE_PULL_RATE = 150_000_000, 50e6  # a 3 s cold pull
IMAGE_CASES = (
    ("cold, serialized pulls", {}, []),
    ("cold, parallel pulls", {"max_parallel_image_pulls": IMAGE_TASKS}, []),
    ("--prepull", {}, ["--prepull"]),
    ("all present", {"present": True}, []),
)


def image_case(kubectl: str, root: Path) -> dict[str, dict]:
    """The same 64-episode rollout of 8 images on a fresh emulator per case: cold (the kubelet's default of
    one pull at a time per node, then maxParallelImagePulls 8), with --prepull, and every image present."""
    tasks_file = root / "image-tasks.jsonl"
    images = [f"registry.bench.local/task-{n}:1" for n in range(IMAGE_TASKS)]
    tasks_file.write_text(
        "".join(
            json.dumps({"id": f"task-{n}", "image": image}) + "\n" for n, image in enumerate(images)
        )
    )
    script = root / "image_episode.py"
    script.write_text(HANGING_EPISODE)
    runs: dict[str, dict] = {}
    for number, (label, store, extra) in enumerate(IMAGE_CASES):
        workdir = root / f"images-{number}"
        workdir.mkdir()
        options = {
            "registry": {image: IMAGE_BYTES for image in images},
            "pull_bytes_per_second": IMAGE_PULL_RATE,
        }
        options.update({key: value for key, value in store.items() if key != "present"})
        if store.get("present"):
            options["present"] = {image: True for image in images}
        emulator = Emulator(
            workdir / "emulator", faults=dict(LIGHTWEIGHT_FAULTS), nodes=IMAGE_NODES, images=options
        )
        emulator.start()
        try:
            output = workdir / "run"
            argv = [
                sys.executable,
                str(PRODUCT),
                "run",
                "--quiet",
                "--tasks",
                str(tasks_file),
                "--group-size",
                str(IMAGE_GROUP),
                "--episode-script",
                str(script),
                "--parallelism",
                str(IMAGE_PARALLELISM),
                "--max-episodes",
                str(IMAGE_TASKS * IMAGE_GROUP),
                "--allow-failures",
                "0",
                "--output",
                str(output),
                "--kubectl",
                kubectl,
                *extra,
            ]
            started = time.monotonic()
            done = subprocess.run(
                argv, env=emulator.env(), capture_output=True, text=True, timeout=1800
            )
            wall = time.monotonic() - started
        finally:
            emulator.stop()
        if done.returncode != 0:
            raise BenchmarkError(
                f"images run {label!r} exited {done.returncode}: "
                f"{' | '.join(done.stderr.strip().splitlines()[-5:])}"
            )
        results = json.loads((output / "results.json").read_text())
        pulls = results["phases"]["image_pull"]
        waiting = [
            entry["image_pull_waiting_p50_seconds"]
            for entry in results["images"].values()
            if entry["image_pull_waiting_p50_seconds"] is not None
        ]
        pulled_p50 = [
            entry["image_pull_p50_seconds"]
            for entry in results["images"].values()
            if entry["image_pull_p50_seconds"] is not None
        ]
        runs[label] = {
            "wall": wall,
            "prepull": (results.get("prepull") or {}).get("seconds"),
            "batch": results["client_job_complete_seconds"],
            "rewards": results["batch_to_all_rewards_seconds"],
            "pod_to_ready_p50": results["pod_to_ready_p50_seconds"],
            "pod_to_ready_p95": results["pod_to_ready_p95_seconds"],
            "pull_p50": statistics.median(pulled_p50) if pulled_p50 else None,
            "pull_max": pulls.get("max"),
            "waiting_p50": statistics.median(waiting) if waiting else None,
            "pulled": results["image_cache"]["pulled"],
            "present": results["image_cache"]["present"],
            "jobs": results["jobs"],
        }
        say(
            f"  {label}: wall {wall:.1f} s, batch {runs[label]['batch']} s, pulled {runs[label]['pulled']}"
        )
    return runs


def image_lines(runs: dict[str, dict]) -> list[str]:
    """The image cases side by side; the baseline is every image present."""
    labels = [label for label, _, _ in IMAGE_CASES]
    base = runs["all present"]

    def row(name: str, key: str) -> str:
        cells = [fmt(runs[label][key]) for label in labels]
        return f"{name:<34}" + "".join(f"{cell:>24}" for cell in cells)

    lines = [
        f"\nImages: {IMAGE_TASKS} tasks x {IMAGE_GROUP} episodes, "
        f"{IMAGE_TASKS} images of {IMAGE_BYTES // 10**6} MB "
        f"(a {IMAGE_BYTES / IMAGE_PULL_RATE:.0f} s cold pull at {IMAGE_PULL_RATE / 1e6:.0f} MB/s), {IMAGE_NODES} "
        f"nodes, parallelism {IMAGE_PARALLELISM} shared by {runs['all present']['jobs']} Jobs, lightweight "
        f"kubelet (faults {json.dumps(LIGHTWEIGHT_FAULTS)}); a fresh emulator per case",
        f"{'figure':<34}" + "".join(f"{label:>24}" for label in labels),
        row("run wall time (s)", "wall"),
        row("pre-pull step (s)", "prepull"),
        row("batch: create -> seen complete (s)", "batch"),
        row("batch: Job created -> last reward", "rewards"),
        row("pod_to_ready p50 (s)", "pod_to_ready_p50"),
        row("pod_to_ready p95 (s)", "pod_to_ready_p95"),
        row("image_pull of pulls, p50 (s) *", "pull_p50"),
        row("image_pull phase max (s)", "pull_max"),
        row("kubelet's wait in pulls, p50 (s) *", "waiting_p50"),
        row("episodes that pulled", "pulled"),
        row("episodes that found it present", "present"),
    ]
    lines.append(
        "* over the episodes that pulled: per image its p50, the median of the images' (results.json's "
        "images); the wait is the kubelet's own, its Pulled message's total less its pull"
    )
    serial, parallel = runs["cold, serialized pulls"], runs["cold, parallel pulls"]
    lines.append(
        f"serialized pulls cost {serial['batch'] - parallel['batch']:.1f} s of the cold batch "
        f"({serial['batch']:.1f} s against {parallel['batch']:.1f} s with {IMAGE_TASKS} pulls at once; "
        f"the emulator gives each pull its own {IMAGE_PULL_RATE / 1e6:.0f} MB/s, so this is the most parallel "
        f"pulls can save, when one pull cannot fill the node's link); every image present: "
        f"{base['batch']:.1f} s; --prepull: {runs['--prepull']['prepull']:.1f} s of pre-pull, then "
        f"{runs['--prepull']['batch']:.1f} s of batch"
    )
    return lines


def streaming_lines(stragglers: dict[str, dict], delivery: dict) -> list[str]:
    need, everything = stragglers["need"], stragglers["all"]
    lines = [
        f"\nStreaming: {STRAGGLER_COUNT} episodes, {STRAGGLERS} hang {STRAGGLER_HANG_SECONDS} s "
        f"(faults {json.dumps(EMULATOR_FAULTS)}; times from the Job's creation)",
        render_table(
            [
                (
                    "wall time of the run",
                    round(need["wall_seconds"], 2),
                    round(everything["wall_seconds"], 2),
                    ratio(need["wall_seconds"], everything["wall_seconds"]),
                    "",
                ),
                (
                    f"{STRAGGLER_NEED}th reward in rewards.jsonl",
                    round(need["kth"], 2),
                    round(everything["kth"], 2),
                    ratio(need["kth"], everything["kth"]),
                    "",
                ),
                ("first reward in rewards.jsonl", need["first"], everything["first"], "", ""),
                ("episodes cancelled", need["cancelled"], everything["cancelled"] or 0, "", ""),
                ("delivery lag p99 (s)", need["lag_p99"], everything["lag_p99"], "", ""),
            ],
            header=("figure", f"--need {STRAGGLER_NEED}", "wait for all", "all / need", "target"),
        ),
    ]
    lines += [
        f"\nDelivery lag at {DELIVERY_LAG_SIZE} episodes (lightweight kubelet, parallelism "
        f"{min(DELIVERY_LAG_SIZE, LIGHTWEIGHT_PARALLELISM)}): "
        f"p50 {delivery['reward_delivery_lag_p50_seconds']} s, "
        f"p99 {delivery['reward_delivery_lag_p99_seconds']} s (target < {TARGET_DELIVERY_LAG_P99_SECONDS} s: "
        f"{verdict(delivery['reward_delivery_lag_p99_seconds'] < TARGET_DELIVERY_LAG_P99_SECONDS)}), "
        f"max {delivery['reward_delivery_lag_max_seconds']} s; lines streamed "
        f"{delivery['delivery']['streamed']} of {delivery['delivery']['lines']}; lag precision "
        f"{delivery['delivery']['lag_precision_seconds']} s; of it the client's own part (its watch seeing the "
        f"end -> the line written) p50 {delivery['delivery']['seen_to_written_p50_seconds']} s, p99 "
        f"{delivery['delivery']['seen_to_written_p99_seconds']} s; "
        f"client CPU {delivery['tool_cpu_seconds']:.1f} s "
        f"(+ kubectl {delivery['kubectl_cpu_seconds']:.1f} s), wall {delivery['wall_seconds']:.1f} s"
    ]
    return lines


def lightweight_rows(runs: dict[int, dict]) -> list[tuple[str, Any, Any, str, str]]:
    """The scale targets at each size, and each size against the smallest measured in this run."""
    rows: list[tuple[str, Any, Any, str, str]] = []
    if not runs:
        return rows
    base_count = min(runs)
    base = runs[base_count]

    def add(name: str, value: Any, baseline: Any, target: str = "") -> None:
        shown_ratio = "-"
        if isinstance(value, (int, float)) and isinstance(baseline, (int, float)) and baseline:
            shown_ratio = f"{value / baseline:.2f}"
        rows.append((name, value, baseline, shown_ratio, target))

    for count, run in sorted(runs.items()):
        prefix = f"{count} ep (p{run['parallelism']}, lightweight)"
        lag = run["lag_seconds"]
        add(
            f"{prefix}: completion lag (s)",
            lag,
            base["lag_seconds"],
            f"<= {TARGET_LAG_SECONDS} {verdict(lag <= TARGET_LAG_SECONDS)}",
        )
        post = run["post_seconds"]
        post_target = TARGET_POST_SECONDS.get(count)
        add(
            f"{prefix}: post-completion to results.json (s)",
            post,
            base["post_seconds"],
            f"<= {post_target} {verdict(post <= post_target)}" if post_target else "",
        )
        add(
            f"{prefix}: post-completion per episode (ms)",
            1000 * post / count,
            1000 * base["post_seconds"] / base_count,
        )
        tail = run["tail_seconds"]
        tail_target = TARGET_TAIL_SECONDS.get(count)
        add(
            f"{prefix}: true end -> process exit (s)",
            tail,
            base["tail_seconds"],
            f"<= {tail_target} {verdict(tail <= tail_target)}" if tail_target else "",
        )
        add(
            f"{prefix}: CPU of tool after the end (s)",
            run["post_cpu_seconds"],
            base["post_cpu_seconds"],
        )
        add(
            f"{prefix}: submit -> end seen by client (s)", run["wait_seconds"], base["wait_seconds"]
        )
        add(
            f"{prefix}: CPU tool process alone (s)",
            run["tool_cpu_seconds"],
            base["tool_cpu_seconds"],
        )
        add(
            f"{prefix}: CPU kubectl children (s)",
            run["kubectl_cpu_seconds"],
            base["kubectl_cpu_seconds"],
        )
        rss = run["peak_rss_mb"]
        add(
            f"{prefix}: peak RSS of tool (MB)",
            rss,
            base["peak_rss_mb"],
            f"<= {TARGET_PEAK_RSS_MB} {verdict(rss <= TARGET_PEAK_RSS_MB)}"
            if count >= 10000
            else "",
        )
        add(
            f"{prefix}: peak RSS of tool until the end (MB)",
            run["peak_rss_at_end_mb"],
            base["peak_rss_at_end_mb"],
        )
        largest = run["largest_process_mb"]
        add(
            f"{prefix}: largest process of the run, tool or a kubectl (MB)",
            largest,
            base["largest_process_mb"],
            f"<= {TARGET_PEAK_RSS_MB} {verdict(largest <= TARGET_PEAK_RSS_MB)}"
            if count >= 10000
            else "",
        )
        add(
            f"{prefix}: kubectl processes per run",
            run["kubectl_processes"],
            base["kubectl_processes"],
            f"= smallest {verdict(run['kubectl_processes'] == base['kubectl_processes'])}",
        )
        requests = run["api_requests"]
        add(f"{prefix}: API requests (emulator's log)", requests, base["api_requests"])
        add(
            f"{prefix}: API requests per episode",
            requests / count,
            base["api_requests"] / base_count,
        )
        if count != base_count:
            growth = (requests - base["api_requests"]) / (count - base_count)
            add(
                f"{prefix}: API requests per added episode (vs {base_count})",
                growth,
                None,
                f"<= {TARGET_REQUESTS_PER_EPISODE} {verdict(growth <= TARGET_REQUESTS_PER_EPISODE)}",
            )
        add(
            f"{prefix}: most watch events waiting in the client at once",
            run["watch_queue_peak"],
            base["watch_queue_peak"],
        )
        fell_behind = run["watches_expired"] + run["watch_restarts"]
        add(
            f"{prefix}: watches answered 410 Gone / restarted",
            f"{run['watches_expired']} / {run['watch_restarts']}",
            f"{base['watches_expired']} / {base['watch_restarts']}",
            f"0 / 0 {verdict(fell_behind == 0)}",
        )
    return rows


def wait_length_case(kubectl: str, root: Path) -> dict[str, dict[str, dict]]:
    """The same 10-episode batch with a short and a long sandbox delay, both clients."""
    runs: dict[str, dict[str, dict]] = {}
    for name, delay in (("short", EMULATOR_FAULTS["sandbox_delay"]), ("long", LONG_SANDBOX_DELAY)):
        workdir = root / f"wait-{name}"
        workdir.mkdir()
        faults = dict(EMULATOR_FAULTS, sandbox_delay=delay)

        def body(
            emulator: Emulator, name: str = name, workdir: Path = workdir, faults: dict = faults
        ) -> None:
            runs[name] = {
                kind: run_client(
                    emulator, kind, WAIT_CHECK_COUNT, WAIT_CHECK_COUNT, kubectl, workdir, kind
                )
                for kind in ("product", "guide")
            }
            say(
                f"  sandbox delay {faults['sandbox_delay']:g} s: product waited "
                f"{runs[name]['product']['wait_seconds']:.1f} s, guide {runs[name]['guide']['wait_seconds']:.1f} s"
            )

        with_emulator(workdir, faults, body)
    return runs


# --------------------------------------------------------------------------
# The worker's lean start.


def worker_sources(workspace: Path) -> dict[str, str]:
    """The product's worker and a straightforward one, both writing into `workspace`."""
    product = rl_batch_demo.WORKER_SOURCE
    if '"/workspace"' not in product:
        raise BenchmarkError(
            'the product\'s worker no longer names "/workspace"; update the benchmark'
        )
    constants = {}
    for node in ast.parse(product).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("BUGGY_SOURCE", "TEST_SOURCE")
        ):
            constants[node.targets[0].id] = ast.literal_eval(node.value)
    return {
        "product": product.replace('"/workspace"', repr(str(workspace))),
        "guide": STRAIGHTFORWARD_WORKER.format(
            buggy=constants["BUGGY_SOURCE"],
            tests=constants["TEST_SOURCE"],
            workspace=str(workspace),
        ),
    }


def imports_before_ready(argv: list[str], env: dict) -> dict[str, float]:
    """Module -> its own import time (s) for every import before the `ready` line (-X importtime).

    stdout and stderr share one pipe, so the flushed `ready` line falls between the
    import lines that came before it and those after.
    """
    completed = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60
    )
    imported: dict[str, float] = {}
    for line in completed.stdout.splitlines():
        if line.startswith("{") and '"ready"' in line:
            return imported
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            self_us, _, name = line.split(":", 1)[1].split("|")
            imported[name.strip()] = int(self_us) / 1e6
    if "-c" in argv:
        return imported
    raise BenchmarkError(f"no ready event from {argv[-1]}: {completed.stdout[-300:]}")


def spawn_to_ready_seconds(argv: list[str], env: dict) -> float:
    """Wall time from starting the worker to its `ready` event."""
    started = time.time()
    completed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    for line in completed.stdout.splitlines():
        if '"ready"' in line:
            return json.loads(line)["at"] - started
    raise BenchmarkError(f"no ready event from {argv[-1]}: {completed.stderr[-300:]}")


def worker_case(root: Path, runs: int) -> dict[str, dict]:
    """Modules and time before `ready`: the product's worker vs a straightforward one."""
    figures: dict[str, dict] = {}
    env = dict(os.environ, EPISODE_ID="bench-worker")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    startup = imports_before_ready([sys.executable, "-X", "importtime", "-B", "-c", "pass"], env)
    for kind in ("product", "guide"):
        workspace = root / f"worker-{kind}"
        workspace.mkdir()
        script = root / f"worker-{kind}.py"
        script.write_text(worker_sources(workspace)[kind])
        imported = imports_before_ready(
            [sys.executable, "-X", "importtime", "-B", str(script)], env
        )
        beyond = {name: seconds for name, seconds in imported.items() if name not in startup}
        times = [
            spawn_to_ready_seconds([sys.executable, "-B", str(script)], env) for _ in range(runs)
        ]
        figures[kind] = {
            "modules": len(imported),
            "modules_beyond_startup": len(beyond),
            "import_seconds": sum(imported.values()),
            "import_seconds_beyond_startup": sum(beyond.values()),
            "spawn_to_ready_seconds": statistics.median(times),
        }
    return figures


# --------------------------------------------------------------------------
# The table.


def ratio(product: float, guide: float) -> str:
    if not product:
        return "inf" if guide else "-"
    return f"{guide / product:.2f}"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "MISSED")


def render_table(
    rows: list[tuple[str, Any, Any, str, str]],
    header: tuple[str, ...] = ("figure", "product", "guide", "guide/product", "target"),
) -> str:
    cells = [header] + [
        (name, fmt(p), fmt(g), ratio_text, target) for name, p, g, ratio_text, target in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for index, row in enumerate(cells):
        lines.append(
            "  ".join(
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                for i, cell in enumerate(row)
            ).rstrip()
        )
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"


def build_rows(
    repeated: dict[int, dict[str, list[dict]]],
    scale: dict[int, dict[str, dict]],
    waits: dict[str, dict[str, dict]],
    worker: dict[str, dict],
) -> list[tuple]:
    rows: list[tuple] = []

    def add(name: str, product: Any, guide: Any, target: str = "") -> None:
        both = isinstance(product, (int, float)) and isinstance(guide, (int, float))
        rows.append((name, product, guide, ratio(product, guide) if both else "-", target))

    for count, runs in sorted(repeated.items()):
        product, guide = runs["product"], runs["guide"]
        n = len(product)
        prefix = f"{count} ep"
        lag = median_of(product, "lag_seconds")
        add(
            f"{prefix}: completion lag, median of {n} (s)",
            lag,
            median_of(guide, "lag_seconds"),
            f"<= {TARGET_LAG_SECONDS} {verdict(lag <= TARGET_LAG_SECONDS)}",
        )
        add(
            f"{prefix}: completion lag, max of {n} (s)",
            max(r["lag_seconds"] for r in product),
            max(r["lag_seconds"] for r in guide),
        )
        post = median_of(product, "post_seconds")
        add(
            f"{prefix}: post-completion to results.json, median (s)",
            post,
            median_of(guide, "post_seconds"),
            f"<= {TARGET_POST_SECONDS_20} {verdict(post <= TARGET_POST_SECONDS_20)}"
            if count == 20
            else "",
        )
        add(
            f"{prefix}: post-completion, max of {n} (s)",
            max(r["post_seconds"] for r in product),
            max(r["post_seconds"] for r in guide),
        )
        tail = median_of(product, "tail_seconds")
        tail_target = TARGET_TAIL_SECONDS.get(count)
        add(
            f"{prefix}: true end -> process exit, median (s)",
            tail,
            median_of(guide, "tail_seconds"),
            f"<= {tail_target} {verdict(tail <= tail_target)}" if tail_target else "",
        )
        add(
            f"{prefix}: true end -> process exit, max of {n} (s)",
            max(r["tail_seconds"] for r in product),
            max(r["tail_seconds"] for r in guide),
        )
        add(
            f"{prefix}: submit -> end seen by client, median (s)",
            median_of(product, "wait_seconds"),
            median_of(guide, "wait_seconds"),
        )
        add(
            f"{prefix}: kubectl processes while waiting, median",
            int(median_of(product, "processes_while_waiting")),
            int(median_of(guide, "processes_while_waiting")),
        )
        add(
            f"{prefix}: kubectl processes per run, median",
            int(median_of(product, "kubectl_processes")),
            int(median_of(guide, "kubectl_processes")),
        )
        cpu = median_of(product, "cpu_seconds")
        guide_cpu = median_of(guide, "cpu_seconds")
        add(
            f"{prefix}: CPU tool+kubectl per run, median (s)",
            cpu,
            guide_cpu,
            f"< guide {verdict(cpu < guide_cpu)}",
        )
        add(
            f"{prefix}: CPU tool process alone, median (s)",
            median_of(product, "tool_cpu_seconds"),
            median_of(guide, "tool_cpu_seconds"),
        )
        add(
            f"{prefix}: CPU kubectl children, median (s)",
            median_of(product, "kubectl_cpu_seconds"),
            median_of(guide, "kubectl_cpu_seconds"),
        )
        add(
            f"{prefix}: peak RSS of tool process, median (MB)",
            median_of(product, "peak_rss_mb"),
            median_of(guide, "peak_rss_mb"),
        )
        add(
            f"{prefix}: largest process of the run (tool or a kubectl), median (MB)",
            median_of(product, "largest_process_mb"),
            median_of(guide, "largest_process_mb"),
        )

    if waits:
        short, long = waits["short"], waits["long"]
        for kind_label, key in (
            ("submit -> end seen (s)", "wait_seconds"),
            ("kubectl processes while waiting", "processes_while_waiting"),
        ):
            add(
                f"wait check {WAIT_CHECK_COUNT} ep, sandbox {EMULATOR_FAULTS['sandbox_delay']:g} s: {kind_label}",
                short["product"][key],
                short["guide"][key],
            )
            add(
                f"wait check {WAIT_CHECK_COUNT} ep, sandbox {LONG_SANDBOX_DELAY:g} s: {kind_label}",
                long["product"][key],
                long["guide"][key],
            )
        grew = (
            long["product"]["processes_while_waiting"] - short["product"]["processes_while_waiting"]
        )
        add(
            "wait check: growth of processes while waiting (long - short)",
            grew,
            long["guide"]["processes_while_waiting"] - short["guide"]["processes_while_waiting"],
            f"product 0 {verdict(grew <= 0)}",
        )

    for count, runs in sorted(scale.items()):
        product, guide = runs["product"], runs.get("guide") or {}
        prefix = f"{count} ep (p{product['parallelism']})"
        add(f"{prefix}: completed", "yes", "yes" if guide else "not run", "completes: met")
        add(f"{prefix}: completion lag (s)", product["lag_seconds"], guide.get("lag_seconds"))
        add(
            f"{prefix}: post-completion to results.json (s)",
            product["post_seconds"],
            guide.get("post_seconds"),
        )
        add(
            f"{prefix}: true end -> process exit (s)",
            product["tail_seconds"],
            guide.get("tail_seconds"),
        )
        add(
            f"{prefix}: post-completion per episode (ms)",
            1000 * product["post_seconds"] / count,
            1000 * guide["post_seconds"] / count if guide else None,
        )
        add(
            f"{prefix}: submit -> end seen by client (s)",
            product["wait_seconds"],
            guide.get("wait_seconds"),
        )
        add(
            f"{prefix}: kubectl processes per run",
            product["kubectl_processes"],
            guide.get("kubectl_processes"),
        )
        add(
            f"{prefix}: CPU tool+kubectl per run (s)",
            product["cpu_seconds"],
            guide.get("cpu_seconds"),
        )
        add(
            f"{prefix}: CPU tool process alone (s)",
            product["tool_cpu_seconds"],
            guide.get("tool_cpu_seconds"),
        )
        add(
            f"{prefix}: RSS of tool when end seen (MB)",
            product["rss_at_end_mb"],
            guide.get("rss_at_end_mb"),
        )
        add(f"{prefix}: peak RSS of tool (MB)", product["peak_rss_mb"], guide.get("peak_rss_mb"))
        add(
            f"{prefix}: peak RSS growth after end seen, per episode (kB)",
            1024 * (product["peak_rss_mb"] - product["peak_rss_at_end_mb"]) / count,
            1024 * (guide["peak_rss_mb"] - guide["peak_rss_at_end_mb"]) / count if guide else None,
        )

    if worker:
        product, guide = worker["product"], worker["guide"]
        add(
            "worker: modules imported before ready (all, -X importtime)",
            product["modules"],
            guide["modules"],
            f"< straightforward {verdict(product['modules'] < guide['modules'])}",
        )
        add(
            "worker: modules before ready beyond interpreter start-up",
            product["modules_beyond_startup"],
            guide["modules_beyond_startup"],
        )
        add(
            "worker: import time before ready (ms, -X importtime sum)",
            1000 * product["import_seconds"],
            1000 * guide["import_seconds"],
            f"< straightforward {verdict(product['import_seconds'] < guide['import_seconds'])}",
        )
        add(
            "worker: import time beyond interpreter start-up (ms)",
            1000 * product["import_seconds_beyond_startup"],
            1000 * guide["import_seconds_beyond_startup"],
        )
        add(
            f"worker: spawn -> ready wall, median of {WORKER_TIMING_RUNS} (ms)",
            1000 * product["spawn_to_ready_seconds"],
            1000 * guide["spawn_to_ready_seconds"],
        )
    return rows


def linearity_lines(
    repeated: dict[int, dict[str, list[dict]]], scale: dict[int, dict[str, dict]]
) -> list[str]:
    """The product's post-completion time and memory per episode across batch sizes."""
    points = []
    keys = (
        "post_seconds",
        "tool_cpu_seconds",
        "peak_rss_mb",
        "peak_rss_at_end_mb",
        "rss_at_end_mb",
    )
    for count, runs in sorted(repeated.items()):
        points.append((count, *(median_of(runs["product"], key) for key in keys)))
    for count, runs in sorted(scale.items()):
        points.append((count, *(runs["product"][key] for key in keys)))
    if len(points) < 2:
        return []
    lines = [
        "",
        "Product by batch size (linear growth => per-episode columns flat or falling; "
        "RSS sampled every 20 ms):",
        f"{'episodes':>8}  {'post s':>7}  {'post ms/ep':>10}  {'tool CPU s':>10}  {'RSS at end MB':>13}  "
        f"{'peak at end MB':>14}  {'final peak MB':>13}  {'growth after end kB/ep':>22}",
    ]
    for count, post, cpu, peak, peak_at_end, rss_at_end in points:
        lines.append(
            f"{count:>8}  {post:>7.3f}  {1000 * post / count:>10.2f}  {cpu:>10.2f}  {rss_at_end:>13.1f}  "
            f"{peak_at_end:>14.1f}  {peak:>13.1f}  {1024 * (peak - peak_at_end) / count:>22.1f}"
        )
    return lines


# --------------------------------------------------------------------------
# Command line.


# --------------------------------------------------------------------------
# The cost model to 100,000 episodes: the tool followed against the replay stand-in kubectl.


REPLAY = SUPPORT_DIR / "replay_kubectl.py"
REPLAY_SIZES = (10000, 30000, 100000)
REPLAY_RATES = (500, 2000)
TARGET_REPLAY_RSS_MB = 1024
TARGET_REPLAY_TAIL_SECONDS = 10.0


def replay_case(count: int, rate: int, root: Path) -> dict:
    """One run of the product against tests/support/replay_kubectl.py: `count` episodes, the pod watch
    printing `rate` lines a second. The true end is the moment the stand-in printed the Job's
    Complete line."""
    workdir = root / f"replay-{count}-{rate}"
    workdir.mkdir(parents=True)
    output, state, usage_path = workdir / "out", workdir / "state", workdir / "rusage.json"
    args = [
        "run",
        "--quiet",
        "--count",
        str(count),
        "--parallelism",
        str(count),
        "--max-episodes",
        str(count),
        "--output",
        str(output),
        "--kubectl",
        str(REPLAY),
        "--timeout",
        str(LIGHTWEIGHT_DEADLINE_SECONDS),
    ]
    env = dict(
        os.environ,
        REPLAY_STATE=str(state),
        REPLAY_EPISODES=str(count),
        REPLAY_POD_EVENTS_PER_SECOND=str(rate),
    )
    argv = [sys.executable, "-c", RUSAGE_WRAPPER, str(usage_path), str(PRODUCT)] + args
    with open(workdir / "stdout", "wb") as stdout, open(workdir / "stderr", "wb") as stderr:
        started = time.monotonic()
        process = subprocess.Popen(
            argv, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
        )
        samples: list[tuple[float, int, int, float]] = []
        stop = threading.Event()
        sampler = threading.Thread(
            target=sample_rss, args=(process.pid, samples, {}, stop), daemon=True
        )
        sampler.start()
        _, status, _ = os.wait4(process.pid, 0)
        exited_at = time.time()
        wall = time.monotonic() - started
        stop.set()
        sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        tail = (workdir / "stderr").read_text(errors="replace").strip().splitlines()[-5:]
        raise BenchmarkError(
            f"replay run of {count} exited {os.waitstatus_to_exitcode(status)}: {' | '.join(tail)}"
        )
    client = json.loads((output / "client.json").read_text())
    own = json.loads(usage_path.read_text())
    end = json.loads((state / "jobs.done").read_text())["at"]
    pods_done = json.loads((state / "pods.done").read_text())
    before_end = [cpu for moment, _, _, cpu in samples if moment <= client["observed_at"]] or [0.0]
    peak_before_end = max(
        (peak for moment, _, peak, _ in samples if moment <= client["observed_at"]), default=0
    )
    submitted = client["submitted_at"]
    figures = {
        "count": count,
        "rate": rate,
        "wall_seconds": wall,
        "replay_seconds": end - submitted,
        "replay_behind_seconds": pods_done["behind_seconds"],
        "lag_seconds": client["observed_at"] - end,
        "tail_seconds": exited_at - end,
        "queue_peak": client["watch_queue_peak"],
        "cpu_waiting_ms_per_episode": 1000 * before_end[-1] / count,
        "cpu_after_end_ms_per_episode": 1000 * (own["self_cpu"] - before_end[-1]) / count,
        "peak_rss_mb": own["self_maxrss_kb"] / 1024,
        "peak_rss_until_end_mb": peak_before_end / 1024,
        "drafts_taken": client.get("episodes_summarised_while_waiting"),
        "files_mb": sum(path.stat().st_size for path in output.iterdir()) / 2**20,
        "pods_json_mb": (output / "pods.json").stat().st_size / 2**20,
    }
    say(
        f"  replay {count} episodes at {rate} pod lines/s: lag {figures['lag_seconds']:.3f} s, tail "
        f"{figures['tail_seconds']:.2f} s, peak RSS {figures['peak_rss_mb']:.0f} MB, "
        f"queue peak {figures['queue_peak']}, "
        f"wall {wall:.0f} s"
    )
    return figures


def replay_rows(runs: list[dict]) -> list[tuple[str, Any, Any, str, str]]:
    rows: list[tuple[str, Any, Any, str, str]] = []
    for run in runs:
        prefix = f"{run['count']} ep at {run['rate']} pod lines/s"
        rss, tail = run["peak_rss_mb"], run["tail_seconds"]
        big = run["count"] >= 100000
        rows += [
            (
                f"{prefix}: replay took (s; stand-in behind its schedule by at most)",
                run["replay_seconds"],
                run["replay_behind_seconds"],
                "-",
                "",
            ),
            (
                f"{prefix}: most watch events waiting in the client at once",
                run["queue_peak"],
                None,
                "-",
                "",
            ),
            (
                f"{prefix}: Job's end printed -> seen by the client (s)",
                run["lag_seconds"],
                None,
                "-",
                "",
            ),
            (
                f"{prefix}: tool CPU while waiting, per episode (ms)",
                run["cpu_waiting_ms_per_episode"],
                None,
                "-",
                "",
            ),
            (
                f"{prefix}: tool CPU after the end, per episode (ms)",
                run["cpu_after_end_ms_per_episode"],
                None,
                "-",
                "",
            ),
            (
                f"{prefix}: peak RSS of the tool until it saw the end (MB)",
                run["peak_rss_until_end_mb"],
                None,
                "-",
                "",
            ),
            (
                f"{prefix}: peak RSS of the tool (MB)",
                rss,
                None,
                "-",
                f"<= {TARGET_REPLAY_RSS_MB} {verdict(rss <= TARGET_REPLAY_RSS_MB)}" if big else "",
            ),
            (
                f"{prefix}: end -> process exit (s)",
                tail,
                None,
                "-",
                f"<= {TARGET_REPLAY_TAIL_SECONDS:g} {verdict(tail <= TARGET_REPLAY_TAIL_SECONDS)}"
                if big
                else "",
            ),
            (f"{prefix}: episodes taken from their drafts", run["drafts_taken"], None, "-", ""),
            (
                f"{prefix}: files written (MB; pods.json)",
                run["files_mb"],
                run["pods_json_mb"],
                "-",
                "",
            ),
        ]
    return rows


@contextlib.contextmanager
def busy_loops(per_core: int) -> Any:
    """`per_core` busy loops on every core while the block runs: a loaded machine, made on purpose."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(per_core * (os.cpu_count() or 1))
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


class Measured:
    """Every case's figures from one pass (quiet, or under busy loops)."""

    def __init__(self) -> None:
        self.repeated: dict[int, dict[str, list[dict]]] = {}
        self.scale: dict[int, dict[str, dict]] = {}
        self.waits: dict[str, dict[str, dict]] = {}
        self.worker: dict[str, dict] = {}
        self.lightweight: dict[int, dict] = {}
        self.stragglers: dict[str, dict] = {}
        self.delivery: dict = {}
        self.images: dict[str, dict] = {}


def measure(
    args: argparse.Namespace,
    cases: list[int],
    scale_sizes: list[int],
    reps: int,
    guide_max: int,
    kubectl: str,
    root: Path,
) -> Measured:
    """One pass over the cases asked for."""
    measured = Measured()
    root.mkdir(parents=True, exist_ok=True)
    if args.images:
        say("images: cold, parallel pulls, --prepull, all present ...")
        measured.images = image_case(kubectl, root)
    if args.streaming:
        say("stragglers: --need against waiting for all ...")
        measured.stragglers = straggler_case(kubectl, root)
        say(f"delivery lag at {DELIVERY_LAG_SIZE} episodes ...")
        measured.delivery = delivery_lag_case(kubectl, root)
    if not args.no_worker:
        say("worker start-up ...")
        measured.worker = worker_case(root, WORKER_TIMING_RUNS)
    for count in cases:
        say(f"case {count} ...")
        if count in SCALE_PARALLELISM or count > rl_batch_demo.DEFAULT_MAX_EPISODES:
            parallelism = SCALE_PARALLELISM.get(count, max(1, count // 10))
            measured.scale[count] = scale_case(
                count, parallelism, count <= guide_max, kubectl, root
            )
        else:
            measured.repeated[count] = repeated_case(count, reps, kubectl, root)
    if not args.no_wait_check:
        say("wait-length check ...")
        measured.waits = wait_length_case(kubectl, root)
    for count in scale_sizes:
        say(f"scale {count} (lightweight kubelet) ...")
        measured.lightweight[count] = lightweight_case(count, kubectl, root)
    return measured


def print_measured(measured: Measured) -> None:
    rows = build_rows(measured.repeated, measured.scale, measured.waits, measured.worker)
    if rows:
        print(render_table(rows))
    lightweight = measured.lightweight
    if lightweight:
        print(
            f"\nScale on the lightweight kubelet (faults {json.dumps(LIGHTWEIGHT_FAULTS)}); baseline = the "
            f"{min(lightweight)}-episode run of this invocation; ratio = size / baseline:"
        )
        print(
            render_table(
                lightweight_rows(lightweight),
                header=("figure", "value", f"at {min(lightweight)}", "ratio", "target"),
            )
        )
    for line in linearity_lines(measured.repeated, measured.scale):
        print(line)
    if measured.stragglers:
        for line in streaming_lines(measured.stragglers, measured.delivery):
            print(line)
    if measured.images:
        for line in image_lines(measured.images):
            print(line)


def kubectl_version(path: str) -> str:
    try:
        completed = subprocess.run(
            [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
        )
        return json.loads(completed.stdout)["clientVersion"]["gitVersion"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return "unknown"


def load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Benchmark the product's client against the guide's method "
        "on the Kubernetes API emulator."
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 repetitions, cases 10,20 only, no guide on large cases",
    )
    parser.add_argument(
        "--kubectl",
        default=None,
        metavar="PATH",
        help="kubectl binary (default: 1.33 as the tests find it)",
    )
    parser.add_argument(
        "--cases",
        default=None,
        metavar="N,N,...",
        help="batch sizes (default 10,20,200,500; --quick 10,20); 200 and 500 run at "
        "parallelism 20 and 50, others at parallelism = count",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        metavar="N",
        help="repetitions of each case up to 20 episodes (default 5; --quick 2)",
    )
    parser.add_argument(
        "--guide-max",
        type=int,
        default=None,
        metavar="N",
        help="run the guide's method on large cases up to N episodes (default 200; --quick 0)",
    )
    parser.add_argument(
        "--no-wait-check", action="store_true", help="skip the short/long wait check"
    )
    parser.add_argument(
        "--no-worker", action="store_true", help="skip the worker import measurement"
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help=f"scale targets at {' and '.join(map(str, LIGHTWEIGHT_SIZES))} episodes, parallelism "
        f"{LIGHTWEIGHT_PARALLELISM}, on the emulator's lightweight kubelet (no process per "
        f"pod); alone it skips the other cases unless --cases is given",
    )
    parser.add_argument(
        "--scale-sizes",
        default=None,
        metavar="N,N,...",
        help=f"with --scale, these sizes instead (default {','.join(map(str, LIGHTWEIGHT_SIZES))})",
    )
    parser.add_argument(
        "--scale-10000",
        action="store_true",
        help=f"with --scale, also {LIGHTWEIGHT_LONG_SIZE} episodes (long: about 10 minutes)",
    )
    parser.add_argument(
        "--streaming",
        action="store_true",
        help=f"only streaming rollouts: {STRAGGLER_COUNT} episodes with {STRAGGLERS} hanging, "
        f"--need {STRAGGLER_NEED} against waiting for all; delivery lag at "
        f"{DELIVERY_LAG_SIZE} episodes",
    )
    parser.add_argument(
        "--images",
        action="store_true",
        help=f"an image per task: {IMAGE_TASKS} tasks x {IMAGE_GROUP} episodes, {IMAGE_TASKS} images "
        f"cold (pulls serialized, then parallel), with --prepull, and all present",
    )

    parser.add_argument(
        "--replay",
        default=None,
        metavar="N@RATE,...",
        help="only the cost model: the product followed against tests/support/replay_kubectl.py, e.g. "
        "10000@500,100000@2000 (episodes @ pod watch lines a second)",
    )
    parser.add_argument(
        "--loaded",
        action="store_true",
        help=f"measure every case again with {BUSY_LOOPS_PER_CORE} busy loops per core and print "
        f"those figures too, after the quiet ones",
    )
    parser.add_argument("--keep", action="store_true", help="keep the emulators' and runs' files")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    only = args.scale or args.streaming or args.images
    default_cases = "" if only else ("10,20" if args.quick else "10,20,200,500")
    cases = [
        int(c) for c in (args.cases if args.cases is not None else default_cases).split(",") if c
    ]
    if only:
        args.no_wait_check = args.no_wait_check or args.cases is None
        args.no_worker = args.no_worker or args.cases is None
    sizes = (
        [int(c) for c in args.scale_sizes.split(",") if c]
        if args.scale_sizes
        else list(LIGHTWEIGHT_SIZES)
    )
    scale_sizes = (
        sizes + ([LIGHTWEIGHT_LONG_SIZE] if args.scale_10000 else []) if args.scale else []
    )
    reps = args.reps or (2 if args.quick else 5)
    guide_max = args.guide_max if args.guide_max is not None else (0 if args.quick else 200)
    kubectl = args.kubectl or prereqs.default_kubectl(prereqs.find_kubectls())
    if not kubectl:
        raise SystemExit("Error: no kubectl found; pass --kubectl PATH")
    if shutil.which("bwrap") is None:
        raise SystemExit("Error: bwrap (bubblewrap) is needed to run the episodes")
    product_digest = hashlib.sha256(PRODUCT.read_bytes()).hexdigest()[:12]
    root = Path(tempfile.mkdtemp(prefix="rl-bench-"))
    if args.replay:
        return replay_main(args, root, product_digest)
    began = time.monotonic()
    load_before = load_average()
    cpu_before = os.times()
    passes: list[tuple[str, Measured, str]] = []
    try:
        passes.append(
            (
                "quiet",
                measure(args, cases, scale_sizes, reps, guide_max, kubectl, root / "quiet"),
                load_average(),
            )
        )
        if args.loaded:
            say(f"again, with {BUSY_LOOPS_PER_CORE} busy loops per core ...")
            with busy_loops(BUSY_LOOPS_PER_CORE):
                loaded = measure(
                    args, cases, scale_sizes, reps, guide_max, kubectl, root / "loaded"
                )
                passes.append(
                    (f"loaded ({BUSY_LOOPS_PER_CORE} busy loops per core)", loaded, load_average())
                )
    except BenchmarkError as error:
        raise SystemExit(f"Error: {error} (files kept in {root})") from None
    elapsed = time.monotonic() - began
    load_after = load_average()
    cpu_after = os.times()
    # CPU this benchmark used (emulator, pods, clients) vs what the machine could give it:
    # on a shared machine the rest went to other work, which makes every figure noisier.
    own_cpu = sum(cpu_after[:4]) - sum(cpu_before[:4])

    print(f"command: {shlex.join([sys.executable] + sys.argv)}")
    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"kubectl {kubectl_version(kubectl)} ({kubectl})"
    )
    print(
        f"product: {PRODUCT.name} sha256 {product_digest}"
        + (
            ""
            if hashlib.sha256(PRODUCT.read_bytes()).hexdigest()[:12] == product_digest
            else " (CHANGED during the benchmark: figures mix versions)"
        )
    )
    print(
        f"emulator: faults {json.dumps(EMULATOR_FAULTS)}, 3 nodes, Kubernetes 1.33; "
        f"repetitions {reps} for cases <= {rl_batch_demo.DEFAULT_MAX_EPISODES} episodes (medians)"
    )
    print(
        f"load average (1 min) before {load_before}, after {load_after}; this benchmark used "
        f"{own_cpu:.0f} CPU-s of {elapsed * (os.cpu_count() or 1):.0f} available"
    )
    print("ratio column = guide / product (above 1: the product is lower, i.e. faster or leaner)")
    print()
    for name, measured, load_at_end in passes:
        if len(passes) > 1:
            print(f"\n== {name}: load average (1 min) at its end {load_at_end}\n")
        print_measured(measured)
    print(f"\nbenchmark took {elapsed:.0f} s")
    if args.keep:
        print(f"files kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def replay_main(args: argparse.Namespace, root: Path, product_digest: str) -> int:
    """--replay: each size and rate asked for, one after the other."""
    load_before = load_average()
    runs = []
    try:
        for spec in args.replay.split(","):
            count, rate = (int(part) for part in spec.split("@"))
            say(f"replay {count} episodes at {rate} pod lines a second ...")
            runs.append(replay_case(count, rate, root))
    except BenchmarkError as error:
        raise SystemExit(f"Error: {error} (files kept in {root})") from None
    print(f"command: {shlex.join([sys.executable] + sys.argv)}")
    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"product sha256 {product_digest}; load average (1 min) before {load_before}, after {load_average()}"
    )
    print(
        f"replay: {REPLAY.name} serving tests/recorded/replay-3 scaled up (7 pod watch lines and 5 events per "
        f"episode); the tool unchanged"
    )
    print()
    print(render_table(replay_rows(runs), header=("figure", "value", "beside", "-", "target")))
    if args.keep:
        print(f"files kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
