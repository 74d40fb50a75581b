"""Ingress → route entries, TLS certificates, the default backend and Ingress status.

Which Ingresses we serve (networking.k8s.io/v1 semantics): `spec.ingressClassName`
names an IngressClass whose `spec.controller` is ours; or, without a class name, the
legacy annotation `kubernetes.io/ingress.class` names such a class; or, with
neither, one of our classes is the default (annotation
`ingressclass.kubernetes.io/is-default-class: "true"`).

Rules of all served Ingresses merge per host.  A wildcard host ("*.foo.com")
matches exactly one label, as the Ingress API defines.  Path types: Exact; Prefix
(element-wise); ImplementationSpecific, which Fleet serves with Prefix semantics.
When two Ingresses declare the same (host, path, path type), the oldest
(creationTimestamp, then namespace/name) keeps it and the other gets a Warning
event.  The oldest served Ingress' `defaultBackend` is the listener's catch-all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.network.routebuild_backends import Resolver, backend_reason
from fleet.network.routebuild_common import (
    Collector,
    age_key,
    dicts,
    get,
    int_or_none,
    name_of,
    namespace_of,
    object_meta,
    precedence_key,
    text,
)
from fleet.network.routetable import Backend, Certificate, Match, PathMatch, Route, Source

__all__ = ["IngressPart", "build_ingress", "load_balancer_status", "served_ingresses"]

ANN_CLASS = "kubernetes.io/ingress.class"
ANN_DEFAULT_CLASS = "ingressclass.kubernetes.io/is-default-class"


@dataclass
class IngressPart:
    """What Ingress contributes to the Ingress listeners (HTTP and HTTPS alike)."""

    # (hostname, one_label, precedence key, route)
    routes: list[tuple[str, bool, tuple, Route]] = field(default_factory=list)
    default_route: Route | None = None
    certificates: list[tuple[tuple, Certificate]] = field(default_factory=list)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    ann = object_meta(obj).get("annotations")
    return ann if isinstance(ann, Mapping) else {}


def served_ingresses(ingresses: Iterable[Mapping[str, Any]], classes: Iterable[Mapping[str, Any]],
                     controller: str) -> list[Mapping[str, Any]]:
    """The Ingresses our controller serves, oldest first."""
    ours: set[str] = set()
    default_ours = False
    for ic in classes:
        if not isinstance(ic, Mapping) or get(ic, "spec", "controller") != controller:
            continue
        ours.add(name_of(ic))
        default_ours = default_ours or _annotations(ic).get(ANN_DEFAULT_CLASS) == "true"
    out = []
    for ing in ingresses:
        if not isinstance(ing, Mapping):
            continue
        cls = get(ing, "spec", "ingressClassName")
        legacy = _annotations(ing).get(ANN_CLASS)
        if isinstance(cls, str) and cls:
            served = cls in ours
        elif isinstance(legacy, str) and legacy:
            served = legacy in ours
        else:
            served = default_ours
        if served:
            out.append(ing)
    return sorted(out, key=age_key)


def _backend(ing: Mapping[str, Any], spec: Any, resolver: Resolver, col: Collector) -> Backend:
    """An IngressBackend resolved; problems become Warning events on the Ingress."""
    ns = namespace_of(ing)
    svc = get(spec, "service")
    if isinstance(svc, Mapping):
        name = text(svc.get("name"))
        number = int_or_none(get(svc, "port", "number"))
        port: int | str = number if number else text(get(svc, "port", "name"))
        backend = resolver.backend(ns, name, port)
    elif isinstance(get(spec, "resource"), Mapping):
        kind = text(get(spec, "resource", "kind"))
        backend = Backend(ns, "", 0, problem=f'resource backend "{kind}" is not supported')
        col.warn("Ingress", ing, "UnsupportedBackend", backend.problem)
        return backend
    else:
        backend = Backend(ns, "", 0, problem="backend names no service")
    reason = backend_reason(backend)
    if reason:
        col.warn("Ingress", ing, reason, backend.problem)
    return backend


def build_ingress(ingresses: Sequence[Mapping[str, Any]], resolver: Resolver,
                  col: Collector) -> IngressPart:
    """Routes, certificates and default backend from the served Ingresses (oldest first)."""
    part = IngressPart()
    owner: dict[tuple[str, str, str], str] = {}
    default_owner = ""
    for ing in ingresses:
        ns, name, age = namespace_of(ing), name_of(ing), age_key(ing)
        me = f"{ns}/{name}"
        source = Source("Ingress", ns, name)
        spec = ing.get("spec") if isinstance(ing.get("spec"), Mapping) else {}
        for ri, rule in enumerate(dicts(spec.get("rules"))):
            host = text(rule.get("host")).lower().rstrip(".")
            for pi, p in enumerate(dicts(get(rule, "http", "paths"))):
                raw_type = text(p.get("pathType"), "ImplementationSpecific")
                ptype = "Exact" if raw_type == "Exact" else "Prefix"
                path = text(p.get("path")) or "/"
                claim = (host, path, ptype)
                if claim in owner:
                    if owner[claim] != me:
                        col.warn("Ingress", ing, "RuleConflict",
                                 f'host "{host}" path "{path}" ({ptype}) is already served by '
                                 f'the older Ingress {owner[claim]}; this rule is ignored')
                    continue
                owner[claim] = me
                match = Match(path=PathMatch(ptype, path))
                route = Route(source, (match,), (_backend(ing, p.get("backend"), resolver, col),))
                key = precedence_key(match, age, "Ingress", ri * 1000 + pi, 0)
                part.routes.append((host, host.startswith("*."), key, route))
        dflt = spec.get("defaultBackend")
        if isinstance(dflt, Mapping):
            if part.default_route is None:
                part.default_route = Route(source, (Match(),), (_backend(ing, dflt, resolver, col),))
                default_owner = me
            else:
                col.warn("Ingress", ing, "DefaultBackendConflict",
                         f"the older Ingress {default_owner} already sets the default backend; "
                         "this one is ignored")
        for ti, tls in enumerate(dicts(spec.get("tls"))):
            secret = text(tls.get("secretName"))
            if not secret:
                continue  # hosts without a secret are served with the default certificate
            hosts = [text(h).lower().rstrip(".") for h in tls.get("hosts") or [] if isinstance(h, str)]
            cert = resolver.certificate(ns, secret, hosts or [""], source)
            if isinstance(cert, str):
                col.warn("Ingress", ing, "InvalidCertificate", cert)
            else:
                part.certificates.append(((age, ti), cert))
    return part


def load_balancer_status(addresses: Sequence[str]) -> dict[str, Any]:
    """An Ingress' `status` for our advertised addresses: `loadBalancer.ingress` gets an
    `ip` entry for an IP address and a `hostname` entry for a DNS name (as
    IngressLoadBalancerIngress defines); `ports` stays unset, as it is for Ingress
    controllers that serve the standard HTTP/HTTPS ports."""
    entries: list[dict[str, str]] = []
    for a in addresses:
        try:
            entries.append({"ip": str(ipaddress.ip_address(a))})
        except ValueError:
            entries.append({"hostname": a})
    return {"loadBalancer": {"ingress": entries} if entries else {}}
