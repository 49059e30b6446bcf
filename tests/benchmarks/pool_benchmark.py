#!/usr/bin/env python3
"""Live sandboxes, measured on whatever cluster KUBECONFIG names (start one with
tests/local_cluster.py: --emulator, the real control plane, or --kubelet for a real node).

    python3 tests/benchmarks/pool_benchmark.py --kubectl PATH [--sandboxes N] [--episodes E]

Prints, side by side in one run:
- the empty command's round trip (`true`, one sandbox, one after another), against
  `kubectl exec POD -- true` on the same pod where the tier serves exec;
- the warm claim's wait (a reused pool, claims with a sandbox always free);
- N sandboxes driven from one process at once: commands a second, and this process's CPU per
  command; the kubectl processes running at 1 sandbox and at N;
- E guide episodes as a pool (`pool`) and as a batch (`run`): the wall time of each.
Figures, never assertions: this machine is shared and its timings are noisy.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO_ROOT / "src"))

import rl_batch_demo  # noqa: E402  (the package, from src/)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(value: float) -> str:
    return f"{value * 1000:8.2f} ms"


def kubectl_processes() -> int:
    """The kubectl processes below this one (a dispatcher's child counted too)."""
    return len(kubectl_cpu())


def kubectl_cpu() -> dict[int, float]:
    """The kubectl processes below this one, each with the CPU seconds it has used."""
    me, parents, names, cpu = os.getpid(), {}, {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)
                names[int(entry)] = stat[0].split("(", 1)[1]
                fields = stat[1].split()
                parents[int(entry)] = int(fields[1])
                cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
    found = {}
    for pid, name in names.items():
        walk = pid
        while walk in parents and walk not in (0, 1, me):
            walk = parents[walk]
        if walk == me and name.startswith("kubectl"):
            found[pid] = cpu[pid]
    return found


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def empty_round_trips(
    kubectl: str, work: Path, count: int, empty: list[str]
) -> tuple[list[float], list[float], int]:
    """`true` through one sandbox, `count` times; and `kubectl exec` on its pod, if served."""
    with rl_batch_demo.open_pool(
        output=str(work / "empty"), size=1, episodes=1, kubectl=kubectl
    ) as pool:
        with pool.claim(timeout=300) as sandbox:
            trips = [sandbox.run(empty).round_trip_seconds for _ in range(count)]
            processes = kubectl_processes()
            execs: list[float] = []
            for _ in range(min(count, 20)):
                started = time.monotonic()
                done = subprocess.run(
                    [
                        kubectl,
                        "exec",
                        "-n",
                        pool.run.namespace,
                        sandbox.pod,
                        "-c",
                        "sandbox",
                        "--",
                        *empty,
                    ],
                    capture_output=True,
                    timeout=60,
                )
                if done.returncode != 0:
                    execs = []
                    break
                execs.append(time.monotonic() - started)
            sandbox.finish(reward=1)
    return trips, execs, processes


def warm_claims(kubectl: str, work: Path, count: int) -> list[float]:
    """Claims from a reused pool of 2, one at a time: a sandbox is always free and warm."""
    waits = []
    with rl_batch_demo.open_pool(
        output=str(work / "claims"), size=2, episodes=count + 2, reuse=True, kubectl=kubectl
    ) as pool:
        with pool.claim(timeout=300) as first:
            first.finish(reward=1)
        time.sleep(1.0)  # both warm
        for _ in range(count):
            with pool.claim(timeout=60) as sandbox:
                waits.append(sandbox.claim_wait_seconds)
                sandbox.finish(reward=1)
    return waits


def many_sandboxes(kubectl: str, work: Path, sandboxes: int, commands: int) -> dict:
    """`sandboxes` sandboxes at once, each sent `commands` commands from a thread of its own."""
    with rl_batch_demo.open_pool(
        output=str(work / "many"), size=sandboxes, episodes=sandboxes, kubectl=kubectl
    ) as pool:
        opened = time.monotonic()
        held = [pool.claim(timeout=600) for _ in range(sandboxes)]
        warm_after = time.monotonic() - opened
        processes = kubectl_processes()
        cpu, proxy_cpu, started = cpu_seconds(), kubectl_cpu(), time.monotonic()

        def drive(sandbox: rl_batch_demo.pool.Sandbox) -> None:
            for _ in range(commands):
                sandbox.run(["true"])

        with concurrent.futures.ThreadPoolExecutor(sandboxes) as threads:
            list(threads.map(drive, held))
        wall, used = time.monotonic() - started, cpu_seconds() - cpu
        proxy_used = sum(
            seconds - proxy_cpu.get(pid, 0.0) for pid, seconds in kubectl_cpu().items()
        )
        evidence = evidence_seconds(pool)
        for sandbox in held:
            sandbox.finish(reward=1)
    total = sandboxes * commands
    return {
        "evidence": evidence,
        "warm_after": warm_after,
        "per_second": total / wall,
        "cpu_per_command": used / total,
        "proxy_cpu_per_command": proxy_used / total,
        "kubectl_processes": processes,
    }


def evidence_seconds(pool: rl_batch_demo.pool.Pool) -> dict[int, float]:
    """The seconds the pool's evidence (job, pods, events, every pod's log) takes to save, by the
    number of log readers: one at a time (the baseline) and the tool's."""
    seconds, tools = {}, rl_batch_demo.pool.LOG_READERS
    try:
        for readers in (1, tools):
            rl_batch_demo.pool.LOG_READERS = readers
            started = time.monotonic()
            rl_batch_demo.pool.save_pool_evidence(pool)
            seconds[readers] = time.monotonic() - started
    finally:
        rl_batch_demo.pool.LOG_READERS = tools
    return seconds


def wall_of(argv: list[str]) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 3):
        raise SystemExit(f"Error: {' '.join(argv[:3])} failed: {done.stderr[-500:]}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument(
        "--sandboxes", type=int, default=64, help="driven at once (default 64; 0: not run)"
    )
    parser.add_argument("--commands", type=int, default=20, help="per sandbox (default 20)")
    parser.add_argument(
        "--episodes", type=int, default=64, help="guide episodes (default 64; 0: not run)"
    )
    parser.add_argument(
        "--round-trips", type=int, default=200, help="empty commands (default 200; 0: not run)"
    )
    parser.add_argument("--claims", type=int, default=100, help="warm claims (default 100; 0: not)")
    parser.add_argument(
        "--empty",
        default="true",
        help="the empty command, run by both (default: true; a "
        "minimal image without it: python3 -c pass)",
    )
    args = parser.parse_args()
    print(f"load average before: {load_average()}", flush=True)
    one = 0
    with tempfile.TemporaryDirectory(prefix="rldemo-pool-bench-") as directory:
        work = Path(directory)
        if args.round_trips:
            one = print_round_trips(args, work)
        if args.claims:
            waits = warm_claims(args.kubectl, work, args.claims)
            print(
                f"warm claim wait           p50 {ms(quantile(waits, 0.5))}  "
                f"p99 {ms(quantile(waits, 0.99))}",
                flush=True,
            )
        if args.sandboxes:
            many = many_sandboxes(args.kubectl, work, args.sandboxes, args.commands)
            print(
                f"{args.sandboxes} sandboxes at once: all warm after {many['warm_after']:.1f} s, "
                f"{many['per_second']:.0f} commands/s, {many['cpu_per_command'] * 1000:.2f} ms of "
                f"this process's CPU a command, {many['proxy_cpu_per_command'] * 1000:.2f} ms of "
                "its kubectl proxy's",
                flush=True,
            )
            evidence = many["evidence"]
            readers = max(evidence)
            one_by_one, seconds = evidence[1], evidence[readers]
            print(
                f"evidence of {args.sandboxes} sandboxes (pods' logs), as closing saves it: "
                f"{seconds:.2f} s with {readers} log readers, {one_by_one:.2f} s one at a time "
                f"({one_by_one / seconds:.1f} x)",
                flush=True,
            )
            print(
                f"kubectl processes: {one if args.round_trips else '-'} at 1 sandbox, "
                f"{many['kubectl_processes']} at {args.sandboxes}",
                flush=True,
            )
        if args.episodes:
            print_pool_and_batch(args, work)
    print(f"load average after: {load_average()}")
    return 0


