"""End to end, what the command line shows a user debugging on a bastion: `--verbose`
echoes every kubectl command line and every request through the tool's own
`kubectl proxy` on stderr, and shows nothing of the kind without it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import PRODUCT, load, run_namespaces, run_tool

pytestmark = pytest.mark.e2e


def echoed(stderr: str) -> list[str]:
    """The lines `--verbose` echoed (what was sent), without their `+ ` mark."""
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


def kubectl_lines(lines: list[str], kubectl: str) -> list[list[str]]:
    """The echoed kubectl command lines, parsed back into argv as a shell would."""
    return [shlex.split(line) for line in lines if shlex.split(line)[0] == kubectl]


def request(argv: list[str]) -> list[str]:
    """An echoed kubectl argv without the binary and the options every call carries."""
    rest = argv[1:]
    if rest[:1] == ["--context"]:
        rest = rest[2:]
    return [arg for arg in rest if not arg.startswith("--request-timeout=")]


def test_verbose_echoes_every_kubectl_command_and_proxy_request(
    make_cluster, tmp_path: Path
) -> None:
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "verbose"
    result = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True, verbose=True)
    assert result.returncode == 0, result.stderr
    namespace = load(output / "receipt.json")["namespace"]
    lines = echoed(result.stderr)
    argvs = kubectl_lines(lines, kubectl)
    # Every kubectl command is echoed whole, as a shell would run it: the binary, the context.
    assert argvs and all(argv[1:3] == ["--context", emulator.context] for argv in argvs[1:]), lines
    assert argvs[0][1:] == ["config", "current-context"]
    # After the context, each bounds its requests: 30 s for a request-and-answer call and the proxy.
    assert all(argv[3] == "--request-timeout=30s" for argv in argvs[1:] if "--watch" not in argv), (
        lines
    )
    assert all(argv[0] == kubectl for argv in argvs)
    tails = [request(argv) for argv in argvs]
    assert tails.count(["create", "-f", "-", "-o", "json"]) == 3  # namespace, configmap, job
    assert ["get", "runtimeclass", "cube", "-o", "name"] in tails
    watches = [argv for argv in argvs if "--watch" in argv]
    assert sorted(argv[argv.index("get") + 1] for argv in watches) == ["events", "jobs", "pods"]
    assert all(
        argv[3].startswith("--request-timeout=") for argv in watches
    )  # bounded, and shown so
    proxies = [argv for argv in argvs if "proxy" in argv]
    assert len(proxies) == 1 and proxies[0][-1].startswith("--unix-socket=")
    # Reads through the proxy are shown as the HTTP request sent.
    gets = [line for line in lines if line.startswith("GET ")]
    assert any(
        line.startswith(f"GET /api/v1/namespaces/{namespace}/events?") and "timeout=30s" in line
        for line in gets
    ), lines
    assert any(
        line.startswith(f"GET /api/v1/namespaces/{namespace}/pods/")
        and "/log?container=episode" in line
        for line in gets
    ), lines
    # What kubectl is given on stdin (the manifests) is never echoed.
    assert '"apiVersion"' not in result.stderr and "print(" not in result.stderr
    assert echoed(result.stdout) == []  # stdout stays the results

    cleaned = run_tool(emulator, kubectl, "cleanup", output, verbose=True)
    assert cleaned.returncode == 0, cleaned.stderr
    cleanup_tails = [request(argv) for argv in kubectl_lines(echoed(cleaned.stderr), kubectl)]
    assert any(tail[:3] == ["delete", "job", "rollout"] for tail in cleanup_tails), cleanup_tails
    assert any(tail[:3] == ["delete", "namespace", namespace] for tail in cleanup_tails), (
        cleanup_tails
    )
    assert run_namespaces(emulator) == []


def test_without_verbose_no_command_line_is_echoed(make_cluster, tmp_path: Path) -> None:
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "plain"
    result = run_tool(emulator, kubectl, "run", count=2, output=output)
    assert result.returncode == 0, result.stderr
    assert (
        "Test namespace:" in result.stdout and "pod_to_ready" in result.stderr
    )  # the usual chatter
    assert echoed(result.stderr) == []
    assert "create -f -" not in result.stderr and "GET /api/" not in result.stderr
    assert "--watch" not in result.stderr and "proxy --unix-socket" not in result.stderr
    cleaned = run_tool(emulator, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0 and echoed(cleaned.stderr) == [], cleaned.stderr


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "kept"])
def test_local_cluster_removes_its_temporary_state_on_stopping_unless_kept(
    require_e2e, tmp_path: Path, keep: bool
) -> None:
    require_e2e()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    argv = [
        sys.executable,
        str(Path(__file__).resolve().parent.parent / "local_cluster.py"),
        "--emulator",
        "--kubectl",
        "",
    ]
    process = subprocess.Popen(
        argv + (["--keep"] if keep else []),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TMPDIR=str(temporary)),
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("READY "), (
            line,
            process.stderr.read() if process.poll() is not None else "",
        )
        [state] = list(temporary.glob("rldemo-cluster-*"))
        assert Path(line.split(" ", 1)[1].strip()).is_relative_to(state)  # the kubeconfig is in it
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stopped = json.loads(process.stderr.read().strip().splitlines()[-1])
    assert stopped == {"stopped": str(state), "removed": not keep}
    assert state.exists() is keep


def test_the_local_emulator_has_only_the_images_it_is_given(require_e2e, tmp_path: Path) -> None:
    kubectl = require_e2e()
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent.parent / "local_cluster.py")]
        + ["--emulator", "--workdir", str(tmp_path / "cluster"), "--kubectl", kubectl]
        + ["--images", "python:3.12-alpine,registry.local/agent:7"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("READY "), process.stderr.read() if process.poll() else line
        env = dict(os.environ, KUBECONFIG=line.split(" ", 1)[1].strip(), HOME=str(tmp_path))

        def run(output: str, *options: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, str(PRODUCT), "run", "--count", "1", "--quiet"]
                + ["--output", str(tmp_path / output), "--kubectl", kubectl, *options],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )

        for output, image in (("guide", "python:3.12-alpine"), ("named", "registry.local/agent:7")):
            ran = run(output, "--image", image, "--cleanup")
            assert ran.returncode == 0, ran.stderr
            assert load(tmp_path / output / "results.json")["reward_sum"] == 1
        # A typo is an image no node has and no registry serves: it fails to pull as on a real
        # node, and the run fails instead of rewarding 1.0.
        typo = run("typo", "--image", "pyton:3.12-alpine", "--timeout", "6", "--cleanup")
        assert typo.returncode == 1, typo.stderr
        assert not (tmp_path / "typo" / "results.json").exists()
        events = (tmp_path / "typo" / "events.txt").read_text()
        # The kubelet's words: the pull's error, ErrImagePull, then the back-off.
        assert 'Failed to pull image "pyton:3.12-alpine": rpc error: code = NotFound' in events
        assert "Error: ErrImagePull" in events and "Error: ImagePullBackOff" in events
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
