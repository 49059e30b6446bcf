"""The kubelet's part, in Python, for the real control plane of tests/support/control_plane.py.

It registers nodes with capacity, keeps their Leases and Ready condition fresh,
watches the pods bound to them, runs each container as a local process inside
bubblewrap (tests/support/sandbox.py, the same code as the emulator's kubelets), posts
pod status the way a kubelet does, records the kubelet's events, serves
container logs on the kubelet API (HTTPS, /containerLogs/...) so that
`kubectl logs` goes through the API server, and honours graceful deletion.
A pod gets a made-up IP (10.244.N.M) and a network of its own with nothing in it,
unless it declares ports: then it runs in the agent's pod network
(tests/support/pod_network.py, as root) on an address the API server reaches,
so that pods/proxy works as on a real node.

Standard library only.
"""

from __future__ import annotations

import base64
import http.server
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from control_plane import Api, ApiError, free_port
from kube_emulator import (
    declares_ports,
    hex64,
    link_python,
    normalize_image,
    told_of_removal,
    write_config_map_volume,
    write_downward_api_files,
    write_secret_volume,
)
from pod_network import PodNetwork, PodNetworkError
from sandbox import (
    SANDBOX_PATH,
    ContainerLog,
    MountError,
    build_bwrap_argv,
    expand_vars,
    resolve_field_ref,
    signal_container,
    signal_tree,
)

KUBELET_VERSION = "v1.35.4"
LEASE_SECONDS = 40
LEASE_RENEW_SECONDS = 10
NODE_STATUS_SECONDS = 20
# The kubelet's status manager sends again, on this period, a pod status the API server did not
# take (its syncBatch ticker): a status lost to an API server restart still arrives.
STATUS_SYNC_SECONDS = 10
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_micro() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


# How many events the recorder's correlator remembers (client-go's maxLruCacheEntries).
EVENT_CACHE_SIZE = 4096
# The pod conditions a kubelet owns and writes whole (pkg/kubelet/types PodConditionsByKubelet, with
# PodReadyToStartContainers); any other (DisruptionTarget) it keeps as the pod has it.
KUBELET_CONDITIONS = frozenset(
    ("PodScheduled", "Ready", "Initialized", "ContainersReady", "PodReadyToStartContainers")
)


def condition(
    ctype: str, status: str, reason: str | None = None, message: str | None = None
) -> dict:
    # reason and message are always sent, null when absent: a strategic merge patch keeps a
    # field it is not told to delete, and a completed pod's Ready must not keep its old message.
    return {
        "type": ctype,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now_rfc3339(),
        "reason": reason,
        "message": message,
    }


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")


class ContainerRun:
    """One container of a pod: its process, its log runs, its status."""

    def __init__(self, worker: PodWorker, spec: dict):
        self.worker = worker
        self.spec = spec
        self.name = spec["name"]
        repo, self.image = normalize_image(spec.get("image", ""))
        self.image_id = f"{repo}@sha256:{hex64(self.image)}"
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.logs: list[ContainerLog] = []
        self.started_at: str | None = None
        self.ended = threading.Event()  # set once the status says how the process ended
        self.status: dict = {
            "name": self.name,
            "state": {"waiting": {"reason": "ContainerCreating"}},
            "lastState": {},
            "ready": False,
            "restartCount": 0,
            "image": spec.get("image", ""),
            "imageID": "",
            "started": False,
        }

    def alive(self) -> bool:
        with self.lock:
            return self.process is not None and self.process.poll() is None

    def kill(self, sig: int) -> None:
        """SIGKILL ends every process of the container; a stop signal goes to its first process
        alone, and only if that handles it, as to a container's PID 1: the episode, a Python
        program with no handler, then runs to the grace period's end and is killed (exit 137)."""
        with self.lock:
            if self.process is not None and self.process.poll() is None:
                if sig == signal.SIGKILL:
                    signal_tree(self.process, sig)
                else:
                    signal_container(self.process, sig)


