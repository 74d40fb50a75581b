"""Node IPAM: give every Node a pod CIDR (a /24 of the cluster CIDR) once.

A node's agent takes its pods' addresses from `spec.podCIDR`, so two nodes
must never share one.  Uniqueness survives restarts without any state of its
own: the allocated set is rebuilt from the nodes themselves at every
(re-)list, so whatever the API says is what is taken (kube-controller-manager's
range allocator works the same way).  Deleting a node frees its range.

`CIDRAllocator` and `plan` are pure; `NodeIPAM` is the controller around them, run
by the controller manager (`nodeipam` in --controllers) from its shared nodes
informer: the informer's handler keeps the allocator's picture current (a range seen
on a node is taken, a deleted node's range is free — and a re-list after a lost watch
reports the nodes deleted meanwhile, so nothing leaks), and a one-worker queue gives
ranges to the nodes without one.  Only IPv4 single-stack for now: `spec.podCIDRs`
gets the one range.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

from fleet.client import ApiException, ClientConfig
from fleet.client.informer import Informer
from fleet.controllers.runtime import Context, Manager, QueueWorker

log = logging.getLogger(__name__)

DEFAULT_CLUSTER_CIDR = "10.42.0.0/16"
DEFAULT_NODE_MASK = 24


class CIDRExhausted(Exception):
    """Every node range of the cluster CIDR is taken."""


class CIDRAllocator:
    """Hands out the lowest free node-sized subnet of the cluster CIDR."""

    def __init__(self, cluster_cidr: str = DEFAULT_CLUSTER_CIDR, node_mask: int = DEFAULT_NODE_MASK) -> None:
        self.cluster = ipaddress.ip_network(cluster_cidr)
        if not isinstance(self.cluster, ipaddress.IPv4Network):
            raise ValueError(f"cluster CIDR {cluster_cidr} is not IPv4")
        if not self.cluster.prefixlen <= node_mask <= 32:
            raise ValueError(f"node mask /{node_mask} does not fit in {cluster_cidr}")
        self.node_mask = node_mask
        self._size = 1 << (node_mask - self.cluster.prefixlen)
        self._used: set[int] = set()
        self._next = 0  # search hint: lowest index that may be free

    @property
    def capacity(self) -> int:
        return self._size

    def _index(self, cidr: str) -> int | None:
        """The range's index in the cluster CIDR, or None if it is not one of ours."""
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            return None
        if (not isinstance(net, ipaddress.IPv4Network) or net.prefixlen != self.node_mask
                or not net.subnet_of(self.cluster)):
            return None
        return (int(net.network_address) - int(self.cluster.network_address)) >> (32 - self.node_mask)

    def _cidr(self, index: int) -> str:
        base = int(self.cluster.network_address) + (index << (32 - self.node_mask))
        return f"{ipaddress.IPv4Address(base)}/{self.node_mask}"

    def occupy(self, cidr: str) -> bool:
        """Mark a range taken (a node already has it); False if it is not ours."""
        idx = self._index(cidr)
        if idx is None:
            return False
        self._used.add(idx)
        return True

    def release(self, cidr: str) -> None:
        idx = self._index(cidr)
        if idx is not None:
            self._used.discard(idx)
            self._next = min(self._next, idx)

    def allocate(self) -> str:
        for idx in range(self._next, self._size):
            if idx not in self._used:
                self._used.add(idx)
                self._next = idx + 1
                return self._cidr(idx)
        raise CIDRExhausted(f"no free /{self.node_mask} left in {self.cluster}")

    def is_used(self, cidr: str) -> bool:
        idx = self._index(cidr)
        return idx is not None and idx in self._used


def node_cidr(node: dict[str, Any]) -> str:
    return str((node.get("spec") or {}).get("podCIDR") or "")


def plan(nodes: Iterable[dict[str, Any]], allocator: CIDRAllocator) -> dict[str, str]:
    """Ranges for the nodes that have none, after counting every range already assigned.

    Nodes are served in name order, so the same cluster always gets the same plan.
    When the cluster CIDR runs out, the remaining nodes get nothing (and are
    logged); they get a range as soon as a node is deleted.
    """
    nodes = list(nodes)
    for n in nodes:
        if node_cidr(n):
            allocator.occupy(node_cidr(n))
    out: dict[str, str] = {}
    for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        if not node_cidr(n):
            try:
                out[n["metadata"]["name"]] = allocator.allocate()
            except CIDRExhausted as e:
                log.error("node IPAM: node %s gets no pod CIDR: %s", n["metadata"]["name"], e)
                break
    return out


