"""The legacy `v1 Endpoints` controller's decision, pure (Kubernetes'
pkg/controller/endpoint and pkg/api/v1/endpoints):

* **Addresses.**  Each selected pod with an address that has not finished gives one
  address per Service port it serves (`find_port`): `addresses` when it is Ready —
  or always with `publishNotReadyAddresses` —, `notReadyAddresses` otherwise.  A
  terminating pod is left out unless the Service publishes not-ready addresses.
  Each address has `ip`, `nodeName`, `targetRef` to the pod and, when the pod's
  subdomain is the Service, `hostname`.  A headless Service without ports publishes
  bare addresses.
* **Canonical form** (`repack_subsets`, RepackSubsets): the same address set of
  several ports becomes one subset with those ports; an address not ready for one
  port is not ready for all; everything sorted, so equal contents compare equal.
* **Capacity** (`truncate`): at most 1000 addresses; beyond that ready ones are kept
  first, shared among the subsets in proportion, and the object carries
  `endpoints.kubernetes.io/over-capacity: truncated`.
* **What is written** (`plan_endpoints`): nothing when subsets, labels (the Service's,
  plus `service.kubernetes.io/headless` without a cluster IP) and the over-capacity
  annotation are already right; else the whole object, with the last-change trigger
  time annotation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from typing import Any

from fleet.api.conditions import is_pod_ready
from fleet.controllers.endpoints_util import (
    LABEL_HEADLESS,
    LAST_CHANGE_TRIGGER_TIME,
    OVER_CAPACITY,
    find_port,
    is_ipv6,
    is_service_ip_set,
    meta_of,
    pod_ips,
    selects,
    should_pod_be_in_endpoints,
    should_set_hostname,
    spec_of,
)

MAX_CAPACITY = 1000
TRUNCATED = "truncated"

Obj = Mapping[str, Any]


def _address_family(service: Obj, pod: Obj) -> str:
    """podToEndpointAddressForService's family: the Service's first ipFamily, its
    cluster IP's, or — headless — the pod's primary IP's."""
    fams = spec_of(service).get("ipFamilies")
    if isinstance(fams, list) and fams:
        return str(fams[0])
    if is_service_ip_set(service):
        return "IPv6" if is_ipv6(spec_of(service).get("clusterIP")) else "IPv4"
    ips = pod_ips(pod)
    return "IPv6" if ips and is_ipv6(ips[0]) else "IPv4"


def pod_address(service: Obj, pod: Obj) -> dict[str, Any] | None:
    """The pod's EndpointAddress for the Service (None: no IP of its family)."""
    family = _address_family(service, pod)
    ip = next((i for i in pod_ips(pod) if is_ipv6(i) == (family == "IPv6")), None)
    if ip is None:
        return None
    md = meta_of(pod)
    addr: dict[str, Any] = {"ip": ip}
    if should_set_hostname(pod, service):
        addr["hostname"] = spec_of(pod)["hostname"]
    if spec_of(pod).get("nodeName"):
        addr["nodeName"] = spec_of(pod)["nodeName"]
    addr["targetRef"] = {"kind": "Pod", "namespace": md.get("namespace"), "name": md.get("name"),
                         "uid": md.get("uid")}
    return addr


def _port(sp: Mapping[str, Any], num: int) -> dict[str, Any]:
    p: dict[str, Any] = {"port": num, "protocol": str(sp.get("protocol") or "TCP")}
    if sp.get("name"):
        p["name"] = str(sp["name"])
    if sp.get("appProtocol"):
        p["appProtocol"] = sp["appProtocol"]
    return p


def desired_subsets(service: Obj, pods: Iterable[Obj]) -> list[dict[str, Any]]:
    """One subset per (pod, port), repacked (see the module docstring)."""
    publish = bool(spec_of(service).get("publishNotReadyAddresses"))
    service_ports = [p for p in spec_of(service).get("ports") or [] if isinstance(p, Mapping)]
    headless = spec_of(service).get("clusterIP") == "None"
    raw: list[dict[str, Any]] = []
    for pod in pods:
        if not selects(service, pod) or not should_pod_be_in_endpoints(pod, publish):
            continue
        addr = pod_address(service, pod)
        if addr is None:
            continue
        which = "addresses" if publish or is_pod_ready(pod) else "notReadyAddresses"
        if not service_ports:
            if headless:
                raw.append({which: [addr]})
            continue
        for sp in service_ports:
            num = find_port(pod, sp)
            if num is not None:
                raw.append({which: [addr], "ports": [_port(sp, num)]})
    return repack_subsets(raw)


