"""ClusterIP and NodePort allocation for Services: the Service's `AllocationStrategy`.

Uniqueness comes from the store, never from memory: an allocated ClusterIP is an
`IPAddress` object (networking.k8s.io/v1, named by the IP, `spec.parentRef` the
Service — Kubernetes' KEP-1880 allocator) and an allocated NodePort is one
internal key per port under `PORT_PREFIX` (not an API resource).  The store's
create is create-if-absent, so the allocator takes a value by creating its key
*before* the Service is written: two concurrent creates can never get the same
value (the loser gets KeyExists and tries another), and a crash between the two
writes leaves only a reservation without a Service, which the repair loop
(`svcrepair.py`) removes.  Watch-fed caches of both prefixes only steer the
search away from taken values; the store create decides.

Which Services get what (kube's rules): every type but ExternalName gets a
ClusterIP unless it is headless (`clusterIP: None`); NodePort and LoadBalancer
Services get a NodePort per port (LoadBalancer not when
`allocateLoadBalancerNodePorts: false`, except the ports asked for by value); a
LoadBalancer with `externalTrafficPolicy: Local` gets a `healthCheckNodePort`.
A requested value is honoured when free and in range, else 422 with
kube-apiserver's message; an exhausted range is a 500 naming the range.
Updates keep what the object holds (`prepare_service_update` in
fleet/api/kinds/core.py carries it over), allocate what is new and release, on
commit, what the new object no longer holds; a delete releases everything.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from typing import Any

import trio

from fleet.api import errors
from fleet.api import validation as v
from fleet.api.kinds import networking
from fleet.api.meta import store_key
from fleet.server.allocation import Transaction
from fleet.server.svcalloc_range import PortRange, ServiceIPRange
from fleet.store import KeyExists, KeyNotFound, RevisionConflict, Store
from fleet.store.watchcache import WatchCache

log = logging.getLogger(__name__)

IP_PREFIX = store_key(networking.GROUP, "ipaddresses", None)
#: One key per allocated NodePort; not served by the API (like kube's bitmap in etcd).
PORT_PREFIX = "/fleet.internal/servicenodeports/"


def ip_key(ip: str) -> str:
    return IP_PREFIX + ip


def port_key(port: int) -> str:
    return PORT_PREFIX + str(port)


def parent_of(svc: dict[str, Any]) -> dict[str, str]:
    md = svc.get("metadata") or {}
    return {"group": "", "resource": "services", "namespace": str(md.get("namespace") or ""),
            "name": str(md.get("name") or "")}


def ip_address_object(ip: str, svc: dict[str, Any], family: str = "IPv4") -> dict[str, Any]:
    return {
        "apiVersion": f"{networking.GROUP}/v1", "kind": "IPAddress",
        "metadata": {"name": ip, "labels": {networking.LABEL_IP_FAMILY: family,
                                            networking.LABEL_MANAGED_BY: networking.MANAGED_BY_ALLOCATOR}},
        "spec": {"parentRef": parent_of(svc)},
    }


def port_reservation(port: int, svc: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": str(port)}, "parentRef": parent_of(svc)}


def owner_of(reservation: dict[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the Service a reservation (IPAddress or port) belongs to."""
    ref = reservation.get("parentRef")
    if ref is None:
        ref = (reservation.get("spec") or {}).get("parentRef")
    if not isinstance(ref, dict) or ref.get("resource") != "services" or ref.get("group") not in ("", None):
        return None
    return str(ref.get("namespace") or ""), str(ref.get("name") or "")


# ----------------------------------------------------------------- what a Service holds


def wants_cluster_ip(spec: dict[str, Any]) -> bool:
    return spec.get("type", "ClusterIP") != "ExternalName" and spec.get("clusterIP") != "None"


def cluster_ips(svc: dict[str, Any]) -> list[str]:
    """The allocated ClusterIPs a stored Service holds ("None" and "" are not addresses)."""
    spec = svc.get("spec") or {}
    if not wants_cluster_ip(spec):
        return []
    ips = [str(i) for i in spec.get("clusterIPs") or [] if i not in ("", "None")]
    if not ips and spec.get("clusterIP") not in (None, "", "None"):
        ips = [str(spec["clusterIP"])]
    return ips


