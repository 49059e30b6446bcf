"""Unit tests of what the tool keeps from its watches so that little is read after a
Job's end: when the pod watch's view is final (a list would show the same pods), the
namespace's events as a reducer of watch changes (records in memory, whole on disk),
the count of events a list of one reports, and the follower settling after the end
fed queue items by hand. No thread, no kubectl, no API."""

from __future__ import annotations

import copy
import errno
import gc
import json
import os
import random
import signal
import threading
import time
import types
import unittest.mock
from pathlib import Path
from typing import Any

import pytest

import all_names as demo

NAMESPACE = "agc-rl-0123456789ab"
FINALIZER = "batch.kubernetes.io/job-tracking"


def job(succeeded: int = 2, failed: int = 0, end: str = "Complete", **status: object) -> dict:
    conditions = [{"type": end, "status": "True"}] if end else []
    return {
        "metadata": {"name": "rollout", "resourceVersion": "90"},
        "status": dict(
            {"succeeded": succeeded, "failed": failed, "conditions": conditions}, **status
        ),
    }


def pod(
    name: str, phase: str = "Succeeded", finalizers: list[str] | None = None, **metadata: object
) -> dict:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": dict(
            {"name": name, "namespace": NAMESPACE, "finalizers": finalizers or []}, **metadata
        ),
        "status": {"phase": phase},
    }


def event(name: str, reason: str = "Scheduled", rv: str = "10", **fields: object) -> dict:
    return dict(
        {
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": f"uid-{name}",
                "resourceVersion": rv,
                "creationTimestamp": "2026-01-01T00:00:01Z",
                "managedFields": [{"big": "x" * 50}],
            },
            "involvedObject": {
                "kind": "Pod",
                "name": name.split(".")[0],
                "uid": "pod-uid",
                "apiVersion": "v1",
                "fieldPath": "spec.containers{episode}",
            },
            "reason": reason,
            "message": f"{reason} it",
            "type": "Normal",
            "count": 1,
            "source": {"component": "kubelet", "host": "node-1"},
            "firstTimestamp": "2026-01-01T00:00:01Z",
            "lastTimestamp": "2026-01-01T00:00:01Z",
            "eventTime": None,
            "reportingComponent": "kubelet",
            "reportingInstance": "node-1",
        },
        **fields,
    )


# --------------------------------------------------------------------------
# When the pod watch's view is final.


def test_ended_and_counted_pods_of_a_complete_job_are_final() -> None:
    assert demo.pods_final(job(2), [pod("a"), pod("b")])
    assert demo.pods_final(job(1, failed=1), [pod("a"), pod("b", "Failed")])


def test_a_pod_not_yet_counted_by_the_job_controller_is_not_final() -> None:
    # The controller removes its finalizer once it has counted the pod: that change is still to come.
    assert not demo.pods_final(job(2), [pod("a"), pod("b", finalizers=[FINALIZER])])
    assert not demo.pods_final(
        job(2, uncountedTerminatedPods={"succeeded": ["uid-b"]}), [pod("a"), pod("b")]
    )


def test_a_running_or_deleted_pod_is_not_final() -> None:
    assert not demo.pods_final(job(2), [pod("a"), pod("b", "Running")])
    assert not demo.pods_final(
        job(2), [pod("a"), pod("b", deletionTimestamp="2026-01-01T00:00:09Z")]
    )


def test_fewer_pods_than_the_job_counted_are_not_final() -> None:
    # The watch never delivered one of them: a list would show it.
    assert not demo.pods_final(job(3), [pod("a"), pod("b")])


def test_only_a_complete_job_has_final_pods() -> None:
    assert not demo.pods_final(job(2, end="Failed"), [pod("a"), pod("b")])
    assert not demo.pods_final(job(2, end=""), [pod("a"), pod("b")])
    assert not demo.pods_final(job(2, active=1), [pod("a"), pod("b")])
    assert not demo.pods_final(None, [pod("a")])


# --------------------------------------------------------------------------
# The events as a reducer of watch changes.


