"""The repair loop of Service allocations (kube's ipallocator and portallocator repair
controllers, which run inside kube-apiserver).

The allocator (`svcalloc.py`) writes a reservation before its Service, so a crash
or a failed request can leave a reservation without a Service (a leak), and a
store restored from elsewhere or a hand-deleted IPAddress can leave a Service
without its reservation.  Every `interval` seconds, and at start, the loop reads
IPAddresses, NodePort reservations and Services at one store revision and
`plan()` — pure — decides:

* a Service's ClusterIP / NodePort with no reservation → create it
  (`ClusterIPNotAllocated` / `PortNotAllocated` Warning on the Service);
* a value held by several Services → `ClusterIPAlreadyAllocated` /
  `PortAlreadyAllocated` on every holder but the reservation's owner;
* a value outside the configured range → `ClusterIPOutOfRange` / `PortOutOfRange`;
* a reservation whose Service is gone or holds another value → a leak, deleted
  only when the previous pass saw the very same reservation (same
  resourceVersion) leaked too, and never while a request of this server still
  has it in flight (`ServiceAllocator.pending`): an in-flight create is never
  robbed of the value it just took.

Before each pass the system Services (`systemsvc.py`: `default/kubernetes`...)
are ensured again, as kube-apiserver's bootstrap controller does every 10 s.

IPAddresses not written by the allocator (another `managed-by`, or a parent that
is not a Service) are not ours to judge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import meta
from fleet.api.kinds import networking
from fleet.server import systemsvc
from fleet.server.svcalloc import (
    IP_PREFIX,
    PORT_PREFIX,
    ServiceAllocator,
    cluster_ips,
    ip_key,
    node_ports,
    owner_of,
    port_key,
)
from fleet.server.svcalloc_range import PortRange, ServiceIPRange
from fleet.store import KeyNotFound, RevisionConflict, Store

log = logging.getLogger(__name__)

SERVICES_PREFIX = meta.store_key("", "services", None)

Name = tuple[str, str]


@dataclass
class RepairPlan:
    """What one pass does.  Keys are store keys (`ip_key` / `port_key`)."""

    # (value, Service) to reserve for that Service.
    create_ips: list[tuple[str, Name]] = field(default_factory=list)
    create_ports: list[tuple[int, Name]] = field(default_factory=list)
    # (key, resourceVersion) leaked on this pass and the previous one: delete.
    delete: list[tuple[str, int]] = field(default_factory=list)
    # key → resourceVersion seen leaked on this pass (the next pass's `suspects`).
    suspects: dict[str, int] = field(default_factory=dict)
    # (Service, reason, message) Warning events.
    events: list[tuple[Name, str, str]] = field(default_factory=list)


def _name(obj: Mapping[str, Any]) -> Name:
    md = obj.get("metadata") or {}
    return str(md.get("namespace") or ""), str(md.get("name") or "")


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def plan(services: list[dict[str, Any]], ip_addresses: list[dict[str, Any]],
         port_reservations: list[dict[str, Any]], ip_range: ServiceIPRange, port_range: PortRange, *,
         suspects: Mapping[str, int] | None = None, pending: set[str] | frozenset[str] = frozenset()) -> RepairPlan:
    """One pass's decisions from a consistent snapshot (see the module docstring)."""
    suspects = suspects or {}
    out = RepairPlan()
    family = ip_range.family
    by_name = {_name(s): s for s in services}
    ip_owner: dict[str, tuple[Name, int]] = {}
    for a in ip_addresses:
        labels = (a.get("metadata") or {}).get("labels") or {}
        owner = owner_of(a)
        ip = str((a.get("metadata") or {}).get("name") or "")
        if owner is None or labels.get(networking.LABEL_MANAGED_BY, networking.MANAGED_BY_ALLOCATOR) != \
                networking.MANAGED_BY_ALLOCATOR:
            ip_owner[ip] = (("", ""), -1)  # someone else's: it takes the address, we never touch it
            continue
        ip_owner[ip] = (owner, _rv(a))
    port_owner: dict[int, tuple[Name, int]] = {}
    for r in port_reservations:
        try:
            port = int((r.get("metadata") or {}).get("name") or "")
        except ValueError:
            continue
        owner = owner_of(r)
        port_owner[port] = (owner if owner is not None else ("", ""), _rv(r))

    # Services' view: who holds what.
    ip_holders: dict[str, list[Name]] = {}
    port_holders: dict[int, list[Name]] = {}
    for s in sorted(services, key=lambda s: (str((s.get("metadata") or {}).get("creationTimestamp") or ""),
                                             _name(s))):
        for ip in cluster_ips(s):
            ip_holders.setdefault(ip, []).append(_name(s))
        for port in sorted(node_ports(s)):
            port_holders.setdefault(port, []).append(_name(s))

    for ip, holders in sorted(ip_holders.items()):
        if not ip_range.contains(ip):
            for h in holders:
                out.events.append((h, "ClusterIPOutOfRange", f"Cluster IP [{family}]:{ip} is not within the "
                                                             f"configured Service CIDR {ip_range.cidr}; please "
                                                             "recreate service"))
            continue
        owner = ip_owner.get(ip)
        if owner is None:
            out.create_ips.append((ip, holders[0]))
            out.events.append((holders[0], "ClusterIPNotAllocated",
                               f"Cluster IP [{family}]:{ip} is not allocated; repairing"))
            rest = holders[1:]
        else:
            rest = [h for h in holders if h != owner[0]]
            if len(rest) == len(holders):
                # The reservation names another object (leaked below): the first
                # holder gets it once the leak is gone; the others are duplicates.
                rest = holders[1:]
        for h in rest:
            out.events.append((h, "ClusterIPAlreadyAllocated", f"Cluster IP [{family}]:{ip} was assigned to "
                                                               "multiple services; please recreate service"))
    for port, holders in sorted(port_holders.items()):
        if not port_range.contains(port):
            for h in holders:
                out.events.append((h, "PortOutOfRange", f"Port {port} is not within the port range "
                                                        f"{port_range}; please recreate service"))
            continue
        powner = port_owner.get(port)
        if powner is None:
            out.create_ports.append((port, holders[0]))
            out.events.append((holders[0], "PortNotAllocated", f"Port {port} is not allocated; repairing"))
            rest = holders[1:]
        else:
            rest = [h for h in holders if h != powner[0]]
            if len(rest) == len(holders):
                rest = holders[1:]
        for h in rest:
            out.events.append((h, "PortAlreadyAllocated", f"Port {port} was assigned to multiple services; "
                                                          "please recreate service"))

    def leaked(key: str, rv: int) -> None:
        if key in pending:
            return
        out.suspects[key] = rv
        if suspects.get(key) == rv:
            out.delete.append((key, rv))

    for ip, (owner, rv) in sorted(ip_owner.items()):
        if rv < 0:
            continue
        svc = by_name.get(owner)
        if svc is None or ip not in cluster_ips(svc):
            leaked(ip_key(ip), rv)
    for port, (owner, rv) in sorted(port_owner.items()):
        svc = by_name.get(owner)
        if svc is None or port not in node_ports(svc):
            leaked(port_key(port), rv)
    return out


