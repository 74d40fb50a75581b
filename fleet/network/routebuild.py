"""The route builder: Kubernetes objects in, one `RouteTable` plus the statuses and
events they imply out.  Pure — no I/O, no clock unless `BuildOptions.now` is left
empty — and deterministic: the same objects in any order give the same result.

The I/O controller (`fleet.network.ingress`) feeds `build` from its informers and
writes back the returned statuses and events; the engines serve the table.  The
parts live beside this module: Ingress in `routebuild_ingress`, Gateway API in
`routebuild_gateway`, Service/EndpointSlice/Secret resolution in
`routebuild_backends`; this module merges what they produce into listeners.

Merging: Ingress is served on `http_port` (HTTP) and `https_port` (HTTPS, with the
Ingresses' TLS certificates and the default certificate); a Gateway listener on one
of those ports shares that listener.  Routes of one host pattern are merged from
every source and ordered by `routebuild_common.precedence_key`; hosts are ordered
exact names first, then wildcards longest first, then the catch-all "".  An Ingress
wildcard (one label) and a Gateway wildcard (one or more) of the same pattern are
two virtual hosts: the one-label one first, carrying both sources' routes, so a
request for a one-label name sees every route that applies to it.  The oldest
Ingress `defaultBackend` is appended, last, to every host of the Ingress
listeners and is their catch-all "" host's final route.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from fleet.network.routebuild_backends import Resolver
from fleet.network.routebuild_common import Collector, name_of, namespace_of
from fleet.network.routebuild_gateway import build_gateway
from fleet.network.routebuild_ingress import build_ingress, load_balancer_status, served_ingresses
from fleet.network.routetable import (
    BuildResult,
    Certificate,
    Listener,
    Route,
    RouteTable,
    VirtualHost,
)

__all__ = ["BuildInput", "BuildOptions", "build"]


@dataclass(frozen=True)
class BuildInput:
    """Every object the builder reads, as plain Kubernetes dicts (informer contents)."""

    ingresses: Sequence[Mapping] = ()
    ingress_classes: Sequence[Mapping] = ()
    gateway_classes: Sequence[Mapping] = ()
    gateways: Sequence[Mapping] = ()
    http_routes: Sequence[Mapping] = ()
    services: Sequence[Mapping] = ()
    endpoint_slices: Sequence[Mapping] = ()
    secrets: Sequence[Mapping] = ()
    namespaces: Sequence[Mapping] = ()


@dataclass(frozen=True)
class BuildOptions:
    ingress_controller: str = "fleet.io/ingress"  # IngressClass.spec.controller we serve
    gateway_controller: str = "fleet.io/gateway-controller"  # GatewayClass.spec.controllerName
    http_port: int = 8080  # where Ingress is served over HTTP (0: not at all)
    https_port: int = 8443  # where Ingress is served over TLS (0: not at all)
    addresses: tuple[str, ...] = ()  # advertised in Ingress and Gateway status
    default_certificate: Certificate | None = None
    generation: int = 0
    # RFC 3339 time for a condition's lastTransitionTime when its status changes;
    # "" reads the clock (tests pass a fixed one).
    now: str = ""
    # Ports the engine could not listen on (`EngineError.ports`): left out of the
    # table; a Gateway listener on one is Accepted=False, reason PortUnavailable.
    unavailable_ports: frozenset[int] = frozenset()


@dataclass
class _Acc:
    """One listener being assembled."""

    port: int
    protocol: Literal["HTTP", "HTTPS"]
    ingress: bool = False  # the Ingress listener: gets the default backend
    routes: list[tuple[str, bool, tuple, Route]] = field(default_factory=list)
    certificates: list[tuple[tuple, Certificate]] = field(default_factory=list)


def _now(opts: BuildOptions) -> str:
    if opts.now:
        return opts.now
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _host_order(hostname: str, one_label: bool) -> tuple:
    if hostname == "":
        return (2, 0, 0, "")
    if hostname.startswith("*."):
        return (1, -len(hostname), 0 if one_label else 1, hostname)
    return (0, 0, 0, hostname)


def _assemble(acc: _Acc, default_route: Route | None, default_cert: Certificate | None) -> Listener:
    groups: dict[tuple[str, bool], list[tuple[tuple, Route]]] = {}
    for host, one_label, key, route in acc.routes:
        groups.setdefault((host, one_label), []).append((key, route))
    # A one-label (Ingress) wildcard also carries the many-label (Gateway) wildcard's
    # routes of the same pattern: it is tried first and there is no fall-through.
    for (host, one_label), entries in list(groups.items()):
        if one_label and (host, False) in groups:
            entries.extend(groups[(host, False)])
    if acc.ingress and default_route is not None:
        groups.setdefault(("", False), [])
    hosts = []
    for host, one_label in sorted(groups, key=lambda hk: _host_order(*hk)):
        routes = [r for _, r in sorted(groups[(host, one_label)], key=lambda e: e[0])]
        if acc.ingress and default_route is not None:
            routes.append(default_route)
        hosts.append(VirtualHost(host, tuple(routes), one_label=one_label))
    certs: list[Certificate] = []
    for _, cert in sorted(acc.certificates, key=lambda e: e[0]):
        if all((c.hostnames, c.cert_pem, c.key_pem) != (cert.hostnames, cert.cert_pem, cert.key_pem)
               for c in certs):
            certs.append(cert)
    https = acc.protocol == "HTTPS"
    return Listener(acc.port, acc.protocol, tuple(hosts), tuple(certs) if https else (),
                    default_cert if https else None)


def _valid_port(port: int) -> bool:
    return isinstance(port, int) and 0 < port < 65536


def build(inp: BuildInput, opts: BuildOptions) -> BuildResult:
    """The route table, statuses and events for these objects (never raises)."""
    col = Collector()
    now = _now(opts)
    resolver = Resolver(inp.services, inp.endpoint_slices, inp.secrets)
    accs: dict[int, _Acc] = {}

    ingresses = served_ingresses(inp.ingresses, inp.ingress_classes, opts.ingress_controller)
    part = build_ingress(ingresses, resolver, col)
    lb = load_balancer_status(opts.addresses)
    for ing in ingresses:
        col.status("networking.k8s.io/v1", "Ingress", namespace_of(ing), name_of(ing), lb)
    if _valid_port(opts.http_port):
        accs[opts.http_port] = _Acc(opts.http_port, "HTTP", ingress=True, routes=list(part.routes))
    if _valid_port(opts.https_port) and opts.https_port not in accs:
        accs[opts.https_port] = _Acc(opts.https_port, "HTTPS", ingress=True, routes=list(part.routes),
                                     certificates=list(part.certificates))

    claims = {port: acc.protocol for port, acc in accs.items()}
    gw = build_gateway(inp.gateway_classes, inp.gateways, inp.http_routes, inp.namespaces,
                       opts.gateway_controller, opts.addresses, claims, resolver, col, now,
                       unavailable=opts.unavailable_ports)
    for port, protocol in gw.ports.items():
        accs.setdefault(port, _Acc(port, protocol))
    for port, key, cert in gw.certificates:
        accs[port].certificates.append((key, cert))
    for e in gw.entries:
        accs[e.port].routes.append((e.hostname, e.one_label, e.key, e.route))

    listeners = []
    for port in sorted(accs):
        acc = accs[port]
        if port in opts.unavailable_ports:
            continue  # the engine cannot listen there (its Gateway listeners say so)
        if acc.protocol == "HTTPS" and not acc.certificates and opts.default_certificate is None:
            continue  # nothing to serve TLS with: the port stays closed
        listeners.append(_assemble(acc, part.default_route, opts.default_certificate))
    table = RouteTable(tuple(listeners), opts.generation)
    return BuildResult(table, col.sorted_statuses(), col.sorted_events())

