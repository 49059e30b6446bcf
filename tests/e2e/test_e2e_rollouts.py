"""End to end, rollouts: tasks in, rewards out, failures classified, infrastructure failures
retried through the Job's per-index API, partial batches accepted with exit status 3.
Real kubectl against the emulator, whose Job controller follows backoffLimitPerIndex,
maxFailedIndexes and podFailurePolicy as the real one does."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from xml.etree import ElementTree
from typing import Any

import pytest

import all_names as rl_batch_demo
from e2e_support import (
    TASK_EPISODE_HEAD,
    documentation,
    emulators,
    load,
    run_namespaces,
    tool,
    write_script,
)

pytestmark = pytest.mark.e2e
SVG = "{http://www.w3.org/2000/svg}"

# Reads its task from $TASK_FILE; the task's "fail" makes the episode fail on its own.
TASK_EPISODE = (
    TASK_EPISODE_HEAD
    + """\
if task.get("fail"):
    sys.exit("the agent gave up")
emit("reward", reward=task["x"] * 0.5, task_seen=task.get("id"), index="kept apart")
"""
)


@pytest.fixture
def cluster(tmp_path: Path, require_e2e: Any):
    """(kubectl 1.35, make(server_version=..., **faults)): emulators whose Job back-off is short."""
    kubectl = require_e2e("1.35")
    with emulators(tmp_path, timing={"job_backoff_base": 0.5}) as make:
        yield kubectl, make


def rewards_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "rewards.jsonl").read_text().splitlines()]


def tasks_run(
    tmp_path: Path, tasks: str, *options: str, episode: str = TASK_EPISODE
) -> tuple[list[str], Path]:
    """The arguments of a `run` of `tasks` (JSON lines) by the `episode` script, and its output directory."""
    (tmp_path / "tasks.jsonl").write_text(tasks)
    output = tmp_path / "out"
    return [
        "run",
        "--output",
        str(output),
        "--quiet",
        "--tasks",
        str(tmp_path / "tasks.jsonl"),
        "--episode-script",
        str(write_script(tmp_path, episode)),
        *options,
    ], output


def test_tasks_in_rewards_out_in_groups(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make()
    args, output = tasks_run(
        tmp_path,
        '{"id": "alpha", "x": 1}\n\n{"x": 2}\n{"x": 4, "note": "third"}\n',
        "--group-size",
        "2",
    )
    result = tool(emulator, kubectl, *args)
    assert result.returncode == 0, result.stderr
    rows = rewards_of(output)
    assert [row["index"] for row in rows] == [0, 1, 2, 3, 4, 5]
    # The id field, else the line number (blank lines count).
    assert [row["task_id"] for row in rows] == [
        "alpha",
        "alpha",
        "3",
        "3",
        "4",
        "4",
    ]  # strings always
    assert [row["group"] for row in rows] == [0, 0, 1, 1, 2, 2]
    assert [row["reward"] for row in rows] == [0.5, 0.5, 1.0, 1.0, 2.0, 2.0]
    assert [row["task_seen"] for row in rows] == ["alpha", "alpha", None, None, None, None]
    assert all(row["failure_class"] is None and row["attempts"] == 1 for row in rows)
    assert all(
        row["episode_index"] == "kept apart" for row in rows
    )  # never overwrites the tool's own field
    assert all(row["batch_to_reward_seconds"] >= row["batch_to_ready_seconds"] > 0 for row in rows)
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    for row in rows:
        assert pods[row["pod"]]["metadata"]["annotations"][
            "batch.kubernetes.io/job-completion-index"
        ] == str(row["index"])
    results = load(output / "results.json")
    assert results["episodes"] == 6 and results["failed_episodes"] == 0
    assert results["groups_complete"] == 3
    assert [g["task_id"] for g in results["groups"]] == ["alpha", "3", "4"]
    for group in results["groups"]:
        members = [r["batch_to_reward_seconds"] for r in rows if r["group"] == group["group"]]
        assert group["all_rewards_seconds"] == max(members)
        assert group["spread_seconds"] == pytest.approx(max(members) - min(members), abs=0.002)
    # Tasks alone keep the guide's Job: one bad episode fails the batch.
    job = load(output / "job-submitted.json")["spec"]
    assert job["backoffLimit"] == 0 and "backoffLimitPerIndex" not in job
    namespace = load(output / "receipt.json")["namespace"]
    shipped = emulator.get("configmaps", namespace, "tasks-0")["data"]
    assert shipped["task-0.json"] == '{"id": "alpha", "x": 1}'


def test_evicted_episode_is_retried_and_the_batch_passes(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make(replace_pod=[0])  # the first pod created is evicted while it runs
    output = tmp_path / "out"
    result = tool(
        emulator,
        kubectl,
        "run",
        "--output",
        str(output),
        "--quiet",
        "--count",
        "3",
        "--retries",
        "1",
    )
    assert result.returncode == 0, result.stderr
    rows = rewards_of(output)
    assert all(row["failure_class"] is None and row["reward"] == 1 for row in rows)
    retried = [row for row in rows if row["attempts"] > 1]
    assert len(retried) == 1 and retried[0]["attempts"] == 2
    earlier = retried[0]["earlier_attempts"]
    assert len(earlier) == 1 and earlier[0]["failure_class"] == "infrastructure"
    assert "disrupted" in earlier[0]["failure"] and "TerminationByKubelet" in earlier[0]["failure"]
    pods = {p["metadata"]["name"]: p for p in load(output / "pods.json")["items"]}
    assert len(pods) == 4
    assert (
        pods[retried[0]["pod"]]["metadata"]["annotations"][
            "batch.kubernetes.io/job-index-failure-count"
        ]
        == "1"
    )
    results = load(output / "results.json")
    assert results["attempts"] == {
        "attempts_total": 4,
        "episodes_retried": 1,
        "first_attempt": {
            "succeeded": 2,
            "failed": {"infrastructure": 1, "episode": 0, "verifier": 0},
        },
        "final": {
            "succeeded": 3,
            "failed": {"infrastructure": 0, "episode": 0, "verifier": 0},
            "cancelled": 0,
        },
    }
    assert results["job_end"] == {"condition": "Complete", "reason": None}
    job = load(output / "job.json")
    assert job["status"]["failed"] == 1 and job["status"]["failedIndexes"] == ""


def test_an_episodes_own_failure_is_a_sample_never_retried_nor_a_partial_batch(
    cluster: Any, tmp_path: Path
) -> None:
    """The agent that gave up is a valid sample: its launcher records its exit and ends its pod 0,
    so the Job neither retries it nor counts it among its failed indexes, and the batch, every
    line valid, is whole (exit 0), --allow-failures untouched."""
    kubectl, make = cluster
    emulator = make()
    args, output = tasks_run(
        tmp_path,
        '{"id": "ok", "x": 2}\n{"id": "bad", "x": 2, "fail": true}\n{"id": "ok2", "x": 2}\n',
        "--retries",
        "2",
        "--allow-failures",
        "1",
    )
    result = tool(emulator, kubectl, *args)
    assert result.returncode == 0, result.stderr
    assert "1 of 3 episodes failed on their own (1 episode failure): valid samples" in result.stderr
    assert "partial" not in result.stderr
    rows = rewards_of(output)
    assert [row["failure_class"] for row in rows] == [None, "episode", None]
    bad = rows[1]
    assert bad["task_id"] == "bad" and bad["attempts"] == 1 and bad["failure"] == "exited 1"
    assert bad["evidence"] == f"{bad['pod']}.log" and (output / bad["evidence"]).is_file()
    assert (
        bad["reward"] is None and bad["valid"] is True and bad["pod_to_ready_seconds"] is not None
    )
    pods = {pod["metadata"]["name"]: pod for pod in load(output / "pods.json")["items"]}
    assert len(pods) == 3  # never retried
    assert pods[bad["pod"]]["status"]["phase"] == "Succeeded"
    log = (output / bad["evidence"]).read_text()
    assert "the agent gave up" in log and '"event": "episode_exit"' in log
    # The timeline draws all 3 episodes, the failed one marked, as far as it got (it was ready).
    timeline = ElementTree.fromstring((output / "timeline.svg").read_text())
    bars = {}
    for rect in timeline.iter(f"{SVG}rect"):
        title = rect.findtext(f"{SVG}title")
        if title:
            bars.setdefault(title.split()[0], []).append(title.split()[1].rstrip(":"))
    assert sorted(bars) == sorted(row["pod"] for row in rows)
    assert "episode_work" not in bars[bad["pod"]] and "scheduling" in bars[bad["pod"]]
    [mark] = [text for text in timeline.iter(f"{SVG}text") if text.findtext(f"{SVG}title")]
    assert mark.findtext(f"{SVG}title") == f"{bad['pod']} failed (episode): exited 1"
    legend = ["".join(text.itertext()) for text in timeline.iter(f"{SVG}text")]
    assert rl_batch_demo.GAP_MEANING in legend and rl_batch_demo.FAILED_MEANING in legend
    results = load(output / "results.json")
    assert results["accepted_partial"] is False
    assert (results["failed_episodes"], results["lost_episodes"]) == (1, 0)
    assert results["failures_by_class"] == {"infrastructure": 0, "episode": 1, "verifier": 0}
    assert results["job_end"] == {"condition": "Complete", "reason": None}
    assert results["successful_episodes"] == 2 and results["episodes"] == 3
    assert results["groups_complete"] == 2 and results["groups"][1]["complete"] is False
    assert results["pod_to_ready_censored"]["censored"] == 0
    assert load(output / "job.json")["status"].get("failedIndexes", "") == ""
    # episodes.csv: a row per episode, the failed one too (its points as far as it got), and
    # each episode's task and outcome in the last columns, after every column it had before.
    text = (output / "episodes.csv").read_text()
    header = next(csv.reader(io.StringIO(text)))
    assert header[:5] == ["batch", "pod", "index", "node", "reward"]
    assert header[-5:] == ["image_size_bytes", "task_id", "failure_class", "failure", "valid"]
    table = {row["index"]: row for row in csv.DictReader(io.StringIO(text))}
    assert {
        index: (row["pod"], row["task_id"], row["failure_class"], row["failure"], row["valid"])
        for index, row in table.items()
    } == {
        str(row["index"]): (
            row["pod"],
            row["task_id"],
            row["failure_class"] or "",
            row["failure"] or "",
            "true",
        )
        for row in rows
    }
    assert table["1"]["ready_after_job_seconds"] and not table["1"]["reward_after_job_seconds"]
    # `report` recomputes the same outcome from the saved files alone.
    report = tool(emulator, kubectl, "report", str(output), "--quiet")
    assert report.returncode == 0, report.stderr
    printed = json.loads(report.stdout)
    assert (printed["failed_episodes"], printed["failures_by_class"]) == (
        1,
        results["failures_by_class"],
    )
    # The failed episodes' rows are in the file the summary names.
    assert load(Path(printed["results_file"]))["failures"] == results["failures"]


def test_failures_beyond_the_allowance_fail_the_run_with_every_episode_listed(
    cluster: Any, tmp_path: Path
) -> None:
    kubectl, make = cluster
    emulator = make(fail_pods=[1])
    output = tmp_path / "out"
    result = tool(
        emulator,
        kubectl,
        "run",
        "--output",
        str(output),
        "--quiet",
        "--count",
        "3",
        "--retries",
        "1",
    )
    assert result.returncode == 1, result.stderr
    # The fault ends the container (the episode's launcher) with 3: a loss of the
    # infrastructure's, not the episode's own end, which the launcher would have recorded.
    # maxFailedIndexes 0: the first lost episode ends the Job, which stops any still running.
    assert re.search(
        r"[123] of 3 episodes failed \([123] infrastructure failures?\); --allow-failures accepts 0",
        result.stderr,
    ), result.stderr
    assert "Traceback" not in result.stderr
    rows = rewards_of(output)
    assert len(rows) == 3 and all(r["failure_class"] in (None, "infrastructure") for r in rows)
    assert rows[1]["failure"].startswith("the episode launcher exited 3"), rows[1]
    assert all(
        "MaxFailedIndexesExceeded" in r["failure"]
        for r in rows
        if r["failure_class"] == "infrastructure" and r["index"] != 1
    )
    assert (
        load(output / "job.json")["status"]["conditions"][-1]["reason"]
        == "MaxFailedIndexesExceeded"
    )
    assert not (output / "results.json").exists()


def test_image_pull_failure_is_infrastructure(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make(image_pull_backoff=[0])
    output = tmp_path / "out"
    # The Job's deadline ends the pod stuck pulling; the other episode must finish before it,
    # which took more than 4 s at load 22 on two cores: 30 s leaves it a wide margin, and the
    # deadline is what the test waits for, never a measure of speed.
    result = tool(
        emulator,
        kubectl,
        "run",
        "--output",
        str(output),
        "--quiet",
        "--count",
        "2",
        "--timeout",
        "30",
        "--allow-failures",
        "1",
    )
    assert result.returncode == 3, result.stderr
    rows = rewards_of(output)
    failed = [row for row in rows if row["failure_class"]]
    assert len(failed) == 1 and failed[0]["failure_class"] == "infrastructure"
    assert "DeadlineExceeded" in failed[0]["failure"]
    assert "ErrImagePull" in failed[0]["failure"] or "BackOff" in failed[0]["failure"]
    results = load(output / "results.json")
    censored = results["pod_to_ready_censored"]
    assert censored["censored"] == 1 and censored["samples"] == 2
    assert results["pod_to_ready_max_seconds"] == censored["max"] >= 3


def test_retries_refused_on_a_cluster_older_than_1_33(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make(server_version="1.32")
    output = tmp_path / "out"
    result = tool(emulator, kubectl, "run", "--output", str(output), "--quiet", "--retries", "1")
    assert result.returncode == 1
    assert "--retries and --allow-failures need Kubernetes >= 1.33" in result.stderr
    assert "serves 1.32; nothing was created" in result.stderr
    assert run_namespaces(emulator) == []


def test_run_batch_in_process_returns_every_reward(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    kubectl, make = cluster
    emulator = make()
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    results = rl_batch_demo.run_batch(
        [{"id": "t1", "x": 2}, {"id": "t2", "x": 2, "fail": True}],
        output=str(tmp_path / "out"),
        group_size=2,
        retries=0,
        allow_failures=2,
        kubectl=kubectl,
        cleanup=False,
        episode_script=write_script(tmp_path, TASK_EPISODE),
    )
    # The agents of t2 failed on their own: samples, so no partial batch, and nothing printed.
    assert results["accepted_partial"] is False and results["failed_episodes"] == 2
    assert capfd.readouterr() == ("", "")
    assert [
        (r["task_id"], r["failure_class"], r["reward"], r["valid"]) for r in results["rewards"]
    ] == [
        ("t1", None, 1.0, True),
        ("t1", None, 1.0, True),
        ("t2", "episode", None, True),
        ("t2", "episode", None, True),
    ]
    # cleanup=False keeps the namespace, as the command line does.
    assert [ns["metadata"]["name"] for ns in run_namespaces(emulator)] == [results["namespace"]]
    # Every agent failing is a batch of samples too, whatever the allowance for losses.
    every = rl_batch_demo.run_batch(
        [{"x": 1, "fail": True}],
        output=str(tmp_path / "out2"),
        group_size=2,
        allow_failures=0,
        options=[
            "--kubectl",
            kubectl,
            "--episode-script",
            str(write_script(tmp_path, TASK_EPISODE)),
        ],
    )
    assert [(r["failure_class"], r["valid"]) for r in every["rewards"]] == [("episode", True)] * 2
    # A loss the allowance does not cover fails the call: a process killed from outside (as the
    # OOM killer does) is the infrastructure's, never the agent's own end.
    killed = TASK_EPISODE.replace(
        'if task.get("fail"):',
        'if task.get("kill"):\n    os.kill(os.getpid(), 9)\nif task.get("fail"):',
    )
    with pytest.raises(
        rl_batch_demo.DemoError,
        match=r"^1 of 2 episodes failed \(1 infrastructure failure\); allow_failures=0 accepts no "
        r"more\n",
    ):
        rl_batch_demo.run_batch(
            [{"x": 1}, {"x": 1, "kill": True}],
            output=str(tmp_path / "out3"),
            allow_failures=0,
            kubectl=kubectl,
            episode_script=write_script(tmp_path, killed, "killed.py"),
        )
    assert os.path.exists(tmp_path / "out3" / "rewards.jsonl")
    # By default a Python call deletes its namespace once the evidence is saved, also after a failure.
    assert [ns["metadata"]["name"] for ns in run_namespaces(emulator)] == [results["namespace"]]
    assert {path.name for path in (tmp_path / "out3").iterdir()} >= {
        "job.json",
        "pods.json",
        "receipt.json",
        "rewards.jsonl",
    }


def assert_every_line_is_its_pods_outcome(output: Path, count: int, need: int = 0) -> None:
    """Each rewards.jsonl line names a pod of pods.json and carries that pod's own reward (with
    --need, at least `need` of them; the rest cancelled)."""
    pods = {pod["metadata"]["name"]: pod for pod in load(output / "pods.json")["items"]}
    rewards = rewards_of(output)
    assert [line["index"] for line in rewards] == list(range(count))
    passed = [line for line in rewards if line["failure_class"] is None]
    assert len(passed) >= (need or count), rewards
    assert all(line["failure_class"] == "cancelled" for line in rewards if line not in passed)
    for line in passed:
        assert line["pod"] in pods, line
        assert pods[line["pod"]]["status"]["phase"] == "Succeeded"
        assert (line["reward"], line["valid"]) == (1, True), line


def test_a_call_without_tasks_reports_each_pods_own_outcome(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented call without tasks (count= episodes of the built-in demo) is a rollout:
    its lines are matched to pods by index, so its Job is Indexed as every rollout's is."""
    kubectl, make = cluster
    emulator = make()
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    results = rl_batch_demo.run_batch(output=tmp_path / "batch", count=2, kubectl=kubectl)
    assert (results["successful_episodes"], results["failed_episodes"]) == (2, 0)
    assert_every_line_is_its_pods_outcome(tmp_path / "batch", 2)
    lines = list(rl_batch_demo.stream_batch(output=tmp_path / "stream", count=3, kubectl=kubectl))
    assert sorted(line["index"] for line in lines) == [0, 1, 2]
    assert_every_line_is_its_pods_outcome(tmp_path / "stream", 3)
    # The command line's rollouts without tasks: each rollout option makes the Job Indexed too.
    for number, (count, options) in enumerate(
        ((3, ["--need", "2"]), (2, ["--allow-failures", "1"]), (2, ["--retries", "1"]))
    ):
        output = tmp_path / f"cli-{number}"
        result = tool(
            emulator,
            kubectl,
            "run",
            "--output",
            str(output),
            "--quiet",
            "--count",
            str(count),
            *options,
        )
        assert result.returncode == 0, result.stderr
        assert load(output / "job.json")["spec"]["completionMode"] == "Indexed"
        assert_every_line_is_its_pods_outcome(output, count, 2 if "--need" in options else 0)


