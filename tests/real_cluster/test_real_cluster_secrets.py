"""--env-from-secret as a real user on the real API server: the README's ClusterRole and, in the
Secret's own namespace, the documented Role that lets it get that one Secret are enough, and
without that Role the run stops before anything is created."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from e2e_support import load, run_tool, write_script
from test_e2e_podspec import ENV_SCRIPT
from test_real_cluster import kubectl_run, readme_rbac, user_with

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "operations.md"


def secret_role() -> str:
    """The documented Role that lets the run get one Secret of another namespace."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text().split("## Permissions", 1)[1], re.S)
    (role,) = [
        block
        for block in blocks
        if "kind: Role\n" in block and "name: rl-batch-demo-secret\n" in block
    ]
    return role


def admin(cluster, kubectl: str, *args: str, stdin: str | None = None) -> None:
    done = subprocess.run(
        [kubectl, *args], input=stdin, env=cluster.env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_documented_role_reads_the_one_secret_and_no_other(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    user = "secret-user"
    kubeconfig = user_with(cluster, kubectl, user, readme_rbac())
    value = "sk-" + secrets.token_hex(12)
    admin(cluster, kubectl, "create", "namespace", "team-rl")
    for name, data in (("openai", {"AGENT_API_KEY": value}), ("other", {"X": "y"})):
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": "team-rl"},
            "stringData": data,
        }
        admin(cluster, kubectl, "create", "-f", "-", stdin=json.dumps(secret))
    script = write_script(tmp_path, ENV_SCRIPT)
    flags = dict(count=1, episode_script=script, env_from_secret=["team-rl/openai"], quiet=True)
    # Without the Role: refused before anything is created, saying what is needed.
    refused = run_tool(
        cluster, kubectl, "run", output=tmp_path / "refused", kubeconfig=kubeconfig, **flags
    )
    assert refused.returncode == 1
    assert (
        "--env-from-secret team-rl/openai: may not get Secret openai in namespace team-rl (the "
        "copy into the run's namespace needs get on it, and create secrets); nothing was created"
    ) in refused.stderr
    # With the documented Role, bound to the user in that namespace.
    binding = f"""---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: rl-batch-demo-secret
  namespace: team-rl
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: rl-batch-demo-secret
subjects:
  - kind: User
    name: {user}
"""
    admin(cluster, kubectl, "apply", "-f", "-", stdin=secret_role() + binding)
    output = tmp_path / "out"
    result = run_tool(cluster, kubectl, "run", output=output, kubeconfig=kubeconfig, **flags)
    assert result.returncode == 0, result.stderr
    logs = "".join(path.read_text() for path in output.glob("rollout-*.log"))
    assert hashlib.sha256(value.encode()).hexdigest() in logs and value not in logs
    assert load(output / "results.json")["successful_episodes"] == 1
    # Still least privilege: no other Secret of that namespace, nor a list of them.
    for args in (("get", "secret", "other", "-n", "team-rl"), ("get", "secrets", "-n", "team-rl")):
        denied = kubectl_run(cluster, kubectl, *args, kubeconfig=kubeconfig)
        assert denied.returncode == 1 and "forbidden" in denied.stderr, args
    cleaned = run_tool(cluster, kubectl, "cleanup", output=output, kubeconfig=kubeconfig)
    assert cleaned.returncode == 0, cleaned.stderr
