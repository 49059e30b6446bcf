#!/usr/bin/env python3
"""The picture of docs/jaeger-trace.png: one run's trace in Jaeger's UI, taken from the real tier.

    python3 tests/support/jaeger_screenshot.py UI_BUILD_DIR [--output docs/jaeger-trace.png]

What it buys: the trace a reader of docs/observability.md will see, as Jaeger shows it (run ->
batch -> episode -> phase, a failed episode in red), made by the tool itself, not drawn. It starts
Jaeger v2 (tests/support/telemetry_servers.py) serving the UI from UI_BUILD_DIR, the real control
plane with the node agent (tests/local_cluster.py), runs a small rollout (four tasks, one that
fails on its own) with `--otlp-endpoint` to that Jaeger, and has headless Chromium take the
screenshot of the run's trace page. Everything listens on loopback and is stopped at the end.

It needs a built Jaeger UI directory, given as UI_BUILD_DIR: Jaeger built from the Go module proxy
carries none, and no registry we reach serves it built. Build it from jaeger-ui's source (the tag
of Jaeger's version, v1.75.0) with npm: `npm ci && npm run build`, then give
packages/jaeger-ui/build. It also needs Jaeger (tests/support/build_jaeger.py, or
$RLDEMO_JAEGER_BIN), the control plane (tests/support/build_control_plane.py, or
$RLDEMO_CONTROL_PLANE_BIN), kubectl 1.35 (as the tests find it), bubblewrap and `chromium`.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUPPORT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SUPPORT_DIR.parent.parent
sys.path.insert(0, str(SUPPORT_DIR))
sys.path.insert(0, str(SUPPORT_DIR.parent))
import build_control_plane  # noqa: E402  (needs the path above)
import build_jaeger  # noqa: E402
import prereqs  # noqa: E402
from local_cluster import LocalCluster  # noqa: E402
from telemetry_servers import Jaeger  # noqa: E402

PRODUCT = REPO_ROOT / "rl_batch_demo.py"

# Each episode works a little (its task's `x` tenths of a second) so the bars differ; "c" fails
# on its own: a valid sample, its span an ERROR.
EPISODE = """\
import json, os, sys, time
def emit(event, **fields):
    fields.update(event=event, at=time.time(), episode_id=os.environ["EPISODE_ID"])
    print(json.dumps(fields), flush=True)
with open(os.environ["TASK_FILE"]) as handle:
    task = json.load(handle)
emit("ready")
time.sleep(task["x"] / 10)
if task.get("fail"):
    sys.exit("the agent gave up")
emit("reward", reward=task["x"] * 0.5)
"""
TASKS = [
    {"id": "a", "x": 3},
    {"id": "b", "x": 6},
    {"id": "c", "x": 2, "fail": True},
    {"id": "d", "x": 4},
]


def bin_dir(module, env_var: str) -> Path:
    """A built tool's directory: $env_var, else the module's cache (nothing is built here)."""
    given = os.environ.get(env_var)
    found = Path(given) if given else module.BIN_DIR
    if not module.binaries_present(found):
        sys.exit(f"jaeger_screenshot: missing {found} (python3 tests/support/{module.__name__}.py)")
    return found


def kubectl_135() -> str:
    kubectl = prereqs.find_kubectls(("1.35",)).get("1.35")
    if kubectl is None:
        sys.exit("jaeger_screenshot: no kubectl 1.35 (python3 tests/support/prereqs.py)")
    return kubectl


def run_traced(cluster: LocalCluster, kubectl: str, workdir: Path, otlp_url: str) -> dict:
    """One small rollout on the cluster, exporting its trace; results.json's telemetry."""
    tasks, episode, output = workdir / "tasks.jsonl", workdir / "episode.py", workdir / "traced"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    episode.write_text(EPISODE)
    argv = [sys.executable, str(PRODUCT), "run", "--kubectl", kubectl, "--output", str(output)]
    argv += ["--tasks", str(tasks), "--episode-script", str(episode)]
    argv += ["--allow-failures", "1", "--quiet", "--otlp-endpoint", otlp_url]
    done = subprocess.run(argv, env=cluster.env(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"jaeger_screenshot: the run exited {done.returncode}: {done.stderr[-2000:]}")
    telemetry = json.loads((output / "results.json").read_text())["telemetry"]
    if telemetry["not_exported_spans"]:
        sys.exit(f"jaeger_screenshot: spans not exported: {telemetry}")
    return telemetry


def screenshot(url: str, png: Path, window: str, chromium: str) -> None:
    """Headless Chromium's picture of `url`, once the page has had 15 s of virtual time (the UI
    fetches the trace and lays out the waterfall in that)."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
        argv += [f"--user-data-dir={profile}", f"--window-size={window}"]
        argv += ["--virtual-time-budget=15000", f"--screenshot={png}", url]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.exists():
        sys.exit(f"jaeger_screenshot: chromium exited {done.returncode}: {done.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ui", type=Path, help="a built jaeger-ui (packages/jaeger-ui/build)")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "jaeger-trace.png")
    parser.add_argument("--window", default="1400,930", help="Chromium's window, W,H pixels")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    ui = args.ui.resolve()
    if not (ui / "index.html").exists():
        parser.error(f"{ui} holds no index.html: give jaeger-ui's packages/jaeger-ui/build")
    jaeger_bin = bin_dir(build_jaeger, build_jaeger.ENV_VAR)
    control_plane_bin = bin_dir(build_control_plane, "RLDEMO_CONTROL_PLANE_BIN")
    kubectl = kubectl_135()
    with tempfile.TemporaryDirectory(prefix="jaeger-screenshot-") as temp:
        workdir = Path(temp)
        with Jaeger(jaeger_bin, workdir, ui_assets=ui) as jaeger:
            with LocalCluster(workdir / "cluster", control_plane_bin) as cluster:
                telemetry = run_traced(cluster, kubectl, workdir, jaeger.otlp_url)
            jaeger.trace(telemetry["trace_id"], telemetry["spans"])  # all of it, stored
            url = f"{jaeger.query_url}/trace/{telemetry['trace_id']}"
            screenshot(url, args.output.resolve(), args.window, args.chromium)
    print(f"{args.output}: {url} ({telemetry['spans']} spans)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
