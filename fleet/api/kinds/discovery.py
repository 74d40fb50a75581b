"""`discovery.k8s.io/v1` EndpointSlice: who backs a Service, in slices of at most 100.

The endpointslice controller writes them from Services and ready pods, the mirroring
controller copies hand-made `v1 Endpoints` into them, and every consumer (the node's
service rules, cluster DNS, the ingress) reads them — never the legacy Endpoints.
Validation follows kube's `ValidateEndpointSlice`; the table is kubectl's
(ADDRESSTYPE, PORTS, ENDPOINTS, each list cut at three with "+ N more...").
"""

from __future__ import annotations

import ipaddress
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import col, dicts, lst
from fleet.api.registry import KindInfo

Cause = dict[str, str]

#: The label naming the Service a slice belongs to (discovery.LabelServiceName).
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
#: The label naming the controller that manages a slice (discovery.LabelManagedBy).
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"

ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")
MAX_ENDPOINTS = 1000
MAX_ADDRESSES = 100
MAX_PORTS = 20000


def _with_more(items: list[str], count: int, limit: int = 3) -> str:
    shown = ",".join(items[:limit])
    if count > limit:
        return f"{shown} + {count - limit} more..."
    return shown or "<unset>"


def format_ports(o: dict[str, Any]) -> str:
    names: list[str] = []
    for p in dicts(lst(o, "ports")):
        if p.get("port") is not None:
            names.append(str(p["port"]))
        elif p.get("name") is not None:
            names.append(str(p["name"]))
        else:
            names.append("*")
    return _with_more(names, len(names))


def format_endpoints(o: dict[str, Any]) -> str:
    addrs = [str(a) for e in dicts(lst(o, "endpoints")) for a in lst(e, "addresses")]
    return _with_more(addrs, len(addrs))


def _address_errors(addr: Any, address_type: str) -> list[str]:
    if not isinstance(addr, str) or not addr:
        return ["must be a valid IP address" if address_type != "FQDN" else "must be a valid domain name"]
    if address_type == "FQDN":
        return v.is_dns1123_subdomain(addr)
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return ["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
    if address_type == "IPv4" and ip.version != 4:
        return ["must be an IPv4 address"]
    if address_type == "IPv6" and ip.version != 6:
        return ["must be an IPv6 address"]
    return []


def validate_endpoint_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    address_type = obj.get("addressType")
    if not address_type:
        out.append(v.required("addressType"))
    elif address_type not in ADDRESS_TYPES:
        out.append(v.not_supported("addressType", address_type, ADDRESS_TYPES))
    if old is not None and old.get("addressType") != address_type:
        out += v.immutable(address_type, old.get("addressType"), "addressType")
    endpoints = obj.get("endpoints")
    if endpoints is not None and not isinstance(endpoints, list):
        out.append(v.type_invalid("endpoints", endpoints, "array"))
        endpoints = []
    endpoints = endpoints or []
    if len(endpoints) > MAX_ENDPOINTS:
        out.append(v.too_many("endpoints", len(endpoints), MAX_ENDPOINTS))
    for i, ep in enumerate(endpoints):
        ep_path = f"endpoints[{i}]"
        if not isinstance(ep, dict):
            out.append(v.type_invalid(ep_path, ep, "object"))
            continue
        addrs = ep.get("addresses")
        if not isinstance(addrs, list) or not addrs:
            out.append(v.required(f"{ep_path}.addresses", "must contain at least 1 address"))
            addrs = []
        elif len(addrs) > MAX_ADDRESSES:
            out.append(v.too_many(f"{ep_path}.addresses", len(addrs), MAX_ADDRESSES))
        if address_type in ADDRESS_TYPES:
            for j, addr in enumerate(addrs):
                for msg in _address_errors(addr, address_type):
                    out.append(v.invalid(f"{ep_path}.addresses[{j}]", addr, msg))
        hostname = ep.get("hostname")
        if hostname is not None:
            for msg in v.is_dns1123_label(str(hostname)):
                out.append(v.invalid(f"{ep_path}.hostname", hostname, msg))
        node = ep.get("nodeName")
        if node is not None:
            for msg in v.is_dns1123_subdomain(str(node)):
                out.append(v.invalid(f"{ep_path}.nodeName", node, msg))
        conditions = ep.get("conditions")
        if conditions is not None and not isinstance(conditions, dict):
            out.append(v.type_invalid(f"{ep_path}.conditions", conditions, "object"))
    ports = obj.get("ports")
    if ports is not None and not isinstance(ports, list):
        out.append(v.type_invalid("ports", ports, "array"))
        ports = []
    ports = ports or []
    if len(ports) > MAX_PORTS:
        out.append(v.too_many("ports", len(ports), MAX_PORTS))
    names: set[str] = set()
    for i, p in enumerate(ports):
        pp = f"ports[{i}]"
        if not isinstance(p, dict):
            out.append(v.type_invalid(pp, p, "object"))
            continue
        name = p.get("name") or ""
        if name:
            for msg in v.is_dns1123_label(str(name)):
                out.append(v.invalid(f"{pp}.name", name, msg))
        if name in names:
            out.append(v.duplicate(f"{pp}.name", name))
        names.add(name)
        proto = p.get("protocol")
        if proto is not None and proto not in v.PROTOCOLS:
            out.append(v.not_supported(f"{pp}.protocol", proto, v.PROTOCOLS))
        port = p.get("port")
        if port is not None:
            for msg in v.is_valid_port_num(port):
                out.append(v.invalid(f"{pp}.port", port, msg))
    return out


def default_endpoint_slice(obj: dict[str, Any]) -> None:
    for p in dicts(lst(obj, "ports")):
        p.setdefault("protocol", "TCP")
        p.setdefault("name", "")
    for ep in dicts(lst(obj, "endpoints")):
        if ep.get("conditions") is None:
            ep["conditions"] = {}


ENDPOINT_SLICE = KindInfo(
    group="discovery.k8s.io", version="v1", kind="EndpointSlice", plural="endpointslices",
    singular="endpointslice",
    columns=(
        col("AddressType", lambda o: str(o.get("addressType") or ""),
            description="addressType specifies the type of address carried by this EndpointSlice."),
        col("Ports", format_ports, description="ports specifies the list of network ports exposed by each endpoint in this slice."),
        col("Endpoints", format_endpoints, description="endpoints is a list of unique endpoints in this slice."),
    ),
    default=default_endpoint_slice, validate=validate_endpoint_slice,
)

KINDS = (ENDPOINT_SLICE,)
