"""Gateway API (gateway.networking.k8s.io/v1): GatewayClass, Gateway, HTTPRoute → route
entries, certificates and the statuses the spec defines.

GatewayClasses whose `spec.controllerName` is ours are Accepted; Gateways of such a
class are served.  Every Gateway listener is served on its own port number; all our
Gateways (and Ingress, on its two ports) share one data plane, so listeners of one
port merge.  A port's protocol belongs to whoever claims it first — Ingress, then
Gateways oldest first in listener order — and a later listener with another protocol
is Conflicted (ProtocolConflict) and not served.  Only HTTP and HTTPS (TLS mode
Terminate) are served; other protocols are not Accepted (UnsupportedProtocol).
HTTPS certificateRefs are Secrets in the Gateway's namespace (no ReferenceGrant:
another namespace is RefNotPermitted); a bad one is InvalidCertificateRef.

HTTPRoute attachment follows the parentRef (Gateway; sectionName and port narrow it),
the listener's allowedRoutes (namespaces Same / All / Selector on the Namespace's
labels; kinds) and hostname intersection; the route's status gets one entry per
parentRef of ours (Accepted: Accepted / NoMatchingParent / NotAllowedByListeners /
NoMatchingListenerHostname / UnsupportedValue for a regular expression that does
not compile; ResolvedRefs: ResolvedRefs / InvalidKind /
RefNotPermitted / BackendNotFound), other controllers' entries are kept.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fleet.api.selectors import selector_dict_matches
from fleet.network.routebuild_backends import Resolver
from fleet.network.routebuild_common import (
    Collector,
    RouteEntry,
    age_key,
    dicts,
    get,
    int_or_none,
    name_of,
    namespace_of,
    object_meta,
    precedence_key,
    set_conditions,
    text,
)
from fleet.network.routebuild_httproute import intersect_hostnames, route_rules
from fleet.network.routetable import Certificate, Source

__all__ = ["GatewayPart", "build_gateway"]

GROUP = "gateway.networking.k8s.io"
API = f"{GROUP}/v1"
HTTPROUTE_KIND = {"group": GROUP, "kind": "HTTPRoute"}


@dataclass
class _Listener:
    gateway: Mapping[str, Any]
    index: int
    name: str
    port: int
    protocol: str
    hostname: str
    spec: Mapping[str, Any]
    conditions: list[tuple[str, str, str, str]] = field(default_factory=list)
    supported_kinds: list[dict[str, str]] = field(default_factory=list)
    programmed: bool = False
    attached: set[tuple[str, str]] = field(default_factory=set)

    def admits(self, route_ns: str, ns_labels: Mapping[str, str]) -> bool:
        """allowedRoutes: the route's namespace and kind (HTTPRoute)."""
        if HTTPROUTE_KIND not in self.supported_kinds:
            return False
        frm = get(self.spec, "allowedRoutes", "namespaces", "from") or "Same"
        if frm == "All":
            return True
        if frm == "Selector":
            return selector_dict_matches(get(self.spec, "allowedRoutes", "namespaces", "selector"), ns_labels)
        return route_ns == namespace_of(self.gateway)


@dataclass
class GatewayPart:
    entries: list[RouteEntry] = field(default_factory=list)
    # (port, sort key, certificate) of programmed HTTPS listeners
    certificates: list[tuple[int, tuple, Certificate]] = field(default_factory=list)
    ports: dict[int, Literal["HTTP", "HTTPS"]] = field(default_factory=dict)


def _generation(obj: Mapping[str, Any]) -> int | None:
    return int_or_none(object_meta(obj).get("generation"))


