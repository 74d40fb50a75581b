"""System Services the server keeps: `default/kubernetes` (and, for the DNS part,
`kube-system/kube-dns`), each with a fixed ClusterIP and hand-made `v1 Endpoints`.

kube-apiserver's bootstrap controller creates the `kubernetes` Service and its
endpoint reconciler writes the Endpoints pointing at the API servers; Fleet does
both at every server start with `ensure_system_service`, and again at every pass
of the allocation repair loop (`svcrepair.run_repair`), so a deleted or edited
system Service comes back as with kube-apiserver's bootstrap controller.  Any
part of the server can use it for its own selector-less Service — in run.py, add
a `functools.partial` of it to the `system_services` list:

    await ensure_system_service(store, registry, allocator,
                                namespace="kube-system", name="kube-dns", cluster_ip="10.43.0.10",
                                ports=[{"name": "dns", "port": 53, "protocol": "UDP"},
                                       {"name": "dns-tcp", "port": 53, "protocol": "TCP"}],
                                endpoint_ips=["127.0.0.1"],
                                endpoint_ports=[{"name": "dns", "port": 5353, "protocol": "UDP"},
                                                {"name": "dns-tcp", "port": 5353, "protocol": "TCP"}],
                                labels={"k8s-app": "kube-dns"})

The Service is created when missing (its ClusterIP reserved through the Service
allocator, adopting an IPAddress a crash left pointing at it), its ports and
labels put back when they drifted; a Service holding another ClusterIP is left
as it is (the field is immutable) with a warning.  The Endpoints are created or
rewritten to exactly the given addresses and ports (the endpointslice-mirroring
controller turns them into EndpointSlices).  Store writes, no HTTP: this runs
before the API listens.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fleet.api.registry import Registry
from fleet.server.svcalloc import ServiceAllocator
from fleet.store import KeyExists, KeyNotFound, RevisionConflict, Store

log = logging.getLogger(__name__)

#: kube-apiserver's labels on the `kubernetes` Service.
KUBERNETES_LABELS = {"component": "apiserver", "provider": "kubernetes"}


async def ensure_system_service(store: Store, registry: Registry, allocator: ServiceAllocator, *,
                                namespace: str, name: str, cluster_ip: str,
                                ports: list[dict[str, Any]], endpoint_ips: list[str],
                                endpoint_ports: list[dict[str, Any]],
                                labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Create or repair a selector-less ClusterIP Service with a fixed `cluster_ip` and
    `ports` (each `{name, port, protocol, targetPort?}`), and its `v1 Endpoints`
    (`endpoint_ips` × `endpoint_ports`, each `{name, port, protocol}`).  Returns the
    stored Service.  Raises ValueError when `cluster_ip` is taken by another Service
    or outside the service CIDR."""
    svc_info = registry.get("", "v1", "services")
    ep_info = registry.get("", "v1", "endpoints")
    assert svc_info is not None and ep_info is not None
    want: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "ports": copy.deepcopy(ports), "sessionAffinity": "None"},
    }
    if svc_info.default is not None:
        svc_info.default(want)
    if not allocator.ip_range.contains(cluster_ip):
        raise ValueError(f"{namespace}/{name}: {allocator.ip_range.out_of_range_message(cluster_ip)}")
    want["spec"]["ipFamilies"] = [allocator.ip_range.family]
    key = svc_info.key(namespace, name)
    stored = await _ensure_service(store, allocator, key, want, cluster_ip)
    await _ensure_endpoints(store, ep_info.key(namespace, name), namespace, name, endpoint_ips, endpoint_ports,
                            dict(labels or {}))
    return stored


async def _ensure_service(store: Store, allocator: ServiceAllocator, key: str, want: dict[str, Any],
                          cluster_ip: str) -> dict[str, Any]:
    ns, name = want["metadata"]["namespace"], want["metadata"]["name"]
    for _ in range(5):
        try:
            cur = await store.get(key)
        except KeyNotFound:
            if not await allocator.take_ip(want, cluster_ip, adopt=True):
                raise ValueError(f"{ns}/{name}: the ClusterIP {cluster_ip} is allocated to another Service") from None
            try:
                return await store.create(key, copy.deepcopy(want))
            except KeyExists:
                continue
        spec = cur.get("spec") or {}
        if spec.get("clusterIP") != cluster_ip:
            log.warning("Service %s/%s has ClusterIP %s, not %s; leaving it (delete it to have it recreated)",
                        ns, name, spec.get("clusterIP"), cluster_ip)
            return cur
        # The ClusterIP it holds must be reserved (a restore from an old store...).
        await allocator.take_ip(cur, cluster_ip, adopt=True)
        new = copy.deepcopy(cur)
        new["spec"]["ports"] = want["spec"]["ports"]
        new["spec"]["type"] = "ClusterIP"
        new["spec"].pop("selector", None)
        md = new["metadata"]
        md["labels"] = {**(md.get("labels") or {}), **want["metadata"]["labels"]}
        if new == cur:
            return cur
        try:
            return await store.update(key, new, expected_revision=int(cur["metadata"]["resourceVersion"]))
        except (RevisionConflict, KeyNotFound):
            continue
    raise RuntimeError(f"could not ensure the Service {ns}/{name}: it kept changing")


