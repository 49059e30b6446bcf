#!/usr/bin/env python3
"""Whether two versions of rl_batch_demo.py make the same files of the same saved runs.

    python3 tests/benchmarks/same_outputs.py OLD.py NEW.py RUN_DIR [RUN_DIR ...]

A change that should not change what a run saves (how much it holds while waiting, how it
reads its watches) is checked here: for each saved run, each version recomputes the run from
its files alone, as `report` does, and writes what a run writes from its summary (results.json,
episodes.csv, timeline.svg, ramp.svg, cdf.svg, and the printed results), and makes again, from
the saved events, pods and rows, events.txt, pods.json and rewards.jsonl. The two versions'
files must be byte for byte the same, and the same as the run's own (which the version that
ran wrote as its batch ran, from its drafts and its watches): a run made by the new version is
checked against the old version's whole-batch path. Exit status 1 on any difference, with the files named.
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

SUMMARY_FILES = ("results.json", "episodes.csv", "timeline.svg", "ramp.svg", "cdf.svg")


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def made_by(version: ModuleType, run: Path, into: Path) -> list[str]:
    """What `version` makes of the saved run `run`, written into `into`: the names of the files
    made (a run of several batches keeps each batch's evidence in the batch's own directory)."""
    into.mkdir(parents=True)
    results = version.recompute(str(run))
    settings = version.Settings.from_saved(json.loads((run / "run.json").read_text()))
    version.write_json(str(into / "results.json"), results.figures)
    version.write_text(str(into / "episodes.csv"), version.episodes_csv(results.batches))
    version.write_pictures(str(into), results.batches, settings, results.figures.get("throughput"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        version.print_results(results.figures, False)
    (into / "printed.txt").write_text(printed.getvalue())
    made = [*SUMMARY_FILES, "printed.txt"]
    for entry in settings.batches or [version.BatchEntry("", True, ".")]:
        batch, into_batch = run / entry.dir, into / entry.dir
        into_batch.mkdir(parents=True, exist_ok=True)
        prefix = "" if entry.dir == "." else f"{entry.dir}/"
        if (batch / "events.json").exists():
            events = json.loads((batch / "events.json").read_text()).get("items") or []
            if hasattr(version, "event_records"):  # a version whose readers of events take records
                events = version.event_records(events)
            text = version.events_table(events) if events else ""
            version.write_text(str(into_batch / "events.txt"), text)
            made.append(prefix + "events.txt")
        if (batch / "pods.json").exists():
            pods = json.loads((batch / "pods.json").read_text())
            version.write_json(str(into_batch / "pods.json"), pods)
            made.append(prefix + "pods.json")
        if (batch / "rewards.jsonl").exists():  # a rollout's
            rows = [json.loads(line) for line in (batch / "rewards.jsonl").read_text().splitlines()]
            version.write_text(str(into_batch / "rewards.jsonl"), version.rewards_jsonl(rows))
            made.append(prefix + "rewards.jsonl")
    return made


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    old, new = load(argv[0], "old_rl_batch_demo"), load(argv[1], "new_rl_batch_demo")
    differences = 0
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as scratch:
        for number, run in enumerate(Path(name) for name in argv[2:]):
            made = {}
            names: list[str] = []
            for label, version in (("old", old), ("new", new)):
                made[label] = Path(scratch) / str(number) / label
                names = made_by(version, run, made[label])
            for name in names:
                texts = {label: (made[label] / name).read_bytes() for label in made}
                saved = run / name
                if saved.exists() and name != "printed.txt":
                    texts["the run's own"] = saved.read_bytes()
                same = len(set(texts.values())) == 1
                differences += not same
                print(
                    f"{'same' if same else 'DIFFERENT'}  {run}/{name}  "
                    f"({', '.join(f'{label} {len(text)} bytes' for label, text in texts.items())})"
                )
    print(f"{differences} difference(s)")
    return 1 if differences else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main(sys.argv[1:]))
