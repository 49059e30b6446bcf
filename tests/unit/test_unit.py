"""Unit tests of rl_batch_demo's pure functions, by equality against hand-worked values.

The expected manifests are written out literally from the guide's Job; the expected
figures of the synthetic batch are worked by hand in the comments next to them.
The one exception to "pure" is `test_worker_*`: the real episode program, run in
a bubblewrap sandbox that gives it the /workspace and /demo it hard-codes.
"""

from __future__ import annotations

import ast
import calendar
import copy
import csv
import dataclasses
import io
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Optional

import pytest

import prereqs
import all_names as demo
import rl_batch_demo
import sandbox
from conftest import discovered_bwrap, skip_or_fail
from rl_batch_demo import VerificationError

# The package the tests import (src/rl_batch_demo), not the single file generated from it.
PACKAGE_DIR = Path(rl_batch_demo.__file__).resolve().parent

NAMESPACE = "agc-rl-0123456789ab"
RUN_ID = "0123456789ab"

# The Job's creationTimestamp, worked out independently of parse_time.
T0 = calendar.timegm((2026, 11, 29, 20, 0, 0))
JOB_CREATED = "2026-11-29T20:00:00Z"


def stamp(seconds_after_t0: int) -> str:
    """A whole-second Kubernetes timestamp, `seconds_after_t0` after the Job's creation (< 60)."""
    return f"2026-11-29T20:00:{seconds_after_t0:02d}Z"


# --------------------------------------------------------------------------
# Builders of realistic API objects and worker logs.


def make_job(
    created: str = JOB_CREATED,
    end: str = "Complete",
    end_at: str = stamp(11),
    criteria_at: Optional[str] = stamp(11),
) -> dict:
    conditions = []
    if criteria_at is not None:
        conditions.append(
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": criteria_at}
        )
    conditions.append({"type": end, "status": "True", "lastTransitionTime": end_at})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "rollout",
            "namespace": NAMESPACE,
            "uid": "job-uid-1",
            "creationTimestamp": created,
        },
        "status": {"conditions": conditions, "succeeded": 3},
    }


def make_pod(
    name: str,
    created: str = stamp(1),
    phase: str = "Succeeded",
    node: str = "node-1",
    restart_count: int = 0,
    exit_code: Optional[int] = 0,
    started: str = stamp(2),
    finished: str = stamp(9),
    scheduled: Optional[str] = stamp(1),
    sandbox_ready: Optional[str] = stamp(2),
    image_id: str = "docker.io/library/python@sha256:1f2e3d",
) -> dict:
    """A pod as `kubectl get pods -o json` shows it once its episode has ended."""
    conditions = []
    if scheduled is not None:
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}
        )
    if sandbox_ready is not None:
        conditions.append(
            {
                "type": "PodReadyToStartContainers",
                "status": "True",
                "lastTransitionTime": sandbox_ready,
            }
        )
    state: dict[str, Any]
    if exit_code is None:
        state = {"running": {"startedAt": started}}
    else:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started,
                "finishedAt": finished,
                "containerID": f"containerd://{name}",
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "labels": {"app": "rl-batch-demo", "job-name": "rollout"},
        },
        "spec": {"nodeName": node, "runtimeClassName": "cube"},
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": "episode",
                    "restartCount": restart_count,
                    "ready": False,
                    "image": "python:3.12-alpine",
                    "imageID": image_id,
                    "state": state,
                }
            ],
        },
    }


def ready_event(episode_id: str, at: float, **fields: Any) -> dict:
    record = {
        "event": "ready",
        "at": at,
        "episode_id": episode_id,
        "imports_done_at": at - 0.25,
        "process_started_at": at - 1.0,
        "modules_before_ready": 34,
        "import_seconds": 0.75,
    }
    record.update(fields)
    return record


def reward_event(episode_id: str, at: float, **fields: Any) -> dict:
    record = {
        "event": "reward",
        "at": at,
        "episode_id": episode_id,
        "reward": 1,
        "baseline_exit": 1,
        "tests_exit": 0,
        "tests_output": "...\nRan 3 tests in 0.000s\n\nOK\n",
    }
    record.update(fields)
    return record


def log_text(*events: dict) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


POD_A, POD_B, POD_C = "rollout-4kq2m", "rollout-9vtzb", "rollout-p7x8s"


def valid_batch() -> tuple[dict, list[dict], dict[str, str]]:
    """Three honest episodes: (job, pods, logs)."""
    job = make_job()
    pods = [make_pod(POD_A), make_pod(POD_B, node="node-2"), make_pod(POD_C, created=stamp(2))]
    logs = {
        POD_A: log_text(ready_event(POD_A, T0 + 3.5), reward_event(POD_A, T0 + 8.0)),
        POD_B: log_text(ready_event(POD_B, T0 + 4.25), reward_event(POD_B, T0 + 8.5)),
        POD_C: log_text(ready_event(POD_C, T0 + 5.0), reward_event(POD_C, T0 + 9.75)),
    }
    return job, pods, logs


def pod_by_name(pods: list[dict], name: str) -> dict:
    return next(pod for pod in pods if pod["metadata"]["name"] == name)


# --------------------------------------------------------------------------
# Manifests (namespace, ConfigMap, Job, the hardened variant): written out literally.


def expected_job(count: int, parallelism: int) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "rollout", "namespace": NAMESPACE},
        "spec": {
            "completions": count,
            "parallelism": parallelism,
            "backoffLimit": 0,
            "activeDeadlineSeconds": 240,
            "template": {
                "metadata": {"labels": {"app": "rl-batch-demo"}},
                "spec": {
                    "runtimeClassName": "cube",
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "runAsNonRoot": True,
                    },
                    "containers": [
                        {
                            "name": "episode",
                            "image": "python:3.12-alpine",
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "-B", "/demo/episode.py"],
                            "env": [
                                {
                                    "name": "EPISODE_ID",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                }
                            ],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "64Mi"},
                                "limits": {"cpu": "500m", "memory": "128Mi"},
                            },
                            "volumeMounts": [
                                {"name": "demo", "mountPath": "/demo", "readOnly": True},
                                {"name": "workspace", "mountPath": "/workspace"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "demo", "configMap": {"name": "episode"}},
                        {"name": "workspace", "emptyDir": {}},
                    ],
                },
            },
        },
    }


@pytest.mark.parametrize("count, parallelism", [(10, 10), (10, 1)])
def test_job_manifest_is_the_guides_job_field_by_field(count: int, parallelism: int) -> None:
    manifest = demo.job_manifest(NAMESPACE, count, parallelism, "python:3.12-alpine", "cube")
    expected = expected_job(count, parallelism)
    # Field by field first, so a failure names the field; then the whole.
    assert (
        manifest["spec"]["template"]["spec"]["containers"]
        == expected["spec"]["template"]["spec"]["containers"]
    )
    assert manifest["spec"]["template"] == expected["spec"]["template"]
    assert manifest == expected


def test_job_manifest_uses_image_runtime_and_deadline_given() -> None:
    manifest = demo.job_manifest(NAMESPACE, 3, 2, "registry.local/py:3.13", "kata", 600)
    assert manifest["spec"]["activeDeadlineSeconds"] == 600
    assert manifest["spec"]["template"]["spec"]["runtimeClassName"] == "kata"
    assert (
        manifest["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/py:3.13"
    )
    assert (manifest["spec"]["completions"], manifest["spec"]["parallelism"]) == (3, 2)


def test_namespace_manifest_is_labelled_with_the_run_id() -> None:
    assert demo.namespace_manifest(NAMESPACE, RUN_ID) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"agc-demo-run": RUN_ID}},
    }


def test_configmap_manifest_ships_the_worker_as_episode_py() -> None:
    assert demo.configmap_manifest(NAMESPACE, demo.WORKER_SOURCE) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "episode", "namespace": NAMESPACE},
        "data": {"episode.py": demo.WORKER_SOURCE},
    }


def test_harden_adds_read_only_root_and_workspace_size_limit_and_nothing_else() -> None:
    manifest = demo.job_manifest(NAMESPACE, 10, 10, "python:3.12-alpine", "cube", harden=True)
    expected = expected_job(10, 10)
    pod_spec = expected["spec"]["template"]["spec"]
    pod_spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = True
    pod_spec["volumes"][1] = {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"}}
    assert manifest == expected


def test_harden_labels_the_namespace_for_pod_security_restricted() -> None:
    labels = demo.namespace_manifest(NAMESPACE, RUN_ID, harden=True)["metadata"]["labels"]
    assert labels["agc-demo-run"] == RUN_ID
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    modes = {
        key: value
        for key, value in labels.items()
        if key.startswith("pod-security.kubernetes.io/") and not key.endswith("-version")
    }
    assert set(modes.values()) == {"restricted"}


def test_network_policy_denies_all_ingress_and_egress() -> None:
    policy = demo.network_policy_manifest(NAMESPACE)
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["namespace"] == NAMESPACE
    # An empty selector picks every pod; both types with no rules allow nothing.
    assert policy["spec"]["podSelector"] == {}
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]


