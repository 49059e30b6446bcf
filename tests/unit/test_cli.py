"""The command line, called in-process as `main([...])` with tmp_path and capsys.

Nothing here talks to a cluster: argument rules, --dry-run, the refusals that
come before any cluster call (existing output directory, unusable kubectl, no
kube context, bad receipts), and `report` / `compare` on saved run directories
built here in the shape `run` writes them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import http.server
import io
import re
import shutil
import subprocess
import sys
import warnings
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

import all_names as demo
from rl_batch_demo import main, syntax
from test_unit import (
    GUIDE_COMPARE_HEADER,
    GUIDE_COMPARE_ROWS,
    GUIDE_PARALLEL,
    GUIDE_SERIAL,
    NAMESPACE,
    RUN_ID,
    T0,
    compare_rows,
    log_text,
    ready_event,
    reward_event,
    stamp,
)


def usage_error(argv: list[str]) -> int:
    """The exit status of a `main` that must stop with a usage error."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    return stopped.value.code


def error_line(err: str) -> str:
    """The one `Error:` line an expected failure prints: no traceback, one line."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("Error: "), err
    return lines[0]


@pytest.fixture
def no_subprocesses(monkeypatch: pytest.MonkeyPatch) -> list:
    """Record (and refuse) every process the product tries to start."""
    started: list = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        started.append(args[0] if args else kwargs.get("args"))
        raise AssertionError(f"the product started a process: {started[-1]}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    return started


# --------------------------------------------------------------------------
# Argument rules.


@pytest.mark.parametrize(
    "extra",
    [
        ["--count", "0"],
        ["--count", "-3"],
        ["--count", "ten"],
        ["--parallelism", "0"],
        ["--count", "3", "--parallelism", "4"],
        ["--count", "3", "--parallelism", "-1"],
        ["--count", "21"],
        ["--count", "30", "--max-episodes", "29"],
    ],
)
def test_run_argument_rules_are_usage_errors(
    extra: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    no_subprocesses: list,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert usage_error(["run", "--output", "out"] + extra) == 2
    assert list(tmp_path.iterdir()) == []
    assert no_subprocesses == []
    assert "usage:" in capsys.readouterr().err


def test_count_over_the_cap_names_max_episodes(tmp_path: Path, capsys: Any) -> None:
    assert usage_error(["run", "--output", str(tmp_path / "out"), "--count", "21"]) == 2
    assert "--max-episodes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--output", "out"],
        ["run"],
        ["cleanup"],
        [],
        ["run", "--output"],
        ["run", "--output", "out", "--bogus"],
    ],
)
def test_unknown_action_or_missing_output_is_a_usage_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    assert usage_error(argv) == 2
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == ""


def dry_run(argv: list[str], capsys: Any) -> dict:
    """`run --dry-run` output, parsed: {kind: object} (one of each kind)."""
    assert main(["run", "--dry-run"] + argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["apiVersion"] == "v1" and printed["kind"] == "List"
    objects = {item["kind"]: item for item in printed["items"]}
    assert len(objects) == len(printed["items"])
    return objects


def test_count_21_passes_with_max_episodes_21(tmp_path: Path, capsys: Any) -> None:
    objects = dry_run(
        ["--output", str(tmp_path / "out"), "--count", "21", "--max-episodes", "21"], capsys
    )
    assert objects["Job"]["spec"]["completions"] == 21
    assert objects["Job"]["spec"]["parallelism"] == 21


def test_defaults_count_10_parallelism_count_image_and_runtime(tmp_path: Path, capsys: Any) -> None:
    job = dry_run(["--output", str(tmp_path / "out")], capsys)["Job"]
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["completions"] == 10
    assert job["spec"]["parallelism"] == 10
    assert job["spec"]["activeDeadlineSeconds"] == 240
    assert pod["containers"][0]["image"] == "python:3.12-alpine"
    assert pod["runtimeClassName"] == "cube"


def test_parallelism_defaults_to_the_count_given(tmp_path: Path, capsys: Any) -> None:
    job = dry_run(["--output", str(tmp_path / "out"), "--count", "4"], capsys)["Job"]
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (4, 4)


def test_flags_reach_the_job(tmp_path: Path, capsys: Any) -> None:
    job = dry_run(
        [
            "--output",
            str(tmp_path / "out"),
            "--count",
            "3",
            "--parallelism",
            "1",
            "--image",
            "registry.local/python:3.13",
            "--runtime",
            "kata",
            "--timeout",
            "100",
        ],
        capsys,
    )["Job"]
    pod = job["spec"]["template"]["spec"]
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (3, 1)
    assert job["spec"]["activeDeadlineSeconds"] == 100
    assert pod["containers"][0]["image"] == "registry.local/python:3.13"
    assert pod["runtimeClassName"] == "kata"


def test_the_default_deadline_is_the_guides_up_to_the_cap_and_grows_past_it(
    tmp_path: Path, capsys: Any
) -> None:
    output = tmp_path / "out"

    def deadline(count: int, parallelism: int) -> int:
        job = dry_run(
            [
                "--output",
                str(output),
                "--count",
                str(count),
                "--max-episodes",
                str(count),
                "--parallelism",
                str(parallelism),
            ],
            capsys,
        )["Job"]
        assert job["spec"]["completions"] == count and job["spec"]["parallelism"] == parallelism
        return job["spec"]["activeDeadlineSeconds"]

    assert (
        deadline(20, 20) == deadline(20, 1) == 240
    )  # the guide's default is unchanged up to the cap
    wide, narrow, sequential = deadline(500, 500), deadline(500, 50), deadline(500, 1)
    assert wide == demo.default_timeout(500, 500) >= 240
    assert narrow == demo.default_timeout(500, 50) >= wide
    # One episode at a time: each of the 500 waves gets at least ~10 s (the guide's sequential pace).
    assert sequential == demo.default_timeout(500, 1) >= 500 * 10
    assert not output.exists()


def help_sections(text: str) -> dict[str, str]:
    """Option -> its help text, from argparse's help output (continuation lines joined)."""
    sections: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("--"):
            current = stripped.split()[0].rstrip(",")
            sections[current] = stripped
        elif current and line.startswith("      ") and stripped:
            sections[current] += " " + stripped
        else:
            current = None
    return sections


