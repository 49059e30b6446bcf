"""Summarising while waiting: episodes drafted as their pods end, in any order and from whatever
evidence had arrived by then, give exactly the summary made from the final evidence alone.

The batch is a recorded run (tests/recorded/clock-corrected-16: 16 episodes at parallelism 4 on
the emulator's lightweight kubelet, node emu-node-2's clock 0.8 s ahead), so the final pass meets
all three cases: drafts taken whole (nodes whose clocks agree), drafts whose creation point alone
is made again (pods created into a slot an earlier pod's end freed), and drafts made again whole
(the corrected node's episodes).
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import unittest.mock
from pathlib import Path
from typing import Any

import pytest

import all_names as demo

RECORDED = Path(__file__).resolve().parent.parent / "recorded" / "clock-corrected-16"
CORRECTED_NODE = "emu-node-2"


def recorded_batch() -> dict[str, Any]:
    """The recorded run's evidence, as the summary after the end reads it."""
    pods = json.loads((RECORDED / "pods.json").read_text())["items"]
    return {
        "job": json.loads((RECORDED / "job.json").read_text()),
        "pods": pods,
        "events": demo.event_records(json.loads((RECORDED / "events.json").read_text())["items"]),
        "logs": {
            demo.pod_name(pod): (RECORDED / f"{demo.pod_name(pod)}.log").read_text() for pod in pods
        },
        "observed": json.loads((RECORDED / "observed.json").read_text()),
        "observed_at": json.loads((RECORDED / "client.json").read_text())["observed_at"],
    }


def summary_of(
    batch: dict[str, Any], drafts: demo.EpisodeDrafts | None = None
) -> demo.BatchSummary:
    return demo.summarise_batch(
        batch["job"],
        batch["pods"],
        batch["logs"],
        batch["events"],
        len(batch["pods"]),
        True,
        batch["observed_at"],
        batch["observed"],
        drafts=None if drafts is None else drafts.drafts,
    )


def saved_form(summary: demo.BatchSummary) -> str:
    """Everything a summary hands on (results.json, the CSV, the pictures), as text to compare."""
    return json.dumps(
        [summary.figures, summary.episodes, summary.failed, summary.job_created, summary.origin],
        sort_keys=True,
    )


def on_node(batch: dict[str, Any], node: str) -> set[str]:
    return {demo.pod_name(pod) for pod in batch["pods"] if pod["spec"].get("nodeName") == node}


def drafted(batch: dict[str, Any], as_seen: bool = False) -> demo.EpisodeDrafts:
    """The batch's episodes drafted from the final evidence: in the pods' order, or (`as_seen`)
    each pod told as it was created and each episode drafted as its reward came."""
    drafts = demo.EpisodeDrafts(builtin=True)
    for event in batch["events"]:
        drafts.index.add(event)
    pods = batch["pods"]
    if as_seen:
        for pod in sorted(pods, key=lambda pod: pod["metadata"]["creationTimestamp"]):
            drafts.saw(pod, batch["job"], batch["observed"]["pods"].get(demo.pod_name(pod)))
        pods = sorted(pods, key=lambda pod: reward_at(batch["logs"][demo.pod_name(pod)]))
    for pod in pods:
        name = demo.pod_name(pod)
        drafts.draft(
            pod,
            batch["logs"][name],
            batch["job"],
            batch["observed"]["job"],
            batch["observed"]["pods"].get(name),
        )
    return drafts


def reward_at(log_text: str) -> float:
    events = demo.parse_events(log_text.splitlines())
    return next(event["at"] for event in events if event["event"] == "reward")


def test_the_recorded_batch_has_a_corrected_clock_and_pods_created_into_freed_slots() -> None:
    """What the tests below rely on: without it they would not reach each case of the final pass."""
    batch = recorded_batch()
    summary = summary_of(batch)
    assert summary.figures["clocks"]["nodes"][CORRECTED_NODE]["offset_seconds"] != 0
    assert all(
        entry["offset_seconds"] == 0
        for node, entry in summary.figures["clocks"]["nodes"].items()
        if node != CORRECTED_NODE
    )
    assert 0 < len(on_node(batch, CORRECTED_NODE)) < len(batch["pods"])
    # Pods on the other nodes created into a slot an earlier pod's end freed, a bound no draft knew.
    assert slotted_pods(batch) - on_node(batch, CORRECTED_NODE)


