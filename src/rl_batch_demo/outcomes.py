"""Outcomes: verification (the first violation fails the whole batch) and rollouts (every episode's
outcome, its failure classified, none dropped).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .constants import (
    BASELINE_PASSED_MESSAGE,
    CANCELLED,
    COMPLETION_INDEX_ANNOTATION,
    EPISODE_EXIT_ANNOTATION,
    DEADLINE_ANNOTATION,
    EPISODE_EXIT_EVENT,
    EPISODE_EXIT_RECORDED,
    EPISODE_INDEXES_ANNOTATION,
    FAILURE_CLASSES,
    INDEX_FAILURE_COUNT_ANNOTATION,
    INDEX_IGNORED_FAILURE_COUNT_ANNOTATION,
    INFRASTRUCTURE_EXIT_CODES,
    INFRASTRUCTURE_POD_REASONS,
    INFRASTRUCTURE_TERMINATED_REASONS,
    POD_DEADLINE_REASON,
    SUCCESS_POLICY_REASON,
    VALID_CLASSES,
)
from .model import Settings, VerificationError
from .stats import percentile, rounded
from .parse import (
    EventRecord,
    cancelled_by_tool,
    condition,
    condition_true,
    container_image,
    container_status,
    container_terminated,
    index_list,
    parse_events,
    parse_time,
    pod_name,
    pod_warnings,
    run_wide_indexes,
)
from .timing import EpisodeDraft, WHOLE_SECOND, worker_time


def verify_episode(
    pod: dict, events: list[dict], job_created: float, builtin: bool
) -> tuple[dict, dict]:
    """Check one episode; return its ready and reward events."""
    name = pod_name(pod)
    phase = (pod.get("status") or {}).get("phase")
    if phase != "Succeeded":
        raise VerificationError(f"pod {name}: phase is {phase}, not Succeeded")
    ready, reward = episode_events(name, events)
    check_reward(name, reward, builtin)
    check_times_in_order(name, pod, job_created, ready, reward)
    check_container_exit(name, pod)
    return ready, reward


def episode_events(name: str, events: list[dict]) -> tuple[dict, dict]:
    """The episode's one ready and one reward event, both naming its pod."""
    readies = [e for e in events if e["event"] == "ready"]
    rewards = [e for e in events if e["event"] == "reward"]
    if len(readies) != 1:
        raise VerificationError(
            f"pod {name}: expected exactly one ready event, found {len(readies)}"
        )
    if len(rewards) != 1:
        raise VerificationError(
            f"pod {name}: expected exactly one reward event, found {len(rewards)}"
        )
    ready, reward = readies[0], rewards[0]
    if ready.get("episode_id") != name:
        raise VerificationError(
            f"pod {name}: ready event has episode_id {ready.get('episode_id')!r}, not the pod name"
        )
    if reward.get("episode_id") != ready.get("episode_id"):
        raise VerificationError(
            f"pod {name}: reward event has episode_id {reward.get('episode_id')!r}, "
            f"not the ready event's {ready.get('episode_id')!r}"
        )
    return ready, reward


def check_reward(name: str, reward: dict, builtin: bool) -> None:
    """The built-in episode's reward is 1, its patched tests passed and its baseline failed; an
    episode script's reward is a finite number."""
    value = reward.get("reward")
    if not builtin:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise VerificationError(f"pod {name}: reward is {value!r}, not a number")
        return
    if value != 1 or isinstance(value, bool):
        raise VerificationError(f"pod {name}: reward is {value!r}, not 1", "verifier")
    tests_exit, baseline_exit = reward.get("tests_exit"), reward.get("baseline_exit")
    if tests_exit != 0 or isinstance(tests_exit, bool):
        raise VerificationError(f"pod {name}: tests_exit is {tests_exit!r}, not 0", "verifier")
    if (
        baseline_exit in (0, None)
        or not isinstance(baseline_exit, int)
        or isinstance(baseline_exit, bool)
    ):
        raise VerificationError(
            f"pod {name}: baseline_exit is {reward.get('baseline_exit')!r}; the baseline must fail",
            "verifier",
        )


def check_times_in_order(
    name: str, pod: dict, job_created: float, ready: dict, reward: dict
) -> None:
    """The Job created, then the pod, then ready, then the reward: every time known, none earlier
    than the one before."""
    pod_created = parse_time(pod["metadata"].get("creationTimestamp"))
    moments = [job_created, pod_created, ready.get("at"), reward.get("at")]
    numbers = [m for m in moments if isinstance(m, (int, float))]
    in_order = len(numbers) == len(moments) and all(a <= b for a, b in zip(numbers, numbers[1:]))
    if not in_order:
        raise VerificationError(
            f"pod {name}: times out of order (job created {moments[0]}, pod created {moments[1]}, "
            f"ready {moments[2]}, reward {moments[3]}): unsynchronised clocks or broken events",
            "verifier",
        )


