"""Shared pytest setup: import paths, markers, and the end-to-end prerequisites.

`tests/run_tests.py` discovers the prerequisites and passes them in the
environment (RLDEMO_KUBECTLS, RLDEMO_KUBECTL, RLDEMO_BWRAP, RLDEMO_REQUIRE_E2E);
a bare `pytest` run finds them itself, without downloading anything.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable, NoReturn, Optional

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
# The package (src/) before the repository root, where the generated single file of the same name
# lives: the tests import the package's modules, and run the generated file as a program. The
# tests import the test machinery in tests/support/ (the emulator, the node agent, the builders)
# by its modules' names, and the real tiers import scenario helpers from the files of tests/e2e/
# and tests/real_cluster/, whichever folder pytest was given.
_IMPORTED = (REPO_ROOT, TESTS_DIR, TESTS_DIR / "e2e", TESTS_DIR / "real_cluster")
for _path in map(str, (*_IMPORTED, TESTS_DIR / "support", REPO_ROOT / "src")):
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)

import prereqs  # noqa: E402  (needs the path above)

MARKERS = {
    "e2e": "end-to-end: real kubectl against the emulator in tests/support/, pods sandboxed by bubblewrap",
    "slow": "takes more than a few seconds; deselect with -m 'not slow'",
    "real_cluster": "end-to-end on a real control plane (kube-apiserver, controllers, scheduler) and the node agent",
    "real_node": "end-to-end on a real control plane and a real node (kubelet, containerd, runc), as root",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


@functools.lru_cache(maxsize=None)
def discovered_kubectls() -> dict[str, str]:
    """{version: path} from $RLDEMO_KUBECTLS, else found locally (nothing is fetched)."""
    given = os.environ.get("RLDEMO_KUBECTLS")
    if given:
        try:
            kubectls = json.loads(given)
        except ValueError as error:
            raise pytest.UsageError(f"RLDEMO_KUBECTLS is not a JSON object: {error}") from None
        if not isinstance(kubectls, dict):
            raise pytest.UsageError("RLDEMO_KUBECTLS is not a JSON object of version -> path")
        return kubectls
    return prereqs.find_kubectls()


@functools.lru_cache(maxsize=None)
def discovered_bwrap() -> Optional[str]:
    """Path of bwrap from $RLDEMO_BWRAP or PATH (nothing is installed)."""
    return os.environ.get("RLDEMO_BWRAP") or prereqs.find_bwrap()


@functools.lru_cache(maxsize=None)
def discovered_control_plane() -> Optional[str]:
    """The directory of the control plane binaries from $RLDEMO_CONTROL_PLANE_BIN or the cache (nothing is built)."""
    given = os.environ.get("RLDEMO_CONTROL_PLANE_BIN")
    if given:
        return given
    import build_control_plane

    return str(build_control_plane.BIN_DIR) if build_control_plane.binaries_present() else None


def discovered_kueue() -> Optional[str]:
    """The directory of the Kueue manager and its manifests from $RLDEMO_KUEUE_BIN or the cache
    (nothing is built)."""
    given = os.environ.get("RLDEMO_KUEUE_BIN")
    if given:
        return given
    import build_kueue

    return str(build_kueue.BIN_DIR) if build_kueue.binaries_present() else None


@functools.lru_cache(maxsize=None)
def discovered_node_bin() -> Optional[str]:
    """The directory of the real node's binaries from $RLDEMO_NODE_BIN or the cache (nothing is built)."""
    given = os.environ.get("RLDEMO_NODE_BIN")
    if given:
        return given
    import build_node

    return (
        str(build_node.BIN_DIR)
        if build_node.binaries_present() and not build_node.debian_missing()
        else None
    )


def default_kubectl_path() -> Optional[str]:
    """$RLDEMO_KUBECTL, else 1.33, else the newest found, else kubectl on PATH."""
    return os.environ.get("RLDEMO_KUBECTL") or prereqs.default_kubectl(discovered_kubectls())