def test_indexed_mode_for_episode_scripts_adds_completion_index() -> None:
    manifest = demo.job_manifest(NAMESPACE, 10, 10, "python:3.12-alpine", "cube", indexed=True)
    assert manifest["spec"]["completionMode"] == "Indexed"
    env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0] == {
        "name": "EPISODE_ID",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    assert {
        "name": "EPISODE_INDEX",
        "valueFrom": {
            "fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            }
        },
    } in env
    # Everything else is the Part A Job.
    del manifest["spec"]["completionMode"]
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = env[:1]
    assert manifest == expected_job(10, 10)


def test_planned_objects_index_only_custom_scripts() -> None:
    settings = demo.Settings(
        count=4, parallelism=2, image="python:3.12-alpine", runtime="cube", timeout=240
    )
    builtin_job = demo.planned_objects(NAMESPACE, RUN_ID, settings, demo.WORKER_SOURCE)[-1]
    custom_job = demo.planned_objects(
        NAMESPACE, RUN_ID, dataclasses.replace(settings, builtin=False), "print()"
    )[-1]
    assert "completionMode" not in builtin_job["spec"]
    assert custom_job["spec"]["completionMode"] == "Indexed"


def test_the_plan_lists_every_object_in_creation_order_and_each_batch_job_by_name() -> None:
    settings = demo.Settings(
        count=4,
        parallelism=2,
        image="python:3.12-alpine",
        runtime="cube",
        timeout=240,
        harden=True,
        rounds=2,
        warmup=True,
    )
    plan = demo.plan_run(NAMESPACE, RUN_ID, settings, demo.WORKER_SOURCE)
    assert [(o["kind"], o["metadata"]["name"]) for o in plan.objects()] == [
        ("Namespace", NAMESPACE),
        ("NetworkPolicy", "deny-all"),
        ("ConfigMap", "episode"),
        ("Job", "rollout-warmup"),
        ("Job", "rollout-1"),
        ("Job", "rollout-2"),
    ]
    assert list(plan.jobs) == ["rollout-warmup", "rollout-1", "rollout-2"]
    assert plan.objects() == demo.planned_objects(NAMESPACE, RUN_ID, settings, demo.WORKER_SOURCE)


# --------------------------------------------------------------------------
# The receipt: saved whole at every change, and the one test of "is this namespace ours?".


def live_namespace(run_id: str, uid: str) -> dict:
    return {"metadata": {"name": NAMESPACE, "uid": uid, "labels": {"agc-demo-run": run_id}}}


def test_a_receipt_is_saved_at_every_change_with_the_guides_keys(tmp_path: Path) -> None:
    receipt = demo.Receipt.start(str(tmp_path), "kind-kind", NAMESPACE, RUN_ID)
    assert not (tmp_path / "receipt.json").exists()
    saved = lambda: json.loads((tmp_path / "receipt.json").read_text())  # noqa: E731
    receipt.save()
    assert saved() == {"context": "kind-kind", "namespace": NAMESPACE, "run_id": RUN_ID}
    # Each UID is on disk the moment it is recorded, not only once a later change saves it.
    receipt.record_namespace("ns-uid")
    assert saved()["namespace_uid"] == saved()["uid"] == "ns-uid"
    receipt.record_job("rollout-warmup", "warmup-uid")
    assert saved()["jobs"] == {"rollout-warmup": "warmup-uid"} and "job_uid" not in saved()
    receipt.record_job("rollout", "job-uid")
    assert saved() == {
        "context": "kind-kind",
        "namespace": NAMESPACE,
        "run_id": RUN_ID,
        "uid": "ns-uid",
        "namespace_uid": "ns-uid",
        "jobs": {"rollout-warmup": "warmup-uid", "rollout": "job-uid"},
        "job_uid": "job-uid",
    }
    assert sorted(path.name for path in tmp_path.iterdir()) == ["receipt.json"]  # no temporary left
    read = demo.Receipt.read(str(tmp_path))
    assert (read.context, read.namespace, read.run_id, read.namespace_uid) == (
        "kind-kind",
        NAMESPACE,
        RUN_ID,
        "ns-uid",
    )
    assert read.job_uids() == {"rollout-warmup": "warmup-uid", "rollout": "job-uid"}


def test_a_namespace_is_ours_by_the_run_label_and_once_recorded_by_its_uid(tmp_path: Path) -> None:
    receipt = demo.Receipt.start(str(tmp_path), "kind-kind", NAMESPACE, RUN_ID)
    assert receipt.owns_namespace(
        live_namespace(RUN_ID, "any-uid")
    )  # created, its UID not yet recorded
    assert not receipt.owns_namespace(live_namespace("fedcba987654", "any-uid"))
    assert not receipt.owns_namespace({"metadata": {"name": NAMESPACE, "uid": "any-uid"}})
    assert not receipt.owns_namespace(None)
    receipt.record_namespace("ns-uid")
    assert receipt.owns_namespace(live_namespace(RUN_ID, "ns-uid"))
    assert not receipt.owns_namespace(live_namespace(RUN_ID, "any-uid"))  # deleted and made again


def test_the_guides_receipt_proves_its_job_by_the_uid_in_job_json(tmp_path: Path) -> None:
    (tmp_path / "receipt.json").write_text(
        json.dumps(
            {"context": "kind-kind", "namespace": NAMESPACE, "run_id": RUN_ID, "uid": "ns-uid"}
        )
    )
    assert demo.Receipt.read(str(tmp_path)).job_uids() == {}
    (tmp_path / "job.json").write_text(json.dumps(make_job()))
    receipt = demo.Receipt.read(str(tmp_path))
    assert receipt.namespace_uid == "ns-uid"
    assert receipt.job_uids() == {"rollout": "job-uid-1"}


# --------------------------------------------------------------------------
# Percentiles: index (n-1)*q, linear between closest ranks, NumPy's default.


def test_percentile_of_one_sample_is_that_sample() -> None:
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        assert demo.percentile([4.2], q) == 4.2


def test_percentile_of_two_samples_interpolates() -> None:
    # n=2: index (2-1)*q = q, so p = a + q*(b-a).
    assert demo.percentile([2.0, 6.0], 0.50) == 4.0  # the midpoint
    assert demo.percentile([2.0, 6.0], 0.95) == pytest.approx(2.0 + 0.95 * 4.0, abs=1e-12)  # 5.8
    assert demo.percentile([2.0, 6.0], 0.95) == pytest.approx(5.8, abs=1e-12)


# Deliberately unsorted; sorted: 0.8 1.1 1.3 2.0 2.4 3.0 3.7 3.7 4.1 9.0 (sum 31.1).
TEN = [3.7, 0.8, 9.0, 2.4, 1.3, 3.7, 4.1, 1.1, 3.0, 2.0]


@pytest.mark.parametrize(
    "q, expected",
    [
        (0.0, 0.8),
        (0.50, 2.7),  # index 9*0.50 = 4.5  -> 2.4 + 0.5*(3.0-2.4)  = 2.7
        (0.90, 4.59),  # index 9*0.90 = 8.1  -> 4.1 + 0.1*(9.0-4.1)  = 4.59
        (
            0.95,
            6.795,
        ),  # index 9*0.95 = 8.55 -> 4.1 + 0.55*(9.0-4.1) = 6.795 (NumPy: np.percentile(x, 95) = 6.795)
        (0.99, 8.559),  # index 9*0.99 = 8.91 -> 4.1 + 0.91*(9.0-4.1) = 8.559
        (1.0, 9.0),
        (0.70, 3.7),  # index 6.3 between two equal values 3.7 and 3.7
    ],
)
def test_percentile_of_ten_unsorted_samples(q: float, expected: float) -> None:
    assert demo.percentile(TEN, q) == pytest.approx(expected, abs=1e-9)


def test_percentile_does_not_reorder_its_input_and_refuses_no_values() -> None:
    values = list(TEN)
    demo.percentile(values, 0.5)
    assert values == TEN
    with pytest.raises(ValueError):
        demo.percentile([], 0.5)


def test_describe_gives_rounded_percentiles_max_mean_and_counts() -> None:
    assert demo.describe(TEN, missing=1) == {
        "samples": 10,
        "missing": 1,
        "p50": 2.7,
        "p95": 6.795,
        "p99": 8.559,
        "max": 9.0,
        "mean": 3.11,
    }
    assert demo.describe([], missing=3) == {"samples": 0, "missing": 3}


# --------------------------------------------------------------------------
# Verification: every rule, each with an example that breaks it.


def assert_log_fails(pod: str, events: list[dict], message: str, builtin: bool = True) -> None:
    """A valid batch but for `pod`'s log, made of `events`, fails verification at that pod with `message`."""
    job, pods, logs = valid_batch()
    logs[pod] = log_text(*events)
    with pytest.raises(VerificationError, match=rf"pod {pod}: {message}"):
        demo.verify_batch(3, job, pods, logs, builtin=builtin)


def test_a_fully_valid_batch_passes_sorted_by_pod_name() -> None:
    job, pods, logs = valid_batch()
    episodes = demo.verify_batch(3, job, list(reversed(pods)), logs)
    assert [pod["metadata"]["name"] for pod, _, _ in episodes] == [POD_A, POD_B, POD_C]
    assert [(ready["event"], ready["at"]) for _, ready, _ in episodes] == [
        ("ready", T0 + 3.5),
        ("ready", T0 + 4.25),
        ("ready", T0 + 5.0),
    ]
    assert [reward["reward"] for _, _, reward in episodes] == [1, 1, 1]


def test_fewer_pods_than_the_count_fail() -> None:
    job, pods, logs = valid_batch()
    with pytest.raises(VerificationError, match=r"expected 3 pods .*found 2"):
        demo.verify_batch(3, job, pods[:2], logs)


def test_more_pods_than_the_count_fail() -> None:
    job, pods, logs = valid_batch()
    replacement = make_pod("rollout-zz9zz", created=stamp(3))
    logs["rollout-zz9zz"] = log_text(
        ready_event("rollout-zz9zz", T0 + 6.0), reward_event("rollout-zz9zz", T0 + 9.0)
    )
    with pytest.raises(VerificationError, match=r"expected 3 pods .*found 4"):
        demo.verify_batch(3, job, pods + [replacement], logs)


@pytest.mark.parametrize("phase", ["Failed", "Running", "Pending", "Unknown"])
def test_a_pod_not_succeeded_fails(phase: str) -> None:
    job, pods, logs = valid_batch()
    pod_by_name(pods, POD_B)["status"]["phase"] = phase
    with pytest.raises(VerificationError, match=rf"pod {POD_B}: phase is {phase}, not Succeeded"):
        demo.verify_batch(3, job, pods, logs)


@pytest.mark.parametrize(
    "events, event, found",
    [
        ([reward_event(POD_B, T0 + 8.5)], "ready", 0),
        (
            [
                ready_event(POD_B, T0 + 4.25),
                ready_event(POD_B, T0 + 4.5),
                reward_event(POD_B, T0 + 8.5),
            ],
            "ready",
            2,
        ),
        ([ready_event(POD_B, T0 + 4.25)], "reward", 0),
        (
            [
                ready_event(POD_B, T0 + 4.25),
                reward_event(POD_B, T0 + 8.5),
                reward_event(POD_B, T0 + 8.6),
            ],
            "reward",
            2,
        ),
    ],
)
def test_not_exactly_one_ready_or_reward_event_fails(
    events: list[dict], event: str, found: int
) -> None:
    assert_log_fails(POD_B, events, rf".*one {event} event, found {found}")


def test_an_empty_or_missing_log_fails() -> None:
    job, pods, logs = valid_batch()
    del logs[POD_C]
    with pytest.raises(VerificationError, match=rf"pod {POD_C}: .*one ready event, found 0"):
        demo.verify_batch(3, job, pods, logs)


def test_ready_episode_id_must_be_the_pod_name() -> None:
    assert_log_fails(
        POD_A,
        [ready_event(POD_B, T0 + 3.5), reward_event(POD_B, T0 + 8.0)],
        f"ready event has episode_id '{POD_B}'",
    )


def test_reward_episode_id_must_equal_the_ready_one() -> None:
    assert_log_fails(
        POD_A,
        [ready_event(POD_A, T0 + 3.5), reward_event("", T0 + 8.0)],
        "reward event has episode_id ''",
    )


@pytest.mark.parametrize(
    "reward, shown", [(0, "0"), (True, "True"), (0.5, "0.5"), ("1", "'1'"), (None, "None")]
)
def test_builtin_reward_must_be_the_integer_1(reward: Any, shown: str) -> None:
    assert_log_fails(
        POD_C,
        [ready_event(POD_C, T0 + 5.0), reward_event(POD_C, T0 + 9.75, reward=reward)],
        f"reward is {shown}, not 1",
    )


@pytest.mark.parametrize("tests_exit", [1, False, "0"])
def test_builtin_tests_exit_must_be_0(tests_exit: object) -> None:
    assert_log_fails(
        POD_C,
        [ready_event(POD_C, T0 + 5.0), reward_event(POD_C, T0 + 9.75, tests_exit=tests_exit)],
        f"tests_exit is {tests_exit!r}, not 0",
    )


@pytest.mark.parametrize("baseline", [0, None, True, "1"])
def test_builtin_baseline_must_have_failed(baseline: object) -> None:
    assert_log_fails(
        POD_C,
        [ready_event(POD_C, T0 + 5.0), reward_event(POD_C, T0 + 9.75, baseline_exit=baseline)],
        f"baseline_exit is {baseline!r}; the baseline must fail",
    )


def test_pod_created_before_its_job_is_out_of_order() -> None:
    job, pods, logs = valid_batch()
    pod_by_name(pods, POD_A)["metadata"]["creationTimestamp"] = "2026-11-29T19:59:59Z"
    with pytest.raises(VerificationError, match=rf"pod {POD_A}: times out of order"):
        demo.verify_batch(3, job, pods, logs)


def test_ready_before_pod_creation_is_out_of_order() -> None:
    # POD_C was created at T0+2; a ready at T0+1.5 cannot be its.
    assert_log_fails(
        POD_C, [ready_event(POD_C, T0 + 1.5), reward_event(POD_C, T0 + 9.75)], "times out of order"
    )


def test_reward_before_ready_is_out_of_order() -> None:
    assert_log_fails(
        POD_B, [ready_event(POD_B, T0 + 4.25), reward_event(POD_B, T0 + 4.0)], "times out of order"
    )


def test_equal_whole_second_times_are_in_order() -> None:
    # Job and pod created in the same second, ready at that very second: allowed (<=).
    job, pods, logs = valid_batch()
    pod_by_name(pods, POD_A)["metadata"]["creationTimestamp"] = JOB_CREATED
    logs[POD_A] = log_text(ready_event(POD_A, float(T0)), reward_event(POD_A, float(T0)))
    assert len(demo.verify_batch(3, job, pods, logs)) == 3


def test_a_restarted_container_fails() -> None:
    job, pods, logs = valid_batch()
    pod_by_name(pods, POD_B)["status"]["containerStatuses"][0]["restartCount"] = 1
    with pytest.raises(VerificationError, match=rf"pod {POD_B}: container restarted 1 time"):
        demo.verify_batch(3, job, pods, logs)


def test_a_container_exit_code_other_than_0_fails() -> None:
    job, pods, logs = valid_batch()
    pods[1] = make_pod(POD_B, node="node-2", exit_code=2)
    with pytest.raises(VerificationError, match=rf"pod {POD_B}: container exited 2, not 0"):
        demo.verify_batch(3, job, pods, logs)


def test_the_first_violation_is_reported_not_dropped() -> None:
    # Two bad episodes: the error names the first by pod name; nothing is returned.
    job, pods, logs = valid_batch()
    pod_by_name(pods, POD_C)["status"]["phase"] = "Failed"
    pod_by_name(pods, POD_B)["status"]["phase"] = "Failed"
    with pytest.raises(VerificationError, match=rf"pod {POD_B}: phase is Failed"):
        demo.verify_batch(3, job, pods, logs)


@pytest.mark.parametrize("reward", [0, 0.5, 1, -2])
def test_custom_script_rewards_may_be_any_number(reward: float) -> None:
    job, pods, logs = valid_batch()
    for name in logs:  # a custom script need not report baseline or tests exits
        ready_at = json.loads(logs[name].splitlines()[0])["at"]
        logs[name] = (
            "setting up\n"
            + json.dumps(ready_event(name, ready_at))
            + "\n"
            + json.dumps(
                {"event": "reward", "at": ready_at + 1.0, "episode_id": name, "reward": reward}
            )
            + "\n"
        )
    episodes = demo.verify_batch(3, job, pods, logs, builtin=False)
    assert [r["reward"] for _, _, r in episodes] == [reward] * 3


@pytest.mark.parametrize("reward, shown", [("high", "'high'"), (None, "None"), (True, "True")])
def test_custom_script_reward_must_be_a_number(reward: Any, shown: str) -> None:
    assert_log_fails(
        POD_A,
        [ready_event(POD_A, T0 + 3.5), reward_event(POD_A, T0 + 8.0, reward=reward)],
        f"reward is {shown}, not a number",
        builtin=False,
    )


def test_custom_script_still_checks_ids_and_order() -> None:
    assert_log_fails(
        POD_A,
        [ready_event(POD_A, T0 + 3.5), reward_event(POD_A, T0 + 3.0, reward=0)],
        "times out of order",
        builtin=False,
    )


# --------------------------------------------------------------------------
# Parsing.


def test_parse_events_keeps_only_json_events() -> None:
    ready = ready_event(POD_A, T0 + 3.5)
    reward = reward_event(POD_A, T0 + 8.0)
    lines = [
        "Collecting wheel...",  # plain text
        "",  # blank
        json.dumps(ready),
        "  " + json.dumps({"note": "no event"}),  # JSON, not an event
        json.dumps({"event": 5, "at": 1.0}),  # event name not a string
        json.dumps([{"event": "ready"}]),  # JSON, not an object
        '"ready"',  # JSON string
        '{"event": "reward", "at": 17',  # broken JSON
        "{not json at all}",
        "Traceback (most recent call last):",
        "   " + json.dumps(reward) + "   ",  # surrounding whitespace is fine
    ]
    assert demo.parse_events(lines) == [ready, reward]


def test_parse_events_of_nothing_is_nothing() -> None:
    assert demo.parse_events([]) == []
    assert demo.parse_events("".splitlines()) == []


BASE = calendar.timegm((2026, 11, 29, 20, 0, 1))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-11-29T20:00:01Z", BASE),
        ("2026-11-29T20:00:01z", BASE),
        ("2026-11-29T20:00:01+00:00", BASE),
        ("2026-11-29T21:00:01+01:00", BASE),
        ("2026-11-29T15:30:01-04:30", BASE),
        ("2026-11-29T21:00:01.25+01:00", BASE + 0.25),
        ("2026-11-30T00:00:00Z", calendar.timegm((2026, 11, 30, 0, 0, 0))),
    ],
)
def test_parse_time_whole_seconds_and_offsets(text: str, expected: float) -> None:
    assert demo.parse_time(text) == expected


