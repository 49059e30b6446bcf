#!/usr/bin/env python3
"""A local Kubernetes cluster for trying the tool, and for the real-cluster tests.

    python3 tests/local_cluster.py [--emulator | --kubelet] [--images A,B] [--workdir DIR] [--keep]
                                   [--nodes N]

Starts a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, built once from the Go module proxy by
tests/support/build_control_plane.py) with tests/support/node_agent.py doing the kubelet's part
-- or, with --emulator, the tests' API emulator; with --kubelet, one real node
(kubelet, containerd, runc: tests/support/real_node.py, as root) -- writes a kubeconfig, prints
`READY <kubeconfig path>` on one line once `kubectl get nodes` works, and stops
everything on SIGINT or SIGTERM, removing the temporary directory it made for its
state (its logs, the control plane's data) unless --keep says otherwise. Then, in
another shell:

    KUBECONFIG=<kubeconfig path> python3 rl_batch_demo.py run --count 10 --output rl-parallel-10

Standard library only (Python 3.9+); needs bubblewrap, and Go for the first build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

SUPPORT_DIR = Path(__file__).resolve().parent / "support"
if str(SUPPORT_DIR) not in sys.path:
    sys.path.insert(0, str(SUPPORT_DIR))

from build_control_plane import BuildError, ensure_built  # noqa: E402
from control_plane import ApiError, ControlPlane  # noqa: E402
from kube_emulator import ANY_IMAGE, normalize_image, present_images  # noqa: E402
from node_agent import NodeAgent  # noqa: E402

# The images on the nodes unless --images names others: the guide's image alone, as on a node that
# pulled it once. Any other fails to pull, as on a real node: a typo is an ErrImagePull, not a pass.
DEFAULT_IMAGES = ["python:3.12-alpine"]

# Where each resource lives in the API, for get()/list() like the emulator's.
RESOURCES = {
    "namespaces": ("/api/v1", False),
    "pods": ("/api/v1", True),
    "events": ("/api/v1", True),
    "configmaps": ("/api/v1", True),
    "nodes": ("/api/v1", False),
    "serviceaccounts": ("/api/v1", True),
    "jobs": ("/apis/batch/v1", True),
    "secrets": ("/api/v1", True),
    "runtimeclasses": ("/apis/node.k8s.io/v1", False),
    "networkpolicies": ("/apis/networking.k8s.io/v1", True),
    "leases": ("/apis/coordination.k8s.io/v1", True),
}


def resource_path(plural: str, namespace: Optional[str] = None, name: Optional[str] = None) -> str:
    prefix, namespaced = RESOURCES[plural]
    path = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
    return path + (f"/{name}" if name else "")


class LocalCluster:
    """The real control plane plus the node agent; the same small API as the emulator's."""

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        nodes: int = 3,
        sandbox_seconds: float = 0.4,
        images: Optional[List[str]] = None,
        runtime_overhead: bool = True,
    ):
        self.workdir = Path(workdir)
        self.control_plane = ControlPlane(
            self.workdir / "control-plane", bin_dir, runtime_overhead=runtime_overhead
        )
        self.nodes = nodes
        self.sandbox_seconds = sandbox_seconds
        # The only images on the nodes (None: every image, for the tests that run any)
        self.images = images
        self.agent: Optional[NodeAgent] = None

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def context(self) -> str:
        return self.control_plane.context

    @property
    def api(self) -> Any:
        return self.control_plane.api

    def start(self) -> "LocalCluster":
        try:
            self.control_plane.start()
            self.agent = NodeAgent(
                self.control_plane.api,
                self.workdir / "node-agent",
                self.control_plane.pki,
                nodes=self.nodes,
                sandbox_seconds=self.sandbox_seconds,
            )
            if self.images is not None:
                self.agent.present_images = {normalize_image(image)[1] for image in self.images}
            self.agent.start()
            self.agent.wait_schedulable()
            self.wait_default_service_account()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_default_service_account(self) -> None:
        """Pods are admitted only once the namespace has its service account (ServiceAccount admission)."""

        deadline = time.monotonic() + 60
        while self.get("serviceaccounts", "default", "default") is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no default service account after 60s")
            time.sleep(0.2)

    def stop(self) -> None:
        try:
            if self.agent is not None:
                self.agent.stop()
        finally:
            self.control_plane.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def env(self, kubeconfig: Optional[Path] = None) -> Dict[str, str]:
        return self.control_plane.env(kubeconfig)

    def get(self, plural: str, namespace: Optional[str], name: str) -> Optional[dict]:
        return self.api.get_or_none(resource_path(plural, namespace, name))

    def list(self, plural: str, namespace: Optional[str] = None) -> List[dict]:
        return self.api.get(resource_path(plural, namespace))["items"]

    def create(self, plural: str, namespace: Optional[str], body: dict) -> dict:
        return self.api.create(resource_path(plural, namespace), body)

    def delete(self, plural: str, namespace: Optional[str], name: str) -> None:
        try:
            self.api.delete(resource_path(plural, namespace, name))
        except ApiError as error:
            if error.status != 404:
                raise


