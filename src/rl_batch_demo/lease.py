"""One follower per run: a lock file in its output directory, and a lease on its namespace."""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from typing import Callable, NamedTuple

from .constants import (
    CALL_TIMEOUT_SECONDS,
    FOLLOWER_ANNOTATION,
    LEASE_RENEW_SECONDS,
    LEASE_STALE_PERIODS,
    LOCK_FILE,
)
from .model import DemoError
from .files import Receipt
from .parse import parse_time
from .kube import (
    Kubectl,
    KubectlError,
)
from .proxied import ProxiedKubectl, merge_patch


class Holder(NamedTuple):
    """A follower: its host, PID and its process's start (in clock ticks since boot, from
    /proc: a PID reused by another process is not the follower that held it)."""

    host: str
    pid: int
    process_started: str | None = None

    @property
    def identity(self) -> str:
        return f"{self.host}/{self.pid}"

    def said(self) -> str:
        return f"host {self.host} PID {self.pid}"


class FollowerBusy(DemoError):
    """Another live follower holds the run: its lock file or its namespace's lease."""


def process_start(pid: int) -> str | None:
    """A process's start time as /proc/PID/stat gives it (its 22nd field), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def this_holder() -> Holder:
    """This process as a follower."""
    return Holder(socket.gethostname(), os.getpid(), process_start(os.getpid()))


def holder_alive(holder: Holder) -> bool | None:
    """Whether the follower's process still runs: None when it runs on another host (unknown
    here); False when its PID is gone, or now belongs to a process started later."""
    if holder.host != socket.gethostname():
        return None
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has the PID: it exists
    started = process_start(holder.pid)
    return not (holder.process_started and started and started != holder.process_started)


def holder_of(record: dict | None) -> Holder | None:
    """The holder a lock file's or a lease's record names, or None when it names none."""
    if not isinstance(record, dict) or not record.get("host"):
        return None
    try:
        pid = int(record.get("pid"))  # type: ignore[arg-type]  # checked by the int() below
    except (TypeError, ValueError):
        return None
    started = record.get("process_started")
    return Holder(str(record["host"]), pid, str(started) if started else None)


def read_lock(path: str) -> dict | None:
    """The lock file's record; None when it cannot be read whole (being written, or damaged)."""
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def take_lock(output: str, replace_remote: bool = False) -> str:
    """Hold the output directory's lock file for this process: a lock of a dead process on this
    host is taken over, one of another host only when `replace_remote` (its lease is stale); a
    live holder's is refused with FollowerBusy naming it. The lock file's path."""
    path = os.path.join(output, LOCK_FILE)
    me = this_holder()
    record = dict(me._asdict(), since=time.time())
    for _ in range(3):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = read_lock(path)
            holder = holder_of(held)
            if holder is None and lock_age(path) < LEASE_RENEW_SECONDS:
                time.sleep(0.2)  # being written by a follower starting this moment
                continue
            alive = None if holder is None else holder_alive(holder)
            if holder is not None and (alive or (alive is None and not replace_remote)):
                raise FollowerBusy(lock_refusal(output, holder, held or {}, alive)) from None
            remove_quietly(path)  # stale: its holder is dead, or the lease says so
            continue
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
        except OSError as error:
            remove_quietly(path)
            raise DemoError(f"cannot write {path}: {error.strerror or error}") from None
        return path
    raise FollowerBusy(f"{output}: could not take {LOCK_FILE}; another follower is starting")


def lock_age(path: str) -> float:
    """Seconds since the lock file was last written or renewed (0 when it is gone)."""
    try:
        return max(0.0, time.time() - os.path.getmtime(path))
    except OSError:
        return 0.0


def lock_refusal(output: str, holder: Holder, record: dict, alive: bool | None) -> str:
    """Why a second follower of one output directory is refused, and what to do instead."""
    since = record.get("since")
    started = f", since {rfc3339_micro(since)}" if isinstance(since, (int, float)) else ""
    if alive:
        return (
            f"{output} is already followed by {holder.said()}{started}; one follower per run "
            f"(stop that process first, or wait for it)"
        )
    return (
        f"{output} is followed by {holder.said()}{started} (another host: its process cannot "
        f"be checked from here); attach --force takes over once its lease on the namespace "
        f"has not been renewed for {LEASE_STALE_PERIODS} periods"
    )