def test_the_event_store_keeps_each_events_newest_version_in_list_order() -> None:
    store = demo.EventStore()
    first = event("p-2.aa", count=1)
    store.apply("ADDED", first)
    store.apply("ADDED", event("p-1.bb", "Pulled"))
    store.apply("MODIFIED", event("p-2.aa", count=3, rv="12"))
    assert len(store) == 2
    assert [json.loads(text)["metadata"]["name"] for text in store.whole()] == ["p-1.bb", "p-2.aa"]
    assert json.loads(list(store.whole(["p-2.aa"]))[0]) == event("p-2.aa", count=3, rv="12")
    assert [e.count for e in store.events()] == [1, 3]


def test_a_deleted_event_is_forgotten_and_a_nameless_one_ignored() -> None:
    store = demo.EventStore()
    store.apply("ADDED", event("p-1.aa"))
    store.apply("ADDED", event("p-2.bb"))
    store.apply("DELETED", event("p-1.aa"))
    store.apply("ADDED", {"kind": "Event", "metadata": {}})
    assert [e.name for e in store.events()] == ["p-2.bb"]
    assert len(list(store.whole())) == 1


def test_an_event_record_keeps_what_its_readers_read_and_nothing_else() -> None:
    whole = [
        event("p-1.18ed0000000000aa", "Scheduled", eventTime="2026-01-01T00:00:01.250000Z"),
        event(
            "p-1.18ed0000000000bb",
            "Pulled",
            message='Container image "x" already present on machine',
        ),
        event("p-1.18ed0000000000cc", "Started"),
        event("p-1.18ed0000000000dd", "BackOff", type="Warning", count=4),
        event(
            "rollout.18ed0000000000ee",
            "SuccessfulCreate",
            message="Created pod: p-1",
            involvedObject={"kind": "Job", "name": "rollout", "uid": "job-uid"},
            source={"component": "job-controller"},
        ),
    ]
    records = demo.event_records(whole)
    assert records[3] == demo.EventRecord(
        "p-1.18ed0000000000dd",
        "2026-01-01T00:00:01Z",
        "Pod",
        "p-1",
        "pod-uid",
        "spec.containers{episode}",
        "BackOff",
        "Warning",
        "BackOff it",
        None,
        "2026-01-01T00:00:01Z",
        4,
        "node-1",
        "kubelet",
        "node-1",
    )
    # What no reader reads (the event's own uid, its revision, managedFields) is not held.
    stripped = copy.deepcopy(whole)
    for each in stripped:
        for key in ("uid", "resourceVersion", "managedFields", "namespace"):
            each["metadata"].pop(key, None)
        each["involvedObject"].pop("apiVersion", None)
    assert demo.event_records(stripped) == records
    assert demo.scheduled_event_times(records) == {
        "p-1": demo.parse_time("2026-01-01T00:00:01.25Z")
    }
    assert demo.pod_creation_events(records) == {"p-1": 0x18ED0000000000EE / 1e9}
    assert demo.warning_summary(records) == {"BackOff": {"count": 4, "objects": ["Pod/p-1"]}}
    owner = {"metadata": {"name": "rollout", "uid": "job-uid"}}
    assert demo.batch_events(records, owner, [], first=False) == [records[4]]


def test_an_events_k8s_io_event_reads_as_its_core_v1_twin() -> None:
    whole = {
        "metadata": {"name": "p-1.aa", "creationTimestamp": "2026-01-01T00:00:01Z"},
        "regarding": {"kind": "Pod", "name": "p-1"},
        "reason": "Failed",
        "note": "it broke",
        "type": "Warning",
    }
    twin = {
        "metadata": whole["metadata"],
        "involvedObject": {"kind": "Pod", "name": "p-1"},
        "reason": "Failed",
        "message": "it broke",
        "type": "Warning",
    }
    record = demo.event_record(whole)
    assert record == demo.event_record(twin)
    assert demo.pod_warnings([record]) == {"p-1": ["Failed: it broke"]}


def test_shared_strings_keep_values_equal_and_share_repeats() -> None:
    shared = demo.SharedStrings()
    first = shared.share(json.loads(json.dumps(pod("a"))))
    second = shared.share(json.loads(json.dumps(pod("b"))))
    assert first == pod("a") and second == pod("b")
    assert first["status"]["phase"] is second["status"]["phase"]
    assert next(iter(first)) is next(iter(second))