def kubectl_works(kubectl: str, env: Dict[str, str]) -> bool:
    try:
        return (
            subprocess.run(
                [kubectl, "get", "nodes"],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def image_list(text: str) -> Optional[List[str]]:
    """--images: the references, or None for '*' (every image present)."""
    if text.strip() == "*":
        return None
    images = [part.strip() for part in text.split(",") if part.strip()]
    if not images:
        raise argparse.ArgumentTypeError("name at least one image, or '*' for any")
    return images


def images_line(images: Optional[List[str]]) -> str:
    """What the local cluster says of its nodes' images."""
    if images is None:
        return "every image is taken as present (--images '*')"
    return (
        f"images on the nodes: {', '.join(images)}; any other fails to pull "
        "(ErrImagePull; --images A,B to choose)"
    )


def start_kueue(workdir: Path, kubectl: str, env: Dict[str, str]) -> Any:
    """The real Kueue manager on the started control plane, and a queue for newcomers to try:
    `run --namespace team-a --queue lq`."""
    import build_kueue
    from kueue_manager import KueueManager

    manager = KueueManager(
        build_kueue.ensure_built(log=lambda *a, **k: print(*a, file=sys.stderr, **k)),
        workdir / "kueue",
        kubectl,
        env,
    )
    manager.install()
    manager.queue("team-a", "lq", "cq", {"cpu": "2", "memory": "2Gi"})
    print(
        f"local_cluster: Kueue v{build_kueue.KUEUE_VERSION} ready: namespace team-a, LocalQueue lq",
        file=sys.stderr,
        flush=True,
    )
    return manager


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--emulator",
        action="store_true",
        help="the tests' API emulator instead of the real control plane",
    )
    mode.add_argument(
        "--kubelet",
        action="store_true",
        help="a real node (kubelet, containerd, runc; needs root) instead of the node agent",
    )
    parser.add_argument(
        "--workdir",
        help="where to keep state, kept after stopping (default: a new temporary "
        "directory, removed after stopping)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary state directory after stopping"
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="also run the real Kueue manager (built once from the Go module proxy; needs root), "
        "with namespace team-a and its LocalQueue lq (ClusterQueue cq: 2 CPUs, 2Gi)",
    )
    parser.add_argument(
        "--no-overhead",
        action="store_true",
        help="RuntimeClass cube without its pod overhead (250m CPU, 768Mi), as a real node's "
        "runc has none: many small pods then fit the node agents (the pool benchmark's 256)",
    )
    parser.add_argument(
        "--images",
        type=image_list,
        default=DEFAULT_IMAGES,
        metavar="A,B",
        help="the only images on the nodes, comma-separated; any other fails to pull "
        "(ErrImagePull, then ImagePullBackOff) as on a real node; '*' takes every image as "
        f"present (default: {','.join(DEFAULT_IMAGES)}; not with --kubelet, whose registry holds "
        "the guide's image alone)",
    )
    parser.add_argument(
        "--kubectl",
        default=os.environ.get("KUBECTL") or shutil.which("kubectl") or "",
        help="kubectl used to check the cluster answers (default: kubectl on PATH)",
    )
    args = parser.parse_args(argv)
    if args.kubelet and args.images != DEFAULT_IMAGES:
        parser.error(
            "--images is for --emulator and the node agent: --kubelet's registry holds "
            "the guide's image alone"
        )
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rldemo-cluster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # Only a directory this script made is removed: a --workdir is the user's.
    remove = args.workdir is None and not args.keep
    # The signals only append to a list the main thread looks at. A handler runs in the main
    # thread between any two of its bytecodes, also inside Event.wait() while that holds the
    # event's lock: an Event.set() from the handler would then wait for that lock for ever.
    stopping: List[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, _frame: stopping.append(signum))

    if args.kueue and (args.emulator or args.kubelet or not args.kubectl):
        parser.error("--kueue runs beside the real control plane and node agent, with --kubectl")
    cluster: Any
    kueue: Any = None
    if args.emulator:
        from kube_emulator import Emulator

        images = ANY_IMAGE if args.images is None else present_images(args.images)
        cluster = Emulator(workdir / "emulator", nodes=args.nodes, images=images)
    else:
        try:
            bin_dir = ensure_built(log=lambda *a, **k: print(*a, file=sys.stderr, **k))
        except BuildError as error:
            print(f"local_cluster: cannot build the control plane: {error}", file=sys.stderr)
            return 1
        if args.kubelet:
            import build_node
            from real_node import RealNodeCluster

            try:
                node_bin = build_node.ensure_built(
                    log=lambda *a, **k: print(*a, file=sys.stderr, **k)
                )
            except BuildError as error:
                print(f"local_cluster: cannot build the real node: {error}", file=sys.stderr)
                return 1
            if os.geteuid() != 0:
                print(
                    "local_cluster: --kubelet runs containerd and the kubelet: run it as root",
                    file=sys.stderr,
                )
                return 1
            cluster = RealNodeCluster(
                workdir, bin_dir, node_bin, log=lambda *a, **k: print(*a, file=sys.stderr, **k)
            )
        else:
            cluster = LocalCluster(
                workdir,
                bin_dir,
                nodes=args.nodes,
                images=args.images,
                runtime_overhead=not args.no_overhead,
            )
    try:
        cluster.start()
        env = cluster.env()
        if args.kubectl and not kubectl_works(args.kubectl, env):
            print(
                "local_cluster: `kubectl get nodes` fails against the new cluster", file=sys.stderr
            )
            return 1
        if args.kueue:
            kueue = start_kueue(workdir, args.kubectl, env)
        print(f"READY {cluster.kubeconfig}", flush=True)
        print(
            f"local_cluster: state in {workdir}{' (removed on stopping; --keep keeps it)' if remove else ''}; "
            f"stop with Ctrl-C",
            file=sys.stderr,
            flush=True,
        )
        if not args.kubelet:
            print(f"local_cluster: {images_line(args.images)}", file=sys.stderr, flush=True)
        while not stopping:
            time.sleep(0.1)
    finally:
        if kueue is not None:
            kueue.stop()
        cluster.stop()
        if remove:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"stopped": str(workdir), "removed": remove}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
