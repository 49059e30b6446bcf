"""Build a Go command of a published module from the Go module proxy, once, into tests/.cache.

`go install pkg@version` refuses a module whose go.mod has replace directives (Jaeger's has
one), so each build gets a small module of its own under tests/.cache/<name>-v<version>/build:
it requires the published module, copies its replace directives and its `go` line, and builds
the command with `go build`. The binaries land in tests/.cache/<name>-v<version>/bin, written
through a partial directory renamed at the end, so an interrupted build is never taken for one.
The shared Go caches (~/.cache/go-build, ~/go/pkg/mod) make a second build of the same
dependencies fast.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CACHE_ROOT = REPO_ROOT / "tests" / ".cache"


class BuildError(Exception):
    """A Go command cannot be built here (no Go, no module proxy, a failed build)."""


class GoCommand(NamedTuple):
    """One command to build: its binary's name, its module and version, its package path."""

    binary: str
    module: str
    version: str  # v1.2.3
    package: str
    ldflags: str = "-s -w"


def bin_dir(name: str, version: str) -> Path:
    return CACHE_ROOT / f"{name}-{version}" / "bin"


def binaries_present(directory: Path, commands: Sequence[GoCommand]) -> bool:
    return all(os.access(directory / command.binary, os.X_OK) for command in commands)


def go_binary() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if go is None:
        raise BuildError("the Go toolchain (`go`) is not installed")
    return go


def run_go(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    completed = subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if completed.returncode != 0:
        raise BuildError(
            f"`{' '.join(argv)}` failed in {cwd} (exit {completed.returncode}):\n"
            f"{completed.stderr.strip()[-4000:]}"
        )
    return completed.stdout


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-trimpath -buildvcs=false")
    env["CGO_ENABLED"] = "0"
    return env


def replace_lines(go_mod: str) -> list[str]:
    """A go.mod's replace directives, single-line and block, as single lines (local paths dropped:
    a published module's own ./ paths do not exist outside it)."""
    lines: list[str] = []
    for block in re.findall(r"^replace\s*\((.*?)^\)", go_mod, re.M | re.S):
        lines += [line.strip() for line in block.splitlines() if line.strip()]
    lines += re.findall(r"^replace\s+([^(\s].*)$", go_mod, re.M)
    return [line for line in lines if "=> ./" not in line and "=> ../" not in line]


def go_directive(go_mod: str) -> str:
    found = re.search(r"^go\s+(\S+)", go_mod, re.M)
    return found.group(1) if found else "1.24"


def build_module(go: str, env: dict[str, str], directory: Path, command: GoCommand) -> None:
    """A module under `directory` that requires the command's module as published, with its
    replace directives and `go` line, and imports the command's package."""
    directory.mkdir(parents=True, exist_ok=True)
    info = json.loads(
        run_go(
            [go, "mod", "download", "-json", f"{command.module}@{command.version}"], directory, env
        )
    )
    go_mod = Path(info["GoMod"]).read_text()
    replaces = "".join(f"replace {line}\n" for line in replace_lines(go_mod))
    (directory / "go.mod").write_text(
        f"module rldemo.test/{command.binary}-build\n\ngo {go_directive(go_mod)}\n\n"
        f"require {command.module} {command.version}\n\n{replaces}"
    )
    (directory / "tools.go").write_text(
        f'//go:build tools\n\npackage tools\n\nimport _ "{command.package}"\n'
    )
    run_go([go, "mod", "tidy"], directory, env)


def ensure_built(
    name: str, version: str, commands: Sequence[GoCommand], log: Callable[..., None] = print
) -> Path:
    """The directory holding `commands`' binaries, building the missing ones first; each build
    prints how long it took."""
    target = bin_dir(name, version)
    if binaries_present(target, commands):
        return target
    go, env = go_binary(), go_env()
    partial = target.with_name("bin.partial")
    partial.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for command in commands:
        if os.access(partial / command.binary, os.X_OK):
            continue
        log(f"building {command.binary} {command.version} from the Go module proxy...", flush=True)
        step = time.monotonic()
        module_dir = target.parent / f"build-{command.binary}"
        build_module(go, env, module_dir, command)
        run_go(
            [go, "build", f"-ldflags={command.ldflags}", "-o", str(partial / command.binary)]
            + [command.package],
            module_dir,
            env,
        )
        log(f"built {command.binary} in {time.monotonic() - step:.0f}s", flush=True)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    log(f"{name} binaries ready in {target} ({time.monotonic() - started:.0f}s)", flush=True)
    return target