def check_container_exit(name: str, pod: dict) -> None:
    """The episode's container ran once and exited 0."""
    status = container_status(pod)
    if status.get("restartCount", 0) != 0:
        raise VerificationError(
            f"pod {name}: container restarted {status.get('restartCount')} time(s)",
            "infrastructure",
        )
    terminated = container_terminated(pod)
    if terminated is None:
        raise VerificationError(f"pod {name}: container has no terminated state")
    if terminated.get("exitCode") != 0:
        raise VerificationError(f"pod {name}: container exited {terminated.get('exitCode')}, not 0")


def never_ran(pod: dict, job: dict, log_text: str = "") -> bool:
    """A pod of a Job that was suspended, deleted before any container of it was made: no
    episode ran in it. Kueue stops a Job it has just admitted when its Workload is not yet in its
    cache ("Missing Workload; unable to restore pod templates", kubernetes-sigs/kueue#8482) and
    resumes it, and an eviction can come before the pods start: the Job controller deletes the
    pods, which end Failed (ContainerStatusUnknown, never started), and makes others. A pod with a
    log, or whose container ran once (lastState), ran."""
    if not pod["metadata"].get("deletionTimestamp") or log_text.strip():
        return False
    conditions = (job.get("status") or {}).get("conditions") or []
    if not any(condition.get("type") == "Suspended" for condition in conditions):
        return False
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        terminated = state.get("terminated") or {}
        if status.get("containerID") or "running" in state or terminated.get("startedAt"):
            return False
        if (status.get("lastState") or {}).get("terminated"):  # a container that ran before
            return False
    return True


def verify_batch(
    count: int,
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    builtin: bool = True,
    drafts: Mapping[str, EpisodeDraft] | None = None,
) -> list[tuple[dict, dict, dict]]:
    """Every episode honest, or VerificationError naming the first that is not.

    Returns (pod, ready event, reward event) per pod, sorted by pod name. An episode drafted
    while waiting from this very pod, log and Job creation is not verified again.
    """
    if len(pods) != count:
        raise VerificationError(
            f"expected {count} pods for {count} episodes, found {len(pods)} "
            f"(a replaced or missing pod is a failure)"
        )
    job_created = parse_time(job["metadata"].get("creationTimestamp"))
    if job_created is None:
        raise VerificationError("the Job has no creationTimestamp")
    episodes = []
    for pod in sorted((succeeded_before_its_deadline(pod, job) for pod in pods), key=pod_name):
        name = pod_name(pod)
        draft = (drafts or {}).get(name)
        if draft is not None and draft.verified(pod, logs.get(name, ""), job_created, builtin):
            episodes.append((pod, draft.ready, draft.reward))
            continue
        events = parse_events(logs.get(name, "").splitlines())
        ready, reward = verify_episode(pod, events, job_created, builtin)
        episodes.append((pod, ready, reward))
    return episodes


def job_end_reason(job: dict | None) -> str | None:
    """The reason of the Job's Failed (or FailureTarget) condition, e.g. DeadlineExceeded."""
    for kind in ("Failed", "FailureTarget"):
        entry = condition(job or {}, kind)
        if entry and entry.get("status") == "True":
            return entry.get("reason")
    return None


TRACEBACK_START = re.compile(r'(Traceback \(most recent call last\):|  File ".*", line \d+)')

EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(: .*)?")


def traceback_tail(log_text: str) -> str | None:
    """The last line of the last Python traceback in a log (`ZeroDivisionError: division by
    zero`), what a failed episode's line quotes; a SyntaxError has no "Traceback" header, only
    its `File` lines, so either opens one."""
    last, in_trace = None, False
    for line in log_text.splitlines():
        if TRACEBACK_START.match(line):
            in_trace = True
        elif in_trace and not line[:1].isspace():
            in_trace = False
            if EXCEPTION_LINE.fullmatch(line.rstrip()):
                last = line.strip()
    return last


def with_traceback(why: str, log_text: str) -> str:
    tail = traceback_tail(log_text)
    return f"{why}: {tail}" if tail else why


def classify_attempt(
    pod: dict, log_text: str, job: dict, builtin: bool, warnings: Sequence[str] = ()
) -> tuple[str | None, str | None]:
    """(failure class, why) of one pod, or (None, None) for an episode that passed every check.

    Infrastructure: the pod was disrupted, never scheduled, never started its
    container, was killed from outside, or was stopped by the batch's end before it
    started. Episode: the program exited non-zero on its own, broke the event
    protocol, or was still running at the Job's deadline. Verifier: the built-in
    checks of the result failed (the baseline passed, the patched tests failed,
    reward not 1, times out of order). `warnings` (the pod's Warning event reasons)
    are named with an infrastructure failure: a pod stopped at the deadline while
    its image would not pull says so.
    """
    failure_class, why = classify_pod_state(pod, log_text, job, builtin)
    if failure_class == "infrastructure" and warnings:
        why = f"{why}; pod warnings: {'; '.join(warnings)}"
    return failure_class, why