def test_run_help_lists_every_flag_with_its_default(repo_root: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(repo_root / "rl_batch_demo.py"), "run", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, COLUMNS="100"),
    )
    assert completed.returncode == 0, completed.stderr
    text = completed.stdout
    for expected in (
        "--count",
        "default: 10",
        "python:3.12-alpine",
        "cube",
        "--parallelism",
        "--output",
    ):
        assert expected in text
    sections = help_sections(text)
    assert "default: 10" in sections["--count"]
    assert "python:3.12-alpine" in sections["--image"]
    assert "cube" in sections["--runtime"]
    assert "default" in sections["--parallelism"] and "count" in sections["--parallelism"]
    assert "DIR" in sections["--output"]
    # Part B flags, with their defaults where they have one.
    assert "default: 20" in sections["--max-episodes"]
    assert "240" in sections["--timeout"]
    assert "default: 1" in sections["--rounds"]
    assert "kubectl" in sections["--kubectl"]
    for flag in (
        "--context",
        "--warmup",
        "--episode-script",
        "--dry-run",
        "--harden",
        "--cleanup",
        "--quiet",
        "--verbose",
    ):
        assert flag in sections, f"run --help lacks {flag}"


ACTION_EXAMPLES = {
    "run": "run --output runs/first --count 10",
    "cleanup": "cleanup --output runs/first",
    "report": "report runs/first",
    "compare": "compare runs/parallel runs/serial",
}


@pytest.mark.parametrize("action", sorted(ACTION_EXAMPLES))
def test_every_action_help_has_a_purpose_and_an_example(action: str, capsys: Any) -> None:
    assert usage_error([action, "--help"]) == 0
    text = capsys.readouterr().out
    purpose = text.split("\n\n")[1]  # the paragraph after the usage lines
    assert purpose.endswith(".") and "\n" not in purpose and len(purpose.split()) >= 4, text
    example = text.rstrip().splitlines()[-2:]
    assert example[0] == "example:", text
    assert example[1].endswith(ACTION_EXAMPLES[action]), text
    # The example is a command line this parser accepts.
    assert demo.build_parser().parse_args(ACTION_EXAMPLES[action].split()).action == action


def test_compare_help_explains_both_directories(capsys: Any) -> None:
    assert usage_error(["compare", "--help"]) == 0
    sections = {
        line.split()[0]: line.strip()
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("  DIR_")
    }
    assert "first run's output directory" in sections["DIR_A"]
    assert "second run's output directory" in sections["DIR_B"] and "B/A" in sections["DIR_B"]


