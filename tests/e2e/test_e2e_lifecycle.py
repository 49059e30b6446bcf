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

from e2e_support import PRODUCT, load, run_tool, start_tool, wait_for
from kube_emulator import CANONICAL

import all_names as rl_batch_demo

pytestmark = pytest.mark.e2e

GUIDE = Path(__file__).resolve().parent.parent / "support" / "guide_client.py"


def annotations_of(emulator, output: Path) -> dict:
    namespace = load(output / "receipt.json")["namespace"]
    return emulator.get("namespaces", None, namespace)["metadata"].get("annotations") or {}


def test_a_run_says_who_started_it_from_where_and_until_when(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    alice = emulator.add_user("alice", groups=("rl-team",))
    output = tmp_path / "out"
    started = time.time()
    result = run_tool(
        emulator, kubectl, "run", count=1, ttl="2h", output=output, quiet=True, kubeconfig=alice
    )
    assert result.returncode == 0, result.stderr
    receipt = load(output / "receipt.json")
    annotations = annotations_of(emulator, output)
    expires = rl_batch_demo.parse_time(annotations.pop("rl-batch-demo.agc/expires-at"))
    assert annotations == {
        "rl-batch-demo.agc/run-id": receipt["run_id"],
        "rl-batch-demo.agc/version": rl_batch_demo.__version__,
        "rl-batch-demo.agc/host": socket.gethostname(),
        "rl-batch-demo.agc/output": str(output.resolve()),
        "rl-batch-demo.agc/user": "alice",
        "rl-batch-demo.agc/jobs-planned": "1",
        "rl-batch-demo.agc/episodes-planned": "1",
    }
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
    result = run_tool(emulator, kubectl, "run", count=1, output=output, quiet=True, kubeconfig=bob)
    assert result.returncode == 0, result.stderr
    annotations = annotations_of(emulator, output)
    assert (
        annotations["rl-batch-demo.agc/user"] == "bob"
    )  # the kubeconfig's user entry, by its name
    assert "rl-batch-demo.agc/expires-at" not in annotations
    reviews = [r for r in emulator.requests if r["path"].endswith("/selfsubjectreviews")]
    assert reviews and all(r["status"] == 404 for r in reviews)


# --------------------------------------------------------------------------
# The emulator answers these requests as kube-apiserver 1.35 does (its answers were
# read from the real control plane of tests/support/control_plane.py).


def kubectl_as(
    emulator, kubeconfig: Path, kubectl: str, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [kubectl, *args],
        input=stdin,
        env=emulator.env(kubeconfig),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_emulator_tells_users_apart_and_refuses_as_rbac_does(make_cluster):
    kubectl, make = make_cluster
    emulator = make()
    carol = emulator.add_user(
        "carol", rules=[{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]
    )
    whoami = kubectl_as(emulator, carol, kubectl, "auth", "whoami", "-o", "json")
    assert whoami.returncode == 0, whoami.stderr
    review = json.loads(whoami.stdout)
    assert (review["kind"], review["apiVersion"]) == (
        "SelfSubjectReview",
        "authentication.k8s.io/v1",
    )
    assert review["status"]["userInfo"]["username"] == "carol"
    assert review["status"]["userInfo"]["groups"] == ["system:authenticated"]
    admin = json.loads(
        kubectl_as(emulator, emulator.kubeconfig, kubectl, "auth", "whoami", "-o", "json").stdout
    )
    assert admin["status"]["userInfo"]["username"] == "admin"
    assert "system:masters" in admin["status"]["userInfo"]["groups"]

    listed = kubectl_as(emulator, carol, kubectl, "get", "namespaces", "-o", "json")
    assert listed.returncode == 1
    assert (
        'Error from server (Forbidden): namespaces is forbidden: User "carol" cannot list resource '
        '"namespaces" in API group "" at the cluster scope' in listed.stderr
    )
    jobs = kubectl_as(emulator, carol, kubectl, "get", "jobs", "-A", "-o", "json")
    assert (
        'jobs.batch is forbidden: User "carol" cannot list resource "jobs" in API group "batch" at the '
        "cluster scope" in jobs.stderr
    )
    assert (
        kubectl_as(
            emulator, carol, kubectl, "get", "namespace", "default", "-o", "name"
        ).stdout.strip()
        == "namespace/default"
    )

    stranger = json.loads(emulator.add_user("dave").read_text())
    stranger["users"][0]["user"]["token"] = "not-a-token"
    wrong = Path(emulator.workdir / "wrong.kubeconfig")
    wrong.write_text(json.dumps(stranger))
    refused = kubectl_as(emulator, wrong, kubectl, "get", "namespaces")
    assert refused.returncode == 1 and "Unauthorized" in refused.stderr


def test_a_delete_whose_uid_precondition_fails_is_a_conflict_in_the_api_servers_words(make_cluster):
    kubectl, make = make_cluster
    emulator = make()
    emulator.writes.create_object(
        CANONICAL["namespaces"],
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "victim"}},
    )
    uid = emulator.get("namespaces", None, "victim")["metadata"]["uid"]
    body = json.dumps(
        {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"},
        }
    )
    # kubectl streams a body read from stdin (chunked): the server reads it whole.
    conflict = kubectl_as(
        emulator,
        emulator.kubeconfig,
        kubectl,
        "delete",
        "--raw",
        "/api/v1/namespaces/victim",
        "-f",
        "-",
        stdin=body,
    )
    assert conflict.returncode == 1
    assert conflict.stderr.strip().splitlines()[-1] == (
        'Error from server (Conflict): Operation cannot be fulfilled on namespaces "victim": Precondition failed: '
        f"UID in precondition: 00000000-0000-0000-0000-000000000000, UID in object meta: {uid}"
    )
    assert emulator.get("namespaces", None, "victim")["metadata"].get("deletionTimestamp") is None
    deleted = kubectl_as(
        emulator,
        emulator.kubeconfig,
        kubectl,
        "delete",
        "--raw",
        "/api/v1/namespaces/victim",
        "-f",
        "-",
        stdin=json.dumps({"preconditions": {"uid": uid}}),
    )
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["status"]["phase"] == "Terminating"


# --------------------------------------------------------------------------
# `list` and `cleanup --stale`: runs of two users, the guide's, a running one, an expired
# one and a namespace that only copies what a run's looks like.

# Says ready, then works for a long time: a run that is still running.
SLOW_SCRIPT = """\
import json, os, time
print(json.dumps({"event": "ready", "at": time.time(), "episode_id": os.environ["EPISODE_ID"]}), flush=True)
time.sleep(600)
"""


def running_run(cluster, kubeconfig: Path, kubectl: str, tmp_path: Path, name: str, **flags):
    """A run of one slow episode as the user of `kubeconfig` (more `flags` added), once its Job is
    there: (process, namespace)."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_SCRIPT)
    output = tmp_path / name
    process = start_tool(
        cluster,
        kubectl,
        "run",
        count=1,
        episode_script=script,
        output=output,
        quiet=True,
        kubeconfig=kubeconfig,
        **flags,
    )
    namespace = wait_for(
        lambda: (output / "receipt.json").exists() and load(output / "receipt.json")["namespace"],
        90,
        "the receipt",
    )
    wait_for(
        lambda: cluster.get("jobs", namespace, "rollout") is not None, 90, f"the Job in {namespace}"
    )
    return process, namespace


def guide_run(emulator, kubectl: str, output: Path) -> str:
    made = subprocess.run(
        [sys.executable, str(GUIDE), "--output", str(output), "--count", "1", "--kubectl", kubectl],
        env=emulator.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    return load(output / "receipt.json")["namespace"]


def copied_namespace(emulator, name: str, user: str) -> None:
    """A namespace that looks like a run's (name, label, annotations) with no Job of the tool inside."""
    run_id = name[len("agc-rl-") :]
    emulator.writes.create_object(
        CANONICAL["namespaces"],
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": {"agc-demo-run": run_id},
                "annotations": {"rl-batch-demo.agc/run-id": run_id, "rl-batch-demo.agc/user": user},
            },
        },
    )