@pytest.mark.parametrize("digits", range(1, 10))
def test_parse_time_fractions_of_1_to_9_digits(digits: int) -> None:
    fraction = "123456789"[:digits]
    parsed = demo.parse_time(f"2026-11-29T20:00:01.{fraction}Z")
    # Microsecond resolution: digits past the sixth are dropped, never rounded up a second.
    assert parsed == pytest.approx(BASE + int(fraction) / 10**digits, abs=1.5e-6)
    assert BASE <= parsed < BASE + 1


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "   ",
        "yesterday",
        "2026-13-01T00:00:00Z",
        "2026-11-29T25:00:00Z",
        "2026-11-29T20:00:01+25:00",
        "1795982401",
    ],
)
def test_parse_time_bad_input_is_none(text: Optional[str]) -> None:
    assert demo.parse_time(text) is None


STREAM_VALUES = [
    {
        "type": "ADDED",
        "object": {"kind": "Job", "metadata": {"name": "rollout"}, "status": {"active": 3}},
    },
    {
        "type": "MODIFIED",
        "object": {
            "kind": "Pod",
            "metadata": {
                "name": POD_A,
                "annotations": {"note": 'braces } { and "quotes" and \\ backslash, unicode \u00e9'},
            },
        },
    },
    {
        "type": "MODIFIED",
        "object": {
            "kind": "Job",
            "status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 3},
        },
    },
]
# What `kubectl get -w -o json` prints: pretty-printed values one after another.
STREAM_TEXT = "".join(json.dumps(value, indent=4) + "\n" for value in STREAM_VALUES)


def test_iter_json_stream_whole_text() -> None:
    assert list(demo.iter_json_stream([STREAM_TEXT])) == STREAM_VALUES


def test_iter_json_stream_split_at_every_point() -> None:
    quote_inside = STREAM_TEXT.index("braces }") + 3  # a split inside a string
    assert (
        list(demo.iter_json_stream([STREAM_TEXT[:quote_inside], STREAM_TEXT[quote_inside:]]))
        == STREAM_VALUES
    )
    for split in range(len(STREAM_TEXT) + 1):
        chunks = [STREAM_TEXT[:split], STREAM_TEXT[split:]]
        assert list(demo.iter_json_stream(chunks)) == STREAM_VALUES, f"split at {split}"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_iter_json_stream_in_small_chunks(size: int) -> None:
    chunks = [STREAM_TEXT[i : i + size] for i in range(0, len(STREAM_TEXT), size)]
    assert list(demo.iter_json_stream(iter(chunks))) == STREAM_VALUES


def test_iter_json_stream_yields_each_value_as_soon_as_it_is_complete() -> None:
    first = json.dumps(STREAM_VALUES[0], indent=4) + "\n"
    stream = demo.iter_json_stream(iter([first, '{\n  "type": "MOD']))
    assert next(stream) == STREAM_VALUES[0]
    assert list(stream) == []  # an unfinished value is not invented


# --------------------------------------------------------------------------
# Summaries of a synthetic 3-pod batch, hand-computed.
#
#                    created sched.    sandbox start proc.  imports ready  reward  finished node
#   POD_A 4kq2m      +1      +1.25 ev  +2      +2    +2.5   +3.25   +3.5   +8.0    +9       node-1
#   POD_B 9vtzb      +1      +1.5  ev  +3      +3    +3.0   +4.0    +4.25  +8.5    +9       node-2
#   POD_C p7x8s      +2      +2 cond   -       +3    +3.5   +4.5    +5.0   +9.75   +10      node-1
#
# (ev = the scheduler's Scheduled event, microseconds; cond = PodScheduled condition,
# whole seconds; POD_C has no PodReadyToStartContainers condition.)


def synthetic_batch() -> tuple[dict, list[dict], dict[str, str], list[dict]]:
    job = make_job(end_at=stamp(11), criteria_at=stamp(11))
    pods = [
        make_pod(
            POD_A,
            created=stamp(1),
            scheduled=stamp(1),
            sandbox_ready=stamp(2),
            started=stamp(2),
            finished=stamp(9),
            node="node-1",
            image_id="docker.io/library/python@sha256:aaa",
        ),
        make_pod(
            POD_B,
            created=stamp(1),
            scheduled=stamp(2),
            sandbox_ready=stamp(3),
            started=stamp(3),
            finished=stamp(9),
            node="node-2",
            image_id="docker.io/library/python@sha256:bbb",
        ),
        make_pod(
            POD_C,
            created=stamp(2),
            scheduled=stamp(2),
            sandbox_ready=None,
            started=stamp(3),
            finished=stamp(10),
            node="node-1",
            image_id="docker.io/library/python@sha256:aaa",
        ),
    ]
    logs = {
        POD_A: log_text(
            ready_event(POD_A, T0 + 3.5, imports_done_at=T0 + 3.25, process_started_at=T0 + 2.5),
            reward_event(POD_A, T0 + 8.0),
        ),
        POD_B: log_text(
            ready_event(POD_B, T0 + 4.25, imports_done_at=T0 + 4.0, process_started_at=T0 + 3.0),
            reward_event(POD_B, T0 + 8.5),
        ),
        POD_C: "Python 3.12 starting\n"
        + log_text(
            ready_event(POD_C, T0 + 5.0, imports_done_at=T0 + 4.5, process_started_at=T0 + 3.5),
            reward_event(POD_C, T0 + 9.75),
        ),
    }

    def event(reason: str, kind: str, pod: str, event_type: str = "Normal", **extra: Any) -> dict:
        return dict(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "reason": reason,
                "type": event_type,
                "involvedObject": {"kind": kind, "name": pod, "namespace": NAMESPACE},
                "metadata": {"name": f"{pod}.{reason}", "namespace": NAMESPACE},
            },
            **extra,
        )

    events = [
        event("Scheduled", "Pod", POD_A, eventTime="2026-11-29T20:00:01.250000Z", count=None),
        event("Scheduled", "Pod", POD_B, eventTime="2026-11-29T20:00:01.500000Z", count=None),
        event("SuccessfulCreate", "Job", "rollout", count=3),
        event("Pulled", "Pod", POD_C, count=1),  # no message: which it was is unknown
        event(
            "Pulled",
            "Pod",
            POD_A,
            message='Container image "python:3.12-alpine" already present on machine',
        ),
        event(
            "Pulled",
            "Pod",
            POD_B,
            message='Successfully pulled image "python:3.12-alpine" in 2.1s '
            "(2.1s including waiting). Image size: 19203584 bytes.",
        ),
        event("FailedScheduling", "Pod", POD_C, event_type="Warning", count=2),
        event("FailedScheduling", "Pod", POD_C, event_type="Warning"),
        event("BackOff", "Pod", POD_B, event_type="Warning", count=1),
        event("FailedScheduling", "Pod", POD_B, event_type="Warning", count=1),
    ]
    return job, pods, logs, demo.event_records(events)


ROW_FIELDS = [
    "pod",
    "node",
    "image_id",
    "reward",
    "pod_to_ready_seconds",
    "batch_to_ready_seconds",
    "batch_to_reward_seconds",
]


def test_summarise_batch_rows_are_exactly_the_spec_fields_hand_computed() -> None:
    job, pods, logs, events = synthetic_batch()
    summary = demo.summarise_batch(job, pods, logs, events, 3)
    assert [list(row) for row in summary.figures["pods"]] == [ROW_FIELDS] * 3
    assert summary.figures["pods"] == [
        {
            "pod": POD_A,
            "node": "node-1",
            "image_id": "docker.io/library/python@sha256:aaa",
            "reward": 1,
            "pod_to_ready_seconds": 2.5,
            "batch_to_ready_seconds": 3.5,
            "batch_to_reward_seconds": 8.0,
        },
        {
            "pod": POD_B,
            "node": "node-2",
            "image_id": "docker.io/library/python@sha256:bbb",
            "reward": 1,
            "pod_to_ready_seconds": 3.25,
            "batch_to_ready_seconds": 4.25,
            "batch_to_reward_seconds": 8.5,
        },
        {
            "pod": POD_C,
            "node": "node-1",
            "image_id": "docker.io/library/python@sha256:aaa",
            "reward": 1,
            "pod_to_ready_seconds": 3.0,
            "batch_to_ready_seconds": 5.0,
            "batch_to_reward_seconds": 9.75,
        },
    ]


def test_summarise_batch_headline_figures() -> None:
    job, pods, logs, events = synthetic_batch()
    summary = demo.summarise_batch(job, pods, logs, events, 3)
    # pod_to_ready sorted: 2.5 3.0 3.25; p50 = 3.0; p95 index 1.9 -> 3.0 + 0.9*0.25 = 3.225.
    assert {
        key: summary.figures[key]
        for key in (
            "episodes",
            "successful_episodes",
            "reward_sum",
            "batch_to_all_ready_seconds",
            "batch_to_all_rewards_seconds",
            "pod_to_ready_p50_seconds",
            "pod_to_ready_p95_seconds",
            "pod_to_ready_max_seconds",
        )
    } == {
        "episodes": 3,
        "successful_episodes": 3,
        "reward_sum": 3,
        "batch_to_all_ready_seconds": 5.0,
        "batch_to_all_rewards_seconds": 9.75,
        "pod_to_ready_p50_seconds": 3.0,
        "pod_to_ready_p95_seconds": 3.225,
        "pod_to_ready_max_seconds": 3.25,
    }


def test_summarise_batch_refuses_a_dishonest_batch() -> None:
    job, pods, logs, events = synthetic_batch()
    logs[POD_B] = log_text(ready_event(POD_B, T0 + 4.25), reward_event(POD_B, T0 + 8.5, reward=0))
    with pytest.raises(VerificationError, match=rf"pod {POD_B}: reward is 0"):
        demo.summarise_batch(job, pods, logs, events, 3)


def test_phases_with_precision_and_missing_counts() -> None:
    job, pods, logs, events = synthetic_batch()
    phases = demo.summarise_batch(job, pods, logs, events, 3).figures["phases"]

    def figures(name: str) -> dict:
        return {
            k: phases[name][k] for k in ("samples", "missing", "p50", "max", "precision_seconds")
        }

    # A phase's precision is the sum of its ends' (the interval of a difference); the table's
    # precision is the largest of its episodes'.
    # scheduling = scheduled - created: A 0.25, B 0.5 (events), C 0.0 (both whole-second conditions).
    assert figures("scheduling") == {
        "samples": 3,
        "missing": 0,
        "p50": 0.25,
        "max": 0.5,
        "precision_seconds": 2.0,
    }
    assert phases["scheduling"]["p95"] == 0.475  # index 1.9 -> 0.25 + 0.9*0.25
    # With no kubelet event and no watch, PodReadyToStartContainers (stamped when the kubelet
    # reported it) only bounds the sandbox from above: A is in [scheduled 1.25, 3), read at
    # its stamp 2 -> 0.75; B in [1.5, 4), read at 3 -> 1.5; C has no condition: missing.
    assert figures("sandbox_creation") == {
        "samples": 2,
        "missing": 1,
        "p50": 1.125,
        "max": 1.5,
        "precision_seconds": 2.500001,
    }
    # container_start = process start (/proc ticks) - sandbox ready: A 0.5, B 0.0; C missing.
    assert figures("container_start") == {
        "samples": 2,
        "missing": 1,
        "p50": 0.25,
        "max": 0.5,
        "precision_seconds": 2.51,
    }
    # python_imports = imports done - process start: A 0.75, B 1.0, C 1.0; /proc ticks (10 ms).
    assert figures("python_imports") == {
        "samples": 3,
        "missing": 0,
        "p50": 1.0,
        "max": 1.0,
        "precision_seconds": 0.010001,
    }
    # imports_done_to_ready: A 0.25, B 0.25, C 0.5; both worker clocks (microseconds).
    assert figures("imports_done_to_ready") == {
        "samples": 3,
        "missing": 0,
        "p50": 0.25,
        "max": 0.5,
        "precision_seconds": 2e-6,
    }
    # episode_work = reward - ready: A 4.5, B 4.25, C 4.75.
    assert figures("episode_work") == {
        "samples": 3,
        "missing": 0,
        "p50": 4.5,
        "max": 4.75,
        "precision_seconds": 2e-6,
    }
    # container_exit = finishedAt - reward: A 1.0, B 0.5, C 0.25.
    assert figures("container_exit") == {
        "samples": 3,
        "missing": 0,
        "p50": 0.5,
        "max": 1.0,
        "precision_seconds": 1.000001,
    }
    assert figures("pod_to_ready") == {
        "samples": 3,
        "missing": 0,
        "p50": 3.0,
        "max": 3.25,
        "precision_seconds": 1.000001,
    }
    assert figures("pod_to_reward") == {
        "samples": 3,
        "missing": 0,
        "p50": 7.5,
        "max": 7.75,
        "precision_seconds": 1.000001,
    }


