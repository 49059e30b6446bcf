"""End to end, what each episode's pod is given: --cpu and --memory, --env, --env-from-secret (a
Secret of the user's, copied into the run's namespace, whose values reach the episodes and no file),
and under --harden --allow-egress (a NetworkPolicy the API server takes). On the emulator and on the
real control plane, which holds every object to the real API's validation."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

import all_names as rl_batch_demo
from conftest import on_tiers
from e2e_support import load, run_tool, write_script

pytestmark = pytest.mark.e2e

# Says what its environment holds: the Secret's value only as its digest.
ENV_SCRIPT = """\
import hashlib, json, os, time

def emit(event, **fields):
    print(json.dumps({"event": event, "at": time.time(),
                      "episode_id": os.environ["EPISODE_ID"], **fields}), flush=True)

key = os.environ.get("AGENT_API_KEY")
emit("ready")
emit("reward", reward=1, model_url=os.environ.get("MODEL_URL"), region=os.environ.get("REGION"),
     key_sha256=key and hashlib.sha256(key.encode()).hexdigest())
"""


def kubectl_call(cluster: Any, kubectl: str, *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [kubectl, *args], env=cluster.env(), input=stdin, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def make_secret(
    cluster: Any, kubectl: str, name: str, data: dict[str, str], namespace: str = "default"
) -> None:
    """The user's own Secret in `namespace` (as JSON: the emulator reads no protobuf)."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": data,
    }
    kubectl_call(cluster, kubectl, "create", "-f", "-", stdin=json.dumps(secret))


