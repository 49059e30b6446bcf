"""Live sandboxes on the emulator: `pool` and open_pool(), driven through real kubectl's proxy and
the emulator's pod proxy, the sandbox server running in each pod."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import rl_batch_demo
from e2e_support import (
    documentation,
    emulators,
    load,
    run_namespaces,
    running_pods,
    start_tool,
    tool,
    wait_for,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(kubectl 1.35, a started emulator) with its environment set for in-process pools."""
    kubectl = require_e2e("1.35")
    with emulators(tmp_path) as make:
        emulator = make()
        for name, value in emulator.env().items():
            monkeypatch.setenv(name, value)
        yield kubectl, emulator


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def token_of(emulator: Any, namespace: str) -> str:
    import base64

    secret = emulator.get("secrets", namespace, "sandbox-token")
    if "data" in secret:
        return base64.b64decode(secret["data"]["token"]).decode()
    return str(secret["stringData"]["token"])


def test_the_pool_command_plays_the_guides_episode_as_turns(cluster: Any, tmp_path: Path) -> None:
    kubectl, emulator = cluster
    output = tmp_path / "pool"
    result = tool(
        emulator,
        kubectl,
        "pool",
        "--output",
        str(output),
        "--size",
        "2",
        "--episodes",
        "4",
    )
    assert result.returncode == 0, result.stderr
    assert "Episodes: 4, rewards 4.0, successful 4" in result.stdout
    rewards = lines(output / "rewards.jsonl")
    assert sorted(line["index"] for line in rewards) == [0, 1, 2, 3]
    assert all(line["reward"] == 1.0 and line["valid"] for line in rewards)
    assert len({line["sandbox"] for line in rewards}) == 4  # each episode its own fresh pod
    assert all(line["commands"] == 2 and line["image"] == "python:3.12-alpine" for line in rewards)
    commands = lines(output / "commands.jsonl")
    assert [c["exit_code"] for c in commands if c["index"] == 0] == [1, 0]  # fails, then passes
    assert all(c["round_trip_seconds"] >= c["server_seconds"] > 0 for c in commands)
    results = load(output / "results.json")
    block = results["pool"]
    assert (block["size"], block["episodes"], block["reused"]) == (2, 4, False)
    assert block["round_trip_seconds"]["p50"] > 0 and block["commands_per_second"] > 0
    assert block["refill_seconds"]["p50"] is not None  # two pods replaced two let go
    # Each sandbox's start: the container's start (whole seconds) to its server listening.
    started = [p for p in results["sandboxes"] if p["server_start_seconds"] is not None]
    assert len(started) >= 4 and all(-1.0 < p["server_start_seconds"] < 30 for p in started)
    assert block["server_start_seconds"]["precision_seconds"] == 1.0
    with open(output / "episodes.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["index"] for row in rows] == ["0", "1", "2", "3"]
    assert all(float(row["server_ready_at"]) > float(row["pod_created_at"]) - 1 for row in rows)
    assert all(row["server_start_precision_seconds"] == "1.0" for row in rows)
    for name in ("receipt.json", "run.json", "job.json", "pods.json", "events.json"):
        assert (output / name).is_file(), name
    assert len(list(output.glob("pool-*.log"))) >= 4
    token = token_of(emulator, load(output / "receipt.json")["namespace"])
    for saved in output.iterdir():  # the token is never written to the output directory
        assert token not in saved.read_text(errors="replace"), saved.name
    assert token not in result.stdout + result.stderr
    assert tool(emulator, kubectl, "cleanup", "--output", str(output)).returncode == 0
    assert run_namespaces(emulator) == []


def test_the_readme_pool_example_runs_as_written(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubectl, emulator = cluster
    blocks = re.findall(r"```python\n(.*?)```", documentation(), flags=re.S)
    example = next(
        block for block in blocks if "open_pool(" in block and "tasks=tasks" not in block
    )
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kubectl").symlink_to(kubectl)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    rewards = lines(tmp_path / "runs" / "step-3" / "rewards.jsonl")
    assert [(r["reward"], r["valid"]) for r in rewards] == [(1.0, True)]
    assert run_namespaces(emulator) == []


def test_a_sandbox_runs_commands_and_files_as_a_trainer_drives_them(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    with rl_batch_demo.open_pool(
        output=str(tmp_path / "p"), size=1, episodes=1, kubectl=kubectl
    ) as pool:
        with pool.claim(timeout=60) as sandbox:
            assert sandbox.run(["true"]).exit_code == 0
            missing = sandbox.run(["no-such-command"])
            assert missing.exit_code == 127 and "No such file" in missing.stderr
            said = sandbox.run("echo out; echo err >&2; exit 3")
            assert (said.exit_code, said.stdout, said.stderr) == (3, "out\n", "err\n")
            assert sandbox.run(["cat"], stdin=b"\x00in\xff").stdout == "\x00in\ufffd"
            data = bytes(range(256)) * 4
            sandbox.write_file("deep/dir/blob.bin", data)
            assert sandbox.read_file("deep/dir/blob.bin") == data
            with pytest.raises(FileNotFoundError):
                sandbox.read_file("nothing-here")
            assert sandbox.run(["pwd"], cwd="deep").stdout.strip().endswith("/workspace/deep")
            assert sandbox.run("echo $FOO", env={"FOO": "bar"}).stdout == "bar\n"
            # 100 MB printed: kept to the cap, said to be cut.
            big = sandbox.run("head -c 100000000 /dev/zero | tr '\\0' a", timeout=120)
            assert big.truncated and big.exit_code == 0 and 0 < len(big.stdout) < 2_000_000
            # Past its timeout: killed, with what it started, and said so.
            started = time.monotonic()
            with pytest.raises(rl_batch_demo.CommandTimeout) as timed_out:
                sandbox.run("echo begun; sleep 30", timeout=1)
            assert time.monotonic() - started < 15
            assert timed_out.value.result.timed_out and timed_out.value.result.stdout == "begun\n"
            sandbox.finish(reward=0.5, info={"turns": 9})
    rewards = lines(tmp_path / "p" / "rewards.jsonl")
    assert [(r["reward"], r["valid"], r["info"]) for r in rewards] == [(0.5, True, {"turns": 9})]
    assert rewards[0]["commands"] == 8  # the one past its timeout among them
    assert run_namespaces(emulator) == []  # open_pool cleans up by default; the files stay
    assert (tmp_path / "p" / "results.json").is_file()


def test_reuse_gives_the_next_claim_a_pristine_workspace_and_no_daemon(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    with rl_batch_demo.open_pool(
        output=str(tmp_path / "p"), size=1, episodes=2, reuse=True, kubectl=kubectl
    ) as pool:
        with pool.claim(timeout=60) as first:
            first.write_file("left.txt", "from the first episode")
            first.run("nohup sleep 600 >/dev/null 2>&1 & echo $! > daemon.pid")
            daemon = first.read_file("daemon.pid").decode().strip()
            assert first.run(["kill", "-0", daemon]).exit_code == 0
            first.finish(reward=1)
        with pool.claim(timeout=60) as second:
            assert second.pod == first.pod  # the same pod, served again
            assert second.claim_wait_seconds < 1.0 and second.warm
            with pytest.raises(FileNotFoundError):
                second.read_file("left.txt")
            assert second.run(["kill", "-0", daemon]).exit_code != 0  # killed at finish
            second.finish(reward=1)
    results = load(tmp_path / "p" / "results.json")
    assert results["pool"]["reused"] is True and results["episodes"] == 2


def test_a_pod_deleted_during_a_command_loses_the_sandbox_not_the_episode(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    output = tmp_path / "p"
    with rl_batch_demo.open_pool(output=str(output), size=1, episodes=1, kubectl=kubectl) as pool:
        sandbox = pool.claim(timeout=60)
        namespace = pool.run.namespace
        deleting = threading.Timer(
            1.0,
            lambda: subprocess.run(
                [kubectl, "delete", "pod", sandbox.pod, "-n", namespace, "--wait=false"],
                env=emulator.env(),
                capture_output=True,
                timeout=60,
            ),
        )
        deleting.start()
        with pytest.raises(rl_batch_demo.SandboxLost) as lost:
            sandbox.run("sleep 20", timeout=30)
        deleting.join()
        assert lost.value.failure_class == "infrastructure" and sandbox.pod in str(lost.value)
        sandbox.finish(reward=1.0)
        # The lost episode is served again, on a fresh pod the Job made.
        with pool.claim(timeout=60) as again:
            assert again.pod != sandbox.pod
            assert again.run(["true"]).exit_code == 0
            again.finish(reward=1.0)
    rewards = lines(output / "rewards.jsonl")
    assert [(r["failure_class"], r["valid"]) for r in rewards] == [
        ("infrastructure", False),
        (None, True),
    ]


def test_a_claim_that_times_out_says_what_the_pool_is_waiting_for(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    with rl_batch_demo.open_pool(
        output=str(tmp_path / "p"), size=1, episodes=2, kubectl=kubectl
    ) as pool:
        with pool.claim(timeout=60) as held:
            with pytest.raises(rl_batch_demo.DemoError) as waited:
                pool.claim(timeout=2)  # the one sandbox is held; its successor is not made yet
            held.finish(reward=1)
    said = str(waited.value)
    assert "no sandbox became free in 2 s: 0 ready, 1 held, 0 starting, 0 pending" in said, said


TRAINER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import rl_batch_demo
pool = rl_batch_demo.open_pool(output=sys.argv[2], size=2, episodes=8, idle_timeout=3,
                               kubectl=sys.argv[3], cleanup=False)
sandbox = pool.claim(timeout=60)
print(pool.run.namespace, flush=True)
time.sleep(600)
"""


def test_a_trainer_killed_leaves_a_pool_that_idles_out_and_is_reaped(
    cluster: Any, tmp_path: Path
) -> None:
    """SIGKILL: nobody closes the pool. Its sandboxes idle out, which ends its Job (no pod after
    them); `list` shows the pool and `cleanup` reaps it."""
    kubectl, emulator = cluster
    output = tmp_path / "p"
    src = Path(rl_batch_demo.__file__).resolve().parent.parent
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(src), str(output), kubectl],
        env=emulator.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        namespace = trainer.stdout.readline().strip()
        assert namespace.startswith("agc-rl-"), trainer.stderr.read()
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)

        def failed() -> bool:
            job = emulator.get("jobs", namespace, "pool") or {}
            return any(
                c["type"] == "Failed" and c["status"] == "True"
                for c in (job.get("status") or {}).get("conditions") or []
            )

        wait_for(failed, 60, "the idle pool's Job to fail")
        listed = tool(emulator, kubectl, "list", "-o", "json")
        assert namespace in listed.stdout, listed.stdout + listed.stderr
        time.sleep(2)
        pods = json.loads(
            subprocess.run(
                [kubectl, "get", "pods", "-n", namespace, "-o", "json"],
                env=emulator.env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
        )["items"]
        assert len(pods) <= 2, pods  # the ones that idled out (the Job's end deletes the rest)
        assert all(p["status"]["phase"] in ("Failed", "Succeeded") for p in pods), pods
    finally:
        trainer.kill()
    assert tool(emulator, kubectl, "cleanup", "--output", str(output)).returncode == 0
    assert run_namespaces(emulator) == []


def test_open_pool_refuses_bad_keywords_before_anything_is_created(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    with pytest.raises(TypeError):
        rl_batch_demo.open_pool(output=str(tmp_path / "a"), size="2", episodes=2)
    with pytest.raises(ValueError):
        rl_batch_demo.open_pool(output=str(tmp_path / "b"), size=0, episodes=2)
    with pytest.raises(TypeError):
        rl_batch_demo.open_pool(output=str(tmp_path / "c"), size=1, episodes=1, colour="red")
    assert not any((tmp_path / name).exists() for name in "abc")
    assert run_namespaces(emulator) == []
    assert os.environ["KUBECONFIG"]


@pytest.mark.parametrize("retries", [0, 1])
def test_pool_retries_an_episode_whose_pod_was_deleted_on_a_fresh_sandbox(
    cluster: Any, tmp_path: Path, retries: int
) -> None:
    kubectl, emulator = cluster
    turns = tmp_path / "turns.jsonl"
    turns.write_text('{"run": ["sleep", "6"]}\n{"run": ["true"]}\n')
    output = tmp_path / "pool"
    process = start_tool(
        emulator,
        kubectl,
        "pool",
        output=output,
        size=1,
        episodes=1,
        turns=turns,
        retries=retries,
        quiet=True,
    )
    first = wait_for(lambda: running_pods(emulator, output), 60, "the first sandbox running")[0]
    time.sleep(2.5)  # claimed, and its first turn running
    namespace = load(output / "receipt.json")["namespace"]
    subprocess.run(
        [kubectl, "delete", "pod", first["metadata"]["name"], "-n", namespace, "--wait=false"],
        env=emulator.env(),
        capture_output=True,
        timeout=60,
    )
    stdout, stderr = process.communicate(timeout=120)
    rewards = lines(output / "rewards.jsonl")
    assert rewards[0]["sandbox"] == first["metadata"]["name"]
    assert (rewards[0]["failure_class"], rewards[0]["valid"]) == ("infrastructure", False)
    assert "lost" in rewards[0]["failure"]
    if retries:
        assert process.returncode == 0, stderr
        assert len(rewards) == 2 and rewards[1]["sandbox"] != first["metadata"]["name"]
        assert (rewards[1]["reward"], rewards[1]["valid"]) == (1.0, True)
    else:
        assert process.returncode == 1 and len(rewards) == 1, stderr
    assert tool(emulator, kubectl, "cleanup", "--output", str(output)).returncode == 0


def test_pool_prepull_makes_its_image_present_on_every_node_first(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    output = tmp_path / "pool"
    result = tool(
        emulator, kubectl, "pool", "--output", str(output), "--size", "1", "--episodes", "1",
        "--prepull", "--cleanup",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    prepulled = load(output / "prepull.json")
    assert prepulled["images"] == 1 and prepulled["failures"] == []
    assert prepulled["pods"] == prepulled["nodes"] >= 1
    assert load(output / "results.json")["prepull"]["pods"] == prepulled["pods"]
    assert load(output / "results.json")["successful_episodes"] == 1


def test_a_hardened_pool_lets_the_pod_proxy_in_to_the_sandbox_port(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    output = tmp_path / "pool"
    result = tool(
        emulator, kubectl, "pool", "--output", str(output), "--size", "1", "--episodes", "1",
        "--harden",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    namespace = load(output / "receipt.json")["namespace"]
    policy = emulator.get("networkpolicies", namespace, "deny-all-but-sandbox-port")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8377}]}]
    assert load(output / "results.json")["successful_episodes"] == 1
    assert tool(emulator, kubectl, "cleanup", "--output", str(output)).returncode == 0


def kubectl_create(kubectl: str, manifest: dict) -> dict:
    """One object made as the cluster's admin (the fixture's environment names the emulator)."""
    done = subprocess.run(
        [kubectl, "create", "-f", "-", "-o", "json"],
        input=json.dumps(manifest),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def names_in(emulator: Any, kind: str, namespace: str) -> set[str]:
    return {item["metadata"]["name"] for item in emulator.list(kind, namespace)}


def test_two_pools_share_a_namespace_and_each_cleans_up_only_its_own(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    namespace = "team-pools"
    kubectl_create(
        kubectl, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    theirs = kubectl_create(
        kubectl,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "episode", "namespace": namespace},
            "data": {"theirs": "yes"},
        },
    )
    first = rl_batch_demo.open_pool(
        output=str(tmp_path / "a"), size=1, episodes=1, kubectl=kubectl, namespace=namespace
    )
    with first:
        with rl_batch_demo.open_pool(
            output=str(tmp_path / "b"),
            size=1,
            episodes=1,
            kubectl=kubectl,
            namespace=namespace,
            harden=True,
        ) as second:
            receipts = [load(tmp_path / name / "receipt.json") for name in ("a", "b")]
            run_a, run_b = (receipt["run_id"] for receipt in receipts)
            for pool in (first, second):
                with pool.claim(timeout=120) as sandbox:
                    assert sandbox.run(["echo", "hi"]).stdout == "hi\n"
                    sandbox.finish(reward=1.0)
            # Each pool's own objects, named after it and labelled with it, UIDs in its receipt.
            receipts = [load(tmp_path / name / "receipt.json") for name in ("a", "b")]
            assert all(r["shared_namespace"] and "uid" not in r for r in receipts)
            kinds = {(item["kind"], item["name"]) for item in receipts[1]["objects"]}
            assert kinds == {
                ("NetworkPolicy", f"deny-all-but-sandbox-port-{run_b}"),
                ("Secret", f"sandbox-token-{run_b}"),
                ("ConfigMap", f"episode-{run_b}"),
            }
            assert all(item["uid"] for item in receipts[1]["objects"])
            assert set(receipts[0]["jobs"]) == {f"pool-{run_a}"}
            assert names_in(emulator, "jobs", namespace) == {f"pool-{run_a}", f"pool-{run_b}"}
            job = emulator.get("jobs", namespace, f"pool-{run_b}")
            assert job["metadata"]["labels"]["agc-demo-run"] == run_b
        # The second pool closed: its objects are gone, the first's and theirs stay.
        assert names_in(emulator, "jobs", namespace) == {f"pool-{run_a}"}
        assert f"sandbox-token-{run_a}" in names_in(emulator, "secrets", namespace)
        assert f"sandbox-token-{run_b}" not in names_in(emulator, "secrets", namespace)
        assert names_in(emulator, "networkpolicies", namespace) == set()
        assert f"episode-{run_a}" in names_in(emulator, "configmaps", namespace)
        # Its evidence is its own: none of the other pool's pods.
        pods = load(tmp_path / "b" / "pods.json")["items"]
        assert pods and all(p["metadata"]["name"].startswith(f"pool-{run_b}") for p in pods)
    assert names_in(emulator, "jobs", namespace) == set()
    assert names_in(emulator, "configmaps", namespace) - {"kube-root-ca.crt"} == {"episode"}
    assert (
        emulator.get("configmaps", namespace, "episode")["metadata"]["uid"]
        == theirs["metadata"]["uid"]
    )
    assert emulator.get("namespaces", None, namespace) is not None
    assert [r["reward"] for r in lines(tmp_path / "a" / "rewards.jsonl")] == [1.0]


def test_a_pools_sandbox_has_its_resources_env_and_secrets_keys(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, emulator = cluster
    kubectl_create(
        kubectl,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "agent-keys", "namespace": "default"},
            "stringData": {"AGENT_API_KEY": "sk-pool-secret", "REGION": "eu-west"},
        },
    )
    output = tmp_path / "p"
    result = tool(
        emulator,
        kubectl,
        "pool",
        "--output",
        str(output),
        "--size",
        "1",
        "--episodes",
        "1",
        "--cpu",
        "200m:1",
        "--memory",
        "96Mi:256Mi",
        "--env",
        "MODEL_URL=http://model.internal:8000/v1",
        "--env",
        "REGION=us-east",
        "--env-from-secret",
        "default/agent-keys",
        "--turns",
        str(write_turns(tmp_path)),
    )
    assert result.returncode == 0, result.stderr
    commands = lines(output / "commands.jsonl")
    # --env wins over the Secret's key of the same name (REGION); the Secret's key arrives.
    assert commands[-1]["exit_code"] == 0, commands
    pods = load(output / "pods.json")["items"]
    container = pods[0]["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "200m", "memory": "96Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    assert container["envFrom"] == [{"secretRef": {"name": "agent-keys"}}]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["MODEL_URL"] == "http://model.internal:8000/v1" and env["REGION"] == "us-east"
    for saved in output.iterdir():  # the Secret's value is in no file of the pool
        assert "sk-pool-secret" not in saved.read_text(errors="replace"), saved.name
    assert tool(emulator, kubectl, "cleanup", "--output", str(output)).returncode == 0


def write_turns(tmp_path: Path) -> Path:
    """Turns whose last command exits 0 only when the sandbox's environment is as asked."""
    check = (
        'test "$MODEL_URL" = http://model.internal:8000/v1 && test "$REGION" = us-east '
        '&& test "${AGENT_API_KEY#sk-pool-}" = secret'  # the value itself in no turn
    )
    path = tmp_path / "turns.jsonl"
    path.write_text(json.dumps({"shell": check}) + "\n")
    return path