def job_cut_short(job: dict | None) -> bool:
    """The Job's successPolicy (--need) was met, or the tool stopped it once --need-groups was:
    every episode still running is stopped."""
    if cancelled_by_tool(job or {}):
        return True
    for kind in ("SuccessCriteriaMet", "Complete"):
        entry = condition(job or {}, kind)
        if entry and entry.get("status") == "True" and entry.get("reason") == SUCCESS_POLICY_REASON:
            return True
    return False


def cut_short_by(job: dict | None) -> str:
    """What cut the batch short (job_cut_short): the flag, as a cancelled episode's line names it."""
    return "--need-groups" if cancelled_by_tool(job or {}) else "--need"


def succeeded_before_its_deadline(pod: dict, job: dict | None) -> dict:
    """The pod as it ended: one the kubelet marked Failed (DeadlineExceeded) after it had
    succeeded is given back as Succeeded, else the pod itself.

    A real kubelet keeps checking a pod's activeDeadlineSeconds as long as the pod is on its node,
    ended or not, so a pod that succeeded well before its deadline turns Failed with reason
    DeadlineExceeded once the deadline passes while the batch still runs (its container's exit
    code still 0). It had succeeded if the Job counted its index as completed, or if its every
    container had ended, with exit code 0, in a second before its deadline's."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed" or status.get("reason") != POD_DEADLINE_REASON:
        return pod
    ends = [
        (cs.get("state") or {}).get("terminated") or {}
        for cs in status.get("containerStatuses") or []
    ]
    if not ends or any(end.get("exitCode") != 0 for end in ends):
        return pod
    index = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        COMPLETION_INDEX_ANNOTATION, ""
    )
    counted = index.isdigit() and int(index) in index_list(
        ((job or {}).get("status") or {}).get("completedIndexes") or ""
    )
    started = parse_time(status.get("startTime"))
    limit = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    finished = [parse_time(end.get("finishedAt")) for end in ends]
    in_time = (
        started is not None
        and isinstance(limit, int)
        and all(moment is not None and moment < started + limit for moment in finished)
    )
    if not (counted or in_time):
        return pod
    kept = {key: value for key, value in status.items() if key not in ("reason", "message")}
    return dict(pod, status=dict(kept, phase="Succeeded"))


def classify_pod_state(
    pod: dict, log_text: str, job: dict, builtin: bool
) -> tuple[str | None, str | None]:
    """classify_attempt from the pod's status and log alone: the first step that explains the
    pod, in this order, says whose failure it was. A pod whose episode ran under the launcher
    (exit_recorded) has its episode's own end in its log: it Succeeded whatever that end, so a
    failed one is never the episode's."""
    pod = succeeded_before_its_deadline(pod, job)
    lost = lost_pod(pod)
    if lost is not None:
        return lost
    if (pod.get("status") or {}).get("phase") == "Succeeded":
        own = own_end(log_text, builtin) if exit_recorded(pod) else None
        return own or succeeded_pod(pod, log_text, job, builtin)
    state = container_status(pod).get("state") or {}
    stopped = stopped_pod(pod, job, state)
    if stopped is not None:
        return stopped
    unended = unended_container(pod, job, state)
    if unended is not None:
        return unended
    if exit_recorded(pod):
        return launcher_failed(state["terminated"], log_text)
    return ended_container(state["terminated"], log_text, builtin)


