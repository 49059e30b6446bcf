"""End to end on the emulator: runs that say who they are, `list`, and `cleanup --stale`.

Each user has a kubeconfig of its own (a bearer token over TLS, as a real cluster's
token file would give), so two users' runs are told apart by what the API server
says of them (`kubectl auth whoami`), not by anything the tool is told.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_support import PRODUCT, load
from kube_emulator import CANONICAL

import rl_batch_demo

pytestmark = pytest.mark.e2e

GUIDE = Path(__file__).resolve().parent / "guide_client.py"


def as_user(emulator, kubeconfig: Path, kubectl: str, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(PRODUCT), *args, "--kubectl", kubectl]
    return subprocess.run(argv, env=emulator.env(kubeconfig), capture_output=True, text=True, timeout=300)


def annotations_of(emulator, output: Path) -> dict:
    namespace = load(output / "receipt.json")["namespace"]
    return emulator.get("namespaces", None, namespace)["metadata"].get("annotations") or {}


def test_a_run_says_who_started_it_from_where_and_until_when(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    alice = emulator.add_user("alice", groups=("rl-team",))
    output = tmp_path / "out"
    started = time.time()
    result = as_user(emulator, alice, kubectl, "run", "--count", "1", "--ttl", "2h", "--output", str(output),
                     "--quiet")
    assert result.returncode == 0, result.stderr
    receipt = load(output / "receipt.json")
    annotations = annotations_of(emulator, output)
    expires = rl_batch_demo.parse_time(annotations.pop("rl-batch-demo.agc/expires-at"))
    assert annotations == {
        "rl-batch-demo.agc/run-id": receipt["run_id"], "rl-batch-demo.agc/version": rl_batch_demo.__version__,
        "rl-batch-demo.agc/host": socket.gethostname(), "rl-batch-demo.agc/output": str(output.resolve()),
        "rl-batch-demo.agc/user": "alice"}
    assert started + 7200 - 1 <= expires <= time.time() + 7200
    # The user is the API server's answer: alice asked it who she is, with her own token.
    reviews = [r for r in emulator.requests if r["path"].endswith("/selfsubjectreviews")]
    assert [(r["method"], r["user"], r["status"]) for r in reviews] == [("POST", "alice", 201)]
    assert load(output / "run.json")["ttl_seconds"] == 7200


def test_without_a_self_review_api_the_user_is_the_kubeconfigs(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(server_version="1.26")
    bob = emulator.add_user("bob")
    output = tmp_path / "out"
    result = as_user(emulator, bob, kubectl, "run", "--count", "1", "--output", str(output), "--quiet")
    assert result.returncode == 0, result.stderr
    annotations = annotations_of(emulator, output)
    assert annotations["rl-batch-demo.agc/user"] == "bob"  # the kubeconfig's user entry, by its name
    assert "rl-batch-demo.agc/expires-at" not in annotations
    reviews = [r for r in emulator.requests if r["path"].endswith("/selfsubjectreviews")]
    assert reviews and all(r["status"] == 404 for r in reviews)


# --------------------------------------------------------------------------
# The emulator answers these requests as kube-apiserver 1.35 does (its answers were
# read from the real control plane of tests/control_plane.py).


def kubectl_as(emulator, kubeconfig: Path, kubectl: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([kubectl, *args], input=stdin, env=emulator.env(kubeconfig), capture_output=True,
                          text=True, timeout=60)


def test_the_emulator_tells_users_apart_and_refuses_as_rbac_does(make_cluster):
    kubectl, make = make_cluster
    emulator = make()
    carol = emulator.add_user("carol", rules=[{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}])
    whoami = kubectl_as(emulator, carol, kubectl, "auth", "whoami", "-o", "json")
    assert whoami.returncode == 0, whoami.stderr
    review = json.loads(whoami.stdout)
    assert (review["kind"], review["apiVersion"]) == ("SelfSubjectReview", "authentication.k8s.io/v1")
    assert review["status"]["userInfo"]["username"] == "carol"
    assert review["status"]["userInfo"]["groups"] == ["system:authenticated"]
    admin = json.loads(kubectl_as(emulator, emulator.kubeconfig, kubectl, "auth", "whoami", "-o", "json").stdout)
    assert admin["status"]["userInfo"]["username"] == "admin"
    assert "system:masters" in admin["status"]["userInfo"]["groups"]

    listed = kubectl_as(emulator, carol, kubectl, "get", "namespaces", "-o", "json")
    assert listed.returncode == 1
    assert 'Error from server (Forbidden): namespaces is forbidden: User "carol" cannot list resource ' \
           '"namespaces" in API group "" at the cluster scope' in listed.stderr
    jobs = kubectl_as(emulator, carol, kubectl, "get", "jobs", "-A", "-o", "json")
    assert 'jobs.batch is forbidden: User "carol" cannot list resource "jobs" in API group "batch" at the ' \
           'cluster scope' in jobs.stderr
    assert kubectl_as(emulator, carol, kubectl, "get", "namespace", "default", "-o", "name").stdout.strip() == \
        "namespace/default"

    stranger = json.loads(emulator.add_user("dave").read_text())
    stranger["users"][0]["user"]["token"] = "not-a-token"
    wrong = Path(emulator.workdir / "wrong.kubeconfig")
    wrong.write_text(json.dumps(stranger))
    refused = kubectl_as(emulator, wrong, kubectl, "get", "namespaces")
    assert refused.returncode == 1 and "Unauthorized" in refused.stderr


def test_a_delete_whose_uid_precondition_fails_is_a_conflict_in_the_api_servers_words(make_cluster):
    kubectl, make = make_cluster
    emulator = make()
    emulator.writes.create_object(CANONICAL["namespaces"], {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": "victim"}})
    uid = emulator.get("namespaces", None, "victim")["metadata"]["uid"]
    body = json.dumps({"kind": "DeleteOptions", "apiVersion": "v1",
                       "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})
    # kubectl streams a body read from stdin (chunked): the server reads it whole.
    conflict = kubectl_as(emulator, emulator.kubeconfig, kubectl, "delete", "--raw", "/api/v1/namespaces/victim",
                          "-f", "-", stdin=body)
    assert conflict.returncode == 1
    assert conflict.stderr.strip().splitlines()[-1] == (
        'Error from server (Conflict): Operation cannot be fulfilled on namespaces "victim": Precondition failed: '
        f'UID in precondition: 00000000-0000-0000-0000-000000000000, UID in object meta: {uid}')
    assert emulator.get("namespaces", None, "victim")["metadata"].get("deletionTimestamp") is None
    deleted = kubectl_as(emulator, emulator.kubeconfig, kubectl, "delete", "--raw", "/api/v1/namespaces/victim",
                         "-f", "-", stdin=json.dumps({"preconditions": {"uid": uid}}))
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["status"]["phase"] == "Terminating"