def listed(emulator, kubeconfig: Path, kubectl: str) -> dict:
    result = run_tool(emulator, kubectl, "list", "-o", "json", kubeconfig=kubeconfig)
    assert result.returncode == 0, result.stderr
    return {item["namespace"]: item for item in json.loads(result.stdout)}


def live(emulator) -> set:
    names = (ns["metadata"]["name"] for ns in emulator.list("namespaces"))
    return {name for name in names if name.startswith("agc-rl-")}


def test_list_shows_every_run_and_cleanup_stale_reaps_only_what_it_proves(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    alice, bob = emulator.add_user("alice"), emulator.add_user("bob")
    ended = {}
    for user, kubeconfig in (("alice", alice), ("bob", bob)):
        result = run_tool(
            emulator,
            kubectl,
            "run",
            count=2,
            output=tmp_path / user,
            quiet=True,
            kubeconfig=kubeconfig,
        )
        assert result.returncode == 0, result.stderr
        ended[user] = load(tmp_path / user / "receipt.json")["namespace"]
    guide = guide_run(emulator, kubectl, tmp_path / "guide")
    copy = "agc-rl-c0c0c0c0c0c0"
    copied_namespace(emulator, copy, "alice")
    running, running_ns = running_run(emulator, alice, kubectl, tmp_path, "running")
    expired, expired_ns = running_run(emulator, alice, kubectl, tmp_path, "expired", ttl="1s")
    try:
        runs = listed(emulator, alice, kubectl)
        assert set(runs) == {ended["alice"], ended["bob"], guide, copy, running_ns, expired_ns}
        fields = {
            "namespace",
            "run_id",
            "state",
            "age_seconds",
            "episodes",
            "succeeded",
            "user",
            "host",
            "output",
            "expires",
            "guide",
        }
        assert all(fields <= set(item) for item in runs.values())
        assert {
            name: (item["state"], item["user"], item["guide"]) for name, item in runs.items()
        } == {
            ended["alice"]: ("succeeded", "alice", False),
            ended["bob"]: ("succeeded", "bob", False),
            guide: ("succeeded", None, True),
            copy: ("pending", "alice", False),
            running_ns: ("running", "alice", False),
            expired_ns: ("running", "alice", False),
        }
        assert (runs[ended["bob"]]["episodes"], runs[ended["bob"]]["succeeded"]) == (2, 2)
        assert runs[ended["alice"]]["output"] == str((tmp_path / "alice").resolve())
        assert runs[ended["alice"]]["expires"] is None and runs[expired_ns]["expires"] is not None
        table = run_tool(emulator, kubectl, "list", kubeconfig=alice)
        assert table.returncode == 0 and len(table.stdout.splitlines()) == 7, table.stdout

        time.sleep(
            2.5
        )  # every run is now older than --stale 2s, and the expired one past its --ttl
        dry = run_tool(emulator, kubectl, "cleanup", stale="2s", dry_run=True, kubeconfig=alice)
        assert dry.returncode == 0, dry.stderr
        assert f"Would delete {ended['alice']}: succeeded" in dry.stdout
        assert f"Would delete {expired_ns}: running, past its --ttl" in dry.stdout
        assert "Would delete 2, left 4 of 6 runs" in dry.stdout
        assert live(emulator) == set(runs)
        assert not any(r["method"] == "DELETE" for r in emulator.requests)

        reaped = run_tool(emulator, kubectl, "cleanup", stale="2s", kubeconfig=alice)
        assert reaped.returncode == 0, reaped.stderr
        assert f"Deleted {ended['alice']}: succeeded" in reaped.stdout
        assert f"Deleted {expired_ns}: running, past its --ttl" in reaped.stdout
        assert f"Left {ended['bob']}: started by bob, not by you (alice)" in reaped.stdout
        assert f"Left {guide}: made by the guide's script" in reaped.stdout
        assert f"Left {copy}: no Job labelled app=rl-batch-demo inside" in reaped.stdout
        assert f"Left {running_ns}: still running" in reaped.stdout
        assert live(emulator) == {ended["bob"], guide, copy, running_ns}
        # Each deletion carried the namespace's UID as a precondition.
        deletes = [r for r in emulator.requests if r["method"] == "DELETE"]
        assert sorted(r["path"] for r in deletes) == sorted(
            f"/api/v1/namespaces/{n}" for n in (ended["alice"], expired_ns)
        )

        everyone = run_tool(
            emulator, kubectl, "cleanup", stale="2s", all_users=True, kubeconfig=emulator.kubeconfig
        )
        assert everyone.returncode == 0, everyone.stderr
        assert f"Deleted {ended['bob']}: succeeded" in everyone.stdout
        assert live(emulator) == {guide, copy, running_ns}
    finally:
        for process in (running, expired):
            process.kill()
            process.communicate()


# A kubectl that, on the namespace's DELETE, first deletes the namespace and makes it again
# under the same name (a new UID), then sends the DELETE: the namespace the tool listed is
# gone and another stands in its place, between the listing and the delete.
RECREATING_KUBECTL = """#!%(python)s
import json, os, subprocess, sys, time
real, name = os.environ["REAL_KUBECTL"], os.environ["RECREATE_NAMESPACE"]
args = sys.argv[1:]
if "--raw" in args and "/api/v1/namespaces/" + name in args:
    head = args[:args.index("delete")]
    old = json.loads(subprocess.run([real, *head, "get", "namespace", name, "-o", "json"], capture_output=True,
                                    text=True, check=True).stdout)
    subprocess.run([real, *head, "delete", "namespace", name, "--wait=true"], capture_output=True, check=True)
    meta = {k: old["metadata"][k] for k in ("name", "labels", "annotations") if k in old["metadata"]}
    subprocess.run([real, *head, "create", "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": meta}), capture_output=True, text=True, check=True)
os.execv(real, [real, *args])
"""


def recreating_kubectl(tmp_path: Path, kubectl: str) -> Path:
    path = tmp_path / "recreating-kubectl"
    path.write_text(RECREATING_KUBECTL % {"python": sys.executable})
    path.chmod(0o755)
    return path


def test_a_namespace_made_again_between_the_listing_and_the_delete_is_left_alone(
    make_cluster, tmp_path
):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    made = run_tool(
        emulator, kubectl, "run", count=1, output=output, quiet=True, kubeconfig=emulator.kubeconfig
    )
    assert made.returncode == 0, made.stderr
    namespace, first_uid = (
        load(output / "receipt.json")["namespace"],
        load(output / "receipt.json")["uid"],
    )
    time.sleep(1.5)
    wrapper = recreating_kubectl(tmp_path, kubectl)
    env = dict(emulator.env(), REAL_KUBECTL=kubectl, RECREATE_NAMESPACE=namespace)
    reaped = subprocess.run(
        [sys.executable, str(PRODUCT), "cleanup", "--stale", "1s", "--kubectl", str(wrapper)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reaped.returncode == 0, reaped.stderr
    assert (
        f"Left {namespace}: made again under that name since it was listed (its UID is no longer {first_uid})"
        in reaped.stdout
    ), reaped.stdout
    again = emulator.get("namespaces", None, namespace)
    assert again is not None and again["metadata"]["uid"] != first_uid
    assert again["metadata"].get("deletionTimestamp") is None
    conflicts = [r for r in emulator.requests if r["method"] == "DELETE" and r["status"] == 409]
    assert len(conflicts) == 1


@pytest.mark.parametrize("denied, what", [("namespaces", "namespaces"), ("jobs", "jobs (batch)")])
def test_without_list_permission_list_and_cleanup_stale_say_which(
    make_cluster, tmp_path, denied, what
):
    kubectl, make = make_cluster
    emulator = make()
    # Everything but `list` on one of the two.
    rules = [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "create", "delete", "watch"]},
        {
            "apiGroups": ["", "batch"],
            "resources": [r for r in ("namespaces", "jobs") if r != denied],
            "verbs": ["list"],
        },
    ]
    erin = emulator.add_user("erin", rules=rules)
    for args in (["list"], ["list", "-o", "json"], ["cleanup", "--stale", "1h"]):
        result = run_tool(emulator, kubectl, *args, kubeconfig=erin)
        assert result.returncode == 1, result.stdout
        assert result.stdout == ""
        assert result.stderr.strip() == (
            f"Error: the account of context 'kube-emulator' may not list {what} at the cluster scope, which "
            f"`list` and `cleanup --stale` need: grant `list` on {what} (see the README's Permissions)"
        )


# --------------------------------------------------------------------------
# A run of several batches makes each batch's Jobs only when that batch starts: between two,
# every Job there is has ended. This kubectl holds the create of one Job (HOLD_JOB), having said
# so in HOLD_FILE, until the tool gives up on the call (CALL_TIMEOUT_SECONDS, 60 s; the steps
# the test takes meanwhile are a few kubectl calls): the run is caught alive between its batches.
HOLDING_KUBECTL = """#!%(python)s
import json, os, subprocess, sys, time
real, job, held = os.environ["REAL_KUBECTL"], os.environ["HOLD_JOB"], os.environ["HOLD_FILE"]
args = sys.argv[1:]
if "create" in args and "-f" in args:
    text = sys.stdin.read()
    try:
        name = json.loads(text)["metadata"]["name"]
    except (ValueError, KeyError, TypeError):
        name = None
    if name == job:
        open(held, "a").close()
        while True:
            time.sleep(1)
    done = subprocess.run([real, *args], input=text, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    sys.exit(done.returncode)
os.execv(real, [real, *args])
"""


def backdate(emulator, store: str, namespace: str | None, name: str, seconds: float) -> None:
    """Move an object's times `seconds` into the past, as if that much time had gone by since."""

    def earlier(text: str) -> str:
        return rl_batch_demo.rfc3339(rl_batch_demo.parse_time(text) - seconds)

    def mutate(obj: dict) -> None:
        metadata, status = obj["metadata"], obj.get("status") or {}
        metadata["creationTimestamp"] = earlier(metadata["creationTimestamp"])
        for key in ("startTime", "completionTime"):
            if status.get(key):
                status[key] = earlier(status[key])
        for entry in status.get("conditions") or []:
            for key in ("lastProbeTime", "lastTransitionTime"):
                if entry.get(key):
                    entry[key] = earlier(entry[key])

    assert emulator.store.update(store, namespace, name, mutate) is not None


def held_run(env: dict, kubectl: str, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A `--rounds 2` run of 2 episodes each (env: its cluster's), held alive between its
    batches: (process, output) once round 1 ended and the tool is making round 2's Job."""
    holding, held, output = tmp_path / "holding-kubectl", tmp_path / "held", tmp_path / "out"
    holding.write_text(HOLDING_KUBECTL % {"python": sys.executable})
    holding.chmod(0o755)
    process = subprocess.Popen(
        [sys.executable, str(PRODUCT), "run", "--count", "2", "--rounds", "2"]
        + ["--output", str(output), "--quiet", "--kubectl", str(holding)],
        env=dict(env, REAL_KUBECTL=kubectl, HOLD_JOB="rollout-2", HOLD_FILE=str(held)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: held.exists() or process.poll() is not None, 180, "round 2's create")
        assert process.poll() is None, process.communicate()
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.communicate()
        raise
    return process, output


def test_a_run_between_its_batches_is_running_and_reaped_only_once_stopped_and_stale(
    make_cluster, tmp_path
):
    kubectl, make = make_cluster
    emulator = make()
    # Round 1 ended and was verified; round 2's Job is not made yet.
    process, output = held_run(emulator.env(), kubectl, tmp_path)
    try:
        namespace = load(output / "receipt.json")["namespace"]
        assert emulator.get("jobs", namespace, "rollout-1")["status"]["succeeded"] == 2
        assert emulator.get("jobs", namespace, "rollout-2") is None
        annotations = emulator.get("namespaces", None, namespace)["metadata"]["annotations"]
        assert annotations["rl-batch-demo.agc/jobs-planned"] == "2"
        assert annotations["rl-batch-demo.agc/episodes-planned"] == "4"

        run = listed(emulator, emulator.kubeconfig, kubectl)[namespace]
        assert (run["state"], run["episodes"], run["succeeded"]) == ("running", 4, 2)
        assert (run["jobs"], run["jobs_planned"], run["between_batches"]) == (1, 2, True)
        table = run_tool(emulator, kubectl, "list", kubeconfig=emulator.kubeconfig)
        assert table.returncode == 0, table.stderr
        row = table.stdout.splitlines()[1].split()  # NAMESPACE STATE AGE EPISODES ...
        assert (row[0], row[1], row[3]) == (namespace, "running", "2/4")

        # Two hours old, round 1 ended just now: alive as far as the cluster can tell, so left.
        backdate(emulator, "namespaces", None, namespace, 7200)
        kept = run_tool(emulator, kubectl, "cleanup", stale="1h", kubeconfig=emulator.kubeconfig)
        assert kept.returncode == 0, kept.stderr
        assert (
            f"Left {namespace}: between batches (1 of 2 Jobs made, the last ended " in kept.stdout
        )
        assert "Deleted 0, left 1 of 1 runs" in kept.stdout, kept.stdout
        assert not any(r["method"] == "DELETE" for r in emulator.requests)
        assert (
            emulator.get("namespaces", None, namespace)["metadata"].get("deletionTimestamp") is None
        )
        assert process.poll() is None  # the run was alive all along, about to make round 2

        # Killed there: nothing more comes. Once its last Job ended longer ago than --stale, reaped.
        process.kill()
        process.communicate()
        assert listed(emulator, emulator.kubeconfig, kubectl)[namespace]["state"] == "running"
        backdate(emulator, "jobs", namespace, "rollout-1", 7200)
        reaped = run_tool(emulator, kubectl, "cleanup", stale="1h", kubeconfig=emulator.kubeconfig)
        assert reaped.returncode == 0, reaped.stderr
        assert (
            f"Deleted {namespace}: stopped between batches (1 of 2 Jobs made, the last ended 2h"
            in reaped.stdout
        ), reaped.stdout
        assert live(emulator) == set()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