def test_equal_parts_of_ended_pods_are_held_once() -> None:
    shared = demo.SharedStrings()
    first, second, third = (
        shared.share(json.loads(json.dumps(dict(pod(name), spec={"nodeName": "n-1"}))))
        for name in ("a", "b", "c")
    )
    assert first == dict(pod("a"), spec={"nodeName": "n-1"})
    # The first holds texts seen for the first time: the next equal parts are held once.
    assert second["spec"] is third["spec"] and second["status"] is third["status"]
    assert second["metadata"] is not third["metadata"]


def test_sharing_never_changes_a_value_or_its_text() -> None:
    shared = demo.SharedStrings()
    values = [
        {"a": True},
        {"a": 1},
        {"a": 1.0},
        {"a": 0.0},
        {"a": -0.0},
        {"a": None},
        {"a": "1"},
        {"a": [1]},
        {"a": [True]},
        {"a": {"b": 1}},
        {"b": 1, "a": 1},
        {"a": 1, "b": 1},
        [1, 2],
        [2, 1],
        {"a": (1, "x")},
    ]
    for value in values * 2:
        assert json.dumps(shared.share(copy.deepcopy(value))) == json.dumps(value)
    assert shared.share({"a": [1]})["a"] is shared.share({"a": [1]})["a"]


def test_a_spool_keeps_the_newest_text_of_each_name_and_leaves_no_file_in_its_directory(
    tmp_path: Path,
) -> None:
    spool = demo.Spool(str(tmp_path))
    for name, text in (("a", "first"), ("b", "é" * 3), ("a", "newest")):
        spool.put(name, text)
    assert spool.get("b") == "é" * 3 and spool.get("a") == "newest"
    spool.put("c", "after a read")
    assert spool.get("c") == "after a read" and spool.get("b") == "é" * 3
    assert list(tmp_path.iterdir()) == []


def test_a_spool_held_in_memory_gives_the_same_texts_with_its_file_closed(
    tmp_path: Path,
) -> None:
    # An earlier round's drafted rows of episodes.csv, kept while later rounds run.
    spool = demo.Spool(str(tmp_path), "episodes.csv")
    for name, text in (("a", "first"), ("b", "é" * 3), ("a", "newest")):
        spool.put(name, text)
    spool.hold_in_memory()
    assert spool._file.closed
    assert spool.get("a") == "newest" and spool.get("b") == "é" * 3 and "b" in spool
    spool.hold_in_memory()  # once is enough
    assert spool.get("a") == "newest"


def test_a_spool_the_disk_refuses_names_the_file_it_feeds_and_writes_over_what_was_cut(
    tmp_path: Path,
) -> None:
    spool = demo.Spool(str(tmp_path), "events.json")
    spool.put("a", "kept")
    real_file, full = spool._file, {"now": True}

    class FullDisk:
        """The spool's file on a disk that fills in the middle of a write."""

        def write(self, data: bytes) -> int:
            if full["now"]:
                real_file.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_file.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(real_file, name)

    spool._file = FullDisk()
    with pytest.raises(demo.DemoError) as refused:
        spool.put("b", "cut in the middle")
    assert str(refused.value) == (
        f"cannot write {tmp_path / 'events.json'}: {os.strerror(errno.ENOSPC)}"
    )
    assert "b" not in spool and spool.get("a") == "kept"
    full["now"] = False
    spool.put("c", "after the disk had room again")
    assert spool.get("c") == "after the disk had room again" and spool.get("a") == "kept"


def test_shared_strings_forget_everything_when_the_table_grows_large() -> None:
    shared = demo.SharedStrings(most=3)
    for number in range(10):
        assert shared.share({"name": f"pod-{number}"}) == {"name": f"pod-{number}"}
    assert len(shared.table) <= 4


def test_the_total_of_a_list_is_its_items_and_the_remaining_count() -> None:
    assert (
        demo.list_total({"metadata": {"continue": "t", "remainingItemCount": 41}, "items": [{}]})
        == 42
    )
    assert demo.list_total({"metadata": {}, "items": [{}]}) == 1
    assert demo.list_total({"metadata": {}, "items": []}) == 0
    # More follow but the API does not say how many (as with a selector): unknown.
    assert demo.list_total({"metadata": {"continue": "t"}, "items": [{}]}) is None


