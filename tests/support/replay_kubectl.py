#!/usr/bin/env python3
"""A stand-in kubectl that replays a recorded batch, scaled to N episodes at a chosen rate.

No machine here runs 100,000 pods, so to see what following that many costs the client, the
tool runs unchanged with `--kubectl tests/support/replay_kubectl.py`: every kubectl call it makes is
answered here, and its watches print what real kubectl printed while a small batch ran on the
emulator (tests/recorded/replay-3: the Job's, the pods' and the events' watch lines, each with
the moment it arrived, and each episode's log), repeated for N episodes:

- episode i replays recorded pod i % 3, renamed (pod, uid, namespace, Job uid), every time in it
  (RFC 3339 stamps, event name times, the worker's times in its log) moved by a whole number of
  seconds, so every stamp still names its true second; its watch lines are printed when the
  recording's arrived, moved by the same seconds plus a fraction (a watch that delivers later);
- pods start at REPLAY_POD_EVENTS_PER_SECOND / 7 a second (a recorded pod has 7 watch lines),
  so the pod watch prints that many lines a second however many run at once;
- the Job is created when the tool creates it (the create call's moment anchors everything);
  its last lines (SuccessCriteriaMet, Complete) follow the last pod's end;
- `kubectl proxy --unix-socket` serves each episode's log and the count of events.

Environment: REPLAY_STATE (a directory the calls of one run share; required), REPLAY_EPISODES
(default 10), REPLAY_POD_EVENTS_PER_SECOND (default 500), REPLAY_TEMPLATE (default the recording).
With REPLAY_VERBATIM=1 the recording is printed as it was, renamed into the tool's namespace but
with its own times: what tests/support/test_replay.py compares with the recording.
"""
# SPDX-License-Identifier: MIT

from __future__ import annotations

import datetime
import heapq
import http.server
import json
import math
import os
import re
import signal
import socketserver
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

TEMPLATE = Path(__file__).resolve().parent.parent / "recorded" / "replay-3"
LINES_PER_POD = 7
STAMP = re.compile(r'"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z"')
EVENT_NAME = re.compile(r'("name":"[^"]*\.)([0-9a-f]{16})"')
RESOURCE_VERSION = re.compile(r'"resourceVersion":"\d*"')


def rfc3339(moment: float, fraction: str | None) -> str:
    text = datetime.datetime.fromtimestamp(math.floor(moment), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S"
    )
    return f'"{text}{fraction or ""}Z"'


def stamp_seconds(text: str) -> float:
    return (
        datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
        .replace(tzinfo=datetime.timezone.utc)
        .timestamp()
    )


class Recording:
    """The recorded batch: each stream's lines with their arrival, and what names what."""

    def __init__(self, directory: Path) -> None:
        self.streams = {
            kind: [
                json.loads(line) for line in (directory / f"{kind}.watch").read_text().splitlines()
            ]
            for kind in ("jobs", "pods", "events")
        }
        first_job = json.loads(self.streams["jobs"][0]["line"])["object"]
        self.namespace = first_job["metadata"]["namespace"]
        self.job_uid = first_job["metadata"]["uid"]
        self.job_created = stamp_seconds(first_job["metadata"]["creationTimestamp"][:19])
        self.job_arrived = self.streams["jobs"][0]["arrived"]
        self.pods: list[str] = []
        self.pod_uids: dict[str, str] = {}
        for entry in self.streams["pods"]:
            pod = json.loads(entry["line"])["object"]["metadata"]
            if pod["name"] not in self.pods:
                self.pods.append(pod["name"])
                self.pod_uids[pod["name"]] = pod["uid"]
        self.logs = {name: (directory / f"{name}.log").read_text() for name in self.pods}

    def about(self, kind: str, entry: dict) -> str | None:
        """The recorded pod a line is about (None: the Job's own)."""
        obj = json.loads(entry["line"])["object"]
        if kind == "pods":
            return obj["metadata"]["name"]
        if kind == "events":
            regarding = obj.get("involvedObject") or {}
            if regarding.get("kind") == "Pod":
                return regarding.get("name")
            message = obj.get("message") or ""
            return (
                message[len("Created pod: ") :].strip()
                if message.startswith("Created pod: ")
                else None
            )
        return None


