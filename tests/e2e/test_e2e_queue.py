"""End to end: runs in a namespace they share (`--namespace`), and runs queued through Kueue
(`--queue`): only their own objects made and deleted, two runs side by side, the queue's label.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import on_tiers
from e2e_support import load, run_tool, start_tool

pytestmark = pytest.mark.e2e

RUN_LABEL = "agc-demo-run"


def kubectl_json(cluster, kubectl: str, *args: str, manifest: dict | None = None, kubeconfig=None):
    """kubectl ARGS against the cluster as its admin (or `kubeconfig`'s user); its JSON output."""
    done = subprocess.run(
        [kubectl, *args],
        input=None if manifest is None else json.dumps(manifest),
        env=cluster.env(kubeconfig),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else done.stdout


def given_namespace(cluster, kubectl: str, name: str) -> dict:
    """A namespace a user was given, with an object of someone else's in it; its UID and the object's."""
    kubectl_json(
        cluster, kubectl, "create", "-f", "-", "-o", "json", manifest=namespace_manifest(name)
    )
    return kubectl_json(
        cluster,
        kubectl,
        "create",
        "-f",
        "-",
        "-o",
        "json",
        manifest={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "episode", "namespace": name, "labels": {"app": "rl-batch-demo"}},
            "data": {"theirs": "yes"},
        },
    )


def namespace_manifest(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def names_in(cluster, kind: str, namespace: str) -> set[str]:
    return {item["metadata"]["name"] for item in cluster.list(kind, namespace)}


@on_tiers("emulator", "real_cluster")
def test_two_runs_share_a_namespace_and_each_cleans_up_only_its_own(tier, tier_name, tmp_path):
    kubectl, cluster = tier
    namespace = f"team-a-{tmp_path.name[-8:].lower().replace('_', '-')}".strip("-")
    theirs = given_namespace(cluster, kubectl, namespace)
    first = start_tool(
        cluster, kubectl, "run", count=2, namespace=namespace, output=tmp_path / "a", quiet=True
    )
    second = start_tool(
        cluster,
        kubectl,
        "run",
        count=2,
        namespace=namespace,
        harden=True,
        output=tmp_path / "b",
        quiet=True,
    )
    for process in (first, second):
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    receipts = [load(tmp_path / name / "receipt.json") for name in ("a", "b")]
    for receipt, name in zip(receipts, ("a", "b")):
        assert receipt["namespace"] == namespace and receipt["shared_namespace"] is True
        assert "uid" not in receipt and "job_uid" not in receipt  # no namespace, no guide's Job
        assert load(tmp_path / name / "results.json")["reward_sum"] == 2
        assert set(receipt["jobs"]) == {f"rollout-{receipt['run_id']}"}
    kinds = {(item["kind"], item["name"]) for item in receipts[1]["objects"]}
    run_b = receipts[1]["run_id"]
    assert kinds == {("NetworkPolicy", f"deny-all-{run_b}"), ("ConfigMap", f"episode-{run_b}")}
    policy = cluster.get("networkpolicies", namespace, f"deny-all-{run_b}")
    assert policy["spec"]["podSelector"] == {"matchLabels": {RUN_LABEL: run_b}}

    listed = json.loads(run_tool(cluster, kubectl, "list", "-o", "json").stdout)
    mine = {item["run_id"]: item for item in listed if item["namespace"] == namespace}
    assert set(mine) == {receipt["run_id"] for receipt in receipts}
    assert all(item["shared_namespace"] and item["state"] == "succeeded" for item in mine.values())

    # A SIGKILL between a Job's creation and its record leaves the Job out of the receipt: the
    # cleanup finds it by the run's label and deletes it by the UID it has.
    unrecorded = dict(receipts[0], jobs={})
    (tmp_path / "a" / "receipt.json").write_text(json.dumps(unrecorded))
    cleaned = run_tool(cluster, kubectl, "cleanup", output=tmp_path / "a")
    assert cleaned.returncode == 0, cleaned.stderr
    assert "the namespace stays" in cleaned.stdout
    assert "Deleted 2 objects" in cleaned.stdout, cleaned.stdout
    run_a = receipts[0]["run_id"]
    assert f"rollout-{run_a}" not in names_in(cluster, "jobs", namespace)
    assert names_in(cluster, "jobs", namespace) == {f"rollout-{run_b}"}
    assert names_in(cluster, "configmaps", namespace) >= {"episode", f"episode-{run_b}"}
    assert f"episode-{run_a}" not in names_in(cluster, "configmaps", namespace)
    live = cluster.get("configmaps", namespace, "episode")
    assert live["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert cluster.get("namespaces", None, namespace) is not None
    again = run_tool(cluster, kubectl, "cleanup", output=tmp_path / "a")
    assert again.returncode == 0 and "Deleted 0 objects" in again.stdout, again.stdout

    # The second run, its receipt aside, is found by its Jobs' label and reaped by UID.
    time.sleep(1.5)  # older than --stale 1s
    reaped = run_tool(cluster, kubectl, "cleanup", stale="1s")
    assert reaped.returncode == 0, reaped.stderr
    assert f"Deleted {namespace}/{run_b}: succeeded" in reaped.stdout, reaped.stdout
    assert names_in(cluster, "jobs", namespace) == set()
    assert names_in(cluster, "networkpolicies", namespace) == set()
    assert names_in(cluster, "configmaps", namespace) - {"kube-root-ca.crt"} == {"episode"}
    assert cluster.get("namespaces", None, namespace) is not None


def test_a_namespace_that_does_not_exist_is_said_and_nothing_is_made(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    result = run_tool(
        emulator, kubectl, "run", count=1, namespace="nowhere", output=tmp_path / "out", quiet=True
    )
    assert result.returncode == 1
    assert "namespace 'nowhere' does not exist" in result.stderr, result.stderr
    assert "nothing was created" in result.stderr and "Traceback" not in result.stderr
    names = {ns["metadata"]["name"] for ns in emulator.list("namespaces")}
    assert not [name for name in names if name.startswith("agc-rl-") or name == "nowhere"]


def test_a_shared_runs_receipt_is_read_back_and_never_names_the_namespace_for_deletion(tmp_path):
    import all_names as demo

    receipt = demo.Receipt.start(str(tmp_path), "ctx", "team-a", "abc", shared=True)
    receipt.save()
    receipt.record_object("ConfigMap", "episode-abc", "u1")
    receipt.record_job("rollout-abc", "u2")
    again = demo.Receipt.read(str(tmp_path))
    assert again.shared and again.namespace == "team-a"
    assert again.objects() == [
        {"kind": "ConfigMap", "name": "episode-abc", "uid": "u1"},
        {"kind": "Job", "name": "rollout-abc", "uid": "u2"},
    ]
    assert json.loads(Path(receipt.path).read_text()).get("job_uid") is None