def require_prerequisites(
    kubectl_version: Optional[str] = None,
    *,
    kubectl: bool = True,
    bwrap: bool = True,
    control_plane: bool = False,
    node: bool = False,
) -> Optional[str]:
    """Skip the test -- or fail it when CI / RLDEMO_REQUIRE_E2E is set -- unless the
    prerequisites are present. Returns the kubectl path (the default one when
    kubectl_version is None; None when kubectl=False).

    A plain function so session- and module-scoped fixtures can call it too.
    """
    missing = []
    path = None
    if kubectl:
        path = (
            discovered_kubectls().get(kubectl_version)
            if kubectl_version
            else default_kubectl_path()
        )
        if path is None:
            missing.append(f"kubectl {kubectl_version}" if kubectl_version else "kubectl")
    if bwrap and discovered_bwrap() is None:
        missing.append("bwrap (bubblewrap)")
    if control_plane and discovered_control_plane() is None:
        missing.append("the control plane binaries (kube-apiserver, ...; built with Go)")
    if node and discovered_node_bin() is None:
        missing.append(
            "the real node's binaries (kubelet, containerd, ...; built with Go) and runc/crun/CNI"
        )
    if node and os.geteuid() != 0:
        missing.append("root (the real node runs containerd and the kubelet)")
    if missing:
        skip_or_fail(
            f"missing prerequisite: {', '.join(missing)} (python3 tests/run_tests.py finds or installs them)"
        )
    return path


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for want of what `reason` names -- or fail it when CI / RLDEMO_REQUIRE_E2E is set."""
    if prereqs.e2e_required():
        pytest.fail(f"{reason}; CI / RLDEMO_REQUIRE_E2E forbids skipping", pytrace=False)
    pytest.skip(reason)


def pytest_report_header(config: pytest.Config) -> list[str]:
    kubectls = ", ".join(f"{version}={path}" for version, path in discovered_kubectls().items())
    return [
        f"rl_batch_demo: kubectl {kubectls or 'none'}; default {default_kubectl_path() or 'none'}",
        f"rl_batch_demo: control plane {discovered_control_plane() or 'missing'}",
        f"rl_batch_demo: bwrap {discovered_bwrap() or 'missing'}; "
        f"missing prerequisites {'FAIL' if prereqs.e2e_required() else 'skip'}",
    ]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (where rl_batch_demo.py lives)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def kubectls() -> dict[str, str]:
    """{version: path} of the kubectl binaries found (may lack some versions)."""
    return dict(discovered_kubectls())


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    """The default kubectl (1.33 when available); skips or fails when there is none."""
    path = require_prerequisites(kubectl=True, bwrap=False)
    assert path is not None
    return path


@pytest.fixture(scope="session")
def require_e2e() -> Callable[..., Optional[str]]:
    """require_e2e(kubectl_version=None, *, kubectl=True, bwrap=True) -> kubectl path.

    Call it at the top of an end-to-end test (or fixture) to skip or, in CI, fail
    when bwrap or the kubectl it needs is missing.
    """
    return require_prerequisites


@pytest.fixture
def make_cluster(tmp_path, require_e2e):
    """(kubectl path, make(**faults) -> a started emulator); every emulator made is stopped after the test."""
    from e2e_support import emulators

    kubectl = require_e2e()
    with emulators(tmp_path) as make:
        yield kubectl, make


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory):
    """(kubectl 1.35 path, a LocalCluster): one real control plane and node agent per test process."""
    from local_cluster import LocalCluster

    kubectl = require_prerequisites("1.35", control_plane=True)
    cluster = LocalCluster(
        tmp_path_factory.mktemp("real-cluster"), Path(discovered_control_plane())
    )
    cluster.start()
    yield kubectl, cluster
    cluster.stop()


@pytest.fixture(scope="session")
def real_node(tmp_path_factory):
    """(kubectl 1.35 path, a RealNodeCluster): the real control plane and a real kubelet, per test process."""
    from real_node import RealNodeCluster

    kubectl = require_prerequisites("1.35", bwrap=False, control_plane=True, node=True)
    cluster = RealNodeCluster(
        tmp_path_factory.mktemp("real-node"),
        Path(discovered_control_plane()),
        Path(discovered_node_bin()),
    )
    cluster.start()
    yield kubectl, cluster
    cluster.stop()


# --------------------------------------------------------------------------
# A scenario written once and run on several tiers: @on_tiers("emulator", "real_cluster", ...)
# runs the test once per tier, its `tier` fixture that tier's (kubectl, cluster) and `tier_name`
# the tier's name. Each real tier's run carries the marks that tier's own files carry, so the
# passes of run_tests.py select it by marker as they select those, and under pytest-xdist
# (--dist loadgroup) it runs in the worker that holds that tier's one cluster.
TIERS = {
    "emulator": pytest.param("emulator", id="emulator"),
    "real_cluster": pytest.param(
        "real_cluster",
        id="real_cluster",
        marks=[pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")],
    ),
    "real_node": pytest.param(
        "real_node",
        id="real_node",
        marks=[pytest.mark.real_node, pytest.mark.xdist_group("real-node")],
    ),
}
# The fixture that makes each tier's (kubectl, cluster).
TIER_FIXTURES = {
    "emulator": "emulator_tier",
    "real_cluster": "real_cluster",
    "real_node": "real_node",
}


def on_tiers(*names: str) -> pytest.MarkDecorator:
    """Run the test once on each tier named (see TIERS), through the `tier` fixture."""
    return pytest.mark.parametrize("tier_name", [TIERS[name] for name in names])


@pytest.fixture
def emulator_tier(make_cluster):
    """(kubectl, a started emulator): the emulator tier's cluster. A module whose emulator needs
    other faults, timing or kubectl defines its own fixture of this name."""
    kubectl, make = make_cluster
    return kubectl, make()


@pytest.fixture
def tier(tier_name: str, request: pytest.FixtureRequest):
    """(kubectl, cluster) of the tier the test runs on (see on_tiers)."""
    return request.getfixturevalue(TIER_FIXTURES[tier_name])
