"""What the service proxy reads from API objects: Services → `ServicePort`s,
EndpointSlices → `Endpoint`s, and which endpoints each traffic policy uses.

Pure and forgiving: anything malformed (a bad IP, protocol, port, or a name that is
not a DNS name and so could not be part of an nftables identifier) is skipped, never
raised — one bad object must not take the node's rules down.  The rules built from
these live in `fleet.network.proxy_rules`.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds: Kubernetes' default ClientIP timeout
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
PROTOCOLS = ("TCP", "UDP", "SCTP")


@dataclass(frozen=True)
class ServicePort:
    """One port of one Service, as the proxy sees it."""

    namespace: str
    name: str
    port_name: str
    protocol: str  # lower case: tcp, udp, sctp
    port: int
    cluster_ip: str
    node_port: int = 0
    external_ips: tuple[str, ...] = ()
    lb_ips: tuple[str, ...] = ()
    affinity_timeout: int | None = None  # seconds; None: no session affinity
    external_local: bool = False
    internal_local: bool = False

    @property
    def key(self) -> str:
        """`ns/name/proto/portname`: the base of every chain name of this port."""
        return f"{self.namespace}/{self.name}/{self.protocol}/{self.port_name}"

    @property
    def externally_accessible(self) -> bool:
        return bool(self.node_port or self.external_ips or self.lb_ips)

    @property
    def uses_cluster_endpoints(self) -> bool:
        return not self.internal_local or (self.externally_accessible and not self.external_local)

    @property
    def uses_local_endpoints(self) -> bool:
        return self.internal_local or (self.externally_accessible and self.external_local)


@dataclass(frozen=True, order=True)
class Endpoint:
    """One endpoint address:port of a service port."""

    ip: str
    port: int
    node_name: str = ""
    ready: bool = True
    serving: bool = True
    terminating: bool = False

    @property
    def addr(self) -> str:
        return f"{self.ip}:{self.port}"


def ipv4_or_none(value: Any) -> str | None:
    """`value` as a canonical IPv4 address, or None."""
    if not isinstance(value, str):
        return None
    return _ipv4_str(value)


@functools.lru_cache(maxsize=1 << 16)
def _ipv4_str(value: str) -> str | None:
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        return None


_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def _is_name(value: Any) -> bool:
    """A DNS-label/subdomain-like name (namespaces, Services, port names): safe inside
    nftables identifiers, which allow [A-Za-z0-9_./-]."""
    return isinstance(value, str) and len(value) <= 253 and _NAME.fullmatch(value) is not None


def _port(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        return None
    return value


def object_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata, or {} when it is not a mapping."""
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, list) else []


def service_ports(svc: Mapping[str, Any]) -> list[ServicePort]:
    """The proxied ports of a Service ([] for headless, ExternalName, malformed)."""
    md, spec, status = object_meta(svc), svc.get("spec"), svc.get("status")
    if not isinstance(spec, Mapping):
        return []
    status = status if isinstance(status, Mapping) else {}
    if spec.get("type") == "ExternalName":
        return []
    cluster_ip = ipv4_or_none(spec.get("clusterIP"))
    if cluster_ip is None:  # "None" (headless), "", missing, or IPv6 only
        return []
    ns, name = md.get("namespace") or "default", md.get("name")
    if not (_is_name(ns) and _is_name(name)):
        return []  # the API never stores these; they would not make nft identifiers
    external_ips = tuple(sorted({ip for ip in map(ipv4_or_none, spec.get("externalIPs") or []) if ip}))
    lb_ips: tuple[str, ...] = ()
    if spec.get("type") == "LoadBalancer":
        ingress = _dicts((status.get("loadBalancer") or {}).get("ingress")
                         if isinstance(status.get("loadBalancer"), Mapping) else None)
        lb_ips = tuple(sorted({ip for ip in (ipv4_or_none(i.get("ip")) for i in ingress) if ip}))
    timeout = None
    if spec.get("sessionAffinity") == "ClientIP":
        cfg = spec.get("sessionAffinityConfig")
        client = cfg.get("clientIP") if isinstance(cfg, Mapping) else None
        t = client.get("timeoutSeconds") if isinstance(client, Mapping) else None
        timeout = t if isinstance(t, int) and not isinstance(t, bool) and t > 0 else DEFAULT_AFFINITY_TIMEOUT
    node_ports_allowed = spec.get("type") in ("NodePort", "LoadBalancer")
    out = []
    for p in _dicts(spec.get("ports")):
        proto = p.get("protocol") or "TCP"
        port = _port(p.get("port"))
        port_name = p.get("name") or ""
        if proto not in PROTOCOLS or port is None or not (port_name == "" or _is_name(port_name)):
            continue
        node_port = _port(p.get("nodePort")) if node_ports_allowed else None
        out.append(ServicePort(
            namespace=ns, name=name, port_name=port_name,
            protocol=proto.lower(), port=port, cluster_ip=cluster_ip,
            node_port=node_port or 0, external_ips=external_ips, lb_ips=lb_ips,
            affinity_timeout=timeout,
            external_local=spec.get("externalTrafficPolicy") == "Local" and (
                bool(node_port) or bool(external_ips) or bool(lb_ips)),
            internal_local=spec.get("internalTrafficPolicy") == "Local"))
    return out