def test_phases_without_sandbox_condition_anywhere_are_all_missing() -> None:
    job, pods, logs, events = synthetic_batch()
    for pod in pods:
        pod["status"]["conditions"] = [
            c for c in pod["status"]["conditions"] if c["type"] != "PodReadyToStartContainers"
        ]
    phases = demo.summarise_batch(job, pods, logs, events, 3).figures["phases"]
    assert phases["sandbox_creation"]["samples"] == 0
    assert phases["sandbox_creation"]["missing"] == 3
    assert phases["sandbox_creation"]["precision_seconds"] is None
    assert "p50" not in phases["sandbox_creation"]
    assert (
        phases["sandbox_creation"]["why_missing"]
        == "no episode had both scheduled and sandbox_ready"
    )
    assert phases["container_start"]["missing"] == 3


def test_completion_gap_hand_computed() -> None:
    job, pods, logs, events = synthetic_batch()
    job["status"]["conditions"][0]["lastTransitionTime"] = stamp(10)  # SuccessCriteriaMet
    gap = demo.completion_gap(job, pods, last_reward_at=T0 + 9.75, client_observed_at=T0 + 12.5)
    # last finished +10; criteria +10; Complete +11; client +12.5.
    assert {k: v for k, v in gap.items() if k != "note"} == {
        "last_reward_to_last_container_finished_seconds": 0.25,
        "last_container_finished_to_success_criteria_met_seconds": 0.0,
        "last_container_finished_to_job_complete_seconds": 1.0,
        "job_complete_to_client_observed_seconds": 1.5,
        "last_reward_to_client_observed_seconds": 2.75,
        "precision_seconds": 1.0,
        # Each whole-second end may lie anywhere in its second.
        "bounds_seconds": {
            "last_reward_to_last_container_finished_seconds": [0.25, 1.25],
            "last_container_finished_to_success_criteria_met_seconds": [0.0, 1.0],
            "last_container_finished_to_job_complete_seconds": [0.0, 2.0],
            "job_complete_to_client_observed_seconds": [0.5, 1.5],
            "last_reward_to_client_observed_seconds": [2.75, 2.75],
        },
    }


def test_completion_gap_whose_sign_its_precision_cannot_settle_is_never_negative() -> None:
    # The last reward at +10.68; its container's finishedAt names second +10: it finished
    # between 10.68 and 11, which the two stamps' difference (-0.68) reads as a bug.
    job, pods, _, _ = synthetic_batch()
    gap = demo.completion_gap(job, pods, last_reward_at=T0 + 10.68, client_observed_at=T0 + 12.5)
    assert gap["bounds_seconds"]["last_reward_to_last_container_finished_seconds"] == [0.0, 0.32]
    assert (
        gap["last_reward_to_last_container_finished_seconds"] == 0.0
    )  # read as finished no earlier than the reward
    assert gap["last_container_finished_to_job_complete_seconds"] == 0.32  # the Job stamped +11
    assert gap["job_complete_to_client_observed_seconds"] == 1.5
    assert all(
        value >= 0
        for key, value in gap.items()
        if key.endswith("_seconds") and isinstance(value, float)
    )


def test_completion_gap_without_client_or_success_criteria() -> None:
    job, pods, _, _ = synthetic_batch()
    job = make_job(end_at=stamp(12), criteria_at=None)
    gap = demo.completion_gap(job, pods, last_reward_at=T0 + 9.75, client_observed_at=None)
    assert gap["last_container_finished_to_success_criteria_met_seconds"] is None
    assert gap["last_container_finished_to_job_complete_seconds"] == 2.0
    assert gap["job_complete_to_client_observed_seconds"] is None
    assert gap["last_reward_to_client_observed_seconds"] is None


def test_node_distribution_counts_pods_per_node() -> None:
    _, pods, _, _ = synthetic_batch()
    unscheduled = make_pod("rollout-xxxxx")
    del unscheduled["spec"]["nodeName"]
    assert demo.node_distribution(pods + [unscheduled]) == {
        "(unscheduled)": 1,
        "node-1": 2,
        "node-2": 1,
    }


def test_warning_summary_counts_per_reason_and_names_objects() -> None:
    _, _, _, events = synthetic_batch()
    assert demo.warning_summary(events) == {
        # count 2 + a count-less event (1) + count 1
        "FailedScheduling": {"count": 4, "objects": [f"Pod/{POD_C}", f"Pod/{POD_B}"]},
        "BackOff": {"count": 1, "objects": [f"Pod/{POD_B}"]},
    }


def test_scheduled_event_times_only_from_pod_scheduled_events() -> None:
    _, _, _, events = synthetic_batch()
    assert demo.scheduled_event_times(events) == {POD_A: BASE + 0.25, POD_B: BASE + 0.5}


EXPECTED_CSV_HEADER = ",".join(
    ["batch", "pod", "node", "reward", "image_cache", "runtime_class"]
    + [f"{point}_after_job_seconds" for point in demo.POINTS]
    + [f"{point}_precision_seconds" for point in demo.POINTS]
    + [f"{phase}_seconds" for phase in demo.PHASES]
    + [f"{point}_at" for point in demo.POINTS]
    + [f"{point}_source" for point in demo.POINTS]
    + [f"{point}_clock" for point in demo.POINTS]
    + [f"{phase}_precision_seconds" for phase in demo.PHASES]
    + ["image", "image_pull_waiting_seconds", "image_pull_kubelet_seconds", "image_size_bytes"]
    # Added last, after every column older files had: the task and the outcome.
    + ["task_id", "failure_class", "failure", "valid"]
)


def test_episodes_csv_has_an_index_column_only_for_an_indexed_job() -> None:
    job, pods, logs, events = synthetic_batch()
    default = demo.summarise_batch(job, pods, logs, events, 3)
    assert "index" not in next(csv.reader(io.StringIO(demo.episodes_csv([("rollout", default)]))))
    for position, pod in enumerate(pods):
        pod["metadata"].setdefault("annotations", {})[demo.COMPLETION_INDEX_ANNOTATION] = str(
            position
        )
    indexed = demo.summarise_batch(job, pods, logs, events, 3)
    rows = list(csv.DictReader(io.StringIO(demo.episodes_csv([("rollout", indexed)]))))
    assert sorted(row["index"] for row in rows) == ["0", "1", "2"]
    assert {row["pod"]: row["index"] for row in rows} == {
        record["pod"]: record["index"] for record in indexed.episodes
    }


def test_episodes_csv_header_and_rows() -> None:
    job, pods, logs, events = synthetic_batch()
    summary = demo.summarise_batch(job, pods, logs, events, 3)
    lines = demo.episodes_csv([("rollout", summary)]).splitlines()
    assert lines[0] == EXPECTED_CSV_HEADER
    assert lines[1:] == [
        "rollout,rollout-4kq2m,node-1,1,present,cube,"
        "1.000000,1.250000,2.000000,2.000000,2.500000,3.250000,3.500000,8.000000,9.000000,"
        "1,1e-06,1.75,1,0.01,1e-06,1e-06,1e-06,1,"
        "0.250000,0.750000,0.500000,0.750000,0.250000,4.500000,1.000000,2.500000,7.000000,,"
        "1795982401.000000,1795982401.250000,1795982402.000000,1795982402.000000,1795982402.500000,"
        "1795982403.250000,1795982403.500000,1795982408.000000,1795982409.000000,"
        'Pod creationTimestamp,Scheduled event eventTime,"PodReadyToStartContainers condition,'
        ' after Scheduled eventTime",container startedAt,'
        "worker /proc start time,worker imports_done_at,worker ready event,worker reward event,"
        "container finishedAt,"
        "control plane,control plane,node,node,node,node,node,node,node,"
        "1,1.75,1.76,0.010001,2e-06,2e-06,1,1,1,,"
        # The kubelet's Pulled message: present, no pull, no wait.
        ",0.000000,0.000000,"
        ",,,,true",
        "rollout,rollout-9vtzb,node-2,1,pulled,cube,"
        "1.000000,1.500000,3.000000,3.000000,3.000000,4.000000,4.250000,8.500000,9.000000,"
        "1,1e-06,2.5,1,0.01,1e-06,1e-06,1e-06,1,"
        "0.500000,1.500000,0.000000,1.000000,0.250000,4.250000,0.500000,3.250000,7.500000,,"
        "1795982401.000000,1795982401.500000,1795982403.000000,1795982403.000000,1795982403.000000,"
        "1795982404.000000,1795982404.250000,1795982408.500000,1795982409.000000,"
        'Pod creationTimestamp,Scheduled event eventTime,"PodReadyToStartContainers condition,'
        ' after Scheduled eventTime",container startedAt,'
        "worker /proc start time,worker imports_done_at,worker ready event,worker reward event,"
        "container finishedAt,"
        "control plane,control plane,node,node,node,node,node,node,node,"
        "1,2.5,2.51,0.010001,2e-06,2e-06,1,1,1,,"
        # Pulled in 2.1s (2.1s including waiting): no wait; its size.
        ",0.000000,2.100000,19203584"
        ",,,,true",
        # No sandbox condition and no kubelet event: empty cells; scheduled from the whole-second condition.
        "rollout,rollout-p7x8s,node-1,1,,cube,"
        "2.000000,2.000000,,3.000000,3.500000,4.500000,5.000000,9.750000,10.000000,"
        "1,1,,1,0.01,1e-06,1e-06,1e-06,1,"
        "0.000000,,,1.000000,0.500000,4.750000,0.250000,3.000000,7.750000,,"
        "1795982402.000000,1795982402.000000,,1795982403.000000,1795982403.500000,1795982404.500000,"
        "1795982405.000000,1795982409.750000,1795982410.000000,"
        "Pod creationTimestamp,PodScheduled condition,,container startedAt,"
        "worker /proc start time,worker imports_done_at,worker ready event,worker reward event,"
        "container finishedAt,"
        "control plane,control plane,,node,node,node,node,node,node,"
        "2,,,0.010001,2e-06,2e-06,1,1,1,,"
        ",,,"
        ",,,,true",
    ]


SVG = "{http://www.w3.org/2000/svg}"


def test_timeline_svg_is_xml_with_one_row_per_episode_and_a_legend() -> None:
    job, pods, logs, events = synthetic_batch()
    summary = demo.summarise_batch(job, pods, logs, events, 3)
    text = demo.timeline_svg([("rollout", summary)], "3 episodes <cube> & friends")
    root = ElementTree.fromstring(text)
    assert root.tag == f"{SVG}svg"
    texts = ["".join(element.itertext()) for element in root.iter(f"{SVG}text")]
    assert "3 episodes <cube> & friends" in texts
    for phase in (
        "scheduling",
        "sandbox creation",
        "container start",
        "python imports",
        "imports done to ready",
        "episode work",
        "container exit",
    ):
        assert phase in texts, f"legend lacks {phase}"
    for pod in (POD_A, POD_B, POD_C):
        assert texts.count(pod) == 1, f"one row label for {pod}"
    bars = [rect for rect in root.iter(f"{SVG}rect") if rect.find(f"{SVG}title") is not None]
    rows = {}
    for bar in bars:
        pod, phase = bar.find(f"{SVG}title").text.split(":")[0].split(" ")
        rows.setdefault(pod, set()).add((phase, bar.get("y")))
    assert sorted(rows) == [POD_A, POD_B, POD_C]
    assert len({y for bars_of_pod in rows.values() for _, y in bars_of_pod}) == 3  # one row each
    for pod in rows:
        assert len({y for _, y in rows[pod]}) == 1
    # Zero-length phases (POD_B's container_start, POD_C's scheduling) and phases with a
    # missing point (POD_C has no sandbox_ready) draw no bar.
    assert {phase for phase, _ in rows[POD_A]} == set(demo.PHASE_COLOURS)
    assert {phase for phase, _ in rows[POD_B]} == set(demo.PHASE_COLOURS) - {"container_start"}
    assert {phase for phase, _ in rows[POD_C]} == set(demo.PHASE_COLOURS) - {
        "scheduling",
        "sandbox_creation",
        "container_start",
    }
    titles = {bar.find(f"{SVG}title").text for bar in bars}
    assert f"{POD_C} episode_work: 4.750 s" in titles


def timeline_record(pod: str, index: int | str, **moments: float) -> dict:
    """An episode's record for the timeline: its points at these moments, the rest unknown."""
    points = {point: None for point in demo.POINTS}
    points.update({name: demo.Point(at, 0.01, "test", "node") for name, at in moments.items()})
    return {"pod": pod, "points": points, "phases": demo.phase_durations(points), "index": index}


def test_timeline_rows_are_named_by_task_and_group_when_the_run_has_tasks() -> None:
    records = [
        timeline_record(f"rollout-{index}-abcde", index, pod_created=100.5 + index, ready=103.0)
        for index in range(4)
    ]
    records[1]["index"] = "1"  # a succeeded episode's index, as episodes.csv holds it
    summary = demo.BatchSummary(figures={}, episodes=records, job_created=100.0, origin=100.0)
    long_task = "django__django-11099-with-a-very-long-suffix"
    root = ElementTree.fromstring(
        demo.timeline_svg([("rollout", summary)], "4 episodes", ("sympy-7", long_task), 2)
    )
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("text-anchor") == "end"]
    assert labels[:2] == ["sympy-7 g0.0", "sympy-7 g0.1"]
    # A long task id keeps its start and its end, and the row's group and place in it.
    assert labels[2] == "django__dj\u2026ong-suffix g1.0" and len(labels[2]) == 26
    assert labels[3].endswith(" g1.1")
    # The pod is named in the row's tooltip; without tasks the row is named by its pod.
    assert [g.findtext(f"{SVG}title") for g in root.iter(f"{SVG}g")][:1] == ["rollout-0-abcde"]
    assert demo.episode_label(records[0], None, 1) == "rollout-0-abcde"