def test_long_encoded_items_are_written_as_given_one_per_line() -> None:
    items = [{"n": number} for number in range(demo.ONE_LINE_ITEMS_FROM)]
    encoded = demo.EncodedItems(lambda: (json.dumps(item) for item in items), len(items))
    assert "".join(demo.json_pieces({"items": encoded})) == "".join(
        demo.json_pieces({"items": items})
    )
    few = demo.EncodedItems(lambda: (json.dumps(item) for item in items[:2]), 2)
    assert (
        "".join(demo.json_pieces({"items": few}))
        == "".join(demo.json_pieces({"items": items[:2]}))
        == json.dumps({"items": items[:2]}, indent=2)
    )


# --------------------------------------------------------------------------
# The follower after the end, fed by hand.


class Watch:
    """Stands for a running watch process: the follower only asks whether it runs."""

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def follower_at_the_end(pods: list[dict], succeeded: int) -> demo.BatchFollower:
    follower = demo.BatchFollower(
        demo.Kubectl("kubectl-never-run"),
        NAMESPACE,
        "rollout",
        succeeded,
        demo.Progress(quiet=True),
        pool=None,
    )  # type: ignore[arg-type]
    follower.watches.failures = {"job": 0, "pods": 0, "events": 0}
    follower.watches.processes = {"pods": Watch(), "events": Watch()}  # type: ignore[dict-item]
    for item in pods:
        follower.take(demo.WatchEvent("pods", {"type": "ADDED", "object": item}, 99.0), 0.0)
    follower.take(demo.WatchEvent("job", {"type": "MODIFIED", "object": job(succeeded)}, 99.5), 0.0)
    return follower


def test_the_follower_settles_once_each_pods_last_change_and_every_event_arrived() -> None:
    follower = follower_at_the_end([pod("a"), pod("b", finalizers=[FINALIZER])], 2)
    follower.watches.queue.put(
        demo.WatchEvent("events", {"type": "ADDED", "object": event("a.1")}, 100.0)
    )
    follower.watches.queue.put(
        demo.WatchEvent("pods", {"type": "MODIFIED", "object": pod("b")}, 100.1)
    )
    follower.watches.queue.put(
        demo.WatchEvent("events", {"type": "ADDED", "object": event("b.1")}, 100.2)
    )
    assert not demo.watches_settled(follower, 2)
    demo.settle_watches(follower, 2, seconds=5)
    assert demo.watches_settled(follower, 2) and demo.watched_pods_final(follower)
    assert demo.events_caught_up(follower, 2)
    assert sorted(follower.state.pods) == ["a", "b"] and len(follower.state.events) == 2


def test_the_pods_and_logs_are_saved_while_the_events_are_counted_and_the_events_then_awaited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    follower = follower_at_the_end([pod("a"), pod("b")], 2)
    pods_json = tmp_path / "pods.json"

    def count_events(*_: object) -> tuple[int, str]:
        # An API server busy with the Job's end: it answers once pods.json is written, and two
        # events arrive on the watch only then.
        deadline = time.monotonic() + 10
        while not pods_json.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pods_json.exists(), "pods.json waited for the count"
        for name in ("a.1", "b.1"):
            follower.watches.queue.put(
                demo.WatchEvent("events", {"type": "ADDED", "object": event(name)}, 100.0)
            )
        return 2, "95"

    monkeypatch.setattr(demo.MODULES["follow"], "count_events", count_events)  # BatchFollower's
    monkeypatch.setattr(
        follower.log_reader, "collect", lambda pods, *_: {demo.pod_name(p): "" for p in pods}
    )
    run = types.SimpleNamespace(
        kubectl=follower.kubectl,
        namespace=NAMESPACE,
        settings=types.SimpleNamespace(batches=[types.SimpleNamespace(job="rollout")]),
        spelling=None,
        silent=True,
    )
    evidence = demo.BatchEvidence(run, follower, str(tmp_path)).collect("rollout")  # type: ignore[arg-type]
    # The event watch went on after the pods were saved: the events are the ones it followed.
    assert [event.name for event in evidence.events] == ["a.1", "b.1"]
    assert follower.state.events.resource_version == "95"
    saved = json.loads(pods_json.read_text())
    assert [item["metadata"]["name"] for item in saved["items"]] == ["a", "b"]
    assert evidence.reading.source == "final watch" and sorted(evidence.logs) == ["a", "b"]
    assert len(json.loads((tmp_path / "events.json").read_text())["items"]) == 2