def _condition(conds: Mapping[str, Any], name: str, default: bool) -> bool:
    v = conds.get(name)
    return v if isinstance(v, bool) else default


def slice_endpoints(es: Mapping[str, Any], port_name: str, protocol: str) -> list[Endpoint]:
    """The endpoints one EndpointSlice gives the service port (`port_name`, `protocol`)."""
    if es.get("addressType") != "IPv4":
        return []
    target = None
    for p in _dicts(es.get("ports")):
        if str(p.get("name") or "") == port_name and str(p.get("protocol") or "TCP").lower() == protocol:
            target = _port(p.get("port"))
            break
    if target is None:
        return []
    out = []
    for ep in _dicts(es.get("endpoints")):
        addrs = ep.get("addresses")
        ip = ipv4_or_none(addrs[0]) if isinstance(addrs, list) and addrs else None
        if ip is None:
            continue
        conds = ep.get("conditions") if isinstance(ep.get("conditions"), Mapping) else {}
        ready = _condition(conds, "ready", True)
        out.append(Endpoint(ip=ip, port=target, node_name=str(ep.get("nodeName") or ""),
                            ready=ready, serving=_condition(conds, "serving", ready),
                            terminating=_condition(conds, "terminating", False)))
    return out


def slices_by_service(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """EndpointSlices grouped by (namespace, kubernetes.io/service-name)."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for es in slices:
        md = object_meta(es)
        labels = md.get("labels") if isinstance(md.get("labels"), Mapping) else {}
        svc = labels.get(LABEL_SERVICE_NAME)
        if isinstance(svc, str) and svc:
            out.setdefault((str(md.get("namespace") or "default"), svc), []).append(es)
    return out


def port_endpoints(sp: ServicePort, slices: Sequence[Mapping[str, Any]]) -> list[Endpoint]:
    """Every endpoint of `sp` across its slices, one per address:port, sorted."""
    seen: dict[tuple[str, int], Endpoint] = {}
    for es in sorted(slices, key=lambda s: str(object_meta(s).get("name") or "")):
        for ep in slice_endpoints(es, sp.port_name, sp.protocol):
            seen.setdefault((ep.ip, ep.port), ep)
    return sorted(seen.values())


@dataclass(frozen=True)
class Categorized:
    """The endpoints each traffic policy uses, and whether any is usable anywhere."""

    cluster: tuple[Endpoint, ...]
    local: tuple[Endpoint, ...]
    has_any: bool


def categorize(endpoints: Sequence[Endpoint], node_name: str) -> Categorized:
    """Ready endpoints, else serving+terminating ones — per policy, as kube-proxy does."""
    def pick(eps: Sequence[Endpoint]) -> tuple[Endpoint, ...]:
        ready = tuple(e for e in eps if e.ready)
        return ready or tuple(e for e in eps if e.serving and e.terminating)

    cluster = pick(endpoints)
    local = pick([e for e in endpoints if node_name and e.node_name == node_name])
    return Categorized(cluster=cluster, local=local, has_any=bool(cluster))


__all__ = [
    "DEFAULT_AFFINITY_TIMEOUT",
    "LABEL_SERVICE_NAME",
    "PROTOCOLS",
    "Categorized",
    "Endpoint",
    "ServicePort",
    "categorize",
    "ipv4_or_none",
    "object_meta",
    "port_endpoints",
    "service_ports",
    "slice_endpoints",
    "slices_by_service",
]
