"""Unit tests of one follower per run: the lock file in its output directory (a live holder
refused by host and PID, a dead one's taken over), the lease on its namespace (who may hold it,
when --force takes it over) and `list`'s column of who follows each run. No cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import all_names as demo

T0 = 1_800_000_000.0
HOST = socket.gethostname()


def lease(host: str, pid: int, renewed: float) -> dict:
    return demo.lease_record(demo.Holder(host, pid), renewed - 60, renewed, "/runs/a")


def test_a_second_follower_of_a_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = demo.Holder(HOST, holder.pid, demo.process_start(holder.pid))._asdict()
        (tmp_path / "follower.lock").write_text(json.dumps(dict(record, since=T0)))
        with pytest.raises(demo.FollowerBusy) as refused:
            demo.take_lock(str(tmp_path))
        assert f"already followed by host {HOST} PID {holder.pid}" in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    # Its process gone, the lock is stale: the next follower takes it over.
    path = demo.take_lock(str(tmp_path))
    assert json.loads(Path(path).read_text())["pid"] == os.getpid()
    demo.release_lock(path)
    assert not os.path.exists(path)


def test_a_reused_pid_does_not_keep_a_dead_followers_lock(tmp_path: Path) -> None:
    # Our own PID, recorded with another process start: a process that took a dead one's PID.
    record = dict(demo.Holder(HOST, os.getpid(), "1")._asdict(), since=T0)
    (tmp_path / "follower.lock").write_text(json.dumps(record))
    assert demo.holder_alive(demo.Holder(HOST, os.getpid(), "1")) is False
    assert demo.take_lock(str(tmp_path))


def test_a_lock_of_another_host_is_refused_unless_its_lease_is_stale(tmp_path: Path) -> None:
    record = dict(demo.Holder("bastion-9", 4242)._asdict(), since=T0)
    (tmp_path / "follower.lock").write_text(json.dumps(record))
    with pytest.raises(demo.FollowerBusy) as refused:
        demo.take_lock(str(tmp_path))
    assert "host bastion-9 PID 4242" in str(refused.value) and "--force" in str(refused.value)
    assert demo.take_lock(str(tmp_path), replace_remote=True)


def test_who_may_hold_a_runs_lease() -> None:
    me = demo.Holder(HOST, os.getpid())
    other = lambda holder: None  # noqa: E731  # another host: unknown from here
    assert demo.lease_verdict(None, me, T0, False) is None
    assert demo.lease_verdict(lease(HOST, os.getpid(), T0 - 100), me, T0, False) is None
    fresh = lease("bastion-9", 4242, T0 - 5)
    why = demo.lease_verdict(fresh, me, T0, False, other)
    assert why is not None and "host bastion-9 PID 4242" in why and "last renewed 5 s ago" in why
    # --force takes over only a lease not renewed for 3 periods (30 s).
    assert demo.lease_verdict(fresh, me, T0, True, other) is not None
    assert demo.lease_verdict(lease("bastion-9", 4242, T0 - 29), me, T0, True, other) is not None
    stale = lease("bastion-9", 4242, T0 - 30)
    why = demo.lease_verdict(stale, me, T0, False, other)
    assert why is not None and "attach --force takes the lease over" in why
    assert demo.lease_verdict(stale, me, T0, True, other) is None
    # On this host, a live holder is never taken over, a dead one always.
    live = lease(HOST, 1, T0 - 1000)
    assert demo.lease_verdict(live, me, T0, True, lambda holder: True) is not None
    assert demo.lease_verdict(live, me, T0, False, lambda holder: False) is None


def test_list_shows_who_follows_each_run() -> None:
    annotations = {
        "rl-batch-demo.agc/run-id": "0123456789ab",
        "rl-batch-demo.agc/follower": json.dumps(lease("bastion-1", 77, T0 - 12)),
    }
    namespace = {
        "metadata": {
            "name": "agc-rl-0123456789ab",
            "uid": "u",
            "labels": {"agc-demo-run": "0123456789ab"},
            "annotations": annotations,
            "creationTimestamp": "2027-01-15T08:00:00Z",
        }
    }
    (run,) = demo.cluster_runs([namespace], [])
    assert demo.run_record(run, T0)["follower"] == {
        "host": "bastion-1",
        "pid": 77,
        "output": "/runs/a",
        "renewed": demo.rfc3339_micro(T0 - 12),
        "stale": False,
    }
    assert demo.runs_table([run], T0).splitlines()[1].split()[-1] == "bastion-1/77"
    assert demo.runs_table([run], T0 + 30).splitlines()[1].split()[-1] == "(stale)"
    del annotations["rl-batch-demo.agc/follower"]
    (run,) = demo.cluster_runs([namespace], [])
    assert demo.run_record(run, T0)["follower"] is None


def test_an_episode_the_job_counts_but_whose_pod_is_gone_cannot_be_verified() -> None:
    job = {
        "metadata": {"name": "rollout", "creationTimestamp": "2027-01-15T08:00:00Z"},
        "status": {"completedIndexes": "0-1", "failedIndexes": "2"},
    }
    row = demo.episode_row(0, [], job, {}, False, ["a", "b", "c", "d"], 1)
    assert (row["failure_class"], row["valid"], row["attempts"]) == ("infrastructure", False, None)
    assert row["failure"].startswith("cannot verify: the Job counts this episode succeeded")
    assert (
        "counts this episode failed" in demo.episode_row(2, [], job, {}, False, None, 1)["failure"]
    )
    # Never counted by the Job: its pod was never created.
    assert demo.episode_row(3, [], job, {}, False, None, 1)["failure"].startswith("never started")


def test_attach_resumes_a_job_its_client_suspended_never_one_need_groups_stopped() -> None:
    """A client killed right after --need-groups stopped its Jobs (stamped and suspended, before
    the controller's Suspended condition): attach must not resume them, which would run the
    cancelled episodes; a Job an interrupted client suspended is resumed."""
    patched: list[list[str]] = []

    class Recording:
        def run(self, args: list[str], retry_until: float | None = None) -> str:
            patched.append(args)
            return ""

        def get_list(self, kind: str, namespace: str, *flags: str, **options: object) -> dict:
            assert flags == ("-l", "kueue.x-k8s.io/job-uid=u-interrupted")
            return {"items": [{"metadata": {"name": "job-interrupted-1a2b3"}}]}

    settings = SimpleNamespace(queue=None)
    run = SimpleNamespace(kubectl=Recording(), namespace="ns", settings=settings)

    def job(name: str, annotations: dict) -> dict:
        return {
            "metadata": {"name": name, "uid": f"u-{name}", "annotations": annotations},
            "spec": {"suspend": True},
            "status": {"active": 2},
        }

    stopped = job("stopped", {demo.NEED_GROUPS_ANNOTATION: "2"})
    interrupted = job("interrupted", {})
    assert demo.MODULES["attach"].resume(run, [stopped, interrupted]) == ["interrupted"]
    assert [args[:3] for args in patched] == [["patch", "job", "interrupted"]]
    # Queued: Kueue would suspend a Job resumed by hand again; its Workload is let go instead
    # (the interrupted client deactivated it), and Kueue resumes the Job once it admits it.
    patched.clear()
    settings.queue = "lq"
    assert demo.MODULES["attach"].resume(run, [stopped, interrupted]) == ["interrupted"]
    (((kind, name), body),) = [(args[1:3], args[-1]) for args in patched]
    assert name == "job-interrupted-1a2b3" and kind.startswith("workloads.")
    assert json.loads(body) == {"spec": {"active": True}}


class VanishingNamespace:
    """A kubectl whose namespace is read, then deleted (by the run's cleanup) before the patch."""

    binary, context, verbose = "kubectl", None, False

    def get(self, *args, **kwargs) -> dict:
        return {"metadata": {"name": "agc-rl-x", "uid": "u1", "resourceVersion": "7"}}

    def run(self, args, **kwargs):
        raise demo.KubectlError(
            "patch", 1, 'Error from server (NotFound): namespaces "agc-rl-x" not found'
        )


class OwnedReceipt:
    namespace, namespace_uid = "agc-rl-x", "u1"

    def owns_namespace(self, live: dict) -> bool:
        return live["metadata"]["uid"] == self.namespace_uid


def test_a_namespace_deleted_between_read_and_renewal_is_no_failure_to_hold_the_lease(
    tmp_path: Path,
) -> None:
    lease = demo.FollowerLease(
        VanishingNamespace(), OwnedReceipt(), str(tmp_path), str(tmp_path / "l")
    )
    lease.kubectl = VanishingNamespace()
    lease.hold()  # no DemoError: the run's own cleanup deleted the namespace; nothing to warn of
    assert lease.lost is None
