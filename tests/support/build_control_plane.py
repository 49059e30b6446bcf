"""Build the real Kubernetes control plane binaries from the Go module proxy, once.

`k8s.io/kubernetes` cannot be `go install`ed: its go.mod requires the
`k8s.io/*` staging modules at v0.0.0 and replaces them with local paths. A small
build module under tests/.cache requires it and replaces every staging module
with its published v0.Y.Z twin; etcd gets a build module of its own. The
binaries are cached under tests/.cache/control-plane/<versions>/bin, so a second
run reuses them.

    python3 tests/support/build_control_plane.py        # build if missing, print the bin dir
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CACHE_DIR = REPO_ROOT / "tests" / ".cache" / "control-plane"

KUBERNETES_VERSION = "1.35.4"
ETCD_VERSION = "3.6.5"
BIN_DIR = CACHE_DIR / f"k8s-v{KUBERNETES_VERSION}-etcd-v{ETCD_VERSION}" / "bin"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = KUBE_COMMANDS + ("etcd",)
GO_MODULE_DIRECTIVE = "1.25"


class BuildError(Exception):
    """The control plane cannot be built here (no Go, no module proxy, a failed build)."""


def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in BINARIES)


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if go is None:
        raise BuildError(
            "the Go toolchain (`go`) is not installed; it builds kube-apiserver, "
            "kube-controller-manager, kube-scheduler and etcd for the real-cluster tests"
        )
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


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The k8s.io/* modules that kubernetes' go.mod replaces with ./staging paths."""
    return sorted(
        set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", kubernetes_go_mod, re.M))
    )


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-trimpath")
    env["CGO_ENABLED"] = "0"
    return env


def _build_kubernetes(go: str, env: dict[str, str], bin_dir: Path) -> None:
    module_dir = CACHE_DIR / f"build-kubernetes-v{KUBERNETES_VERSION}"
    module_dir.mkdir(parents=True, exist_ok=True)
    info = json.loads(
        _run(
            [go, "mod", "download", "-json", f"k8s.io/kubernetes@v{KUBERNETES_VERSION}"],
            module_dir,
            env,
        )
    )
    staging = staging_modules(Path(info["GoMod"]).read_text())
    if not staging:
        raise BuildError(f"no staging modules found in {info['GoMod']}")
    minor = KUBERNETES_VERSION.split(".", 1)[1]
    lines = [
        "module rldemo.test/kubernetes-build",
        "",
        f"go {GO_MODULE_DIRECTIVE}",
        "",
        f"require k8s.io/kubernetes v{KUBERNETES_VERSION}",
        "",
        "replace (",
    ]
    lines += [f"\t{name} => {name} v0.{minor}" for name in staging]
    lines += [")", ""]
    (module_dir / "go.mod").write_text("\n".join(lines))
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{name}"' for name in KUBE_COMMANDS)
    (module_dir / "tools.go").write_text(
        f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"
    )
    _run([go, "mod", "tidy"], module_dir, env)
    version_flags = " ".join(
        [
            f"-X k8s.io/component-base/version.gitVersion=v{KUBERNETES_VERSION}",
            f"-X k8s.io/component-base/version.gitMajor={KUBERNETES_VERSION.split('.')[0]}",
            f"-X k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
        ]
    )
    _run(
        [go, "build", f"-ldflags=-s -w {version_flags}", "-o", str(bin_dir) + "/"]
        + [f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_COMMANDS],
        module_dir,
        env,
    )


def _build_etcd(go: str, env: dict[str, str], bin_dir: Path) -> None:
    module_dir = CACHE_DIR / f"build-etcd-v{ETCD_VERSION}"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "go.mod").write_text(
        f"module rldemo.test/etcd-build\n\ngo {GO_MODULE_DIRECTIVE}\n\n"
        f"require go.etcd.io/etcd/server/v3 v{ETCD_VERSION}\n"
    )
    (module_dir / "tools.go").write_text(
        '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n'
    )
    _run([go, "mod", "tidy"], module_dir, env)
    _run(
        [go, "build", "-ldflags=-s -w", "-o", str(bin_dir / "etcd"), "go.etcd.io/etcd/server/v3"],
        module_dir,
        env,
    )


def ensure_built(log=print) -> Path:
    """The directory holding the four binaries, building the missing ones first."""
    if binaries_present():
        return BIN_DIR
    go = _go()
    env = _go_env()
    staging_bin = BIN_DIR.with_name("bin.partial")
    staging_bin.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if not all(os.access(staging_bin / name, os.X_OK) for name in KUBE_COMMANDS):
        log(
            f"building {', '.join(KUBE_COMMANDS)} v{KUBERNETES_VERSION} from the Go module proxy "
            f"(a cold build takes many minutes on 2 cores)...",
            flush=True,
        )
        step = time.monotonic()
        _build_kubernetes(go, env, staging_bin)
        log(f"built {', '.join(KUBE_COMMANDS)} in {time.monotonic() - step:.0f}s", flush=True)
    if not os.access(staging_bin / "etcd", os.X_OK):
        log(f"building etcd v{ETCD_VERSION} from the Go module proxy...", flush=True)
        step = time.monotonic()
        _build_etcd(go, env, staging_bin)
        log(f"built etcd in {time.monotonic() - step:.0f}s", flush=True)
    if BIN_DIR.exists():
        shutil.rmtree(BIN_DIR)
    staging_bin.rename(BIN_DIR)
    log(
        f"control plane binaries ready in {BIN_DIR} ({time.monotonic() - started:.0f}s)", flush=True
    )
    return BIN_DIR


def main() -> int:
    try:
        print(ensure_built())
    except BuildError as error:
        print(f"cannot build the control plane: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