def test_a_hung_episodes_running_time_is_drawn_up_to_its_end() -> None:
    # Ready at 103, no reward, its container killed by its deadline at 112.
    hung = timeline_record(
        "rollout-0-hung",
        0,
        pod_created=100.5,
        scheduled=101.0,
        ready=103.0,
        container_finished=112.0,
    )
    hung.update(failure_class="episode", failure="past its --episode-timeout")
    done = timeline_record(
        "rollout-1-done", 1, pod_created=100.5, ready=103.0, reward=104.0, container_finished=104.5
    )
    summary = demo.BatchSummary(
        figures={}, episodes=[done], failed=[hung], job_created=100.0, origin=100.0
    )
    root = ElementTree.fromstring(demo.timeline_svg([("rollout", summary)], "2 episodes"))
    unrewarded = [r for r in root.iter(f"{SVG}rect") if r.get("fill") == "url(#unrewarded)"]
    (bar,) = [r for r in unrewarded if r.find(f"{SVG}title") is not None]
    assert bar.findtext(f"{SVG}title") == "rollout-0-hung ran with no reward: 9.000 s"
    start, end = float(bar.get("x")), float(bar.get("x")) + float(bar.get("width"))
    assert axis_seconds(root, start) == pytest.approx(3.0, abs=0.05)
    assert axis_seconds(root, end) == pytest.approx(12.0, abs=0.05)
    legend = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert demo.UNREWARDED_MEANING in legend


def axis_seconds(root: ElementTree.Element, x: float) -> float:
    """Where `x` (px) falls on a picture's time axis, read from its tick labels (the numbers
    centred under the axis)."""
    ticks = sorted(
        (float(t.get("x")), float(t.text))
        for t in root.iter(f"{SVG}text")
        if t.get("text-anchor") == "middle" and (t.text or "").replace(".", "", 1).isdigit()
    )
    (x0, t0), (x1, t1) = ticks[0], ticks[1]
    return t0 + (x - x0) * (t1 - t0) / (x1 - x0)


def test_ramp_and_timeline_share_one_time_origin_and_say_which() -> None:
    # The Job's stamp names second 100; it was truly created at 100.45 at the earliest, and its
    # pod at 100.8: both pictures put the pod at 0.8 s, as episodes.csv and results.json count.
    points = {point: None for point in demo.POINTS}
    points.update(
        pod_created=demo.Point(100.8, 0.01, "test", "control plane"),
        scheduled=demo.Point(101.0, 0.01, "test", "control plane"),
        ready=demo.Point(102.0, 0.01, "test", "node"),
        reward=demo.Point(103.0, 0.01, "test", "node"),
    )
    record = {
        "pod": "rollout-abcde",
        "points": points,
        "phases": demo.phase_durations(points),
        "index": None,
    }
    summary = demo.BatchSummary(figures={}, episodes=[record], job_created=100.0, origin=100.45)
    figures = {
        "pods_created_per_second": 1,
        "sandboxes_ready_per_second_mean": None,
        "sandboxes_ready_per_second_peak": None,
        "max_episodes_running_at_once": 1,
    }
    timeline = ElementTree.fromstring(demo.timeline_svg([("rollout", summary)], "1 episode"))
    ramp = ElementTree.fromstring(demo.ramp_svg([("rollout", summary)], "1 episode", figures))
    [scheduling] = [
        rect
        for rect in timeline.iter(f"{SVG}rect")
        if (rect.findtext(f"{SVG}title") or "").startswith("rollout-abcde scheduling")
    ]
    assert axis_seconds(timeline, float(scheduling.get("x"))) == pytest.approx(0.8, abs=0.01)
    created_line = next(
        path
        for path in ramp.iter(f"{SVG}path")
        if path.findtext(f"{SVG}title") == "pod_created: 1 episode"
    )
    first_x = float(created_line.get("d")[1:].split(",")[0])
    assert axis_seconds(ramp, first_x) == pytest.approx(0.8, abs=0.01)
    for picture in (timeline, ramp):
        assert demo.TIME_AXIS in ["".join(t.itertext()) for t in picture.iter(f"{SVG}text")]
    assert "creationTimestamp" in demo.TIME_AXIS and "episodes.csv" in demo.TIME_AXIS
    # The true creation, at the earliest, is marked on the timeline where it was.
    [marker] = [line for line in timeline.iter(f"{SVG}line") if line.findtext(f"{SVG}title")]
    assert axis_seconds(timeline, float(marker.get("x1"))) == pytest.approx(0.45, abs=0.01)


def compare_rows(table: str) -> dict[str, list[str]]:
    """A compare table's rows below its header: {metric: [A, B, B/A]}."""
    return {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:]}


def test_compare_table_shows_what_each_run_was() -> None:
    first = {
        "episodes": 2,
        "image": "python:3.12-alpine",
        "runtime": "cube",
        "cache_state": "warmed",
        "harden": False,
        "episode_script_sha256": None,
        "image_cache": {"present": 2, "pulled": 0},
    }
    second = {
        "episodes": 2,
        "image": "python:3.12-alpine",
        "runtime": "kata",
        "cache_state": "uncontrolled",
        "harden": True,
        "episode_script_sha256": "ab" * 32,
        "image_cache": {"present": 0, "pulled": 2},
    }
    second.update(context="kind-kind", failed_episodes=1, accepted_partial=True)
    first["context"] = "gke-prod"
    rows = compare_rows(demo.compare_table(first, second, "A", "B"))
    assert rows["context"] == ["gke-prod", "kind-kind", "differ"]
    assert rows["failed_episodes"] == [
        "0",
        "1",
        "-",
    ]  # A has results only because every episode passed
    assert rows["image"] == ["python:3.12-alpine", "python:3.12-alpine", "same"]
    assert rows["runtime"] == ["cube", "kata", "differ"]
    assert rows["cache_state"] == ["warmed", "uncontrolled", "differ"]
    assert rows["harden"] == ["False", "True", "differ"]
    assert rows["episode_script_sha256"] == ["-", "ab" * 6, "differ"]
    assert rows["image_present_episodes"] == ["2", "0", "0.00"]
    assert rows["image_pulled_episodes"] == ["0", "2", "-"]


# The guide's 10-way parallel run (A), the same batch at parallelism 1 (B), and what
# `compare` shows of them.
GUIDE_PARALLEL = {
    "episodes": 10,
    "parallelism": 10,
    "reward_sum": 10,
    "batch_to_all_ready_seconds": 3.7,
    "batch_to_all_rewards_seconds": 8.4,
    "client_job_complete_seconds": 12.7,
    "pod_to_ready_p50_seconds": 3.7,
    "pod_to_ready_p95_seconds": 3.7,
    "pod_to_ready_max_seconds": 3.8,
}
GUIDE_SERIAL = dict(
    GUIDE_PARALLEL,
    parallelism=1,
    batch_to_all_ready_seconds=93.1,
    batch_to_all_rewards_seconds=97.6,
    client_job_complete_seconds=101.6,
    pod_to_ready_p50_seconds=3.6,
    pod_to_ready_p95_seconds=3.8,
    pod_to_ready_max_seconds=3.9,
)
GUIDE_COMPARE_HEADER = ["metric", "A:", "parallel", "B:", "serial", "B/A"]
GUIDE_COMPARE_ROWS = {
    "episodes": ["10", "10", "1.00"],
    "failed_episodes": ["0", "0", "-"],  # results of a run without failures allowed: none failed
    "parallelism": ["10", "1", "0.10"],
    "reward_sum": ["10", "10", "1.00"],
    "batch_to_all_ready_seconds": ["3.7", "93.1", "25.16"],  # 93.1 / 3.7 = 25.162
    "batch_to_all_rewards_seconds": ["8.4", "97.6", "11.62"],  # 97.6 / 8.4 = 11.619
    "client_job_complete_seconds": ["12.7", "101.6", "8.00"],
    "pod_to_ready_p50_seconds": ["3.7", "3.6", "0.97"],  # 3.6 / 3.7 = 0.973
    "pod_to_ready_p95_seconds": ["3.7", "3.8", "1.03"],  # 3.8 / 3.7 = 1.027
    "pod_to_ready_max_seconds": ["3.8", "3.9", "1.03"],  # 3.9 / 3.8 = 1.026
}


def test_compare_table_ratios() -> None:
    first = dict(GUIDE_PARALLEL, phases={"python_imports": {"p50": 1.32}})
    second = dict(
        GUIDE_SERIAL, pod_to_ready_p95_seconds=None, phases={"python_imports": {"p50": 0.66}}
    )
    table = demo.compare_table(first, second, "A: parallel", "B: serial")
    assert table.splitlines()[0].split() == GUIDE_COMPARE_HEADER
    assert compare_rows(table) == dict(
        GUIDE_COMPARE_ROWS,
        pod_to_ready_p95_seconds=["3.7", "-", "-"],
        python_imports_p50_seconds=["1.32", "0.66", "0.50"],
    )


def worker_namespace() -> dict:
    """The worker's functions, defined without running its main()."""
    namespace: dict[str, Any] = {"__name__": "episode"}
    exec(compile(demo.WORKER_SOURCE, "episode.py", "exec"), namespace)
    return namespace


def test_worker_flat_json_is_json_for_the_ready_event() -> None:
    # Before "ready" the worker has not imported json; its own encoder must still be JSON.
    flat_json = worker_namespace()["flat_json"]
    record = {
        "event": "ready",
        "at": 1795982403.123456,
        "episode_id": "rollout-x7k2p",
        "imports_done_at": 1795982402.5,
        "process_started_at": None,
        "modules_before_ready": 34,
        "odd": 'quote " back \\ slash\nnew line\ttab \u00e9 {braces}',
        "flag": True,
        "off": False,
    }
    assert json.loads(flat_json(record)) == record
    assert "\n" not in flat_json(record)  # one event, one line


# --------------------------------------------------------------------------
# The real worker, in a sandbox that gives it /workspace and /demo.


