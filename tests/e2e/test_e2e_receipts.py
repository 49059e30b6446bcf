"""End to end: the guide's receipts and ours are interchangeable. The guide's script
writes {context, namespace, run_id, uid, job_uid} (`uid` being the namespace's UID,
`job_uid` Job rollout's) and its cleanup reads only those; this tool writes the same
keys with the same meaning, adds its own beside them, and accepts either."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_support import load, run_namespaces, run_tool

pytestmark = pytest.mark.e2e

GUIDE = Path(__file__).resolve().parent.parent / "support" / "guide_client.py"


def guide(emulator, kubectl: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(GUIDE), *args, "--kubectl", kubectl],
        env=emulator.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_guide_receipt_is_cleaned_up_by_this_tool(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "guide"
    made = guide(emulator, kubectl, "--output", str(output), "--count", "2")
    assert made.returncode == 0, made.stderr
    namespace = load(output / "receipt.json")["namespace"]
    live_namespace = emulator.get("namespaces", None, namespace)["metadata"]
    live_job = emulator.get("jobs", namespace, "rollout")["metadata"]
    # The guide's receipt, written out literally: its five keys and nothing of ours.
    (output / "receipt.json").write_text(
        json.dumps(
            {
                "context": emulator.context,
                "namespace": namespace,
                "run_id": live_namespace["labels"]["agc-demo-run"],
                "uid": live_namespace["uid"],
                "job_uid": live_job["uid"],
            }
        )
    )
    (output / "job.json").unlink()  # the receipt alone must prove whose Job it is

    cleaned = run_tool(emulator, kubectl, "cleanup", output=output)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == f"Deleted test namespace: {namespace}"
    assert run_namespaces(emulator) == []


def test_a_guide_receipt_naming_another_namespace_uid_is_refused(make_cluster, tmp_path):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "guide"
    assert guide(emulator, kubectl, "--output", str(output), "--count", "1").returncode == 0
    receipt = load(output / "receipt.json")
    (output / "receipt.json").write_text(
        json.dumps({**receipt, "uid": "00000000-0000-0000-0000-000000000000"})
    )
    refused = run_tool(emulator, kubectl, "cleanup", output=output)
    assert refused.returncode == 1
    assert f"refusing to delete namespace {receipt['namespace']}" in refused.stderr
    assert len(run_namespaces(emulator)) == 1


@pytest.mark.parametrize("warmup", [False, True])
def test_this_tools_receipt_is_cleaned_up_by_the_guides_cleanup(make_cluster, tmp_path, warmup):
    kubectl, make = make_cluster
    emulator = make()
    output = tmp_path / "ours"
    made = run_tool(emulator, kubectl, "run", count=2, output=output, quiet=True, warmup=warmup)
    assert made.returncode == 0, made.stderr
    receipt = load(output / "receipt.json")
    namespace = receipt["namespace"]
    assert receipt["uid"] == emulator.get("namespaces", None, namespace)["metadata"]["uid"]
    # With a warm-up first, `job_uid` is still Job rollout's, as the guide's cleanup reads it.
    assert receipt["job_uid"] == emulator.get("jobs", namespace, "rollout")["metadata"]["uid"]

    cleaned = guide(emulator, kubectl, "cleanup", "--output", str(output))
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == f"Deleted test namespace: {namespace}"
    assert run_namespaces(emulator) == []
