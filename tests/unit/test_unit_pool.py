"""Unit tests of the live sandboxes' pure parts: the pool's state as the watch and the probes tell
it, the pods' reasons, the Job a pool is, turns read from a file, and the figures."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import all_names as demo

SHAPE = demo.PoolShape("cube", False, False, 600)


def pod(name: str, phase: str = "Running", ip: str = "10.0.0.1", **status: object) -> dict:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-12-07T00:00:00Z"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "podIP": ip, **status},
    }


def test_a_running_pod_is_probed_once_then_warm_until_claimed() -> None:
    state = demo.PoolState()
    assert state.apply(pod("a", "Pending", ""), False, "pool") is None  # no IP yet: nothing to ask
    view = state.apply(pod("a"), False, "pool")
    assert view is not None and view.probing
    assert state.apply(pod("a"), False, "pool") is None  # already being asked
    assert state.take("pool") is None  # not warm until its server answered
    state.warmed("a", 123.5)
    assert state.counts("pool") == {"warm": 1, "held": 0, "starting": 0, "pending": 0, "gone": 0}
    taken = state.take("pool")
    assert taken is not None and taken.name == "a" and taken.claimed and taken.ready_at == 123.5
    assert state.take("pool") is None
    state.give_back("a")  # a reused sandbox
    assert state.take("pool") is not None


def test_the_oldest_warm_sandbox_of_the_claims_job_is_taken_first() -> None:
    state = demo.PoolState()
    for name, job in (("a", "pool-0"), ("b", "pool-1"), ("c", "pool-1")):
        state.apply(pod(name), False, job)
    state.warmed("c", 1.0)
    state.warmed("b", 2.0)
    state.warmed("a", 3.0)
    assert [state.take("pool-1").name, state.take("pool-1").name] == ["c", "b"]
    assert state.take("pool-1") is None and state.take("pool-0").name == "a"


def test_a_deleted_or_ended_pod_leaves_the_warm_sandboxes_with_its_reason() -> None:
    state = demo.PoolState()
    state.apply(pod("a"), False, "pool")
    state.warmed("a", 1.0)
    terminated = {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    state.apply(pod("a", "Failed", containerStatuses=[terminated]), False, "pool")
    assert state.take("pool") is None
    assert state.pods["a"].reason == "OOMKilled (exit code 137)"
    assert state.counts("pool")["gone"] == 1
    state.apply(pod("b"), False, "pool")
    state.warmed("b", 1.0)
    state.apply(pod("b"), True, "pool")
    assert state.take("pool") is None and state.pods["b"].deleted


def test_the_reasons_of_pods_not_yet_warm_are_counted() -> None:
    state = demo.PoolState()
    unscheduled = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 nodes are available",
    }
    state.apply(pod("a", "Pending", "", conditions=[unscheduled]), False, "pool")
    state.apply(pod("b", "Pending", "", conditions=[unscheduled]), False, "pool")
    waiting = {"state": {"waiting": {"reason": "ImagePullBackOff"}}}
    state.apply(pod("c", "Pending", "", containerStatuses=[waiting]), False, "pool")
    assert state.waiting_reasons("pool") == [
        "2 x Unschedulable: 0/2 nodes are available",
        "1 x ImagePullBackOff",
    ]
    error = demo.claim_timeout(state, "pool", 0.0)
    assert "0 ready, 0 held, 0 starting, 3 pending (2 x Unschedulable" in str(error)
    # No pod at all: the Job's own warnings say why (a quota refused its pods, say).
    quota = 'FailedCreate: pods "pool-x" is forbidden: exceeded quota: q'
    error = demo.claim_timeout(demo.PoolState(), "pool", 0.0, ["old", quota])
    assert str(error).endswith(f"0 pending (old; {quota})"), str(error)
    assert str(demo.claim_timeout(demo.PoolState(), "pool", 0.0)).endswith("(no pod yet)")


def test_a_pool_job_keeps_its_size_warm_and_ends_on_an_idle_sandbox() -> None:
    job = demo.pool_job_manifest("ns", "pool", 4, 16, "python:3.12-alpine", SHAPE)
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"]) == (4, 16)
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "sandbox", "operator": "In", "values": [75]},
    }
    container = spec["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == 8377
    env = {item["name"]: item for item in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["SANDBOX_IDLE_SECONDS"]["value"] == "600"
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "sandbox-token"
    # With reuse, each pod serves many episodes and completes once, at the pool's end.
    reused = demo.pool_job_manifest("ns", "pool", 4, 16, "img", SHAPE._replace(reuse=True))
    assert (reused["spec"]["parallelism"], reused["spec"]["completions"]) == (4, 4)


def test_turns_are_read_from_a_file_and_bad_ones_refused(tmp_path: Path) -> None:
    turns = tmp_path / "turns.jsonl"
    turns.write_text(
        '{"write": "a.py", "text": "x"}\n\n{"run": ["python", "a.py"], "timeout": 5}\n'
    )
    assert demo.read_turns(str(turns)) == (
        {"write": "a.py", "text": "x"},
        {"run": ["python", "a.py"], "timeout": 5},
    )
    turns.write_text('{"sleep": 1}\n')
    with pytest.raises(demo.UsageError, match="line 1: give write, run or shell"):
        demo.read_turns(str(turns))
    turns.write_text("not json\n")
    with pytest.raises(demo.UsageError, match="line 1: not JSON"):
        demo.read_turns(str(turns))


def test_a_command_request_says_argv_or_shell_and_carries_stdin_as_base64() -> None:
    assert json.loads(demo.command_body(["ls", "-l"], 5, None, None, b"\x00\xff")) == {
        "argv": ["ls", "-l"],
        "timeout": 5,
        "cwd": None,
        "env": {},
        "stdin": "AP8=",
    }
    assert json.loads(demo.command_body("echo $X", None, "sub", {"X": "1"}, None))["shell"] == (
        "echo $X"
    )


def test_distributions_are_the_tools_percentiles_and_empty_ones_none() -> None:
    figures = demo.distribution([0.4, 0.1, 0.3, 0.2], (0.5, 0.99))
    assert figures == {"p50": 0.25, "p99": pytest.approx(0.397, abs=1e-6), "max": 0.4}
    assert demo.distribution([], (0.5,)) == {"p50": None, "max": None}


def test_a_hardened_pool_lets_nothing_out_and_only_the_sandbox_port_in() -> None:
    # A deny-all ingress policy, where a CNI enforces it, refuses the API server's pod proxy too:
    # it comes from a node's address. The sandbox port stays open, the token guarding it.
    policy = demo.pool_network_policy_manifest("ns")
    assert policy["spec"] == {
        "podSelector": {},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": demo.SANDBOX_PORT}]}],
    }
    assert "egress" not in policy["spec"]


def serve_once(path: Path, answer: bytes) -> None:
    import socket
    import threading

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def answer_one() -> None:
        connection, _ = listener.accept()
        connection.recv(65536)
        connection.sendall(answer)
        connection.close()
        listener.close()

    threading.Thread(target=answer_one, daemon=True).start()


@pytest.mark.parametrize(
    "answer, on_the_way",
    [
        # `kubectl proxy` with its API server down: its own 500, in plain text.
        (
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: 28\r\n\r\ndial tcp: connection refused",
            True,
        ),
        # The API server's own refusal: a Status.
        (
            b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 30\r\n\r\n{"kind":"Status","code":503}  ',
            True,
        ),
        # The sandbox server's own error: its header.
        (
            b"HTTP/1.1 500 Internal Server Error\r\nX-Sandbox-Answer: 1\r\nContent-Length: 2"
            b"\r\n\r\n{}",
            False,
        ),
    ],
)
def test_an_answer_without_the_sandboxs_header_came_from_the_way_there(
    tmp_path: Path, answer: bytes, on_the_way: bool
) -> None:
    serve_once(tmp_path / "s", answer)
    client = demo.ProxyClient(str(tmp_path / "s"), lambda line: None)
    got = client.request("GET", "/x", None, {}, 10.0)
    assert got.from_api_server is on_the_way


class FlakyPool:
    """What a Sandbox asks of its pool, its requests failing `failures` times first."""

    def __init__(self, failures: int) -> None:
        self.failures, self.asked = failures, 0
        self.state = demo.PoolState()
        self.state.apply(pod("a"), False, "pool")

    def request(self, *args: object) -> object:
        self.asked += 1
        if self.asked <= self.failures:
            raise demo.SandboxLost("a", "500 dial tcp: connection refused")
        return demo.ProxyAnswer(200, b"x", False)


def test_a_retried_request_is_sent_again_while_its_pod_runs(monkeypatch) -> None:
    monkeypatch.setattr(demo.MODULES["pool"].time, "sleep", lambda seconds: None)
    view = demo.PodView("a", "pool")
    flaky = FlakyPool(3)
    sandbox = demo.Sandbox(flaky, view, 0, None, 0.0, True)
    assert sandbox._ask("GET", "file", None, 5.0, True).body == b"x"
    assert flaky.asked == 4 and sandbox.lost is None
    # Without retry (a command), the first failure loses the sandbox, for good.
    once = demo.Sandbox(FlakyPool(1), view, 1, None, 0.0, True)
    with pytest.raises(demo.SandboxLost):
        once._ask("POST", "run", b"{}", 5.0, False)
    with pytest.raises(demo.SandboxLost):
        once._ask("POST", "run", b"{}", 5.0, True)
    assert once.lost is not None


def test_a_retried_request_stops_once_the_pod_is_gone(monkeypatch) -> None:
    monkeypatch.setattr(demo.MODULES["pool"].time, "sleep", lambda seconds: None)
    flaky = FlakyPool(100)
    flaky.state.apply(pod("a", "Failed"), True, "pool")
    sandbox = demo.Sandbox(flaky, demo.PodView("a", "pool"), 0, None, 0.0, True)
    with pytest.raises(demo.SandboxLost):
        sandbox._ask("GET", "file", None, 5.0, True)
    assert flaky.asked == 1


def test_a_pools_episodes_csv_holds_server_ready_and_server_start_with_their_precision() -> None:
    import csv
    import io

    line = {
        "index": 0, "sandbox": "pool-a", "image": "img", "reward": 1.0, "warm": True,
        "commands": 2, "command_seconds": 0.02, "claimed_at": 110.5, "finished_at": 111.0,
        "claim_wait_seconds": 0.00001, "task_id": "t1", "failure_class": None,
        "failure": None, "valid": True,
    }  # fmt: skip
    point = {
        "pod": "pool-a", "pod_created_at": 100.0, "container_started_at": 101.0,
        "server_ready_at": 101.2500004999, "server_start_seconds": 0.25,
    }  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(demo.pool_episodes_csv([line], [point]))))
    assert len(rows) == 1
    row = rows[0]
    # Every point at the microsecond, as a run's episodes.csv and the spans have it.
    assert (row["server_ready_at"], row["server_ready_source"]) == (
        "101.250000",
        "the sandbox server's clock",
    )
    assert (row["server_start_seconds"], row["server_start_precision_seconds"]) == ("0.25", "1.0")
    assert (row["container_started_at"], row["container_started_precision_seconds"]) == (
        "101.000000",
        "1.0",
    )
    assert (row["claimed_at"], row["finished_at"], row["task_id"]) == (
        "110.500000",
        "111.000000",
        "t1",
    )


def planned_pool(harden: bool = False, **options: object) -> tuple[object, dict]:
    """A pool's plan from its options, as pool_request and start_run make them (no cluster)."""
    request = demo.pool_request("out", 4, 16, None, dict(options), demo.COMMAND_LINE)
    settings = SimpleNamespace(
        shared_namespace=request.namespace is not None,
        queue=request.queue,
        pod=demo.episode_pod(request),
        image=request.image,
        image_map=(),
        parallelism=request.parallelism,
        count=request.count,
    )
    run = SimpleNamespace(
        settings=settings,
        namespace=request.namespace or "rl-batch-demo-abc",
        receipt=SimpleNamespace(run_id="abc123"),
    )
    plan = demo.pool_plan(run, SHAPE._replace(harden=harden), "tok", ())
    return plan, {m["kind"]: m for m in plan.setup}