class Plan:
    """Who episode i is and how far its times move; shared by every call of one run."""

    def __init__(
        self,
        recording: Recording,
        episodes: int,
        rate: float,
        created: float,
        verbatim: bool,
        spec: dict | None = None,
    ) -> None:
        self.recording = recording
        self.spec = spec or {}
        self.episodes = episodes
        self.pods_per_second = max(rate / LINES_PER_POD, 1e-9)
        self.created = created  # the tool's create call, on this machine's clock
        self.verbatim = verbatim
        # Whole seconds, so that each stamp still names its true second; enough that the first
        # recorded line lands after the create call and no pod is stamped before the Job.
        self.base = 0 if verbatim else math.ceil(created - recording.job_arrived) + 1

    def shift(self, episode: int) -> int:
        return self.base + (0 if self.verbatim else int(episode / self.pods_per_second))

    def delay(self, episode: int) -> float:
        """A fraction of a second more for the watch to deliver: pods spread over their second."""
        if self.verbatim:
            return 0.0
        return (episode % max(1, int(self.pods_per_second))) / max(1.0, self.pods_per_second)

    def template_of(self, episode: int) -> str:
        return self.recording.pods[episode % len(self.recording.pods)]

    def pod_name(self, episode: int) -> str:
        if self.verbatim:
            return self.template_of(episode)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        suffix = "".join(digits[(episode // 36**power) % 36] for power in range(4, -1, -1))
        return f"rollout-{suffix}"

    def pod_uid(self, episode: int) -> str:
        if self.verbatim:
            return self.recording.pod_uids[self.template_of(episode)]
        return f"00000000-0000-4000-8000-{episode:012x}"

    def last_shift(self) -> int:
        return self.shift(self.episodes - 1)


def moved(text: str, seconds: int, nanoseconds: int = 0) -> str:
    """A recorded line with every time in it moved by `seconds`."""
    if not seconds and not nanoseconds:
        return text
    text = STAMP.sub(
        lambda found: rfc3339(stamp_seconds(found.group(1)) + seconds, found.group(2)), text
    )
    shift = seconds * 10**9 + nanoseconds
    return EVENT_NAME.sub(
        lambda found: f'{found.group(1)}{int(found.group(2), 16) + shift:016x}"', text
    )


def renamed(text: str, plan: Plan, namespace: str, job_uid: str, episode: int | None) -> str:
    recording = plan.recording
    text = text.replace(recording.namespace, namespace).replace(recording.job_uid, job_uid)
    if episode is not None:
        template = plan.template_of(episode)
        text = text.replace(template, plan.pod_name(episode)).replace(
            recording.pod_uids[template], plan.pod_uid(episode)
        )
    return text


class CompiledLine:
    """A recorded line cut where episode i's differs (its names, its times), put together again for
    each episode without searching the line: at 100,000 episodes the replay must outrun the tool."""

    def __init__(self, line: str, plan: Plan, namespace: str, job_uid: str, template: str) -> None:
        recording = plan.recording
        line = line.replace(recording.namespace, namespace).replace(recording.job_uid, job_uid)
        marks = [
            (found.start(), found.end(), ("stamp", stamp_seconds(found.group(1)), found.group(2)))
            for found in STAMP.finditer(line)
        ]
        marks += [
            (found.start(2), found.end(2), ("hex", int(found.group(2), 16), None))
            for found in EVENT_NAME.finditer(line)
        ]
        for name, token in (
            (template, ("pod", None, None)),
            (recording.pod_uids[template], ("uid", None, None)),
        ):
            start = line.find(name)
            while start >= 0:
                marks.append((start, start + len(name), token))
                start = line.find(name, start + len(name))
        marks.sort()
        self.pieces: list[Any] = []
        position = 0
        for start, end, token in marks:
            if start < position:
                continue  # inside a piece already cut (a pod's name within an event's name)
            self.pieces += [line[position:start], token]
            position = end
        self.pieces.append(line[position:])

    def line(
        self, plan: Plan, episode: int, shift: int, stamps: dict[tuple[float, str | None], str]
    ) -> str:
        parts = []
        for piece in self.pieces:
            if isinstance(piece, str):
                parts.append(piece)
            elif piece[0] == "stamp":
                key = (piece[1] + shift, piece[2])
                text = stamps.get(key)
                if text is None:
                    text = stamps[key] = rfc3339(key[0], piece[2])
                parts.append(text)
            elif piece[0] == "hex":
                # Plus the episode's number in nanoseconds: events of episodes moved alike stay apart.
                parts.append(f"{piece[1] + shift * 10**9 + (0 if plan.verbatim else episode):016x}")
            elif piece[0] == "pod":
                parts.append(plan.pod_name(episode))
            else:
                parts.append(plan.pod_uid(episode))
        return "".join(parts)


def scheduled_lines(
    plan: Plan, kind: str, namespace: str, job_uid: str
) -> Iterator[tuple[float, str]]:
    """(when to print it, the line) for one watch, in order."""
    recording = plan.recording
    entries = recording.streams[kind]
    per_pod = {
        name: [entry for entry in entries if recording.about(kind, entry) == name]
        for name in recording.pods
    }
    own = [entry for entry in entries if recording.about(kind, entry) is None]
    if kind == "jobs":
        # Its first lines as recorded; those saying the batch is done after the last pod's end.
        done = [
            entry
            for entry in own
            if json.loads(entry["line"])["object"].get("status", {}).get("conditions")
        ]
        for entry in own:
            last = entry in done
            shift = plan.last_shift() if last else plan.base
            yield (
                entry["arrived"] + shift + (plan.delay(plan.episodes - 1) if last else 0.0),
                as_created(
                    renamed(moved(entry["line"], shift), plan, namespace, job_uid, None), plan
                ),
            )
        return
    heap: list[tuple[float, int, str]] = []
    counter = 0
    done_lines = [entry for entry in own]  # the Job's Completed event, after the last pod
    compiled = {
        name: [
            (entry["arrived"], CompiledLine(entry["line"], plan, namespace, job_uid, name))
            for entry in entries
        ]
        for name, entries in per_pod.items()
    }
    stamps: dict[tuple[float, str | None], str] = {}
    for episode in range(plan.episodes):
        shift, delay = plan.shift(episode), plan.delay(episode)
        lines = compiled[plan.template_of(episode)]
        # Episodes come in order of their start: whatever is due before this one's first line goes out first.
        first_due = min(arrived for arrived, _ in lines) + shift + delay if lines else math.inf
        while heap and heap[0][0] <= first_due:
            at, _, line = heapq.heappop(heap)
            yield at, line
        for arrived, compiled_line in lines:
            counter += 1
            heapq.heappush(
                heap,
                (
                    arrived + shift + delay,
                    counter,
                    compiled_line.line(plan, episode, shift, stamps),
                ),
            )
    while heap:
        at, _, line = heapq.heappop(heap)
        yield at, line
    for entry in done_lines:
        shift = plan.last_shift()
        yield (
            entry["arrived"] + shift + plan.delay(plan.episodes - 1),
            renamed(moved(entry["line"], shift), plan, namespace, job_uid, None),
        )


def as_created(line: str, plan: Plan) -> str:
    """A recorded Job line as the tool's own Job: its completions and parallelism, its count of pods."""
    if plan.verbatim:
        return line
    event = json.loads(line)
    job = event["object"]
    job["spec"].update(
        {key: plan.spec[key] for key in ("completions", "parallelism") if key in plan.spec}
    )
    job["metadata"]["creationTimestamp"] = rfc3339(plan.created, None).strip('"')
    status = job.get("status") or {}
    if status.get("succeeded"):
        status["succeeded"] = plan.episodes
    return json.dumps(event, separators=(",", ":"))


def with_resource_version(line: str, at: float, plan: Plan) -> str:
    if plan.verbatim:
        return line
    return RESOURCE_VERSION.sub(
        f'"resourceVersion":"{int((at - plan.created) * 1e6) + 1000}"', line, count=1
    )


def log_of(plan: Plan, episode: int) -> str:
    """Episode i's log: its recorded pod's, renamed, the worker's times moved with its pod's."""
    text = plan.recording.logs[plan.template_of(episode)].replace(
        plan.template_of(episode), plan.pod_name(episode)
    )
    shift = plan.shift(episode)
    lines = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            lines.append(line)
            continue
        for key in ("at", "process_started_at", "imports_done_at"):
            if isinstance(event.get(key), (int, float)):
                event[key] = event[key] + shift
        lines.append(json.dumps(event))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# The calls.


def state_dir() -> Path:
    state = os.environ.get("REPLAY_STATE")
    if not state:
        sys.exit("replay_kubectl: set REPLAY_STATE to a directory")
    Path(state).mkdir(parents=True, exist_ok=True)
    return Path(state)


def plan_of(created: dict) -> Plan:
    recording = Recording(Path(os.environ.get("REPLAY_TEMPLATE") or TEMPLATE))
    verbatim = os.environ.get("REPLAY_VERBATIM") == "1"
    episodes = len(recording.pods) if verbatim else int(os.environ.get("REPLAY_EPISODES", "10"))
    return Plan(
        recording,
        episodes,
        float(os.environ.get("REPLAY_POD_EVENTS_PER_SECOND", "500")),
        created["at"],
        verbatim,
        created.get("spec"),
    )


def wait_for_job(deadline: float) -> dict:
    path = state_dir() / "job.json"
    while not path.exists():
        if time.time() > deadline:
            sys.exit(0)
        time.sleep(0.01)
    return json.loads(path.read_text())


def option(args: list[str], name: str) -> str | None:
    for position, arg in enumerate(args):
        if arg == name and position + 1 < len(args):
            return args[position + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def watch(kind: str, args: list[str]) -> int:
    timeout = option(args, "--request-timeout") or "3600s"
    deadline = time.time() + float(timeout.rstrip("s") or 3600)
    created = wait_for_job(deadline)
    plan = plan_of(created)
    out = sys.stdout
    behind = 0.0
    lines = scheduled_lines(plan, kind, created["namespace"], created["uid"])
    upcoming = next(lines, None)
    while upcoming is not None:
        at, line = upcoming
        upcoming = next(lines, None)
        wait = at - time.time()
        if wait > 0:
            out.flush()
            time.sleep(wait)
        else:
            behind = max(behind, -wait)
        if time.time() > deadline:
            return 0
        if upcoming is None:
            # A client that sees the last line stops this watch at once: the note below is
            # written before its stop is taken, or a quick client would leave the benchmark
            # without its end. Blocked before the line is written, not after: a write that fills
            # the pipe's buffer sends it on its own (seen with the Job's last lines due together).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        out.write(with_resource_version(line, at, plan) + "\n")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    out.flush()
    # When the last line went out (the Job's Complete, on the Job's watch) and how far this
    # replay ever fell behind its schedule: the benchmark's true end, and whether the rate held.
    (state_dir() / f"{kind}.done").write_text(
        json.dumps({"at": time.time(), "behind_seconds": behind})
    )
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    # A watch runs until it is stopped or its request times out.
    time.sleep(max(0.0, deadline - time.time()))
    return 0


def create(args: list[str]) -> int:
    manifest = json.loads(sys.stdin.read())
    now = time.time()
    metadata = manifest.setdefault("metadata", {})
    metadata.update(
        uid=f"{manifest['kind'].lower()}-{int(now * 1e6):x}",
        resourceVersion="1",
        creationTimestamp=rfc3339(now, None).strip('"'),
    )
    if manifest["kind"] == "Namespace":
        manifest["status"] = {"phase": "Active"}
        # Kept for the follower lease's reads of it (its writes are taken and not kept).
        (state_dir() / "namespace.json").write_text(json.dumps(manifest))
    if manifest["kind"] == "Job":
        (state_dir() / "job.json.tmp").write_text(
            json.dumps(
                {
                    "at": now,
                    "namespace": metadata["namespace"],
                    "uid": metadata["uid"],
                    "spec": manifest.get("spec"),
                }
            )
        )
        os.replace(state_dir() / "job.json.tmp", state_dir() / "job.json")
    print(json.dumps(manifest))
    return 0


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        parts = url.path.strip("/").split("/")
        plan = self.server.plan  # type: ignore[attr-defined]
        if len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
            name = parts[5]
            episode = (
                next((n for n in range(plan.episodes) if plan.pod_name(n) == name), None)
                if plan.verbatim
                else decode_episode(name)
            )
            if episode is None:
                return self.answer(404, "{}")
            return self.answer(200, log_of(plan, episode), "text/plain")
        if len(parts) == 5 and parts[4] == "events":
            about = [
                plan.recording.about("events", entry) for entry in plan.recording.streams["events"]
            ]
            templates = [plan.template_of(n) for n in range(len(plan.recording.pods))]
            per_template = {name: about.count(name) for name in templates}
            cycles, rest = divmod(plan.episodes, len(templates))
            total = (
                about.count(None)
                + cycles * sum(per_template.values())
                + sum(per_template[name] for name in templates[:rest])
            )
            return self.answer(
                200,
                json.dumps(
                    {
                        "kind": "EventList",
                        "apiVersion": "v1",
                        "items": [{}],
                        "metadata": {
                            "resourceVersion": "1",
                            "continue": "more",
                            "remainingItemCount": total - 1,
                        },
                    }
                ),
            )
        return self.answer(404, json.dumps({"kind": "Status", "status": "Failure", "code": 404}))

    def answer(self, status: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def decode_episode(name: str) -> int | None:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    suffix = name.rsplit("-", 1)[-1]
    try:
        return sum(
            digits.index(char) * 36 ** (len(suffix) - 1 - position)
            for position, char in enumerate(suffix)
        )
    except ValueError:
        return None


class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def proxy(args: list[str]) -> int:
    path = option(args, "--unix-socket")
    if not path:
        sys.exit("replay_kubectl: proxy needs --unix-socket")
    with UnixServer(path, ProxyHandler) as server:
        # The proxy starts before the Job exists: the plan is made at the first request.
        server.plan = None  # type: ignore[attr-defined]

        class Planned(ProxyHandler):
            def do_GET(self) -> None:
                if server.plan is None:  # type: ignore[attr-defined]
                    server.plan = plan_of(json.loads((state_dir() / "job.json").read_text()))  # type: ignore[attr-defined]
                ProxyHandler.do_GET(self)

        server.RequestHandlerClass = Planned
        server.serve_forever()
    return 0


def main(argv: list[str]) -> int:
    args = [arg for arg in argv]
    if "--context" in args:
        position = args.index("--context")
        del args[position : position + 2]
    words = [arg for arg in args if not arg.startswith("-")]
    if words[:1] == ["version"]:
        print(
            json.dumps(
                {"clientVersion": {"major": "1", "minor": "35", "gitVersion": "v1.35.0-replay"}}
            )
        )
        return 0
    if words[:2] == ["config", "current-context"]:
        print("replay")
        return 0
    if words[:2] == ["config", "get-contexts"]:
        print(words[2] if len(words) > 2 else "replay")
        return 0
    if words[:2] == ["auth", "whoami"]:
        print(
            json.dumps(
                {"kind": "SelfSubjectReview", "status": {"userInfo": {"username": "replay"}}}
            )
        )
        return 0
    if words[:1] == ["create"]:
        return create(args)
    if words[:2] == ["get", "namespace"] and (state_dir() / "namespace.json").exists():
        print((state_dir() / "namespace.json").read_text())
        return 0
    if words[:2] == ["patch", "namespace"]:
        return 0
    if words[:1] == ["proxy"]:
        return proxy(args)
    if words[:2] == ["get", "runtimeclass"]:
        if "-o" in args and args[args.index("-o") + 1] == "name":
            print(f"runtimeclass.node.k8s.io/{words[2]}")
        else:
            print(
                json.dumps(
                    {
                        "apiVersion": "node.k8s.io/v1",
                        "kind": "RuntimeClass",
                        "handler": words[2],
                        "metadata": {"name": words[2]},
                    }
                )
            )
        return 0
    if words[:2] == ["get", "nodes"]:
        print(
            json.dumps(
                {
                    "kind": "List",
                    "items": [
                        {
                            "metadata": {"name": f"emu-node-{n}"},
                            "spec": {},
                            "status": {
                                "allocatable": {
                                    "cpu": "100000",
                                    "memory": "100000Gi",
                                    "pods": "1000000",
                                },
                                "conditions": [{"type": "Ready", "status": "True"}],
                            },
                        }
                        for n in (1, 2, 3)
                    ],
                }
            )
        )
        return 0
    if words[:1] == ["get"] and "--watch" in args:
        kind = {"jobs": "jobs", "pods": "pods", "events": "events"}.get(words[1])
        if kind:
            return watch(kind, args)
    print(f"replay_kubectl: not replayed: {' '.join(argv)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