def test_after_the_pods_only_the_events_are_awaited() -> None:
    follower = follower_at_the_end([pod("a"), pod("b", "Running")], 2)  # b never ends
    for name in ("a.1", "b.1"):
        follower.watches.queue.put(
            demo.WatchEvent("events", {"type": "ADDED", "object": event(name)}, 100.0)
        )
    # Done once both events arrived: waiting for pod b would last the hour.
    settling = threading.Thread(
        target=demo.settle_watches, args=(follower, 2, 3600.0), kwargs={"pods": False}, daemon=True
    )
    settling.start()
    settling.join(timeout=30)
    assert not settling.is_alive() and demo.events_caught_up(follower, 2)


def test_what_a_stopped_pod_watch_delivered_is_left_untaken_the_events_taken() -> None:
    follower = follower_at_the_end([pod("a"), pod("b", "Running")], 2)
    follower.stop_watches(keep=("events",))  # pods.json is written from what it saw by then
    for item in (
        demo.WatchEvent("pods", {"type": "MODIFIED", "object": pod("b")}, 100.0),
        demo.WatchEvent("events", {"type": "ADDED", "object": event("a.1")}, 100.1),
        demo.WatchEvent("events", {"type": "ADDED", "object": event("b.1")}, 100.2),
    ):
        follower.watches.queue.put(item)
    demo.settle_watches(follower, 2, seconds=5, pods=False)
    assert demo.events_caught_up(follower, 2)
    assert follower.state.pods["b"]["status"]["phase"] == "Running"


def test_the_follower_stops_waiting_at_its_deadline_when_a_pod_never_ends() -> None:
    follower = follower_at_the_end([pod("a"), pod("b", "Running", finalizers=[FINALIZER])], 2)
    demo.settle_watches(follower, None, seconds=0.2)
    assert not demo.watched_pods_final(follower)


def test_events_not_watched_are_not_waited_for() -> None:
    follower = follower_at_the_end([pod("a")], 1)
    follower.watching.events_watched = False
    assert demo.watches_settled(follower, 5) and not demo.events_caught_up(follower, 5)


def test_a_pod_deleted_under_the_watch_is_never_final() -> None:
    follower = follower_at_the_end([pod("a"), pod("b")], 2)
    follower.take(demo.WatchEvent("pods", {"type": "DELETED", "object": pod("b")}, 100.0), 0.0)
    assert not demo.watched_pods_final(follower) and demo.watches_settled(follower, None)


def test_an_event_watch_that_keeps_breaking_is_given_up_saying_how_often_it_broke(capsys) -> None:
    follower = demo.BatchFollower(
        demo.Kubectl("kubectl-never-run"),
        NAMESPACE,
        "rollout",
        1,
        demo.Progress(quiet=True),
        pool=None,
    )  # type: ignore[arg-type]
    follower.watches.failures = {"job": 0, "pods": 0, "events": 0}
    follower.watches.processes = {"events": Watch()}  # type: ignore[dict-item]
    restarted = []

    def restart(kind: str, client_deadline: float) -> None:  # at once, and no process
        restarted.append(kind)
        follower.watches.processes[kind] = Watch()  # type: ignore[assignment]

    follower.watches.restart = restart  # type: ignore[method-assign]
    breaks = demo.WATCH_RESTARTS_BEFORE_POLLING + 1  # the first break, then each restart's
    for _ in range(breaks):
        follower.take(demo.WatchEnded("events", None), 0.0)
    assert restarted == ["events"] * demo.WATCH_RESTARTS_BEFORE_POLLING
    assert not follower.watching.events_watched and "events" not in follower.watches
    assert f"(it broke {breaks} times in a row)" in capsys.readouterr().err


# --------------------------------------------------------------------------
# The state alone: a reducer of watch changes, no follower around it.