def _listener_certs(lst: _Listener, resolver: Resolver) -> tuple[list[Certificate], tuple[str, str] | None]:
    """The listener's certificates and its first certificateRef problem (reason, message)."""
    gw = lst.gateway
    ns = namespace_of(gw)
    certs: list[Certificate] = []
    problem: tuple[str, str] | None = None
    refs = dicts(get(lst.spec, "tls", "certificateRefs"))
    if not refs:
        return [], ("InvalidCertificateRef", "no certificateRefs")
    for ref in refs:
        group, kind = text(ref.get("group")), text(ref.get("kind"), "Secret")
        rns, rname = text(ref.get("namespace")) or ns, text(ref.get("name"))
        if group not in ("", "core") or kind != "Secret":
            why: tuple[str, str] | None = ("InvalidCertificateRef",
                                           f"certificateRef kind {group or 'core'}/{kind} is not supported")
        elif rns != ns:
            why = ("RefNotPermitted", f'certificateRef to secret "{rns}/{rname}" in another namespace '
                                      "is not permitted (ReferenceGrant is not served)")
        else:
            got = resolver.certificate(rns, rname, [lst.hostname], Source("Gateway", ns, name_of(gw)))
            why = ("InvalidCertificateRef", got) if isinstance(got, str) else None
            if not isinstance(got, str):
                certs.append(got)
        if why is not None and problem is None:
            problem = why
    return certs, problem


def _listeners(gw: Mapping[str, Any], claims: dict[int, str], resolver: Resolver,
               part: GatewayPart, col: Collector, unavailable: frozenset[int]) -> list[_Listener]:
    out = []
    for li, spec in enumerate(dicts(get(gw, "spec", "listeners"))):
        port = int_or_none(spec.get("port")) or 0
        protocol = text(spec.get("protocol"))
        lst = _Listener(gw, li, text(spec.get("name")), port, protocol,
                        text(spec.get("hostname")).lower().rstrip("."), spec)
        accepted = ("Accepted", "True", "Accepted", "listener is accepted")
        conflicted = ("Conflicted", "False", "NoConflicts", "no conflicts")
        resolved = ("ResolvedRefs", "True", "ResolvedRefs", "all references are resolved")
        certs: list[Certificate] = []
        tls_mode = text(get(spec, "tls", "mode"), "Terminate")
        if protocol in ("HTTP", "HTTPS"):
            kinds = get(spec, "allowedRoutes", "kinds")
            if isinstance(kinds, list) and kinds:
                bad = []
                for k in dicts(kinds):
                    if text(k.get("group"), GROUP) == GROUP and k.get("kind") == "HTTPRoute":
                        lst.supported_kinds = [dict(HTTPROUTE_KIND)]
                    else:
                        bad.append(f"{text(k.get('group'), GROUP)}/{text(k.get('kind'))}")
                if bad:
                    resolved = ("ResolvedRefs", "False", "InvalidRouteKinds",
                                f"route kinds {', '.join(bad)} are not supported")
            else:
                lst.supported_kinds = [dict(HTTPROUTE_KIND)]
        if protocol not in ("HTTP", "HTTPS") or (protocol == "HTTPS" and tls_mode != "Terminate"):
            what = protocol if protocol != "HTTPS" else f"HTTPS with TLS mode {tls_mode}"
            accepted = ("Accepted", "False", "UnsupportedProtocol", f"protocol {what} is not supported")
        elif not 0 < port < 65536:
            accepted = ("Accepted", "False", "PortUnavailable", f"port {port} is not valid")
        elif port in unavailable:
            accepted = ("Accepted", "False", "PortUnavailable",
                        f"port {port} cannot be listened on on this host (in use by another "
                        "process, or not permitted)")
        elif claims.setdefault(port, protocol) != protocol:
            conflicted = ("Conflicted", "True", "ProtocolConflict",
                          f"port {port} is already served as {claims[port]}")
            accepted = ("Accepted", "False", "PortUnavailable",
                        f"port {port} is already served as {claims[port]}")
        elif protocol == "HTTPS":
            certs, problem = _listener_certs(lst, resolver)
            if problem is not None:
                resolved = ("ResolvedRefs", "False", *problem)
                col.warn("Gateway", gw, problem[0], f"listener {lst.name}: {problem[1]}")
        ok = accepted[1] == "True" and conflicted[1] == "False" and (protocol == "HTTP" or bool(certs))
        lst.programmed = ok
        programmed = ("Programmed", "True", "Programmed", "listener is programmed") if ok else \
            ("Programmed", "False", "Invalid", "listener is not served: see its other conditions")
        lst.conditions = [accepted, programmed, resolved, conflicted]
        if ok:
            part.ports.setdefault(port, protocol)  # type: ignore[arg-type]
            for ci, c in enumerate(certs):
                part.certificates.append((port, (age_key(gw), li, ci), c))
        out.append(lst)
    return out