async def _ensure_endpoints(store: Store, key: str, namespace: str, name: str, ips: list[str],
                            ports: list[dict[str, Any]], labels: dict[str, str]) -> None:
    subsets = []
    if ips:
        subsets = [{"addresses": [{"ip": ip} for ip in ips],
                    "ports": [{"protocol": "TCP", **p} for p in ports]}]
    want = {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": namespace, "labels": labels}, "subsets": subsets}
    for _ in range(5):
        try:
            cur = await store.get(key)
        except KeyNotFound:
            try:
                await store.create(key, want)
                return
            except KeyExists:
                continue
        if cur.get("subsets") == subsets and (cur["metadata"].get("labels") or {}) == labels:
            return
        new = copy.deepcopy(cur)
        new["subsets"] = subsets
        new["metadata"]["labels"] = labels
        try:
            await store.update(key, new, expected_revision=int(cur["metadata"]["resourceVersion"]))
            return
        except (RevisionConflict, KeyNotFound):
            continue
    raise RuntimeError(f"could not ensure the Endpoints {namespace}/{name}: they kept changing")


async def ensure_kubernetes_service(store: Store, registry: Registry, allocator: ServiceAllocator, *,
                                    advertise_address: str, port: int) -> dict[str, Any]:
    """`default/kubernetes`: ClusterIP the first address of the range, port 443 `https`
    → the API server's `port` at `advertise_address`."""
    return await ensure_system_service(
        store, registry, allocator, namespace="default", name="kubernetes",
        cluster_ip=allocator.ip_range.kubernetes_ip,
        ports=[{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
        endpoint_ips=[advertise_address],
        endpoint_ports=[{"name": "https", "port": port, "protocol": "TCP"}],
        labels=KUBERNETES_LABELS)


def default_advertise_address(listen: str) -> str:
    """kube-apiserver's default --advertise-address: the listen address, or, when it
    listens on every address, the address of the host's default-route interface
    (found by routing a UDP socket — nothing is sent), else 127.0.0.1."""
    if listen not in ("0.0.0.0", "::", ""):
        return "127.0.0.1" if listen == "localhost" else listen
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route lookup happens
            addr = s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    return addr if addr and addr != "0.0.0.0" else "127.0.0.1"


async def ensure_all(ensures: Iterable[Callable[[], Awaitable[Any]]]) -> None:
    """Run each ensure function; a failure (the address taken by a Service from an
    older range, a store conflict storm) is logged and the others still run."""
    for ensure in ensures:
        try:
            await ensure()
        except (ValueError, RuntimeError) as e:
            log.error("could not ensure a system Service: %s", e)


async def ensure_default_service_cidr(store: Store, registry: Registry, cidr: str) -> None:
    """The ServiceCIDR `kubernetes` holding the --service-cidr, status Ready."""
    from fleet.api import meta

    info = registry.get("networking.k8s.io", "v1", "servicecidrs")
    assert info is not None
    now = meta.now_rfc3339()
    obj = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
           "metadata": {"name": "kubernetes"}, "spec": {"cidrs": [cidr]},
           "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
                                      "message": "Kubernetes Service CIDR is ready",
                                      "lastTransitionTime": now}]}}
    try:
        await store.create(info.key(None, "kubernetes"), obj)
    except KeyExists:
        try:
            cur = await store.get(info.key(None, "kubernetes"))
        except KeyNotFound:
            return  # deleted this instant: the next pass recreates it
        if (cur.get("spec") or {}).get("cidrs") != [cidr]:
            log.warning("the default ServiceCIDR holds %s but --service-cidr is %s; Services get addresses "
                        "from %s", (cur.get("spec") or {}).get("cidrs"), cidr, cidr)
