"""The emulator's read path against the real API's rules: paged lists (limit,
continue, remainingItemCount, an expired continue token), lists with
resourceVersionMatch=NotOlderThan, a lagging or stalled watch cache and slow
lists. Driven by real kubectl 1.35 where kubectl has a say, by plain HTTP
where the exact answer matters. No pod runs, so no sandbox is needed."""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

import pytest

from conftest import require_prerequisites
from e2e_support import wait_for
from kube_emulator import Emulator

NAMESPACE = "reads"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


@pytest.fixture
def emulator(tmp_path):
    made = []

    def make(**options: Any) -> Emulator:
        emulator = Emulator(tmp_path / f"emulator-{len(made)}", nodes=1, **options)
        emulator.start()
        made.append(emulator)
        namespaces = emulator._info_for("namespaces")
        emulator.writes.create_object(
            namespaces, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        # The namespace controller adds its root CA configmap soon after: wait for it, so
        # that every configmap listed below is one the test made or that one.
        wait_for(
            lambda: emulator.get("configmaps", NAMESPACE, "kube-root-ca.crt"),
            120,
            "kube-root-ca.crt",
        )
        return emulator

    yield make
    for emulator in made:
        emulator.stop()


def add_configmaps(emulator: Emulator, names: list[str]) -> None:
    info = emulator._info_for("configmaps")
    for name in names:
        emulator.writes.create_object(
            info,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"set": "test"}},
            },
        )