def release_lock(path: str) -> None:
    """Remove the lock file if it is still this process's."""
    holder = holder_of(read_lock(path))
    if holder is not None and (holder.host, holder.pid) == (socket.gethostname(), os.getpid()):
        remove_quietly(path)


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def rfc3339_micro(moment: float) -> str:
    """Epoch seconds -> RFC 3339 in UTC with microseconds, as a Lease's MicroTime."""
    stamp = datetime.datetime.fromtimestamp(moment, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_record(holder: Holder, acquired: float, renewed: float, output: str) -> dict:
    """The lease annotation's JSON: the fields of a coordination.k8s.io Lease, and who holds it."""
    return {
        "holderIdentity": holder.identity,
        "host": holder.host,
        "pid": holder.pid,
        "process_started": holder.process_started,
        "output": os.path.abspath(output),
        "acquireTime": rfc3339_micro(acquired),
        "renewTime": rfc3339_micro(renewed),
        "leaseDurationSeconds": LEASE_RENEW_SECONDS * LEASE_STALE_PERIODS,
        "renewPeriodSeconds": LEASE_RENEW_SECONDS,
    }


def lease_of(namespace: dict | None) -> dict | None:
    """The follower lease a namespace carries, or None (none, or not JSON)."""
    text = (((namespace or {}).get("metadata") or {}).get("annotations") or {}).get(
        FOLLOWER_ANNOTATION
    )
    try:
        record = json.loads(text) if text else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def lease_renewed_at(record: dict) -> float | None:
    return parse_time(str(record.get("renewTime") or "")) or None


def lease_verdict(
    record: dict | None,
    me: Holder,
    now: float,
    force: bool,
    alive: Callable[[Holder], bool | None] = holder_alive,
) -> str | None:
    """None when `me` may hold the lease; else why not. Free: none, ours, its holder's process
    gone (this host), or (`force`) not renewed for LEASE_STALE_PERIODS periods. Pure but for
    `alive`, which looks at this host's processes."""
    holder = holder_of(record)
    if record is None or holder is None or holder.identity == me.identity:
        return None
    renewed = lease_renewed_at(record)
    period = float(record.get("renewPeriodSeconds") or LEASE_RENEW_SECONDS)
    age = None if renewed is None else max(0.0, now - renewed)
    living = alive(holder)
    if living is False:
        return None
    since = "never renewed" if age is None else f"last renewed {age:.0f} s ago"
    if living:
        return f"the run is followed by {holder.said()} ({since}); one follower per run"
    stale = age is None or age >= LEASE_STALE_PERIODS * period
    if stale and force:
        return None
    if stale:
        return (
            f"the run's lease is held by {holder.said()}, {since} (more than "
            f"{LEASE_STALE_PERIODS} periods of {period:.0f} s): that follower looks gone; "
            f"attach --force takes the lease over"
        )
    return (
        f"the run is followed by {holder.said()} ({since}, every {period:.0f} s); one "
        f"follower per run (attach --force takes over only a lease not renewed for "
        f"{LEASE_STALE_PERIODS} periods)"
    )


def conflict(error: KubectlError) -> bool:
    """The namespace changed since it was read (the resourceVersion precondition failed)."""
    return "Conflict" in error.stderr or "the object has been modified" in error.stderr


class FollowerLease:
    """This process's hold on one run: its lock file, renewed (touched) every
    LEASE_RENEW_SECONDS, and its namespace's lease, claimed as soon as the namespace exists
    and renewed with it, both by a thread of its own through a kubectl of its own (the run's
    counts its own processes). `release` gives both up."""

    def __init__(
        self, kubectl: Kubectl, receipt: Receipt, output: str, lock_path: str, force: bool = False
    ) -> None:
        self.kubectl = (
            kubectl.sibling()
            if isinstance(kubectl, ProxiedKubectl)
            else Kubectl(kubectl.binary, kubectl.context, kubectl.verbose)
        )
        self.receipt = receipt
        self.output = output
        self.lock_path = lock_path
        self.force = force
        self.me = this_holder()
        self.acquired: float | None = None
        self.lost: str | None = None  # why the lease was lost to another follower, if it was
        self.failing = False  # the last claim or renewal failed (and was said)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> FollowerLease:
        self._thread = threading.Thread(
            target=self._keep, name="rl-batch-demo follower lease", daemon=True
        )
        self._thread.start()
        return self

    def _keep(self) -> None:
        """Claim the lease once the namespace exists, then renew it and the lock every period."""
        while not self._stop.is_set():
            wait: float = LEASE_RENEW_SECONDS
            if self.lost is None and self.receipt.namespace_uid:
                try:
                    self.hold()
                    self.failing = False
                except FollowerBusy as error:
                    self.warn(f"Warning: the run's follower lease was taken over: {error}")
                except DemoError as error:
                    # Said once: a role without patch on namespaces keeps the lock file alone.
                    self.warn(
                        f"Warning: cannot hold the run's follower lease on namespace "
                        f"{self.receipt.namespace} ({error}); grant patch on namespaces"
                    )
                    wait = 1 if self.acquired is not None else LEASE_RENEW_SECONDS
            elif self.lost is None:
                wait = 0.5  # the namespace is about to be created
            try:
                os.utime(self.lock_path)
            except OSError:
                pass  # the directory went: nothing more to renew there
            self._stop.wait(wait)

    def warn(self, line: str) -> None:
        """One warning per spell of failures, not one a period."""
        if not self.failing:
            print(line, file=sys.stderr, flush=True)
        self.failing = True

    def hold(self, force: bool | None = None) -> None:
        """Claim or renew the lease: read the namespace, check who holds it, write ours with its
        resourceVersion as a precondition (a follower that wrote meanwhile wins, as in leader
        election). FollowerBusy when another holds it."""
        live = self.kubectl.get(
            "namespace",
            self.receipt.namespace,
            missing_ok=True,
            retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
        )
        if live is None or not self.receipt.owns_namespace(live):
            return
        now = time.time()
        why = lease_verdict(lease_of(live), self.me, now, self.force if force is None else force)
        if why is not None:
            if self.acquired is not None:
                self.lost = why
            raise FollowerBusy(why)
        self.acquired = self.acquired or now
        record = lease_record(self.me, self.acquired, now, self.output)
        self.patch(json.dumps(record), live["metadata"].get("resourceVersion"))

    def patch(self, value: str | None, resource_version: str | None) -> None:
        metadata: dict = {"annotations": {FOLLOWER_ANNOTATION: value}}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        try:
            merge_patch(
                self.kubectl,
                "namespace",
                self.receipt.namespace,
                None,
                {"metadata": metadata},
                retry_until=time.monotonic() + CALL_TIMEOUT_SECONDS,
            )
        except KubectlError as error:
            if conflict(error):
                raise FollowerBusy(
                    "another follower wrote the run's lease at the same moment"
                ) from None
            if error.not_found:
                return  # the namespace went after it was read (cleanup): nothing left to hold
            raise

    def release(self) -> None:
        """Stop renewing; remove the lease if it is still ours, and the lock file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_SECONDS)
        if self.acquired is not None and self.lost is None:
            try:
                live = self.kubectl.get(
                    "namespace",
                    self.receipt.namespace,
                    missing_ok=True,
                    retry_until=time.monotonic() + 5,
                )
                held = holder_of(lease_of(live))
                if live is not None and held is not None and held.identity == self.me.identity:
                    self.patch(None, live["metadata"].get("resourceVersion"))
            except DemoError:
                pass  # it expires by itself: LEASE_STALE_PERIODS periods unrenewed
        release_lock(self.lock_path)
