"""Build the Kueue manager from the Go module proxy, once.

`sigs.k8s.io/kueue` has no replace directives, so a small build module under
tests/.cache requires it at KUEUE_VERSION and builds `cmd/kueue` (the manager:
its controllers and its webhooks in one process). Its CRDs come from the same
module's config/components/crd/bases, copied beside the binary so that a cached
build needs nothing else. Cached under tests/.cache/kueue-v<version>/bin.

    python3 tests/support/build_kueue.py        # build if missing, print the bin dir
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
KUEUE_VERSION = "0.17.0"
CACHE_DIR = REPO_ROOT / "tests" / ".cache" / f"kueue-v{KUEUE_VERSION}"
BIN_DIR = CACHE_DIR / "bin"
BINARY = "kueue-manager"
CRD_DIR_NAME = "crd"
GO_MODULE_DIRECTIVE = "1.25.0"


class BuildError(Exception):
    """Kueue cannot be built here (no Go, no module proxy, a failed build)."""


WEBHOOK_MANIFESTS = "webhook-manifests.yaml"


def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    return (
        os.access(bin_dir / BINARY, os.X_OK)
        and any((bin_dir / CRD_DIR_NAME).glob("*.yaml"))
        and (bin_dir / WEBHOOK_MANIFESTS).exists()
    )


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if go is None:
        raise BuildError("the Go toolchain (`go`) is not installed; it builds the Kueue manager")
    return go


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    completed = subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if completed.returncode != 0:
        raise BuildError(
            f"`{' '.join(argv)}` failed in {cwd} (exit {completed.returncode}):\n"
            f"{completed.stderr.strip()[-4000:]}"
        )
    return completed.stdout


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-trimpath")
    env["CGO_ENABLED"] = "0"
    return env


def _build(go: str, env: dict[str, str], staging_bin: Path) -> None:
    module_dir = CACHE_DIR / "build"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "go.mod").write_text(
        f"module rldemo.test/kueue-build\n\ngo {GO_MODULE_DIRECTIVE}\n\n"
        f"require sigs.k8s.io/kueue v{KUEUE_VERSION}\n"
    )
    (module_dir / "tools.go").write_text(
        '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/kueue/cmd/kueue"\n'
    )
    _run([go, "mod", "tidy"], module_dir, env)
    version_flag = f"-X sigs.k8s.io/kueue/pkg/version.GitVersion=v{KUEUE_VERSION}"
    _run(
        [go, "build", f"-ldflags=-s -w {version_flag}", "-o", str(staging_bin / BINARY)]
        + ["sigs.k8s.io/kueue/cmd/kueue"],
        module_dir,
        env,
    )


def copy_manifests(go: str, env: dict[str, str], bin_dir: Path) -> None:
    """The module's CRDs and webhook configurations, beside the manager they go with."""
    module_dir = CACHE_DIR / "build"
    module_dir.mkdir(parents=True, exist_ok=True)
    info = json.loads(
        _run(
            [go, "mod", "download", "-json", f"sigs.k8s.io/kueue@v{KUEUE_VERSION}"], module_dir, env
        )
    )
    components = Path(info["Dir"]) / "config" / "components"
    target = bin_dir / CRD_DIR_NAME
    target.mkdir(exist_ok=True)
    for crd in sorted((components / "crd" / "bases").glob("*.yaml")):
        shutil.copyfile(crd, target / crd.name)
    if not any(target.glob("*.yaml")):
        raise BuildError(f"no CRDs found in {components / 'crd' / 'bases'}")
    shutil.copyfile(components / "webhook" / "manifests.yaml", bin_dir / WEBHOOK_MANIFESTS)


def ensure_built(log=print) -> Path:
    """The directory holding the Kueue manager and its CRDs, building them first if missing."""
    if binaries_present():
        return BIN_DIR
    go = _go()
    if os.access(BIN_DIR / BINARY, os.X_OK):  # a build of before the manifests were kept
        copy_manifests(go, _go_env(), BIN_DIR)
        return BIN_DIR
    staging_bin = BIN_DIR.with_name("bin.partial")
    staging_bin.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if not os.access(staging_bin / BINARY, os.X_OK):
        log(f"building the Kueue manager v{KUEUE_VERSION} from the Go module proxy...", flush=True)
        _build(go, _go_env(), staging_bin)
    copy_manifests(go, _go_env(), staging_bin)
    if BIN_DIR.exists():
        shutil.rmtree(BIN_DIR)
    staging_bin.rename(BIN_DIR)
    log(f"Kueue manager ready in {BIN_DIR} ({time.monotonic() - started:.0f}s)", flush=True)
    return BIN_DIR


def main() -> int:
    try:
        print(ensure_built())
    except BuildError as error:
        print(f"cannot build Kueue: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