class PodWorker(threading.Thread):
    """The kubelet's per-pod worker: sandbox, volumes, containers, status, termination."""

    def __init__(self, agent: NodeAgent, node: str, pod: dict):
        metadata = pod["metadata"]
        super().__init__(name=f"pod-{metadata['name']}", daemon=True)
        self.agent, self.api, self.node = agent, agent.api, node
        self.pod = pod
        self.ns, self.name, self.uid = metadata["namespace"], metadata["name"], metadata["uid"]
        self.hostname = (pod.get("spec") or {}).get("hostname") or self.name
        self.dir = agent.workdir / "pods" / self.uid
        self.containers = [
            ContainerRun(self, c) for c in (pod.get("spec") or {}).get("containers") or []
        ]
        self.deleting = threading.Event()
        self.grace = 30.0
        self.removed = False
        self.evicted: str | None = None
        self.deadline_exceeded = False
        self.conditions: dict[str, dict] = {}
        self.phase = "Pending"
        self.status_lock = threading.Lock()
        self.extra_status: dict = {}
        self.unsent: dict | None = None  # the last status patch the API server did not take
        self.image_checked: set = set()  # containers whose image the worker already found present
        self.serving = declares_ports(pod)  # in the pod network, on an address of its own
        self.pod_ip: str | None = None

    # -- signals -----------------------------------------------------------
    def on_deletion(self, pod: dict) -> None:
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        self.grace = float(grace) if grace is not None else 30.0
        self.deleting.set()

    def on_removed(self) -> None:
        self.removed = True
        self.grace = 0.0
        self.deleting.set()

    def stop_requested(self) -> bool:
        return (
            self.deleting.is_set()
            or self.evicted is not None
            or self.deadline_exceeded
            or self.agent.stopping.is_set()
        )

    def sleep(self, seconds: float) -> bool:
        """Wait; True when the pod is being stopped meanwhile."""
        end = time.monotonic() + seconds
        while not self.stop_requested():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.deleting.wait(min(left, 0.1))
        return True

    # -- status ------------------------------------------------------------
    def set_condition(
        self, ctype: str, status: str, reason: str | None = None, message: str | None = None
    ) -> None:
        old = self.conditions.get(ctype)
        if (
            old
            and old["status"] == status
            and old.get("reason") == reason
            and old.get("message") == message
        ):
            return
        self.conditions[ctype] = condition(ctype, status, reason, message)

    def post_status(self, terminal: bool = True) -> None:
        """The pod's status as a kubelet computes it, sent as a strategic merge patch.

        As kubelet 1.35's generateAPIPodStatus, the conditions follow the phase the containers give
        (Ready False with reason PodCompleted or PodFailed, Initialized with PodCompleted once all
        succeeded), but until the pod worker has stopped the pod (`terminal`) the phase sent stays
        what it was, without the pod's reason: a container that ended first shows up terminated
        in a Running pod whose sandbox is still ready, and the terminal phase follows."""
        with self.status_lock:
            statuses = [dict(c.status) for c in self.containers]
            terminated = [s for s in statuses if "terminated" in s["state"]]
            phase = self.phase
            if self.evicted is not None or self.deadline_exceeded:
                phase = "Failed"
            elif statuses and len(terminated) == len(statuses):
                phase = (
                    "Succeeded"
                    if all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses)
                    else "Failed"
                )
            elif any("running" in s["state"] for s in statuses):
                phase = "Running"
            ended = phase in ("Succeeded", "Failed")
            unready = [s["name"] for s in statuses if not s["ready"]]
            # Ready before ContainersReady, as the kubelet lists them.
            for ctype in ("Ready", "ContainersReady"):
                if ended:
                    self.set_condition(
                        ctype, "False", "PodFailed" if phase == "Failed" else "PodCompleted"
                    )
                elif statuses and not unready:
                    self.set_condition(ctype, "True")
                else:
                    self.set_condition(
                        ctype,
                        "False",
                        "ContainersNotReady",
                        f"containers with unready status: [{' '.join(unready)}]",
                    )
            if "Initialized" in self.conditions:
                self.set_condition(
                    "Initialized", "True", "PodCompleted" if phase == "Succeeded" else None
                )
            extra = dict(self.extra_status)
            if ended and not terminal:
                phase = self.phase
                extra.pop("reason", None)
                extra.pop("message", None)
            elif ended:
                self.set_condition("PodReadyToStartContainers", "False")
            self.phase = phase
            # As the 1.35 kubelet merges its status (mergePodStatus) and patches it: the conditions it
            # does not own (DisruptionTarget from the Eviction API) first, as the pod has them, then
            # its own as it generates them, PodScheduled (the scheduler's, kept) last; the patch's
            # directive sets that order.
            held = [
                c.get("type")
                for c in (self.pod.get("status") or {}).get("conditions") or []
                if c.get("type") not in self.conditions
            ]
            order = (
                [t for t in held if t not in KUBELET_CONDITIONS]
                + list(self.conditions)
                + [t for t in held if t in KUBELET_CONDITIONS]
            )
            status = {
                "phase": phase,
                "conditions": list(self.conditions.values()),
                "$setElementOrder/conditions": [{"type": ctype} for ctype in order],
                "containerStatuses": statuses,
                "observedGeneration": self.pod["metadata"].get("generation", 1),
                **extra,
            }
            self.unsent = {"metadata": {"uid": self.uid}, "status": status}
            self._send_status()

    def resend_status(self) -> None:
        """The status manager's periodic sync: the status the API server did not take, again."""
        with self.status_lock:
            self._send_status()

    def _send_status(self) -> None:
        # Called with status_lock held. Each patch carries the whole status, so the last one unsent
        # is all there is to send again.
        if self.unsent is None:
            return
        try:
            self.api.strategic_patch(pod_path(self.ns, self.name, "status"), self.unsent)
        except ApiError as error:
            if error.status in (404, 409, 422):
                self.unsent = None  # the pod is gone or replaced: nothing to send any more
            elif error.status < 500 and error.status != 429:
                raise
            return  # the API server failed the write; the next sync sends it again
        except OSError:
            return  # the API server is away; the next sync sends it again
        self.unsent = None

    def event(self, etype: str, reason: str, message: str, container: str | None = None) -> None:
        self.agent.record_event(
            self.pod,
            self.node,
            etype,
            reason,
            message,
            f"spec.containers{{{container}}}" if container else None,
        )

    # -- lifecycle -----------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            traceback.print_exc()
        finally:
            if self.serving and self.pod_ip is not None:
                self.agent.pod_network.release(self.pod_ip)
            self._final_delete()

    def _run(self) -> None:
        ip = self.agent.node_ip
        self.extra_status = {"hostIP": ip, "hostIPs": [{"ip": ip}], "startTime": now_rfc3339()}
        self.active_since = time.monotonic()
        self.set_condition("PodReadyToStartContainers", "False")
        self.set_condition("Initialized", "True")
        self.post_status()
        # As a kubelet does, the volumes are mounted before the sandbox is asked for, so that the
        # first container's image check follows the sandbox at once.
        volumes: dict[str, tuple[str, str]] = {}
        while True:
            try:
                volumes = self._prepare_volumes()
                break
            except MountError as error:
                self.event("Warning", "FailedMount", str(error))
                if self.sleep(2.0):
                    self._terminate()
                    return
        if self.sleep(self.agent.sandbox_seconds + random.uniform(0, self.agent.sandbox_jitter)):
            self._terminate()
            return
        self.agent.note(self.ns, self.name, sandbox_ready=time.time())
        # SyncPod goes on from the sandbox to the first container's image in the same step; the
        # status manager posts the sandbox's readiness on its own, after that.
        if self.containers:
            self.image_present(self.containers[0])
        pod_ip = self._sandbox_ip()
        if pod_ip is None:
            self._terminate()
            return
        self.extra_status.update({"podIP": pod_ip, "podIPs": [{"ip": pod_ip}]})
        self.set_condition("PodReadyToStartContainers", "True")
        self.post_status()
        threads = [
            threading.Thread(target=self._run_container, args=(c, volumes), daemon=True)
            for c in self.containers
        ]
        for t in threads:
            t.start()
        stopped = False
        while any(t.is_alive() for t in threads) and not stopped:
            if self.stop_requested():
                self._terminate()
                stopped = True
            elif self.past_active_deadline():
                self.stop_at_deadline()
                stopped = True
            else:
                self.deleting.wait(0.05)
        for t in threads:
            t.join(15)
        if not stopped and self.stop_requested():
            # A container that gave up waiting (an image that never pulled) as the pod was being
            # stopped ended before the loop saw it: the pod is still stopped, and ends Failed.
            self._terminate()
        elif not stopped:
            # The containers ended on their own: the pod worker stops the sandbox, and the status
            # it writes then has the terminal phase.
            if not self.removed:
                self.post_status()
            self.deadline_after_success()

    def _sandbox_ip(self) -> str | None:
        """The pod's IP: from the pod network for a pod that serves (its sandbox fails, and is
        tried again, while the network cannot be made), else a made-up one; None once stopped."""
        if not self.serving:
            return self.agent.pod_ip()
        while True:
            try:
                self.pod_ip = self.agent.pod_network.take()
                return self.pod_ip
            except PodNetworkError as error:
                self.event(
                    "Warning",
                    "FailedCreatePodSandBox",
                    f"Failed to create pod sandbox: failed to set up the pod network: {error}",
                )
            if self.sleep(2.0):
                return None

    def view(self) -> dict:
        """The pod as this kubelet knows it: the status it has set over the one it was given
        (what a downward API field names, status.podIP among them, is read from this)."""
        status = {**(self.pod.get("status") or {}), **self.extra_status}
        return {**self.pod, "status": status}

    def _terminate(self) -> None:
        """Graceful stop: Killing events, SIGTERM, the grace period, SIGKILL; then the final status."""
        alive = [c for c in self.containers if c.alive()]
        if not self.removed:
            for c in alive:
                self.event("Normal", "Killing", f"Stopping container {c.name}", c.name)
        for c in alive:
            c.kill(signal.SIGTERM)
        end = time.monotonic() + (0.0 if self.evicted is not None else self.grace)
        while time.monotonic() < end and any(c.alive() for c in alive):
            time.sleep(0.02)
        for c in alive:
            c.kill(signal.SIGKILL)
        # Each container's own thread writes how its process ended (Error, 137 after SIGKILL);
        # only a container that never ran is reported as one the runtime could not locate.
        deadline = time.monotonic() + 10
        for c in self.containers:
            if c.process is not None:
                c.ended.wait(max(0.0, deadline - time.monotonic()))
        for c in self.containers:
            if "terminated" not in c.status["state"]:
                c.status.update(
                    ready=False,
                    started=False,
                    state={
                        "terminated": {
                            "exitCode": 137,
                            "reason": "ContainerStatusUnknown",
                            "message": "The container could not be located when the pod was terminated",
                            "startedAt": None,
                            "finishedAt": now_rfc3339(),
                        }
                    },
                )
        if not self.removed:
            self.post_status()

    def past_active_deadline(self) -> bool:
        """Active on this node for the pod's activeDeadlineSeconds, counted from its start."""
        limit = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        return limit is not None and time.monotonic() - self.active_since >= limit

    def stop_at_deadline(self) -> None:
        """As a kubelet's active deadline handler: a Normal DeadlineExceeded event; a status whose
        Ready is False (PodFailed) while the phase stays Running, the container still running;
        the containers stopped with the pod's grace period; then Failed with the pod's reason
        DeadlineExceeded and its message."""
        self.event("Normal", "DeadlineExceeded", DEADLINE_MESSAGE)
        self.deadline_exceeded = True
        self.post_status(terminal=False)
        with self.status_lock:
            self.extra_status.update({"reason": "DeadlineExceeded", "message": DEADLINE_MESSAGE})
        self.grace = float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        self._terminate()

    def deadline_after_success(self) -> None:
        """A pod that Succeeded turns Failed, reason DeadlineExceeded, with a Normal DeadlineExceeded
        event and its conditions' reasons PodFailed, once its deadline passes while it is still
        there; its containers' states stay as they ended, and nothing is killed. Kubelet 1.35's
        activeDeadlineHandler.ShouldEvict has no terminal check, but a real node flips the pod
        only when it writes its status again after the deadline (seen once in two runs of
        tests/support/compare_nodes.py: when the deadline passed while the kubelet was still finishing
        the pod); the agent always does, the case a reader of the pod must handle."""
        limit = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        if limit is None or self.phase != "Succeeded":
            return
        if self.sleep(self.active_since + limit - time.monotonic()):
            return
        self.event("Normal", "DeadlineExceeded", DEADLINE_MESSAGE)
        self.deadline_exceeded = True
        with self.status_lock:
            self.extra_status.update({"reason": "DeadlineExceeded", "message": DEADLINE_MESSAGE})
        self.post_status()

    def evict(self, message: str) -> None:
        """Evicted by this node: phase Failed, reason Evicted, a DisruptionTarget condition."""
        with self.status_lock:
            self.extra_status.update({"reason": "Evicted", "message": message})
            self.set_condition("DisruptionTarget", "True", "TerminationByKubelet", message)
            self.evicted = message
        self.event("Warning", "Evicted", message)
        self.deleting.set()

    def _final_delete(self) -> None:
        """Once its containers are gone, a pod being deleted is removed for good (grace 0)."""
        self.agent.forget(self)
        if (
            self.removed
            or not self.deleting.is_set()
            or self.evicted is not None
            or self.agent.stopping.is_set()
        ):
            return
        self.agent.delete_for_good(self.ns, self.name, self.uid)

    # -- volumes -------------------------------------------------------------
    def _prepare_volumes(self) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        for v in (self.pod.get("spec") or {}).get("volumes") or []:
            name = v["name"]
            d = self.dir / "volumes" / name
            d.mkdir(parents=True, exist_ok=True)
            if v.get("configMap") is not None:
                ref = v["configMap"]
                cm = self.api.get_or_none(
                    f"/api/v1/namespaces/{self.ns}/configmaps/{ref.get('name', '')}"
                )
                write_config_map_volume(d, name, ref, cm)
                out[name] = (str(d), "configMap")
            elif v.get("secret") is not None:
                ref = v["secret"]
                secret = self.api.get_or_none(
                    f"/api/v1/namespaces/{self.ns}/secrets/{ref.get('secretName', '')}"
                )
                write_secret_volume(d, name, ref, secret)
                out[name] = (str(d), "secret")
            elif v.get("emptyDir") is not None:
                os.chmod(d, 0o777)
                out[name] = (str(d), "emptyDir")
            elif v.get("projected") is not None or v.get("downwardAPI") is not None:
                sources = (v.get("projected") or {}).get("sources") or [
                    {"downwardAPI": v.get("downwardAPI")}
                ]
                for source in sources:
                    if source.get("serviceAccountToken"):
                        (d / source["serviceAccountToken"].get("path", "token")).write_text(
                            self._token()
                        )
                    if source.get("configMap"):
                        cm = (
                            self.api.get_or_none(
                                f"/api/v1/namespaces/{self.ns}/configmaps/"
                                f"{source['configMap'].get('name', '')}"
                            )
                            or {}
                        )
                        for item in source["configMap"].get("items") or []:
                            (d / item["path"]).write_text(
                                (cm.get("data") or {}).get(item["key"], "")
                            )
                    write_downward_api_files(
                        self.pod, d, (source.get("downwardAPI") or {}).get("items") or []
                    )
                for f in d.iterdir():
                    os.chmod(f, 0o644)
                out[name] = (str(d), "projected")
            elif v.get("hostPath") is not None:
                out[name] = (v["hostPath"].get("path", "/"), "hostPath")
            else:
                raise MountError(
                    f'MountVolume.SetUp failed for volume "{name}" : volume type not supported '
                    f"by the node agent"
                )
        return out

    def _token(self) -> str:
        account = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        try:
            answer = self.api.create(
                f"/api/v1/namespaces/{self.ns}/serviceaccounts/{account}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {
                        "expirationSeconds": 3607,
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": self.name,
                            "uid": self.uid,
                        },
                    },
                },
            )
            return answer["status"]["token"]
        except (ApiError, OSError, KeyError, TypeError):
            return ""

    # -- containers ----------------------------------------------------------
    def image_absent(self, c: ContainerRun) -> bool:
        reference = normalize_image(c.spec.get("image", ""))[1]
        present = self.agent.present_images
        return reference in self.agent.absent_images or (
            present is not None and reference not in present
        )

    def image_present(self, c: ContainerRun) -> None:
        """The kubelet's first step for a container: the image is found on the node (no pulls here)."""
        if c.name not in self.image_checked and not self.image_absent(c):
            self.image_checked.add(c.name)
            # As kubelet v1.35.4 words them (its Created and Started no longer name the container).
            self.event(
                "Normal",
                "Pulled",
                f'Container image "{c.spec.get("image", "")}" already present on '
                f"machine and can be accessed by the pod",
                c.name,
            )

    def pull_until_stopped(self, c: ContainerRun) -> None:
        """An image no registry has, as kubelet v1.35.4 pulls it: Pulling, the pull's error and
        ErrImagePull; then BackOff and ImagePullBackOff until the next try, the back-off doubling
        from 10 s up to 300 s; until the pod is stopped."""
        image = c.spec.get("image", "")
        reference = normalize_image(image)[1]
        error = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{reference}": '
            f"failed to resolve image: {reference}: not found"
        )
        backoff = 10.0
        while True:
            self.event("Normal", "Pulling", f'Pulling image "{image}"', c.name)
            self.event("Warning", "Failed", f'Failed to pull image "{image}": {error}', c.name)
            self.event("Warning", "Failed", "Error: ErrImagePull", c.name)
            c.status["state"] = {"waiting": {"reason": "ErrImagePull", "message": error}}
            self.post_status(terminal=False)
            if self.sleep(1.0):
                return
            self.event("Normal", "BackOff", f'Back-off pulling image "{image}"', c.name)
            self.event("Warning", "Failed", "Error: ImagePullBackOff", c.name)
            message = f'Back-off pulling image "{image}": ErrImagePull: {error}'
            c.status["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": message}}
            self.post_status(terminal=False)
            if self.sleep(backoff):
                return
            backoff = min(backoff * 2, 300.0)

    def _run_container(self, c: ContainerRun, volumes: dict[str, tuple[str, str]]) -> None:
        spec = c.spec
        if self.image_absent(c):
            self.pull_until_stopped(c)
            return
        self.image_present(c)
        env, uid, gid, error = self._environment(spec)
        while error:
            c.status["state"] = {
                "waiting": {"reason": "CreateContainerConfigError", "message": error}
            }
            self.post_status()
            self.event("Warning", "Failed", f"Error: {error}", c.name)
            if self.sleep(2.0):
                return
            env, uid, gid, error = self._environment(spec)
        if self.stop_requested():
            return
        mounts = []
        for mount in spec.get("volumeMounts") or []:
            src, kind = volumes.get(mount["name"], ("", ""))
            if src:
                if mount.get("subPath"):
                    src = os.path.join(src, mount["subPath"])
                    os.makedirs(src, exist_ok=True)
                mounts.append(
                    (
                        src,
                        mount["mountPath"],
                        bool(mount.get("readOnly")) or kind in ("configMap", "secret", "projected"),
                    )
                )
        read_only_root = bool((spec.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        command = spec.get("command") or []
        args = spec.get("args") or []
        argv = [
            expand_vars(a, env)
            for a in (list(command) + list(args) if command else list(args) or ["python3"])
        ]
        cid = hex64(f"{self.uid}/{c.name}/0")
        self.event("Normal", "Created", "Container created", c.name)
        cmd = build_bwrap_argv(
            uid,
            gid,
            self.hostname,
            mounts,
            read_only_root,
            spec.get("workingDir") or "/",
            argv,
            str(self.agent.bindir),
            share_net=self.serving,
        )
        if self.serving:
            cmd = self.agent.pod_network.enter(cmd)
        log = ContainerLog(self.agent.workdir / "logs" / f"{self.ns}_{self.name}_{c.name}-0.log")
        c.logs.append(log)
        started = now_rfc3339()
        true_start = time.time()
        try:
            with c.lock:
                if self.stop_requested():
                    log.close()
                    return
                c.process = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    close_fds=True,
                )
        except OSError as error:
            log.close()
            message = f"failed to start container process: {error}"
            c.status.update(
                ready=False,
                started=False,
                state={
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": message,
                        "startedAt": "1970-01-01T00:00:00Z",
                        "finishedAt": now_rfc3339(),
                        "containerID": f"containerd://{cid}",
                    }
                },
            )
            c.ended.set()
            self.event("Warning", "Failed", f"Error: {message}", c.name)
            self.post_status(terminal=False)
            return
        self.agent.note(self.ns, self.name, node=self.node, container_started=true_start)
        self.event("Normal", "Started", "Container started", c.name)
        c.status.update(
            state={"running": {"startedAt": started}},
            ready=True,
            started=True,
            image=c.image,
            imageID=c.image_id,
            containerID=f"containerd://{cid}",
        )
        self.post_status()
        assert c.process.stdout is not None
        for line in iter(c.process.stdout.readline, b""):
            log.append(line)
        rc = c.process.wait()
        log.close()
        code = rc if rc >= 0 else 128 - rc
        self.agent.note(self.ns, self.name, container_finished=time.time(), exit_code=code)
        c.status.update(
            ready=False,
            started=False,
            state={
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started,
                    "finishedAt": now_rfc3339(),
                    "containerID": f"containerd://{cid}",
                }
            },
        )
        c.ended.set()
        # A pod being stopped gets its status from the stop; one whose containers end on their
        # own shows each ended container before the pod worker gives the pod its terminal phase.
        if not self.stop_requested():
            self.post_status(terminal=False)

    def _environment(self, spec: dict) -> tuple[dict[str, str], int, int, str | None]:
        pod_spec = self.pod.get("spec") or {}
        pod_security = pod_spec.get("securityContext") or {}
        container_security = spec.get("securityContext") or {}
        uid = container_security.get("runAsUser", pod_security.get("runAsUser"))
        gid = container_security.get("runAsGroup", pod_security.get("runAsGroup"))
        pod_ref = f'"{self.name}_{self.ns}({self.uid})"'
        if container_security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            if uid is None:
                return (
                    {},
                    0,
                    0,
                    (
                        f"container has runAsNonRoot and image will run as root "
                        f"(pod: {pod_ref}, container: {spec['name']})"
                    ),
                )
            if uid == 0:
                return (
                    {},
                    0,
                    0,
                    (
                        f"container's runAsUser breaks non-root policy "
                        f"(pod: {pod_ref}, container: {spec['name']})"
                    ),
                )
        env = {"PATH": SANDBOX_PATH, "HOSTNAME": self.hostname, "HOME": "/", "LANG": "C.UTF-8"}
        if pod_spec.get("enableServiceLinks", True):
            env.update(
                {
                    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                    "KUBERNETES_SERVICE_PORT": "443",
                    "KUBERNETES_SERVICE_PORT_HTTPS": "443",
                    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
                    "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
                    "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                    "KUBERNETES_PORT_443_TCP_PORT": "443",
                    "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
                }
            )
        missing = self._env_from(spec, env)
        if missing:
            return env, 0, 0, missing
        for e in spec.get("env") or []:
            source = e.get("valueFrom")
            if not source:
                env[e["name"]] = expand_vars(str(e.get("value", "")), env)
            elif source.get("fieldRef"):
                value = resolve_field_ref(self.view(), source["fieldRef"].get("fieldPath", ""))
                if value is None:
                    return (
                        env,
                        0,
                        0,
                        f"unsupported fieldPath: {source['fieldRef'].get('fieldPath')}",
                    )
                env[e["name"]] = value
            elif source.get("configMapKeyRef"):
                ref = source["configMapKeyRef"]
                cm = self.api.get_or_none(
                    f"/api/v1/namespaces/{self.ns}/configmaps/{ref.get('name', '')}"
                )
                data = (cm or {}).get("data") or {}
                if ref.get("key") in data:
                    env[e["name"]] = data[ref["key"]]
                elif not ref.get("optional"):
                    return (
                        env,
                        0,
                        0,
                        (
                            f'configmap "{ref.get("name")}" not found'
                            if cm is None
                            else f"couldn't find key {ref.get('key')} in ConfigMap {self.ns}/{ref.get('name')}"
                        ),
                    )
            elif source.get("secretKeyRef"):
                ref = source["secretKeyRef"]
                secret = self.api.get_or_none(
                    f"/api/v1/namespaces/{self.ns}/secrets/{ref.get('name', '')}"
                )
                data = (secret or {}).get("data") or {}
                if ref.get("key") in data:
                    env[e["name"]] = base64.b64decode(data[ref["key"]]).decode("utf-8", "replace")
                elif not ref.get("optional"):
                    return (
                        env,
                        0,
                        0,
                        (
                            f'secret "{ref.get("name")}" not found'
                            if secret is None
                            else f"couldn't find key {ref.get('key')} in Secret {self.ns}/{ref.get('name')}"
                        ),
                    )
        return env, int(uid or 0), int(gid if gid is not None else 0), None

    def _env_from(self, spec: dict, env: dict[str, str]) -> str | None:
        """envFrom, as kubelet 1.35 reads it: each Secret's or ConfigMap's keys (behind the prefix)
        before `env`, which wins; a key that is not a variable name skipped with an
        InvalidEnvironmentVariableNames event; a missing source a config error unless optional."""
        for source in spec.get("envFrom") or []:
            kind = "Secret" if source.get("secretRef") else "ConfigMap"
            ref = source.get("secretRef") or source.get("configMapRef") or {}
            plural = "secrets" if kind == "Secret" else "configmaps"
            found = self.api.get_or_none(
                f"/api/v1/namespaces/{self.ns}/{plural}/{ref.get('name', '')}"
            )
            if found is None:
                if ref.get("optional"):
                    continue
                return f'{kind.lower()} "{ref.get("name")}" not found'
            data = dict(found.get("data") or {})
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}
            invalid = []
            for key, value in data.items():
                key = (source.get("prefix") or "") + key
                if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", key):
                    invalid.append(key)
                    continue
                env[key] = value
            if invalid:
                self.event(
                    "Warning",
                    "InvalidEnvironmentVariableNames",
                    f"Keys [{', '.join(sorted(invalid))}] from the EnvFrom {kind.lower()} "
                    f"{self.ns}/{ref.get('name')} were skipped since they are considered invalid "
                    f"environment variable names.",
                )
        return None


