"""End to end, the features beyond the guide (context, cap, progress, episode scripts, dry run,
harden, --cleanup): the real tool and real kubectl against the emulator, each feature held against the files it writes,
what it prints, and what the emulator saw.

Faults and scripts keep the batches small (1-4 episodes) except where the size is
the point (30 episodes past the default cap of 20)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from e2e_support import (
    PRODUCT,
    REPO_ROOT,
    assert_evidence_saved,
    load,
    run_namespaces,
    run_tool,
    start_tool,
    tool,
    wait_for,
    write_script,
)
from conftest import on_tiers
from kube_emulator import Emulator, pod_security_violations

import all_names as rl_batch_demo

pytestmark = pytest.mark.e2e

README = REPO_ROOT / "README.md"

# The README's example, kept identical to it (test_readme_example_is_the_one_tested checks).
ZERO_REWARD_SCRIPT = """\
# zero_reward.py: an episode whose agent fails; the run reports reward 0 honestly.
import json, os, sys, time

def emit(event, **fields):
    print(json.dumps({"event": event, "at": time.time(),
                      "episode_id": os.environ["EPISODE_ID"], **fields}), flush=True)

emit("ready", task=int(os.environ.get("EPISODE_INDEX", "0")))
emit("reward", reward=0)
"""

EMIT = """\
import json, os, sys, time

def emit(event, **fields):
    print(json.dumps({"event": event, "at": time.time(),
                      "episode_id": os.environ["EPISODE_ID"], **fields}), flush=True)
"""

# Half reward; says which task (EPISODE_INDEX) it picked.
HALF_REWARD_SCRIPT = (
    EMIT
    + """
index = int(os.environ["EPISODE_INDEX"])
emit("ready", index=index, job_completion_index=os.environ.get("JOB_COMPLETION_INDEX"))
emit("reward", reward=0.5, index=index)
"""
)

JUNK_SCRIPT = (
    EMIT
    + """
print("agent: thinking...", flush=True)
print("{not json at all", flush=True)
print('{"no_event_key": 1}', flush=True)
print("[1, 2, 3]", flush=True)
emit("ready")
print("   ", flush=True)
print('{"event": "progress", "step": 1}', flush=True)
emit("reward", reward=1)
print("agent: done", flush=True)
"""
)

SILENT_SCRIPT = 'print("this episode never says ready", flush=True)\n'

FAILING_SCRIPT = (
    EMIT
    + """
emit("ready")
emit("reward", reward=1)
sys.exit(3)
"""
)

NOT_A_NUMBER_SCRIPT = (
    EMIT
    + """
emit("ready")
emit("reward", reward="high")
"""
)

# Writes outside /workspace: allowed on a writable root, refused on a read-only one.
WRITES_TMP_SCRIPT = (
    EMIT
    + """
emit("ready")
try:
    with open("/tmp/probe", "w") as handle:
        handle.write("x")
except OSError as error:
    print("cannot write /tmp/probe:", error, flush=True)
    sys.exit(1)
