"""Ensure a system Service and its hand-made `v1 Endpoints` exist (kube-dns).

kube-apiserver keeps the `kubernetes` Service and its Endpoints itself; the cluster
DNS Service (`kube-system/kube-dns`) is served by Fleet's server the same way: a
selector-less Service with a fixed ClusterIP, and `v1 Endpoints` naming the
server's address, which the endpointslice-mirroring controller turns into
EndpointSlices.  Both through the API (so ClusterIP allocation and validation see
them), idempotent, repaired at every start: missing objects are created, ports,
labels and addresses that drifted are put back; a ClusterIP that differs (it is
immutable) is logged, not fought over.

`plan_service` / `endpoints_differ` are the pure decisions; `ensure_system_service` the
I/O, through the API (it runs after the DNS listener has its port).  The ClusterIP
allocator's store-side `ensure_system_service` (for `kubernetes`) takes the same
keywords: `fleet.network.cluster_dns.kube_dns_spec(cfg)` feeds either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.client import ApiException, Client

log = logging.getLogger(__name__)


def desired_service(namespace: str, name: str, cluster_ip: str, ports: Sequence[Mapping[str, Any]],
                    labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": namespace, "name": name, "labels": dict(labels)},
            "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                     "ports": [dict(p) for p in ports]}}


def desired_endpoints(namespace: str, name: str, addresses: Sequence[str],
                      ports: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> dict[str, Any]:
    """Endpoints: every address on every port ({name, port, protocol})."""
    eports = [{"name": p["name"], "port": int(p["port"]), "protocol": p.get("protocol") or "TCP"}
              for p in ports]
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"namespace": namespace, "name": name, "labels": dict(labels)},
            "subsets": [{"addresses": [{"ip": a} for a in addresses], "ports": eports}]
            if addresses else []}


def plan_service(current: dict[str, Any] | None, want: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that brings `current` to `want` (None: nothing to do). Creation is
    the caller's when `current` is None."""
    if current is None:
        return None
    patch: dict[str, Any] = {}
    labels = (current.get("metadata") or {}).get("labels") or {}
    missing = {k: v for k, v in want["metadata"]["labels"].items() if labels.get(k) != v}
    if missing:
        patch["metadata"] = {"labels": missing}
    spec = current.get("spec") or {}
    if _ports(spec.get("ports")) != _ports(want["spec"]["ports"]):
        patch["spec"] = {"ports": want["spec"]["ports"]}
    return patch or None


def _ports(ports: Any) -> list[tuple[Any, ...]]:
    return sorted((str(p.get("name")), p.get("port"), p.get("protocol") or "TCP",
                   str(p.get("targetPort") or p.get("port")))
                  for p in ports or [] if isinstance(p, dict))


def endpoints_differ(current: dict[str, Any], want: dict[str, Any]) -> bool:
    def norm(subsets: Any) -> list[tuple[Any, ...]]:
        out = []
        for ss in subsets or []:
            ips = sorted(a.get("ip") for a in ss.get("addresses") or [])
            ps = sorted((p.get("name"), p.get("port"), p.get("protocol") or "TCP")
                        for p in ss.get("ports") or [])
            out.append((tuple(ips), tuple(ps)))
        return sorted(out)

    labels = (current.get("metadata") or {}).get("labels") or {}
    return norm(current.get("subsets")) != norm(want.get("subsets")) or any(
        labels.get(k) != v for k, v in want["metadata"]["labels"].items())


async def ensure_system_service(client: Client, *, namespace: str, name: str, cluster_ip: str,
                                ports: Sequence[Mapping[str, Any]], endpoint_ips: Sequence[str],
                                endpoint_ports: Sequence[Mapping[str, Any]],
                                labels: Mapping[str, str] | None = None) -> None:
    """Create or repair `namespace/name`: the Service (`ports`: {name, port, protocol,
    targetPort}) and its Endpoints (`endpoint_ips` × `endpoint_ports`: {name, port,
    protocol}). The keyword shape of fleet/server/systemsvc.py's store-side function."""
    labels = dict(labels or {})
    want = desired_service(namespace, name, cluster_ip, ports, labels)
    try:
        current = await client.get_object("v1", "services", name, namespace)
    except ApiException as e:
        if e.code != 404:
            raise
        current = None
    if current is None:
        try:
            await client.create("v1", "services", want, namespace)
            log.info("created system Service %s/%s (%s)", namespace, name, cluster_ip)
        except ApiException as e:
            if e.code != 409:
                raise
    else:
        have_ip = (current.get("spec") or {}).get("clusterIP")
        if have_ip != cluster_ip:
            log.warning("system Service %s/%s has ClusterIP %s, not %s (ClusterIPs are immutable: "
                        "delete it to move it)", namespace, name, have_ip, cluster_ip)
        patch = plan_service(current, want)
        if patch is not None:
            await client.patch("v1", "services", name, patch, namespace=namespace)
    want_ep = desired_endpoints(namespace, name, endpoint_ips, endpoint_ports, labels)
    try:
        cur_ep = await client.get_object("v1", "endpoints", name, namespace)
    except ApiException as e:
        if e.code != 404:
            raise
        await client.create("v1", "endpoints", want_ep, namespace)
        return
    if endpoints_differ(cur_ep, want_ep):
        body = dict(want_ep)
        body["metadata"] = {**want_ep["metadata"],
                            "resourceVersion": (cur_ep.get("metadata") or {}).get("resourceVersion")}
        await client.replace("v1", "endpoints", name, body, namespace)


__all__ = ["desired_endpoints", "desired_service", "endpoints_differ", "ensure_system_service",
           "plan_service"]