@on_tiers("emulator", "real_cluster", "real_node")
def test_resources_env_and_a_secrets_keys_reach_every_episode_and_no_file(
    tier: Any, tmp_path: Path
) -> None:
    kubectl, cluster = tier
    value = "sk-" + secrets.token_hex(16)
    name = "agent-keys-" + secrets.token_hex(3)
    make_secret(cluster, kubectl, name, {"AGENT_API_KEY": value, "REGION": "eu-west"})
    output = tmp_path / "out"
    result = run_tool(
        cluster,
        kubectl,
        "run",
        output=output,
        count=2,
        episode_script=write_script(tmp_path, ENV_SCRIPT),
        cpu="200m:1",
        memory="96Mi:256Mi",
        env=["MODEL_URL=http://model.internal:8000/v1", "REGION=us-east"],
        env_from_secret=[f"default/{name}"],
        harden=True,
        allow_egress=["10.1.2.0/24", "127.0.0.1:8443", "localhost:8443"],
        verbose=True,
    )
    assert result.returncode == 0, result.stderr
    assert load(output / "results.json")["successful_episodes"] == 2
    rewards = [
        event
        for log in sorted(output.glob("rollout-*.log"))
        for event in rl_batch_demo.parse_events(log.read_text().splitlines())
        if event["event"] == "reward"
    ]
    # The Secret's keys arrive; --env wins over a Secret's key of the same name (REGION).
    assert [(r["model_url"], r["region"], r["key_sha256"]) for r in rewards] == [
        ("http://model.internal:8000/v1", "us-east", hashlib.sha256(value.encode()).hexdigest())
    ] * 2
    # The value is in no file of the run, and was never printed (even with --verbose).
    for path in output.rglob("*"):
        if path.is_file():
            assert value not in path.read_text(errors="replace"), path
    assert value not in result.stdout + result.stderr
    # The pods carry the reference, and the resources asked for.
    for pod in load(output / "pods.json")["items"]:
        container = pod["spec"]["containers"][0]
        assert container["envFrom"] == [{"secretRef": {"name": name}}]
        assert container["resources"] == {
            "requests": {"cpu": "200m", "memory": "96Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        }
    assert load(output / "run.json")["env_from_secret"] == [{"name": name, "namespace": "default"}]
    assert load(output / "run.json")["capacity"]["per_episode"]["cpu"].startswith("200m")
    # The API server took the egress NetworkPolicy beside the deny-all, and the Secret's copy.
    namespace = load(output / "receipt.json")["namespace"]
    policy = json.loads(
        kubectl_call(
            cluster, kubectl, "get", "networkpolicy", "allow-egress", "-n", namespace, "-o", "json"
        )
    )
    port = [{"protocol": "TCP", "port": 8443}]
    assert policy["spec"]["egress"][:2] == [
        {"to": [{"ipBlock": {"cidr": "10.1.2.0/24"}}]},
        {"to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}], "ports": port},
    ]
    # A host name, resolved as the run started: its addresses, and pinned in the pods' /etc/hosts.
    local = policy["spec"]["egress"][2]
    assert {"ipBlock": {"cidr": "127.0.0.1/32"}} in local["to"] and local["ports"] == port
    for pod in load(output / "pods.json")["items"]:
        assert {"ip": "127.0.0.1", "hostnames": ["localhost"]} in pod["spec"]["hostAliases"]
    copy = json.loads(
        kubectl_call(cluster, kubectl, "get", "secret", name, "-n", namespace, "-o", "json")
    )
    assert (
        copy["metadata"]["annotations"][rl_batch_demo.COPIED_FROM_ANNOTATION] == f"default/{name}"
    )
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0
    kubectl_call(cluster, kubectl, "delete", "secret", name, "-n", "default")


# Says the digests of the two Secrets' keys it was given.
TWO_SECRETS_SCRIPT = """\
import hashlib, json, os, time

def digest(name):
    value = os.environ.get(name)
    return value and hashlib.sha256(value.encode()).hexdigest()

print(json.dumps({"event": "ready", "at": time.time(), "episode_id": os.environ["EPISODE_ID"]}))
print(json.dumps({"event": "reward", "at": time.time(), "episode_id": os.environ["EPISODE_ID"],
                  "reward": 1, "team": digest("TEAM_KEY"), "other": digest("OTHER_KEY")}),
      flush=True)
"""


@on_tiers("emulator", "real_cluster")
def test_in_a_shared_namespace_its_own_secret_is_read_in_place_and_another_copied_after_the_run(
    tier: Any, tmp_path: Path
) -> None:
    """--namespace: a bare NAME is that namespace's Secret, referenced where it is (no copy); a
    Secret of another namespace is copied under the run's suffix, its pods pointed at the copy,
    and cleanup deletes the copy alone."""
    kubectl, cluster = tier
    team = "team-" + secrets.token_hex(3)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}}
    kubectl_call(cluster, kubectl, "create", "-f", "-", stdin=json.dumps(namespace))
    team_value, other_value = "t-" + secrets.token_hex(8), "o-" + secrets.token_hex(8)
    make_secret(cluster, kubectl, "creds", {"TEAM_KEY": team_value}, team)
    other = "keys-" + secrets.token_hex(3)
    make_secret(cluster, kubectl, other, {"OTHER_KEY": other_value})
    output = tmp_path / "out"
    result = run_tool(
        cluster,
        kubectl,
        "run",
        output=output,
        count=1,
        namespace=team,
        episode_script=write_script(tmp_path, TWO_SECRETS_SCRIPT),
        env_from_secret=["creds", f"default/{other}"],
    )
    assert result.returncode == 0, result.stderr
    [reward] = [
        event
        for log in sorted(output.glob("rollout-*.log"))
        for event in rl_batch_demo.parse_events(log.read_text().splitlines())
        if event["event"] == "reward"
    ]
    assert (reward["team"], reward["other"]) == (
        hashlib.sha256(team_value.encode()).hexdigest(),
        hashlib.sha256(other_value.encode()).hexdigest(),
    )
    run_id = load(output / "receipt.json")["run_id"]
    [pod] = load(output / "pods.json")["items"]
    assert pod["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "creds"}},
        {"secretRef": {"name": f"{other}-{run_id}"}},
    ]
    listed = json.loads(kubectl_call(cluster, kubectl, "get", "secrets", "-n", team, "-o", "json"))
    assert {item["metadata"]["name"] for item in listed["items"]} >= {"creds", f"{other}-{run_id}"}
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0
    listed = json.loads(kubectl_call(cluster, kubectl, "get", "secrets", "-n", team, "-o", "json"))
    assert "creds" in {item["metadata"]["name"] for item in listed["items"]}
    assert f"{other}-{run_id}" not in {item["metadata"]["name"] for item in listed["items"]}
    kubectl_call(cluster, kubectl, "delete", "namespace", team, "--wait=false")
    kubectl_call(cluster, kubectl, "delete", "secret", other, "-n", "default")


@on_tiers("emulator", "real_cluster")
def test_a_missing_secret_is_refused_before_anything_is_created(tier: Any, tmp_path: Path) -> None:
    kubectl, cluster = tier
    output = tmp_path / "out"
    result = run_tool(
        cluster, kubectl, "run", output=output, count=1, env_from_secret=["no-such-secret"]
    )
    assert result.returncode == 1
    assert (
        "Error: --env-from-secret no-such-secret: no Secret no-such-secret in the context's "
        "namespace; nothing was created" in result.stderr
    )
    assert not output.exists()  # nothing to keep: nothing was made
