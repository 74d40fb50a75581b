"""`networking.k8s.io/v1` NetworkPolicy: which traffic may reach (and leave) selected pods.

The declaration, kube-apiserver 1.32's way: defaulting is the v1
`SetDefaults_NetworkPolicyPort` (a port's protocol is TCP) and
`SetDefaults_NetworkPolicy` (no policyTypes means Ingress, plus Egress when the
policy has egress rules); validation is `ValidateNetworkPolicy[Update]` of
pkg/apis/networking/validation with its messages and field paths (and its
allowance for stored selectors with invalid values); the table is
kubectl's `printNetworkPolicy` (NAME, POD-SELECTOR, AGE).  Enforcing policies
is the node's job (fleet/network/policy.py), reading these objects.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from fleet.api import validation as v
from fleet.api.errors import cause
from fleet.api.kinds._common import col, d, dicts, format_label_selector, lst
from fleet.api.registry import KindInfo

Cause = dict[str, str]

GROUP = "networking.k8s.io"
PROTOCOLS = ("TCP", "UDP", "SCTP")  # the order kube lists them in its message
POLICY_TYPES = ("Ingress", "Egress")
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_cidr_sloppy(value: Any) -> IpNetwork | None:
    """netutils.ParseCIDRSloppy: `addr/prefix`, host bits allowed, IPv4 octets may have leading zeros."""
    if not isinstance(value, str) or "/" not in value or "%" in value:
        return None
    addr, _, prefix = value.partition("/")
    if not prefix.isdigit():
        return None
    parts = addr.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        addr = ".".join(str(int(p)) for p in parts)
    try:
        return ipaddress.ip_network(f"{addr}/{prefix}", strict=False)
    except ValueError:
        return None


def _ip_block_errors(block: dict[str, Any], path: str) -> list[Cause]:
    """ValidateIPBlock: a CIDR, and every except a strict subset of it."""
    cidr = block.get("cidr")
    if not cidr:
        return [v.required(f"{path}.cidr")]
    net = parse_cidr_sloppy(cidr)
    if net is None:
        return [v.invalid(f"{path}.cidr", cidr, "not a valid CIDR")]
    out: list[Cause] = []
    for i, exc in enumerate(lst(block, "except")):
        epath = f"{path}.except[{i}]"
        sub = parse_cidr_sloppy(exc)
        if sub is None:
            # kube stops at the first bad except.
            return out + [v.invalid(epath, exc, "not a valid CIDR")]
        if sub.version != net.version or not net.supernet_of(sub) or net.prefixlen >= sub.prefixlen:
            out.append(v.invalid(epath, exc, "must be a strict subset of `cidr`"))
    return out


def _port_errors(port: dict[str, Any], path: str) -> list[Cause]:
    """ValidateNetworkPolicyPort."""
    out: list[Cause] = []
    proto = port.get("protocol")
    if proto is not None and proto not in PROTOCOLS:
        out.append(v.not_supported(f"{path}.protocol", proto, PROTOCOLS))
    value, end = port.get("port"), port.get("endPort")
    if value is None:
        if end is not None:
            out.append(v.invalid(f"{path}.endPort", end, "may not be specified when `port` is not specified"))
    elif isinstance(value, int) and not isinstance(value, bool):
        out += [v.invalid(f"{path}.port", value, m) for m in v.is_valid_port_num(value)]
        if end is not None:
            if isinstance(end, int) and end < value:
                out.append(v.invalid(f"{path}.endPort", end, "must be greater than or equal to `port`"))
            out += [v.invalid(f"{path}.endPort", end, m) for m in v.is_valid_port_num(end)]
    else:
        if end is not None:
            out.append(v.invalid(f"{path}.endPort", end, "may not be specified when `port` is non-numeric"))
        out += [v.invalid(f"{path}.port", value, m) for m in v.is_valid_port_name(str(value))]
    return out


def _peer_errors(peer: dict[str, Any], path: str, allow_invalid_values: bool) -> list[Cause]:
    """ValidateNetworkPolicyPeer: ipBlock alone, or pod and/or namespace selectors."""
    out: list[Cause] = []
    count = 0
    for f in ("podSelector", "namespaceSelector"):
        if peer.get(f) is not None:
            count += 1
            out += v.validate_label_selector(peer[f], f"{path}.{f}", allow_invalid_values=allow_invalid_values)
    block = peer.get("ipBlock")
    if isinstance(block, dict):
        count += 1
        out += _ip_block_errors(block, f"{path}.ipBlock")
    if count == 0:
        out.append(v.required(path, "must specify a peer"))
    elif count > 1 and isinstance(block, dict):
        out.append(v.forbidden(path, "may not specify both ipBlock and another peer"))
    return out


def _policy_types_value(types: list[Any]) -> str:
    # field.Invalid(path, &spec.PolicyTypes, ...): Go prints the slice with %#v.
    return "[]networking.PolicyType{" + ", ".join(json.dumps(str(t)) for t in types) + "}"


def validate_network_policy(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = v.validate_object_meta(obj.get("metadata"), namespaced=True)
    spec = obj.get("spec")
    if spec is not None and not isinstance(spec, dict):
        return out + [v.type_invalid("spec", spec, "object")]
    spec = spec or {}
    # ValidationOptionsForNetworking: a stored policy whose podSelector kube once let through
    # with invalid expression values stays updatable.
    allow = old is not None and bool(v.validate_label_selector(d(old, "spec").get("podSelector") or {}, ""))
    out += v.validate_label_selector(spec.get("podSelector") or {}, "spec.podSelector", allow_invalid_values=allow)
    for direction, peers in (("ingress", "from"), ("egress", "to")):
        for i, rule in enumerate(dicts(lst(spec, direction))):
            rpath = f"spec.{direction}[{i}]"
            for j, port in enumerate(dicts(lst(rule, "ports"))):
                out += _port_errors(port, f"{rpath}.ports[{j}]")
            for j, peer in enumerate(dicts(lst(rule, peers))):
                out += _peer_errors(peer, f"{rpath}.{peers}[{j}]", allow)
    types = lst(spec, "policyTypes")
    if len(types) > len(POLICY_TYPES):
        out.append(cause("spec.policyTypes", f"Invalid value: {_policy_types_value(types)}: "
                         "may not specify more than two policyTypes", "FieldValueInvalid"))
        return out
    for i, t in enumerate(types):
        if t not in POLICY_TYPES:
            out.append(v.not_supported(f"spec.policyTypes[{i}]", t, POLICY_TYPES))
    return out


def default_network_policy(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for direction in ("ingress", "egress"):
        for rule in dicts(lst(spec, direction)):
            for port in dicts(lst(rule, "ports")):
                if port.get("protocol") is None:
                    port["protocol"] = "TCP"
    if spec.get("policyTypes") in (None, []):
        types = ["Ingress"]
        if lst(spec, "egress"):
            types.append("Egress")
        spec["policyTypes"] = types


NETWORK_POLICY = KindInfo(
    group=GROUP, version="v1", kind="NetworkPolicy", plural="networkpolicies", singular="networkpolicy",
    short_names=("netpol",),
    columns=(col("Pod-Selector", lambda o: format_label_selector(d(o, "spec").get("podSelector")),
                 description="podSelector selects the pods to which this NetworkPolicy object applies. "
                             "The array of rules is applied to any pods selected by this field. An empty "
                             "selector matches all pods in this namespace."),),
    default=default_network_policy, validate=validate_network_policy,
)

KINDS = (NETWORK_POLICY,)
