"""On the real control plane: a run in a namespace it was given, as a user whose only grant is the
namespaced Role of docs/operations.md (RBAC as the real API server enforces it).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from e2e_support import load, run_tool

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]

OPERATIONS = Path(__file__).resolve().parent.parent.parent / "docs" / "operations.md"


def namespaced_role() -> str:
    """The Role and RoleBinding of docs/operations.md's `--namespace` section."""
    section = OPERATIONS.read_text().split("### In a namespace you were given", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def kubectl_as(cluster, kubectl: str, *args: str, stdin: str | None = None, kubeconfig=None):
    return subprocess.run(
        [kubectl, *args],
        input=stdin,
        env=cluster.env(kubeconfig),
        capture_output=True,
        text=True,
        timeout=120,
    )


def tenant(cluster, kubectl: str, user: str, namespace: str) -> Path:
    """A namespace made by the cluster's admin, the documented Role bound in it to `user`; the
    user's kubeconfig."""
    made = kubectl_as(cluster, kubectl, "create", "namespace", namespace)
    assert made.returncode == 0, made.stderr
    manifest = namespaced_role().replace("rl-bench@example.com", user)
    applied = kubectl_as(
        cluster, kubectl, "apply", "-f", "-", stdin=manifest.replace("team-a", namespace)
    )
    assert applied.returncode == 0, applied.stderr
    return cluster.control_plane.user_kubeconfig(user)


def test_the_namespaced_role_is_enough_for_runs_in_a_given_namespace(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    namespace = "team-role"
    kubeconfig = tenant(cluster, kubectl, "rl-tenant", namespace)
    for denied in (
        ("create", "namespace", "mine"),
        ("get", "namespace", namespace),
        ("get", "runtimeclass"),
        ("get", "secrets", "-n", namespace),
    ):
        refused = kubectl_as(cluster, kubectl, *denied, kubeconfig=kubeconfig)
        assert refused.returncode == 1 and "forbidden" in refused.stderr, denied
    keep = kubectl_as(cluster, kubectl, "create", "configmap", "keep", "-n", namespace)
    assert keep.returncode == 0, keep.stderr
    for name, extra in (("plain", {}), ("harden", {"harden": True})):
        output = tmp_path / name
        result = run_tool(
            cluster,
            kubectl,
            "run",
            count=2,
            namespace=namespace,
            output=output,
            quiet=True,
            kubeconfig=kubeconfig,
            **extra,
        )
        assert result.returncode == 0, (name, result.stderr)
        assert "RuntimeClass check skipped" in result.stderr
        results = load(output / "results.json")
        assert results["reward_sum"] == 2 and results["namespace"] == namespace
        receipt = load(output / "receipt.json")
        assert receipt["shared_namespace"] and all(item["uid"] for item in receipt["objects"])
        cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
        assert cleaned.returncode == 0, (name, cleaned.stderr)
        run_id = receipt["run_id"]
        assert cluster.get("jobs", namespace, f"rollout-{run_id}") is None
        assert cluster.get("configmaps", namespace, f"episode-{run_id}") is None
    # A run left behind, its receipt aside: found and reaped in the namespace, as the user.
    left = run_tool(
        cluster,
        kubectl,
        "run",
        count=1,
        namespace=namespace,
        output=tmp_path / "left",
        quiet=True,
        kubeconfig=kubeconfig,
    )
    assert left.returncode == 0, left.stderr
    run_id = load(tmp_path / "left" / "receipt.json")["run_id"]
    listed = run_tool(cluster, kubectl, "list", namespace=namespace, kubeconfig=kubeconfig)
    assert listed.returncode == 0 and f"{namespace}/{run_id}" in listed.stdout, listed.stderr
    everywhere = run_tool(cluster, kubectl, "list", kubeconfig=kubeconfig)
    assert everywhere.returncode == 1 and "may not list" in everywhere.stderr
    time.sleep(1.5)
    reaped = run_tool(
        cluster, kubectl, "cleanup", stale="1s", namespace=namespace, kubeconfig=kubeconfig
    )
    assert reaped.returncode == 0, reaped.stderr
    assert f"Deleted {namespace}/{run_id}: succeeded" in reaped.stdout, reaped.stdout
    assert cluster.get("configmaps", namespace, f"episode-{run_id}") is None
    assert cluster.get("namespaces", None, namespace) is not None
    assert cluster.get("configmaps", namespace, "keep") is not None