# ---------------------------------------------------------------------------------------
# RepackSubsets


def _addr_id(addr: Mapping[str, Any]) -> tuple[str, str]:
    ref = addr.get("targetRef") if isinstance(addr.get("targetRef"), Mapping) else {}
    return str(addr.get("ip") or ""), str(ref.get("uid") or "")


def _port_id(port: Mapping[str, Any]) -> tuple[str, int, str, str]:
    return (str(port.get("name") or ""), int(port.get("port") or 0), str(port.get("protocol") or "TCP"),
            str(port.get("appProtocol") or ""))


def _port_sort(port: Mapping[str, Any]) -> tuple[Any, ...]:
    name, num, proto, app = _port_id(port)
    return (num, proto, name, app)


def _addr_sort(addr: Mapping[str, Any]) -> tuple[bytes, str]:
    """LessEndpointAddress: by IP (as bytes), then target uid."""
    ip, uid = _addr_id(addr)
    return ip.encode(), uid


def repack_subsets(subsets: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """RepackSubsets: the canonical layout (see the module docstring)."""
    all_addrs: dict[tuple[str, str], dict[str, Any]] = {}
    # port id (None: the no-port sentinel) -> {address id: ready}
    by_port: dict[tuple[str, int, str, str] | None, dict[tuple[str, str], bool]] = {}
    port_objs: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    for ss in subsets:
        if not isinstance(ss, Mapping):
            continue
        ports = [p for p in ss.get("ports") or [] if isinstance(p, Mapping)]
        port_ids: list[tuple[str, int, str, str] | None] = []
        for p in ports:
            pid = _port_id(p)
            port_objs.setdefault(pid, dict(p))
            port_ids.append(pid)
        if not port_ids:
            port_ids = [None]
        for key, ready in (("addresses", True), ("notReadyAddresses", False)):
            for a in ss.get(key) or []:
                if not isinstance(a, Mapping):
                    continue
                aid = _addr_id(a)
                all_addrs.setdefault(aid, copy.deepcopy(dict(a)))
                for pid in port_ids:
                    seen = by_port.setdefault(pid, {})
                    # not ready trumps ready
                    if seen.get(aid, True):
                        seen[aid] = ready
    # Group the ports that have exactly the same addresses (with the same readiness).
    groups: dict[frozenset[tuple[tuple[str, str], bool]], list[tuple[str, int, str, str] | None]] = {}
    for pid, addrs in by_port.items():
        groups.setdefault(frozenset(addrs.items()), []).append(pid)
    out: list[dict[str, Any]] = []
    for addrs, pids in groups.items():
        ready = sorted((all_addrs[a] for a, r in addrs if r), key=_addr_sort)
        not_ready = sorted((all_addrs[a] for a, r in addrs if not r), key=_addr_sort)
        ss: dict[str, Any] = {}
        if ready:
            ss["addresses"] = ready
        if not_ready:
            ss["notReadyAddresses"] = not_ready
        ports = sorted((port_objs[p] for p in pids if p is not None), key=_port_sort)
        if ports:
            ss["ports"] = ports
        out.append(ss)
    return sort_subsets(out)


def sort_subsets(subsets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SortSubsets' purpose — one order for equal contents — with our own key."""
    def key(ss: Mapping[str, Any]) -> tuple[Any, ...]:
        return (tuple(_port_sort(p) for p in ss.get("ports") or []),
                tuple(_addr_sort(a) for a in ss.get("addresses") or []),
                tuple(_addr_sort(a) for a in ss.get("notReadyAddresses") or []))
    return sorted(subsets, key=key)


# ---------------------------------------------------------------------------------------
# Capacity


def count_addresses(subsets: Iterable[Mapping[str, Any]]) -> int:
    return sum(len(ss.get("addresses") or []) + len(ss.get("notReadyAddresses") or []) for ss in subsets)


def truncate(subsets: list[dict[str, Any]], max_capacity: int = MAX_CAPACITY) -> tuple[list[dict[str, Any]], bool]:
    """truncateEndpoints: at most `max_capacity` addresses, ready ones first, each subset
    keeping its share (rounded up, the last ones taking what is left).  Returns the
    subsets and whether anything was cut."""
    ready_total = sum(len(ss.get("addresses") or []) for ss in subsets)
    not_ready_total = sum(len(ss.get("notReadyAddresses") or []) for ss in subsets)
    if ready_total + not_ready_total <= max_capacity:
        return subsets, False
    cut_ready = ready_total > max_capacity
    room = max_capacity if cut_ready else max_capacity - ready_total
    total = ready_total if cut_ready else not_ready_total
    left = room
    out: list[dict[str, Any]] = []
    for ss in subsets:
        ss = dict(ss)
        field = "addresses" if cut_ready else "notReadyAddresses"
        items = list(ss.get(field) or [])
        share = math.ceil(len(items) / total * room) if total else 0
        share = min(share, left)
        items = items[:share]
        if items:
            ss[field] = items
        else:
            ss.pop(field, None)
        if cut_ready:
            ss.pop("notReadyAddresses", None)
        left -= len(items)
        out.append(ss)
    return out, True


# ---------------------------------------------------------------------------------------
# The plan


def _canonical(subsets: Any) -> list[dict[str, Any]]:
    """Stored subsets in the canonical layout, targetRef resourceVersions aside
    (endpointSubsetsEqualIgnoreResourceVersion)."""
    subsets = copy.deepcopy(subsets if isinstance(subsets, list) else [])
    for ss in subsets:
        for key in ("addresses", "notReadyAddresses"):
            for a in (ss.get(key) or []) if isinstance(ss, dict) else []:
                if isinstance(a, dict) and isinstance(a.get("targetRef"), dict):
                    a["targetRef"].pop("resourceVersion", None)
    return repack_subsets(subsets)


def endpoints_labels(service: Obj) -> dict[str, str]:
    labels = dict(meta_of(service).get("labels") or {})
    if is_service_ip_set(service):
        labels.pop(LABEL_HEADLESS, None)
    else:
        labels[LABEL_HEADLESS] = ""
    return labels


def plan_endpoints(service: Obj, pods: Iterable[Obj], current: Obj | None, *,
                   trigger_time: str | None = None) -> dict[str, Any] | None:
    """The Endpoints object to write for a Service with a selector (a create when
    `current` is None, else a full update carrying its resourceVersion), or None when
    the stored one is right."""
    subsets, truncated = truncate(desired_subsets(service, pods))
    if truncated:
        subsets = repack_subsets(subsets)  # canonical again, so the next sync compares equal
    labels = endpoints_labels(service)
    if current is not None:
        annotations = meta_of(current).get("annotations") or {}
        capacity_ok = (annotations.get(OVER_CAPACITY) == TRUNCATED) == truncated
        if (_canonical(current.get("subsets")) == subsets and (meta_of(current).get("labels") or {}) == labels
                and capacity_ok):
            return None
        body = copy.deepcopy(dict(current))
    else:
        md = meta_of(service)
        body = {"metadata": {"name": md.get("name"), "namespace": md.get("namespace")}}
    body["apiVersion"], body["kind"] = "v1", "Endpoints"
    meta = body.setdefault("metadata", {})
    meta["labels"] = labels
    annotations = dict(meta.get("annotations") or {})
    if trigger_time:
        annotations[LAST_CHANGE_TRIGGER_TIME] = trigger_time
    else:
        annotations.pop(LAST_CHANGE_TRIGGER_TIME, None)
    if truncated:
        annotations[OVER_CAPACITY] = TRUNCATED
    else:
        annotations.pop(OVER_CAPACITY, None)
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    if subsets:
        body["subsets"] = subsets
    else:
        body.pop("subsets", None)
    return body
