"""Unit tests of what a Python caller's requests through the shared `kubectl proxy` are made of:
the API paths of kubectl's calls, kubectl's words for the API server's refusals (so an error read
through the proxy reads, and is judged, as kubectl's), which calls the proxy can carry, and the
context resolved once per kubeconfig. No cluster, no kubectl."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import threading
import types
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import all_names as demo


def status(code: int, reason: str, message: str) -> str:
    return json.dumps(
        {"kind": "Status", "apiVersion": "v1", "code": code, "reason": reason, "message": message}
    )


def test_a_refusal_through_the_proxy_reads_as_kubectl_prints_it() -> None:
    missing = demo.server_error(404, status(404, "NotFound", 'namespaces "agc-rl-1" not found'))
    assert missing == 'Error from server (NotFound): namespaces "agc-rl-1" not found\n'
    error = demo.KubectlError("get namespace agc-rl-1", 1, missing)
    assert error.not_found and not error.transient
    assert str(error) == (
        "kubectl get namespace agc-rl-1 failed (exit 1): Error from server (NotFound): "
        'namespaces "agc-rl-1" not found'
    )
    exists = demo.server_error(
        409, status(409, "AlreadyExists", 'namespaces "agc-rl-1" already exists'), creating=True
    )
    assert exists == (
        'Error from server (AlreadyExists): error when creating "STDIN": '
        'namespaces "agc-rl-1" already exists\n'
    )
    assert demo.KubectlError("create", 1, exists).already_exists


def test_an_answer_without_a_status_is_named_by_its_code() -> None:
    # A URL the server does not serve: what check_runtime_class tells from a missing RuntimeClass.
    unserved = demo.server_error(404, "404 page not found")
    assert unserved == f"Error from server (NotFound): {demo.UNSERVED_PATH_MESSAGE}\n"
    busy = demo.KubectlError("get job rollout", 1, demo.server_error(503, "upstream busy"))
    assert busy.transient
    assert demo.status_reason(status(404, "NotFound", "x")) == "NotFound"
    assert demo.status_reason("404 page not found") is None


def test_an_invalid_object_is_named_with_its_causes_as_kubectl_does() -> None:
    details = {
        "kind": "Job",
        "name": "rollout",
        "causes": [{"field": "spec.maxFailedIndexes", "message": "Invalid value: 3"}],
    }
    answer = json.dumps({"kind": "Status", "reason": "Invalid", "message": "x", "details": details})
    assert demo.server_error(422, answer, creating=True) == (
        'The Job "rollout" is invalid: spec.maxFailedIndexes: Invalid value: 3\n'
    )
    details["causes"].append({"message": "and another"})
    answer = json.dumps({"kind": "Status", "reason": "Invalid", "message": "x", "details": details})
    assert demo.server_error(422, answer) == (
        'The Job "rollout" is invalid: \n* spec.maxFailedIndexes: Invalid value: 3\n* and another\n'
    )


def test_the_paths_of_kubectls_calls() -> None:
    assert demo.resource_path("job", "ns", "rollout") == "/apis/batch/v1/namespaces/ns/jobs/rollout"
    assert demo.resource_path("namespace", None, "ns") == "/api/v1/namespaces/ns"
    # A cluster-wide kind ignores the namespace, as kubectl does.
    assert demo.resource_path("runtimeclass", "ns", "cube") == (
        "/apis/node.k8s.io/v1/runtimeclasses/cube"
    )
    assert demo.resource_path("nodes", None) == "/api/v1/nodes"


def test_only_the_calls_the_proxy_can_say_go_through_it() -> None:
    assert demo.proxied_list_flags(())
    assert demo.proxied_list_flags(("-l", "job-name=rollout"))
    assert demo.proxied_list_flags(("--chunk-size=500",))
    assert not demo.proxied_list_flags(("--field-selector", "metadata.name=rollout"))
    assert not demo.proxied_list_flags(("--sort-by=.metadata.name",))
    assert demo.proxied_delete_flags(("--wait=false",))
    assert demo.proxied_delete_flags(("--cascade=foreground", "--wait=false"))
    # A deletion kubectl waits for stays kubectl's.
    assert not demo.proxied_delete_flags(("--cascade=foreground",))
    assert not demo.proxied_delete_flags(("--wait=false", "--grace-period=0"))


def test_a_batchs_watches_through_the_proxy_select_what_kubectls_would() -> None:
    one = demo.WatchStream(demo.Kubectl("kubectl"), "ns", "rollout")
    assert one.api_path("job") == (
        "/apis/batch/v1/namespaces/ns/jobs?fieldSelector=metadata.name%3Drollout&watch=1"
    )
    assert (
        one.api_path("pods")
        == "/api/v1/namespaces/ns/pods?labelSelector=job-name%3Drollout&watch=1"
    )
    assert one.api_path("events") == "/api/v1/namespaces/ns/events?watch=1"
    several = demo.WatchStream(
        demo.Kubectl("kubectl"),
        "ns",
        "rollout",
        demo.BatchJobs("rollout", ["rollout-image-1", "rollout-image-2"]),
    )
    selector = urllib.parse.urlencode({"labelSelector": f"{demo.BATCH_LABEL}=rollout", "watch": 1})
    assert several.api_path("job") == f"/apis/batch/v1/namespaces/ns/jobs?{selector}"
    assert several.api_path("pods") == f"/api/v1/namespaces/ns/pods?{selector}"


def test_the_context_is_asked_of_kubectl_once_per_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = tmp_path / "asked"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$*" >> "{asked}"\necho ctx-a\n')
    kubectl.chmod(0o755)
    config = tmp_path / "config"
    config.write_text("first")
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.setattr(demo.MODULES["preflight"], "RESOLVED_CONTEXTS", {})
    runner = demo.Kubectl(str(kubectl))
    assert demo.resolve_context(runner, None) == "ctx-a"
    assert demo.resolve_context(runner, None) == "ctx-a"
    assert asked.read_text().splitlines() == ["config current-context"]
    config.write_text("second, longer")  # another kubeconfig may name another current context
    os.utime(config, ns=(1, 1))
    assert demo.resolve_context(runner, None) == "ctx-a"
    assert asked.read_text().splitlines() == ["config current-context"] * 2


def test_cluster_wide_facts_are_read_once_in_a_while_and_a_failure_never_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = demo.MODULES["proxied"]
    monkeypatch.setattr(kube, "RECENT_READS", {})
    reads: list[str] = []

    def read(what: str) -> str:
        reads.append(what)
        return f"{what} #{len(reads)}"

    runner = demo.Kubectl("kubectl", "ctx")
    assert demo.recently_read(runner, ("nodes", None, ()), lambda: read("nodes")) == "nodes #1"
    assert demo.recently_read(runner, ("nodes", None, ()), lambda: read("nodes")) == "nodes #1"
    # A namespaced object is never kept: each read is the cluster's answer of the moment.
    assert demo.recently_read(runner, ("job", "rollout"), lambda: read("job")) == "job #2"
    assert demo.recently_read(runner, ("job", "rollout"), lambda: read("job")) == "job #3"

    def refused() -> str:
        raise demo.KubectlError("auth whoami", 1, "Error from server (Forbidden): no")

    with pytest.raises(demo.KubectlError):
        demo.recently_read(runner, ("whoami",), refused)
    assert demo.recently_read(runner, ("whoami",), lambda: read("whoami")) == "whoami #4"
    monkeypatch.setattr(kube, "RECENT_READ_SECONDS", 0.0)  # kept no longer
    assert demo.recently_read(runner, ("nodes", None, ()), lambda: read("nodes")) == "nodes #5"


def test_a_cleanup_begun_early_is_waited_for_and_says_what_it_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_module = demo.MODULES["run"]
    deleting = threading.Event()
    threads: list[str] = []

    def cleanup_namespace(kubectl: object, receipt: object, report: Any) -> None:
        threads.append(threading.current_thread().name)
        deleting.wait(5)
        print("Deleted test namespace: agc-rl-1", file=report)

    monkeypatch.setattr(run_module, "cleanup_namespace", cleanup_namespace)
    run: Any = types.SimpleNamespace(
        kubectl=None, receipt=None, cleanup_ahead=concurrent.futures.Future()
    )
    demo.begin_cleanup(run)
    assert run.cleanup_ahead.running()
    deleting.set()
    report = io.StringIO()
    demo.cleaned_up(run, report)
    assert report.getvalue() == "Deleted test namespace: agc-rl-1\n"
    assert threads == ["rl-batch-demo cleanup"]
    # Its failure is raised where it is waited for.
    monkeypatch.setattr(run_module, "cleanup_namespace", lambda *a, **k: 1 / 0)
    run.cleanup_ahead = concurrent.futures.Future()
    demo.begin_cleanup(run)
    with pytest.raises(ZeroDivisionError):
        demo.cleaned_up(run, io.StringIO())
    # Not begun (no proxy, or the run failed before its evidence): done when waited for.
    monkeypatch.setattr(run_module, "cleanup_namespace", cleanup_namespace)
    run.cleanup_ahead, threads[:] = concurrent.futures.Future(), []
    demo.cleaned_up(run, report)
    assert threads == [threading.current_thread().name]


class RecordingProxy:
    """An ApiProxy that answers every list with one empty page and keeps the paths asked."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def call(self, verb: str, method: str, path: str, retry_until: Any, *rest: Any) -> str:
        self.paths.append(path)
        return json.dumps({"kind": "JobList", "items": [], "metadata": {}})


def test_a_label_selector_given_as_a_tuple_selects_through_the_proxy_too() -> None:
    # ProxiedKubectl.get_list(kind, namespace, *flags) hands its flags on as a tuple: a selector
    # dropped there would list every Job of a shared namespace as the run's (and delete them).
    proxy = RecordingProxy()
    demo.api_get_list(proxy, "jobs", "team-a", ("-l", "agc-demo-run=abc"), None)
    (path,) = proxy.paths
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    assert query["labelSelector"] == ["agc-demo-run=abc"]