def load_average() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def print_round_trips(args: argparse.Namespace, work: Path) -> int:
    """The empty command's round trips, against kubectl exec; the kubectl processes at 1."""
    trips, execs, one = empty_round_trips(args.kubectl, work, args.round_trips, args.empty.split())
    print(
        f"empty command round trip  p50 {ms(quantile(trips, 0.5))}  "
        f"p99 {ms(quantile(trips, 0.99))}",
        flush=True,
    )
    if execs:
        ratio = quantile(execs, 0.5) / quantile(trips, 0.5)
        print(
            f"kubectl exec -- {args.empty:<9} p50 {ms(quantile(execs, 0.5))}  "
            f"p99 {ms(quantile(execs, 0.99))}  ({ratio:.1f} x the pool's)",
            flush=True,
        )
    else:
        print(f"kubectl exec -- {args.empty}: not served by this tier", flush=True)
    return one


def print_pool_and_batch(args: argparse.Namespace, work: Path) -> None:
    """The same guide episodes as a pool and as a batch, 8 at a time: the wall time of each."""
    product, size = str(REPO_ROOT / "rl_batch_demo.py"), min(8, args.episodes)
    common = ["--kubectl", args.kubectl, "--cleanup", "--quiet"]
    pool_wall = wall_of(
        [sys.executable, product, "pool", "--output", str(work / "as-pool")]
        + ["--size", str(size), "--episodes", str(args.episodes), *common]
    )
    batch_wall = wall_of(
        [sys.executable, product, "run", "--output", str(work / "as-batch")]
        + ["--count", str(args.episodes), "--parallelism", str(size)]
        + ["--max-episodes", str(args.episodes), *common]
    )
    print(
        f"{args.episodes} guide episodes, {size} at a time: pool {pool_wall:.1f} s, batch "
        f"{batch_wall:.1f} s ({batch_wall / pool_wall:.2f} x)"
    )


if __name__ == "__main__":
    sys.exit(main())
