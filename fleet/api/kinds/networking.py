"""`networking.k8s.io/v1` IPAddress and ServiceCIDR: the objects behind ClusterIP allocation.

Kubernetes' current allocator (KEP-1880, "MultiCIDRServiceAllocator") keeps one
cluster-scoped `IPAddress` per allocated ClusterIP, named by the IP in its
canonical form and pointing back at its Service through `spec.parentRef`; a
ServiceCIDR names a range Services are given addresses from (the default one,
`kubernetes`, holds the `--service-cidr`).  The allocator itself lives in
`fleet/server/svcalloc.py`; here are the declarations, their validation (kube's
`ValidateIPAddress` / `ValidateServiceCIDR`) and kubectl's tables (IPAddress:
NAME, PARENTREF; ServiceCIDR: NAME, CIDRS, AGE).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from fleet.api import validation as v
from fleet.api.kinds._common import col, d, lst
from fleet.api.registry import AGE_COLUMN, NAME_COLUMN, KindInfo

Cause = dict[str, str]

GROUP = "networking.k8s.io"
#: kube's labels on the IPAddresses its allocator writes.
LABEL_IP_FAMILY = "ipaddress.kubernetes.io/ip-family"
LABEL_MANAGED_BY = "ipaddress.kubernetes.io/managed-by"
MANAGED_BY_ALLOCATOR = "ipallocator.k8s.io"
#: The default ServiceCIDR, holding the server's --service-cidr.
DEFAULT_SERVICE_CIDR_NAME = "kubernetes"


def parent_ref_string(o: dict[str, Any]) -> str:
    """kubectl's PARENTREF cell: `resource[.group][/namespace]/name`, lower case."""
    ref = d(o, "spec", "parentRef")
    if not ref:
        return "<none>"
    resource = str(ref.get("resource") or "")
    group = str(ref.get("group") or "")
    out = (f"{resource}.{group}" if group else resource).lower()
    if ref.get("namespace"):
        out += "/" + str(ref["namespace"])
    return out + "/" + str(ref.get("name") or "")


def _canonical_ip_errors(name: Any) -> list[str]:
    try:
        ip = ipaddress.ip_address(str(name))
    except ValueError:
        return ["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
    if str(ip) != name:
        return [f"must be in canonical form (\"{ip}\")"]
    if ip.is_unspecified or ip.is_loopback or ip.is_link_local or ip.is_multicast:
        return ["may not be an unspecified, loopback, link-local or multicast address"]
    return []


def validate_ip_address(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    md = obj.get("metadata")
    out = v.validate_object_meta(md, namespaced=False, name_validator=lambda n: [])
    name = md.get("name") if isinstance(md, dict) else None
    if isinstance(md, dict) and md.get("generateName"):
        out.append(v.forbidden("metadata.generateName", "an IPAddress is named by its IP"))
    if name:
        for msg in _canonical_ip_errors(name):
            out.append(v.invalid("metadata.name", name, msg))
    ref = d(obj, "spec").get("parentRef")
    if not isinstance(ref, dict):
        out.append(v.required("spec.parentRef"))
    else:
        for f in ("resource", "name"):
            if not ref.get(f):
                out.append(v.required(f"spec.parentRef.{f}"))
        if ref.get("namespace"):
            for msg in v.is_dns1123_label(str(ref["namespace"])):
                out.append(v.invalid("spec.parentRef.namespace", ref["namespace"], msg))
    if old is not None:
        out += v.immutable(d(obj, "spec").get("parentRef"), d(old, "spec").get("parentRef"), "spec.parentRef")
    return out


def validate_service_cidr(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    cidrs = lst(obj, "spec", "cidrs")
    if not cidrs:
        out.append(v.required("spec.cidrs"))
    elif len(cidrs) > 2:
        out.append(v.too_many("spec.cidrs", len(cidrs), 2))
    families = []
    for i, c in enumerate(cidrs):
        try:
            net = ipaddress.ip_network(str(c), strict=True)
        except ValueError:
            out.append(v.invalid(f"spec.cidrs[{i}]", c, "must be a valid CIDR value, (e.g. 10.9.8.0/24 "
                                                          "or 2001:db8::/64)"))
            continue
        families.append(net.version)
    if len(families) == 2 and families[0] == families[1]:
        out.append(v.invalid("spec.cidrs", cidrs, "may specify no more than one IP for each IP family, "
                                                  "i.e 192.168.0.0/24 and 2001:db8::/64"))
    if old is not None:
        out += v.immutable(d(obj, "spec").get("cidrs"), d(old, "spec").get("cidrs"), "spec.cidrs")
    return out


IP_ADDRESS = KindInfo(
    group=GROUP, version="v1", kind="IPAddress", plural="ipaddresses", singular="ipaddress",
    namespaced=False,
    # kubectl prints NAME and PARENTREF only (kube's printer defines no AGE column).
    columns_override=(NAME_COLUMN, col("ParentRef", parent_ref_string,
                                       description="ParentRef references the resource that an "
                                                   "IPAddress is attached to.")),
    validate=validate_ip_address,
)

SERVICE_CIDR = KindInfo(
    group=GROUP, version="v1", kind="ServiceCIDR", plural="servicecidrs", singular="servicecidr",
    namespaced=False, subresources=("status",),
    columns_override=(NAME_COLUMN, col("CIDRs", lambda o: ",".join(str(c) for c in lst(o, "spec", "cidrs")),
                                       description="CIDRs defines the IP blocks in CIDR notation from "
                                                   "which to assign service cluster IPs."),
                      AGE_COLUMN),
    validate=validate_service_cidr,
)

KINDS = (IP_ADDRESS, SERVICE_CIDR)