def bwrap_or_skip(require_e2e: Any) -> str:
    require_e2e(kubectl=False, bwrap=True)
    bwrap = discovered_bwrap()
    assert bwrap is not None
    problem = prereqs.bwrap_problem(bwrap)
    if problem:
        skip_or_fail(f"bwrap cannot make a sandbox here: {problem}")
    return bwrap


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory: pytest.TempPathFactory, require_e2e: Any) -> dict:
    """Run WORKER_SOURCE once, for real, as a pod would: exit code, stdout, wall-clock bounds, workspace."""
    bwrap = bwrap_or_skip(require_e2e)
    root = tmp_path_factory.mktemp("worker")
    workspace, demo_dir, bindir = root / "workspace", root / "demo", root / "bin"
    for directory in (workspace, demo_dir, bindir):
        directory.mkdir()
    (demo_dir / "episode.py").write_text(demo.WORKER_SOURCE, encoding="utf-8")
    # The sandbox the emulator's kubelet gives a pod: the host's root read-only, the volumes at
    # /workspace and (read-only) /demo, uid 1000, no network; run by the bwrap found, not PATH's.
    mounts = [(str(workspace), "/workspace", False), (str(demo_dir), "/demo", True)]
    argv = sandbox.build_bwrap_argv(
        1000,
        1000,
        "rollout-x7k2p",
        mounts,
        False,
        "/",
        [os.path.realpath(sys.executable), "-B", "/demo/episode.py"],
        str(bindir),
    )
    started = time.time()
    completed = subprocess.run(
        [bwrap] + argv[1:],
        env={"EPISODE_ID": "rollout-x7k2p", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {
        "returncode": completed.returncode,
        "stdout": completed.stdout,
        "stderr": completed.stderr,
        "started": started,
        "ended": time.time(),
        "workspace": workspace,
    }


def test_worker_exits_0_with_exactly_ready_then_reward(worker_run: dict) -> None:
    assert worker_run["returncode"] == 0, worker_run["stderr"]
    lines = worker_run["stdout"].splitlines()
    assert len(lines) == 2, worker_run["stdout"]
    events = demo.parse_events(lines)
    assert [event["event"] for event in events] == ["ready", "reward"]
    assert [event["episode_id"] for event in events] == ["rollout-x7k2p", "rollout-x7k2p"]


def test_worker_events_carry_the_spec_fields(worker_run: dict) -> None:
    ready, reward = demo.parse_events(worker_run["stdout"].splitlines())
    assert reward["reward"] == 1 and type(reward["reward"]) is int
    assert reward["tests_exit"] == 0
    assert isinstance(reward["baseline_exit"], int) and reward["baseline_exit"] != 0
    assert "Ran 3 tests" in reward["tests_output"] and "OK" in reward["tests_output"]
    for event in (ready, reward):
        assert isinstance(event["at"], float)
        assert worker_run["started"] - 1 <= event["at"] <= worker_run["ended"] + 1
    assert ready["imports_done_at"] <= ready["at"] <= reward["at"]
    assert isinstance(ready["modules_before_ready"], int) and ready["modules_before_ready"] > 0


def test_worker_events_pass_verification(worker_run: dict) -> None:
    start = calendar.timegm(time.gmtime(worker_run["started"] - 1))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    job = make_job(created=created)
    pod = make_pod("rollout-x7k2p", created=created)
    assert len(demo.verify_batch(1, job, [pod], {"rollout-x7k2p": worker_run["stdout"]})) == 1


def test_worker_leaves_the_fixed_code_and_its_tests_in_workspace(worker_run: dict) -> None:
    workspace = worker_run["workspace"]
    shipping = (workspace / "shipping.py").read_text()
    assert "total >= 99" in shipping and "total > 99" not in shipping
    namespace: dict[str, Any] = {}
    exec(compile(shipping, "shipping.py", "exec"), namespace)
    assert [namespace["shipping"](t) for t in (98, 99, 100)] == [10, 0, 0]
    tests = subprocess.run(
        [sys.executable, "-B", "test_shipping.py"],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert tests.returncode == 0 and "Ran 3 tests" in tests.stderr


def test_worker_test_file_fails_the_original_bug(worker_run: dict, tmp_path: Path) -> None:
    # The spec's bug (`total > 99`) must fail the boundary test the worker wrote.
    (tmp_path / "test_shipping.py").write_text(
        (worker_run["workspace"] / "test_shipping.py").read_text()
    )
    (tmp_path / "shipping.py").write_text(
        (worker_run["workspace"] / "shipping.py").read_text().replace("total >= 99", "total > 99")
    )
    tests = subprocess.run(
        [sys.executable, "-B", "test_shipping.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert tests.returncode != 0
    assert "test_threshold_ships_free" in tests.stderr and "Ran 3 tests" in tests.stderr


# --------------------------------------------------------------------------
# Standard library only (the tool is copied onto bastions with nothing installed).

# Used where sys.stdlib_module_names does not exist (Python 3.9).
STDLIB_ALLOW_LIST = frozenset(
    """
    __future__ abc argparse ast asyncio atexit base64 bisect calendar codecs collections concurrent ctypes
    contextlib copy csv dataclasses datetime decimal difflib email enum errno fcntl fnmatch fractions
    functools gc getpass glob gzip hashlib heapq hmac html http importlib inspect io ipaddress
    itertools json keyword locale logging math mimetypes numbers operator os pathlib pickle platform
    posixpath pprint queue random re resource secrets select selectors shlex shutil signal socket
    stat statistics string struct subprocess sys sysconfig tarfile tempfile textwrap threading
    time timeit tokenize traceback types typing unicodedata unittest urllib uuid warnings weakref xml zipfile
    zlib
""".split()
)


def top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def stdlib_names() -> frozenset:
    return frozenset(getattr(sys, "stdlib_module_names", STDLIB_ALLOW_LIST))


def test_the_allow_list_is_standard_library() -> None:
    if not hasattr(sys, "stdlib_module_names"):
        pytest.skip("sys.stdlib_module_names is Python >= 3.10")
    assert STDLIB_ALLOW_LIST <= sys.stdlib_module_names


def test_rl_batch_demo_imports_only_the_standard_library(repo_root: Path) -> None:
    source = (repo_root / "rl_batch_demo.py").read_text(encoding="utf-8")
    imported = top_level_imports(source)
    assert {"json", "subprocess", "argparse"} <= imported  # the walk does see imports
    assert sorted(imported - stdlib_names()) == []


def test_the_worker_compiles_and_imports_only_the_standard_library() -> None:
    compile(demo.WORKER_SOURCE, "episode.py", "exec")
    imported = top_level_imports(demo.WORKER_SOURCE)
    assert {"os", "sys", "time"} <= imported
    assert sorted(imported - stdlib_names()) == []


def test_sandbox_ready_comes_from_the_true_transition_only() -> None:
    # Once a pod ends, the kubelet turns PodReadyToStartContainers False (sandbox gone):
    # that later time must not pass for the sandbox's readiness. The watch's record of
    # the True transition, kept in `observed`, is used instead.
    job, pods, logs, events = synthetic_batch()
    for pod in pods:
        for entry in pod["status"]["conditions"]:
            if entry["type"] == "PodReadyToStartContainers":
                entry["status"] = "False"
                entry["lastTransitionTime"] = "2026-11-29T20:00:30Z"
    phases = demo.summarise_batch(job, pods, logs, events, 3).figures["phases"]
    assert phases["sandbox_creation"]["samples"] == 0 and phases["sandbox_creation"]["missing"] == 3
    observed = {POD_A: {"sandbox_ready": "2026-11-29T20:00:02Z"}}
    phases = demo.summarise_batch(job, pods, logs, events, 3, observed=observed).figures["phases"]
    assert phases["sandbox_creation"]["samples"] == 1
    assert phases["sandbox_creation"]["p50"] == 0.75  # 20:00:02 - scheduled 20:00:01.25


def test_each_batch_starts_its_progress_with_a_line_of_its_own() -> None:
    stream = io.StringIO()
    progress = demo.Progress(quiet=False, stream=stream)
    progress.update("rollout-1: first")
    progress.update("rollout-1: too soon after the first")
    progress.new_batch()
    progress.update("rollout-2: first")
    assert stream.getvalue().splitlines() == ["rollout-1: first", "rollout-2: first"]


def test_the_wait_past_the_pods_says_what_it_waits_for() -> None:
    assert demo.waiting_note({"spec": {"activeDeadlineSeconds": 240}, "status": {}}, 10.0) == ""
    assert demo.waiting_note({"spec": {"activeDeadlineSeconds": 3}, "status": {}}, 4.5) == (
        "  (past the Job's 3 s deadline: waiting up to 30 s more for the Job controller to end it)"
    )
    failing = {
        "spec": {"activeDeadlineSeconds": 3},
        "status": {
            "conditions": [
                {"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded"}
            ]
        },
    }
    assert demo.waiting_note(failing, 4.5) == (
        "  (DeadlineExceeded: waiting for the pods to stop before Kubernetes marks the Job Failed)"
    )
    succeeding = {"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}}
    assert "marks the Job Complete" in demo.waiting_note(succeeding, 1.0)


def test_a_failed_batch_says_which_evidence_exists() -> None:
    assert demo.saved_evidence({"kind": "Job"}, [], {}, []) == (
        "saved: job.json, pods.json (0 pods), events.txt (0 events), 0 of 0 pod logs with content, "
        "no pod is left to have a log (the Job controller deletes a Job's pods when it ends it for its deadline)"
    )
    pods = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    assert demo.saved_evidence(None, pods, {"a": "{}\n", "b": ""}, demo.event_records([{}])) == (
        "saved: job.json (unreadable), pods.json (2 pods), events.txt (1 event), 1 of 2 pod logs with content"
    )


# --------------------------------------------------------------------------
# Sub-second points: event names, the client's watch, server seconds, clocks.


def named_event(
    reason: str,
    pod: str,
    at: float,
    kind: str = "Pod",
    node: str = "node-1",
    stored: float | None = None,
    **extra: Any,
) -> dict:
    """An event as a recorder makes it: named `<object>.<hex UnixNano>` on its own clock."""
    metadata = {"name": f"{pod}.{int(round(at * 1e9)):x}", "namespace": NAMESPACE}
    if stored is not None:
        metadata["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stored))
    involved = {"kind": kind, "name": pod, "namespace": NAMESPACE}
    if kind == "Pod":
        involved["fieldPath"] = "spec.containers{episode}"
    return dict(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "reason": reason,
            "type": "Normal",
            "count": 1,
            "involvedObject": involved,
            "metadata": metadata,
            "source": {"component": "kubelet", "host": node}
            if kind == "Pod"
            else {"component": "job-controller"},
        },
        **extra,
    )


def test_event_name_time_reads_the_recorders_nanoseconds() -> None:
    event = demo.event_record(named_event("Started", POD_A, T0 + 2.123456789))
    assert demo.event_name_time(event) == pytest.approx(T0 + 2.123456789, abs=1e-6)

    def named(metadata: dict) -> demo.EventRecord:
        return demo.event_record({"metadata": metadata})

    # A name the recorder did not make (kubectl-created, or a short hex word) says nothing.
    assert demo.event_name_time(named({"name": "rollout-4kq2m.Started"})) is None
    assert demo.event_name_time(named({"name": "rollout.beef"})) is None
    assert demo.event_name_time(named({"name": "rollout.deadbeef1"})) is None  # 1970: not a time
    assert demo.event_name_time(named({})) is None


def test_kubelet_events_and_pod_creations_per_pod() -> None:
    events = [
        named_event("Pulled", POD_A, T0 + 2.10),
        named_event("Created", POD_A, T0 + 2.11),
        named_event("Started", POD_A, T0 + 2.15),
        named_event("Started", POD_A, T0 + 5.0),  # a restart
        named_event("FailedMount", POD_A, T0 + 1.5),  # before the sandbox: not a container event
        named_event(
            "SuccessfulCreate", "rollout", T0 + 1.02, kind="Job", message=f"Created pod: {POD_A}"
        ),
        # The recorder combined this one with similar events: it names no pod's own creation.
        named_event(
            "SuccessfulCreate",
            "rollout",
            T0 + 1.03,
            kind="Job",
            count=4,
            message=f"Created pod: {POD_B}",
        ),
    ]
    events = demo.event_records(events)
    kubelet = demo.kubelet_container_events(events)
    assert {reason: round(at - T0, 3) for reason, (at, _) in kubelet[POD_A].items()} == {
        "Pulled": 2.1,
        "Created": 2.11,
        "Started": 2.15,
    }
    assert kubelet[POD_A]["Started"][1] == "node-1"
    assert {pod: round(at - T0, 3) for pod, at in demo.pod_creation_events(events).items()} == {
        POD_A: 1.02
    }


def test_the_watch_records_when_each_transition_first_arrived() -> None:
    pending = make_pod(POD_A, exit_code=None, sandbox_ready=None)
    pending["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ContainerCreating"}
    }
    del pending["spec"]["nodeName"]
    seen = demo.pod_observation(None, pending, 100.0)
    assert seen == {"seen": {"added": 100.0}}
    first = seen
    pending["spec"]["nodeName"] = "node-1"
    seen = demo.pod_observation(seen, pending, 100.5)
    running = make_pod(POD_A, exit_code=None, sandbox_ready=stamp(2))
    seen = demo.pod_observation(seen, running, 102.0)  # sandbox and running in one update
    seen = demo.pod_observation(seen, make_pod(POD_A), 109.0)
    final = seen
    seen = demo.pod_observation(seen, make_pod(POD_A), 110.0)  # seen again: the first arrival stays
    assert seen == {
        "seen": {
            "added": 100.0,
            "bound": 100.5,
            "sandbox_ready": 102.0,
            "running": 102.0,
            "terminated": 109.0,
        },
        "sandbox_ready": stamp(2),
    }
    # A record once made is never changed: a sight that adds nothing gives the very same one.
    assert seen is final and first == {"seen": {"added": 100.0}}
    job_seen: dict[str, float] = {}
    demo.record_job_observation(job_seen, make_job(end_at=stamp(11), criteria_at=stamp(11)), 111.5)
    assert job_seen == {"added": 111.5, "SuccessCriteriaMet": 111.5, "Complete": 111.5}


def sharp_batch() -> tuple[dict, list[dict], dict[str, str], list[dict], dict]:
    """One episode with every sharp source: events named on the node, watch times on the client."""
    job = make_job(end_at=stamp(11), criteria_at=stamp(11))
    pod = make_pod(
        POD_A,
        created=stamp(1),
        scheduled=stamp(1),
        sandbox_ready=stamp(2),
        started=stamp(2),
        finished=stamp(3),
    )
    logs = {
        POD_A: log_text(
            ready_event(POD_A, T0 + 2.5, imports_done_at=T0 + 2.45, process_started_at=T0 + 2.2),
            reward_event(POD_A, T0 + 3.4),
        )
    }
    events = [
        dict(
            named_event("Scheduled", POD_A, T0 + 1.03),
            eventTime="2026-11-29T20:00:01.030000Z",
            source={},
            reportingComponent="default-scheduler",
        ),
        named_event(
            "SuccessfulCreate", "rollout", T0 + 1.005, kind="Job", message=f"Created pod: {POD_A}"
        ),
        named_event("Pulled", POD_A, T0 + 1.96, stored=T0 + 1),
        named_event("Created", POD_A, T0 + 2.12, stored=T0 + 2),
        named_event("Started", POD_A, T0 + 2.18, stored=T0 + 2),
    ]
    observed = {
        "pods": {
            POD_A: {
                "seen": {
                    "added": T0 + 1.01,
                    "bound": T0 + 1.04,
                    "sandbox_ready": T0 + 2.2,
                    "running": T0 + 2.2,
                    "terminated": T0 + 3.45,
                }
            }
        },
        "job": {"submitted": T0 - 0.05, "create_returned": T0 + 0.02, "added": T0 + 0.9},
    }
    return job, [pod], logs, demo.event_records(events), observed


def test_every_point_from_its_sharpest_source() -> None:
    job, pods, logs, events, observed = sharp_batch()
    summary = demo.summarise_batch(job, pods, logs, events, 1, observed=observed)
    points = summary.episodes[0]["points"]
    shown = {name: (round(p.at - T0, 6), p.precision, p.clock) for name, p in points.items()}
    assert shown == {
        # Named by the Job controller after creating the pod; within its allowance of it and in its second.
        "pod_created": (1.005, 0.005, "control plane"),
        "scheduled": (1.03, 1e-6, "control plane"),
        # The kubelet's Pulled follows the sandbox: within the event's allowance (0.5 s) before it.
        "sandbox_ready": (1.96, 0.5, "node"),
        # Between the Created and Started events.
        "container_started": (2.18, 0.06, "node"),
        "process_started": (2.2, 0.01, "node"),
        "imports_done": (2.45, 1e-6, "node"),
        "ready": (2.5, 1e-6, "node"),
        "reward": (3.4, 1e-6, "node"),
        # After the reward, within finishedAt's second, seen terminated by the watch.
        "container_finished": (3.45, 0.05, "client"),
        # The image was present: the kubelet's Pulled event alone bounds both ends of image_pull.
        "image_pull_started": (1.96, demo.EVENT_FOLLOWS_SECONDS, "node"),
        "image_pulled": (1.96, demo.EVENT_FOLLOWS_SECONDS, "node"),
    }
    assert summary.episodes[0]["phases"]["image_pull"][0] == 0.0
    assert (
        points["container_started"].source
        == "kubelet Started event name, after kubelet Created event name"
    )
    # Every point with a server stamp lies in that stamp's second.
    assert 1 <= shown["pod_created"][0] < 2 and 3 <= shown["container_finished"][0] < 4
    phases = summary.episodes[0]["phases"]
    assert phases["sandbox_creation"] == (pytest.approx(0.93), pytest.approx(0.500001))
    # The Job's true creation: inside the client's create call.
    assert summary.figures["job_created"]["at"] == pytest.approx(T0 + 0.02)
    assert summary.figures["job_created"]["precision"] == pytest.approx(0.02)
    # No clock is shown apart from the others, so none is corrected.
    assert summary.figures["clocks"]["warnings"] == []
    assert summary.figures["clocks"]["client"]["offset_seconds"] == 0.0
    assert summary.figures["clocks"]["nodes"]["node-1"]["offset_seconds"] == 0.0
    # The guide's pod_to_ready stays whole-second: ready 2.5 - created 1 (stamp).
    assert summary.figures["pod_to_ready_p50_seconds"] == 1.5
    assert summary.figures["phases"]["pod_to_ready"]["p50"] == pytest.approx(1.495)


def test_a_watch_behind_the_server_second_shows_a_clock_apart_loudly() -> None:
    job, pods, logs, events, observed = sharp_batch()
    # The client's clock runs 0.5 s behind: it "sees" the pod before its creationTimestamp second.
    for seen in observed["pods"][POD_A]["seen"]:
        observed["pods"][POD_A]["seen"][seen] -= 0.5
    observed["job"] = {key: value - 0.5 for key, value in observed["job"].items()}
    summary = demo.summarise_batch(job, pods, logs, events, 1, observed=observed)
    client = summary.figures["clocks"]["client"]
    assert client["at_most_seconds"] == pytest.approx(
        -0.49
    )  # at most 1.01 - 0.5 - 1 (pod created stamp)
    # Corrected by the middle of what the evidence allows, which holds the true -0.5 within its slack.
    assert client["offset_seconds"] == pytest.approx(
        (client["at_least_seconds"] + client["at_most_seconds"]) / 2
    )
    assert client["correction_slack_seconds"] == pytest.approx(
        client["at_most_seconds"] - client["offset_seconds"]
    )
    assert abs(client["offset_seconds"] + 0.5) <= client["correction_slack_seconds"]
    assert any(
        "client's and the control plane's clocks disagree" in w
        for w in summary.figures["clocks"]["warnings"]
    )
    # Corrected onto the control plane's clock, the watch's times fall back into their seconds.
    finished = summary.episodes[0]["points"]["container_finished"]
    assert 3 <= finished.at - T0 < 4
    # The Job's creation read on the client's clock is as uncertain as that clock's correction:
    # the create call alone (offset by the correction, slack left out) would place it 0.5 s late
    # at a precision of 0.07 s. It was truly created within T0 .. T0 + 0.02.
    job_created = summary.figures["job_created"]
    for truth in (T0, T0 + 0.02):
        assert abs(job_created["at"] - truth) <= job_created["precision"], (job_created, truth - T0)


def test_sharpest_keeps_the_stamp_when_the_sources_contradict_it() -> None:
    stamp_bound = demo.whole_second(T0 + 1, "stamp", "control plane")
    watch = demo.upper(T0 + 0.5, "watch", "client")  # seen before its own second: clocks apart
    assert demo.sharpest([watch], stamp_bound) == demo.Point(
        T0 + 1, 1.0, "stamp", "control plane", T0 + 1
    )
    assert (
        demo.sharpest([demo.lower(T0 + 1.2, "after", "node")], None) is None
    )  # nothing shows it happened


def test_a_phase_shorter_than_its_precision_is_never_negative() -> None:
    points = {
        "pod_created": demo.Point(10.05, 0.1, "a", "control plane"),
        "scheduled": demo.Point(10.0, 1e-6, "b", "control plane"),
    }
    assert demo.phase_durations(points)["scheduling"] == (0.0, 0.100001)
    assert demo.figure(0.0, 0.100001) == "<0.1"
    assert demo.figure(0.25, 0.1) == "0.250"
    assert demo.figure(None, 0.1) == "-"


def test_compare_takes_no_ratio_of_figures_below_their_precision() -> None:
    def results(scheduling: float, precision: float) -> dict:
        return {
            "phases": {
                "scheduling": {"p50": scheduling, "precision_seconds": precision},
                "sandbox_creation": {"p50": 0.8, "precision_seconds": 0.1},
            }
        }

    table = demo.compare_table(results(0.03, 0.1), results(0.5, 0.1), "A", "B")
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()}
    assert rows["scheduling_p50_seconds"] == ["<0.1", "0.5", "-"]
    assert rows["sandbox_creation_p50_seconds"] == ["0.8", "0.8", "1.00"]


def test_a_node_clock_behind_the_control_plane_is_said_loudly() -> None:
    job, pods, logs, events, observed = sharp_batch()
    # The node's clock runs 1.2 s behind: its kubelet names its first container event
    # before the scheduler bound the pod, by the control plane's clock.
    for position, event in enumerate(events):
        if event.component == "kubelet":
            at = demo.event_name_time(event) - 1.2
            events[position] = event._replace(name=f"{POD_A}.{int(round(at * 1e9)):x}")
    summary = demo.summarise_batch(job, pods, logs, events, 1, observed=observed)
    node = summary.figures["clocks"]["nodes"]["node-1"]
    # Pulled - the binding's earliest: its PodScheduled second (later than 0.5 s before the eventTime).
    assert node["at_most_seconds"] == pytest.approx(1.96 - 1.2 - 1)
    assert node["offset_seconds"] == pytest.approx(
        (node["at_least_seconds"] + node["at_most_seconds"]) / 2
    )
    assert abs(node["offset_seconds"] + 1.2) <= node["correction_slack_seconds"]
    # A point read on the node's clock is corrected, and as imprecise as the correction.
    ready = summary.episodes[0]["points"]["ready"]
    assert ready.precision == pytest.approx(1e-6 + 2 * node["correction_slack_seconds"], abs=1e-6)
    assert any(
        "node node-1's and the control plane's clocks disagree by at least 0.240 s" in warning
        for warning in summary.figures["clocks"]["warnings"]
    )


def test_a_node_clock_behind_by_less_than_the_sandbox_is_pinned_by_the_pods_start_time() -> None:
    # The node runs 1.5 s behind. Its first container event follows the binding by the whole
    # sandbox (2.2 s here), so on its own it allows a clock that agrees; but the kubelet took
    # the pod up at once: at 20:00:01.81 by its clock, stamped startTime 20:00:01, while the
    # API server bound it in 20:00:03 (PodScheduled) on the control plane's.
    pod = make_pod(
        POD_A,
        created=stamp(3),
        scheduled=stamp(3),
        sandbox_ready=stamp(5),
        started=stamp(5),
        finished=stamp(7),
    )
    pod["status"]["startTime"] = stamp(1)
    events = [
        dict(
            named_event("Scheduled", POD_A, T0 + 3.37),
            eventTime="2026-11-29T20:00:03.370000Z",
            source={},
            reportingComponent="default-scheduler",
        ),
        named_event("Pulled", POD_A, T0 + 5.51 - 1.5, stored=T0 + 5.6),
    ]
    events = demo.event_records(events)
    clocks = demo.clock_offsets(make_job(), [pod], events, {}, {})
    node = clocks["nodes"]["node-1"]
    assert node["at_most_seconds"] == pytest.approx(
        1 + 1 - 3
    )  # startTime's second's end - PodScheduled's start
    assert node["at_least_seconds"] == pytest.approx(
        4.01 - 5 - 1
    )  # Pulled named before it was stored
    assert abs(node["offset_seconds"] + 1.5) <= node["correction_slack_seconds"]
    assert any(
        "node node-1's and the control plane's clocks disagree by at least 1.000 s" in warning
        for warning in clocks["warnings"]
    )
    # Without the start time, the sandbox's length hides the offset.
    del pod["status"]["startTime"]
    assert (
        demo.clock_offsets(make_job(), [pod], events, {}, {})["nodes"]["node-1"]["offset_seconds"]
        == 0.0
    )


def test_a_scheduler_naming_its_event_late_leaves_an_agreeing_node_clock_alone() -> None:
    # One clock for all. The API server binds the pod at 20:00:01.90, the kubelet takes it up at
    # .95 (startTime 20:00:01) and names Pulled at 20:00:02.05 (a fast sandbox), but the
    # scheduler, its bind request slow to return on a loaded machine, takes its eventTime only
    # at 20:00:02.20. Read as following the binding within an event's allowance (0.1 s), the
    # start time would prove the node 0.10 s behind, and Pulled named before the eventTime
    # 0.15 s behind: a correction and a warning for clocks that agree.
    pod = make_pod(
        POD_A,
        created=stamp(1),
        scheduled=stamp(1),
        sandbox_ready=stamp(2),
        started=stamp(2),
        finished=stamp(4),
    )
    pod["status"]["startTime"] = stamp(1)
    events = [
        dict(
            named_event("Scheduled", POD_A, T0 + 2.20),
            eventTime="2026-11-29T20:00:02.200000Z",
            source={},
            reportingComponent="default-scheduler",
        ),
        named_event("Pulled", POD_A, T0 + 2.05, stored=T0 + 2.1),
    ]
    events = demo.event_records(events)
    clocks = demo.clock_offsets(make_job(), [pod], events, {}, {})
    node = clocks["nodes"]["node-1"]
    assert node["at_least_seconds"] <= 0 <= node["at_most_seconds"], node
    # The binding no earlier than SCHEDULED_FOLLOWS_BINDING_SECONDS before the eventTime (1.70).
    assert node["at_most_seconds"] == pytest.approx(
        1 + 1 - (2.20 - demo.SCHEDULED_FOLLOWS_BINDING_SECONDS)
    )
    assert node["offset_seconds"] == 0.0 and clocks["warnings"] == [], clocks


def test_a_pod_past_the_parallelism_was_created_after_enough_earlier_pods_ended() -> None:
    # Parallelism 2: a, b start; c only once one of them ended, d once two of a, b, c had.
    within = {"a": (10.0, 10.05), "b": (10.0, 10.1), "c": (13.0, 13.02), "d": (14.0, 14.01)}
    ended = {"a": 12.5, "b": 13.5, "c": 13.8}
    assert demo.slot_freed_after(within, ended, 2) == {"c": 12.5, "d": 13.5}
    # Creations that may overlap say nothing of their order: c might precede a, so nothing bounds c.
    within["c"] = (10.0, 13.02)
    assert demo.slot_freed_after(within, ended, 2) == {"d": 13.5}
    # An earlier pod whose end is unknown may have ended first: no bound from then on.
    within["c"] = (13.0, 13.02)
    assert demo.slot_freed_after(within, {"b": 13.5, "c": 13.8}, 2) == {}
    assert demo.slot_freed_after(within, ended, 4) == {}


@pytest.mark.parametrize("seed", range(20))
def test_slots_that_may_not_have_waited_are_those_where_no_pod_is_found(seed: int) -> None:
    """slots_freed skips the search for a pod created after `parallelism` others wherever
    slots_may_have_waited says none can be: never where one is found, at any parallelism."""
    rng = random.Random(seed)
    names = [f"p{number}" for number in range(rng.randint(1, 6))]
    within = {}
    for name in names:
        earliest = rng.uniform(0, 5)
        # Now and then contradictory bounds (clocks apart): the latest before the earliest.
        within[name] = (earliest, earliest + rng.uniform(-3 if rng.random() < 0.3 else 0, 2))
    ended = {name: rng.uniform(0, 8) for name in names if rng.random() < 0.9}
    for parallelism in range(1, len(names) + 2):
        found = demo.slot_freed_after(within, ended, parallelism)
        assert not found or demo.slots_may_have_waited(within, parallelism), (parallelism, found)
    # And a pod created after every pod, itself too, is found where the parallelism equals them all.
    late = {"a": (10.0, 9.0)}
    assert demo.slot_freed_after(late, {"a": 8.0}, 1) == {"a": 8.0}
    assert demo.slots_may_have_waited(late, 1)


def test_a_pod_asked_to_be_deleted_bounds_no_later_pods_creation() -> None:
    # Parallelism 1: b was created after a ended, by its reward at T0 + 5. Had a been asked to be
    # deleted, the Job could have replaced it at once, long before its reward: nothing bounds b.
    def episode(name: str, created: str, reward_at: float, **metadata: Any) -> tuple:
        pod = {"metadata": {"name": name, "creationTimestamp": created, **metadata}, "spec": {}}
        return pod, {}, {"at": reward_at}

    def no_offsets(pod: dict) -> demo.EpisodeClocks:
        return demo.EpisodeClocks()

    b = episode("b", stamp(6), T0 + 9)
    ended = episode("a", stamp(0), T0 + 5)
    assert demo.slots_freed([ended, b], no_offsets, {}, {}, T0, 1) == {"b": T0 + 5}
    deleted = episode(
        "a", stamp(0), T0 + 5, deletionTimestamp=stamp(32), deletionGracePeriodSeconds=30
    )
    assert demo.slots_freed([deleted, b], no_offsets, {}, {}, T0, 1) == {}
    # A Job that waits for a terminating pod to end before replacing it (podReplacementPolicy
    # Failed, as with a podFailurePolicy): the end still frees the slot.
    assert demo.slots_freed(
        [deleted, b], no_offsets, {}, {}, T0, 1, replaces_terminating=False
    ) == {"b": T0 + 5}


def test_the_two_pod_to_ready_p50s_are_named_apart_and_shown_side_by_side() -> None:
    job, pods, logs, events = synthetic_batch()
    figures = demo.summarise_batch(job, pods, logs, events, 3).figures
    # The guide's counts from the pod's whole-second stamp; the phase from its sharpest creation point.
    figures["pod_to_ready_p50_seconds"], figures["phases"]["pod_to_ready"]["p50"] = 1.561, 0.764
    figures["phases"]["pod_to_ready"]["precision_seconds"] = 0.01
    text = demo.phase_tables(figures).split("\n\n")[0]  # the batch's table, before the start paths'
    guide, sharp = 1.561, 0.764
    rows = {line[:24].strip(): line for line in text.splitlines()}
    assert "pod_to_ready" not in rows and rows["pod_to_ready (sharp)"].split()[2] == f"{sharp:.3f}"
    [guide_line] = [line for line in text.splitlines() if line.startswith("pod_to_ready P50:")]
    assert guide_line.startswith(
        f"pod_to_ready P50: {guide:.3f} s the guide's (from the pod's whole-second "
        f"creationTimestamp; pod_to_ready_p50_seconds)"
    )
    next_line = text.splitlines()[text.splitlines().index(guide_line) + 1]
    assert next_line.split()[:3] == [f"{sharp:.3f}", "s", "sharp"]


def test_a_batch_that_mixes_start_paths_shows_each_paths_phases() -> None:
    job, pods, logs, events = synthetic_batch()
    summary = demo.summarise_batch(job, pods, logs, events, 3)
    by_path = summary.figures["phases_by_start_path"]
    # A found its image, B pulled it, C left no trace of which.
    assert sorted(by_path) == ["image present", "image pulled", "image unknown"]
    assert by_path["image pulled"]["sandbox_creation"]["p50"] == 1.5
    assert by_path["image present"]["sandbox_creation"]["p50"] == 0.75
    assert by_path["image unknown"]["sandbox_creation"]["samples"] == 0
    text = demo.phase_tables({"phases": summary.figures["phases"], "phases_by_start_path": by_path})
    assert "start path: image pulled" in text
    # One start path: no split.
    assert demo.start_path_phases([{"image_cache": "present", "phases": {}}] * 2) is None


def test_a_batch_that_mixes_runtime_classes_shows_each_runtimes_phases() -> None:
    job, pods, logs, events = synthetic_batch()
    for pod, runtime in zip(pods, ("cube", "cube", "runc")):
        pod["spec"]["runtimeClassName"] = runtime
    events = [e for e in events if e.reason != "Pulled"]  # one image path: unknown for all
    summary = demo.summarise_batch(job, pods, logs, events, 3)
    by_path = summary.figures["phases_by_start_path"]
    # Named by what differs: the runtime class alone.
    assert sorted(by_path) == ["runtime cube", "runtime runc"]
    assert by_path["runtime cube"]["scheduling"]["samples"] == 2
    assert by_path["runtime runc"]["scheduling"]["samples"] == 1
    rows = list(csv.DictReader(io.StringIO(demo.episodes_csv([("rollout", summary)]))))
    assert [row["runtime_class"] for row in rows] == ["cube", "cube", "runc"]
    # Both differ: both name the path.
    records = [
        {"image_cache": cache, "runtime_class": runtime, "phases": {}}
        for cache, runtime in (("present", "cube"), ("pulled", "cube"), ("present", "runc"))
    ]
    assert sorted(demo.start_path_phases(records)) == [
        "image present, runtime cube",
        "image present, runtime runc",
        "image pulled, runtime cube",
    ]


def test_a_figure_finer_than_its_rounding_is_printed_as_measured() -> None:
    # Worker clocks are microseconds; figures are rounded to the millisecond.
    assert demo.figure(0.0, 2e-6) == "0.000"
    assert not demo.below_precision(0.0, 2e-6)


def test_many_problems_of_one_kind_are_a_few_lines() -> None:
    problems = [f"rollout-{i}.log: forbidden" for i in range(500)]
    assert demo.summarised_problems(problems) == problems[:3] + [
        "... and 497 more (see the saved files)"
    ]
    assert demo.summarised_problems(problems[:4]) == problems[:4]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="VmHWM is Linux's")
def test_peak_memory_is_the_tools_own_not_that_of_the_process_that_spawned_it() -> None:
    # Linux carries ru_maxrss over an exec from the spawning process: a tool started by a large
    # trainer would report the trainer's memory as its own.
    ballast = b"x" * (200 << 20)
    probe = (
        "import rl_batch_demo, resource; from rl_batch_demo.results import peak_rss_mib; "
        "print(peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    printed = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE_DIR.parent,  # the whole package, imported as a run imports it
    ).stdout.split()
    del ballast
    peak, maxrss_kib = float(printed[0]), int(printed[1])
    assert maxrss_kib / 1024 >= 200, "the premise: ru_maxrss starts at the spawning process's RSS"
    assert 0 < peak < 100, peak


def test_a_clock_bounded_on_one_side_only_is_corrected_by_the_least_gap_and_says_it_may_be_more() -> (
    None
):
    bounds = demo.ClockBounds()
    bounds.at_most(-0.7)  # proven at least 0.7 s behind; nothing says by how much more
    entry, warnings = bounds.describe("node node-1's and the control plane's clocks", "test")
    assert entry["offset_seconds"] == pytest.approx(-0.7)
    assert entry["uncertainty_seconds"] is None
    assert len(warnings) == 1 and "disagree by at least 0.700 s" in warnings[0]
    assert "may be off by more than their stated precision" in warnings[0]
    both = demo.ClockBounds()
    both.at_least(-0.9)
    both.at_most(-0.7)
    _, warnings = both.describe("node node-1's and the control plane's clocks", "test")
    assert "+/- 0.100 s" in warnings[0] and "may be off by more" not in warnings[0]


def test_two_threads_writing_one_file_each_leave_it_whole(tmp_path) -> None:
    path = str(tmp_path / "pod.log")
    texts = ["a" * 200_000, "b" * 300_000]
    barrier = threading.Barrier(2)

    def writer(text: str) -> None:
        def pieces():
            barrier.wait()  # both writers are inside write_text at once
            for start in range(0, len(text), 1000):
                yield text[start : start + 1000]

        try:
            demo.write_text(path, pieces())
        except demo.DemoError as error:
            failures.append(error)

    failures: list = []
    threads = [threading.Thread(target=writer, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert (tmp_path / "pod.log").read_text() in texts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pod.log"]


# The interrupt arrives while the main thread forks a kubectl: the interpreter runs its fork
# handlers in this process (a pre-exec step makes it), and a KeyboardInterrupt raised in one is
# printed and dropped, and leaves logging's fork lock taken. Seen under load: SIGINT to a waiting
# run that then finished with 0, and one whose salvage hung on a log reader's kubectl.
INTERRUPTED_IN_FORK = r"""
import logging, os, signal, sys, threading
sys.path.insert(0, sys.argv[1])
import rl_batch_demo  # the whole package, as a run has it
from rl_batch_demo.kube import Kubectl
from rl_batch_demo.run import signals_interrupt
sent = []

def interrupt_during_the_fork():
    if not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGINT)

os.register_at_fork(after_in_parent=interrupt_during_the_fork)
kubectl = Kubectl("/bin/true")
for start in (lambda: kubectl.run(["version"]), lambda: kubectl.stream(["get", "pods", "-w"], 5)):
    sent.clear()
    try:
        with signals_interrupt():
            start()
    except KeyboardInterrupt:
        print("interrupted")
    else:
        print("went on")
# The fork handlers ran to their end (logging's released its lock): another thread starts a child.
sent.append(True)
other = threading.Thread(target=lambda: kubectl.run(["version"]), daemon=True)
other.start()
other.join(30)
print("stuck" if other.is_alive() else "started")
"""


def test_an_interrupt_during_a_kubectl_fork_is_not_lost() -> None:
    if not hasattr(os, "setsid"):
        pytest.skip("no sessions here: no pre-exec step, no fork handlers run in this process")
    completed = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IN_FORK, str(PACKAGE_DIR.parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.stdout.split() == ["interrupted", "interrupted", "started"], (
        completed.stdout,
        completed.stderr,
    )
    assert "Exception ignored" not in completed.stderr, completed.stderr


# --------------------------------------------------------------------------
# The package's map, and the parts of the single file generated from it.

BANNER_RULE = "# " + "-" * 74
MAP_HEADING = "The package's modules, lowest layer first:"
# The package itself, `python -m`, and the programs it ships as text.
NOT_PARTS = {"__init__", "__main__", "worker", "guardian", "sandbox_server", "launcher"}


def test_the_package_docstring_maps_every_module_once_in_the_order_of_the_generated_files_parts(
    repo_root: Path,
) -> None:
    modules = {path.stem for path in PACKAGE_DIR.glob("*.py")} - NOT_PARTS
    docstring = rl_batch_demo.__doc__.splitlines()
    start = next(n for n, line in enumerate(docstring) if line.startswith(MAP_HEADING))
    block = docstring[start : docstring.index("", start)]
    entries = [line[len("    ") :] for line in block if line.startswith("    ")]
    assert entries and all(re.fullmatch(r"\w+: \S.*", entry) for entry in entries), entries
    mapped = [entry.split(":")[0] for entry in entries]
    assert len(mapped) == len(set(mapped)), mapped  # each module once
    assert set(mapped) - modules <= {"worker", "guardian", "sandbox_server", "launcher"}, (
        mapped
    )  # modules of the package only
    # The generated file: each part opens with the rule, then one line naming its source and its
    # docstring's first line, then a blank line; no other rule.
    lines = (repo_root / "rl_batch_demo.py").read_text(encoding="utf-8").splitlines()
    parts = []
    for number, line in enumerate(lines):
        if line == BANNER_RULE:
            header = re.fullmatch(r"# src/rl_batch_demo/(\w+)\.py: (.+)", lines[number + 1])
            assert header, lines[number + 1]
            name, summary = header.groups()
            assert summary == demo.MODULES[name].__doc__.splitlines()[0], name
            assert lines[number + 2] == "", lines[number + 1]
            parts.append(name)
    assert len(parts) > 20
    assert sorted(parts) == sorted(modules)  # every module a part, once
    assert [name for name in mapped if name not in NOT_PARTS] == parts


# --------------------------------------------------------------------------
# The checks tests/run_tests.py runs before pytest.


def test_run_checks_names_each_failing_check_and_a_missing_module(capsys: Any) -> None:
    import run_tests

    python = Path(sys.executable)
    failed = run_tests.run_checks(
        python,
        [
            ("passes", ["-c", "pass"]),
            ("finds something", ["-c", "raise SystemExit(1)"]),
            ("absent", ["-m", "no_such_module_rldemo"]),
        ],
    )
    assert failed[0] == "finds something"
    assert failed[1].startswith("absent (no_such_module_rldemo is not installed in ")
    assert len(failed) == 2
    assert "== passes: python -c pass" in capsys.readouterr().out


# The package stays readable: modules of one concern, functions of one job, classes of one role.
MODULE_MOST_LINES, FUNCTION_MOST_LINES, CLASS_MOST_LINES = 1500, 60, 150


def test_no_module_function_or_class_of_the_package_is_past_its_size() -> None:
    import ast

    oversized = []
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MODULE_MOST_LINES:
            oversized.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                most = CLASS_MOST_LINES if isinstance(node, ast.ClassDef) else FUNCTION_MOST_LINES
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > most:
                    oversized.append(f"{path.name}: {node.name} {length} lines")
    assert oversized == []


def stopped_before_running(name: str) -> dict:
    """A pod as Kueue's stop of a just-admitted Job leaves it (kubernetes-sigs/kueue#8482): deleted
    at once, Failed, its container never made (as a real API server and kubelet 1.35 saved it)."""
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": "2026-12-07T12:33:33Z",
            "deletionTimestamp": "2026-12-07T12:33:33Z",
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "episode",
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "ContainerStatusUnknown",
                            "startedAt": None,
                        }
                    },
                }
            ],
        },
    }