def test_a_pool_in_a_shared_namespace_makes_only_its_own_suffixed_labelled_objects() -> None:
    plan, setup = planned_pool(harden=True, namespace="team", queue="team-queue")
    assert plan.namespace is None  # the namespace is never made (nor deleted)
    names = {kind: m["metadata"]["name"] for kind, m in setup.items()}
    assert names == {
        "NetworkPolicy": "deny-all-but-sandbox-port-abc123",
        "Secret": "sandbox-token-abc123",
        "ConfigMap": "episode-abc123",
    }
    for manifest in setup.values():
        assert manifest["metadata"]["namespace"] == "team"
        assert manifest["metadata"]["labels"][demo.RUN_LABEL] == "abc123"
    # The hardened pool's NetworkPolicy denies only this pool's pods, not the namespace's.
    assert setup["NetworkPolicy"]["spec"]["podSelector"] == {
        "matchLabels": {demo.RUN_LABEL: "abc123"}
    }
    (job,) = plan.jobs[demo.POOL_JOB_NAME]
    assert job["metadata"]["name"] == demo.POOL_JOB_NAME + "-abc123"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert job["metadata"]["labels"][demo.RUN_LABEL] == "abc123"
    template = job["spec"]["template"]
    assert template["metadata"]["labels"][demo.RUN_LABEL] == "abc123"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["token"]["secret"]["secretName"] == "sandbox-token-abc123"
    assert volumes["demo"]["configMap"]["name"] == names["ConfigMap"]