class AllocationRepair:
    """The thin loop around `plan`: read, decide, write, report."""

    def __init__(self, store: Store, allocator: ServiceAllocator, *, interval: float = 60.0,
                 events: Any = None, system_services: Iterable[Callable[[], Awaitable[Any]]] = ()) -> None:
        self.store = store
        self.allocator = allocator
        self.interval = interval
        self.events = events  # a fleet.client.events.EventRecorder, or None (log only)
        # Ensure functions of the system Services (systemsvc.py), run before each pass.
        self.system_services = list(system_services)
        self.suspects: dict[str, int] = {}

    async def run_once(self) -> RepairPlan:
        await systemsvc.ensure_all(self.system_services)
        ips = await self.store.list(IP_PREFIX)
        ports = await self.store.list(PORT_PREFIX, revision=ips.revision)
        services = await self.store.list(SERVICES_PREFIX, revision=ips.revision)
        p = plan(services.items, ips.items, ports.items, self.allocator.ip_range, self.allocator.port_range,
                 suspects=self.suspects, pending=set(self.allocator.pending))
        by_name = {_name(s): s for s in services.items}
        for ip, svc_name in p.create_ips:
            await self.allocator.take_ip(by_name[svc_name], ip, adopt=False)
        for port, svc_name in p.create_ports:
            await self.allocator.take_port(by_name[svc_name], port)
        for key, rv in p.delete:
            if key in self.allocator.pending:
                continue
            try:
                await self.store.delete(key, expected_revision=rv)
                log.warning("allocation repair: %s had leaked (no Service holds it); released", key)
            except (KeyNotFound, RevisionConflict):
                pass  # gone or changed since: judged again on the next pass
        for key in p.delete:
            p.suspects.pop(key[0], None)
        self.suspects = p.suspects
        for svc_name, reason, message in p.events:
            log.warning("allocation repair: Service %s/%s: %s: %s", *svc_name, reason, message)
            if self.events is not None:
                self.events.record(by_name[svc_name], "Warning", reason, message)
        return p

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.run_once()
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.run_once()


async def run_repair(store: Store, allocator: ServiceAllocator, client_cfg: Any, interval: float,
                     system_services: Iterable[Callable[[], Awaitable[Any]]] = (), *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The loop as a server component: Warning events through an API client
    (`client_cfg`, a fleet.client.ClientConfig) and the one event recorder."""
    from fleet.client import Client
    from fleet.client.events import EventRecorder

    async with Client(client_cfg, user_agent="fleet-apiserver-repair") as client:
        events = EventRecorder(client, "ipallocator-repair-controller", senders=1)
        async with trio.open_nursery() as n:
            await n.start(events.run)
            await AllocationRepair(store, allocator, interval=interval, events=events,
                                   system_services=system_services).run(task_status=task_status)