def test_run_batch_prepull_refusal_names_its_keyword(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubectl, make = cluster
    emulator = make(forbidden=["nodes"])
    for name, value in emulator.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(
        rl_batch_demo.DemoError, match=r"^prepull=True needs to list the nodes .*forbidden"
    ):
        rl_batch_demo.run_batch(output=tmp_path / "out", count=1, prepull=True, kubectl=kubectl)
    assert run_namespaces(emulator) == []  # cleaned up, as after any failed call


def test_readme_python_example_runs_as_written(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The README's run_batch example, word for word: three tasks of 8 episodes, its context and
    its episode script; only the cluster behind "kind-kind" is the emulator."""
    kubectl, make = cluster
    emulator = make()
    blocks = re.findall(r"```python\n(.*?)```", documentation(), flags=re.S)
    example = next(block for block in blocks if "run_batch(" in block)
    (tmp_path / "task_episode.py").write_text(
        next(b for b in blocks if b.startswith("# task_episode.py"))
    )
    config = json.loads(emulator.kubeconfig.read_text())
    config["contexts"][0]["name"] = config["current-context"] = "kind-kind"
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    (tmp_path / "bin").mkdir()
    os.symlink(kubectl, tmp_path / "bin" / "kubectl")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    out, err = capsys.readouterr()
    assert out == "False 24\n", (out, err)
    rewards = rewards_of(tmp_path / "runs" / "step-17")
    assert [(r["task_id"], r["reward"]) for r in rewards] == [("issue-101", 1.0)] * 8 + [
        ("issue-102", 0.0)
    ] * 8 + [("issue-103", 0.0)] * 8
    assert run_namespaces(emulator) == []  # deleted by default; the files stay
    assert load(tmp_path / "runs" / "step-17" / "receipt.json")["context"] == "kind-kind"
    assert err == ""  # quiet by default: a training loop's output stays its own


def test_readme_task_episode_runs_as_documented(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make()
    blocks = re.findall(r"```python\n(.*?)```", documentation(), flags=re.S)
    args, output = tasks_run(
        tmp_path,
        '{"id": "issue-101", "prompt": "fix it", "answer": 42}\n'
        '{"id": "issue-102", "prompt": "and this", "answer": 7}\n',
        "--group-size",
        "2",
        "--retries",
        "1",
        "--allow-failures",
        "1",
        episode=next(block for block in blocks if block.startswith("# task_episode.py")),
    )
    result = tool(emulator, kubectl, *args)
    assert result.returncode == 0, result.stderr
    assert [(r["task_id"], r["reward"], r["prompt_chars"]) for r in rewards_of(output)] == [
        ("issue-101", 1.0, 6),
        ("issue-101", 1.0, 6),
        ("issue-102", 0.0, 8),
        ("issue-102", 0.0, 8),
    ]


def test_a_failed_builtin_check_is_a_verifier_failure(cluster: Any, tmp_path: Path) -> None:
    kubectl, make = cluster
    emulator = make(
        api_clock_skew=30
    )  # the API's clock runs ahead: every episode's times out of order
    output = tmp_path / "out"
    result = tool(
        emulator,
        kubectl,
        "run",
        "--output",
        str(output),
        "--quiet",
        "--count",
        "2",
        "--allow-failures",
        "1",
    )
    assert result.returncode == 1, result.stderr
    assert (
        "2 of 2 episodes failed (2 verifier failures); --allow-failures accepts 1" in result.stderr
    )
    rows = rewards_of(output)
    assert [row["failure_class"] for row in rows] == ["verifier", "verifier"]
    assert all(
        "unsynchronised clocks or broken events" in row["failure"] and row["reward"] == 1
        for row in rows
    )
    assert all(
        row["attempts"] == 1 for row in rows
    )  # the pods succeeded: nothing for the Job to retry
