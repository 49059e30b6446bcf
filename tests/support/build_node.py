"""Build a real node's binaries from the Go module proxy, once, beside the control plane.

The kubelet comes from `k8s.io/kubernetes` through a build module like the
control plane's (it needs the same staging-module replaces); containerd, the
registry, crane and crictl each get a build module of their own, since their
dependency graphs disagree. runc and the CNI plugins are Debian's packages
(apt-get), which build nothing. crun, the second runtime, is built from Debian's
source of a newer release than Debian 12 ships (its 1.8.1 refuses the runtime
spec containerd 2 writes: "unknown version specified"). The binaries are cached
under tests/.cache/control-plane/node-<versions>/bin (crun under crun-<version>),
so a second run reuses them.

    python3 tests/support/build_node.py        # build if missing, print the bin dir
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_control_plane  # noqa: E402  (needs the path above)
from build_control_plane import BuildError  # noqa: E402

KUBERNETES_VERSION = build_control_plane.KUBERNETES_VERSION
CONTAINERD_VERSION = "2.4.2"
DISTRIBUTION_VERSION = "3.1.2"
CRANE_VERSION = "0.22.1"
CRICTL_VERSION = "1.34.0"
CACHE_DIR = build_control_plane.CACHE_DIR
BIN_DIR = (
    CACHE_DIR
    / (
        f"node-k8s-v{KUBERNETES_VERSION}-containerd-v{CONTAINERD_VERSION}"
        f"-registry-v{DISTRIBUTION_VERSION}-crane-v{CRANE_VERSION}-crictl-v{CRICTL_VERSION}"
    )
    / "bin"
)
# Debian's packages: runc as containerd's runtime, the reference CNI plugins (bridge,
# host-local, loopback), and what crun is built with (a C compiler, make, pkg-config and the
# headers of the libraries it links: libseccomp, libcap, yajl).
DEBIAN_PACKAGES = {
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "gcc": "/usr/bin/gcc",
    "make": "/usr/bin/make",
    "pkgconf": "/usr/bin/pkg-config",
    "libseccomp-dev": "/usr/include/seccomp.h",
    "libcap-dev": "/usr/include/sys/capability.h",
    "libyajl-dev": "/usr/include/yajl/yajl_tree.h",
}
# crun, the second runtime handler: Debian 12's crun (1.8.1) knows runtime specs up to 1.1 and
# refuses the 1.3.0 that containerd 2.4 writes ("OCI runtime create failed: unknown version
# specified"), so the release Debian 13 ships is built here from Debian's own copy of its source.
CRUN_VERSION = "1.21"
CRUN_SOURCE = f"https://deb.debian.org/debian/pool/main/c/crun/crun_{CRUN_VERSION}.orig.tar.gz"
CRUN_SOURCE_SHA256 = "4bfb700e764a4804a4de3ecf07753f4c391005356d60356df65d80ae0914c486"
CRUN = CACHE_DIR / f"crun-{CRUN_VERSION}" / "crun"
CNI_BIN_DIR = Path("/usr/lib/cni")
CONTAINERD_TAGS = "no_btrfs no_devmapper no_zfs"

# (binary, module, version, package path, extra ldflags) per Go binary we build.
GoBinary = tuple[str, str, str, str, str]
GO_BINARIES: tuple[GoBinary, ...] = (
    (
        "containerd",
        "github.com/containerd/containerd/v2",
        CONTAINERD_VERSION,
        "cmd/containerd",
        "-X github.com/containerd/containerd/v2/version.Version=v{v}",
    ),
    (
        "containerd-shim-runc-v2",
        "github.com/containerd/containerd/v2",
        CONTAINERD_VERSION,
        "cmd/containerd-shim-runc-v2",
        "-X github.com/containerd/containerd/v2/version.Version=v{v}",
    ),
    (
        "ctr",
        "github.com/containerd/containerd/v2",
        CONTAINERD_VERSION,
        "cmd/ctr",
        "-X github.com/containerd/containerd/v2/version.Version=v{v}",
    ),
    (
        "registry",
        "github.com/distribution/distribution/v3",
        DISTRIBUTION_VERSION,
        "cmd/registry",
        "-X github.com/distribution/distribution/v3/version.version=v{v}",
    ),
    ("crane", "github.com/google/go-containerregistry", CRANE_VERSION, "cmd/crane", ""),
    (
        "crictl",
        "sigs.k8s.io/cri-tools",
        CRICTL_VERSION,
        "cmd/crictl",
        "-X sigs.k8s.io/cri-tools/pkg/version.Version=v{v}",
    ),
)
BINARIES = ("kubelet",) + tuple(entry[0] for entry in GO_BINARIES)


def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    return all(os.access(bin_dir / name, os.X_OK) for name in BINARIES) and os.access(CRUN, os.X_OK)


def debian_missing() -> list[str]:
    return [package for package, probe in DEBIAN_PACKAGES.items() if not os.path.exists(probe)]


def ensure_debian_packages(log: Callable[..., None] = print) -> None:
    missing = debian_missing()
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise BuildError(f"{', '.join(missing)} missing and there is no apt-get to install them")
    log(f"installing {', '.join(missing)} from Debian (apt-get; under a minute)...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "install", "-y", "-q", *missing],
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", *missing],
    ):
        completed = subprocess.run(
            argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
        if completed.returncode == 0 and argv[1] == "install":
            break
    if debian_missing():
        raise BuildError(
            f"apt-get install {' '.join(missing)} failed:\n{completed.stderr.strip()[-2000:]}"
        )


def _build_kubelet(go: str, env: dict[str, str], out: Path) -> None:
    """cmd/kubelet through a copy of the control plane's build module (same replaces)."""
    module_dir = CACHE_DIR / f"build-kubelet-v{KUBERNETES_VERSION}"
    module_dir.mkdir(parents=True, exist_ok=True)
    info_json = build_control_plane._run(
        [go, "mod", "download", "-json", f"k8s.io/kubernetes@v{KUBERNETES_VERSION}"],
        module_dir,
        env,
    )
    import json

    staging = build_control_plane.staging_modules(Path(json.loads(info_json)["GoMod"]).read_text())
    if not staging:
        raise BuildError("no staging modules found in k8s.io/kubernetes' go.mod")
    minor = KUBERNETES_VERSION.split(".", 1)[1]
    lines = [
        "module rldemo.test/kubelet-build",
        "",
        f"go {build_control_plane.GO_MODULE_DIRECTIVE}",
        "",
        f"require k8s.io/kubernetes v{KUBERNETES_VERSION}",
        "",
        "replace (",
    ]
    lines += [f"\t{name} => {name} v0.{minor}" for name in staging]
    lines += [")", ""]
    (module_dir / "go.mod").write_text("\n".join(lines))
    (module_dir / "tools.go").write_text(
        '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n'
    )
    build_control_plane._run([go, "mod", "tidy"], module_dir, env)
    major, kube_minor = KUBERNETES_VERSION.split(".")[:2]
    flags = (
        f"-s -w -X k8s.io/component-base/version.gitVersion=v{KUBERNETES_VERSION} "
        f"-X k8s.io/component-base/version.gitMajor={major} "
        f"-X k8s.io/component-base/version.gitMinor={kube_minor} "
        "-X k8s.io/component-base/version.gitTreeState=clean"
    )
    build_control_plane._run(
        [
            go,
            "build",
            f"-ldflags={flags}",
            "-o",
            str(out / "kubelet"),
            "k8s.io/kubernetes/cmd/kubelet",
        ],
        module_dir,
        env,
    )