def slotted_pods(batch: dict[str, Any]) -> set[str]:
    """The pods whose creation the final pass bounds by an earlier pod's end."""
    found: list[dict[str, float]] = []

    def recording(*args: Any, **kwargs: Any) -> dict[str, float]:
        found.append(real(*args, **kwargs))
        return found[-1]

    real = demo.slots_freed
    with unittest.mock.patch.object(demo.MODULES["summary"], "slots_freed", side_effect=recording):
        summary_of(batch)
    return set(found[0])


def test_drafts_made_from_the_final_evidence_are_taken_except_where_the_final_clocks_differ() -> (
    None
):
    batch = recorded_batch()
    summary = summary_of(batch, drafted(batch))
    assert saved_form(summary) == saved_form(summary_of(batch))
    assert demo.episodes_csv([("b", summary)]) == demo.episodes_csv([("b", summary_of(batch))])
    # Their rows of episodes.csv are taken as made where nothing they were made from changed.
    names = {demo.pod_name(pod) for pod in batch["pods"]}
    whole = names - on_node(batch, CORRECTED_NODE) - slotted_pods(batch)
    assert whole and set(summary.csv_rows) == whole
    # Each episode on a node whose clock agrees is taken from its draft (those created into a freed
    # slot with their creation made again); the corrected node's are made again whole.
    assert summary.drafts_taken == len(batch["pods"]) - len(on_node(batch, CORRECTED_NODE))


def test_drafts_told_each_pod_as_it_was_seen_take_the_slot_it_was_created_into_too() -> None:
    batch = recorded_batch()
    drafts = drafted(batch, as_seen=True)
    # Each pod created into a freed slot was drafted with that slot's bound, as the ends known then
    # said it: here the final pass corrects emu-node-2's clock, which moves the ends of its pods
    # and so every later bound, and it makes them again.
    assert {
        name
        for name, draft in drafts.drafts.items()
        if draft.inputs.created_after is not None
        and draft.inputs.created_after.source == "an earlier pod's end freeing its slot"
    } == slotted_pods(batch)
    summary = summary_of(batch, drafts)
    assert saved_form(summary) == saved_form(summary_of(batch))
    assert demo.episodes_csv([("b", summary)]) == demo.episodes_csv([("b", summary_of(batch))])


@pytest.mark.parametrize("seed", range(60))
def test_the_slot_sweep_finds_at_each_pods_end_what_the_final_pass_finds(seed: int) -> None:
    """A Job that creates a pod a moment after each end frees a slot, its pods seen by a lagging
    watch and drafted a moment after their ends, in whatever order they end."""
    rng = random.Random(seed)
    parallelism = rng.randint(1, 6)
    count = rng.randint(parallelism + 1, 50)
    job_earliest = 1000.0 + rng.random()
    created: dict[str, float] = {}
    rewards: dict[str, float] = {}
    timeline: list[tuple[float, str, str]] = []
    slots = [job_earliest + rng.uniform(0.0, 0.3) for _ in range(parallelism)]
    for number in range(count):
        slots.sort()
        name = f"pod-{number}"
        created[name] = slots.pop(0) + rng.uniform(0.001, 0.3)
        rewards[name] = created[name] + rng.uniform(0.8, 3.0)
        ended = rewards[name] + rng.uniform(0.0, 0.2)
        slots.append(ended)
        timeline.append((created[name] + rng.uniform(0.0, 1.0), "seen", name))
        timeline.append((ended + rng.uniform(0.0, 0.5), "drafted", name))
    within = {}
    for name, moment in created.items():
        stamp = float(int(moment))
        seen = next(at for at, what, pod in timeline if what == "seen" and pod == name)
        within[name] = (max(stamp, job_earliest), min(stamp + 1.0, seen))
    final = demo.slot_freed_after(within, rewards, parallelism)
    sweep = demo.SlotSweep(parallelism)
    found = {}
    for _, what, name in sorted(timeline):
        if what == "seen":
            sweep.created(name, within[name][1])
        else:
            found[name] = sweep.slot_bound(within[name][0])
            sweep.ended(name, rewards[name])
    assert {name: at for name, at in found.items() if at is not None} == final