emit("reward", reward=1)
"""
)


def split_stdout(stdout: str) -> tuple[str, dict]:
    """stdout is exactly `Test namespace: NS` and the results JSON; nothing else."""
    first, _, rest = stdout.partition("\n")
    assert re.fullmatch(r"Test namespace: agc-rl-[0-9a-f]{12}", first), stdout
    try:
        printed = json.loads(rest)
    except ValueError as error:
        raise AssertionError(
            f"stdout after the namespace line is not one JSON document ({error}):\n{rest}"
        ) from None
    return first.split(": ", 1)[1], printed


def episode_events(output: Path, event: str) -> dict[str, dict]:
    """Pod name -> its one `event` event, from the saved logs."""
    found = {}
    for log in sorted(output.glob("rollout-*.log")):
        events = rl_batch_demo.parse_events(log.read_text().splitlines())
        matching = [e for e in events if e["event"] == event]
        assert len(matching) == 1, (log, events)
        found[log.stem] = matching[0]
    return found


def post_paths(emulator: Emulator) -> list[str]:
    """The paths of the POSTs that create objects (`kubectl auth whoami`'s self review stores nothing)."""
    return [
        r["path"]
        for r in emulator.requests
        if r["method"] == "POST" and not r["path"].endswith("reviews")
    ]


# --------------------------------------------------------------------------
# --context, --kubectl, --timeout


def kubeconfig_with(path: Path, current: str, servers: dict[str, str]) -> Path:
    """A kubeconfig with one context (and cluster and user) per server."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": name, "cluster": {"server": url}} for name, url in servers.items()],
        "users": [
            {"name": name, "user": {"username": "admin", "password": "emulator"}}
            for name in servers
        ],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}
            for name in servers
        ],
        "current-context": current,
    }
    path.write_text(json.dumps(config, indent=2))
    return path


def test_context_is_used_recorded_and_followed_by_cleanup(make_cluster, tmp_path):
    kubectl, make = make_cluster
    wanted, other = make(), make()
    kubeconfig = kubeconfig_with(
        tmp_path / "kubeconfig",
        current="emu-b",
        servers={"emu-a": wanted.url, "emu-b": other.url, "unreachable": "http://127.0.0.1:9"},
    )
    env = dict(wanted.env(), KUBECONFIG=str(kubeconfig))

    def tool_with_kubeconfig(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(PRODUCT), *args, "--kubectl", kubectl],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    output = tmp_path / "out"
    result = tool_with_kubeconfig(
        "run", "--count", "2", "--context", "emu-a", "--output", str(output), "--quiet"
    )
    assert result.returncode == 0, result.stderr
    receipt = load(output / "receipt.json")
    assert receipt["context"] == "emu-a"
    assert load(output / "results.json")["context"] == "emu-a"
    assert [ns["metadata"]["name"] for ns in run_namespaces(wanted)] == [receipt["namespace"]]
    assert run_namespaces(other) == [] and post_paths(other) == []

    # The current context changes (to a cluster nobody can reach); cleanup still
    # acts on the receipt's context.
    subprocess.run(
        [kubectl, "config", "use-context", "unreachable"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert (
        subprocess.run(
            [kubectl, "config", "current-context"], env=env, capture_output=True, text=True
        ).stdout.strip()
        == "unreachable"
    )
    cleaned = tool_with_kubeconfig("cleanup", "--output", str(output))
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == f"Deleted test namespace: {receipt['namespace']}"
    assert run_namespaces(wanted) == []
    assert not any(r["method"] == "DELETE" for r in other.requests)


def test_unknown_context_fails_before_anything_is_created(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, context="nope", output=output)
    assert result.returncode == 1
    assert "kube context 'nope' not found" in result.stderr and "Traceback" not in result.stderr
    assert not output.exists()
    assert post_paths(emulator) == []


def test_timeout_is_the_job_deadline(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(image_pull_backoff=True)
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, timeout=3, output=output, quiet=True)
    assert result.returncode == 1, result.stderr
    assert "Job failed or timed out" in result.stderr and "DeadlineExceeded" in result.stderr
    # The Job controller ended it, not the client's own limit (3 + 30 s; the default 240 + 30 s).
    assert "not Complete within" not in result.stderr, result.stderr
    assert load(output / "job-submitted.json")["spec"]["activeDeadlineSeconds"] == 3
    namespace = load(output / "receipt.json")["namespace"]
    assert emulator.get("jobs", namespace, "rollout")["spec"]["activeDeadlineSeconds"] == 3


def test_timeout_bounds_the_client_when_the_job_never_ends(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(job_controller_stalled=True)  # no pods, no conditions, no deadline enforced
    output = tmp_path / "out"
    started = time.monotonic()
    result = run_tool(emulator, kubectl, "run", count=2, timeout=2, output=output, quiet=True)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert "Job rollout: not Complete within 32 s" in result.stderr, result.stderr
    # The client waits its whole limit (--timeout + 30 s, measured on the monotonic clock from
    # after this started): it cannot give up sooner, whatever the load. That it was this limit
    # and not the default's 270 s the message above says.
    assert elapsed >= 32, elapsed
    assert_evidence_saved(output, [])
    cleaned = run_tool(emulator, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert run_namespaces(emulator) == []


# --------------------------------------------------------------------------
# --max-episodes


def test_the_cap_is_raised_only_when_asked(tmp_path):
    output = tmp_path / "out"
    refused = subprocess.run(
        [sys.executable, str(PRODUCT), "run", "--count", "21", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "--count 21 is over the cap of 20 episodes" in refused.stderr
    assert "--max-episodes 21" in refused.stderr
    assert not output.exists()
    # A raised cap is still a cap.
    over = subprocess.run(
        [
            sys.executable,
            str(PRODUCT),
            "run",
            "--count",
            "31",
            "--max-episodes",
            "30",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert over.returncode == 2 and "over the cap of 30" in over.stderr
    assert not output.exists()


def test_thirty_episodes_with_the_cap_raised(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=0.2, sandbox_jitter=0.1)
    output = tmp_path / "out"
    result = run_tool(
        emulator,
        kubectl,
        "run",
        count=30,
        max_episodes=30,
        parallelism=10,
        output=output,
        quiet=True,
    )
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["episodes"] == results["successful_episodes"] == results["reward_sum"] == 30
    assert results["parallelism"] == 10
    assert len(load(output / "pods.json")["items"]) == 30
    assert len(list(output.glob("rollout-*.log"))) == 30
    submitted = load(output / "job-submitted.json")["spec"]
    assert submitted["completions"] == 30 and submitted["parallelism"] == 10
    assert submitted["activeDeadlineSeconds"] == rl_batch_demo.default_timeout(30, 10) >= 240
    # The emulator never ran more than 10 at once.
    truth = emulator.truth()["pods"]
    spans = sorted(
        (t["container_started"], t["container_finished"])
        for t in truth.values()
        if "container_started" in t and "container_finished" in t
    )
    assert len(spans) == 30
    assert max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans) <= 10


# --------------------------------------------------------------------------
# Progress on stderr


def test_progress_on_a_terminal_is_one_updating_line(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=2.0, sandbox_jitter=0.2)
    output = tmp_path / "out"
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [
            sys.executable,
            str(PRODUCT),
            "run",
            "--count",
            "2",
            "--output",
            str(output),
            "--kubectl",
            kubectl,
        ],
        env=emulator.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO once the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout, _ = process.communicate(timeout=300)
    reader.join(10)
    os.close(master)
    assert process.returncode == 0, b"".join(chunks)
    terminal = b"".join(chunks).decode().replace("\r\n", "\n")  # the tty turns \n into \r\n
    progress_line, _, after = terminal.partition("\n")
    updates = [u for u in progress_line.split("\r") if u]
    assert len(updates) >= 3, terminal
    for update in updates:
        # A note may follow once the Job has stopped running pods (what it then waits for).
        assert re.match(
            r"rollout: +\d+\.\d+s  active \d+  ready \d+  succeeded \d+/2  failed 0"
            r"(  \([^)]*waiting for [^)]*\))?\x1b\[K$",
            update,
        ), update
    elapsed = [float(re.match(r"rollout: +(\d+\.\d+)s", u).group(1)) for u in updates]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 2.0
    assert "\r" not in after  # the line is closed once the wait ends
    assert "rollout:" not in after
    namespace, printed = split_stdout(stdout.decode())
    assert printed["reward_sum"] == 2 and printed["namespace"] == namespace
    assert "pods" not in printed


def test_progress_without_a_terminal_is_a_line_every_few_seconds(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=7.0, sandbox_jitter=0.2)
    output = tmp_path / "out"
    process = subprocess.Popen(
        [
            sys.executable,
            str(PRODUCT),
            "run",
            "--count",
            "2",
            "--output",
            str(output),
            "--kubectl",
            kubectl,
        ],
        env=emulator.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []

    def drain() -> None:
        for line in process.stderr:  # type: ignore[union-attr]
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout = process.stdout.read()  # type: ignore[union-attr]
    process.wait(timeout=300)
    reader.join(10)
    assert process.returncode == 0, "".join(line for _, line in lines)
    progress = [(at, line) for at, line in lines if line.startswith("rollout:")]
    assert len(progress) >= 2, lines
    assert all("\r" not in line and "\x1b" not in line for _, line in lines)
    # The lines' own elapsed figures (the tool's monotonic clock; when this reader got each line
    # is the load's): at least the 5 s interval apart. The upper bound only catches a missing
    # line: six intervals, which no load this suite runs under stretches one tick to.
    printed = [float(re.match(r"rollout: +(\d+\.\d+)s", line).group(1)) for _, line in progress]
    gaps = [b - a for a, b in zip(printed, printed[1:])]
    assert all(4.9 <= gap <= 30.0 for gap in gaps), (gaps, progress)
    namespace, printed = split_stdout(stdout)
    assert printed["reward_sum"] == 2
    # The namespace stays for inspection, and the last word is how to remove it.
    assert lines[-1][1].strip() == (
        f"The namespace {namespace} stays for inspection; clean up with: "
        f"python3 rl_batch_demo.py cleanup --output {output} --kubectl {kubectl}"
    ), lines


# The guide's results.json fields (SPEC A4), but its per-pod rows: printed as the guide prints them.
GUIDE_FIELDS = (
    "episodes",
    "successful_episodes",
    "reward_sum",
    "batch_to_all_ready_seconds",
    "batch_to_all_rewards_seconds",
    "pod_to_ready_p50_seconds",
    "pod_to_ready_p95_seconds",
    "pod_to_ready_max_seconds",
    "context",
    "namespace",
    "image",
    "runtime",
    "parallelism",
    "cache_state",
    "client_job_complete_seconds",
)


def test_quiet_leaves_stderr_empty_and_stdout_is_only_the_results(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(sandbox_delay=1.0)
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    namespace, printed = split_stdout(result.stdout)
    saved = load(output / "results.json")
    # The guide's fields as the guide prints them (all but the per-pod rows), the rest summarised,
    # and where the whole file is.
    assert {key: printed[key] for key in GUIDE_FIELDS} == {key: saved[key] for key in GUIDE_FIELDS}
    assert printed == rl_batch_demo.printed_results(saved, str(output / "results.json"))
    assert printed["results_file"] == str(output / "results.json")
    assert "pods" not in printed and "phases" not in printed
    assert len(result.stdout.splitlines()) < 120, len(result.stdout.splitlines())
    assert namespace == saved["namespace"]


# --------------------------------------------------------------------------
# --episode-script


def readme_python_block(marker: str) -> Optional[str]:
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
        if block.startswith(marker):
            return block
    return None


def test_readme_example_is_the_one_tested():
    assert readme_python_block("# zero_reward.py") == ZERO_REWARD_SCRIPT


def test_zero_reward_is_reported_honestly(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    script = write_script(tmp_path, ZERO_REWARD_SCRIPT, "zero_reward.py")
    result = run_tool(
        emulator, kubectl, "run", count=3, episode_script=script, output=output, quiet=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    _, printed = split_stdout(result.stdout)
    results = load(output / "results.json")
    for shown in (printed, results):
        assert shown["episodes"] == 3
        assert (
            shown["successful_episodes"] == 3
        )  # verified episodes; reward 0 is an outcome, not a failure
        assert shown["reward_sum"] == 0 and shown["reward_mean"] == 0
    assert [row["reward"] for row in results["pods"]] == [0, 0, 0]
    # The user's program was shipped, not the built-in one.
    namespace = results["namespace"]
    assert (
        emulator.get("configmaps", namespace, "episode")["data"]["episode.py"] == ZERO_REWARD_SCRIPT
    )
    assert sorted(e["task"] for e in episode_events(output, "ready").values()) == [0, 1, 2]


@on_tiers("emulator", "real_cluster", "real_node")
def test_fractional_reward_and_each_episode_knows_its_index(tier, tmp_path):
    kubectl, cluster = tier
    output = tmp_path / "out"
    script = write_script(tmp_path, HALF_REWARD_SCRIPT)
    result = run_tool(
        cluster,
        kubectl,
        "run",
        count=4,
        parallelism=2,
        episode_script=script,
        output=output,
        quiet=True,
    )
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["episodes"] == results["successful_episodes"] == 4
    assert results["reward_sum"] == 2.0 and results["reward_mean"] == 0.5
    readies = episode_events(output, "ready")
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert sorted(readies) == sorted(pods)
    assert sorted(e["index"] for e in readies.values()) == [0, 1, 2, 3]
    for name, ready in readies.items():
        # The Job controller sets the index annotation and JOB_COMPLETION_INDEX.
        annotation = pods[name]["metadata"]["annotations"][
            "batch.kubernetes.io/job-completion-index"
        ]
        assert ready["index"] == int(annotation) == int(ready["job_completion_index"])
        assert name.startswith(f"rollout-{ready['index']}-")
    assert load(output / "job-submitted.json")["spec"]["completionMode"] == "Indexed"
    assert run_tool(cluster, kubectl, "cleanup", output=output).returncode == 0


def test_lines_that_are_not_events_are_kept_and_ignored(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    script = write_script(tmp_path, JUNK_SCRIPT)
    result = run_tool(
        emulator, kubectl, "run", count=2, episode_script=script, output=output, quiet=True
    )
    assert result.returncode == 0, result.stderr
    assert load(output / "results.json")["reward_sum"] == 2
    for log in output.glob("rollout-*.log"):
        text = log.read_text()
        assert "agent: thinking..." in text and "{not json at all" in text and "[1, 2, 3]" in text


def test_an_unreadable_episode_script_is_a_usage_error_before_anything_is_created(tmp_path):
    output = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            str(PRODUCT),
            "run",
            "--episode-script",
            str(tmp_path / "missing.py"),
            "--output",
            str(output),
            "--kubectl",
            str(tmp_path / "no-kubectl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # A usage error, as any other argument's: exit 2, the usage, then the error.
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("usage: ")
    assert (
        f"run: error: cannot read --episode-script {tmp_path / 'missing.py'}: No such file"
        in result.stderr
    )
    assert not output.exists()


@pytest.mark.parametrize(
    "script, message",
    [
        (SILENT_SCRIPT, "expected exactly one ready event, found 0"),
        (FAILING_SCRIPT, "container exited 3"),
        (NOT_A_NUMBER_SCRIPT, "reward is 'high', not a number"),
    ],
    ids=["no-events", "exit-3", "reward-not-a-number"],
)
def test_a_broken_episode_script_fails_naming_the_pod(make_cluster, tmp_path, script, message):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    path = write_script(tmp_path, script)
    result = run_tool(
        emulator, kubectl, "run", count=2, episode_script=path, output=output, quiet=True
    )
    assert result.returncode == 1, result.stderr
    # Noticed when it happened, not at the client's limit (240 + 30 s).
    assert "not Complete within" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"pod rollout-\d-[a-z0-9]{5}: .*" + re.escape(message), result.stderr), (
        result.stderr
    )
    assert f"cleanup --output {output}" in result.stderr
    pods = [p["metadata"]["name"] for p in load(output / "pods.json")["items"]]
    assert_evidence_saved(output, pods)


# --------------------------------------------------------------------------
# --dry-run


def test_dry_run_prints_exactly_what_run_creates(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    script = write_script(tmp_path, ZERO_REWARD_SCRIPT, "zero_reward.py")
    args = ["--count", "2", "--harden", "--episode-script", str(script)]
    no_kubectl = tmp_path / "empty-bin"
    no_kubectl.mkdir()
    planned_output = tmp_path / "planned"
    planned = subprocess.run(
        [sys.executable, str(PRODUCT), "run", "--dry-run", "--output", str(planned_output), *args],
        env=dict(os.environ, PATH=str(no_kubectl)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planned.returncode == 0, planned.stderr
    assert planned.stderr == ""
    assert not planned_output.exists()
    listing = json.loads(planned.stdout)
    assert listing["apiVersion"] == "v1" and listing["kind"] == "List"
    items = listing["items"]
    assert [i["kind"] for i in items] == ["Namespace", "NetworkPolicy", "ConfigMap", "Job"]
    namespace = items[0]["metadata"]["name"]

    # Real kubectl accepts it as it is, and nothing is created.
    accepted = subprocess.run(
        [kubectl, "create", "--dry-run=client", "-f", "-"],
        input=planned.stdout,
        env=emulator.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.splitlines() == [
        f"namespace/{namespace} created (dry run)",
        "networkpolicy.networking.k8s.io/deny-all created (dry run)",
        "configmap/episode created (dry run)",
        "job.batch/rollout created (dry run)",
    ]
    assert post_paths(emulator) == [] and run_namespaces(emulator) == []

    # A real run with the same arguments creates those objects and no others.
    output = tmp_path / "out"
    result = tool(emulator, kubectl, "run", *args, "--output", str(output), "--quiet")
    assert result.returncode == 0, result.stderr
    receipt = load(output / "receipt.json")
    real_namespace = receipt["namespace"]
    planned_run_id = items[0]["metadata"]["labels"]["agc-demo-run"]
    assert namespace == f"agc-rl-{planned_run_id}"
    planned_same = json.loads(planned.stdout.replace(planned_run_id, receipt["run_id"]))["items"]
    assert len(post_paths(emulator)) == len(planned_same)
    live = emulator.get("namespaces", None, real_namespace)
    assert {
        k: v for k, v in live["metadata"]["labels"].items() if k != "kubernetes.io/metadata.name"
    } == planned_same[0]["metadata"]["labels"]
    # The annotations too, but for the user (--dry-run asks the cluster nothing, so it cannot know it)
    # and the output directory, which differs here.
    unknown = {
        "rl-batch-demo.agc/user": rl_batch_demo.USER_UNKNOWN_BEFORE_RUN,
        "rl-batch-demo.agc/output": planned_same[0]["metadata"]["annotations"][
            "rl-batch-demo.agc/output"
        ],
    }
    assert planned_same[0]["metadata"]["annotations"] == dict(
        live["metadata"]["annotations"], **unknown
    )
    assert live["metadata"]["annotations"]["rl-batch-demo.agc/output"] == str(output.resolve())
    assert (
        emulator.get("networkpolicies", real_namespace, "deny-all")["spec"]
        == planned_same[1]["spec"]
    )
    assert emulator.get("configmaps", real_namespace, "episode")["data"] == planned_same[2]["data"]
    assert load(output / "job-submitted.json") == planned_same[3]
    created = sorted(
        (kind, o["metadata"]["name"])
        for kind in ("configmaps", "networkpolicies", "jobs")
        for o in emulator.list(kind, real_namespace)
        if o["metadata"]["name"] != "kube-root-ca.crt"
    )
    assert created == sorted(
        [("configmaps", "episode"), ("networkpolicies", "deny-all"), ("jobs", "rollout")]
    )


# --------------------------------------------------------------------------
# --harden


def intruder_pod(namespace: str) -> dict:
    """A pod that breaks Pod Security "restricted" (no securityContext at all)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "shell",
                    "image": "python:3.12-alpine",
                    "command": ["python", "-c", "pass"],
                }
            ]
        },
    }