def test_a_pod_a_suspension_deleted_before_it_ran_is_no_episode_and_is_named() -> None:
    job, pods, logs, events = synthetic_batch()
    job = copy.deepcopy(job)
    unrun = [
        stopped_before_running("rollout-x-stopped1"),
        stopped_before_running("rollout-x-stopped2"),
    ]
    # Without a suspension of the Job, a replaced pod is a failure, as the guide has it.
    with pytest.raises(demo.VerificationError, match="expected 3 pods for 3 episodes, found 5"):
        demo.summarise_batch(job, pods + unrun, logs, events, 3)
    job.setdefault("status", {})["conditions"] = [
        {"type": "Suspended", "status": "False", "reason": "JobResumed"}
    ]
    summary = demo.summarise_batch(job, pods + unrun, logs, events, 3)
    assert summary.figures["episodes"] == 3
    assert summary.figures["pods_that_never_ran"] == ["rollout-x-stopped1", "rollout-x-stopped2"]
    assert "pods_that_never_ran" not in demo.summarise_batch(job, pods, logs, events, 3).figures
    # A pod that did run (its container made) is an episode's pod still: a replaced one fails.
    ran = stopped_before_running("rollout-x-ran")
    ran["status"]["containerStatuses"][0]["containerID"] = "containerd://abc"
    with pytest.raises(demo.VerificationError, match="found 4"):
        demo.summarise_batch(job, pods + [ran], logs, events, 3)