def wants_node_ports(spec: dict[str, Any]) -> bool:
    t = spec.get("type", "ClusterIP")
    return t == "NodePort" or (t == "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts") is not False)


def wants_health_check_port(spec: dict[str, Any]) -> bool:
    return spec.get("type") == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"


def node_ports(svc: dict[str, Any]) -> set[int]:
    """Every NodePort (and the healthCheckNodePort) a stored Service holds."""
    spec = svc.get("spec") or {}
    out: set[int] = set()
    if spec.get("type") in ("NodePort", "LoadBalancer"):
        for p in spec.get("ports") or []:
            if isinstance(p, dict) and isinstance(p.get("nodePort"), int) and p["nodePort"] > 0:
                out.add(p["nodePort"])
    hc = spec.get("healthCheckNodePort")
    if wants_health_check_port(spec) and isinstance(hc, int) and hc > 0:
        out.add(hc)
    return out


def _invalid(svc: dict[str, Any], causes: list[dict[str, str]]) -> errors.Invalid:
    return errors.Invalid.for_object("Service", "", str((svc.get("metadata") or {}).get("name") or ""), causes)


class ServiceAllocator:
    """The allocation strategy of `v1 Service` (see the module docstring)."""

    def __init__(self, store: Store, ip_range: ServiceIPRange, port_range: PortRange,
                 *, rng: random.Random | None = None) -> None:
        self.store = store
        self.ip_range = ip_range
        self.port_range = port_range
        self.rng = rng or random.Random()
        self.ip_cache = WatchCache(IP_PREFIX)
        self.port_cache = WatchCache(PORT_PREFIX)
        # Keys taken by requests whose Service write has not finished: the repair
        # loop never takes these for leaks.
        self.pending: set[str] = set()

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the caches current; started once both listed."""
        async with trio.open_nursery() as n:
            await n.start(self.ip_cache.run, store)
            await n.start(self.port_cache.run, store)
            task_status.started()

    # ------------------------------------------------------------------ the hooks
    async def before_create(self, obj: dict[str, Any], *, dry_run: bool) -> Transaction:
        txn = Transaction()
        try:
            await self._allocate(obj, None, txn, dry_run=dry_run)
        except BaseException:
            await txn.revert()
            raise
        return txn

    async def before_update(self, old: dict[str, Any], new: dict[str, Any], *, dry_run: bool) -> Transaction:
        txn = Transaction()
        try:
            await self._allocate(new, old, txn, dry_run=dry_run)
        except BaseException:
            await txn.revert()
            raise
        if not dry_run:
            for ip in set(cluster_ips(old)) - set(cluster_ips(new)):
                txn.on_commit.append(partial(self.release_ip, ip, old))
            for port in node_ports(old) - node_ports(new):
                txn.on_commit.append(partial(self.release_port, port, old))
        return txn

    async def after_delete(self, obj: dict[str, Any]) -> None:
        with trio.CancelScope(shield=True):  # the Service is gone: release whatever happens
            for ip in cluster_ips(obj):
                await self.release_ip(ip, obj)
            for port in node_ports(obj):
                await self.release_port(port, obj)

    # -------------------------------------------------------------- cluster IPs
    async def _allocate(self, svc: dict[str, Any], old: dict[str, Any] | None, txn: Transaction, *,
                        dry_run: bool) -> None:
        spec = svc.setdefault("spec", {})
        await self._allocate_cluster_ip(svc, spec, old, txn, dry_run=dry_run)
        await self._allocate_node_ports(svc, spec, old, txn, dry_run=dry_run)

    async def _allocate_cluster_ip(self, svc: dict[str, Any], spec: dict[str, Any], old: dict[str, Any] | None,
                                   txn: Transaction, *, dry_run: bool) -> None:
        if spec.get("type", "ClusterIP") == "ExternalName":
            for f in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                spec.pop(f, None)
            return
        requested = str(spec.get("clusterIP") or "")
        ips = [str(i) for i in spec.get("clusterIPs") or []]
        if not requested and ips:
            requested = ips[0]
        if ips and ips[0] != requested:
            raise _invalid(svc, [v.invalid("spec.clusterIPs[0]", ips[0], "must match `spec.clusterIP` "
                                                                           f"{requested}")])
        if len(ips) > 1:
            raise _invalid(svc, [v.invalid("spec.clusterIPs", ips, "this cluster is single-stack "
                                                                   f"({self.ip_range.family}): at most one "
                                                                   "IP may be given")])
        if spec.get("ipFamilyPolicy") == "RequireDualStack":
            raise _invalid(svc, [v.invalid("spec.ipFamilyPolicy", "RequireDualStack",
                                           "this cluster is not configured for dual-stack services")])
        for i, fam in enumerate(spec.get("ipFamilies") or []):
            if fam != self.ip_range.family:
                raise _invalid(svc, [v.invalid(f"spec.ipFamilies[{i}]", fam, "not configured on this cluster")])
        spec["ipFamilies"] = [self.ip_range.family]
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        if requested == "None":
            spec["clusterIP"], spec["clusterIPs"] = "None", ["None"]
            return
        held = cluster_ips(old) if old is not None else []
        if requested and requested in held:
            spec["clusterIP"], spec["clusterIPs"] = requested, [requested]
            return
        if requested:
            await self._take_requested_ip(svc, requested, txn, dry_run=dry_run)
            ip = requested
        else:
            ip = await self._take_next_ip(svc, txn, dry_run=dry_run)
        spec["clusterIP"], spec["clusterIPs"] = ip, [ip]

    async def _take_requested_ip(self, svc: dict[str, Any], ip: str, txn: Transaction, *, dry_run: bool) -> None:
        def refuse(why: str) -> errors.Invalid:
            return _invalid(svc, [v.invalid("spec.clusterIPs", [ip], f"failed to allocate IP {ip}: {why}")])

        if not self.ip_range.contains(ip):
            raise refuse(self.ip_range.out_of_range_message(ip))
        if dry_run:
            if ip in self.ip_cache or await self._exists(ip_key(ip)):
                raise refuse("provided IP is already allocated")
            return
        if not await self._reserve(txn, ip_key(ip), ip_address_object(ip, svc, self.ip_range.family),
                                   partial(self.release_ip, ip, svc)):
            raise refuse("provided IP is already allocated")

    async def _take_next_ip(self, svc: dict[str, Any], txn: Transaction, *, dry_run: bool) -> str:
        for ip in self.ip_range.candidates(self.rng):
            if ip in self.ip_cache:
                continue
            if dry_run:
                return ip
            if await self._reserve(txn, ip_key(ip), ip_address_object(ip, svc, self.ip_range.family),
                                   partial(self.release_ip, ip, svc)):
                return ip
            # taken since the cache last heard: try the next one
        raise errors.InternalError("Internal error occurred: failed to allocate a serviceIP: range is full "
                                   f"(every address of the service CIDR {self.ip_range.cidr} is allocated)")

    async def take_ip(self, svc: dict[str, Any], ip: str, *, adopt: bool = True) -> bool:
        """Reserve `ip` for `svc` outside a request (system Services at start-up, the
        repair loop).  True when it is now `svc`'s; with `adopt` an IPAddress already
        pointing at `svc` (left by a crash) counts as its own."""
        try:
            await self.store.create(ip_key(ip), ip_address_object(ip, svc, self.ip_range.family))
            return True
        except KeyExists:
            if not adopt:
                return False
        try:
            existing = await self.store.get(ip_key(ip))
        except KeyNotFound:
            return await self.take_ip(svc, ip, adopt=False)
        return owner_of(existing) == _name_of(svc)

    async def release_ip(self, ip: str, svc: dict[str, Any]) -> None:
        """Delete the IPAddress of `ip` if it still belongs to `svc`."""
        await self._release(ip_key(ip), svc)

    # --------------------------------------------------------------- node ports
    async def _allocate_node_ports(self, svc: dict[str, Any], spec: dict[str, Any], old: dict[str, Any] | None,
                                   txn: Transaction, *, dry_run: bool) -> None:
        held = node_ports(old) if old is not None else set()
        ports = [p for p in spec.get("ports") or [] if isinstance(p, dict)]
        t = spec.get("type", "ClusterIP")
        taken_here: set[int] = set()

        async def take(port: int, path: str) -> None:
            if port in held or port in taken_here:
                taken_here.add(port)
                return
            if not self.port_range.contains(port):
                raise _invalid(svc, [v.invalid(path, port, self.port_range.out_of_range_message())])
            if dry_run:
                if str(port) in self.port_cache or await self._exists(port_key(port)):
                    raise _invalid(svc, [v.invalid(path, port, "provided port is already allocated")])
                taken_here.add(port)
                return
            if not await self._reserve(txn, port_key(port), port_reservation(port, svc),
                                       partial(self.release_port, port, svc)):
                raise _invalid(svc, [v.invalid(path, port, "provided port is already allocated")])
            taken_here.add(port)

        async def take_next() -> int:
            for port in self.port_range.candidates(self.rng):
                if port in taken_here or str(port) in self.port_cache:
                    continue
                if dry_run:
                    taken_here.add(port)
                    return port
                if await self._reserve(txn, port_key(port), port_reservation(port, svc),
                                       partial(self.release_port, port, svc)):
                    taken_here.add(port)
                    return port
            raise errors.InternalError("Internal error occurred: failed to allocate a nodePort: range is full "
                                       f"(every port of the node port range {self.port_range} is allocated)")

        if t in ("NodePort", "LoadBalancer"):
            for i, p in enumerate(ports):
                np = p.get("nodePort")
                if isinstance(np, int) and np > 0:
                    await take(np, f"spec.ports[{i}].nodePort")
            if wants_node_ports(spec):
                # Ports with the same number (53/UDP and 53/TCP) share one NodePort,
                # the one asked for on either if any (kube's initNodePorts).
                by_port: dict[Any, int] = {p.get("port"): p["nodePort"] for p in ports
                                           if isinstance(p.get("nodePort"), int) and p["nodePort"] > 0}
                for p in ports:
                    if not (isinstance(p.get("nodePort"), int) and p["nodePort"] > 0):
                        if p.get("port") not in by_port:
                            by_port[p.get("port")] = await take_next()
                        p["nodePort"] = by_port[p.get("port")]
        else:
            for p in ports:
                p.pop("nodePort", None)
        if wants_health_check_port(spec):
            hc = spec.get("healthCheckNodePort")
            if isinstance(hc, int) and hc > 0:
                await take(hc, "spec.healthCheckNodePort")
            else:
                spec["healthCheckNodePort"] = await take_next()
        else:
            spec.pop("healthCheckNodePort", None)

    async def take_port(self, svc: dict[str, Any], port: int) -> bool:
        """Reserve `port` for `svc` outside a request (the repair loop)."""
        try:
            await self.store.create(port_key(port), port_reservation(port, svc))
            return True
        except KeyExists:
            return False

    async def release_port(self, port: int, svc: dict[str, Any]) -> None:
        await self._release(port_key(port), svc)

    # ------------------------------------------------------------------ helpers
    async def _reserve(self, txn: Transaction, key: str, obj: dict[str, Any], release: Any) -> bool:
        """Create `key` (False if it exists); pending until the transaction ends."""
        self.pending.add(key)
        try:
            await self.store.create(key, obj)
        except BaseException as e:
            self.pending.discard(key)
            if isinstance(e, KeyExists):
                return False
            raise

        async def settled() -> None:
            self.pending.discard(key)

        txn.on_revert.append(release)
        txn.on_revert.append(settled)
        txn.on_commit.append(settled)
        return True

    async def _exists(self, key: str) -> bool:
        try:
            await self.store.get(key)
        except KeyNotFound:
            return False
        return True

    async def _release(self, key: str, svc: dict[str, Any]) -> None:
        for _ in range(3):
            try:
                cur = await self.store.get(key)
            except KeyNotFound:
                return
            if owner_of(cur) != _name_of(svc):
                return  # somebody else's by now
            try:
                await self.store.delete(key, expected_revision=int(cur["metadata"]["resourceVersion"]))
                return
            except KeyNotFound:
                return
            except RevisionConflict:
                continue
        log.warning("could not release %s of %s/%s (kept changing); the repair loop will", key,
                    *_name_of(svc))


def _name_of(svc: dict[str, Any]) -> tuple[str, str]:
    md = svc.get("metadata") or {}
    return str(md.get("namespace") or ""), str(md.get("name") or "")