@pytest.mark.parametrize("seed", range(40))
def test_the_slot_sweep_told_every_pod_and_end_answers_in_any_order_as_the_final_pass(
    seed: int,
) -> None:
    rng = random.Random(seed)
    parallelism = rng.randint(1, 4)
    within, ends = {}, {}
    for number in range(rng.randint(parallelism + 1, 30)):
        earliest = float(rng.randint(0, 8))
        within[f"pod-{number}"] = (earliest, earliest + rng.choice([0.3, 0.6, 1.0]))
        ends[f"pod-{number}"] = rng.uniform(0.0, 10.0)  # in any order: nothing here is a Job's
    # Some pods failed (no episode: the summary does not count them), some were asked to be
    # deleted (their slot freed at a moment not known: no later pod is bounded).
    failed = set(rng.sample(list(within), rng.randint(0, 2)))
    deleted = set(rng.sample(sorted(set(within) - failed), rng.randint(0, 1)))
    episodes = {name: window for name, window in within.items() if name not in failed}
    final = demo.slot_freed_after(
        episodes, {name: end for name, end in ends.items() if name not in deleted}, parallelism
    )
    sweep = demo.SlotSweep(parallelism)
    names = list(within)
    for name in rng.sample(names, len(names)):
        sweep.created(name, within[name][1])
        if name in deleted:
            sweep.end_unknown(name)
        if name not in deleted or rng.random() < 0.5:  # drafted before it was deleted
            sweep.ended(name, ends[name])
    asked = rng.sample(names, len(names))
    found = {name: sweep.slot_bound(within[name][0]) for name in asked[: len(names) // 2]}
    for name in failed:  # a failure may be known after pods were asked about
        sweep.forget(name)
    found.update({name: sweep.slot_bound(within[name][0]) for name in asked})
    assert {
        name: at for name, at in found.items() if at is not None and name not in failed
    } == final


def test_a_pod_seen_after_a_later_one_was_asked_about_is_counted_as_created_before_it() -> None:
    # One slot. The ends are not a Job's (one before its own pod's creation): what matters is
    # which pods are counted.
    sweep = demo.SlotSweep(1)
    sweep.created("a", 0.5)
    sweep.ended("a", 1.4)
    assert sweep.slot_bound(2.0) == 1.4  # a pod of second 2 came after "a" had ended
    sweep.created("b", 1.5)  # seen late: created before second 2, counted at once
    sweep.ended("b", 1.2)
    assert sweep.slot_bound(2.0) == 1.4  # after "a" and "b": the later of their ends
    assert sweep.slot_bound(1.0) == 1.4  # "b" itself, after "a" alone: b's own end left out
    assert demo.slot_freed_after(
        {"a": (0.0, 0.5), "b": (1.0, 1.5), "c": (2.0, 2.5)}, {"a": 1.4, "b": 1.2}, 1
    ) == {"b": 1.4, "c": 1.4}
    # A pod that failed before it was counted is never counted: no episode stands for it.
    sweep.created("failed", 2.5)
    sweep.forget("failed")
    sweep.created("d", 2.6)
    sweep.ended("d", 2.9)
    assert sweep.slot_bound(3.0) == 2.9  # after a, b and d; not after a fourth


def test_drafts_with_their_slots_are_taken_whole_where_the_clocks_agree() -> None:
    """The recorded batch with its clocks taken as agreeing (in the final pass too): every
    episode, those created into a freed slot included, is taken from its draft, row and all."""
    batch = recorded_batch()
    real = demo.clock_offsets

    def agreeing(*args: Any, **kwargs: Any) -> dict:
        clocks = real(*args, **kwargs)
        for entry in [clocks["client"], *clocks["nodes"].values()]:
            if entry:
                entry.update(offset_seconds=0.0, correction_slack_seconds=0.0)
        return clocks

    with unittest.mock.patch.object(demo.MODULES["summary"], "clock_offsets", side_effect=agreeing):
        summary = summary_of(batch, drafted(batch, as_seen=True))
        assert saved_form(summary) == saved_form(summary_of(batch))
        slotted = slotted_pods(batch)
    assert slotted and set(summary.csv_rows) == {demo.pod_name(pod) for pod in batch["pods"]}


@pytest.mark.parametrize("seed", range(20))
def test_nth_smallest_less_some_values_is_what_removing_them_leaves(seed: int) -> None:
    rng = random.Random(seed)
    values = sorted(rng.choice([1.0, 2.0, 2.5, 3.0, 4.0, 7.0]) for _ in range(rng.randint(0, 12)))
    removed = sorted(rng.sample(values, rng.randint(0, len(values))))
    left = list(values)
    for value in removed:
        left.remove(value)
    for n in range(-1, len(values) + 1):
        assert demo.nth_smallest(values, removed, n) == (left[n] if 0 <= n < len(left) else None)


def test_a_draft_whose_creation_bound_alone_changed_makes_that_point_alone_again() -> None:
    batch = recorded_batch()
    pod = next(
        pod for pod in batch["pods"] if demo.pod_name(pod) not in on_node(batch, CORRECTED_NODE)
    )
    name = demo.pod_name(pod)
    drafts = demo.EpisodeDrafts(builtin=True)
    drafts.draft(
        pod,
        batch["logs"][name],
        batch["job"],
        batch["observed"]["job"],
        batch["observed"]["pods"][name],
    )
    draft = drafts.drafts[name]
    created = draft.points["pod_created"]
    later = demo.Bound(
        created.at + 0.02, None, "an earlier pod's end freeing its slot", demo.REFERENCE_CLOCK
    )
    points, phases = draft.points_for(pod, draft.ready, draft.inputs._replace(created_after=later))
    expected = demo.episode_points(
        pod, draft.ready, draft.reward, *draft.inputs._replace(created_after=later)
    )
    assert points == expected and points["pod_created"] != created
    assert phases == demo.phase_durations(expected)
    assert {point for point in points if points[point] != draft.points[point]} == {"pod_created"}
    # Any other input changed: nothing is taken.
    assert draft.points_for(pod, draft.ready, draft.inputs._replace(scheduled_at=1.0)) is None
    assert draft.points_for(pod, dict(draft.ready), draft.inputs) is None


def partial_observation(observed: dict | None, rng: random.Random) -> dict | None:
    """What the watch may have seen of a pod when its episode was drafted: a transition, or the
    sandbox stamp, not yet arrived."""
    if observed is None or rng.random() < 0.6:
        return observed
    partial = copy.deepcopy(observed)
    seen = partial.get("seen") or {}
    if seen and rng.random() < 0.7:
        seen.pop(rng.choice(sorted(seen)))
    else:
        partial.pop("sandbox_ready", None)
    return partial


def event_pod(event: demo.EventRecord) -> str | None:
    """The pod an event speaks of: its object, or the pod a Job's SuccessfulCreate names."""
    message = event.message or ""
    if event.kind == "Job" and message.startswith("Created pod: "):
        return message[len("Created pod: ") :].strip()
    return event.object_name if event.kind == "Pod" else None


@pytest.mark.parametrize("seed", range(25))
def test_drafts_in_any_order_of_pod_endings_give_exactly_the_batch_summary(seed: int) -> None:
    """Pods end in a random order; each one's events mostly arrive before it ends, some late (the
    event watch runs behind), in an order of their own; its watch view is sometimes missing a
    transition, its pod a version behind; some are drafted again by a later change."""
    batch = recorded_batch()
    rng = random.Random(seed)
    pods = list(batch["pods"])
    rng.shuffle(pods)
    pending = list(batch["events"])
    rng.shuffle(pending)
    drafts = demo.EpisodeDrafts(builtin=True)

    def deliver(wanted: Any) -> None:
        for event in [event for event in pending if wanted(event)]:
            pending.remove(event)
            drafts.index.add(event)

    for pod in pods:
        name = demo.pod_name(pod)
        late = rng.random() < 0.15
        deliver(lambda event: event_pod(event) == name and not late)  # noqa: B023 (called at once)
        deliver(lambda event: rng.random() < 0.05)  # others' events, early
        seen_as = (
            pod
            if rng.random() < 0.85
            else dict(pod, metadata=dict(pod["metadata"], resourceVersion="0"))
        )
        drafts.draft(
            seen_as,
            batch["logs"][name],
            batch["job"],
            batch["observed"]["job"],
            partial_observation(batch["observed"]["pods"].get(name), rng),
        )
        if rng.random() < 0.2:  # drafted again, as a later change of the ended pod does
            drafts.draft(
                pod,
                batch["logs"][name],
                batch["job"],
                batch["observed"]["job"],
                batch["observed"]["pods"].get(name),
            )
    summary = summary_of(batch, drafts)
    whole = summary_of(batch)
    assert saved_form(summary) == saved_form(whole)
    assert summary.drafts_taken > 0  # else only the path without drafts was compared
    # episodes.csv too, its rows of drafts taken whole as the drafts made them.
    assert not whole.csv_rows
    assert demo.episodes_csv([("rollout", summary)]) == demo.episodes_csv([("rollout", whole)])


def test_a_draft_of_an_episode_that_fails_verification_leaves_the_failure_to_the_final_pass() -> (
    None
):
    batch = recorded_batch()
    pod = batch["pods"][0]
    name = demo.pod_name(pod)
    drafts = demo.EpisodeDrafts(builtin=True)
    honest = batch["logs"][name]
    drafts.draft(
        pod, honest, batch["job"], batch["observed"]["job"], batch["observed"]["pods"].get(name)
    )
    assert name in drafts.drafts
    tampered = honest.replace('"reward": 1', '"reward": 0')
    assert tampered != honest
    drafts.draft(
        pod, tampered, batch["job"], batch["observed"]["job"], batch["observed"]["pods"].get(name)
    )
    assert (
        name not in drafts.drafts
    )  # the honest draft is not kept for a log that no longer says so
    batch["logs"][name] = tampered
    with pytest.raises(demo.VerificationError, match="reward is 0, not 1"):
        summary_of(batch, drafts)
    # And a draft of the honest log is not taken for the tampered log the summary is given.
    drafts.draft(
        pod, honest, batch["job"], batch["observed"]["job"], batch["observed"]["pods"].get(name)
    )
    with pytest.raises(demo.VerificationError, match="reward is 0, not 1"):
        summary_of(batch, drafts)


def test_a_later_event_leaves_the_inputs_a_draft_was_made_from_as_they_were() -> None:
    """A draft holds the kubelet's events of its pod as they were when it was made (not a copy
    of them): an event arriving later, naming an earlier moment, changes the index, not the draft."""
    batch = recorded_batch()
    pod = batch["pods"][0]
    name = demo.pod_name(pod)
    drafts = demo.EpisodeDrafts(builtin=True)
    for event in batch["events"]:
        drafts.index.add(event)
    drafts.draft(
        pod,
        batch["logs"][name],
        batch["job"],
        batch["observed"]["job"],
        batch["observed"]["pods"][name],
    )
    held = drafts.drafts[name].inputs.kubelet
    assert held, "the recorded pod has kubelet events"
    before = copy.deepcopy(held)
    started = next(
        event
        for event in batch["events"]
        if event.reason == "Started" and event.object_name == name
    )
    stem, stamp = (started.name or "").rsplit(".", 1)
    drafts.index.add(started._replace(name=f"{stem}.{int(stamp, 16) - 10**9:x}"))
    assert drafts.index.kubelet[name]["Started"][0] < before["Started"][0]
    assert drafts.drafts[name].inputs.kubelet == before and held == before


def test_the_pods_next_version_that_only_the_job_controller_changed_keeps_its_draft() -> None:
    """An ended pod changes once more when the Job controller counts it (its tracking finalizer
    removed): the draft made from the version before is kept for it, holding the new version;
    any other change drafts the episode anew."""
    batch = recorded_batch()
    final = batch["pods"][0]
    name = demo.pod_name(final)
    before = copy.deepcopy(final)
    before["metadata"]["resourceVersion"] = "1"
    before["metadata"]["finalizers"] = [demo.JOB_TRACKING_FINALIZER]
    drafts = demo.EpisodeDrafts(builtin=True)
    seen = batch["observed"]["pods"][name]
    drafts.draft(before, batch["logs"][name], batch["job"], batch["observed"]["job"], seen)
    first = drafts.drafts[name]
    drafts.draft(final, batch["logs"][name], batch["job"], batch["observed"]["job"], seen)
    kept = drafts.drafts[name]
    assert kept.pod is final and kept.points is first.points and kept.row is first.row
    anew = demo.EpisodeDrafts(builtin=True)
    anew.draft(final, batch["logs"][name], batch["job"], batch["observed"]["job"], seen)
    made = anew.drafts[name]  # what drafting the final version would have made
    assert kept._replace(csv=None) == made._replace(csv=None)
    assert kept.csv is not None and made.csv is not None
    assert kept.csv.get(name) == made.csv.get(name)
    moved = copy.deepcopy(final)
    moved["status"]["startTime"] = "2000-01-01T00:00:00Z"
    drafts.draft(moved, batch["logs"][name], batch["job"], batch["observed"]["job"], seen)
    assert drafts.drafts[name].pod is moved and drafts.drafts[name].points is not first.points


def test_a_later_sight_of_the_pod_leaves_the_observation_a_draft_was_made_from_as_it_was() -> None:
    """A draft holds the watch's record of its pod as it was when the draft was made, not a copy
    of it: a later sight that adds to what was seen makes a new record instead of changing it."""
    batch = recorded_batch()
    pod = batch["pods"][0]
    name = demo.pod_name(pod)
    seen = demo.pod_observation(None, pod, 100.0)
    drafts = demo.EpisodeDrafts(builtin=True)
    drafts.draft(pod, batch["logs"][name], batch["job"], batch["observed"]["job"], seen)
    before = copy.deepcopy(seen)
    assert demo.pod_observation(seen, pod, 101.0) is seen  # nothing new: the same record
    sandbox = copy.deepcopy(pod)
    sandbox["status"]["conditions"] = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "X"}
    ]
    later = demo.pod_observation(seen, sandbox, 102.0)
    assert later is not seen and later["sandbox_ready"] == "X"
    assert drafts.drafts[name].inputs.observed is seen and seen == before


