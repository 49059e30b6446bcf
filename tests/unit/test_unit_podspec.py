"""What each episode's pod is given (--cpu, --memory, --env, --env-from-secret, --allow-egress):
the flags read and checked, the objects and pods they make, the capacity check that counts them."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

import all_names as demo
from test_cli import dry_run, usage_error


def planned(tmp_path: Path, capsys: Any, *flags: str) -> tuple[dict, list[dict]]:
    """The Job and every object of `run --dry-run` with `flags`."""
    assert demo.main(["run", "--dry-run", "--output", str(tmp_path / "out"), *flags]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    (job,) = [item for item in items if item["kind"] == "Job"]
    return job, items


def test_the_guides_pod_is_unchanged_without_the_flags(tmp_path: Path, capsys: Any) -> None:
    job = dry_run(["--output", str(tmp_path / "out")], capsys)["Job"]
    spec = job["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi"},
    }
    assert "envFrom" not in container and "hostAliases" not in spec
    assert [e["name"] for e in container["env"]] == ["EPISODE_ID"]


@pytest.mark.parametrize(
    "flags, requests, limits",
    [
        (["--cpu", "1"], {"cpu": "1", "memory": "64Mi"}, {"cpu": "1", "memory": "128Mi"}),
        (
            ["--cpu", "250m:2", "--memory", "1Gi"],
            {"cpu": "250m", "memory": "1Gi"},
            {"cpu": "2", "memory": "1Gi"},
        ),
        (
            ["--memory", "256Mi:512Mi"],
            {"cpu": "100m", "memory": "256Mi"},
            {"cpu": "500m", "memory": "512Mi"},
        ),
    ],
)
def test_cpu_and_memory_set_the_request_and_limit(
    flags: list[str], requests: dict, limits: dict, tmp_path: Path, capsys: Any
) -> None:
    job, _ = planned(tmp_path, capsys, *flags)
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": requests, "limits": limits}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--cpu", "2:1"], "--cpu 2:1: the request 2 is over the limit 1"),
        (["--cpu", "0"], "--cpu 0: '0' must be more than 0"),
        (
            ["--cpu", "1Gi"],
            "--cpu 1Gi: '1Gi': CPU is counted in cores (e.g. 2) or millicores (500m)",
        ),
        (["--cpu", "fast"], "--cpu fast: 'fast' is not a quantity (e.g. 500m or 2)"),
        (
            ["--memory", "128m"],
            "--memory 128m: '128m' is 128 thousandths of a byte; did you mean 128Mi?",
        ),
        (["--memory", "1Gi:"], "--memory 1Gi:: '' is not a quantity (e.g. 256Mi or 1Gi)"),
        (["--env", "NOEQUALS"], "--env: 'NOEQUALS' is not KEY=VALUE"),
        (["--env", "1X=2"], "--env: '1X' is not an environment variable's name"),
        (["--env", "TASK_FILE=x"], "--env: TASK_FILE is set by the tool for every episode"),
        (["--env", "A=1", "--env", "A=2"], "--env: A is given twice"),
        (["--env-from-secret", "Bad_Name"], "--env-from-secret: 'Bad_Name' is not a Secret's name"),
        (
            ["--env-from-secret", "a/s", "--env-from-secret", "b/s"],
            "--env-from-secret: two Secrets named s",
        ),
        (
            ["--allow-egress", "10.0.0.0/8"],
            "--allow-egress needs --harden: without it nothing is denied",
        ),
        (
            ["--harden", "--allow-egress", "api.example.com"],
            "'api.example.com' is neither HOST:PORT",
        ),
        (["--harden", "--allow-egress", "10.0.0.300/8"], "'10.0.0.300/8' is not a CIDR"),
        (["--harden", "--allow-egress", "h:99999"], "'h:99999' is neither HOST:PORT"),
        (
            ["--harden", "--allow-egress", "bad_host:443"],
            "'bad_host' is not a host name or an IP address",
        ),
    ],
)
def test_a_pod_setting_out_of_bounds_is_a_usage_error(
    flags: list[str], message: str, tmp_path: Path, capsys: Any
) -> None:
    assert usage_error(["run", "--dry-run", "--output", str(tmp_path / "out"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_env_follows_the_tools_own_and_a_secret_is_referenced_never_read(
    tmp_path: Path, capsys: Any
) -> None:
    job, items = planned(
        tmp_path,
        capsys,
        *("--episode-script", __file__, "--env", "MODEL_URL=http://m:8000/v1", "--env", "K=a=b"),
        *("--env-from-secret", "team-a/openai", "--env-from-secret", "hf-token"),
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][-2:] == [
        {"name": "MODEL_URL", "value": "http://m:8000/v1"},
        {"name": "K", "value": "a=b"},
    ]
    assert container["envFrom"] == [
        {"secretRef": {"name": "openai"}},
        {"secretRef": {"name": "hf-token"}},
    ]
    namespace = items[0]["metadata"]["name"]
    copies = [item for item in items if item["kind"] == "Secret"]
    assert copies == [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {demo.COPIED_FROM_ANNOTATION: source},
            },
            "type": "Opaque",
        }
        for name, source in (("openai", "team-a/openai"), ("hf-token", "hf-token"))
    ]
    # Created before the Jobs, after the namespace.
    kinds = [item["kind"] for item in items]
    assert kinds.index("Secret") < kinds.index("Job")


def test_a_secrets_copy_is_filled_only_as_it_is_created() -> None:
    source = demo.SecretSource("openai", "team-a")
    planned_copy = demo.secret_copy_manifest("agc-rl-1", source)
    found = {
        "metadata": {"name": "openai", "namespace": "team-a", "uid": "u", "resourceVersion": "9"},
        "type": "kubernetes.io/basic-auth",
        "data": {"OPENAI_API_KEY": "c2VjcmV0"},
    }
    made = demo.filled(planned_copy, {"openai": found})
    assert made == dict(planned_copy, data={"OPENAI_API_KEY": "c2VjcmV0"})
    assert "data" not in planned_copy  # the plan (printed by --dry-run) never holds it
    other = {"kind": "ConfigMap", "metadata": {"name": "x"}}
    assert demo.filled(other, {"openai": found}) is other


def fake_resolver(answers: dict[str, list[str]]) -> Any:
    def resolve(host: str, port: int, type: int = 0) -> list[tuple]:
        if host not in answers:
            raise socket.gaierror(-2, "Name or service not known")
        return [(socket.AF_INET, type, 6, "", (address, port)) for address in answers[host]]

    return resolve


def test_allow_egress_lets_out_to_its_addresses_and_ports_alone() -> None:
    request_pod = demo.EpisodePod(
        egress=(
            demo.egress_target("10.20.0.0/16"),
            demo.egress_target("192.168.1.7:8000"),
            demo.egress_target("[2001:db8::1]:443"),
            demo.egress_target("model.internal:443"),
        )
    )
    pod = demo.resolve_egress(
        request_pod,
        resolver=fake_resolver({"model.internal": ["10.9.0.2", "10.9.0.1", "10.9.0.2"]}),
    )
    assert [target.cidrs for target in pod.egress] == [
        ("10.20.0.0/16",),
        ("192.168.1.7/32",),
        ("2001:db8::1/128",),
        ("10.9.0.1/32", "10.9.0.2/32"),
    ]
    policy = demo.egress_policy_manifest("ns", pod.egress)
    assert policy["metadata"] == {"name": "allow-egress", "namespace": "ns"}
    assert policy["spec"]["podSelector"] == {} and policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]},
        {
            "to": [{"ipBlock": {"cidr": "192.168.1.7/32"}}],
            "ports": [{"protocol": "TCP", "port": 8000}],
        },
        {
            "to": [{"ipBlock": {"cidr": "2001:db8::1/128"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
        {
            "to": [{"ipBlock": {"cidr": "10.9.0.1/32"}}, {"ipBlock": {"cidr": "10.9.0.2/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
    ]
    # The pods find the host by the addresses allowed, with no DNS (the deny-all has none).
    job = demo.job_manifest("ns", 2, 2, "img", "cube", harden=True, pod=pod)
    assert job["spec"]["template"]["spec"]["hostAliases"] == [
        {"ip": "10.9.0.1", "hostnames": ["model.internal"]},
        {"ip": "10.9.0.2", "hostnames": ["model.internal"]},
    ]
    with pytest.raises(demo.DemoError, match=r"cannot resolve gone.invalid from this machine"):
        demo.resolve_egress(
            demo.EpisodePod(egress=(demo.egress_target("gone.invalid:443"),)),
            resolver=fake_resolver({}),
        )


def test_the_pod_settings_are_saved_and_read_back_without_secret_values() -> None:
    pod = demo.EpisodePod(
        cpu=("1", "2"),
        env=(("A", "1"),),
        secrets=(demo.SecretSource("openai", "team-a"),),
        egress=(demo.EgressTarget("m:443", ("10.0.0.1/32",), 443, "m"),),
    )
    settings = demo.Settings(count=2, parallelism=2, pod=pod, context="c", namespace="n")
    saved = settings.saved()
    assert saved["cpu"] == {"request": "1", "limit": "2"} and "memory" not in saved
    assert saved["env_from_secret"] == [{"name": "openai", "namespace": "team-a"}]
    assert demo.Settings.from_saved(json.loads(json.dumps(saved))).pod == pod
    assert "cpu" not in demo.Settings(count=2, parallelism=2).saved()


def test_the_capacity_check_counts_the_requests_given() -> None:
    node = {
        "metadata": {"name": "n1"},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for pod, fit in (
        (demo.GUIDE_POD, 40),
        (demo.EpisodePod(cpu=("1", "1")), 4),
        (demo.EpisodePod(memory=("3Gi", "3Gi")), 2),
    ):
        job = demo.job_manifest("ns", 50, 50, "img", "cube", pod=pod)
        requests = job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert demo.capacity_plan([node], None, requests, 50, 50)["episodes_fit_at_once"] == fit


def test_python_keywords_take_the_pod_settings(tmp_path: Path) -> None:
    listing = demo.stream_batch(
        output=tmp_path / "out",
        count=2,
        dry_run=True,
        cpu="1",
        memory="1Gi",
        env={"MODEL_URL": "http://m"},
        env_from_secret=["openai"],
        harden=True,
        allow_egress=["10.0.0.0/8"],
    )
    if not isinstance(listing, dict):  # a generator: its value is the listing
        listing = drain(listing)
    kinds = [item["kind"] for item in listing["items"]]
    assert kinds.count("NetworkPolicy") == 2 and "Secret" in kinds
    (job,) = [item for item in listing["items"] if item["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert {"name": "MODEL_URL", "value": "http://m"} in container["env"]
    with pytest.raises(demo.UsageError, match=r"allow_egress= needs harden=True"):
        demo.run_batch(output=tmp_path / "x", dry_run=True, allow_egress=["10.0.0.0/8"])
    with pytest.raises(demo.UsageError, match=r"cpu='2:1': the request 2 is over the limit 1"):
        demo.run_batch(output=tmp_path / "x", dry_run=True, cpu="2:1")


def drain(generator: Any) -> Any:
    try:
        while True:
            next(generator)
    except StopIteration as stop:
        return stop.value


# --------------------------------------------------------------------------
# --need-groups K: the tool stops the rest once K groups are whole.


def suspended_job(name: str, active: int, stamped: bool = True, ended: str | None = None) -> dict:
    conditions = [
        {"type": "Suspended", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}
    ]
    if ended:
        conditions = [
            {"type": ended, "status": "True", "lastTransitionTime": "2026-01-01T00:00:04Z"}
        ]
    metadata: dict[str, Any] = {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"}
    if stamped:
        metadata["annotations"] = {demo.NEED_GROUPS_ANNOTATION: "2"}
    return {
        "metadata": metadata,
        "spec": {"completions": 2},
        "status": {"active": active, "conditions": conditions},
    }


def test_a_job_the_tool_stopped_has_ended_once_none_of_its_pods_runs() -> None:
    assert demo.job_finished(suspended_job("a", active=2)) is None
    assert demo.job_finished(suspended_job("a", active=0)) == "Complete"
    # Whatever its controller concluded of the pods the stopping deleted.
    failed = suspended_job("a", active=0, ended="Failed")
    assert demo.job_finished(failed) == "Complete" and demo.job_cut_short(failed)
    # Suspended by an interrupt (no stamp): not ended, not cut short.
    interrupted = suspended_job("a", active=0, stamped=False)
    assert demo.job_finished(interrupted) is None and not demo.job_cut_short(interrupted)
    # One Job per image: the batch ends once every one has, one of them Complete on its own.
    jobs = [suspended_job("b-image-1", 0), suspended_job("b-image-2", 0, ended="Complete")]
    merged = demo.merged_job("b", jobs, 2)
    assert demo.job_finished(merged) == "Complete" and demo.cancelled_by_tool(merged)
    assert demo.job_finished(demo.merged_job("b", jobs[:1], 2)) is None


def test_the_rest_is_stopped_once_k_groups_have_every_members_valid_line(tmp_path: Path) -> None:
    settings = demo.Settings(count=6, parallelism=6, rollout=True, group_size=2, need_groups=2)
    stopped: list[int] = []
    stream = demo.RewardStream(
        str(tmp_path / "r.jsonl"), settings, stop_rest=lambda: stopped.append(1)
    )

    def line(index: int, valid: bool = True) -> None:
        row = {"index": index, "valid": valid, "failure_class": None if valid else "infrastructure"}
        stream.deliver(row, None, "", None, streamed=True)

    line(0)
    line(2)
    line(3, valid=False)  # group 1 can never be whole
    line(1)  # group 0 whole
    assert stopped == [] and stream.whole_groups == {0}
    line(4)
    line(5)  # group 2 whole: K = 2 met
    assert stopped == [1]
    stream.close()


def test_an_attach_counts_the_groups_made_whole_before_it(tmp_path: Path) -> None:
    """An attach's stream is given the lines of the client before (kept): the groups they made
    whole count toward K, so the rest is stopped once K are, as it would have been unattached;
    K met by those lines alone stops the rest at the first turn of a Job still running."""
    settings = demo.Settings(count=8, parallelism=8, rollout=True, group_size=2, need_groups=2)

    def row(index: int) -> dict:
        return {"index": index, "valid": True, "failure_class": None}

    stopped: list[int] = []
    stream = demo.RewardStream(
        str(tmp_path / "a.jsonl"),
        settings,
        stop_rest=lambda: stopped.append(1),
        kept=[row(0), row(1), row(4)],
    )
    assert stream.whole_groups == {0}
    stream.deliver(row(5), None, "", None, streamed=True)  # group 2 whole: K = 2 met
    assert stopped == [1]
    stream.close()
    stopped.clear()
    stream = demo.RewardStream(
        str(tmp_path / "b.jsonl"),
        settings,
        stop_rest=lambda: stopped.append(1),
        kept=[row(0), row(1), row(2), row(3)],
    )
    state = demo.BatchState()
    stream.judge(state, {}, [])  # its Job not seen yet: nothing stopped
    assert stopped == []
    state.job = {"metadata": {"name": "j"}, "status": {"active": 4}}
    stream.judge(state, {}, [])
    stream.judge(state, {}, [])
    assert stopped == [1]
    stream.close()


def test_fewer_than_k_whole_groups_fail_the_batch() -> None:
    settings = demo.Settings(count=4, parallelism=4, rollout=True, group_size=2, need_groups=2)
    rows = [
        {
            "index": i,
            "valid": i != 3,
            "failure_class": None if i != 3 else "infrastructure",
            "failure": "lost",
            "task_id": "t",
            "pod": "p",
            "attempts": 1,
        }
        for i in range(4)
    ]
    demo.check_groups_whole(rows[:2] + rows[:2], settings, demo.COMMAND_LINE)
    with pytest.raises(
        demo.DemoError,
        match=r"1 of 2 groups have every member's valid line, fewer than --need-groups 2",
    ):
        demo.check_groups_whole(rows, settings, demo.COMMAND_LINE)
