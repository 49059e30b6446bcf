"""Unit tests of how the tool reads a Job's pods after its end: the paged list
(limit/continue, resourceVersionMatch=NotOlderThan, an expired continue token)
as a pure reducer, and the reading of pods that still look unfinished. The API
is a fake proxy answering canned pages; no thread, no kubectl."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest

import all_names as demo
from rl_batch_demo import KubectlError

NAMESPACE = "agc-rl-0123456789ab"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def pod(name: str, phase: str = "Succeeded") -> dict:
    return {"metadata": {"name": name, "namespace": NAMESPACE}, "status": {"phase": phase}}


def query(path: str) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(urlsplit(path).query).items()}


def page(items: list[dict], resource_version: str = "40", token: str | None = None) -> str:
    metadata = {"resourceVersion": resource_version}
    if token:
        metadata["continue"] = token
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items})


EXPIRED = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
        "message": "The provided continue parameter is too old to display a "
        "consistent list result.",
        "metadata": {"continue": "go-on"},
    }
)


class FakeProxy:
    """Answers GETs from a list of (expected path predicate, answer) in order; records the paths."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.paths: list[str] = []

    def get(self, path: str, retry_until: float | None = None) -> str:
        self.paths.append(path)
        answer = self.answers.pop(0)
        if isinstance(answer, KubectlError):
            raise answer
        return answer