def _namespace_labels(namespaces: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    out = {}
    for ns in namespaces:
        if isinstance(ns, Mapping):
            labels = object_meta(ns).get("labels")
            name = name_of(ns)
            out[name] = {"kubernetes.io/metadata.name": name,
                         **(dict(labels) if isinstance(labels, Mapping) else {})}
    return out


def _attach(route: Mapping[str, Any], pref: Mapping[str, Any], listeners: list[_Listener],
            ns_labels: Mapping[str, str]) -> tuple[tuple[str, str, str], list[tuple[_Listener, list[str]]]]:
    """The Accepted condition for one parentRef and the (listener, hostnames) it attaches to."""
    section = pref.get("sectionName")
    port = int_or_none(pref.get("port"))
    cands = [lst for lst in listeners
             if (not isinstance(section, str) or not section or lst.name == section)
             and (port is None or lst.port == port)]
    if not cands:
        return ("False", "NoMatchingParent", "no listener matches the parentRef's sectionName/port"), []
    allowed = [lst for lst in cands if lst.admits(namespace_of(route), ns_labels)]
    if not allowed:
        return ("False", "NotAllowedByListeners", "the listeners' allowedRoutes do not admit this route"), []
    hostnames = [text(h).lower().rstrip(".") for h in get(route, "spec", "hostnames") or []
                 if isinstance(h, str)] if isinstance(get(route, "spec", "hostnames"), list) else []
    attached = [(lst, hs) for lst in allowed if (hs := intersect_hostnames(lst.hostname, hostnames))]
    if not attached:
        return ("False", "NoMatchingListenerHostname",
                "no hostname of the route intersects a listener's hostname"), []
    return ("True", "Accepted", "route is accepted"), attached


def _same_ref(a: Any, b: Mapping[str, Any]) -> bool:
    return isinstance(a, Mapping) and all(a.get(k) == b.get(k) for k in
                                          ("group", "kind", "namespace", "name", "sectionName", "port"))


def build_gateway(gateway_classes: Sequence[Mapping[str, Any]], gateways: Sequence[Mapping[str, Any]],
                  http_routes: Sequence[Mapping[str, Any]], namespaces: Sequence[Mapping[str, Any]],
                  controller: str, addresses: Sequence[str], claims: dict[int, str],
                  resolver: Resolver, col: Collector, now: str,
                  unavailable: frozenset[int] = frozenset()) -> GatewayPart:
    """Gateway API's route entries and certificates; statuses and events into `col`.
    `claims` maps ports already served (Ingress') to their protocol; `unavailable`
    holds the ports the engine could not listen on."""
    part = GatewayPart()
    ours = set()
    for gc in sorted((g for g in gateway_classes if isinstance(g, Mapping)), key=name_of):
        if get(gc, "spec", "controllerName") != controller:
            continue
        ours.add(name_of(gc))
        conds = set_conditions(get(gc, "status", "conditions"),
                               [("Accepted", "True", "Accepted", "served by " + controller)],
                               now, _generation(gc))
        col.status(API, "GatewayClass", "", name_of(gc), {"conditions": conds})

    served = sorted((g for g in gateways if isinstance(g, Mapping)
                     and text(get(g, "spec", "gatewayClassName")) in ours), key=age_key)
    by_key: dict[tuple[str, str], list[_Listener]] = {}
    for gw in served:
        by_key[(namespace_of(gw), name_of(gw))] = _listeners(gw, claims, resolver, part, col, unavailable)

    labels = _namespace_labels(namespaces)
    seen: set[tuple[int, str, tuple]] = set()
    for route in sorted((r for r in http_routes if isinstance(r, Mapping)), key=age_key):
        rns, rname, age = namespace_of(route), name_of(route), age_key(route)
        ns_labels = labels.get(rns, {"kubernetes.io/metadata.name": rns})
        rules = None
        parents = []
        for pref in dicts(get(route, "spec", "parentRefs")):
            if text(pref.get("group"), GROUP) != GROUP or text(pref.get("kind"), "Gateway") != "Gateway":
                continue
            gkey = (text(pref.get("namespace")) or rns, text(pref.get("name")))
            if gkey not in by_key:
                continue  # not a Gateway of ours: its controller reports on it
            if rules is None:
                rules = route_rules(route, resolver, col)
            (status, reason, message), attached = _attach(route, pref, by_key[gkey], ns_labels)
            if rules.invalid and status == "True":
                (status, reason, message), attached = ("False", "UnsupportedValue", rules.invalid), []
            for lst, hosts in attached:
                lst.attached.add((rns, rname))
                if not lst.programmed:
                    continue
                for host in hosts:
                    for ri, mi, r in rules.routes:
                        key = precedence_key(r.matches[0], age, "HTTPRoute", ri, mi)
                        if (lst.port, host, key) in seen:
                            continue
                        seen.add((lst.port, host, key))
                        part.entries.append(RouteEntry(lst.port, lst.protocol, host, False, key, r))  # type: ignore[arg-type]
            resolved = ("ResolvedRefs", "False", *rules.ref_problem) if rules.ref_problem else \
                ("ResolvedRefs", "True", "ResolvedRefs", "all backendRefs are resolved")
            old = next((p for p in dicts(get(route, "status", "parents"))
                        if p.get("controllerName") == controller and _same_ref(p.get("parentRef"), pref)), {})
            parents.append({"parentRef": dict(pref), "controllerName": controller,
                            "conditions": set_conditions(old.get("conditions"),
                                                         [("Accepted", status, reason, message), resolved],
                                                         now, _generation(route))})
        others = [dict(p) for p in dicts(get(route, "status", "parents"))
                  if p.get("controllerName") != controller]
        had_ours = len(others) != len(dicts(get(route, "status", "parents")))
        if parents or had_ours:
            col.status(API, "HTTPRoute", rns, rname, {"parents": parents + others})

    for gw in served:
        _gateway_status(gw, by_key[(namespace_of(gw), name_of(gw))], addresses, col, now)
    return part


def _gateway_status(gw: Mapping[str, Any], listeners: list[_Listener], addresses: Sequence[str],
                    col: Collector, now: str) -> None:
    gen = _generation(gw)
    old = {text(s.get("name")): s for s in dicts(get(gw, "status", "listeners"))}
    lstatus = [{"name": lst.name, "supportedKinds": lst.supported_kinds,
                "attachedRoutes": len(lst.attached),
                "conditions": set_conditions(get(old.get(lst.name), "conditions"), lst.conditions, now, gen)}
               for lst in listeners]
    good = sum(lst.programmed for lst in listeners)
    if good == len(listeners):
        accepted = ("Accepted", "True", "Accepted", "gateway is accepted")
    else:
        accepted = ("Accepted", "True" if good else "False", "ListenersNotValid",
                    f"{len(listeners) - good} of {len(listeners)} listeners are not valid")
    programmed = ("Programmed", "True", "Programmed", "gateway is programmed") if good else \
        ("Programmed", "False", "Invalid", "no listener can be served")
    addrs = []
    for a in addresses:
        try:
            addrs.append({"type": "IPAddress", "value": str(ipaddress.ip_address(a))})
        except ValueError:
            addrs.append({"type": "Hostname", "value": a})
    col.status(API, "Gateway", namespace_of(gw), name_of(gw), {
        "addresses": addrs,
        "conditions": set_conditions(get(gw, "status", "conditions"), [accepted, programmed], now, gen),
        "listeners": lstatus})