def get(emulator: Emulator, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(emulator.url + path, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def names(answer: dict) -> list[str]:
    return [item["metadata"]["name"] for item in answer["items"]]


def watch_names(emulator: Emulator, resource_version: str) -> list[str]:
    """Names of the configmaps a 1-second watch from `resource_version` delivers."""
    path = f"{CONFIGMAPS}?watch=1&resourceVersion={resource_version}&timeoutSeconds=1"
    with urllib.request.urlopen(emulator.url + path, timeout=30) as response:
        return [json.loads(line)["object"]["metadata"]["name"] for line in response if line.strip()]


def test_kubectl_chunked_get_reads_every_page(emulator):
    kubectl = require_prerequisites("1.35", bwrap=False)
    emu = emulator()
    wanted = [f"cm-{i:02d}" for i in range(11)]
    add_configmaps(emu, wanted)
    before = len(emu.requests)
    listed = subprocess.run(
        [
            kubectl,
            "--context",
            emu.context,
            "get",
            "configmaps",
            "-n",
            NAMESPACE,
            "-l",
            "set=test",
            "--chunk-size=4",
            "-o",
            "json",
        ],
        env=emu.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert [item["metadata"]["name"] for item in json.loads(listed.stdout)["items"]] == wanted
    lists = [r for r in emu.requests[before:] if r["path"] == CONFIGMAPS and not r["watch"]]
    assert [r["query"].get("limit") for r in lists] == ["4", "4", "4"]
    assert [bool(r["query"].get("continue")) for r in lists] == [False, True, True]


def test_continue_pages_come_from_the_first_pages_revision(emulator):
    emu = emulator()
    add_configmaps(emu, ["a", "c", "e"])
    status, first = get(emu, f"{CONFIGMAPS}?limit=2")
    assert status == 200 and names(first) == ["a", "c"]
    assert first["metadata"]["remainingItemCount"] == 2  # e and kube-root-ca.crt
    add_configmaps(emu, ["d"])  # after the first page: not in this list
    status, second = get(emu, f"{CONFIGMAPS}?limit=2&continue={first['metadata']['continue']}")
    assert status == 200 and names(second) == ["e", "kube-root-ca.crt"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert "continue" not in second["metadata"] and "remainingItemCount" not in second["metadata"]


def test_remaining_item_count_only_when_nothing_is_filtered(emulator):
    emu = emulator()
    add_configmaps(emu, ["a", "b", "c"])
    status, page = get(emu, f"{CONFIGMAPS}?limit=1&labelSelector={quote('set=test')}")
    assert status == 200 and names(page) == ["a"] and page["metadata"]["continue"]
    assert "remainingItemCount" not in page["metadata"]


def test_an_expired_continue_token_answers_410_and_offers_to_go_on(emulator):
    emu = emulator()
    add_configmaps(emu, ["a", "b", "c", "d"])
    status, first = get(emu, f"{CONFIGMAPS}?limit=2")
    assert status == 200 and names(first) == ["a", "b"]
    emu.set_faults(continue_ttl=0)
    add_configmaps(emu, ["bb"])  # sorts after the first page's last key
    status, expired = get(emu, f"{CONFIGMAPS}?limit=2&continue={first['metadata']['continue']}")
    assert status == 410 and expired["reason"] == "Expired"
    assert expired["message"].startswith(
        "The provided continue parameter is too old to display a consistent list result."
    )
    token = expired["metadata"]["continue"]
    assert json.loads(base64.urlsafe_b64decode(token + "==")) == {
        "rv": -1,
        "start": [NAMESPACE, "b"],
    }
    # Going on reads the newest revision: "bb" appears, consistency is given up.
    status, rest = get(emu, f"{CONFIGMAPS}?limit=2&continue={token}")
    assert status == 200 and names(rest) == ["bb", "c"]
    status, last = get(emu, f"{CONFIGMAPS}?limit=2&continue={rest['metadata']['continue']}")
    assert status == 200 and names(last) == ["d", "kube-root-ca.crt"]


def test_list_options_are_checked_like_the_real_api(emulator):
    emu = emulator()
    add_configmaps(emu, ["a", "b", "c"])
    status, first = get(emu, f"{CONFIGMAPS}?limit=1")
    token = first["metadata"]["continue"]
    status, answer = get(
        emu,
        f"{CONFIGMAPS}?limit=1&continue={token}&resourceVersion=1"
        f"&resourceVersionMatch=NotOlderThan",
    )
    assert (
        status == 422
        and "resourceVersionMatch is forbidden when continue is provided" in answer["message"]
    )
    status, answer = get(emu, f"{CONFIGMAPS}?resourceVersionMatch=NotOlderThan")
    assert status == 422 and "forbidden unless resourceVersion is provided" in answer["message"]
    status, answer = get(emu, f"{CONFIGMAPS}?limit=1&continue={token}&resourceVersion=5")
    assert (
        status == 400
        and answer["message"] == "specifying resource version is not allowed when using continue"
    )


def test_not_older_than_waits_for_the_watch_cache_then_answers_too_large(emulator):
    emu = emulator(timing={"fresh_block": 0.3})
    add_configmaps(emu, ["a"])
    emu.set_faults(watch_stall={"configmaps": 600})
    add_configmaps(emu, ["b"])
    wanted = emu.store.rv
    query = f"{CONFIGMAPS}?resourceVersion={wanted}&resourceVersionMatch=NotOlderThan&limit=10"
    status, answer = get(emu, query)
    assert status == 504 and answer["reason"] == "Timeout"
    assert answer["message"].startswith(f"Timeout: Too large resource version: {wanted}, current: ")
    assert answer["details"] == {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    # A consistent list (no resourceVersion) reads the store, not the stalled cache.
    status, consistent = get(emu, CONFIGMAPS)
    assert status == 200 and "b" in names(consistent)
    # A stalled cache's watch delivers nothing; once it catches up it delivers what it held back.
    assert watch_names(emu, str(wanted - 1)) == []
    emu.set_faults(watch_stall=None)
    status, answer = get(emu, query)
    assert status == 200 and int(answer["metadata"]["resourceVersion"]) >= wanted
    assert names(answer) == ["a", "b", "kube-root-ca.crt"]
    assert watch_names(emu, str(wanted - 1)) == ["b"]


def test_the_cache_of_another_resource_is_not_held_back(emulator):
    emu = emulator(faults={"watch_delay": {"pods": 600}})
    add_configmaps(emu, ["a"])
    status, answer = get(
        emu, f"{CONFIGMAPS}?resourceVersion={emu.store.rv}&resourceVersionMatch=NotOlderThan"
    )
    assert status == 200 and "a" in names(answer)
    status, answer = get(
        emu,
        f"/api/v1/namespaces/{NAMESPACE}/pods?resourceVersion={emu.store.rv}"
        f"&resourceVersionMatch=NotOlderThan&timeout=1s",
    )
    assert status == 504 and "Too large resource version" in answer["message"]


def test_a_slow_list_answers_late_or_times_out(emulator):
    emu = emulator(faults={"list_latency": {"configmaps": 1.0}})
    add_configmaps(emu, ["a"])
    status, answer = get(emu, f"{CONFIGMAPS}?timeout=5s")
    assert status == 200 and "a" in names(answer)
    status, answer = get(emu, f"{CONFIGMAPS}?timeout=200ms")
    assert status == 504 and answer["message"].startswith("Timeout: request did not complete")
    status, _ = get(emu, f"{CONFIGMAPS}/a?timeout=200ms")  # a single GET is not a list
    assert status == 200


@pytest.mark.parametrize(
    "fault", [{"watch_delay": "soon"}, {"watch_stall": {"pods": -1}}, {"list_latency": True}]
)
def test_read_faults_are_checked_when_set(tmp_path, fault):
    with pytest.raises(ValueError, match="takes seconds"):
        Emulator(tmp_path / "emulator", faults=fault)