def test_over_the_cap_prints_the_usage_of_run(tmp_path: Path, capsys: Any) -> None:
    assert usage_error(["run", "--output", str(tmp_path / "out"), "--count", "21"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and " run [-h] --output DIR" in err.splitlines()[0], err
    assert "ACTION" not in err
    assert re.search(r" run: error: --count 21 is over the cap of 20 episodes", err), err


@pytest.mark.parametrize("argv", [["cleanup", "--output"], ["cleanup", "{out}"]])
def test_cleanup_takes_the_directory_as_output_or_positionally(
    argv: list[str], tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = [arg.format(out=out) for arg in argv] + ([str(out)] if argv[-1] == "--output" else [])
    assert main(argv) == 1
    line = error_line(capsys.readouterr().err)
    assert str(out / "receipt.json") in line and "not found" in line
    assert no_subprocesses == []


def test_report_takes_the_directory_positionally_or_as_output(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_saved_run(tmp_path / "run-a")
    assert main(["report", str(run_dir), "--quiet"]) == 0
    positional = capsys.readouterr().out
    assert main(["report", "--output", str(run_dir), "--quiet"]) == 0
    assert capsys.readouterr().out == positional
    assert json.loads(positional)["episodes"] == 3


@pytest.mark.parametrize("action", ["cleanup", "report"])
@pytest.mark.parametrize("given", ["both", "neither"])
def test_run_directory_given_twice_or_not_at_all_is_a_usage_error(
    action: str, given: str, tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    argv = [action] + (
        [str(tmp_path / "a"), "--output", str(tmp_path / "b")] if given == "both" else []
    )
    assert usage_error(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and f" {action} [-h]" in err.splitlines()[0], err
    expected = (
        "name the run directory once" if given == "both" else "name the run's output directory"
    )
    assert f"{action}: error: {expected}" in err
    assert list(tmp_path.iterdir()) == []
    assert no_subprocesses == []


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, erase", [(io.StringIO, ""), (Terminal, "\r\x1b[K")])
def test_verbose_echo_is_a_shell_quoted_line_that_a_terminal_progress_line_does_not_swallow(
    stream: Any, erase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stderr = stream()
    monkeypatch.setattr(sys, "stderr", stderr)
    quiet = demo.Kubectl("/opt/k8s/kubectl", "my context")
    quiet.echo_argv(quiet.argv(["get", "pods"]))
    assert stderr.getvalue() == ""
    verbose = demo.Kubectl("/opt/k8s/kubectl", "my context", verbose=True)
    verbose.echo_argv(
        verbose.argv(["get", "pods", "-l", "job-name=rollout", "-o", "jsonpath={.items[*]}"])
    )
    assert stderr.getvalue() == (
        f"{erase}+ /opt/k8s/kubectl --context 'my context' --request-timeout=30s "
        f"get pods -l job-name=rollout -o 'jsonpath={{.items[*]}}'\n"
    )


# --------------------------------------------------------------------------
# --dry-run.


def test_dry_run_prints_a_v1_list_creates_nothing_needs_no_kubectl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, no_subprocesses: list
) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--output", "out", "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [item["kind"] for item in printed["items"]] == ["Namespace", "ConfigMap", "Job"]
    namespace, configmap, job = printed["items"]
    name = namespace["metadata"]["name"]
    run_id = name[len("agc-rl-") :]
    assert name.startswith("agc-rl-") and len(run_id) == 12 and int(run_id, 16) >= 0
    assert namespace["metadata"]["labels"] == {"agc-demo-run": run_id}
    assert configmap["metadata"] == {"name": "episode", "namespace": name}
    assert configmap["data"] == {"episode.py": demo.WORKER_SOURCE}
    assert job["metadata"] == {"name": "rollout", "namespace": name}
    assert "completionMode" not in job["spec"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-path"]
    assert no_subprocesses == []


def test_dry_run_with_harden_adds_the_network_policy(tmp_path: Path, capsys: Any) -> None:
    assert main(["run", "--output", str(tmp_path / "out"), "--dry-run", "--harden"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    kinds = [item["kind"] for item in items]
    assert kinds[0] == "Namespace" and kinds[-1] == "Job"
    assert sorted(kinds) == ["ConfigMap", "Job", "Namespace", "NetworkPolicy"]
    objects = {item["kind"]: item for item in items}
    name = objects["Namespace"]["metadata"]["name"]
    assert objects["NetworkPolicy"]["metadata"]["namespace"] == name
    assert objects["NetworkPolicy"]["spec"]["podSelector"] == {}
    assert sorted(objects["NetworkPolicy"]["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert (
        objects["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )
    container = objects["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not (tmp_path / "out").exists()


def test_dry_run_ships_an_episode_script_in_indexed_mode(tmp_path: Path, capsys: Any) -> None:
    script = tmp_path / "my_episode.py"
    script.write_text("print('my own episode')\n", encoding="utf-8")
    objects = dry_run(["--output", str(tmp_path / "out"), "--episode-script", str(script)], capsys)
    assert objects["ConfigMap"]["data"] == {"episode.py": "print('my own episode')\n"}
    assert objects["Job"]["spec"]["completionMode"] == "Indexed"
    assert not (tmp_path / "out").exists()


def test_unreadable_episode_script_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "run",
                "--output",
                str(tmp_path / "out"),
                "--dry-run",
                "--episode-script",
                str(tmp_path / "missing.py"),
            ]
        )
    assert exit_.value.code == 2  # as any other usage error
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            f"run: error: cannot read --episode-script {tmp_path / 'missing.py'}: "
            "No such file or directory"
        )
    )


def test_an_episode_script_that_does_not_compile_is_named_with_its_line(
    tmp_path: Path, capsys: Any, no_subprocesses: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This Python is the newest a script may be written for: every error is refused.
    monkeypatch.setattr(syntax, "NEWEST_SYNTAX_PYTHON", sys.version_info[:2])
    script = tmp_path / "broken.py"
    script.write_text("import json\nx = = 1\n")
    out = tmp_path / "out"
    code = main(["run", "--output", str(out), "--dry-run", "--episode-script", str(script)])
    line = error_line(capsys.readouterr().err)
    assert code == 1
    assert f"--episode-script {script}, line 2: " in line and "nothing was created" in line
    assert line.endswith(": x = = 1; nothing was created")
    assert not out.exists()


# Scripts the tokenizer of every Python refuses, and the line each is refused at (None: a line
# that differs between Pythons, this one's first error after the newer syntax).
BROKEN_EVERYWHERE = [
    ('print("hello"\n', 1),  # an unclosed bracket
    ('"""a docstring that never ends\n', 1),  # an unclosed string
    ("if True:\n    x = 1\n  y = 2\n", 3),  # a dedent to no outer level
    ("x = [1, (2]\n", 1),  # a bracket closed by another kind
    ("match x:\n    case [1, 2]:\n        y = (2\n", None),
    ('task = {"a": 1}\nprint(f"{task["a"]}")\ny = """never ends\n', None),
]


@pytest.mark.parametrize("source, line", BROKEN_EVERYWHERE)
def test_a_script_broken_on_every_python_is_refused_even_on_an_older_one(
    source: str, line: Optional[int], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This Python is older than the image's.
    monkeypatch.setattr(syntax, "NEWEST_SYNTAX_PYTHON", (99, 0))
    script = tmp_path / "broken.py"
    script.write_text(source)
    assert (
        main(
            ["run", "--output", str(tmp_path / "out"), "--dry-run", "--episode-script", str(script)]
        )
        == 1
    )
    said = error_line(capsys.readouterr().err)
    where = f"--episode-script {script}" + (f", line {line}: " if line else "")
    assert where in said and "nothing was created" in said
    assert not (tmp_path / "out").exists()


# Valid in the newest Python the check knows (3.14), each in syntax newer than some Python the tool
# runs on: never refused. Before 3.12 the tokenizer reads an f-string that nests its own quote as
# strings that end early: one that nests an odd quote or a triple quote (f"{'"'}") reads as
# unclosed there, and is refused.
NEWER_SYNTAX = [
    "match command:\n    case 'go':\n        pass\n    case {'k': [1, *rest]} if lambda: 1: pass\n",
    "match (\n    command,\n):\n    case (\n        'go',\n    ):\n        pass\n",  # 3.10
    "print(a[i := 0])\n",  # 3.10: a bare := in an index
    "try:\n    pass\nexcept* ValueError as group:\n    pass\n",  # 3.11
    "a[*b] = 1\ndef f(*args: *Ts) -> None:\n    pass\n",  # 3.11
    "type Reward = float\ntype Pair[T] = tuple[T, T]\nif 1: type Other = int\n",  # 3.12
    "def first[T](items: list[T]) -> T:\n    return items[0]\nclass Box[T, *Ts, **P]: pass\n",
    "def first[T = int](items: list[T]) -> T:\n    return items[0]\n",  # 3.13 (PEP 696)
    'task = {"a": 1}\nprint(f"{task["a"]}")\n',  # 3.12 (PEP 701): the same quotes nested
    'x = f"{\n    a  # a comment\n}" f"{a!r:>{w}}" f"{"\\n".join(a)}"\n',  # newlines, \\
    'x = f"{f"{f"{1}"}"}"\n',
    'x = fr"\\{{{1+1}" + f"{"a"}"\n',  # a backslash never escapes a brace
    "try:\n    pass\nexcept ValueError, TypeError:\n    pass\n",  # 3.14 (PEP 758)
    'name = "x"\nx = t"hello {name!r:>{10}}"\ny = t"{t"{1}"}"\n',  # 3.14 (PEP 750)
]


@pytest.mark.parametrize("source", NEWER_SYNTAX)
def test_newer_syntax_is_shipped_on_an_older_python(
    source: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syntax, "NEWEST_SYNTAX_PYTHON", (99, 0))
    script = tmp_path / "newer.py"
    script.write_text("command = 'go'\n" + source)
    assert (
        main(
            ["run", "--output", str(tmp_path / "out"), "--dry-run", "--episode-script", str(script)]
        )
        == 0
    ), capsys.readouterr().err
    try:
        compile(script.read_text(), str(script), "exec")
    except SyntaxError:
        assert "does not compile on Python" in capsys.readouterr().err  # warned, shipped


@pytest.mark.parametrize(
    "source, detail",
    [
        ("x = = 1\n", "invalid syntax: x = = 1"),
        ("return 1\n", "'return' outside function: return 1"),  # found by the compiler alone
    ],
)
def test_an_error_the_tokenizer_passes_is_only_warned_about_on_an_older_python(
    source: str, detail: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may be newer syntax: the image's Python may run it. On the newest, it is refused."""
    script = tmp_path / "plain.py"
    script.write_text("print('ok')\n" + source)
    argv = ["run", "--output", str(tmp_path / "out"), "--dry-run", "--episode-script", str(script)]
    monkeypatch.setattr(syntax, "NEWEST_SYNTAX_PYTHON", (99, 0))
    assert main(argv) == 0
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert (
        f"Warning: --episode-script {script}, line 2 does not compile on Python {python} "
        f"({detail}); the image's Python may be newer, so it is shipped anyway\n"
    ) in capsys.readouterr().err
    monkeypatch.setattr(syntax, "NEWEST_SYNTAX_PYTHON", sys.version_info[:2])
    assert main(argv) == 1  # this Python is the newest: every error is refused
    assert f"line 2: {detail}; nothing was created" in error_line(capsys.readouterr().err)


def test_the_syntax_check_itself_prints_only_its_own_lines(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its tokenizer warns of an invalid escape on 3.12 and later: the image's Python says that,
    the check does not."""
    monkeypatch.setattr(syntax, "NEWEST_SYNTAX_PYTHON", (99, 0))
    script = tmp_path / "newer.py"
    script.write_bytes(b"x = f'\\{y}'\ntry:\n    pass\nexcept A, B:\n    pass\n")
    argv = ["run", "--output", str(tmp_path / "out"), "--dry-run", "--episode-script", str(script)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning from the check fails the test
        assert main(argv) == 0
    err = capsys.readouterr().err
    if sys.version_info < (3, 14):
        assert "does not compile on Python" in err  # 3.14's except A, B: warned, shipped
    assert "SyntaxWarning" not in err and "invalid escape" not in err, err


# --------------------------------------------------------------------------
# Refusals before anything is created.


@pytest.mark.parametrize("kind", ["directory", "file", "dangling symlink"])
def test_existing_output_is_never_overwritten(
    kind: str, tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    out = tmp_path / "out"
    if kind == "directory":
        out.mkdir()
        (out / "notes.txt").write_text("keep me\n")
    elif kind == "file":
        out.write_text("keep me\n")
    else:
        out.symlink_to(tmp_path / "nowhere")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["run", "--output", str(out), "--kubectl", "/nonexistent/kubectl"]) == 1
    line = error_line(capsys.readouterr().err)
    assert str(out) in line and "already exists" in line
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    if kind == "directory":
        assert (out / "notes.txt").read_text() == "keep me\n"
    elif kind == "file":
        assert out.read_text() == "keep me\n"
    assert no_subprocesses == []


def test_missing_kubectl_is_named_and_leaves_no_output(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--kubectl", "/nonexistent/kubectl"]) == 1
    line = error_line(capsys.readouterr().err)
    assert "kubectl" in line and "/nonexistent/kubectl" in line and "not found" in line
    assert not out.exists()


def test_non_executable_kubectl_is_named(tmp_path: Path, capsys: Any) -> None:
    fake = tmp_path / "kubectl"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o644)
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--kubectl", str(fake)]) == 1
    line = error_line(capsys.readouterr().err)
    assert str(fake) in line and "not executable" in line
    assert not out.exists()


KUBECONFIG_WITHOUT_CONTEXT = """apiVersion: v1
kind: Config
clusters: []
contexts: []
users: []
current-context: ""
preferences: {}
"""

KUBECONFIG_WITH_CONTEXT = """apiVersion: v1
kind: Config
clusters:
- name: emulator
  cluster:
    server: https://127.0.0.1:9
contexts:
- name: emulator
  context:
    cluster: emulator
    user: tester
current-context: emulator
users:
- name: tester
  user:
    token: not-a-real-token
preferences: {}
"""


def isolated_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = home / "kubeconfig"
    config.write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", str(config))


def test_no_current_kube_context_is_an_error_before_any_output(
    kubectl_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    isolated_kubeconfig(tmp_path, monkeypatch, KUBECONFIG_WITHOUT_CONTEXT)
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--kubectl", kubectl_bin, "--quiet"]) == 1
    line = error_line(capsys.readouterr().err)
    assert "no current kube context" in line
    assert not out.exists()


def test_unknown_context_is_an_error_before_any_output(
    kubectl_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    isolated_kubeconfig(tmp_path, monkeypatch, KUBECONFIG_WITH_CONTEXT)
    out = tmp_path / "out"
    assert (
        main(
            ["run", "--output", str(out), "--kubectl", kubectl_bin, "--context", "nope", "--quiet"]
        )
        == 1
    )
    line = error_line(capsys.readouterr().err)
    assert "'nope'" in line and "not found" in line
    assert not out.exists()


KUBECONFIG_WITHOUT_CREDENTIALS = """apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://127.0.0.1:9"}
  name: nowhere
contexts:
- context: {cluster: nowhere, user: nobody}
  name: no-credentials
current-context: no-credentials
users:
- name: nobody
  user: {}
"""


def test_missing_credentials_are_named_not_an_eof(
    kubectl_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # kubectl asks for a username when the kubeconfig's user has no credentials; with
    # no terminal to answer it says only "error: EOF".
    isolated_kubeconfig(tmp_path, monkeypatch, KUBECONFIG_WITHOUT_CREDENTIALS)
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--kubectl", kubectl_bin, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "no credentials for context no-credentials" in err and "asked for a username" in err
    assert "EOF" not in err and "Traceback" not in err
    assert not out.exists()  # nothing was created, so nothing to trace and the name stays free


@pytest.mark.parametrize("context", [[], ["--context", "emulator"]])
def test_a_kubectl_that_is_not_kubectl_is_named(
    context: list[str], tmp_path: Path, capsys: Any
) -> None:
    # /bin/true answers every question with silence and success, which used to read as
    # "no current kube context".
    true = shutil.which("true")
    assert true is not None
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--kubectl", true, "--quiet"] + context) == 1
    line = error_line(capsys.readouterr().err)
    assert line == (
        f"Error: --kubectl {true} does not look like kubectl "
        f"(`version --client` printed no kubectl version)"
    )
    assert not out.exists()


def test_cleanup_with_a_kubectl_that_is_not_kubectl_does_not_claim_the_namespace_is_gone(
    tmp_path: Path, capsys: Any
) -> None:
    true = shutil.which("true")
    assert true is not None
    out = tmp_path / "out"
    out.mkdir()
    write_json(
        out / "receipt.json",
        {
            "context": "emulator",
            "namespace": NAMESPACE,
            "run_id": RUN_ID,
            "uid": "ns-uid-1",
            "job_uid": "job-uid-1",
        },
    )
    assert main(["cleanup", "--output", str(out), "--kubectl", true]) == 1
    captured = capsys.readouterr()
    assert "absent" not in captured.out + captured.err
    assert error_line(captured.err) == (
        f"Error: --kubectl {true} does not look like kubectl "
        f"(`version --client` printed no kubectl version)"
    )


class NotKubernetes(http.server.BaseHTTPRequestHandler):
    """A web server that knows no Kubernetes API: 404 for every request, as a plain web server gives."""

    requests: list = []

    def answer(self) -> None:
        self.requests.append((self.command, self.path))
        body = b"404 page not found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def not_kubernetes() -> Any:
    """(URL, requests seen) of a local HTTP server that is not a Kubernetes API."""
    NotKubernetes.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotKubernetes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", NotKubernetes.requests
    server.shutdown()
    server.server_close()


def test_an_endpoint_that_is_not_kubernetes_is_named_not_a_missing_runtimeclass(
    kubectl_bin: str,
    not_kubernetes: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    url, requests = not_kubernetes
    isolated_kubeconfig(
        tmp_path, monkeypatch, KUBECONFIG_WITH_CONTEXT.replace("https://127.0.0.1:9", url)
    )
    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--kubectl", kubectl_bin, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith(
        f"Error: the endpoint of context 'emulator' ({url}) does not serve the "
        f"Kubernetes API (or lacks node.k8s.io/v1 RuntimeClass)"
    ), err
    assert first.endswith("nothing was created"), err
    assert "RuntimeClass 'cube' not found" not in err
    assert requests and {method for method, _ in requests} == {"GET"}  # asked, and created nothing


# --------------------------------------------------------------------------
# Cleanup refuses a missing or untrustworthy receipt, and runs nothing.


def test_cleanup_without_a_receipt(tmp_path: Path, capsys: Any, no_subprocesses: list) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert main(["cleanup", "--output", str(out)]) == 1
    line = error_line(capsys.readouterr().err)
    assert "receipt" in line and "not found" in line and str(out / "receipt.json") in line
    assert list(out.iterdir()) == []
    assert no_subprocesses == []


def test_cleanup_of_a_missing_directory(tmp_path: Path, capsys: Any, no_subprocesses: list) -> None:
    assert main(["cleanup", "--output", str(tmp_path / "never-ran")]) == 1
    assert "receipt" in error_line(capsys.readouterr().err)
    assert not (tmp_path / "never-ran").exists()
    assert no_subprocesses == []


@pytest.mark.parametrize(
    "receipt, message",
    [
        ("{not json", r"receipt unreadable"),
        ("", r"receipt unreadable"),
        (
            json.dumps({"namespace": NAMESPACE}),
            r"lacks context, namespace or run_id; nothing was deleted",
        ),
        (
            json.dumps({"context": "emulator", "namespace": NAMESPACE, "run_id": ""}),
            r"lacks .*run_id",
        ),
        (json.dumps({"context": None, "namespace": NAMESPACE, "run_id": RUN_ID}), r"lacks context"),
        (json.dumps([NAMESPACE]), r"lacks context, namespace or run_id"),
        (
            json.dumps({"context": "emulator", "namespace": "default", "run_id": RUN_ID}),
            r"namespace 'default', which this tool never creates; nothing was deleted",
        ),
        (
            json.dumps({"context": "emulator", "namespace": "agc-rl", "run_id": RUN_ID}),
            r"namespace 'agc-rl', which this tool never creates",
        ),
        (
            json.dumps(
                {
                    "context": "emulator",
                    "namespace": "kube-system",
                    "run_id": RUN_ID,
                    "namespace_uid": "u-1",
                }
            ),
            r"'kube-system', which this tool never creates",
        ),
    ],
)
def test_cleanup_refuses_a_corrupt_receipt(
    receipt: str, message: str, tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "receipt.json").write_text(receipt)
    assert main(["cleanup", "--output", str(out)]) == 1
    line = error_line(capsys.readouterr().err)
    assert re.search(message, line), line
    assert (out / "receipt.json").read_text() == receipt
    assert [p.name for p in out.iterdir()] == ["receipt.json"]
    assert no_subprocesses == []


# --------------------------------------------------------------------------
# Report and compare on saved run directories.
#
# Three episodes (seconds after the Job's creation at T0):
#   pod             created  ready  reward  finished  node
#   rollout-4kq2m   +1       +3.5   +8.0    +9        node-1
#   rollout-9vtzb   +1       +4.25  +8.5    +9        node-2
#   rollout-p7x8s   +2       +5.0   +9.75   +10       node-1
# Job Complete at +11; the client saw it at +12.5, 12.7 s after submitting.

PODS = [
    ("rollout-4kq2m", 1, 3.5, 8.0, 9, "node-1"),
    ("rollout-9vtzb", 1, 4.25, 8.5, 9, "node-2"),
    ("rollout-p7x8s", 2, 5.0, 9.75, 10, "node-1"),
]


def saved_pod(name: str, created: int, finished: int, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "creationTimestamp": stamp(created),
            "labels": {"app": "rl-batch-demo", "job-name": "rollout"},
        },
        "spec": {"nodeName": node, "runtimeClassName": "cube"},
        "status": {
            "phase": "Succeeded",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(created)},
                {
                    "type": "PodReadyToStartContainers",
                    "status": "False",
                    "lastTransitionTime": stamp(created + 1),
                },
            ],
            "containerStatuses": [
                {
                    "name": "episode",
                    "restartCount": 0,
                    "ready": False,
                    "image": "python:3.12-alpine",
                    "imageID": "docker.io/library/python@sha256:5a1b",
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": stamp(created + 1),
                            "finishedAt": stamp(finished),
                        }
                    },
                }
            ],
        },
    }


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_saved_run(
    directory: Path,
    *,
    run_json: bool = True,
    job_end: str = "Complete",
    rewards: Optional[dict[str, Any]] = None,
) -> Path:
    """A finished run's directory as `run` leaves it (execute, BatchEvidence.collect)."""
    directory.mkdir()
    write_json(
        directory / "receipt.json",
        {
            "context": "emulator",
            "namespace": NAMESPACE,
            "run_id": RUN_ID,
            "namespace_uid": "ns-uid-1",
            "jobs": {"rollout": "job-uid-1"},
            "job_uid": "job-uid-1",
        },
    )
    if run_json:
        write_json(
            directory / "run.json",
            {
                "version": "0.1.0",
                "count": 3,
                "parallelism": 3,
                "image": "python:3.12-alpine",
                "runtime": "cube",
                "timeout": 240,
                "rounds": 1,
                "warmup": False,
                "harden": False,
                "builtin": True,
                "episode_script": None,
                "context": "emulator",
                "namespace": NAMESPACE,
                "batches": [{"job": "rollout", "measured": True, "dir": "."}],
            },
        )
    else:  # a run saved by the guide's script, which keeps only the guide's files
        write_json(
            directory / "results.json",
            {
                "episodes": 3,
                "successful_episodes": 3,
                "reward_sum": 3,
                "parallelism": 3,
                "image": "python:3.12-alpine",
                "runtime": "cube",
                "context": "emulator",
                "namespace": NAMESPACE,
                "cache_state": "uncontrolled",
                "client_job_complete_seconds": 12.7,
            },
        )
    write_json(
        directory / "job-submitted.json",
        demo.job_manifest(NAMESPACE, 3, 3, "python:3.12-alpine", "cube"),
    )
    write_json(
        directory / "job.json",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "rollout",
                "namespace": NAMESPACE,
                "uid": "job-uid-1",
                "creationTimestamp": stamp(0),
            },
            "status": {
                "succeeded": 3 if job_end == "Complete" else 0,
                "conditions": [
                    {
                        "type": job_end,
                        "status": "True",
                        "lastTransitionTime": stamp(11),
                        "reason": "DeadlineExceeded" if job_end == "Failed" else None,
                    }
                ],
            },
        },
    )
    write_json(
        directory / "pods.json",
        {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": ""},
            "items": [
                saved_pod(name, created, finished, node)
                for name, created, _, _, finished, node in PODS
            ],
        },
    )
    write_json(
        directory / "events.json",
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "kind": "Event",
                    "type": "Warning",
                    "reason": "FailedScheduling",
                    "count": 2,
                    "involvedObject": {"kind": "Pod", "name": "rollout-p7x8s"},
                },
            ],
        },
    )
    (directory / "events.txt").write_text("LAST SEEN   TYPE      REASON             OBJECT\n")
    for name, _, ready, reward, _, _ in PODS:
        value = (rewards or {}).get(name, 1)
        (directory / f"{name}.log").write_text(
            log_text(ready_event(name, T0 + ready), reward_event(name, T0 + reward, reward=value))
        )
    write_json(
        directory / "client.json",
        {
            "job": "rollout",
            "end": job_end,
            "submitted_at": T0 - 0.2,
            "observed_at": T0 + 12.5,
            "client_job_complete_seconds": 12.7,
            "kubectl_processes_while_waiting": 2,
            "watch_restarts": 0,
            "wait_mode": "watch",
            "post_completion_seconds": 0.4,
        },
    )
    return directory


EXPECTED_REPORT = {
    "episodes": 3,
    "successful_episodes": 3,
    "reward_sum": 3,
    "batch_to_all_ready_seconds": 5.0,  # last ready at +5.0
    "batch_to_all_rewards_seconds": 9.75,  # last reward at +9.75
    "pod_to_ready_p50_seconds": 3.0,  # pod_to_ready 2.5, 3.25, 3.0 -> sorted 2.5 3.0 3.25
    "pod_to_ready_p95_seconds": 3.225,  # index 1.9 -> 3.0 + 0.9 * 0.25
    "pod_to_ready_max_seconds": 3.25,
    "context": "emulator",
    "namespace": NAMESPACE,
    "image": "python:3.12-alpine",
    "runtime": "cube",
    "parallelism": 3,
    "cache_state": "uncontrolled",
    "client_job_complete_seconds": 12.7,
}


def test_report_recomputes_the_saved_run(
    tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    run_dir = write_saved_run(tmp_path / "run-a")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    assert main(["report", str(run_dir)]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert {key: printed.get(key) for key in EXPECTED_REPORT} == EXPECTED_REPORT
    assert "pods" not in printed  # per-pod rows are saved in results.json, not printed
    assert printed["nodes"] == {"node-1": 2, "node-2": 1}
    assert printed["warnings"] == {
        "FailedScheduling": {"count": 2, "objects": ["Pod/rollout-p7x8s"]}
    }
    assert printed["results_file"] == os.path.join(str(run_dir), "results.json")
    # Phases and the completion gap are in results.json, as recomputed; not printed.
    recomputed = demo.recompute(str(run_dir)).figures
    assert "phases" not in printed and "completion_gap" not in printed
    assert (
        recomputed["completion_gap"]["job_complete_to_client_observed_seconds"] == 1.5
    )  # +11 -> +12.5
    assert recomputed["phases"]["episode_work"]["p50"] == 4.5  # 4.5, 4.25, 4.75
    assert "pod_to_ready" in captured.err  # the phase table
    # report writes nothing but metrics.prom, made again from the saved files as the run made it
    after = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    assert after.pop("metrics.prom").endswith(b"\n# EOF\n")
    assert after == before
    assert no_subprocesses == []


def test_report_quiet_prints_only_the_results(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_saved_run(tmp_path / "run-a")
    assert main(["report", str(run_dir), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["episodes"] == 3
    assert captured.err == ""


def test_report_of_a_spec_a_only_run_uses_receipt_and_results(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_saved_run(tmp_path / "old-run", run_json=False)
    assert main(["report", str(run_dir), "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {key: printed.get(key) for key in EXPECTED_REPORT} == EXPECTED_REPORT


def test_report_refuses_a_run_that_does_not_verify(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_saved_run(tmp_path / "run-a", rewards={"rollout-9vtzb": 0})
    assert main(["report", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pod rollout-9vtzb: reward is 0, not 1" in captured.err
    assert "Traceback" not in captured.err


def test_report_of_a_run_json_without_a_field_it_needs_says_which(
    tmp_path: Path, capsys: Any
) -> None:
    run_dir = write_saved_run(tmp_path / "run-a")
    saved = json.loads((run_dir / "run.json").read_text())
    del saved["context"], saved["batches"]
    write_json(run_dir / "run.json", saved)
    assert main(["report", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "Error: run.json lacks 'context', 'batches': not a run directory this tool can report\n"
    )


def test_settings_read_back_from_run_json_are_the_settings_saved() -> None:
    settings = demo.Settings(
        count=4,
        parallelism=2,
        timeout=90,
        builtin=False,
        episode_script="episode.py",
        episode_script_sha256="ab" * 32,
        ttl_seconds=600,
        version="0.1.0",
        rollout=True,
        tasks_file="t.jsonl",
        group_size=2,
        retries=1,
        allow_failures=1,
        task_ids=("a", "b"),
        episode_timeout=30,
        context="ctx",
        namespace=NAMESPACE,
        batches=(demo.BatchEntry("rollout", True, "."),),
    )
    saved = json.loads(json.dumps(settings.saved()))
    assert demo.Settings.from_saved(saved) == settings
    assert list(saved) == [
        "version",
        "count",
        "parallelism",
        "image",
        "runtime",
        "timeout",
        "rounds",
        "warmup",
        "harden",
        "builtin",
        "episode_script",
        "chunk_size",
        "episode_script_sha256",
        "ttl_seconds",
        "rollout",
        "tasks_file",
        "group_size",
        "retries",
        "allow_failures",
        "task_ids",
        "episode_timeout",
        "context",
        "namespace",
        "batches",
    ]
    plain = dataclasses.replace(
        settings,
        rollout=False,
        tasks_file=None,
        group_size=1,
        retries=None,
        allow_failures=None,
        task_ids=None,
        episode_timeout=None,
    )
    assert "rollout" not in plain.saved() and demo.Settings.from_saved(plain.saved()) == plain


def test_client_json_lists_what_is_known_in_the_order_it_became_known() -> None:
    wait = demo.ClientWait("rollout", "Complete", T0, T0 + 3, 3.0, 2, 0, 5, "watch")
    assert list(wait.saved()) == [
        "job",
        "end",
        "submitted_at",
        "observed_at",
        "client_job_complete_seconds",
        "kubectl_processes_while_waiting",
        "watch_restarts",
        "watch_queue_peak",
        "wait_mode",
    ]
    done = wait._replace(
        pods_read={"source": "list"}, events_read="watch", post_completion_seconds=0.2
    )
    assert list(done.saved())[-3:] == ["pods_read", "events_read", "post_completion_seconds"]
    assert (
        done._replace(end=None, observed_at=None).saved()["end"] is None
    )  # given up on: still said
    assert list(done._replace(reward_deliveries=[]).saved())[-2:] == [
        "reward_deliveries",
        "post_completion_seconds",
    ]


def test_report_refuses_a_job_that_did_not_complete(tmp_path: Path, capsys: Any) -> None:
    run_dir = write_saved_run(tmp_path / "run-a", job_end="Failed")
    assert main(["report", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("Error: ") and "did not complete" in captured.err
    assert "Traceback" not in captured.err


def interrupted_run(directory: Path) -> Path:
    """A run interrupted while its Job ran, as `run` leaves it: the Job saved without a
    Complete or Failed condition, one pod still running, no client.json, no results.json."""
    write_saved_run(directory)
    job = json.loads((directory / "job.json").read_text())
    job["status"] = {"active": 1, "succeeded": 2, "startTime": stamp(0)}
    write_json(directory / "job.json", job)
    pods = json.loads((directory / "pods.json").read_text())
    running = pods["items"][2]["status"]
    running["phase"] = "Running"
    running["containerStatuses"][0]["state"] = {"running": {"startedAt": stamp(3)}}
    write_json(directory / "pods.json", pods)
    (directory / "rollout-p7x8s.log").write_text(json.dumps(ready_event("rollout-p7x8s", T0 + 5.0)))
    (directory / "client.json").unlink()
    assert not (directory / "results.json").exists()
    return directory


def test_report_of_an_interrupted_run_says_it_never_finished(
    tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    run_dir = interrupted_run(tmp_path / "run-a")
    assert main(["report", str(run_dir)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "Error: Job rollout never finished while the run watched it (the run was interrupted or gave up "
        "waiting: job.json has no Complete or Failed condition); nothing to report",
        "  pod rollout-p7x8s: Running, still running",
    ]
    assert no_subprocesses == []


def test_report_of_a_run_stopped_before_its_job_was_saved(tmp_path: Path, capsys: Any) -> None:
    run_dir = interrupted_run(tmp_path / "run-a")
    (run_dir / "job.json").unlink()
    assert main(["report", "--output", str(run_dir)]) == 1
    line = error_line(capsys.readouterr().err)
    assert f"no job.json in {run_dir}: the run stopped before its Job's status was saved" in line
    assert "interrupted" in line


def test_report_of_an_empty_directory_is_a_one_line_error(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 1
    error_line(capsys.readouterr().err)


def guide_results(**changes: Any) -> dict:
    """results.json of the guide's 10-way parallel run, in the guide's fields."""
    results = dict(
        GUIDE_PARALLEL,
        successful_episodes=10,
        pods=[],
        context="emulator",
        namespace=NAMESPACE,
        image="python:3.12-alpine",
        runtime="cube",
        cache_state="uncontrolled",
    )
    results.update(changes)
    return results


def test_compare_prints_both_runs_with_ratios(
    tmp_path: Path, capsys: Any, no_subprocesses: list
) -> None:
    parallel, serial = tmp_path / "parallel", tmp_path / "serial"
    parallel.mkdir()
    serial.mkdir()
    write_json(parallel / "results.json", guide_results())
    write_json(serial / "results.json", guide_results(**GUIDE_SERIAL))
    assert main(["compare", str(parallel), str(serial)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == GUIDE_COMPARE_HEADER
    # What each run was: alike here, so the figures compare like with like.
    assert compare_rows(printed) == dict(
        GUIDE_COMPARE_ROWS,
        image=["python:3.12-alpine", "python:3.12-alpine", "same"],
        runtime=["cube", "cube", "same"],
        cache_state=["uncontrolled", "uncontrolled", "same"],
        context=["emulator", "emulator", "same"],
    )
    assert no_subprocesses == []


def test_compare_of_a_report_directory_and_a_run_without_results(
    tmp_path: Path, capsys: Any
) -> None:
    first = tmp_path / "a"
    first.mkdir()
    write_json(first / "results.json", guide_results())
    (tmp_path / "unfinished").mkdir()
    assert main(["compare", str(first), str(tmp_path / "unfinished")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    line = error_line(captured.err)
    assert "results.json" in line and "unfinished" in line


def test_the_printed_results_are_a_summary_and_the_file_that_holds_the_rest() -> None:
    saved = {
        "episodes": 2,
        "pods": [{"pod": "a"}, {"pod": "b"}],
        "image": "python:3.12-alpine",
        "client": {"kubectl_processes": 9, "cpu_seconds": 0.5},
        "phases": {"scheduling": {"p50": 0.1}},
        "groups": [{"group": 0}],
        "failures": [],
        "clock_warnings": ["node-1's clock is 2 s ahead"],
        "failed_warnings": [],
        "warnings": {
            "FailedScheduling": {"count": 9, "objects": ["Pod/a", "Pod/b", "Pod/c", "Pod/d"]}
        },
        "rounds": [{"episodes": 1, "pods": [{"pod": "c"}], "phases": {"a": {"p50": 1}}}],
        "warmup": {"episodes": 1, "pods": []},
    }
    assert demo.printed_results(saved, "out/results.json") == {
        "episodes": 2,
        "image": "python:3.12-alpine",
        "client": {"kubectl_processes": 9, "cpu_seconds": 0.5},
        "clock_warnings": ["node-1's clock is 2 s ahead"],
        "warnings": {
            "FailedScheduling": {"count": 9, "objects": ["Pod/a", "Pod/b", "Pod/c", "and 1 more"]}
        },
        "rounds": [{"episodes": 1}],
        "warmup": {"episodes": 1},
        "results_file": "out/results.json",
    }