def test_a_pool_in_its_own_namespace_with_a_queue_carries_the_queue_label_alone() -> None:
    plan, setup = planned_pool(queue="q")
    assert plan.namespace is not None
    (job,) = plan.jobs[demo.POOL_JOB_NAME]
    assert job["metadata"]["name"] == demo.POOL_JOB_NAME
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert setup["Secret"]["metadata"]["name"] == "sandbox-token"
    plain, _ = planned_pool()
    assert "kueue.x-k8s.io/queue-name" not in plain.jobs[demo.POOL_JOB_NAME][0]["metadata"].get(
        "labels", {}
    )


def test_a_pools_sandbox_has_its_cpu_memory_env_and_secrets() -> None:
    plan, setup = planned_pool(
        cpu="250m:1", memory="256Mi", env=["MODE=eval", "A=b=c"], env_from_secret=["keys"]
    )
    container = plan.jobs[demo.POOL_JOB_NAME][0]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    env = [item["name"] for item in container["env"]]
    assert env[:4] == ["POD_IP", "SANDBOX_PORT", "SANDBOX_IDLE_SECONDS", "SANDBOX_TOKEN_FILE"]
    # Every variable the server reads is set in `env`, which beats a Secret's keys (envFrom).
    assert set(demo.SERVER_ENV) <= set(env)
    assert {i["name"]: i.get("value") for i in container["env"]}["A"] == "b=c"
    assert container["envFrom"] == [{"secretRef": {"name": "keys"}}]
    # In its own namespace, the Secret is copied there (planned without its data).
    secrets = [m for m in plan.setup if m["kind"] == "Secret"]
    assert [s["metadata"]["name"] for s in secrets] == ["keys", "sandbox-token"]
    assert "data" not in secrets[0]
    # In a shared namespace, the Secret is read where it is: no copy, its own name referenced.
    shared, _ = planned_pool(namespace="team", env_from_secret=["keys"])
    assert [m["metadata"]["name"] for m in shared.setup if m["kind"] == "Secret"] == [
        "sandbox-token-abc123"
    ]
    job = shared.jobs[demo.POOL_JOB_NAME][0]
    assert job["spec"]["template"]["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": "keys"}}
    ]
    # The defaults are the guide's.
    plain, _ = planned_pool()
    default = plain.jobs[demo.POOL_JOB_NAME][0]["spec"]["template"]["spec"]["containers"][0]
    assert default["resources"]["requests"] == {"cpu": "100m", "memory": "64Mi"}
    assert "envFrom" not in default