def _build_module_binaries(
    go: str, env: dict[str, str], out: Path, module: str, version: str, entries: list[GoBinary]
) -> None:
    """Build the packages `entries` name from one module, in a build module of its own."""
    module_dir = CACHE_DIR / f"build-{module.replace('/', '_')}-v{version}"
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "go.mod").write_text(
        f"module rldemo.test/node-build\n\n"
        f"go {build_control_plane.GO_MODULE_DIRECTIVE}\n\n"
        f"require {module} v{version}\n"
    )
    imports = "\n".join(f'\t_ "{module}/{entry[3]}"' for entry in entries)
    (module_dir / "tools.go").write_text(
        f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"
    )
    build_control_plane._run([go, "mod", "tidy"], module_dir, env)
    for name, _, _, package, ldflags in entries:
        build_control_plane._run(
            [
                go,
                "build",
                f"-tags={CONTAINERD_TAGS}",
                f"-ldflags=-s -w {ldflags.format(v=version)}",
                "-o",
                str(out / name),
                f"{module}/{package}",
            ],
            module_dir,
            env,
        )


def _build_crun(log: Callable[..., None]) -> None:
    """crun from its source release, checked against the digest Debian's archive lists for it."""
    work = CRUN.parent.with_name(f"build-crun-{CRUN_VERSION}")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log(f"building crun {CRUN_VERSION} from Debian's source (about a minute)...", flush=True)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(CRUN_SOURCE, timeout=120) as response:
            source = response.read()
    except OSError as error:
        raise BuildError(f"cannot fetch {CRUN_SOURCE}: {error}") from error
    digest = hashlib.sha256(source).hexdigest()
    if digest != CRUN_SOURCE_SHA256:
        raise BuildError(f"{CRUN_SOURCE} has sha256 {digest}, not {CRUN_SOURCE_SHA256}")
    with tarfile.open(fileobj=io.BytesIO(source)) as archive:
        if hasattr(tarfile, "data_filter"):  # refuses links and paths out of `work`
            archive.extractall(work, filter="data")
        else:
            archive.extractall(work)
    tree = work / f"crun-{CRUN_VERSION}"
    env = dict(os.environ, LC_ALL="C")
    # No systemd cgroup driver (the node uses cgroupfs), no checkpointing: fewer libraries to link.
    build_control_plane._run(["./configure", "--disable-systemd", "--disable-criu"], tree, env)
    build_control_plane._run(["make", f"-j{os.cpu_count() or 1}"], tree, env)
    CRUN.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(tree / "crun", CRUN.with_name("crun.partial"))
    CRUN.with_name("crun.partial").rename(CRUN)
    shutil.rmtree(work)
    log(f"built crun {CRUN_VERSION} in {time.monotonic() - started:.0f}s", flush=True)