def exit_recorded(pod: dict) -> bool:
    """The pod ran its episode under the launcher, which records the episode's own end in its log."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(EPISODE_EXIT_ANNOTATION) == EPISODE_EXIT_RECORDED


def own_end(log_text: str, builtin: bool) -> tuple[str | None, str | None] | None:
    """The episode's own failure as the launcher recorded it (its last episode_exit event), whose
    fault a failure of its own is (episode, or the built-in checks': verifier); None when it
    recorded none (the program exited 0)."""
    ends = [e for e in parse_events(log_text.splitlines()) if e["event"] == EPISODE_EXIT_EVENT]
    if not ends:
        return None
    end = ends[-1]
    if end.get("timed_out"):
        return "episode", (
            f"ran out of time: still running {end.get('timeout_seconds')} s after it started "
            f"(--episode-timeout), stopped by its launcher"
        )
    return ended_container({"exitCode": end.get("exit_code")}, log_text, builtin)


def launcher_failed(terminated: dict, log_text: str) -> tuple[str | None, str | None]:
    """A failed pod whose episode ran under the launcher: stopped or killed from outside (137, 143,
    OOMKilled, ...), or the launcher could not run the episode at all; never the episode's own end."""
    code, reason = terminated.get("exitCode"), terminated.get("reason") or ""
    if reason in INFRASTRUCTURE_TERMINATED_REASONS or code in INFRASTRUCTURE_EXIT_CODES:
        return "infrastructure", f"container {reason or 'ended'} with exit code {code}"
    return "infrastructure", with_traceback(
        f"the episode launcher exited {code} (it records the episode's own end and exits 0: "
        f"this is its own failure, e.g. a Python it cannot run on)",
        log_text,
    )


def lost_pod(pod: dict) -> tuple[str | None, str | None] | None:
    """A pod disrupted before it finished, or one its node gave up (INFRASTRUCTURE_POD_REASONS)."""
    status = pod.get("status") or {}
    disrupted = condition(pod, "DisruptionTarget")
    # A disrupted pod whose program still finished (PID 1 ignores SIGTERM unless it handles it,
    # so an evicted episode often runs on to exit 0) Succeeded: the Job counts it, so do we.
    if disrupted and disrupted.get("status") == "True" and status.get("phase") != "Succeeded":
        return "infrastructure", (
            f"disrupted ({disrupted.get('reason', '?')}: "
            f"{(disrupted.get('message') or '').strip()})"
        ).replace(": )", ")")
    if status.get("reason") in INFRASTRUCTURE_POD_REASONS:
        return (
            "infrastructure",
            f"pod {status['reason']}: {(status.get('message') or '').strip()}".rstrip(": "),
        )
    return None


def succeeded_pod(
    pod: dict, log_text: str, job: dict, builtin: bool
) -> tuple[str | None, str | None]:
    """A pod that Succeeded: a pass if its episode verifies, else what stopped it or failed."""
    try:
        job_created = parse_time(job["metadata"].get("creationTimestamp"))
        verify_episode(pod, parse_events(log_text.splitlines()), job_created or 0.0, builtin)
    except VerificationError as error:
        if job_cut_short(job) and pod["metadata"].get("deletionTimestamp"):
            # Stopped by the Job once --need was met, it exited 0 before its reward was complete.
            return (
                CANCELLED,
                f"cancelled: {cut_short_by(job)} was met while it ran (it exited 0 before a complete "
                f"reward: {str(error).split(': ', 1)[-1]})",
            )
        end = job_end_reason(job)
        if pod["metadata"].get("deletionTimestamp") and end is not None and not log_text:
            # The Job's end deleted the pod while it ran; it ran on to exit 0 (its first process
            # ignores SIGTERM) and the kubelet removed it at once: its log went with it before it
            # could be read. Its outcome is unknown, not the episode's failure.
            return "infrastructure", (
                f"its log was gone before it could be read: deleted as the Job ended ({end}), "
                f"the pod was removed once it exited 0"
            )
        return error.failure_class, str(error).split(": ", 1)[-1]
    return None, None


def stopped_pod(pod: dict, job: dict, state: dict) -> tuple[str | None, str | None] | None:
    """A pod stopped from outside before its episode ended: by --need being met, by its own
    deadline, or by the Job's end."""
    status = pod.get("status") or {}
    started = "running" in state or bool((state.get("terminated") or {}).get("startedAt"))
    deleted = pod["metadata"].get("deletionTimestamp")
    if job_cut_short(job) and (deleted or status.get("phase") != "Failed"):
        # Stopped (or about to be) by the Job because enough episodes had succeeded.
        return (
            CANCELLED,
            f"cancelled: {cut_short_by(job)} was met while it ran"
            if started
            else f"cancelled: {cut_short_by(job)} was met before its container started",
        )
    if status.get("reason") == POD_DEADLINE_REASON:
        return past_pod_deadline(pod, started)
    end = job_end_reason(job)
    own_exit = (state.get("terminated") or {}).get("exitCode") not in (
        None,
        0,
    ) + INFRASTRUCTURE_EXIT_CODES
    if deleted and end is not None and not own_exit:
        # Stopped by the Job controller as the Job ended, not by anything of its own.
        if started and end == "DeadlineExceeded":
            return "episode", "still running at the Job's deadline"
        return "infrastructure", f"stopped when the Job ended ({end}) before it finished"
    return None


def past_pod_deadline(pod: dict, started: bool) -> tuple[str | None, str | None]:
    """A pod stopped at its activeDeadlineSeconds: the episode's fault once its container started,
    unless its launcher keeps the episode's own time (its pod's deadline is then a backstop). The
    message names what the deadline was made of, as the run was given it (DEADLINE_ANNOTATION)."""
    limit = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    parts = ((pod.get("metadata") or {}).get("annotations") or {}).get(DEADLINE_ANNOTATION)
    # A pod of a run that did not record them: its activeDeadlineSeconds alone.
    made_of = parts or "its pod's activeDeadlineSeconds"
    if started and exit_recorded(pod):
        if "--episode-timeout" in made_of:
            why = (
                f"not by its launcher at the episode's own --episode-timeout: a slow start "
                f"(image {container_image(pod)})"
            )
        else:
            why = "the episode still running then"
        return "infrastructure", (
            f"stopped at its pod's deadline of {limit} s from its start on the node "
            f"({made_of}), {why}"
        )
    if started:
        return (
            "episode",
            f"ran out of time: still running {limit} s after its pod started (its deadline: "
            f"{made_of})",
        )
    return "infrastructure", (
        f"container never started within its pod's deadline of {limit} s from its "
        f"start ({made_of}): image {container_image(pod)} not pulled and started by then"
    )


def unended_container(pod: dict, job: dict, state: dict) -> tuple[str | None, str | None] | None:
    """A pod whose container never ended: never scheduled, never started, or still running."""
    if not (pod.get("spec") or {}).get("nodeName"):
        scheduled = condition(pod, "PodScheduled") or {}
        return (
            "infrastructure",
            f"never scheduled: {scheduled.get('message') or 'no node assigned'}",
        )
    if "waiting" in state:
        waiting = state["waiting"]
        return "infrastructure", (
            f"container never started ({waiting.get('reason', 'waiting')}: "
            f"{waiting.get('message', '')})"
        ).replace(": )", ")")
    if "running" in state:
        end = job_end_reason(job)
        if end == "DeadlineExceeded":
            return "episode", "still running at the Job's deadline"
        return "infrastructure", f"still running when the batch ended ({end or 'not finished'})"
    if state.get("terminated") is None:
        return "infrastructure", "container never started (no container status)"
    return None


def ended_container(
    terminated: dict, log_text: str, builtin: bool
) -> tuple[str | None, str | None]:
    """A container that ended on its own: its exit code and its log say whose failure it was."""
    code, reason = terminated.get("exitCode"), terminated.get("reason") or ""
    if (
        reason in INFRASTRUCTURE_TERMINATED_REASONS
        or code in INFRASTRUCTURE_EXIT_CODES
        or code == 0
    ):
        return "infrastructure", f"container {reason or 'ended'} with exit code {code}"
    if builtin and BASELINE_PASSED_MESSAGE in log_text:
        return "verifier", f"exited {code}: {BASELINE_PASSED_MESSAGE}"
    rewards = [e for e in parse_events(log_text.splitlines()) if e["event"] == "reward"]
    if builtin and len(rewards) == 1 and rewards[0].get("tests_exit") not in (0, None):
        return (
            "verifier",
            f"exited {code}: the patched code failed its tests (tests_exit {rewards[0]['tests_exit']})",
        )
    return "episode", with_traceback(f"exited {code}", log_text)


def pod_index(pod: dict) -> int | None:
    """The pod's episode index in the run: its completion index, which in a Job of several (one per
    image) is its Job's own and names the run-wide index through EPISODE_INDEXES_ANNOTATION."""
    annotations = pod["metadata"].get("annotations") or {}
    try:
        index = int(annotations.get(COMPLETION_INDEX_ANNOTATION, ""))
    except ValueError:
        return None
    if EPISODE_INDEXES_ANNOTATION not in annotations:
        return index
    indexes = sorted(index_list(annotations[EPISODE_INDEXES_ANNOTATION]))
    return indexes[index] if 0 <= index < len(indexes) else None


def attempts_recorded(pod: dict) -> int:
    """This pod's attempt number as the Job controller counts it: 1 + the index's earlier failures."""
    annotations = pod["metadata"].get("annotations") or {}
    total = 1
    for key in (INDEX_FAILURE_COUNT_ANNOTATION, INDEX_IGNORED_FAILURE_COUNT_ANNOTATION):
        try:
            total += max(0, int(annotations.get(key, "0")))
        except ValueError:
            pass
    return total


REWARD_ROW_FIELDS = (
    "index",
    "task_id",
    "image",
    "group",
    "pod",
    "attempts",
    "reward",
    "failure_class",
    "valid",
    "failure",
    "node",
    "pod_to_ready_seconds",
    "batch_to_ready_seconds",
    "batch_to_reward_seconds",
    "episode_seconds",
    "evidence",
    "earlier_attempts",
)


def reward_valid(failure_class: str | None) -> bool:
    """Whether a trainer may learn from the line: the agent's own outcome (a success, or the episode's
    own failure) is; a loss to the infrastructure, the verifier or a cancellation is masked."""
    return failure_class in VALID_CLASSES


def pods_by_index(pods: Iterable[dict], count: int) -> dict[int, list[dict]]:
    """Each completion index's pods (its attempts), oldest first."""
    by_index: dict[int, list[dict]] = {}
    for pod in pods:
        index = pod_index(pod)
        if index is not None and 0 <= index < count:
            by_index.setdefault(index, []).append(pod)
    for attempts in by_index.values():
        attempts.sort(
            key=lambda p: (
                parse_time(p["metadata"].get("creationTimestamp")) or 0.0,
                attempts_recorded(p),
                pod_name(p),
            )
        )
    return by_index


def episode_rows(
    count: int,
    job: dict,
    pods: Sequence[dict],
    logs: dict[str, str],
    builtin: bool,
    task_ids: Sequence[Any] | None,
    group_size: int,
    events: Sequence[EventRecord] = (),
    images: Sequence[str | None] | None = None,
) -> list[dict]:
    """One row per episode (completion index), its final attempt's outcome; pure.

    Every index has a row, an episode whose pod was never created included.
    """
    warnings = pod_warnings(events)
    by_index = pods_by_index(pods, count)
    return [
        episode_row(
            index,
            by_index.get(index, []),
            job,
            logs,
            builtin,
            task_ids,
            group_size,
            warnings,
            images,
        )
        for index in range(count)
    ]


def group_images(settings: Settings) -> list[str]:
    """The image of each group of episodes (a task's; without tasks, each episode's)."""
    return list(settings.task_images or [settings.image] * settings.count)


def episode_row(
    index: int,
    attempts: Sequence[dict],
    job: dict,
    logs: dict[str, str],
    builtin: bool,
    task_ids: Sequence[Any] | None,
    group_size: int,
    warnings: dict[str, list[str]] | None = None,
    images: Sequence[str | None] | None = None,
) -> dict:
    """The row of one episode from its attempts (oldest first); pure. The final attempt is the pod
    that succeeded, else the newest one. `images`: each group's image (group_images)."""
    # Unknown, the batch's times are unknown: never counted from 1970.
    job_created = parse_time(job["metadata"].get("creationTimestamp"))
    group = index // group_size
    row: dict[str, Any] = {"index": index, "task_id": task_ids[group] if task_ids else None}
    if images is not None:
        row["image"] = images[group] if group < len(images) else None
    row["group"] = group
    if not attempts:
        row.update(never_created(job, index))
        return row
    outcomes = [
        (
            pod,
            *classify_attempt(
                pod,
                logs.get(pod_name(pod), ""),
                job,
                builtin,
                (warnings or {}).get(pod_name(pod), ()),
            ),
        )
        for pod in attempts
    ]
    final = next((o for o in outcomes if o[1] is None), outcomes[-1])
    row.update(final_attempt(final, outcomes, len(attempts), job_created, logs))
    return row


def never_created(job: dict, index: int | None = None) -> dict[str, Any]:
    """The outcome of an episode with no pod to read: cancelled, or stopped by the Job's end; or,
    when the Job counts its index as done, a pod that is gone (deleted before its outcome was
    read: a client that was not following, a suspension): what it did cannot be verified."""
    counted = next(
        (
            word
            for field, word in (("completedIndexes", "succeeded"), ("failedIndexes", "failed"))
            if index is not None and index in run_wide_indexes(job, field)
        ),
        None,
    )
    if counted is not None:
        return {
            "pod": None,
            "attempts": None,
            "reward": None,
            "failure_class": "infrastructure",
            "valid": False,
            "failure": f"cannot verify: the Job counts this episode {counted}, but its pod is "
            f"gone (deleted before its outcome was read), its log and reward with it",
            "evidence": "job.json",
        }
    if job_cut_short(job):
        failure_class = CANCELLED
        failure = f"cancelled: {cut_short_by(job)} was met before this episode's pod was created"
    else:
        failure_class = "infrastructure"
        failure = (
            f"never started: the Job ended ({job_end_reason(job) or 'unfinished'}) before "
            f"it created this episode's pod"
        )
    return {
        "pod": None,
        "attempts": 0,
        "reward": None,
        "failure_class": failure_class,
        "valid": False,
        "failure": failure,
        "evidence": "job.json",
    }


def final_attempt(
    final: tuple[dict, str | None, str | None],
    outcomes: Sequence[tuple[dict, str | None, str | None]],
    attempts: int,
    job_created: float | None,
    logs: dict[str, str],
) -> dict[str, Any]:
    """An episode's outcome from its final attempt, (pod, failure class, why): its reward and
    times as its worker reported them, and its other attempts' outcomes."""
    pod, failure_class, failure = final
    name = pod_name(pod)
    worker_events = parse_events(logs.get(name, "").splitlines())
    ready = next((e for e in worker_events if e["event"] == "ready"), {})
    reward = next((e for e in worker_events if e["event"] == "reward"), {})
    created = parse_time(pod["metadata"].get("creationTimestamp"))
    fields = {
        "pod": name,
        "attempts": max(attempts, attempts_recorded(pod)),
        "reward": reward.get("reward"),
        "failure_class": failure_class,
        "valid": reward_valid(failure_class),
        "failure": failure,
        "node": (pod.get("spec") or {}).get("nodeName"),
        "pod_to_ready_seconds": seconds_between(ready.get("at"), created),
        "batch_to_ready_seconds": seconds_between(ready.get("at"), job_created),
        "batch_to_reward_seconds": seconds_between(reward.get("at"), job_created),
        "episode_seconds": seconds_between(
            reward.get("at"), ready.get("at") if "at" in ready else None
        ),
        "evidence": f"{name}.log" if failure_class else None,
        "earlier_attempts": [
            {"pod": pod_name(p), "failure_class": c, "failure": f}
            for p, c, f in outcomes
            if p is not pod
        ],
    }
    for key, value in reward.items():
        if key in ("event", "reward"):
            continue
        fields[key if key not in REWARD_ROW_FIELDS else f"episode_{key}"] = value
    return fields


def seconds_between(later: Any, earlier: float | None) -> float | None:
    """The seconds from `earlier` to `later`, as a row shows them; None unless both are times."""
    ok = isinstance(later, (int, float)) and not isinstance(later, bool) and earlier is not None
    return rounded(later - earlier) if ok else None


def batch_job_whole(job: dict | None, count: int) -> bool:
    """Whether the batch's Job as seen so far is the whole batch's: every one of its Jobs seen (one
    per image: merged, their completions add up to the batch's `count`). Until then the batch's
    origin, its first Job's creation, may be unknown, and no episode's times can be counted."""
    spec = (job or {}).get("spec") or {}
    created = ((job or {}).get("metadata") or {}).get("creationTimestamp")
    return bool(created) and spec.get("completions") == count


def failure_settled(job: dict | None, index: int) -> bool:
    """The Job will not run this index again: it counts it among its failed indexes, or it has
    ended (or is ending: FailureTarget, SuccessCriteriaMet)."""
    status = (job or {}).get("status") or {}
    if cancelled_by_tool(job or {}):  # stopped by the tool (--need-groups): nothing more will run
        return True
    if any(
        condition_true(job or {}, kind)
        for kind in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")
    ):
        return True
    return index in index_list(status.get("failedIndexes") or "")


def settled_attempt(
    attempts: Sequence[dict], job: dict | None, index: int, logs: dict[str, str], may_retry: bool
) -> bool:
    """Whether an episode's outcome is final, from what was seen so far; pure.

    Its attempt that succeeded, else its newest, has ended and every attempt's log is read
    (`logs`: those read after their container ended). A success is final at once; a failure
    once the Job will not retry it: without retries at once, else when the Job says so
    (failure_settled). A failed pod being deleted waits for the Job's word too: whether the
    Job's end (or --need) stopped it, or something else did, decides its class.
    """
    if not attempts:
        return False
    final = next(
        (p for p in attempts if (p.get("status") or {}).get("phase") == "Succeeded"), attempts[-1]
    )
    phase = (final.get("status") or {}).get("phase")
    if phase not in ("Succeeded", "Failed") or any(pod_name(p) not in logs for p in attempts):
        return False
    if phase == "Succeeded":
        return True
    if may_retry or final["metadata"].get("deletionTimestamp"):
        return failure_settled(job, index)
    return True


class Delivery(NamedTuple):
    """One line of rewards.jsonl as it was written: when (the client's wall clock), and between which
    moments its episode's container ended (None where nothing bounds it)."""

    index: int  # type: ignore[assignment]  # the episode's, not tuple.index()
    success: bool
    written_at: float
    ended_after: float | None  # its reward event, or the start of its container's finishedAt second
    ended_before: (
        float | None
    )  # the end of that second, or the client's watch seeing it, the earlier
    streamed: bool  # written while the batch ran, not from the evidence read after its end
    seen_at: float | None = None  # the client's watch seeing the container terminated

    def saved(self) -> list:
        return list(self)


def container_end_bounds(
    pod: dict | None, log_text: str, seen_terminated: float | None
) -> tuple[float | None, float | None]:
    """Between which moments a pod's episode container ended: after its reward event (the episode's
    last act) and within its finishedAt second, before the client's watch saw it terminated."""
    if pod is None:
        return None, None
    terminated = container_terminated(pod) or {}
    finished = parse_time(terminated.get("finishedAt"))
    reward = next((e for e in parse_events(log_text.splitlines()) if e["event"] == "reward"), {})
    after = [t for t in (worker_time(reward.get("at")), finished) if t is not None]
    before = [
        t
        for t in (None if finished is None else finished + WHOLE_SECOND, seen_terminated)
        if t is not None
    ]
    return (max(after) if after else None), (min(before) if before else None)


def delivery_figures(
    deliveries: Sequence[Delivery],
    origin: float | None,
    origin_slack: float | None,
    need: int | None,
) -> dict:
    """When the rewards reached rewards.jsonl: the first (and with --need the K-th) success from the
    Job's creation, and each line's lag from its container's end; pure."""
    successes = sorted(d.written_at for d in deliveries if d.success)
    lags = [d.written_at - d.ended_after for d in deliveries if d.ended_after is not None]
    # The client's own part: from its watch seeing the container's end to the line written.
    own = [d.written_at - d.seen_at for d in deliveries if d.seen_at is not None]
    widths = [
        max(0.0, d.ended_before - d.ended_after)
        for d in deliveries
        if d.ended_after is not None and d.ended_before is not None
    ]

    def since_origin(moment: float | None) -> float | None:
        return None if moment is None or origin is None else rounded(moment - origin)

    figures: dict[str, Any] = {
        "first_reward_seconds": since_origin(successes[0] if successes else None),
        "reward_delivery_lag_p50_seconds": rounded(percentile(lags, 0.50)) if lags else None,
        "reward_delivery_lag_p99_seconds": rounded(percentile(lags, 0.99)) if lags else None,
        "reward_delivery_lag_max_seconds": rounded(max(lags)) if lags else None,
        "reward_delivery": {
            "lines": len(deliveries),
            "streamed": sum(1 for d in deliveries if d.streamed),
            "written_after_the_end": sum(1 for d in deliveries if not d.streamed),
            "lag_samples": len(lags),
            "seen_to_written_p50_seconds": rounded(percentile(own, 0.50)) if own else None,
            "seen_to_written_p99_seconds": rounded(percentile(own, 0.99)) if own else None,
            "lag_from": "the earliest moment the episode's container can have ended (its reward event, "
            "else its finishedAt second) to its line written to rewards.jsonl",
            "lag_precision_seconds": rounded(max(widths)) if widths else None,
            "times_from": "the Job's creation, as the start of the client's create call (up to "
            "origin_precision_seconds early)",
            "origin_precision_seconds": rounded(origin_slack) if origin_slack is not None else None,
        },
    }
    if need is not None:
        figures["kth_reward_seconds"] = since_origin(
            successes[need - 1] if len(successes) >= need else None
        )
    return figures


def rewards_jsonl(rows: Iterable[dict]) -> str:
    """rewards.jsonl: one JSON object per episode, in index order."""
    return "".join(json.dumps(row, sort_keys=False) + "\n" for row in rows)


def is_failure(row: dict) -> bool:
    """A failed episode: neither a success nor cancelled once --need was met."""
    return row["failure_class"] not in (None, CANCELLED)


def is_loss(row: dict) -> bool:
    """An episode lost to the infrastructure or the verifier: a failure whose line a trainer masks,
    the only kind --allow-failures counts. The episode's own failure is a sample, not a loss."""
    return is_failure(row) and row["failure_class"] not in VALID_CLASSES


def failure_counts(classes: Iterable[str | None]) -> dict[str, int]:
    """Failures by class; successes and cancelled episodes are no failures."""
    counts = {kind: 0 for kind in FAILURE_CLASSES}
    for kind in classes:
        if kind in counts:
            counts[kind] += 1
    return counts


def attempt_figures(rows: Sequence[dict]) -> dict:
    """First attempts and final outcomes counted apart: what retries bought."""
    first = [
        (
            row["earlier_attempts"][0]["failure_class"]
            if row.get("earlier_attempts")
            else row["failure_class"]
        )
        for row in rows
    ]
    final = [row["failure_class"] for row in rows]
    return {
        # An episode whose pod is gone (never_created) has attempts unknown: None, not counted.
        "attempts_total": sum(row["attempts"] or 0 for row in rows),
        "episodes_retried": sum(1 for row in rows if (row["attempts"] or 0) > 1),
        "first_attempt": {"succeeded": first.count(None), "failed": failure_counts(first)},
        "final": {
            "succeeded": final.count(None),
            "failed": failure_counts(final),
            "cancelled": final.count(CANCELLED),
        },
    }


def group_figures(rows: Sequence[dict], group_size: int) -> list[dict]:
    """Per group of G episodes sharing a task: complete or not, time until all G rewards are in
    (from the Job's creation), and the spread between its fastest and slowest reward."""
    groups = []
    for start in range(0, len(rows), group_size):
        members = rows[start : start + group_size]
        done = [
            row["batch_to_reward_seconds"]
            for row in members
            if row["failure_class"] is None and row["batch_to_reward_seconds"] is not None
        ]
        complete = len(done) == len(members)
        rewards = [row["reward"] for row in members if row["failure_class"] is None]
        groups.append(
            {
                "group": members[0]["group"],
                "task_id": members[0]["task_id"],
                "episodes": len(members),
                "rewards_in": len(done),
                "complete": complete,
                "all_rewards_seconds": max(done) if complete else None,
                "spread_seconds": rounded(max(done) - min(done)) if done else None,
                "reward_mean": rounded(sum(rewards) / len(rewards), 6)
                if rewards and all(isinstance(r, (int, float)) for r in rewards)
                else None,
            }
        )
    return groups


def censored_pod_to_ready(rows: Sequence[dict], job: dict, pods: Sequence[dict]) -> dict:
    """pod_to_ready over every episode: one that never became ready counts as ready at the Job's
    deadline (Job start + activeDeadlineSeconds, minus its pod's creation), so a slow tail of
    failures raises the percentiles instead of vanishing from them."""
    start = parse_time((job.get("status") or {}).get("startTime")) or parse_time(
        job["metadata"].get("creationTimestamp")
    )
    deadline = (start or 0.0) + ((job.get("spec") or {}).get("activeDeadlineSeconds") or 0)
    created = {pod_name(p): parse_time(p["metadata"].get("creationTimestamp")) for p in pods}
    values, censored = [], 0
    for row in rows:
        if row["failure_class"] == CANCELLED:
            continue  # stopped by the Job once --need was met: never late, just not needed
        if row.get("pod_to_ready_seconds") is not None:
            values.append(row["pod_to_ready_seconds"])
            continue
        censored += 1
        pod_created = created.get(row["pod"]) if row["pod"] else None
        values.append(deadline - (pod_created if pod_created is not None else (start or 0.0)))
    return {
        "p50": rounded(percentile(values, 0.50)),
        "p95": rounded(percentile(values, 0.95)),
        "max": rounded(max(values)),
        "samples": len(values),
        "censored": censored,
        "censored_at": "the Job's deadline: startTime + activeDeadlineSeconds - the pod's creation "
        "(the Job's start for an episode without a pod)",
    }