@pytest.mark.parametrize(
    "options, said",
    [
        ({"env": ["SANDBOX_PORT=1"]}, "--env: SANDBOX_PORT is set by the tool"),
        ({"env": ["NOEQUALS"]}, "--env: 'NOEQUALS' is not KEY=VALUE"),
        ({"cpu": "lots"}, "--cpu lots: 'lots' is not a quantity"),
        (
            {"namespace": "team", "env_from_secret": ["other/keys"]},
            "--env-from-secret other/keys: with --namespace team",
        ),
    ],
)
def test_a_pools_bad_sandbox_settings_are_refused_before_anything(options: dict, said: str) -> None:
    with pytest.raises(demo.UsageError) as caught:
        demo.pool_request("out", 4, 16, None, options, demo.COMMAND_LINE)
    assert str(caught.value).startswith(said), str(caught.value)


class InterruptedConnection:
    """A kept-alive connection whose request is cut by Ctrl-C half-way."""

    sock = None
    timeout = 0.0
    closed = False

    def request(self, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    def close(self) -> None:
        self.closed = True


def test_a_request_cut_by_ctrl_c_leaves_no_half_used_connection_for_the_next(
    tmp_path: Path,
) -> None:
    client = demo.ProxyClient(str(tmp_path / "s"), lambda line: None)
    cut = InterruptedConnection()
    client._local.connection = cut
    with pytest.raises(KeyboardInterrupt):
        client.request("GET", "/x", None, {}, 10.0)
    # The Jobs' suspension that follows the interrupt gets a fresh connection, not "Request-sent".
    assert cut.closed and client._local.connection is None
    serve_once(
        tmp_path / "s", b"HTTP/1.1 200 OK\r\nX-Sandbox-Answer: 1\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert client.request("GET", "/x", None, {}, 10.0).status == 200
