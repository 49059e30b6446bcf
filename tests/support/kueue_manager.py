"""Run the real Kueue manager (built by build_kueue.py) beside the real control plane.

What a cluster install does with Deployments, Services and cert-manager is done here by hand:
- its CRDs applied server-side (the Workload CRD is too big for a client-side apply's annotation);
- its webhooks registered by URL, `https://127.0.0.1:PORT/<path>` (the API server reaches the
  manager on loopback; there is no Service), with a CA of their own whose server certificate
  names IP 127.0.0.1; only the webhooks of what this manager serves are kept (Jobs and Kueue's
  own kinds): a registered webhook nobody serves would refuse every pod or Deployment;
- the manager run as a process with a Configuration of its own: no leader election, Kueue's
  internal certificate management off (it makes certificates for a Service DNS name the API
  server could not resolve here), the `batch/job` integration only, loopback ports picked free.
  With its certificate management off, the manager reads its metrics certificate from the fixed
  path /etc/kueue/metrics/certs: it runs in a mount namespace of its own (`unshare -m`, as root)
  where the test's certificate directory is bound there, so the host's /etc gains only an empty
  mount point.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from control_plane import make_ca, make_cert

METRICS_CERT_PATH = Path("/etc/kueue/metrics/certs")
KUEUE_API = "kueue.x-k8s.io/v1beta2"
# The label of the namespaces whose Jobs the Kueue webhooks see (see loopback_webhooks).
QUEUED_NAMESPACE_LABEL = "rldemo.test/kueue"


class KueueError(Exception):
    """Kueue could not be started here (not root, the manager did not become ready, ...)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def json_documents(text: str) -> list[dict]:
    """The JSON objects kubectl prints one after another for a file of several documents."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return found
        document, at = decoder.raw_decode(text, at)
        found.append(document)


def served_webhook(webhook: dict) -> bool:
    """Whether the manager (the batch/job integration only) serves this webhook: Jobs, and
    Kueue's own kinds."""
    for rule in webhook.get("rules") or []:
        groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
        if "kueue.x-k8s.io" in groups or ("batch" in groups and "jobs" in resources):
            return True
    return False


def loopback_webhooks(configuration: dict, port: int, ca_bundle: str) -> dict:
    """A webhook configuration of the module, its webhooks reached by URL on loopback."""
    configuration = json.loads(json.dumps(configuration))
    kept = []
    for webhook in configuration.get("webhooks") or []:
        if not served_webhook(webhook):
            continue
        path = webhook["clientConfig"]["service"]["path"]
        webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
        if path.endswith("-batch-v1-job"):
            # Only the namespaces of the Kueue tests: the tier's other tests make Jobs that a
            # manager stopped by a test (failurePolicy Fail) would refuse.
            webhook["namespaceSelector"] = {"matchLabels": {QUEUED_NAMESPACE_LABEL: "true"}}
        kept.append(webhook)
    configuration["webhooks"] = kept
    configuration["metadata"] = {"name": "rldemo-" + configuration["metadata"]["name"]}
    return configuration


def manager_configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
    }


def namespace_manifest(name: str, queued: bool = False) -> dict:
    labels = {QUEUED_NAMESPACE_LABEL: "true"} if queued else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


class KueueManager:
    """Kueue's CRDs, webhooks and manager on a running control plane; `stop()` / `start()` kill
    and start the manager alone (its objects stay, as a manager's restart leaves them)."""

    def __init__(self, bin_dir: Path, workdir: Path, kubectl: str, env: dict[str, str]):
        self.bin_dir = Path(bin_dir)
        self.workdir = Path(workdir)
        self.kubectl = kubectl
        self.env = env
        self.process: Optional[subprocess.Popen] = None
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.log_path = self.workdir / "kueue-manager.log"

    def call(self, *args: str, stdin: Optional[str] = None) -> str:
        done = subprocess.run(
            [self.kubectl, *args],
            input=stdin,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if done.returncode != 0:
            raise KueueError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def install(self) -> None:
        """CRDs, the namespace, certificates and the loopback webhooks; the manager started."""
        if os.geteuid() != 0:
            raise KueueError("the Kueue manager runs in a mount namespace of its own: run as root")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.call("apply", "--server-side", "-f", str(self.bin_dir / "crd"))
        self.call("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
        self.call("apply", "-f", "-", stdin=json.dumps(namespace_manifest("kueue-system")))
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        make_ca(pki)
        make_cert(pki, "webhook", "/CN=kueue-webhook", server_ips=("127.0.0.1",))
        self.cert_dir = self.workdir / "certs"
        self.cert_dir.mkdir(exist_ok=True)
        for source, target in (("webhook.crt", "tls.crt"), ("webhook.key", "tls.key")):
            shutil.copyfile(pki / source, self.cert_dir / target)
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        printed = self.call(
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            str(self.bin_dir / "webhook-manifests.yaml"),
        )
        for configuration in json_documents(printed):
            configured = loopback_webhooks(configuration, self.webhook_port, ca_bundle)
            self.call("apply", "-f", "-", stdin=json.dumps(configured))
        config = manager_configuration(self.webhook_port, self.health_port, self.cert_dir)
        (self.workdir / "config.json").write_text(json.dumps(config))
        self.start()

    def start(self) -> None:
        """The manager process, waited for until it is ready and serves its webhooks."""
        METRICS_CERT_PATH.mkdir(parents=True, exist_ok=True)
        script = f'mount --bind "$1" {METRICS_CERT_PATH} && shift && exec "$@"'  # argv, not a command line
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(self.cert_dir),
            str(self.bin_dir / "kueue-manager"),
            f"--config={self.workdir / 'config.json'}",
            # Its on-demand visibility API server wants certificates at /visibility and an
            # APIService; the tool reads the Workloads themselves, not pending positions.
            "--feature-gates=VisibilityOnDemand=false",
        ]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        log.close()
        self.wait_ready()

    def wait_ready(self, seconds: float = 120.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise KueueError(f"the Kueue manager exited: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.health_port), timeout=1) as s:
                    s.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
                    answer = s.recv(64)
                with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1):
                    pass
                if b" 200 " in answer:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise KueueError(f"the Kueue manager was not ready in {seconds:g} s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def queue(self, namespace: str, name: str, cluster_queue: str, quota: dict[str, str]) -> None:
        """A ResourceFlavor `default`, a ClusterQueue with `quota` over it, and a LocalQueue in
        `namespace` pointing at it (each made once)."""
        objects: list[dict[str, Any]] = [
            {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "default"}},
            {
                "apiVersion": KUEUE_API,
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": sorted(quota),
                            "flavors": [
                                {
                                    "name": "default",
                                    "resources": [
                                        {"name": name_, "nominalQuota": amount}
                                        for name_, amount in sorted(quota.items())
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
            {
                "apiVersion": KUEUE_API,
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": cluster_queue},
            },
        ]
        self.call("apply", "-f", "-", stdin=json.dumps(namespace_manifest(namespace, queued=True)))
        for manifest in objects:
            self.call("apply", "-f", "-", stdin=json.dumps(manifest))
