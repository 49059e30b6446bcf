"""A run in a namespace it shares and its Jobs queued through Kueue: the pure parts, by equality."""

from __future__ import annotations

import all_names as demo

JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "rollout-abc", "uid": "u-1", "creationTimestamp": "2026-12-07T06:00:00Z"},
    "spec": {
        "parallelism": 4,
        "template": {
            "spec": {"containers": [{"resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
        },
    },
}


def cluster_queue(quota: dict, cohort: str | None = None, borrowing: dict | None = None) -> dict:
    resources = [
        {
            "name": name,
            "nominalQuota": amount,
            **({"borrowingLimit": borrowing[name]} if borrowing and name in borrowing else {}),
        }
        for name, amount in quota.items()
    ]
    spec = {
        "resourceGroups": [
            {
                "coveredResources": list(quota),
                "flavors": [{"name": "default", "resources": resources}],
            }
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"spec": spec}


def test_a_job_that_fits_its_queue_says_how_many_pods_fit_at_once():
    fit = demo.quota_fit(
        demo.cluster_queue_quota(cluster_queue({"cpu": "1", "memory": "1Gi"})), [JOB]
    )
    assert fit.never is None and fit.fits_at_once == 10  # 1 CPU / 100m; memory allows 16


def test_a_job_wider_than_the_quota_is_never_admitted_with_its_figures():
    quota = demo.cluster_queue_quota(cluster_queue({"cpu": "300m", "memory": "1Gi"}))
    fit = demo.quota_fit(quota, [JOB])
    assert fit.never == (
        "Job rollout-abc runs 4 pods at once, 400m of cpu (100m each), and the quota is 300m "
        "(3 pods' worth)"
    )


def test_the_runtime_class_overhead_counts_against_the_quota_as_kueue_counts_it():
    overhead = demo.runtime_overhead({"overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}}})
    quota = demo.cluster_queue_quota(cluster_queue({"cpu": "3500m", "memory": "10Gi"}))
    fit = demo.quota_fit(quota, [JOB], overhead)
    assert fit.never is None and fit.fits_at_once == 10  # 350m and 832Mi a pod
    wide = demo.quota_fit(quota, [dict(JOB, spec=dict(JOB["spec"], parallelism=11))], overhead)
    assert "4200m" not in wide.never and "3850m of cpu (350m each)" in wide.never


def test_a_resource_the_cluster_queue_does_not_cover_is_never_admitted():
    fit = demo.quota_fit(demo.cluster_queue_quota(cluster_queue({"cpu": "4"})), [JOB])
    assert fit.never == "Job rollout-abc asks for memory, which the ClusterQueue has no quota of"


def test_in_a_cohort_the_borrowing_limit_counts_and_without_one_nothing_is_refused():
    limited = cluster_queue({"cpu": "300m", "memory": "1Gi"}, "team", {"cpu": "100m"})
    assert demo.quota_fit(demo.cluster_queue_quota(limited), [JOB]).never is None
    unbounded = cluster_queue({"cpu": "100m", "memory": "1Gi"}, "team")
    assert demo.quota_fit(demo.cluster_queue_quota(unbounded), [JOB]).never is None
    tight = cluster_queue({"cpu": "200m", "memory": "1Gi"}, "team", {"cpu": "100m"})
    assert "quota is 300m" in demo.quota_fit(demo.cluster_queue_quota(tight), [JOB]).never


def condition(kind: str, status: str, at: str, reason: str = "", message: str = "") -> dict:
    return {
        "type": kind,
        "status": status,
        "lastTransitionTime": at,
        "reason": reason,
        "message": message,
    }


def test_the_wait_says_what_kueue_says():
    pending = {
        "status": {
            "conditions": [
                condition(
                    "QuotaReserved",
                    "False",
                    "2026-12-07T06:00:01Z",
                    "Pending",
                    "couldn't assign flavors to pod set main: insufficient unused quota for cpu "
                    "in flavor default, 200m more needed",
                )
            ]
        }
    }
    assert demo.wait_line(pending).startswith("queued: couldn't assign flavors")
    inadmissible = {
        "status": {
            "conditions": [
                condition(
                    "QuotaReserved",
                    "False",
                    "2026-12-07T06:00:01Z",
                    "Inadmissible",
                    "LocalQueue lq is stopped",
                )
            ]
        }
    }
    assert demo.wait_line(inadmissible) == (
        "Inadmissible, Kueue will not admit it as things are: LocalQueue lq is stopped"
    )
    evicted = {
        "status": {
            "conditions": [
                condition(
                    "Evicted",
                    "True",
                    "2026-12-07T06:00:05Z",
                    "Preempted",
                    "Preempted to accommodate a workload",
                )
            ]
        }
    }
    assert demo.wait_line(evicted) == (
        "evicted by Kueue (Preempted: Preempted to accommodate a workload); waiting to be requeued"
    )
    assert demo.wait_line(None).startswith("suspended, no Workload yet")


def test_admission_points_and_phases_come_from_the_workloads_conditions():
    job = dict(
        JOB,
        status={
            "conditions": [condition("Suspended", "False", "2026-12-07T06:00:13Z", "JobResumed")]
        },
    )
    workload = {
        "metadata": {"name": "job-rollout-abc-1", "labels": {"kueue.x-k8s.io/job-uid": "u-1"}},
        "status": {
            "conditions": [
                condition("QuotaReserved", "True", "2026-12-07T06:00:10Z", "QuotaReserved"),
                condition("Admitted", "True", "2026-12-07T06:00:12Z", "Admitted"),
            ]
        },
    }
    figures = demo.admission_figures([job], [workload])
    start = demo.parse_time("2026-12-07T06:00:00Z")
    assert (figures["queued_at"], figures["quota_reserved_at"], figures["admitted_at"]) == (
        start,
        start + 10,
        start + 12,
    )
    assert figures["resumed_at"] == start + 13
    assert figures["queue_wait_seconds"] == 10 and figures["admission_checks_seconds"] == 2
    assert (
        figures["precision_seconds"] == 1.0
        and figures["jobs"][0]["workload"] == "job-rollout-abc-1"
    )
    unread = demo.admission_figures([job], [])
    assert unread["quota_reserved_at"] is None and unread["queue_wait_seconds"] is None


def test_a_shared_namespace_job_carries_the_run_and_the_queue_and_its_renamed_config_map():
    job = {
        "metadata": {"name": "rollout-r1", "namespace": "team-a"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "rl-batch-demo"}},
                "spec": {"volumes": [{"name": "demo", "configMap": {"name": "episode"}}]},
            }
        },
    }
    setup = [{"kind": "ConfigMap", "metadata": {"name": "episode", "namespace": "team-a"}}]
    shared = demo.shared_jobs({"rollout-r1": [job]}, setup, "r1", None, None, "lq")["rollout-r1"][0]
    assert shared["metadata"]["labels"] == {
        "app": "rl-batch-demo",
        "agc-demo-run": "r1",
        "kueue.x-k8s.io/queue-name": "lq",
    }
    assert shared["metadata"]["annotations"] == {"rl-batch-demo.agc/run-id": "r1"}
    assert shared["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == "episode-r1"
    assert shared["spec"]["template"]["metadata"]["labels"]["agc-demo-run"] == "r1"
    assert job["metadata"]["name"] == "rollout-r1" and "labels" not in job["metadata"]  # a copy
    renamed = demo.shared_setup(setup, "r1")[0]
    assert renamed["metadata"]["name"] == "episode-r1"
    assert renamed["metadata"]["labels"] == {"agc-demo-run": "r1"}


def test_shared_runs_are_found_by_their_jobs_labels_beside_runs_of_their_own():
    def job(namespace, name, run_id, created):
        return {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": f"uid-{name}",
                "creationTimestamp": created,
                "labels": {"app": "rl-batch-demo", "agc-demo-run": run_id},
                "annotations": {
                    "rl-batch-demo.agc/run-id": run_id,
                    "rl-batch-demo.agc/user": "alice",
                },
            },
            "spec": {"completions": 2, "suspend": True},
            "status": {},
        }

    runs = demo.cluster_runs(
        [],
        [
            job("team-a", "rollout-r1", "r1", "2026-12-07T06:00:00Z"),
            job("team-a", "rollout-r2", "r2", "2026-12-07T06:01:00Z"),
        ],
    )
    assert [(run.place, run.shared, run.user, run.job_uids) for run in runs] == [
        ("team-a/r1", True, "alice", (("rollout-r1", "uid-rollout-r1"),)),
        ("team-a/r2", True, "alice", (("rollout-r2", "uid-rollout-r2"),)),
    ]
    assert runs[0].state == "suspended"  # no queue label: an interrupted run's Job
    queued = job("team-a", "rollout-r3", "r3", "2026-12-07T06:02:00Z")
    queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "lq"
    assert demo.cluster_runs([], [queued])[0].state == "queued"
    queued["status"]["startTime"] = "2026-12-07T06:02:05Z"  # it ran, then was suspended
    assert demo.cluster_runs([], [queued])[0].state == "suspended"


def test_the_admission_bands_span_their_phases_from_the_jobs_creation():
    admission = {
        "queued_at": 100.0,
        "quota_reserved_at": 110.0,
        "admitted_at": 112.0,
        "precision_seconds": 1.0,
    }
    parts = demo.admission_bands(lambda seconds: 10 * seconds, 0, 50, 100.0, admission)
    rects = [part for part in parts if part.startswith("<rect")]
    assert rects == [
        '<rect x="0.0" y="0.0" width="100.0" height="50.0" fill="#cfd8dc" fill-opacity="0.6">'
        "<title>queue_wait: 10 s (+/- 1 s)</title></rect>",
        '<rect x="100.0" y="0.0" width="20.0" height="50.0" fill="#ffe0b2" fill-opacity="0.6">'
        "<title>admission_checks: 2 s (+/- 1 s)</title></rect>",
    ]
    assert demo.admission_bands(lambda s: s, 0, 50, 100.0, None) == []
