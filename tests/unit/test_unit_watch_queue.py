"""Unit tests of the watch queue's bound: a watch's reader stops reading its pipe while `most`
events wait to be taken in, loses none of them, and once its watch is stopped delivers the rest
and its end without waiting; and the logs read as containers end, each once, no finished read
kept. A reader thread fed by a fake process, a pool of two; no kubectl, no API."""

from __future__ import annotations

import concurrent.futures
import json
import queue
import threading
import time
from typing import Any

import all_names as demo

WAIT_SECONDS = 30  # a bound for a wait on another thread, never a figure asserted


class Pipe:
    """A watch's stdout that gives one event a read, noting how many events waited at each read."""

    def __init__(self, stream: demo.WatchStream, count: int) -> None:
        self.lines = [
            (json.dumps({"type": "ADDED", "object": {"metadata": {"name": f"p-{n}"}}}) + "\n")
            for n in range(count)
        ]
        self.stream = stream
        self.waiting_at_reads: list[int] = []

    def read(self, size: int) -> bytes:
        self.waiting_at_reads.append(self.stream.queue.qsize())
        return self.lines.pop(0).encode() if self.lines else b""


class Process:
    """Stands for the watch's kubectl: it has ended once its pipe is read to its end."""

    def __init__(self, stdout: Pipe) -> None:
        self.stdout = stdout

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def terminate(self) -> None:
        pass


class Errors:
    """What the watch's kubectl wrote on stderr: nothing."""

    def __enter__(self) -> Errors:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def seek(self, offset: int) -> None:
        pass

    def read(self) -> bytes:
        return b""


def reading(most: int, count: int) -> tuple[demo.WatchStream, Pipe, threading.Thread]:
    """A pod watch of `count` events read by its own thread into a queue bounded at `most`."""
    stream = demo.WatchStream(demo.Kubectl("kubectl-never-run"), "ns", "rollout", most=most)
    pipe = Pipe(stream, count)
    stream.processes["pods"] = Process(pipe)  # type: ignore[assignment]
    stopped = stream._stopped["pods"] = threading.Event()
    reader = threading.Thread(
        target=stream._pump, args=("pods", Process(pipe), Errors(), stopped), daemon=True
    )
    reader.start()
    return stream, pipe, reader


def until(condition: Any) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "the reader never got there"
        time.sleep(0.01)


def taken(stream: demo.WatchStream) -> list[Any]:
    """Every item up to the watch's end, taken as the follower takes them."""
    items = []
    while True:
        item = stream.get(timeout=WAIT_SECONDS)
        items.append(item)
        if isinstance(item, demo.WatchEnded):
            return items


def names(items: list[Any]) -> list[str]:
    return [
        item.event["object"]["metadata"]["name"]
        for item in items
        if isinstance(item, demo.WatchEvent)
    ]


def test_a_reader_stops_reading_its_pipe_while_the_queue_is_full_and_loses_nothing() -> None:
    stream, pipe, reader = reading(most=3, count=40)
    until(lambda: stream.queue.qsize() == 3)
    time.sleep(0.2)  # a reader that did not wait would read on meanwhile
    assert stream.queue.qsize() == 3 and reader.is_alive()
    # It read the fourth event and waits to put it: the other 36 are still in the pipe.
    assert len(pipe.lines) == 36
    items = taken(stream)
    assert names(items) == [f"p-{n}" for n in range(40)]
    assert items[-1] == demo.WatchEnded("pods", None)
    assert max(pipe.waiting_at_reads) <= 3
    reader.join(WAIT_SECONDS)
    assert not reader.is_alive() and stream.room.waiting == 0


def test_a_stopped_watch_delivers_the_rest_and_its_end_without_waiting_for_room() -> None:
    stream, pipe, reader = reading(most=2, count=10)
    until(lambda: stream.queue.qsize() == 2)
    stream.stop()
    reader.join(WAIT_SECONDS)
    assert not reader.is_alive() and "pods" not in stream
    items = []
    while True:
        try:
            items.append(stream.get(None))
        except queue.Empty:
            break
    assert names(items) == [f"p-{n}" for n in range(10)]
    assert items[-1] == demo.WatchEnded("pods", None)


def test_log_reads_take_no_room_so_no_log_reader_waits_for_the_follower() -> None:
    stream, _, reader = reading(most=2, count=5)
    until(lambda: stream.queue.qsize() == 2)
    for number in range(5):
        stream.queue.put(demo.LogRead(f"p-{number}"))  # as LogReader's threads do: never waits
    items = taken(stream)
    assert names(items) == [f"p-{n}" for n in range(5)]
    assert sum(isinstance(item, demo.LogRead) for item in items) == 5
    reader.join(WAIT_SECONDS)


def test_a_log_is_read_once_per_container_and_no_done_read_is_kept(
    monkeypatch: Any, tmp_path: Any
) -> None:
    reads: list[str] = []

    def read_log(kubectl: Any, proxy: Any, namespace: str, name: str, until: Any) -> str:
        reads.append(name)
        return f"log of {name}\n"

    monkeypatch.setattr(demo.MODULES["watch"], "read_log", read_log)  # LogReader's
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        logs = demo.LogReader(demo.Kubectl("kubectl-never-run"), "ns", pool, log_dir=str(tmp_path))
        logs.schedule([("p-1", "c-1"), ("p-2", "c-2"), ("p-1", "c-1")])
    logs.schedule([("p-1", "c-1")])  # done already: not read again
    assert sorted(reads) == ["p-1", "p-2"] and logs._reads == {}
    assert logs.early == {"p-1": ("c-1", "log of p-1\n"), "p-2": ("c-2", "log of p-2\n")}
    assert (tmp_path / "p-1.log").read_text() == "log of p-1\n"


def test_a_deleted_pods_log_that_is_gone_is_no_failure_to_save(
    monkeypatch: Any, tmp_path: Any
) -> None:
    # A straggler the Job's end deleted takes its log with it: its row says how it ended. A log
    # missing for any other reason, or of a pod not deleted, is still a problem to report.
    errors = {
        "deleted-404": demo.KubectlError("GET", 404, 'pods "deleted-404" not found'),
        "deleted-gone": demo.LogGone("the kubelet no longer has the log (unable to ...)"),
        "deleted-forbidden": demo.KubectlError("GET", 403, 'pods "x" is forbidden'),
        "running-404": demo.KubectlError("GET", 404, 'pods "running-404" not found'),
    }

    def read_log(kubectl: Any, proxy: Any, namespace: str, name: str, until: Any) -> str:
        raise errors[name]

    monkeypatch.setattr(demo.MODULES["watch"], "read_log", read_log)  # LogReader's

    def pod(name: str) -> dict:
        metadata: dict = {"name": name}
        if name.startswith("deleted"):
            metadata["deletionTimestamp"] = "2026-12-06T15:00:00Z"
        return {"metadata": metadata, "status": {}}

    problems: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        logs = demo.LogReader(demo.Kubectl("kubectl-never-run"), "ns", pool)
        texts = logs.collect([pod(name) for name in errors], str(tmp_path), None, problems)
    assert texts == dict.fromkeys(sorted(errors), "")
    assert [problem.split(":")[0] for problem in problems] == [
        "deleted-forbidden.log",
        "running-404.log",
    ]