def test_the_state_reports_each_ended_container_and_the_jobs_end_once() -> None:
    state = demo.BatchState()
    running = pod("a", "Running")
    assert state.apply("pods", "ADDED", running, 100.0) == demo.StateChange("pods", "a")
    ended = pod("a")
    ended["status"]["containerStatuses"] = [
        {"name": "episode", "state": {"terminated": {"containerID": "c-1"}}}
    ]
    assert state.apply("pods", "MODIFIED", ended, 101.0) == demo.StateChange(
        "pods", "a", (("a", "c-1"),)
    )
    assert (
        state.apply("job", "MODIFIED", job(1, end=""), 101.5) == demo.StateChange("job")
        and state.end is None
    )
    assert state.apply("job", "MODIFIED", job(1), 102.0) == demo.StateChange("job", job_ended=True)
    assert state.end == "Complete" and state.end_resource_version == "90"
    assert not state.apply("job", "MODIFIED", job(1), 103.0).job_ended  # the end is told once
    assert state.pods_are_final() and state.observations()["pods"]["a"]
    assert state.apply("events", "ADDED", event("a.1"), 102.5) == demo.StateChange("events")
    assert len(state.events) == 1


def test_a_pods_name_is_one_object_in_its_versions_its_events_and_every_table_of_it() -> None:
    """The follower's one table of shared texts: each decoded version and event brings its own
    copy of the pod's name, and every table keyed by the pod keeps the one object."""
    drafts = demo.EpisodeDrafts(builtin=True)
    state = demo.BatchState(shared=drafts.shared)

    def decoded(value: dict) -> dict:  # as a watch delivers it: every text its own object
        return json.loads(json.dumps(value))

    running = state.apply("pods", "ADDED", decoded(pod("a-1", "Running")), 100.0)
    state.apply("events", "ADDED", decoded(event("a-1.18ed0000000000aa")), 100.5)
    state.apply("pods", "MODIFIED", decoded(pod("a-1")), 101.0)  # ended and counted: final
    [record] = state.events.records.values()
    assert running.pod is not None
    [key] = state.pods
    assert key is running.pod is next(iter(state.observed)) is record.object_name
    assert state.pods[key]["metadata"]["name"] is key


def test_the_state_keeps_a_deleted_pod_as_last_seen_and_then_is_never_final() -> None:
    state = demo.BatchState()
    state.apply("pods", "ADDED", pod("a"), 100.0)
    assert state.apply("pods", "DELETED", pod("a", "Running"), 101.0) == demo.StateChange(
        "pods", "a"
    )
    state.apply("job", "MODIFIED", job(1), 102.0)
    assert state.pods["a"]["status"]["phase"] == "Succeeded" and state.deleted == {"a"}
    assert not state.pods_are_final()


def test_a_final_pod_is_encoded_while_waiting_and_that_text_used_only_for_its_version() -> None:
    state = demo.BatchState()
    final = pod("a", resourceVersion="7")
    state.apply("pods", "MODIFIED", final, 100.0)
    held = state.pods["a"]
    # After the wait nothing is encoded again: the text is the one made as the pod arrived.
    with unittest.mock.patch.object(
        demo.json, "dumps", side_effect=AssertionError("encoded after the wait")
    ):
        text = state.pod_text(held)
    assert json.loads(text) == final
    # A later version of the pod (or another object) is encoded anew.
    newer = pod("a", resourceVersion="8", labels={"x": "y"})
    state.apply("pods", "MODIFIED", newer, 101.0)
    assert json.loads(state.pod_text(state.pods["a"])) == newer
    assert json.loads(state.pod_text(final)) == final


def test_a_small_batchs_pods_are_indented_as_they_end_and_pods_json_is_the_plain_lists_text(
    tmp_path,
) -> None:
    state = demo.BatchState(indented_pods=True)
    for name, version in (("a", "7"), ("b", "8")):
        state.apply("pods", "MODIFIED", pod(name, resourceVersion=version), 100.0)
    held = [state.pods["a"], state.pods["b"]]
    with unittest.mock.patch.object(
        demo.MODULES["follow"], "pod_json", side_effect=AssertionError("encoded after the wait")
    ):
        texts = [state.pod_text(item, indented=True) for item in held]
    demo.write_json(
        str(tmp_path / "encoded.json"),
        dict(
            demo.list_manifest([]),
            items=demo.EncodedItems(lambda: iter(texts), len(texts), indented=True),
        ),
    )
    demo.write_json(str(tmp_path / "plain.json"), dict(demo.list_manifest([]), items=held))
    assert (tmp_path / "encoded.json").read_bytes() == (tmp_path / "plain.json").read_bytes()
    # The compact form, asked of a state that holds the indented one, is made anew.
    assert json.loads(state.pod_text(held[0], indented=False)) == held[0]