INTRUDER_MESSAGE = (
    'pods "intruder" is forbidden: violates PodSecurity "restricted:latest": '
    'allowPrivilegeEscalation != false (container "shell" must set securityContext.allowPrivilegeEscalation=false), '
    'unrestricted capabilities (container "shell" must set securityContext.capabilities.drop=["ALL"]), '
    'runAsNonRoot != true (pod or container "shell" must set securityContext.runAsNonRoot=true), '
    'seccompProfile (pod or container "shell" must set securityContext.seccompProfile.type to '
    '"RuntimeDefault" or "Localhost")'
)


@on_tiers("emulator", "real_cluster", "real_node")
def test_harden_passes_under_enforced_restrictions(tier, tmp_path):
    kubectl, cluster = tier
    output = tmp_path / "out"
    result = run_tool(cluster, kubectl, "run", count=2, harden=True, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    results = load(output / "results.json")
    assert results["reward_sum"] == results["successful_episodes"] == 2
    namespace = results["namespace"]
    labels = cluster.get("namespaces", None, namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    policy = cluster.get("networkpolicies", namespace, "deny-all")
    assert policy["spec"]["podSelector"] == {} and sorted(policy["spec"]["policyTypes"]) == [
        "Egress",
        "Ingress",
    ]
    assert (
        "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    )  # no rule: everything denied
    for pod in cluster.list("pods", namespace):
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        workspace = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"][0]
        assert workspace["emptyDir"]["sizeLimit"] == "64Mi"
    # The episodes' pods passed the Pod Security admission that enforces "restricted" there (the
    # real one on the real tiers):
    refused = subprocess.run(
        [kubectl, "create", "-f", "-"],
        input=json.dumps(intruder_pod(namespace)),
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert (
        INTRUDER_MESSAGE.replace(
            "pods ", 'Error from server (Forbidden): error when creating "STDIN": pods ', 1
        )
        in refused.stderr
    ), refused.stderr
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr


def test_a_failed_episode_line_quotes_the_end_of_its_traceback(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    script = write_script(tmp_path, EMIT + 'emit("ready")\ntask = {}\nprint(task["answer"])\n')
    result = run_tool(
        emulator,
        kubectl,
        "run",
        count=1,
        episode_script=script,
        output=tmp_path / "out",
        quiet=True,
    )
    assert result.returncode == 1
    assert re.search(
        r"pod rollout-0-[a-z0-9]{5}: Failed, container exited 1 \(Error\): KeyError: 'answer'\n",
        result.stderr,
    ), result.stderr


def test_read_only_root_is_really_enforced(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    script = write_script(tmp_path, WRITES_TMP_SCRIPT)
    open_root = tmp_path / "open"
    result = run_tool(
        emulator, kubectl, "run", count=1, episode_script=script, output=open_root, quiet=True
    )
    assert result.returncode == 0, result.stderr
    hardened = tmp_path / "hardened"
    result = run_tool(
        emulator,
        kubectl,
        "run",
        count=1,
        harden=True,
        episode_script=script,
        output=hardened,
        quiet=True,
    )
    assert result.returncode == 1
    assert re.search(r"pod rollout-0-[a-z0-9]{5}: Failed, container exited 1", result.stderr), (
        result.stderr
    )
    [log] = hardened.glob("rollout-*.log")
    assert "cannot write /tmp/probe: [Errno 30] Read-only file system" in log.read_text()


def test_pod_security_admission_in_the_emulator(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    env = emulator.env()

    def create(obj: dict) -> subprocess.CompletedProcess:
        return subprocess.run(
            [kubectl, "create", "-f", "-"],
            input=json.dumps(obj),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
    }
    for name, ns_labels in (("locked", labels), ("open", {})):
        assert (
            create(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": name, "labels": ns_labels},
                }
            ).returncode
            == 0
        )
    refused = create(intruder_pod("locked"))
    assert refused.returncode == 1 and INTRUDER_MESSAGE in refused.stderr, refused.stderr
    assert emulator.get("pods", "locked", "intruder") is None
    assert create(intruder_pod("open")).returncode == 0  # no label, no enforcement

    # A Job's template is only warned about; its pods are refused, which the Job controller reports.
    job = rl_batch_demo.job_manifest("locked", 1, 1, "python:3.12-alpine", "cube")
    del job["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "allowPrivilegeEscalation"
    ]
    created = create(job)
    assert created.returncode == 0, created.stderr
    assert (
        'Warning: would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "episode" must set securityContext.allowPrivilegeEscalation=false)'
        in created.stderr
    )

    def failed_create() -> list:
        return [e for e in emulator.list("events", "locked") if e.get("reason") == "FailedCreate"]

    [event] = wait_for(failed_create, 120, "the FailedCreate event")[:1]
    assert event["message"].startswith(
        'Error creating: pods "rollout-" is forbidden: violates PodSecurity '
        '"restricted:latest": allowPrivilegeEscalation != false'
    ), event
    assert emulator.list("pods", "locked") == []

    # The product's own pods comply (the built-in and the --episode-script shapes).
    for indexed in (False, True):
        spec = rl_batch_demo.job_manifest("x", 1, 1, "i", "cube", harden=True, indexed=indexed)
        assert pod_security_violations(spec["spec"]["template"]["spec"], "restricted") == []


# --------------------------------------------------------------------------
# run --cleanup


def test_cleanup_after_a_successful_run(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, cleanup=True, output=output, quiet=True)
    assert result.returncode == 0, result.stderr
    namespace, printed = split_stdout(result.stdout)
    assert printed["reward_sum"] == 2
    assert "Cleaning up (--cleanup) after the run." in result.stderr
    assert f"Deleted test namespace: {namespace}" in result.stderr
    assert run_namespaces(emulator) == []
    for name in (
        "receipt.json",
        "results.json",
        "job.json",
        "pods.json",
        "events.txt",
        "episodes.csv",
        "timeline.svg",
    ):
        assert (output / name).is_file(), name
    assert len(list(output.glob("rollout-*.log"))) == 2
    assert all(log.read_text() for log in output.glob("rollout-*.log"))
    saved_before_deleting(emulator, namespace)


def saved_before_deleting(emulator: Emulator, namespace: str) -> None:
    """Every log was read before the first DELETE was sent."""
    deletes = [i for i, r in enumerate(emulator.requests) if r["method"] == "DELETE"]
    logs = [i for i, r in enumerate(emulator.requests) if r["path"].endswith("/log")]
    assert deletes and logs and max(logs) < min(deletes)
    assert any(
        r["method"] == "DELETE" and r["path"] == f"/api/v1/namespaces/{namespace}"
        for r in emulator.requests
    )


def test_cleanup_after_a_failed_run(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(fail_pods=[1])
    output = tmp_path / "out"
    result = run_tool(emulator, kubectl, "run", count=2, cleanup=True, output=output, quiet=True)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "Job failed or timed out" in result.stderr and "container exited 3" in result.stderr
    assert "Cleaning up (--cleanup) after a failed run." in result.stderr
    assert f"evidence: {output}" in result.stderr
    assert "clean up:" not in result.stderr  # nothing left to clean up
    namespace = load(output / "receipt.json")["namespace"]
    assert f"Deleted test namespace: {namespace}" in result.stderr
    assert result.stdout.strip() == f"Test namespace: {namespace}"
    assert run_namespaces(emulator) == []
    # The failed pod is in the evidence; the other may already be gone, since the Job
    # controller deletes a failed Job's running pods (how fast depends on the machine's load).
    pods = [p["metadata"]["name"] for p in load(output / "pods.json")["items"]]
    assert 1 <= len(pods) <= 2
    assert_evidence_saved(output, pods)
    assert any("injected container failure" in (output / f"{pod}.log").read_text() for pod in pods)
    saved_before_deleting(emulator, namespace)


def test_a_failed_cleanup_does_not_hide_why_the_run_failed(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make(fail_pods=[1], sandbox_delay=2.0)
    output = tmp_path / "out"
    process = start_tool(emulator, kubectl, "run", count=2, cleanup=True, output=output, quiet=True)
    receipt = wait_for(
        lambda: (
            (output / "receipt.json").exists()
            and "namespace_uid" in load(output / "receipt.json")
            and load(output / "receipt.json")
        ),
        120,
        "the namespace in the receipt",
    )
    # Someone relabels the namespace while the batch runs: cleanup must then refuse.
    subprocess.run(
        [
            kubectl,
            "label",
            "namespace",
            receipt["namespace"],
            "agc-demo-run=someone-else",
            "--overwrite",
        ],
        env=emulator.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert f"refusing to delete namespace {receipt['namespace']}" in stderr
    assert emulator.get("namespaces", None, receipt["namespace"]) is not None
    # ...and the reason the run failed, and where its evidence is, are still said.
    assert "Job failed or timed out" in stderr and "container exited 3" in stderr, stderr
    assert f"evidence: {output}" in stderr
