#!/usr/bin/env python3
"""Run the same scenario against the tests' emulator and the real control plane; print what differs.

    python3 tests/benchmarks/compare_clusters.py [--kubectl PATH] [--keep DIR]

The scenario is the guide's batch through the real tool, then the reads, the
errors and the deletions the tool relies on, each made with kubectl on both
clusters. Answers are normalised (names, UIDs, times, versions, addresses) and
compared: for JSON, which fields each side has and the values that carry
meaning (phases, reasons, condition types, messages); for text, the lines.
Each difference is printed as `request: emulator ... | real ...`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

TESTS_DIR = Path(__file__).resolve().parent.parent  # local_cluster.py
REPO_ROOT = TESTS_DIR.parent
sys.path[:0] = [str(TESTS_DIR / "support"), str(TESTS_DIR), str(REPO_ROOT)]

import prereqs  # noqa: E402
from build_control_plane import ensure_built  # noqa: E402
from kube_emulator import Emulator  # noqa: E402
from local_cluster import LocalCluster  # noqa: E402

PRODUCT = REPO_ROOT / "rl_batch_demo.py"
# Fields whose values are compared (after normalising); all other fields only by presence.
MEANINGFUL = re.compile(
    r"(^|\.)(phase|reason|type|status|message|kind|apiVersion|code|exitCode|ready|started|"
    r"restartCount|finalizers|propagationPolicy|completionMode|succeeded|failed|active|"
    r"terminating|ready|qosClass|restartPolicy|count|component|fieldPath|action|"
    r"reportingComponent)$"
)


def normalise(text: str, names: Dict[str, str]) -> str:
    for real, placeholder in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(real, placeholder)
    text = re.sub(
        r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<uid>", text
    )
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", text)
    text = re.sub(r"agc-rl-[0-9a-f]{12}", "<ns>", text)
    text = re.sub(r"(rollout(-\d+)?)-[bcdfghjklmnpqrstvwxz2456789]{5}\b", r"\1-<x>", text)
    text = re.sub(r"\b\d+(\.\d+)?(ms|s|m)\b", "<dur>", text)
    text = re.sub(r"\b(\d{1,3}\.){3}\d{1,3}\b", "<ip>", text)
    text = re.sub(r"(emu-node|rldemo-node)-\d+", "<node>", text)
    text = re.sub(r"\b[0-9a-f]{64}\b", "<hex>", text)
    text = re.sub(r"\.[0-9a-f]{12,}\b", ".<hex>", text)
    text = re.sub(r'"resourceVersion": "\d+"', '"resourceVersion": "<rv>"', text)
    return text


def flatten(value: Any, prefix: str = "") -> Dict[str, Any]:
    """path -> leaf value; list items are keyed by their name/type when they have one, else [*]."""
    out: Dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(value, list):
        if not value:
            out[prefix] = []
        for item in value:
            key = "*"
            if isinstance(item, dict):
                key = str(item.get("type") or item.get("name") or item.get("reason") or "*")
            out.update(flatten(item, f"{prefix}[{key}]"))
    else:
        out[prefix] = value
    return out


def compare_json(request: str, emulated: Any, real: Any, out: List[str]) -> None:
    a, b = flatten(emulated), flatten(real)
    skip = re.compile(r"managedFields|annotations\.kubectl|\.resourceVersion$|selfLink")
    for path in sorted(set(a) | set(b)):
        if skip.search(path):
            continue
        if path not in b:
            out.append(f"{request}: {path}: emulator {a[path]!r} | real (absent)")
        elif path not in a:
            out.append(f"{request}: {path}: emulator (absent) | real {b[path]!r}")
        elif MEANINGFUL.search(path) and a[path] != b[path]:
            out.append(f"{request}: {path}: emulator {a[path]!r} | real {b[path]!r}")


class Side:
    def __init__(self, name: str, cluster: Any, kubectl: str, workdir: Path):
        self.name, self.cluster, self.kubectl, self.workdir = name, cluster, kubectl, workdir
        self.names: Dict[str, str] = {}

    def kubectl_run(self, *args: str, stdin: str = "") -> Tuple[int, str, str]:
        done = subprocess.run(
            [self.kubectl, *args],
            input=stdin,
            env=self.cluster.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        return (
            done.returncode,
            normalise(done.stdout, self.names),
            normalise(done.stderr, self.names),
        )

    def tool(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(PRODUCT), *args, "--kubectl", self.kubectl],
            env=self.cluster.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )


def scenario(side: Side) -> Dict[str, Any]:
    """request -> answer (exit code and normalised output; JSON parsed when it is JSON)."""
    answers: Dict[str, Any] = {}
    output = side.workdir / "run"
    result = side.tool("run", "--count", "3", "--output", str(output), "--quiet")
    answers["tool run --count 3 (exit)"] = result.returncode
    if result.returncode != 0:
        answers["tool run stderr"] = result.stderr
        return answers
    namespace = json.loads((output / "receipt.json").read_text())["namespace"]
    side.names[namespace] = "<ns>"
    for name in ("job.json", "pods.json"):
        answers[f"saved {name}"] = json.loads(normalise((output / name).read_text(), side.names))
    events = json.loads((output / "events.json").read_text())["items"]
    answers["saved events.json (who said what)"] = sorted(
        {
            " ".join(
                str(x)
                for x in (
                    e["involvedObject"].get("kind"),
                    e.get("type"),
                    e.get("reason"),
                    (e.get("source") or {}).get("component"),
                    e.get("reportingComponent"),
                    "eventTime" if e.get("eventTime") else "-",
                    "firstTimestamp" if e.get("firstTimestamp") else "-",
                    e["involvedObject"].get("fieldPath", "-"),
                    normalise(e.get("message", ""), side.names),
                )
            )
            for e in events
        }
    )
    pods = json.loads((output / "pods.json").read_text())["items"]
    pod = pods[0]["metadata"]["name"]
    ns = ["-n", namespace]

    def ask(label: str, *args: str) -> None:
        code, out, err = side.kubectl_run(*args)
        try:
            parsed: Any = json.loads(out)
        except ValueError:
            parsed = out
        answers[label] = {"exit": code, "out": parsed, "err": err}

    ask("get runtimeclass cube", "get", "runtimeclass", "cube", "-o", "json")
    ask("get namespace", "get", "namespace", namespace, "-o", "json")
    ask("get namespace missing", "get", "namespace", "agc-rl-000000000000")
    ask("get events (core/v1)", "get", "events", *ns, "-o", "json")
    ask("get events.k8s.io", "get", "events.v1.events.k8s.io", *ns, "-o", "json")
    ask("logs", "logs", pod, *ns, "-c", "episode")
    ask("logs --previous", "logs", pod, *ns, "-c", "episode", "--previous")
    ask("logs no such container", "logs", pod, *ns, "-c", "nope")
    ask(
        "get pods field selector",
        "get",
        "pods",
        *ns,
        "--field-selector",
        "status.phase=Succeeded",
        "-o",
        "name",
    )
    ask("get pods bad field selector", "get", "pods", *ns, "--field-selector", "spec.bogus=1")
    ask("get pods wide", "get", "pods", *ns, "-o", "wide")
    ask("get job table", "get", "job", "rollout", *ns)
    ask("create job again", "create", "job", "rollout", *ns, "--image=python:3.12-alpine")
    ask(
        "delete job foreground",
        "delete",
        "job",
        "rollout",
        *ns,
        "--cascade=foreground",
        "--wait=false",
    )
    ask(
        "job after foreground delete",
        "get",
        "job",
        "rollout",
        *ns,
        "-o",
        "json",
        "--ignore-not-found",
    )
    ask("delete namespace", "delete", "namespace", namespace, "--wait=false")
    ask("namespace after delete", "get", "namespace", namespace, "-o", "json", "--ignore-not-found")
    ask("create configmap in terminating namespace", "create", "configmap", "late", *ns)
    return answers


def compare(emulated: Dict[str, Any], real: Dict[str, Any]) -> List[str]:
    out: List[str] = []
    for request in emulated.keys() | real.keys():
        a, b = emulated.get(request), real.get(request)
        if isinstance(a, (dict, list)) and isinstance(b, (dict, list)):
            compare_json(request, a, b, out)
        elif a != b:
            out.append(f"{request}: emulator {a!r} | real {b!r}")
    return sorted(out)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kubectl", default=prereqs.find_kubectls().get("1.35") or shutil.which("kubectl")
    )
    parser.add_argument("--keep", help="keep both clusters' files in this directory")
    args = parser.parse_args(argv)
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="rldemo-compare-"))
    emulator = Emulator(
        workdir / "emulator",
        faults={"sandbox_delay": 0.4, "sandbox_jitter": 0.1},
        server_version="1.35",
    )
    real = LocalCluster(workdir / "real", ensure_built())
    emulator.start()
    real.start()
    try:
        answers = {}
        for name, cluster in (("emulator", emulator), ("real", real)):
            side = Side(name, cluster, args.kubectl, workdir / f"{name}-side")
            side.workdir.mkdir(parents=True, exist_ok=True)
            answers[name] = scenario(side)
        (workdir / "answers.json").write_text(json.dumps(answers, indent=2, default=str))
        differences = compare(answers["emulator"], answers["real"])
    finally:
        emulator.stop()
        real.stop()
    for line in differences:
        print(line)
    print(f"{len(differences)} differences; answers in {workdir / 'answers.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