def test_a_spool_gives_back_the_newest_text_of_each_name_between_writes() -> None:
    spool = demo.Spool()
    spool.put("a", "first ✓")
    spool.put("b", "other")
    assert spool.get("a") == "first ✓" and spool.get_bytes("a") == "first ✓".encode("utf-8")
    spool.put("a", "second")
    assert spool.get("a") == "second" and spool.get("b") == "other" and "a" in spool
    spool.forget("a")
    assert "a" not in spool


def test_the_status_line_counts_the_jobs_pods_and_says_when_it_polls() -> None:
    running = {"spec": {}, "status": {"active": 3, "ready": 2, "succeeded": 1}}
    assert demo.status_line("rollout", 4, running, 12.34, polling=False) == (
        "rollout:   12.3s  active 3  ready 2  succeeded 1/4  failed 0"
    )
    assert demo.status_line("rollout", 4, None, 0.0, polling=True) == (
        "rollout:    0.0s  active 0  ready 0  succeeded 0/4  failed 0  (polling)"
    )


# --------------------------------------------------------------------------
# An interrupt while a watch starts.


class Child:
    """Stands for a started kubectl: told whether it was killed."""

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    def wait(self) -> int:
        return 0


def test_an_interrupt_while_a_watch_starts_is_raised_once_its_process_and_reader_have_started() -> (
    None
):
    interrupts = demo.InterruptsAcrossForks()
    done = []
    child = Child()
    with pytest.raises(KeyboardInterrupt):
        with interrupts.holding():
            interrupts.handle(
                signal.SIGINT, None
            )  # held: raising here could land inside Thread.start
            started = interrupts.start(lambda: child)  # type: ignore[arg-type,return-value]
            done.append(started)
    # The child started inside is the holder's to stop (the watch's stop does), not killed here.
    assert done == [child] and not child.killed and not interrupts.starting


def test_an_interrupt_while_a_child_starts_alone_kills_it_and_is_raised() -> None:
    interrupts = demo.InterruptsAcrossForks()
    child = Child()

    def starter() -> Child:
        interrupts.handle(signal.SIGTERM, None)
        return child

    with pytest.raises(KeyboardInterrupt):
        interrupts.start(starter)  # type: ignore[arg-type]
    assert child.killed
    with interrupts.holding():  # nothing held: the block ends quietly
        pass


