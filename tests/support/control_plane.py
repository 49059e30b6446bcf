"""A real Kubernetes control plane on localhost, for the tests and for newcomers.

etcd, kube-apiserver (TLS, client-certificate authentication, RBAC, the default
admission plugins), kube-controller-manager (job, namespace, garbage-collector,
service-account and a few other controllers) and kube-scheduler, built by
tests/support/build_control_plane.py. There is no kubelet: tests/support/node_agent.py does the
kubelet's part. Certificates come from the `openssl` command.

    cp = ControlPlane(workdir, bin_dir).start()
    cp.env()            # KUBECONFIG for kubectl and the tool (admin)
    cp.api.get("/api/v1/namespaces")
    cp.stop()

Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

CONTEXT = "rldemo-real"
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_IP = "10.96.0.1"
CONTROLLERS = (
    "job",
    "namespace",
    "garbagecollector",
    "serviceaccount",
    "serviceaccount-token",
    "root-ca-cert-publisher",
    "ttl-after-finished",
    "podgc",
    "nodelifecycle",
)
START_TIMEOUT_SECONDS = 120


class ControlPlaneError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- certificates ------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    completed = subprocess.run(
        ["openssl", *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if completed.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {completed.stderr.strip()}")


def make_ca(pki: Path) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=rldemo-test-ca",
        "-days",
        "3650",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-addext",
        "subjectKeyIdentifier=hash",
        cwd=pki,
    )


def make_cert(
    pki: Path,
    name: str,
    subject: str,
    *,
    server_names: Tuple[str, ...] = (),
    server_ips: Tuple[str, ...] = (),
) -> Tuple[Path, Path]:
    """A key and a certificate signed by the CA in `pki`: (name.crt, name.key)."""
    # Python 3.13 verifies strictly (VERIFY_X509_STRICT): key usages and key identifiers must be there.
    extensions = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid",
    ]
    if server_names or server_ips:
        alt = [f"DNS:{n}" for n in server_names] + [f"IP:{ip}" for ip in server_ips]
        extensions += ["extendedKeyUsage=serverAuth,clientAuth", "subjectAltName=" + ",".join(alt)]
    else:
        extensions.append("extendedKeyUsage=clientAuth")
    (pki / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "3650",
        "-extfile",
        f"{name}.ext",
        cwd=pki,
    )
    return pki / f"{name}.crt", pki / f"{name}.key"


def write_kubeconfig(
    path: Path, server: str, ca: Path, cert: Path, key: Path, user: str, context: str = CONTEXT
) -> Path:
    """A kubeconfig (JSON is YAML) whose one context is `context`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {"name": "rldemo-real", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": context, "context": {"cluster": "rldemo-real", "user": user}}],
        "current-context": context,
    }
    path.write_text(json.dumps(config, indent=2))
    return path


# --- a small API client --------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, body: Any):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


class Api:
    """JSON requests to the API server with a client certificate (stdlib only)."""

    def __init__(self, host: str, port: int, ca: Path, cert: Path, key: Path):
        self.host, self.port = host, port
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.load_cert_chain(str(cert), str(key))

    def _connection(self, timeout: Optional[float]) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Any:
        connection = self._connection(timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except http.client.HTTPException as error:
            # A response cut short (the API server restarting mid-answer) is a lost connection to
            # the callers, which already wait and retry on OSError.
            raise ConnectionError(f"{method} {path}: {error!r}") from error
        finally:
            connection.close()
        try:
            decoded = json.loads(data) if data else None
        except ValueError:
            decoded = data.decode("utf-8", "replace")
        if response.status >= 400:
            raise ApiError(response.status, decoded)
        return decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def create(self, path: str, body: dict) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, body: Optional[dict] = None) -> Any:
        return self.request("DELETE", path, body)

    def merge_patch(self, path: str, patch: dict) -> Any:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, patch: dict) -> Any:
        return self.request(
            "PATCH", path, patch, content_type="application/strategic-merge-patch+json"
        )

    def watch(
        self, path: str, resource_version: str, stop: threading.Event, timeout_seconds: int = 60
    ) -> Iterator[dict]:
        """Watch events (dicts with type/object) until the server closes the stream or `stop` is set."""
        sep = "&" if "?" in path else "?"
        url = (
            f"{path}{sep}watch=1&allowWatchBookmarks=true&resourceVersion={quote(resource_version)}"
            f"&timeoutSeconds={timeout_seconds}"
        )
        connection = self._connection(timeout_seconds + 30)
        try:
            connection.request("GET", url, headers={"Accept": "application/json"})
            response = connection.getresponse()
            if response.status >= 400:
                data = response.read()
                try:
                    raise ApiError(response.status, json.loads(data))
                except ValueError:
                    raise ApiError(response.status, data.decode("utf-8", "replace")) from None
            while not stop.is_set():
                line = response.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            connection.close()