def test_episodes_csv_and_events_txt_written_in_pieces_are_the_same_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = recorded_batch()
    summary = summary_of(batch)
    whole = demo.episodes_csv([("rollout", summary)])
    monkeypatch.setattr(demo.MODULES["summary"], "CSV_ROWS_A_PIECE", 5)
    pieces = list(demo.episodes_csv_pieces([("rollout", summary)]))
    assert len(pieces) == 1 + 4 and "".join(pieces) == whole  # the header, then 16 rows by 5
    assert len(whole.splitlines()) == 1 + 16
    for module in ("files", "parse"):
        monkeypatch.setattr(demo.MODULES[module], "ENCODED_ITEMS_A_PIECE", 5)
    events = batch["events"]
    pieces = list(demo.events_table_lines(events))
    by_creation = sorted(events, key=lambda event: event.created or "")
    assert len(pieces) == 1 + -(-len(events) // 5)  # the header, then the events by 5
    assert "".join(pieces[1:]).splitlines(keepends=True) == [
        demo.event_table_line(event) for event in by_creation
    ]
    assert "".join(pieces) == demo.events_table(events)
    assert all(piece.endswith("\n") for piece in pieces)


def test_drafted_points_hold_their_sources_floats_and_share_their_precisions() -> None:
    """Drafted with agreeing clocks, a point read from one source is that source's very float (no
    copy made by moving it by 0), and episodes stating the same precision share one float."""
    batch = recorded_batch()
    drafts = demo.EpisodeDrafts(builtin=True)
    for pod in batch["pods"][:2]:
        name = demo.pod_name(pod)
        drafts.draft(
            pod,
            batch["logs"][name],
            batch["job"],
            batch["observed"]["job"],
            batch["observed"]["pods"].get(name),
        )
    first, second = (drafts.drafts[demo.pod_name(pod)] for pod in batch["pods"][:2])
    for draft in (first, second):
        assert draft.points["ready"].at is draft.ready["at"]
        assert draft.points["reward"].at is draft.reward["at"]
    assert first.points["ready"].precision is second.points["ready"].precision
    assert first.phases["episode_work"][1] is second.phases["episode_work"][1]


# --------------------------------------------------------------------------
# The index of the events kept as the watch delivers them, and taken by the summary when exact.


def index_of(events: list[demo.EventRecord]) -> demo.EventIndex:
    index = demo.EventIndex()
    for event in events:
        index.add(event)
    return index


def what_a_list_makes(events: list[demo.EventRecord]) -> dict[str, Any]:
    """What the summary makes of the events read from a list, in the order given."""
    nodes, started = demo.kubelet_event_clocks(events)
    return {
        "scheduled": demo.scheduled_event_times(events),
        "creations": demo.pod_creation_events(events),
        "kubelet": demo.kubelet_container_events(events),
        "started": started,
        "cache": demo.image_cache_states(events),
        "pulls": demo.image_pulls(events),
        "nodes": {node: vars(bounds) for node, bounds in nodes.items()},
    }


def what_an_index_holds(index: demo.EventIndex) -> dict[str, Any]:
    return {
        "scheduled": index.scheduled,
        "creations": index.creations,
        "kubelet": index.kubelet,
        "started": index.started,
        "cache": index.cache,
        "pulls": index.pulls,
        "nodes": {node: vars(bounds) for node, bounds in index.nodes.items()},
    }


@pytest.mark.parametrize("seed", range(10))
def test_an_exact_index_told_the_events_in_any_order_is_what_their_list_makes(seed: int) -> None:
    events = recorded_batch()["events"]
    shuffled = list(events)
    random.Random(seed).shuffle(shuffled)
    index = index_of(shuffled)
    assert index.exact and index.told == len(events)
    assert what_an_index_holds(index) == what_a_list_makes(sorted(events, key=lambda e: e.name))


def test_an_index_whose_order_decided_something_is_not_exact() -> None:
    events = recorded_batch()["events"]
    scheduled = next(e for e in events if e.reason == "Scheduled")
    later = scheduled._replace(
        name=f"{scheduled.name}x", event_time="2026-12-31T00:00:00.000000Z"
    )  # a second Scheduled event for the pod: the last in a list's order would count
    assert not index_of([*events, later]).exact
    started = next(e for e in events if e.reason == "Started")
    tie = started._replace(host="another-node")  # the same moment, another node
    assert not index_of([*events, tie]).exact
    assert index_of([*events, started]).exact  # the same event again decides nothing


def test_the_event_store_keeps_its_index_exact_only_while_each_event_is_held_as_told() -> None:
    whole = json.loads((RECORDED / "events.json").read_text())["items"]
    store = demo.EventStore()
    for event in whole:
        store.apply("ADDED", copy.deepcopy(event))
    for event in whole:  # a watch's restart lists every event again
        store.apply("ADDED", copy.deepcopy(event))
    assert store.index.exact and store.index.told == len(store) == len(whole)
    assert what_an_index_holds(store.index) == what_a_list_makes(store.events())
    # The recorder's combined event, its message and count changed with each pod it stands
    # for, names no pod: the index stays what the events' list makes.
    creation = next(e for e in whole if e["reason"] == "SuccessfulCreate")
    for count in range(2, 5):
        combined = copy.deepcopy(creation)
        combined["metadata"]["name"] = "rollout.combined"
        combined["count"] = count
        combined["message"] = f"(combined from similar events): Created pod: rollout-{count}"
        store.apply("ADDED" if count == 2 else "MODIFIED", combined)
    assert store.index.exact and store.index.told == len(store) == len(whole) + 1
    assert what_an_index_holds(store.index) == what_a_list_makes(store.events())
    changed = dict(copy.deepcopy(whole[0]), count=7)
    store.apply("MODIFIED", changed)
    assert not store.index.exact
    # An event a reader took from, changed, is not replaced exactly either.
    plain = demo.EventStore()
    for event in whole:
        plain.apply("ADDED", copy.deepcopy(event))
    plain.apply("MODIFIED", dict(copy.deepcopy(creation), message="Created pod: another"))
    assert not plain.index.exact
    gone = demo.EventStore()
    for event in whole:
        gone.apply("ADDED", copy.deepcopy(event))
    gone.apply("DELETED", whole[0])
    assert not gone.index.exact


def test_the_summary_takes_an_exact_index_for_what_it_would_read_from_every_event() -> None:
    batch = recorded_batch()
    index = index_of(batch["events"])

    def refusing(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("read every event again")

    refused = dict(
        kubelet_container_events=refusing,
        kubelet_event_clocks=refusing,
        pod_creation_events=refusing,
    )
    with contextlib.ExitStack() as patches:
        for module in ("summary", "timing"):  # where the summary and its clocks look them up
            patches.enter_context(unittest.mock.patch.multiple(demo.MODULES[module], **refused))
        taken = demo.summarise_batch(
            batch["job"],
            batch["pods"],
            batch["logs"],
            batch["events"],
            len(batch["pods"]),
            True,
            batch["observed_at"],
            batch["observed"],
            index=index,
        )
    assert saved_form(taken) == saved_form(summary_of(batch))
    # An index of other events (another batch's too) is not taken.
    assert saved_form(
        demo.summarise_batch(
            batch["job"],
            batch["pods"],
            batch["logs"],
            batch["events"][1:],
            len(batch["pods"]),
            True,
            batch["observed_at"],
            batch["observed"],
            index=index,
        )
    ) == saved_form(
        demo.summarise_batch(
            batch["job"],
            batch["pods"],
            batch["logs"],
            batch["events"][1:],
            len(batch["pods"]),
            True,
            batch["observed_at"],
            batch["observed"],
        )
    )