@dataclass
class NodeIPAMConfig:
    cluster_cidr: str = DEFAULT_CLUSTER_CIDR
    node_mask: int = DEFAULT_NODE_MASK


class NodeIPAM(QueueWorker):
    """The node IPAM controller: queue keys are nodes ("/name") that need a range."""

    name = "nodeipam"
    kind = "Node"
    # One worker: ranges are handed out in the order nodes are queued (two workers
    # would be safe — allocation is synchronous — but no faster in any way that matters).
    workers = 1

    def __init__(self, cfg: NodeIPAMConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or NodeIPAMConfig()
        self.allocator = CIDRAllocator(self.cfg.cluster_cidr, self.cfg.node_mask)
        self.assigned: dict[str, str] = {}  # node name -> range, as the API last showed it
        self.starved: set[str] = set()  # nodes told "no range left" (logged once each)
        self.client: Any = None
        self.nodes: Informer | None = None

    def setup(self, ctx: Context) -> None:
        self.client = ctx.client
        self.nodes = ctx.informers.informer("v1", "nodes")
        self.nodes.add_handler(self.on_node)

    async def run(self, ctx: Context) -> None:
        """Every node listed so far first, in name order (the same cluster always gets
        the same plan), then whatever the queue brings."""
        assert self.nodes is not None, "setup() first"
        await self.nodes.wait_synced()
        for name, cidr in plan(self.nodes.list(), self.allocator).items():
            await self.assign(name, cidr)
        await super().run(ctx)

    def on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """Informer handler (in memory only): keep the allocator's picture; queue nodes without a range."""
        if etype == "DELETED":
            assert old is not None
            name = old["metadata"]["name"]
            gone = self.assigned.pop(name, "") or node_cidr(old)
            if gone:
                self.allocator.release(gone)
            self.starved.discard(name)
            return
        assert new is not None
        name = new["metadata"]["name"]
        cidr = node_cidr(new)
        if cidr:
            if self.assigned.get(name) != cidr:
                self.assigned[name] = cidr
                self.allocator.occupy(cidr)
            return
        if name not in self.assigned:  # else our patch is on its way; the event predates it
            self.queue.add(f"/{name}")

    async def reconcile(self, key: str) -> float | None:
        assert self.nodes is not None
        name = key.partition("/")[2]
        node = self.nodes.get(key)
        if node is None or node_cidr(node) or name in self.assigned:
            return None
        try:
            cidr = self.allocator.allocate()
        except CIDRExhausted as e:
            # Once per node, not per event: every status heartbeat of a node without a
            # range would otherwise log again (thousands of simulated nodes did).
            if name not in self.starved:
                self.starved.add(name)
                log.error("node IPAM: node %s gets no pod CIDR: %s", name, e)
            return None
        self.starved.discard(name)
        await self.assign(name, cidr)
        return None

    async def assign(self, name: str, cidr: str) -> None:
        patch = {"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}
        try:
            await self.client.patch("v1", "nodes", name, patch)
        except ApiException as e:
            # 404: the node went away.  422: it got a range from someone else
            # meanwhile (podCIDR may not change once set); its event tells us which.
            self.allocator.release(cidr)
            if e.code not in (404, 409, 422):
                raise
            log.info("node IPAM: not assigning %s to %s: %s", cidr, name, e)
            return
        except BaseException:
            self.allocator.release(cidr)  # a transport error: the queue retries with back-off
            raise
        self.assigned[name] = cidr
        log.info("node IPAM: assigned %s to node %s", cidr, name)


async def run(config: ClientConfig, cfg: NodeIPAMConfig | None = None, *,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Only node IPAM, in a manager of its own, until cancelled (`fleet server` runs it
    inside its controller manager instead)."""
    await Manager([NodeIPAM(cfg)]).run(config, task_status=task_status)