def read(proxy: FakeProxy, listing: demo.PagedList) -> demo.PagedList:
    return demo.read_pages(demo.Kubectl("kubectl-never-run"), proxy, listing, None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# The path of each page


def test_the_first_page_asks_for_a_revision_not_older_than_the_jobs_end() -> None:
    path = demo.list_path(PODS, 500, "job-name=rollout", "1234")
    assert path.startswith(PODS + "?")
    assert query(path) == {
        "limit": "500",
        "labelSelector": "job-name=rollout",
        "resourceVersion": "1234",
        "resourceVersionMatch": "NotOlderThan",
    }


def test_a_continued_page_names_only_its_token() -> None:
    # The token carries its list's revision; the API refuses a resourceVersion beside it.
    path = demo.list_path(PODS, 500, "job-name=rollout", "1234", "abc=")
    assert query(path) == {"limit": "500", "labelSelector": "job-name=rollout", "continue": "abc="}


def test_without_a_revision_the_list_is_a_plain_consistent_one() -> None:
    assert query(demo.list_path(PODS, 7)) == {"limit": "7"}


# --------------------------------------------------------------------------
# Answers


@pytest.mark.parametrize(
    "answer, expected",
    [
        (EXPIRED, "go-on"),
        (json.dumps({"kind": "Status", "reason": "Expired", "code": 410}), ""),
        (
            "Error from server (Expired): The provided continue parameter is too old to display a consistent "
            "list result.",
            "",
        ),
        (
            json.dumps(
                {
                    "kind": "Status",
                    "reason": "Timeout",
                    "code": 504,
                    "message": "Timeout: Too large resource version: 9, current: 7",
                }
            ),
            None,
        ),
        ("Error from server (Timeout): Timeout: Too large resource version: 9, current: 7", None),
        ("[1, 2]", None),
    ],
    ids=[
        "status-with-token",
        "status-without-token",
        "kubectl-text",
        "too-large",
        "too-large-text",
        "other",
    ],
)
def test_expired_continue(answer: str, expected: str | None) -> None:
    assert demo.expired_continue(answer) == expected


# --------------------------------------------------------------------------
# The reducer


def test_pages_are_kept_in_order_until_one_has_no_token() -> None:
    listing = demo.PagedList(PODS, "job-name=rollout", "30", limit=2)
    listing.apply(json.loads(page([pod("a"), pod("b")], "41", "t1")))
    assert not listing.done and query(listing.next_path()) == {
        "limit": "2",
        "labelSelector": "job-name=rollout",
        "continue": "t1",
    }
    listing.apply(json.loads(page([pod("c")], "41")))
    assert listing.done and listing.pages == 2
    assert [p["metadata"]["name"] for p in listing.items] == ["a", "b", "c"]
    assert listing.resource_version == "41"


def test_an_expired_token_goes_on_with_the_apis_token_keeping_what_was_read() -> None:
    listing = demo.PagedList(PODS, limit=2)
    listing.apply(json.loads(page([pod("a"), pod("b")], "41", "t1")))
    listing.expired("go-on")
    assert listing.expiries == 1 and listing.continue_token == "go-on" and len(listing.items) == 2
    assert query(listing.next_path())["continue"] == "go-on"


def test_an_expired_token_without_one_to_go_on_starts_again() -> None:
    listing = demo.PagedList(PODS, not_older_than="30", limit=2)
    listing.apply(json.loads(page([pod("a"), pod("b")], "41", "t1")))
    listing.expired("")
    assert listing.items == [] and listing.resource_version is None and not listing.done
    assert query(listing.next_path()) == {
        "limit": "2",
        "resourceVersion": "30",
        "resourceVersionMatch": "NotOlderThan",
    }


# --------------------------------------------------------------------------
# Reading pages through an API that answers canned pages


def test_read_pages_follows_tokens_and_goes_on_after_an_expiry() -> None:
    proxy = FakeProxy(
        [
            page([pod("a")], "41", "t1"),
            KubectlError("GET", 410, EXPIRED),
            page([pod("b")], "55", "t2"),
            page([pod("c")], "55"),
        ]
    )
    listing = read(proxy, demo.PagedList(PODS, not_older_than="30", limit=1))
    assert [p["metadata"]["name"] for p in listing.items] == ["a", "b", "c"]
    assert [query(path).get("continue") for path in proxy.paths] == [None, "t1", "go-on", "t2"]
    assert listing.pages == 3 and listing.expiries == 1 and listing.resource_version == "41"


def test_read_pages_gives_up_after_repeated_expiries() -> None:
    proxy = FakeProxy([page([pod("a")], "41", "t1")] + [KubectlError("GET", 410, EXPIRED)] * 9)
    with pytest.raises(KubectlError):
        read(proxy, demo.PagedList(PODS, limit=1))
    assert len(proxy.paths) == 2 + demo.LIST_EXPIRIES


def test_read_pages_reports_other_errors() -> None:
    proxy = FakeProxy(
        [KubectlError("GET", 403, json.dumps({"kind": "Status", "reason": "Forbidden"}))]
    )
    with pytest.raises(KubectlError, match="exit 403"):
        read(proxy, demo.PagedList(PODS))


# --------------------------------------------------------------------------
# Pods that still look unfinished


def test_unfinished_pods_are_those_neither_succeeded_nor_failed() -> None:
    pods = [
        pod("d", "Running"),
        pod("a"),
        pod("c", "Failed"),
        pod("b", "Pending"),
        {"metadata": {"name": "e"}},
    ]
    assert demo.unfinished_pods(pods) == ["b", "d", "e"]


def test_with_fresh_pods_replaces_by_name_and_sorts() -> None:
    fresh = {"b": pod("b", "Succeeded")}
    assert demo.with_fresh_pods([pod("c"), pod("b", "Running"), pod("a")], fresh) == [
        pod("a"),
        pod("b", "Succeeded"),
        pod("c"),
    ]


def test_read_job_pods_lists_from_the_jobs_end_and_reads_a_straggler_again() -> None:
    straggler_now = dict(pod("rollout-b"), kind="Pod", apiVersion="v1")
    proxy = FakeProxy(
        [page([pod("rollout-a"), pod("rollout-b", "Running")], "77"), json.dumps(straggler_now)]
    )
    reading = demo.read_job_pods(
        demo.Kubectl("kubectl-never-run"),
        proxy,  # type: ignore[arg-type]
        NAMESPACE,
        "rollout",
        "70",
        None,
    )
    assert query(proxy.paths[0]) == {
        "limit": str(demo.LIST_PAGE_SIZE),
        "labelSelector": "job-name=rollout",
        "resourceVersion": "70",
        "resourceVersionMatch": "NotOlderThan",
    }
    assert proxy.paths[1] == f"{PODS}/rollout-b"
    assert reading.source == "list" and reading.resource_version == "77" and reading.pages == 1
    assert reading.reread == ["rollout-b"]
    assert [(p["kind"], p["metadata"]["name"], p["status"]["phase"]) for p in reading.pods] == [
        ("Pod", "rollout-a", "Succeeded"),
        ("Pod", "rollout-b", "Succeeded"),
    ]


def test_a_straggler_that_cannot_be_read_again_stays_as_listed() -> None:
    proxy = FakeProxy(
        [
            page([pod("rollout-a", "Running")], "77"),
            KubectlError("GET", 404, 'pods "rollout-a" not found'),
        ]
    )
    reading = demo.read_job_pods(
        demo.Kubectl("kubectl-never-run"),
        proxy,  # type: ignore[arg-type]
        NAMESPACE,
        "rollout",
        "70",
        None,
    )
    assert reading.reread == []
    assert reading.pods[0]["status"]["phase"] == "Running"


def test_a_pod_the_watch_saw_vanish_stays_in_the_evidence_as_last_seen() -> None:
    listed = [pod("b", "Succeeded"), pod("a", "Succeeded")]
    watched = [pod("a", "Running"), pod("c", "Running")]  # a: older than the list; c: deleted since
    assert demo.with_vanished(listed, watched) == [
        pod("a", "Succeeded"),
        pod("b", "Succeeded"),
        pod("c", "Running"),
    ]


class StoppedWatch:
    """A watch process that has already ended."""

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def pod_event(name: str, phase: str) -> demo.WatchEvent:
    return demo.WatchEvent(
        "pods", {"type": "MODIFIED", "object": dict(pod(name, phase), kind="Pod")}, 100.0
    )


def test_drain_takes_in_what_the_pod_watch_delivered_up_to_its_end_marker() -> None:
    follower = demo.BatchFollower(
        demo.Kubectl("kubectl-never-run"), NAMESPACE, "rollout", 2, demo.Progress(quiet=True), None
    )  # type: ignore[arg-type]
    follower.watches.failures = {"job": 0, "pods": 0}  # as follow() leaves them
    follower.watches.processes["pods"] = StoppedWatch()  # type: ignore[assignment]
    for item in (
        pod_event("rollout-a", "Running"),
        demo.WatchEnded("job", None),
        pod_event("rollout-b", "Running"),
        demo.WatchEnded("pods", None),
        pod_event("rollout-c", "Running"),
    ):
        follower.watches.queue.put(item)
    demo.drain_pod_watch(follower)
    assert sorted(follower.state.pods) == ["rollout-a", "rollout-b"]
    assert follower.watches.processes == {}
    # It stopped at the pod watch's end: what follows is another watch's business.
    assert follower.watches.queue.get_nowait() == pod_event("rollout-c", "Running")
