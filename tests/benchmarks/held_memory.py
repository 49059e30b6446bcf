#!/usr/bin/env python3
"""What the tool holds, per episode, at the moment it has seen its Job's end; and where the time
after the end goes.

    python3 tests/benchmarks/held_memory.py [--episodes 3000] [--rate 2000] [--product PATH]
                                 [--profile FILE] [--top 25]

The tool (by default this repository's rl_batch_demo.py) runs in this process, unchanged, against
tests/support/replay_kubectl.py (see benchmark.py --replay). When it starts collecting its evidence (the
Job's end seen, the watches settled), everything its follower holds is sized object by object
with sys.getsizeof, each object counted once, in the first part below that reaches it: the parts
are in the order a reader would charge them (the events before the tables that share their texts).
With --profile, the rest of the run (collecting, summarising, writing) is profiled with cProfile and
the functions taking most of it printed; the stats are saved in FILE.

Sizes need no quiet machine; the profile's seconds do (note the load average beside them).
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import argparse
import ctypes
import cProfile
import gc
import importlib.util
import io
import os
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

TESTS_DIR = Path(__file__).resolve().parent.parent
REPLAY = TESTS_DIR / "support" / "replay_kubectl.py"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("held_product", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["held_product"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


class Sizer:
    """Bytes of what objects reach, each object counted once over every call."""

    def __init__(self, skip: Iterable[Any] = ()) -> None:
        self.seen: set[int] = {id(value) for value in skip}

    def size(self, *roots: Any) -> int:
        total = 0
        stack = list(roots)
        while stack:
            value = stack.pop()
            if (
                id(value) in self.seen
                or value is None
                or isinstance(value, (bool, type, ModuleType))
            ):
                continue
            self.seen.add(id(value))
            total += sys.getsizeof(value)
            if isinstance(value, dict):
                stack.extend(value.keys())
                stack.extend(value.values())
            elif isinstance(value, (list, tuple, set, frozenset)):
                stack.extend(value)
            elif hasattr(value, "__dict__") and not callable(value):
                stack.append(vars(value))
            if hasattr(type(value), "__slots__") and not isinstance(value, tuple):
                for name in type(value).__slots__:
                    stack.append(getattr(value, name, None))
        return total


def held_events(store: Any) -> dict:
    """The events a store holds by name: records, or (earlier versions) compact dicts."""
    return getattr(store, "records", None) or getattr(store, "compact", {})


def held_parts(product: ModuleType, follower: Any) -> list[tuple[str, Callable[[], list[Any]]]]:
    """The parts of what the follower holds, in the order they are charged."""
    state = follower.state
    drafts = follower.drafts
    events = state.events
    every = list(drafts.drafts.values()) if drafts is not None else []

    def field(name: str) -> Callable[[], list[Any]]:
        return lambda: [getattr(draft, name) for draft in every]

    def inputs_part(name: str) -> Callable[[], list[Any]]:
        return lambda: [getattr(draft.inputs, name) for draft in every]

    return [
        ("events: each", lambda: list(held_events(events).values())),
        ("events: by name (the index's own)", lambda: [held_events(events)]),
        ("events: spool index", lambda: [events._spool]),
        ("pods", lambda: list(state.pods.values())),
        ("pods: by name, finality", lambda: [state.pods, state._not_final, state.deleted]),
        ("pods: spool index, versions", lambda: [state._final_texts, state._final_versions]),
        ("logs", lambda: [text for _, text in follower.log_reader.early.values()]),
        (
            "logs: index",
            lambda: [
                follower.log_reader.early,
                getattr(follower.log_reader, "saved", None),
                getattr(follower.log_reader, "_unsaved", None),
            ],
        ),
        ("log reads scheduled", lambda: [follower.log_reader._scheduled]),
        ("observations", lambda: [state.observed]),
        ("drafts: points", field("points")),
        ("drafts: phases", field("phases")),
        ("drafts: ready", field("ready")),
        ("drafts: reward", field("reward")),
        ("drafts: row", field("row")),
        ("drafts: inputs, observed", inputs_part("observed")),
        ("drafts: inputs, kubelet", inputs_part("kubelet")),
        ("drafts: inputs, the rest", field("inputs")),
        ("drafts: the records themselves", lambda: every),
        ("drafts: by name", lambda: [drafts.drafts] if drafts is not None else []),
        ("events: the index of them", lambda: [getattr(events, "index", None)]),
        ("drafts: kubelet index", lambda: [getattr(drafts, "kubelet", None)]),
        (
            "drafts: scheduled, creations",
            lambda: [getattr(drafts, "scheduled", None), getattr(drafts, "creations", None)],
        ),
        (
            "shared-text tables",
            lambda: [
                table
                for holder in (state, events, drafts)
                if holder is not None
                for table in [getattr(getattr(holder, "_shared", None), "table", None)]
                if table is not None
            ],
        ),
        ("the rest of the follower", lambda: [follower]),
    ]


# The steps after the end timed on their own (no profiler: its overhead would misstate them), and
# each file written, by name.
TIMED_STEPS = (
    "summarise_batch",
    "verify_batch",
    "clock_offsets",
    "slots_freed",
    "phase_summary",
    "throughput",
    "assemble_results",
    "write_pictures",
    "timeline_svg",
    "ramp_svg",
    "cdf_svg",
)


def timed_steps(product: ModuleType, after_end: Callable[[], bool]) -> dict[str, float]:
    """Wrap the product's steps (and write_text, by file name) to add up their seconds once the
    end was seen."""
    spent: dict[str, float] = {}

    def timing(
        name: str, function: Callable[..., Any], key: Callable[..., str]
    ) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if after_end():
                    label = key(*args)
                    spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

        return timed

    for name in TIMED_STEPS:
        setattr(product, name, timing(name, getattr(product, name), lambda *a, n=name: n))
    product.write_text = timing(
        "write_text",
        product.write_text,
        lambda path, *a: (
            "write " + ("<pod>.log" if path.endswith(".log") else os.path.basename(path))
        ),
    )
    return spent


def vm_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def allocators() -> dict[str, float]:
    """MB: Python's small-object allocator (its blocks in use, its arenas) and the C allocator
    (glibc's mallinfo2: in use, and taken from the system), where this process's memory goes."""
    found: dict[str, float] = {}
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    allocated = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    arenas = re.search(r"# bytes lost to arena alignment.*?\nTotal\s*=\s*([\d,]+)", text, re.S)
    if allocated and arenas:
        found["pymalloc in use"] = int(allocated.group(1).replace(",", "")) / 2**20
        found["pymalloc arenas"] = int(arenas.group(1).replace(",", "")) / 2**20
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return found

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
        found["malloc in use"] = (info.uordblks + info.hblkhd) / 2**20
        found["malloc from the system"] = (info.arena + info.hblkhd) / 2**20
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=2000, help="pod watch lines a second")
    parser.add_argument("--product", type=Path, default=TESTS_DIR.parent / "rl_batch_demo.py")
    parser.add_argument("--profile", type=Path, help="profile the run after the end; stats here")
    parser.add_argument(
        "--profile-wait",
        type=Path,
        help="profile the run until the end is seen instead (on Python 3.12+ every thread is profiled; "
        "on 3.9 to 3.11 the thread that follows the batch alone); stats here",
    )
    parser.add_argument("--top", type=int, default=25, help="functions of the profile printed")
    parser.add_argument(
        "--profile-summary",
        type=Path,
        help="profile summarise_batch alone (the thread that runs it); stats here",
    )
    args = parser.parse_args(argv)
    product = load(args.product)
    work = Path(tempfile.mkdtemp(prefix="held-memory-"))
    os.environ.update(
        REPLAY_STATE=str(work / "state"),
        REPLAY_EPISODES=str(args.episodes),
        REPLAY_POD_EVENTS_PER_SECOND=str(args.rate),
    )
    measured: dict[str, Any] = {"rss_at_start_mb": vm_rss_mb()}
    profiler = cProfile.Profile() if args.profile or args.profile_wait else None
    collect = product.BatchEvidence.collect

    def sized_collect(self: Any, *a: Any, **k: Any) -> Any:
        if "parts" not in measured:
            measured["rss_mb"] = vm_rss_mb()
            measured["allocators"] = allocators()
            sizer = Sizer(skip=[product.__dict__])
            parts = []
            for name, roots in held_parts(product, self.follower):
                parts.append((name, sizer.size(*roots())))
            measured["parts"] = parts
            measured["sized_at"] = time.monotonic()
            if profiler is not None and args.profile_wait:
                profiler.disable()
            elif profiler is not None:
                profiler.enable()
        return collect(self, *a, **k)

    product.BatchEvidence.collect = sized_collect
    spent = timed_steps(product, lambda: "parts" in measured) if not profiler else {}
    if args.profile_summary:
        summary_profiler = cProfile.Profile()
        summarise = product.summarise_batch

        def profiled(*a: Any, **k: Any) -> Any:
            return summary_profiler.runcall(summarise, *a, **k)

        product.summarise_batch = profiled
    collections: dict[int, list[float]] = {0: [], 1: [], 2: []}
    collecting: list[float] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            collecting[:] = [time.perf_counter()]
        elif collecting and "parts" not in measured:  # the cycle collector while waiting
            collections[info["generation"]].append(time.perf_counter() - collecting[0])

    gc.callbacks.append(timed)
    if profiler is not None and args.profile_wait:
        profiler.enable()
    status = product.main(
        [
            "run",
            "--quiet",
            "--count",
            str(args.episodes),
            "--parallelism",
            str(args.episodes),
            "--max-episodes",
            str(args.episodes),
            "--output",
            str(work / "out"),
            "--kubectl",
            str(REPLAY),
            "--timeout",
            "3600",
        ]
    )
    if profiler is not None and not args.profile_wait:
        profiler.disable()
    finished = time.monotonic()
    if status != 0 or "parts" not in measured:
        print(f"the run failed (status {status}); files in {work}", file=sys.stderr)
        return 1
    count = args.episodes
    total = sum(size for _, size in measured["parts"])
    print(
        f"product {args.product}; {count} episodes at {args.rate} pod lines/s; "
        f"load average {os.getloadavg()[0]:.2f}; files in {work}"
    )
    print(
        f"VmRSS at the start {measured['rss_at_start_mb']:.1f} MB, when the end was seen "
        f"{measured['rss_mb']:.1f} MB; sized {total / 2**20:.1f} MB; "
        + ", ".join(f"{name} {mb:.1f} MB" for name, mb in measured["allocators"].items())
    )
    print(f"{'part':<40} {'bytes/episode':>14}")
    for name, size in measured["parts"]:
        print(f"{name:<40} {size / count:>14.0f}")
    print(f"{'total':<40} {total / count:>14.0f}")
    print(f"after the end, in process: {finished - measured['sized_at']:.2f} s")
    if spent:
        print(
            "after the end, each step (s): " + ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
        )
    print(
        "the cycle collector while waiting: "
        + ", ".join(
            f"generation {generation} {len(times)} times, {sum(times):.2f} s"
            for generation, times in collections.items()
        )
    )
    if profiler is not None:
        profiler.dump_stats(str(args.profile or args.profile_wait))
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.top)
        print(text.getvalue())
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
    if args.profile_summary:
        summary_profiler.dump_stats(str(args.profile_summary))
        text = io.StringIO()
        pstats.Stats(summary_profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print(text.getvalue())
    gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