@pytest.mark.parametrize("seed", range(20))
def test_the_state_knows_its_pods_final_as_pods_final_reads_them_all(seed: int) -> None:
    """What BatchState notes of each pod as it changes gives, after every change, what
    pods_final says of the Job and every pod held."""
    chooser = random.Random(seed)
    state = demo.BatchState()
    versions = [
        lambda name: pod(name, "Running", finalizers=[FINALIZER]),
        lambda name: pod(name, "Succeeded", finalizers=[FINALIZER]),
        lambda name: pod(name, "Succeeded"),
        lambda name: pod(name, "Failed"),
        lambda name: pod(name, "Succeeded", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    for step in range(40):
        name = chooser.choice("abcd")
        if chooser.random() < 0.15:
            state.apply("job", "MODIFIED", job(chooser.randint(1, 4)), float(step))
        else:
            change = "DELETED" if chooser.random() < 0.03 else "MODIFIED"
            state.apply("pods", change, chooser.choice(versions)(name), float(step))
        expected = state.end == "Complete" and not state.deleted
        expected = expected and demo.pods_final(state.job, state.pods.values())
        assert state.pods_are_final() == expected
    # And once every pod held ends and the Job counts them all, both say final.
    for name in list(state.pods):
        state.apply("pods", "MODIFIED", pod(name), 50.0)
    state.apply("job", "MODIFIED", job(len(state.pods)), 51.0)
    assert state.pods_are_final() == (not state.deleted)
    assert demo.pods_final(state.job, state.pods.values())


@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 6, 7, 99, 100, 101, 301])
@pytest.mark.parametrize("indented", [False, True])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_encoded_items_joined_a_few_at_a_time_are_the_lists_text(
    count: int, indented: bool, as_bytes: bool, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    for module in ("files", "parse"):  # every edge of a piece, many times
        monkeypatch.setattr(demo.MODULES[module], "ENCODED_ITEMS_A_PIECE", 3)
    items = [{"n": number, "s": ["a", number, "✓"]} for number in range(count)]

    def text(item: dict) -> str:
        return "".join(demo.json_pieces(item, 2)) if indented else json.dumps(item)

    def given(item: dict) -> str | bytes:  # as the spools give them: UTF-8
        return text(item).encode("utf-8") if as_bytes else text(item)

    encoded = demo.EncodedItems(lambda: (given(item) for item in items), count, indented)
    expected = (
        "".join(demo.json_pieces({"items": items}))
        if indented or count >= demo.ONE_LINE_ITEMS_FROM or not count
        else json.dumps({"items": items}, indent=2)
    )
    if indented and count:  # a short list of pods is indented as a long list of them would be
        expected = '{\n  "items": [\n    ' + ",\n    ".join(map(text, items)) + "\n  ]\n}"
    # Written as a file, bytes among the str pieces: the very text, byte for byte.
    demo.write_json(str(tmp_path / "items.json"), {"items": encoded})
    assert (tmp_path / "items.json").read_bytes() == (expected + "\n").encode("utf-8")
    if not as_bytes:
        assert "".join(demo.json_pieces({"items": encoded})) == expected


# --------------------------------------------------------------------------
# What a followed batch holds, out of the cycle collector's sight until the batch is done.


def a_follower(spare_held: bool = True) -> demo.BatchFollower:
    return demo.BatchFollower(
        demo.Kubectl("kubectl-never-run"),
        NAMESPACE,
        "rollout",
        1,
        demo.Progress(quiet=True),
        pool=None,  # type: ignore[arg-type]
        spare_held=spare_held,
    )


def test_what_a_followed_batch_holds_is_spared_the_cycle_collector_until_the_batch_is_done() -> (
    None
):
    # Lists, which the collector always tracks (a dict of numbers it does not). A frozen object
    # that dies leaves the count, so the counts are compared with a margin of half a batch.
    assert gc.get_freeze_count() == 0
    with demo.held_objects_spared(True):
        follower = a_follower()
        held = [[number] for number in range(1000)]
        follower.spare_held()
        frozen = gc.get_freeze_count()
        assert frozen >= len(held)  # held, and whatever else lives now
        more = [[number] for number in range(1000)]
        follower.spare_held()  # again at once: not before SPARE_HELD_SECONDS
        assert gc.get_freeze_count() < frozen + len(more) // 2
        follower._spared_at -= demo.SPARE_HELD_SECONDS  # a second later
        follower.spare_held()
        assert gc.get_freeze_count() >= frozen + len(more) // 2
    assert gc.get_freeze_count() == 0


def test_a_python_callers_process_is_left_to_its_own_cycle_collector() -> None:
    # run_batch() and stream_batch() share the caller's process: a freeze would hide the
    # caller's garbage too, and the unfreeze at the batch's end would undo the caller's own.
    assert gc.get_freeze_count() == 0
    with demo.held_objects_spared(False):
        follower = a_follower(spare_held=False)
        follower.spare_held()
        assert gc.get_freeze_count() == 0
        gc.freeze()  # the caller's, made while the batch runs
    try:
        assert gc.get_freeze_count() > 0  # not undone
    finally:
        gc.unfreeze()


def test_a_process_that_froze_objects_of_its_own_keeps_them_frozen_and_its_follower_freezes_none() -> (
    None
):
    gc.freeze()  # a Python caller's own, before it forks
    try:
        # A frozen object freed meanwhile leaves the count (anything this process drops may be
        # one): a freeze would raise it by every object made since, an unfreeze take it to 0.
        frozen = gc.get_freeze_count()
        with demo.held_objects_spared(True):
            follower = a_follower()
            follower.spare_held()
            assert 0 < gc.get_freeze_count() <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
