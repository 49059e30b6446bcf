"""The node agent's pod network: addresses where the real API server reaches pods that serve.

The API server refuses to proxy to a loopback pod IP (pods/proxy answers 400 "address not
allowed"), so on the real-control-plane tier a pod that declares ports gets a real address,
10.246.B.H, inside a network namespace the tests make (`rldemo-pods-<pid>-<n>`): on the
namespace's end of a veth pair whose host end holds 10.246.B.1, with a host route for
10.246.B.0/24 through it (and a block more, on a veth pair of its own, whenever the blocks
it holds are full: 253 serving pods a block). The API server, on the host's loopback,
reaches the pods there; the pods reach each other and the host end's address (as a node's
pods reach their node), nothing else. B is the first block whose veth name is free on this
machine and whose /24 no host route covers yet, so agents running side by side never share
one, and no address outside the namespace is ever used. Such a pod's sandbox (bubblewrap,
keeping the network namespace it is started in) runs in that namespace through nsenter; its
address is added when its sandbox starts and removed when the pod ends, as a CNI plugin's
ADD and DEL would. Every serving pod of the agent shares the one namespace, each on its own
address.

The state is recorded under /run/rldemo-node/<name>/ as tests/support/real_node.py records
its own, and torn down with real_node's helpers: by stop(), or by the next start once the
process that made it is gone (the processes in the namespace killed, the veth's host end and
the namespace deleted, which takes the route with them). Needs root.

    network = PodNetwork()
    address = network.take()               # the first call makes the namespace
    argv = network.enter(bwrap_argv)       # nsenter --net=... bwrap ...
    network.release(address); network.stop()
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PREFIX = "10.246"
NAME_PREFIX = "rldemo-pods"
HOSTS = range(2, 255)  # 10.246.B.2 to .254; .1 is the host end

# real_node is imported where it is used, not here: it imports local_cluster, which imports the
# node agent, which imports this module.


class PodNetworkError(Exception):
    """The pod network cannot be made, or changed, here (the reason says why)."""


def ip(*args: str, netns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS`, in network namespace `netns` if given, through real_node's funnel."""
    import real_node

    try:
        return real_node.run(["ip", *args], netns=netns, check=check)
    except real_node.RealNodeError as error:
        raise PodNetworkError(str(error)) from None


def host_routes() -> List[ipaddress.IPv4Network]:
    """The destinations of this host's IPv4 routes (main table), the default route left out."""
    listed = json.loads(ip("-j", "-4", "route", "show").stdout or "[]")
    return [
        ipaddress.IPv4Network(route["dst"], strict=False)
        for route in listed
        if route.get("dst") not in (None, "default")
    ]


