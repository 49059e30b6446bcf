"""Helpers for the end-to-end tests: run the real tool with real kubectl against the emulator."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence
from xml.etree import ElementTree

from kube_emulator import Emulator

import all_names as rl_batch_demo

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PRODUCT = REPO_ROOT / "rl_batch_demo.py"


def documentation() -> str:
    """README.md and every page of docs/, as one text: a documented example is run as written,
    whichever page shows it."""
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


# Realistic but quick: a sandbox takes a moment to start, so a sequential batch
# is clearly slower than a parallel one, as on a real cluster.
DEFAULT_TIMING = {"sandbox_delay": 0.4, "sandbox_jitter": 0.1}


@contextlib.contextmanager
def emulators(directory: Path, **options: Any) -> Iterator[Callable[..., Emulator]]:
    """make(server_version="1.33", **faults) -> a started emulator under `directory` with the default
    timing faults and the given Emulator options; every emulator made is stopped on leaving."""
    started: list[Emulator] = []

    def make(server_version: str = "1.33", **faults: Any) -> Emulator:
        emulator = Emulator(
            directory / f"emulator-{len(started)}",
            faults={**DEFAULT_TIMING, **faults},
            server_version=server_version,
            **options,
        )
        emulator.start()
        started.append(emulator)
        return emulator

    try:
        yield make
    finally:
        for emulator in started:
            emulator.stop()


def tool_flags(**flags: Any) -> list[str]:
    """The tool's flags from keywords: `image_map=["a=b"], quiet=True, count=4` is
    `--image-map a=b --quiet --count 4`. A list repeats its flag, True is a bare switch, False and
    None leave the flag out; any other value is its str()."""
    argv: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        for each in value if isinstance(value, (list, tuple)) else [value]:
            if each is True:
                argv.append(flag)
            elif each is not False and each is not None:
                argv += [flag, str(each)]
    return argv


def run_tool(
    cluster: Any,
    kubectl: str,
    *args: Any,
    process_timeout: float = 300,
    python: str = sys.executable,
    kubeconfig: Path | None = None,
    **flags: Any,
) -> subprocess.CompletedProcess:
    """Run `rl_batch_demo.py ARGS FLAGS` against the cluster and wait for it: `args` the action and
    its positional arguments (each its str()), `flags` keywords (see tool_flags), e.g.
    `run_tool(cluster, kubectl, "run", output=path, count=4, need=3)`; --kubectl is added for the
    actions that talk to the cluster, and `kubeconfig` (a user's) replaces the cluster's own. The
    test fails if the tool takes longer than `process_timeout` seconds."""
    argv = [*map(str, args), *tool_flags(**flags)]
    return tool(
        cluster, kubectl, *argv, timeout=process_timeout, python=python, kubeconfig=kubeconfig
    )


# The actions that talk to the cluster, through the kubectl given.
CLUSTER_ACTIONS = ("run", "pool", "cleanup", "list", "attach")


def tool(
    cluster: Any,
    kubectl: str,
    *args: str,
    timeout: float = 300,
    python: str = sys.executable,
    kubeconfig: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run `rl_batch_demo.py ARGS` against the cluster, the arguments spelled out (run_tool takes
    the flags as keywords); --kubectl is added for the actions that talk to the cluster."""
    argv = [python, str(PRODUCT), *args]
    if args and args[0] in CLUSTER_ACTIONS:
        argv += ["--kubectl", kubectl]
    env = cluster.env() if kubeconfig is None else cluster.env(kubeconfig)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def start_tool(
    cluster: Any, kubectl: str, *args: Any, kubeconfig: Path | None = None, **flags: Any
) -> subprocess.Popen:
    """Start `rl_batch_demo.py ARGS FLAGS --kubectl KUBECTL` against the cluster and return at once;
    the arguments as run_tool takes them."""
    argv = [sys.executable, str(PRODUCT), *map(str, args), *tool_flags(**flags)]
    return subprocess.Popen(
        [*argv, "--kubectl", kubectl],
        env=cluster.env() if kubeconfig is None else cluster.env(kubeconfig),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(predicate: Any, seconds: float = 120.0, what: str = "the condition") -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


# The opening every task-reading episode script shares: its events as the worker prints them,
# its task read from $TASK_FILE, and `ready`. A test's script is this plus what it does next.
TASK_EPISODE_HEAD = """
import json, os, sys, time
EPISODE_ID = os.environ["EPISODE_ID"]
def emit(event, **fields):
    print(json.dumps(dict({"event": event, "at": time.time(), "episode_id": EPISODE_ID}, **fields)), flush=True)
with open(os.environ["TASK_FILE"]) as handle:
    task = json.load(handle)
emit("ready")
"""


def write_script(directory: Path, source: str, name: str = "episode.py") -> Path:
    """An episode script for --episode-script, written into `directory`."""
    path = directory / name
    path.write_text(source)
    return path


SVG = "{http://www.w3.org/2000/svg}"


def paths_by_title(svg_text: str) -> dict[str, str]:
    """{title: the path's d} of an SVG picture's lines (ramp.svg, cdf.svg)."""
    root = ElementTree.fromstring(svg_text)
    assert root.tag == f"{SVG}svg"
    return {path.find(f"{SVG}title").text: path.get("d") for path in root.iter(f"{SVG}path")}


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def run_namespaces(emulator: Any) -> list[dict]:
    return [
        ns for ns in emulator.list("namespaces") if ns["metadata"]["name"].startswith("agc-rl-")
    ]


def running_pods(cluster: Any, output: Path) -> list[dict]:
    """The pods of the run saved in `output` that are running now (none before its receipt)."""
    if not (output / "receipt.json").exists():
        return []
    namespace = load(output / "receipt.json")["namespace"]
    return [
        p
        for p in cluster.list("pods", namespace)
        if (p.get("status") or {}).get("phase") == "Running"
    ]


def interrupt(
    process: subprocess.Popen, signum: int = signal.SIGINT
) -> subprocess.CompletedProcess:
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def assert_evidence_saved(output: Path, pod_names: Sequence[str]) -> None:
    """A batch's evidence files are there and no results.json was written."""
    for name in ("receipt.json", "job-submitted.json", "job.json", "pods.json", "events.txt"):
        assert (output / name).is_file(), f"{name} missing from {sorted(os.listdir(output))}"
    for pod in pod_names:
        assert (output / f"{pod}.log").is_file(), f"{pod}.log missing"
    assert not (output / "results.json").exists()


def receipt_of(output: Path) -> dict:
    """The receipt as it is now on disk, or {} while it is not there yet."""
    try:
        return json.loads((output / "receipt.json").read_text())
    except (OSError, ValueError):
        return {}


def pods_of(output: Path) -> list[str]:
    """The names of the pods a run saved in pods.json."""
    return [p["metadata"]["name"] for p in load(output / "pods.json")["items"]]


def assert_run_agrees_with_cluster(
    cluster: Any, output: Path, count: int, parallelism: int, runtime: str = "cube"
) -> dict:
    """A finished run's files agree with each other and with the cluster's objects (an emulator or a
    real control plane): its namespace, its Job as submitted and as it ended, and every episode's
    reward and log. Returns results.json."""
    results = load(output / "results.json")
    assert results["episodes"] == results["successful_episodes"] == results["reward_sum"] == count
    assert results["parallelism"] == parallelism
    assert results["context"] == cluster.context
    receipt = load(output / "receipt.json")
    namespace = receipt["namespace"]
    assert cluster.get("namespaces", None, namespace)["metadata"]["uid"] == receipt["namespace_uid"]
    job = load(output / "job.json")
    assert (
        job["metadata"]["uid"]
        == receipt["job_uid"]
        == cluster.get("jobs", namespace, "rollout")["metadata"]["uid"]
    )
    assert any(
        c["type"] == "Complete" and c["status"] == "True" for c in job["status"]["conditions"]
    )
    assert load(output / "job-submitted.json") == rl_batch_demo.job_manifest(
        namespace, count, parallelism, "python:3.12-alpine", runtime
    )
    nodes = {n["metadata"]["name"] for n in cluster.list("nodes")}
    for row in results["pods"]:
        assert row["reward"] == 1 and row["node"] in nodes
        events = rl_batch_demo.parse_events((output / f"{row['pod']}.log").read_text().splitlines())
        assert [e["event"] for e in events] == ["ready", "reward"]
        assert events[0]["episode_id"] == row["pod"]
    return results


# How kubelet v1.35.4 words a container's events, as the real node's tier sees them: the node
# agent and the emulator's kubelet at 1.35 are held to the same words.
KUBELET_135_MESSAGES = {"Created": "Container created", "Started": "Container started"}
KUBELET_135_PRESENT = (
    'Container image "{image}" already present on machine and can be accessed by the pod'
)
KUBELET_135_PULLED = 'Successfully pulled image "{image}" in '


def assert_clocks_agree(results: dict) -> None:
    """Every clock of a run on this one machine (the client's, each node's): the evidence allows it to
    agree with the control plane's, and nothing was corrected (a correction would move each point)."""
    clocks = results["clocks"]
    for name, entry in [("client", clocks["client"])] + list(clocks["nodes"].items()):
        assert (entry["at_least_seconds"] or 0) <= 0 <= (entry["at_most_seconds"] or 0), (
            name,
            entry,
        )
        assert entry["offset_seconds"] == 0.0, (name, entry)
    assert results.get("clock_warnings") in (None, []), results.get("clock_warnings")


def assert_kubelet_135_messages(events: Sequence[dict], image: str = "python:3.12-alpine") -> None:
    """Every Created, Started and Pulled event of the pods' containers says what kubelet v1.35.4 says."""
    seen = set()
    for event in events:
        reason, message = event.get("reason"), event.get("message", "")
        if (event.get("involvedObject") or {}).get("kind") != "Pod" or reason not in (
            "Created",
            "Started",
            "Pulled",
        ):
            continue
        seen.add(reason)
        if reason == "Pulled":
            assert message == KUBELET_135_PRESENT.format(image=image) or message.startswith(
                KUBELET_135_PULLED.format(image=image)
            ), message
        else:
            assert message == KUBELET_135_MESSAGES[reason], (reason, message)
        assert (event.get("involvedObject") or {}).get("fieldPath") == "spec.containers{episode}", (
            event
        )
    assert seen == {"Created", "Started", "Pulled"}, seen


def assert_pulls_one_at_a_time(events: Sequence[dict], nodes: dict[str, str]) -> dict[str, float]:
    """The kubelet pulled one image at a time on each node (serializeImagePulls, its default): the
    pulls its Pulled messages measure (`in 190ms`), each between its pod's Pulling and Pulled
    events, do not overlap, so on a node together they fit between its first Pulling and its last
    Pulled (the events' names: the kubelet's clock, to the nanosecond). `nodes`: pod -> its node.
    Returns each node's span less its pulls (>= 0). Held by the real kubelet and the emulator."""
    stamps: dict[tuple[str, str], float] = {}
    pulled: dict[str, float] = {}
    for event in events:
        regarding = event.get("involvedObject") or {}
        if event.get("reason") not in ("Pulling", "Pulled") or regarding.get("kind") != "Pod":
            continue
        at = rl_batch_demo.event_name_time(rl_batch_demo.event_record(event))
        assert at is not None, event["metadata"]["name"]
        stamps.setdefault((event["reason"], regarding["name"]), at)
        pull = rl_batch_demo.parse_pulled_message(event.get("message", ""))
        if event["reason"] == "Pulled" and pull is not None and pull.pulled:
            assert pull.pull_seconds is not None, event["message"]
            pulled[regarding["name"]] = pull.pull_seconds
    slack = {}
    for node in sorted({nodes[pod] for pod in pulled}):
        pods = [pod for pod in pulled if nodes[pod] == node]
        span = max(stamps[("Pulled", pod)] for pod in pods) - min(
            stamps[("Pulling", pod)] for pod in pods
        )
        total = sum(pulled[pod] for pod in pods)
        assert total <= span, (node, {pod: pulled[pod] for pod in pods}, span)
        slack[node] = span - total
    return slack


def assert_cleanup_works(emulator: Any, kubectl: str, output: Path) -> None:
    """`cleanup` of the run in `output` deletes its namespace, and no run namespace is left."""
    cleaned = tool(emulator, kubectl, "cleanup", "--output", str(output))
    assert cleaned.returncode == 0, cleaned.stderr
    assert "Traceback" not in cleaned.stderr
    assert cleaned.stdout.startswith("Deleted test namespace: agc-rl-")
    assert run_namespaces(emulator) == []


def assert_refused_a_running_pod(process: subprocess.Popen, output: Path, running: str) -> None:
    """The run saw its Job Complete with pod `running` still running: it fails on that pod, saves
    the pod as it read it, and writes no results."""
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 1, (stdout, stderr)
    assert "Traceback" not in stderr
    assert f"pod {running}: phase is Running, not Succeeded" in stderr, stderr
    assert not (output / "results.json").exists()
    pods = {pod["metadata"]["name"]: pod for pod in load(output / "pods.json")["items"]}
    assert pods[running]["status"]["phase"] == "Running"


def most_at_once(runs: Iterable[dict]) -> int:
    """The most containers that ran at one moment, from records of when each started and finished."""
    runs = list(runs)
    moments = sorted(
        [(r["container_started"], 1) for r in runs] + [(r["container_finished"], -1) for r in runs]
    )
    running = most = 0
    for _, change in moments:
        running += change
        most = max(most, running)
    return most


def assert_cleanup_twice(cluster: Any, kubectl: str, output: Path) -> None:
    """`cleanup` deletes the run's namespace and keeps its output; a second one finds it already absent."""
    namespace = load(output / "receipt.json")["namespace"]
    cleaned = tool(cluster, kubectl, "cleanup", "--output", str(output))
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == f"Deleted test namespace: {namespace}"
    assert cluster.get("namespaces", None, namespace) is None
    assert output.is_dir() and (output / "results.json").is_file()
    again = tool(cluster, kubectl, "cleanup", "--output", str(output))
    assert again.returncode == 0 and again.stdout.strip() == "Namespace already absent", (
        again.stderr
    )


# An Indexed episode script whose episode 1 is still working when a test marks the Job Complete.
SLOW_SECOND_EPISODE = '''"""Episode 0 finishes at once; episode 1 is still working when the Job is marked Complete."""
import json
import os
import time

if os.environ.get("JOB_COMPLETION_INDEX") == "1":
    time.sleep(600)
for event in ("ready", "reward"):
    record = {"event": event, "at": time.time(), "episode_id": os.environ["EPISODE_ID"]}
    if event == "reward":
        record.update(reward=1, tests_exit=0, baseline_exit=1)
    print(json.dumps(record), flush=True)
'''


# -- live sandboxes, reached through the API server's pod proxy ----------------------------------

# The sandbox server the tool's live pools run, and the port it serves on.
SANDBOX_SERVER = REPO_ROOT / "src" / "rl_batch_demo" / "sandbox_server.py"
SANDBOX_PORT = 8377
SANDBOX_TOKEN = "token-of-the-run"


def sandbox_manifests(namespace: str, pod: str = "sandbox") -> list[dict]:
    """A Secret holding the run's token, a ConfigMap holding the server and a pod running it, as
    the tool will ship them: a containerPort, POD_IP from the downward API (status.podIP), the
    token a file of the Secret's volume, the server a file of the ConfigMap's, non-root."""
    meta = {"namespace": namespace}
    server = SANDBOX_SERVER.read_text()
    secret = {"token": base64.b64encode(SANDBOX_TOKEN.encode()).decode()}
    container = {
        "name": "sandbox",
        "image": "python:3.12-alpine",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", "/sandbox/sandbox_server.py"],
        "ports": [{"containerPort": SANDBOX_PORT, "name": "sandbox"}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SANDBOX_PORT", "value": str(SANDBOX_PORT)},
            {"name": "SANDBOX_TOKEN_FILE", "value": "/sandbox-token/token"},
        ],
        "volumeMounts": [
            {"name": "server", "mountPath": "/sandbox", "readOnly": True},
            {"name": "token", "mountPath": "/sandbox-token", "readOnly": True},
            {"name": "workspace", "mountPath": "/workspace"},
        ],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sandbox-token", **meta},
            "data": secret,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "sandbox", **meta},
            "data": {"sandbox_server.py": server},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, **meta},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
                "containers": [container],
                "volumes": [
                    {"name": "server", "configMap": {"name": "sandbox"}},
                    {"name": "token", "secret": {"secretName": "sandbox-token"}},
                    {"name": "workspace", "emptyDir": {}},
                ],
            },
        },
    ]


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 to `kubectl proxy --unix-socket PATH`, kept alive as the tool keeps it."""

    def __init__(self, socket_path: Path, timeout: float = 60):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(socket_path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


@contextlib.contextmanager
def kubectl_proxy(kubectl: str, env: dict, socket_path: Path) -> Iterator[UnixHTTPConnection]:
    """A running `kubectl proxy --unix-socket` and one connection to it; stopped on leaving."""
    process = subprocess.Popen(
        [kubectl, "proxy", "--unix-socket", str(socket_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: socket_path.exists() or process.poll() is not None, 30, "kubectl proxy")
        assert process.poll() is None, process.communicate()
        connection = UnixHTTPConnection(socket_path)
        yield connection
        connection.close()
    finally:
        process.terminate()
        process.communicate(timeout=30)


def proxied(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    token: str | None = SANDBOX_TOKEN,
) -> tuple[int, Any]:
    """(status, the answer's JSON) of one request on the kept-alive connection."""
    headers = {"X-Sandbox-Token": token} if token is not None else {}
    connection.request(method, path, body=body, headers=headers)
    answer = connection.getresponse()
    data = answer.read()
    assert not answer.will_close, f"{method} {path}: the connection was not kept alive"
    try:
        return answer.status, json.loads(data)
    except ValueError:
        return answer.status, data


def wait_sandbox_serving(cluster: Any, namespace: str, pod: str) -> str:
    """The pod's IP, once its container runs and the server says it listens."""
    wait_for(
        lambda: (
            ((cluster.get("pods", namespace, pod) or {}).get("status") or {}).get("phase")
            in ("Running", "Succeeded", "Failed")
        ),
        120,
        f"pod {pod} to run",
    )
    status = cluster.get("pods", namespace, pod)["status"]
    assert status["phase"] == "Running", status
    assert status["podIPs"] == [{"ip": status["podIP"]}], status
    return str(status["podIP"])


def wait_proxied_ready(connection: http.client.HTTPConnection, namespace: str, pod: str) -> None:
    """Until the sandbox answers /ready through the proxy (503 while nothing listens yet)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}:{SANDBOX_PORT}/proxy/ready"
    wait_for(lambda: proxied(connection, "GET", path)[0] == 200, 60, "the sandbox to listen")


def assert_sandbox_served(connection: http.client.HTTPConnection, namespace: str, pod: str) -> None:
    """The sandbox through the pod proxy, on one kept-alive connection: 403 without the token
    (the header reaches the pod through kubectl proxy and the API server), /ready, /run and a
    file's round trip with it (the query and the body reach it too); the port taken from the
    pod's first containerPort when the path names none."""
    base = f"/api/v1/namespaces/{namespace}/pods/{pod}:{SANDBOX_PORT}/proxy"
    connection.connect()
    first_socket = connection.sock
    assert proxied(connection, "GET", base + "/ready", token=None) == (403, {"error": "forbidden"})
    assert proxied(connection, "GET", base + "/ready", token="not-the-token")[0] == 403
    status, ready = proxied(connection, "GET", base + "/ready")
    assert status == 200 and ready["ready_at"] > 0, ready
    run = json.dumps({"argv": ["python", "-c", "import os; print(6 * 7, os.getuid())"]})
    status, ran = proxied(connection, "POST", base + "/run", run.encode())
    assert status == 200 and (ran["exit_code"], ran["stdout"]) == (0, "42 1000\n"), ran
    assert proxied(connection, "PUT", base + "/file?path=notes/a.txt", b"hello")[1] == {"bytes": 5}
    assert proxied(connection, "GET", base + "/file?path=notes/a.txt") == (200, b"hello")
    unported = f"/api/v1/namespaces/{namespace}/pods/{pod}/proxy/ready"
    assert proxied(connection, "GET", unported)[0] == 200
    assert connection.sock is first_socket, "kubectl proxy's connection was not kept alive"


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    """A failure Status as the API server writes it."""
    body: dict = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body.update(message=message, reason=reason)
    if details is not None:
        body["details"] = details
    return {**body, "code": code}


def assert_proxy_refusals(
    connection: http.client.HTTPConnection, namespace: str, pod: str, pod_ip: str, unplaced: str
) -> None:
    """What the API server answers when it cannot relay: a pod it has no record of (404), a
    pod with no IP yet (`unplaced`, bound to no node that runs it: 400), a port nothing listens
    on (503 with Go's dial error), an id it cannot read (400)."""
    api = f"/api/v1/namespaces/{namespace}/pods"
    missing = status_body(
        404, "NotFound", 'pods "absent" not found', {"name": "absent", "kind": "pods"}
    )
    assert proxied(connection, "GET", f"{api}/absent:{SANDBOX_PORT}/proxy/ready") == (404, missing)
    no_ip = status_body(400, "BadRequest", "address not allowed")
    assert proxied(connection, "GET", f"{api}/{unplaced}:{SANDBOX_PORT}/proxy/ready") == (
        400,
        no_ip,
    )
    refused = status_body(
        503,
        "ServiceUnavailable",
        f"error trying to reach service: dial tcp {pod_ip}:9: connect: connection refused",
    )
    assert proxied(connection, "GET", f"{api}/{pod}:9/proxy/ready") == (503, refused)
    unreadable = status_body(400, "BadRequest", 'invalid pod request "a:b:c:d"')
    assert proxied(connection, "GET", f"{api}/a:b:c:d/proxy/ready") == (400, unreadable)


def unplaced_pod(namespace: str, name: str = "unplaced") -> dict:
    """A pod bound to a node nobody runs: it never gets an IP."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": "no-such-node",
            "containers": [{"name": "c", "image": "python:3.12-alpine"}],
        },
    }


def live_sandbox_on_a_real_api_server(cluster: Any, kubectl: str, socket_path: Path) -> str:
    """The sandbox's happy path and the API server's refusals through kubectl proxy and a real
    kube-apiserver, then the pod deleted (404 once gone); the pod's IP, for the tier to place."""
    ns = "live-sandbox"

    def kubectl_call(*args: str, manifest: dict | None = None) -> None:
        done = subprocess.run(
            [kubectl, *args],
            input=json.dumps(manifest) if manifest is not None else None,
            env=cluster.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    kubectl_call("create", "namespace", ns)
    # Pods are admitted once the namespace has its service account.
    wait_for(lambda: cluster.get("serviceaccounts", ns, "default"), 60, "the service account")
    for manifest in [*sandbox_manifests(ns), unplaced_pod(ns)]:
        kubectl_call("create", "-f", "-", manifest=manifest)
    ip = wait_sandbox_serving(cluster, ns, "sandbox")
    with kubectl_proxy(kubectl, cluster.env(), socket_path) as connection:
        wait_proxied_ready(connection, ns, "sandbox")
        assert_sandbox_served(connection, ns, "sandbox")
        assert_proxy_refusals(connection, ns, "sandbox", ip, "unplaced")
        kubectl_call("delete", "pod", "sandbox", "-n", ns, "--grace-period=1")
        gone = {"name": "sandbox", "kind": "pods"}
        assert proxied(connection, "GET", f"/api/v1/namespaces/{ns}/pods/sandbox/proxy/ready") == (
            404,
            status_body(404, "NotFound", 'pods "sandbox" not found', gone),
        )
    kubectl_call("delete", "namespace", ns, "--wait=false")
    return ip


def assert_a_pool_serves_its_episodes(cluster: Any, kubectl: str, output: Path) -> dict:
    """`pool` on a cluster: the guide's episode as turns, 4 episodes 2 at a time, each on a pod of
    its own through the API server's pod proxy; its files agree; cleanup leaves nothing. Returns
    results.json."""
    result = tool(
        cluster,
        kubectl,
        "pool",
        "--output",
        str(output),
        "--size",
        "2",
        "--episodes",
        "4",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rewards = [json.loads(line) for line in (output / "rewards.jsonl").read_text().splitlines()]
    assert sorted(line["index"] for line in rewards) == [0, 1, 2, 3]
    assert all(line["reward"] == 1.0 and line["valid"] for line in rewards), rewards
    assert len({line["sandbox"] for line in rewards}) == 4
    commands = [json.loads(line) for line in (output / "commands.jsonl").read_text().splitlines()]
    assert len(commands) == 8 and all(c["round_trip_seconds"] > 0 for c in commands)
    results = load(output / "results.json")
    assert results["episodes"] == results["successful_episodes"] == 4
    assert results["pool"]["refill_seconds"]["p50"] is not None
    assert tool(cluster, kubectl, "cleanup", "--output", str(output)).returncode == 0
    return results
