"""On the real control plane: runs that say who they are, `list`, and `cleanup --stale`.

Each user is a client certificate of its own, bound to the README's role (the
RBAC authorizer of kube-apiserver 1.35 decides), and `kubectl auth whoami` is
answered by the real SelfSubjectReview API. Run with
`python3 tests/run_tests.py --python 3.13 -- -m real_cluster tests/test_real_cluster_lifecycle.py`.
"""

from __future__ import annotations

import socket
import time

import pytest

from e2e_support import load
from test_real_cluster import as_user, readme_rbac, user_with

import rl_batch_demo

pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.xdist_group("real-cluster")]


def test_a_run_says_who_started_it_as_the_api_server_knows_them(real_cluster, tmp_path):
    kubectl, cluster = real_cluster
    kubeconfig = user_with(cluster, kubectl, "ttl-user", readme_rbac())
    output = tmp_path / "out"
    started = time.time()
    result = as_user(cluster, kubeconfig, kubectl, "run", "--count", "1", "--ttl", "30m", "--output", str(output),
                     "--quiet")
    assert result.returncode == 0, result.stderr
    receipt = load(output / "receipt.json")
    annotations = cluster.get("namespaces", None, receipt["namespace"])["metadata"]["annotations"]
    expires = rl_batch_demo.parse_time(annotations.pop("rl-batch-demo.agc/expires-at"))
    assert annotations == {
        "rl-batch-demo.agc/run-id": receipt["run_id"], "rl-batch-demo.agc/version": rl_batch_demo.__version__,
        "rl-batch-demo.agc/host": socket.gethostname(), "rl-batch-demo.agc/output": str(output.resolve()),
        "rl-batch-demo.agc/user": "ttl-user"}
    assert started + 1800 - 1 <= expires <= time.time() + 1800
    cleaned = as_user(cluster, kubeconfig, kubectl, "cleanup", "--output", str(output))
    assert cleaned.returncode == 0, cleaned.stderr