class PodNetwork:
    """One network namespace holding the addresses of an agent's serving pods (see above)."""

    def __init__(self) -> None:
        self.name = f"{NAME_PREFIX}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.netns_path = f"/run/netns/{self.name}"
        self.record: Optional[Path] = None
        self.block: Optional[int] = None  # the first block
        self.devices: Dict[int, str] = {}  # block -> the namespace's end of its veth pair
        self.links: List[str] = []  # the host ends, for the record
        self.given: set = set()
        self.next_host: Dict[int, int] = {}
        self.lock = threading.Lock()

    @property
    def subnet(self) -> str:
        return f"{PREFIX}.{self.block}.0/24"

    def take(self) -> str:
        """A free address for a pod, added in the namespace (made on the first call; a block of
        253 addresses more, on a veth pair of its own, each time the blocks held are full)."""
        with self.lock:
            if self.block is None:
                self._start()
            found = self._free_address()
            if found is None:
                self._claim_block()
                found = self._free_address()
            if found is None:
                raise PodNetworkError(f"no pod address left in {PREFIX}.0.0/16")
            address, block = found
            device = self.devices[block]
            self.given.add(address)
        try:
            ip("addr", "add", f"{address}/32", "dev", device, netns=self.name)
            # The kernel drops a device's routes with its last address: the way back to the host
            # end is made again whenever a pod's address arrives (after the namespace stood empty).
            gateway = f"{PREFIX}.{block}.1"
            ip("route", "replace", f"{gateway}/32", "dev", device, netns=self.name)
        except PodNetworkError:
            with self.lock:
                self.given.discard(address)
            raise
        return address

    def release(self, address: str) -> None:
        """The pod ended: its address leaves the namespace (a dial to it finds no host)."""
        with self.lock:
            if address not in self.given:
                return
            self.given.discard(address)
        device = self.devices[int(address.split(".")[2])]
        ip("addr", "del", f"{address}/32", "dev", device, netns=self.name, check=False)

    def _free_address(self) -> Optional[Tuple[str, int]]:
        """(address, its block): the next one not given, each block taken in turn round its
        hosts (an address just let go is not handed out again at once)."""
        for block in self.devices:
            for _ in HOSTS:
                host = self.next_host.get(block, HOSTS.start)
                self.next_host[block] = host + 1 if host < HOSTS[-1] else HOSTS.start
                address = f"{PREFIX}.{block}.{host}"
                if address not in self.given:
                    return address, block
        return None

    def enter(self, argv: List[str]) -> List[str]:
        """`argv` run inside the namespace."""
        return ["nsenter", f"--net={self.netns_path}", *argv]

    def stop(self) -> None:
        """Tear down what was made (nothing when no pod needed the network)."""
        import real_node

        with self.lock:
            record, self.record, self.block = self.record, None, None
            self.devices, self.links = {}, []
        if record is not None and record.exists():
            problems = real_node.teardown(record)
            if problems:
                raise PodNetworkError("teardown left: " + "; ".join(problems))

    # -- making it ------------------------------------------------------------------------
    def _start(self) -> None:
        """The namespace, recorded first (so that a crash leaves nothing the next start misses)."""
        import real_node

        if os.geteuid() != 0:
            raise PodNetworkError(
                "a pod that declares ports needs the pod network (ip netns add), as root; "
                f"this is uid {os.geteuid()}"
            )
        real_node.cleanup_leftovers()
        self.record = real_node.RECORDS / self.name
        self.record.mkdir(parents=True, exist_ok=True)
        (self.record / "owner").write_text(str(os.getpid()))
        self._save_state([])
        try:
            ip("netns", "add", self.name)
            ip("link", "set", "lo", "up", netns=self.name)
            self._claim_block()
        except BaseException:
            record, self.record, self.block = self.record, None, None
            self.devices, self.links = {}, []
            real_node.teardown(record)
            raise

    def _claim_block(self) -> None:
        """The first free 10.246.B.0/24: its veth pair made (the host end's name is the claim),
        addressed and routed."""
        covered = host_routes()
        for block in range(1, 255):
            subnet = ipaddress.IPv4Network(f"{PREFIX}.{block}.0/24")
            if any(subnet.overlaps(route) for route in covered):
                continue
            host_end, ns_end = f"rlpod{block}h", f"rlpod{block}n"
            veth = ["link", "add", host_end, "type", "veth", "peer", "name", ns_end]
            made = ip(*veth, "netns", self.name, check=False)
            if made.returncode != 0:
                if "exists" in made.stderr:
                    continue  # another agent's block
                raise PodNetworkError(f"ip link add {host_end} type veth: {made.stderr.strip()}")
            self.links.append(host_end)
            self._save_state(self.links)
            gateway = f"{PREFIX}.{block}.1"
            ip("addr", "add", f"{gateway}/32", "dev", host_end)
            ip("link", "set", host_end, "up")
            ip("link", "set", ns_end, "up", netns=self.name)
            ip("route", "add", f"{gateway}/32", "dev", ns_end, netns=self.name)
            ip("route", "add", str(subnet), "dev", host_end, "src", gateway)
            self.devices[block] = ns_end
            self.block = self.block or block
            return
        raise PodNetworkError(f"no free block in {PREFIX}.0.0/16 for the pod network")

    def _save_state(self, links: List[str]) -> None:
        assert self.record is not None
        state = {"name": self.name, "netns": self.name, "links": links}
        (self.record / "state.json").write_text(json.dumps(state))