def ensure_built(log: Callable[..., None] = print) -> Path:
    """The directory holding the node's Go binaries, building the missing ones first."""
    ensure_debian_packages(log)
    if not os.access(CRUN, os.X_OK):
        _build_crun(log)
    if binaries_present():
        return BIN_DIR
    go = build_control_plane._go()
    env = build_control_plane._go_env()
    staging_bin = BIN_DIR.with_name("bin.partial")
    staging_bin.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    groups: dict[tuple[str, str], list[GoBinary]] = {}
    for entry in GO_BINARIES:
        if not os.access(staging_bin / entry[0], os.X_OK):
            groups.setdefault((entry[1], entry[2]), []).append(entry)
    for (module, version), entries in groups.items():
        names = ", ".join(entry[0] for entry in entries)
        log(
            f"building {names} ({module} v{version}) from the Go module proxy (a few minutes)...",
            flush=True,
        )
        step = time.monotonic()
        _build_module_binaries(go, env, staging_bin, module, version, entries)
        log(f"built {names} in {time.monotonic() - step:.0f}s", flush=True)
    if not os.access(staging_bin / "kubelet", os.X_OK):
        log(
            f"building kubelet v{KUBERNETES_VERSION} from the Go module proxy "
            "(~6 min on 2 cores with the control plane in Go's build cache, longer cold)...",
            flush=True,
        )
        step = time.monotonic()
        _build_kubelet(go, env, staging_bin)
        log(f"built kubelet in {time.monotonic() - step:.0f}s", flush=True)
    if BIN_DIR.exists():
        shutil.rmtree(BIN_DIR)
    staging_bin.rename(BIN_DIR)
    log(f"node binaries ready in {BIN_DIR} ({time.monotonic() - started:.0f}s)", flush=True)
    return BIN_DIR


def main() -> int:
    try:
        print(ensure_built())
    except BuildError as error:
        print(f"cannot build the node's binaries: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
