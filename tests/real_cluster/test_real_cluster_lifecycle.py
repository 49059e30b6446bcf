"""On the real control plane: runs that say who they are, `list`, and `cleanup --stale`.

Each user is a client certificate of its own, bound to the README's role (the
RBAC authorizer of kube-apiserver 1.35 decides), and `kubectl auth whoami` is
answered by the real SelfSubjectReview API. Run with
`python3 tests/run_tests.py --python 3.13 -- -m real_cluster tests/real_cluster/test_real_cluster_lifecycle.py`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from e2e_support import PRODUCT, load, run_tool
from test_e2e_lifecycle import GUIDE, held_run, recreating_kubectl, running_run
from test_real_cluster import readme_rbac, user_with

import all_names as rl_batch_demo

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]


def test_a_run_says_who_started_it_as_the_api_server_knows_them(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    kubeconfig = user_with(cluster, kubectl, "ttl-user", readme_rbac())
    output = tmp_path / "out"
    started = time.time()
    result = run_tool(
        cluster,
        kubectl,
        "run",
        count=1,
        ttl="30m",
        output=output,
        quiet=True,
        kubeconfig=kubeconfig,
    )
    assert result.returncode == 0, result.stderr
    receipt = load(output / "receipt.json")
    annotations = cluster.get("namespaces", None, receipt["namespace"])["metadata"]["annotations"]
    expires = rl_batch_demo.parse_time(annotations.pop("rl-batch-demo.agc/expires-at"))
    assert annotations == {
        "rl-batch-demo.agc/run-id": receipt["run_id"],
        "rl-batch-demo.agc/version": rl_batch_demo.__version__,
        "rl-batch-demo.agc/host": socket.gethostname(),
        "rl-batch-demo.agc/output": str(output.resolve()),
        "rl-batch-demo.agc/user": "ttl-user",
        "rl-batch-demo.agc/jobs-planned": "1",
        "rl-batch-demo.agc/episodes-planned": "1",
    }
    assert started + 1800 - 1 <= expires <= time.time() + 1800
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr


def live_runs(cluster) -> set:
    return {
        ns["metadata"]["name"]
        for ns in cluster.list("namespaces")
        if ns["metadata"]["name"].startswith("agc-rl-")
        and not ns["metadata"].get("deletionTimestamp")
    }


def test_list_and_cleanup_stale_on_the_real_api_server(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    alice = user_with(cluster, kubectl, "stale-alice", readme_rbac())
    bob = user_with(cluster, kubectl, "stale-bob", readme_rbac())
    before = live_runs(cluster)  # other tests' runs in this shared cluster, left to them
    ended = {}
    for user, kubeconfig in (("stale-alice", alice), ("stale-bob", bob)):
        result = run_tool(
            cluster,
            kubectl,
            "run",
            count=1,
            output=tmp_path / user,
            quiet=True,
            kubeconfig=kubeconfig,
        )
        assert result.returncode == 0, result.stderr
        ended[user] = load(tmp_path / user / "receipt.json")["namespace"]
    made = subprocess.run(
        [
            sys.executable,
            str(GUIDE),
            "--output",
            str(tmp_path / "guide"),
            "--count",
            "1",
            "--kubectl",
            kubectl,
        ],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    guide = load(tmp_path / "guide" / "receipt.json")["namespace"]
    copy = "agc-rl-c0c0c0c0c0c1"
    cluster.api.create(
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": copy,
                "labels": {"agc-demo-run": copy[7:]},
                "annotations": {
                    "rl-batch-demo.agc/run-id": copy[7:],
                    "rl-batch-demo.agc/user": "stale-alice",
                },
            },
        },
    )
    running, running_ns = running_run(cluster, alice, kubectl, tmp_path, "running")
    expired, expired_ns = running_run(cluster, alice, kubectl, tmp_path, "expired", ttl="1s")
    ours = {ended["stale-alice"], ended["stale-bob"], guide, copy, running_ns, expired_ns}
    try:
        result = run_tool(cluster, kubectl, "list", "-o", "json", kubeconfig=alice)
        assert result.returncode == 0, result.stderr
        runs = {
            item["namespace"]: item
            for item in json.loads(result.stdout)
            if item["namespace"] in ours
        }
        assert {
            name: (item["state"], item["user"], item["guide"]) for name, item in runs.items()
        } == {
            ended["stale-alice"]: ("succeeded", "stale-alice", False),
            ended["stale-bob"]: ("succeeded", "stale-bob", False),
            guide: ("succeeded", None, True),
            copy: ("pending", "stale-alice", False),
            running_ns: ("running", "stale-alice", False),
            expired_ns: ("running", "stale-alice", False),
        }
        assert runs[expired_ns]["expires"] is not None and runs[running_ns]["expires"] is None

        time.sleep(2.5)
        dry = run_tool(cluster, kubectl, "cleanup", stale="2s", dry_run=True, kubeconfig=alice)
        assert dry.returncode == 0, dry.stderr
        assert f"Would delete {ended['stale-alice']}: succeeded" in dry.stdout
        assert f"Would delete {expired_ns}: running, past its --ttl" in dry.stdout
        assert ours <= live_runs(cluster)

        reaped = run_tool(cluster, kubectl, "cleanup", stale="2s", kubeconfig=alice)
        assert reaped.returncode == 0, reaped.stderr
        for name in (ended["stale-alice"], expired_ns):
            assert f"Deleted {name}: " in reaped.stdout
            assert cluster.get("namespaces", None, name) is None
        assert (
            f"Left {ended['stale-bob']}: started by stale-bob, not by you (stale-alice)"
            in reaped.stdout
        )
        assert f"Left {guide}: made by the guide's script" in reaped.stdout
        assert f"Left {copy}: no Job labelled app=rl-batch-demo inside" in reaped.stdout
        assert f"Left {running_ns}: still running" in reaped.stdout
        assert live_runs(cluster) - before == {ended["stale-bob"], guide, copy, running_ns}

        # bob's run, made again under its name (the real API server's own UID check refuses the delete).
        wrapper = recreating_kubectl(tmp_path, kubectl)
        first_uid = load(tmp_path / "stale-bob" / "receipt.json")["uid"]
        env = dict(cluster.env(bob), REAL_KUBECTL=kubectl, RECREATE_NAMESPACE=ended["stale-bob"])
        raced = subprocess.run(
            [sys.executable, str(PRODUCT), "cleanup", "--stale", "2s", "--kubectl", str(wrapper)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert raced.returncode == 0, raced.stderr
        assert (
            f"Left {ended['stale-bob']}: made again under that name since it was listed (its UID is no longer "
            f"{first_uid})" in raced.stdout
        ), raced.stdout
        again = cluster.get("namespaces", None, ended["stale-bob"])
        assert again["metadata"]["uid"] != first_uid and not again["metadata"].get(
            "deletionTimestamp"
        )
    finally:
        for process in (running, expired):
            process.kill()
            process.communicate()
        for name in (copy, running_ns, ended["stale-bob"]):
            cluster.delete("namespaces", None, name)
        subprocess.run(
            [
                sys.executable,
                str(GUIDE),
                "cleanup",
                "--output",
                str(tmp_path / "guide"),
                "--kubectl",
                kubectl,
            ],
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )


def test_a_role_without_patch_on_namespaces_runs_with_the_lock_alone_and_says_so_once(
    real_cluster, tmp_path
):
    kubectl, cluster = real_cluster
    rule = (
        'verbs: ["create", "get", "list", "delete", "patch"]'
        "    # list: `list`, `cleanup --stale`; patch: the follower lease"
    )
    assert rule in readme_rbac()
    without_patch = readme_rbac().replace(rule, 'verbs: ["create", "get", "list", "delete"]')
    kubeconfig = user_with(cluster, kubectl, "no-lease", without_patch)
    output = tmp_path / "out"
    result = run_tool(
        cluster, kubectl, "run", count=2, output=output, quiet=True, kubeconfig=kubeconfig
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "follower lease" in line]
    assert len(warnings) == 1 and "grant patch on namespaces" in warnings[0], result.stderr
    assert "forbidden" in warnings[0]
    assert not (output / "follower.lock").exists()  # held while it followed, then given up
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr


def test_a_role_without_list_on_namespaces_is_told_so(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    rule = (
        'verbs: ["create", "get", "list", "delete", "patch"]'
        "    # list: `list`, `cleanup --stale`; patch: the follower lease"
    )
    assert rule in readme_rbac()
    without_list = readme_rbac().replace(rule, 'verbs: ["create", "get", "delete", "patch"]')
    kubeconfig = user_with(cluster, kubectl, "no-list", without_list)
    for args in (["list"], ["cleanup", "--stale", "1h"]):
        result = run_tool(cluster, kubectl, *args, kubeconfig=kubeconfig)
        assert result.returncode == 1, result.stdout
        assert result.stderr.strip() == (
            f"Error: the account of context '{cluster.context}' may not list namespaces at the cluster scope, "
            f"which `list` and `cleanup --stale` need: grant `list` on namespaces (see the README's Permissions)"
        )


def test_a_run_between_its_batches_is_running_and_reaped_only_once_stopped(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    kubeconfig = user_with(cluster, kubectl, "between-batches", readme_rbac())
    # Round 1 ended and was verified; round 2's Job is not made yet (its create is held).
    process, output = held_run(cluster.env(kubeconfig), kubectl, tmp_path)
    namespace = load(output / "receipt.json")["namespace"]
    try:
        result = run_tool(cluster, kubectl, "list", "-o", "json", kubeconfig=kubeconfig)
        assert result.returncode == 0, result.stderr
        (run,) = [item for item in json.loads(result.stdout) if item["namespace"] == namespace]
        assert (run["state"], run["episodes"], run["succeeded"]) == ("running", 4, 2)
        assert (run["jobs"], run["jobs_planned"], run["between_batches"]) == (1, 2, True)

        kept = run_tool(cluster, kubectl, "cleanup", stale="1h", kubeconfig=kubeconfig)
        assert kept.returncode == 0, kept.stderr
        assert (
            f"Left {namespace}: between batches (1 of 2 Jobs made, the last ended " in kept.stdout
        )
        assert process.poll() is None  # alive all along, about to make round 2

        # Killed there; once its last Job ended longer ago than --stale, reaped.
        process.kill()
        process.communicate()
        time.sleep(2.5)  # round 1 ended before its create was held: more than 2s ago now
        reaped = run_tool(cluster, kubectl, "cleanup", stale="2s", kubeconfig=kubeconfig)
        assert reaped.returncode == 0, reaped.stderr
        assert (
            f"Deleted {namespace}: stopped between batches (1 of 2 Jobs made, the last ended "
            in reaped.stdout
        ), reaped.stdout
        assert cluster.get("namespaces", None, namespace) is None
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        cluster.delete("namespaces", None, namespace)