class _KubeletHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: _KubeletServer

    def log_message(self, *args: Any) -> None:
        pass

    def _plain(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        if url.path == "/healthz":
            self._plain(200, "ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._plain(404, "404 page not found")
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.server.agent.serve_logs(self, parts[1], parts[2], parts[3], query)


class _KubeletServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    agent: NodeAgent


class NodeAgent:
    """Nodes rldemo-node-1..N on 127.0.0.1, against a real API server."""

    def __init__(
        self,
        api: Api,
        workdir: Path,
        pki: Path,
        nodes: int = 3,
        sandbox_seconds: float = 0.4,
        python: str = sys.executable,
        sandbox_jitter: float = 0.0,
    ):
        self.api = api
        self.workdir = Path(workdir)
        self.pki = Path(pki)
        self.node_names = [f"rldemo-node-{i + 1}" for i in range(nodes)]
        self.sandbox_seconds = sandbox_seconds
        self.sandbox_jitter = sandbox_jitter  # each sandbox takes up to this much longer, at random
        self.python = python
        # Image references no registry has (as containerd names them, e.g.
        # docker.io/library/python:0.0-absent): their pulls fail as kubelet v1.35.4 with containerd
        # v2.4.2 report it. Every other image is present on every node, unless `present_images`
        # names the only ones there (`local_cluster.py --images`).
        self.absent_images: set[str] = set()
        self.present_images: set[str] | None = None
        self.node_ip = "127.0.0.1"
        self.bindir = self.workdir / "bin"
        self.stopping = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.finished: dict[tuple[str, str], PodWorker] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self._ip_counter = 0
        # What really happened to each pod (wall-clock times, first occurrence), for the tests to hold
        # figures against: seen (the agent took up the bound pod), sandbox_ready, container_started,
        # container_finished; and its node and exit code.
        self.truth: dict[tuple[str, str], dict] = {}
        # The recorder's correlator: an event the same as one it sent (same object, reason, message,
        # type, source) is that event again, its count raised, not a new one.
        self.sent_events: dict[tuple[str, ...], tuple[str, int]] = {}
        self.events_lock = threading.Lock()
        self.truth_lock = threading.Lock()
        self.port = free_port()
        self.server: _KubeletServer | None = None
        self.pod_network = PodNetwork()  # made when the first pod that serves needs it

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> NodeAgent:
        for d in ("logs", "pods"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        self.bindir.mkdir(parents=True, exist_ok=True)
        link_python(self.bindir, self.python)
        self._serve()
        for node in self.node_names:
            self._register(node)
        self._spawn(self._heartbeat, "heartbeat")
        self._spawn(self._status_sync, "status-sync")
        for node in self.node_names:
            self._spawn(self._watch_pods, f"watch-{node}", node)
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            for c in w.containers:
                c.kill(signal.SIGKILL)
        for w in workers:
            w.join(5)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.pod_network.stop()

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def wait_schedulable(self, timeout: float = 120) -> None:
        """Until every node is Ready and untainted (the node lifecycle controller lifts not-ready)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                nodes = self.api.get("/api/v1/nodes")["items"]
            except (ApiError, OSError):
                nodes = []
            ours = [n for n in nodes if n["metadata"]["name"] in self.node_names]
            if len(ours) == len(self.node_names) and not any(
                (n.get("spec") or {}).get("taints") for n in ours
            ):
                return
            time.sleep(0.2)
        raise TimeoutError(f"nodes not schedulable after {timeout:.0f}s")

    # -- nodes -------------------------------------------------------------
    def _register(self, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "labels": {
                    "kubernetes.io/hostname": node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux",
                    "beta.kubernetes.io/arch": "amd64",
                },
            },
            "spec": {},
        }
        try:
            self.api.create("/api/v1/nodes", body)
        except ApiError as error:
            if error.status != 409:
                raise
        self._node_status(node)
        self._renew_lease(node)

    def _node_status(self, node: str) -> None:
        conditions = [
            {
                "type": t,
                "status": "False",
                "reason": r,
                "message": m,
                "lastHeartbeatTime": now_rfc3339(),
                "lastTransitionTime": now_rfc3339(),
            }
            for t, r, m in (
                (
                    "MemoryPressure",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            )
        ]
        conditions.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now_rfc3339(),
                "lastTransitionTime": now_rfc3339(),
            }
        )
        status = {
            "capacity": CAPACITY,
            "allocatable": CAPACITY,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.node_ip},
                {"type": "Hostname", "address": node},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {
                "machineID": hex64(node)[:32],
                "systemUUID": hex64(node)[:32],
                "bootID": hex64(node)[32:],
                "kernelVersion": os.uname().release,
                "osImage": "rl_batch_demo node agent (bubblewrap)",
                "containerRuntimeVersion": "bubblewrap://0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        self.api.strategic_patch(f"/api/v1/nodes/{node}/status", {"status": status})

    def _renew_lease(self, node: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}"
        spec = {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": now_micro(),
        }
        try:
            self.api.merge_patch(path, {"spec": spec})
        except ApiError as error:
            if error.status != 404:
                raise
            self.api.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": node, "namespace": "kube-node-lease"},
                    "spec": spec,
                },
            )

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW_SECONDS):
            for node in self.node_names:
                try:
                    self._renew_lease(node)
                    if time.monotonic() - last_status >= NODE_STATUS_SECONDS:
                        beat = now_rfc3339()
                        self.api.strategic_patch(
                            f"/api/v1/nodes/{node}/status",
                            {
                                "status": {
                                    "conditions": [
                                        {"type": t, "lastHeartbeatTime": beat}
                                        for t in (
                                            "MemoryPressure",
                                            "DiskPressure",
                                            "PIDPressure",
                                            "Ready",
                                        )
                                    ]
                                }
                            },
                        )
                except (ApiError, OSError):
                    pass
            if time.monotonic() - last_status >= NODE_STATUS_SECONDS:
                last_status = time.monotonic()

    def _status_sync(self) -> None:
        while not self.stopping.wait(STATUS_SYNC_SECONDS):
            with self.lock:
                workers = [*self.workers.values(), *self.finished.values()]
            for worker in workers:
                if worker.unsent is not None:
                    worker.resend_status()

    # -- pods ----------------------------------------------------------------
    def _watch_pods(self, node: str) -> None:
        path = f"/api/v1/pods?fieldSelector={quote('spec.nodeName=' + node)}"
        version = ""
        while not self.stopping.is_set():
            try:
                if not version:
                    listing = self.api.get(path)
                    for pod in listing["items"]:
                        self._on_pod(node, "ADDED", pod)
                    self._forget_missing(node, {p["metadata"]["uid"] for p in listing["items"]})
                    version = listing["metadata"]["resourceVersion"]
                for event in self.api.watch(path, version, self.stopping):
                    if event["type"] == "ERROR":
                        version = ""
                        break
                    version = event["object"]["metadata"].get("resourceVersion") or version
                    if event["type"] != "BOOKMARK":
                        self._on_pod(node, event["type"], event["object"])
            except ApiError as error:
                if error.status == 410:
                    version = ""
                self.stopping.wait(0.5)
            except (OSError, ValueError, ssl.SSLError):
                self.stopping.wait(0.5)
            except Exception:
                traceback.print_exc()
                self.stopping.wait(0.5)

    def _forget_missing(self, node: str, uids: set) -> None:
        with self.lock:
            gone = [w for uid, w in self.workers.items() if w.node == node and uid not in uids]
        for w in gone:
            w.on_removed()

    def _on_pod(self, node: str, kind: str, pod: dict) -> None:
        metadata = pod["metadata"]
        uid = metadata["uid"]
        with self.lock:
            worker = self.workers.get(uid)
        if told_of_removal(kind, worker):
            return
        terminal = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        if worker is None:
            if metadata.get("deletionTimestamp"):
                if terminal or not (pod.get("status") or {}).get("containerStatuses"):
                    self.delete_for_good(metadata["namespace"], metadata["name"], uid)
                return
            if terminal or (pod.get("status") or {}).get("startTime"):
                return  # already run by this node (the agent keeps no state across restarts)
            self.note(metadata["namespace"], metadata["name"], seen=time.time())
            worker = PodWorker(self, node, pod)
            with self.lock:
                self.workers[uid] = worker
            worker.start()
            return
        worker.pod = pod
        if metadata.get("deletionTimestamp") and not worker.deleting.is_set():
            worker.on_deletion(pod)

    def note(self, namespace: str, name: str, **fields: Any) -> None:
        """Record what happened to a pod; a moment keeps its first value, the last run's end its last."""
        with self.truth_lock:
            record = self.truth.setdefault((namespace, name), {})
            for field, value in fields.items():
                if field in ("container_finished", "exit_code") or field not in record:
                    record[field] = value

    def forget(self, worker: PodWorker) -> None:
        with self.lock:
            self.workers.pop(worker.uid, None)
            self.finished[(worker.ns, worker.name)] = worker

    def delete_for_good(self, namespace: str, name: str, uid: str) -> None:
        try:
            self.api.delete(
                pod_path(namespace, name),
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": uid},
                },
            )
        except (ApiError, OSError):
            pass

    def pod_ip(self) -> str:
        with self.lock:
            self._ip_counter += 1
            n = self._ip_counter
        return f"10.244.{n // 250}.{n % 250 + 2}"

    def worker_for(self, namespace: str, name: str) -> PodWorker | None:
        with self.lock:
            for w in self.workers.values():
                if w.ns == namespace and w.name == name:
                    return w
            return self.finished.get((namespace, name))

    def evict(
        self,
        namespace: str,
        name: str,
        message: str = "The node was low on resource: memory. "
        "Threshold quantity: 100Mi, available: 50Mi. ",
    ) -> None:
        worker = self.worker_for(namespace, name)
        if worker is None:
            raise KeyError(f"no pod {namespace}/{name} runs on this agent")
        worker.evict(message)

    def record_event(
        self, pod: dict, node: str, etype: str, reason: str, message: str, field_path: str | None
    ) -> None:
        """A core/v1 Event as the kubelet's recorder makes it: named <pod>.<hex UnixNano>."""
        metadata = pod["metadata"]
        involved = {
            "kind": "Pod",
            "namespace": metadata["namespace"],
            "name": metadata["name"],
            "uid": metadata["uid"],
            "apiVersion": "v1",
            "resourceVersion": metadata.get("resourceVersion", ""),
        }
        if field_path:
            involved["fieldPath"] = field_path
        stamp = now_rfc3339()
        key = (metadata["uid"], field_path or "", etype, reason, message, node)
        with self.events_lock:
            sent = self.sent_events.get(key)
            if sent is not None:
                self.sent_events[key] = (sent[0], sent[1] + 1)
        if sent is not None:
            name, count = sent[0], sent[1] + 1
            try:
                self.api.strategic_patch(
                    f"/api/v1/namespaces/{metadata['namespace']}/events/{name}",
                    {"count": count, "lastTimestamp": stamp, "message": message},
                )
                return
            except (ApiError, OSError):
                pass  # gone (expired, or never written): the recorder makes it anew
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{metadata['name']}.{time.time_ns():x}",
                "namespace": metadata["namespace"],
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "type": etype,
            "eventTime": None,
            "reportingComponent": "kubelet",
            "reportingInstance": node,
        }
        with self.events_lock:
            self.sent_events[key] = (event["metadata"]["name"], 1)
            while len(self.sent_events) > EVENT_CACHE_SIZE:  # least recently made first
                del self.sent_events[next(iter(self.sent_events))]
        try:
            self.api.create(f"/api/v1/namespaces/{metadata['namespace']}/events", event)
        except (ApiError, OSError):
            pass  # the recorder drops what it cannot write, e.g. into a terminating namespace

    # -- the kubelet API ----------------------------------------------------
    def _serve(self) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.pki / "kubelet.crt"), str(self.pki / "kubelet.key"))
        context.load_verify_locations(str(self.pki / "ca.crt"))
        context.verify_mode = ssl.CERT_REQUIRED
        server = _KubeletServer(("127.0.0.1", self.port), _KubeletHandler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.agent = self
        self.server = server
        self._spawn(server.serve_forever, "kubelet-api")

    def serve_logs(
        self,
        handler: _KubeletHandler,
        namespace: str,
        name: str,
        container: str,
        query: dict[str, str],
    ) -> None:
        worker = self.worker_for(namespace, name)
        run = next((c for c in worker.containers if c.name == container), None) if worker else None
        if worker is None or run is None:
            handler._plain(404, f'container "{container}" in pod "{name}" not found')
            return
        previous = query.get("previous") == "true"
        if previous:
            if len(run.logs) < 2:
                handler._plain(
                    400, f'previous terminated container "{container}" in pod "{name}" not found'
                )
                return
            log = run.logs[-2]
        elif not run.logs:
            reason = (run.status["state"].get("waiting") or {}).get("reason", "ContainerCreating")
            handler._plain(
                400, f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
            return
        else:
            log = run.logs[-1]
        follow = query.get("follow") == "true" and not previous
        timestamps = query.get("timestamps") == "true"
        tail = int(query["tailLines"]) if query.get("tailLines", "").lstrip("-").isdigit() else None
        limit = int(query["limitBytes"]) if query.get("limitBytes", "").isdigit() else None
        since = (
            time.time() - int(query["sinceSeconds"])
            if query.get("sinceSeconds", "").isdigit()
            else None
        )
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.end_headers()
        sent = 0
        index = 0
        with log.cond:
            lines = list(log.lines)
        if tail is not None and tail >= 0:
            index = max(0, len(lines) - tail)
        try:
            while True:
                with log.cond:
                    while (
                        index >= len(log.lines)
                        and not log.closed
                        and follow
                        and not self.stopping.is_set()
                    ):
                        log.cond.wait(0.5)
                    batch = log.lines[index:]
                    closed = log.closed
                index += len(batch)
                for t, line in batch:
                    if since is not None and t < since:
                        continue
                    if timestamps:
                        line = (
                            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
                            + f".{int((t % 1) * 1e9):09d}Z "
                        ).encode() + line
                    if limit is not None and sent + len(line) > limit:
                        handler.wfile.write(line[: limit - sent])
                        return
                    handler.wfile.write(line)
                    sent += len(line)
                handler.wfile.flush()
                if not follow or closed or self.stopping.is_set():
                    return
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return