# --- the control plane -----------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler, as local processes."""

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        netns: Optional[str] = None,
        client_port: Optional[int] = None,
        runtime_overhead: bool = True,
    ):
        """`netns`: run every component inside that network namespace (made by the caller), with
        the API server reached from here through `client_port` (a relay the caller runs);
        `runtime_overhead`: whether RuntimeClass cube reserves a VM sandbox's overhead."""
        self.workdir = Path(workdir)
        self.netns = netns
        self.runtime_overhead = runtime_overhead
        self.bin_dir = Path(bin_dir)
        self.pki = self.workdir / "pki"
        self.logs = self.workdir / "logs"
        self.processes: Dict[str, subprocess.Popen] = {}
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.api_port = free_port()
        self.client_port = client_port or self.api_port
        self.kubeconfig = self.workdir / "kubeconfig"
        self.context = CONTEXT
        self.api: Optional[Api] = None
        self._lock = threading.Lock()

    @property
    def server(self) -> str:
        """The API server as clients here (kubectl, the tool) reach it."""
        return f"https://127.0.0.1:{self.client_port}"

    @property
    def internal_server(self) -> str:
        """The API server as the components beside it (in its network namespace) reach it."""
        return f"https://127.0.0.1:{self.api_port}"

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "ControlPlane":
        for d in (self.pki, self.logs, self.workdir / "etcd"):
            d.mkdir(parents=True, exist_ok=True)
        self._make_certificates()
        self._start_etcd()
        self.start_apiserver()
        self._bootstrap()
        self._start(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
                f"--authentication-kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
                f"--authorization-kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--use-service-account-credentials=true",
                "--concurrent-job-syncs=10",
                "--concurrent-gc-syncs=10",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        self._start(
            "kube-scheduler",
            [
                f"--kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                f"--authentication-kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                f"--authorization-kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        return self

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            process = self.processes.pop(name, None)
            if process is not None:
                _terminate(process)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def env(self, kubeconfig: Optional[Path] = None) -> Dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        env["HOME"] = str(home)
        return env

    # -- certificates and kubeconfigs -------------------------------------
    def _make_certificates(self) -> None:
        pki = self.pki
        if (pki / "admin.crt").exists():
            return
        make_ca(pki)
        make_cert(
            pki,
            "apiserver",
            "/CN=kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", SERVICE_IP),
        )
        make_cert(
            pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"
        )
        make_cert(pki, "admin", "/O=system:masters/CN=rldemo-admin")
        make_cert(pki, "kube-controller-manager", "/CN=system:kube-controller-manager")
        make_cert(pki, "kube-scheduler", "/CN=system:kube-scheduler")
        make_cert(
            pki,
            "kubelet",
            "/O=system:nodes/CN=system:node:rldemo-node",
            server_names=("localhost",),
            server_ips=("127.0.0.1",),
        )
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
        write_kubeconfig(
            self.kubeconfig,
            self.server,
            pki / "ca.crt",
            pki / "admin.crt",
            pki / "admin.key",
            "rldemo-admin",
        )

    def component_kubeconfig(self, name: str) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        if not path.exists():
            write_kubeconfig(
                path,
                self.internal_server,
                self.pki / "ca.crt",
                self.pki / f"{name}.crt",
                self.pki / f"{name}.key",
                name,
                context=name,
            )
        return path

    def user_kubeconfig(self, user: str, groups: Tuple[str, ...] = ()) -> Path:
        """A kubeconfig for `user` (a client certificate, in `groups`), context CONTEXT."""
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        cert, key = make_cert(self.pki, f"user-{user}", subject)
        return write_kubeconfig(
            self.workdir / f"user-{user}.kubeconfig",
            self.server,
            self.pki / "ca.crt",
            cert,
            key,
            user,
        )

    # -- processes ---------------------------------------------------------
    def _start(self, name: str, args: List[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        try:
            prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
            process = subprocess.Popen(
                [*prefix, str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        url = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._start(
            "etcd",
            [
                "--name=rldemo",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=rldemo={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=2147483648",
            ],
        )

    def start_apiserver(self) -> None:
        pki = self.pki
        self._start(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                "--anonymous-auth=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                "--profiling=false",
                "--endpoint-reconciler-type=none",
                "--max-requests-inflight=800",
                "--max-mutating-requests-inflight=400",
            ],
        )
        self.api = Api(
            "127.0.0.1", self.client_port, pki / "ca.crt", pki / "admin.crt", pki / "admin.key"
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        last = "not started"
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {process.returncode}; see {self.logs / name}.log:\n"
                        + _tail(self.logs / f"{name}.log")
                    )
            try:
                assert self.api is not None
                if self.api.request("GET", "/readyz", timeout=5) is not None:
                    return
            except (OSError, ApiError, ssl.SSLError) as error:
                last = str(error)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready after {timeout:.0f}s ({last}); see "
            f"{self.logs / 'kube-apiserver.log'}:\n" + _tail(self.logs / "kube-apiserver.log")
        )

    def kill_apiserver(self) -> None:
        """SIGKILL the API server (a crash, not a shutdown)."""
        process = self.processes.pop("kube-apiserver")
        process.kill()
        process.wait()

    def restart_apiserver(self, down_seconds: float = 2.0) -> None:
        self.kill_apiserver()
        time.sleep(down_seconds)
        self.start_apiserver()

    def _bootstrap(self) -> None:
        assert self.api is not None
        api = self.api
        if api.get_or_none("/apis/node.k8s.io/v1/runtimeclasses/cube") is None:
            api.create(
                "/apis/node.k8s.io/v1/runtimeclasses",
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "cube"},
                    "handler": "cube",
                    # What a VM sandbox reserves per pod, as the emulator's cube does
                    # (a real node's cube is runc, which reserves nothing).
                    **(
                        {"overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}}}
                        if self.runtime_overhead
                        else {}
                    ),
                },
            )
        # The node agent runs as system:node:<name> would; the kubelet API is served with the
        # apiserver-kubelet-client identity, which system:masters covers.
        deadline = time.monotonic() + 60
        while api.get_or_none("/api/v1/namespaces/default") is None:
            if time.monotonic() > deadline:
                raise ControlPlaneError("the default namespace never appeared")
            time.sleep(0.2)


def _terminate(process: subprocess.Popen, grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except OSError:
        process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            process.kill()
        process.wait()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
