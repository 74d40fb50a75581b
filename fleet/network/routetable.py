"""The route table: what every ingress engine serves, built from Ingress and Gateway API.

One pure data structure sits between the control plane and the data planes:

    Ingress, IngressClass, Gateway, GatewayClass, HTTPRoute, Service, EndpointSlice, Secret
        └─ fleet.network.routebuild.build(...) ─→ BuildResult(table, statuses, events)
                                                    │
              RouteTable ─→ Engine.apply(table) ────┴─ built-in Trio proxy (fleet.network.ingress_proxy)
                                                     └─ nginx, configured and reloaded (fleet.network.ingress_nginx)

The table is immutable (frozen dataclasses, tuples): an engine swaps the whole
table at once, and a request in flight keeps the table it started with, so a
rule or endpoint change never cuts an open connection.

Order is meaning.  `Listener.hosts` is already sorted by host precedence (an
exact host before wildcards, a longer wildcard before a shorter one, the
catch-all "" last) and `VirtualHost.routes` by route precedence (Gateway API's
rules, which also give Ingress' "Exact before Prefix, longer path first"), so
an engine takes the FIRST host that matches and then the FIRST route that
matches — `RouteTable.select` is that reading, and both engines must agree with it
(the shared routing test suite checks that they do).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

import trio

PathType = Literal["Exact", "Prefix", "RegularExpression"]
StringMatchType = Literal["Exact", "RegularExpression"]


@dataclass(frozen=True)
class Source:
    """The object a route (or certificate) came from: for metrics, events and 503 bodies."""

    kind: str  # "Ingress" or "HTTPRoute"
    namespace: str
    name: str


@dataclass(frozen=True)
class Endpoint:
    """One ready address a backend's traffic may go to."""

    address: str  # an IP, or a DNS name for an ExternalName Service
    port: int


@dataclass(frozen=True)
class Backend:
    """A Service port resolved to its ready endpoints, with a weight for splits.

    `endpoints` empty means 503; `problem` then says why in words a user can act on
    ('service "default/web" not found', 'no ready endpoints for service "default/web"').
    """

    namespace: str
    service: str
    port: int | str  # the Service port as the route named it (number or name)
    weight: int = 1
    endpoints: tuple[Endpoint, ...] = ()
    problem: str = ""


@dataclass(frozen=True)
class PathMatch:
    type: PathType = "Prefix"
    value: str = "/"

    def matches(self, path: str) -> bool:
        """Prefix is element-wise (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`);
        a trailing slash in the rule is ignored; RegularExpression must match the
        whole path."""
        if self.type == "Exact":
            return path == self.value
        if self.type == "RegularExpression":
            return re.fullmatch(self.value, path) is not None
        prefix = self.value.rstrip("/")
        return prefix == "" or path == prefix or path.startswith(prefix + "/")


@dataclass(frozen=True)
class StringMatch:
    """A header or query parameter match (header names compare case-insensitively)."""

    name: str
    value: str
    type: StringMatchType = "Exact"

    def matches(self, actual: str | None) -> bool:
        if actual is None:
            return False
        if self.type == "RegularExpression":
            return re.fullmatch(self.value, actual) is not None
        return actual == self.value


@dataclass(frozen=True)
class Match:
    """All of its parts must hold (a route matches when any of its `matches` does)."""

    path: PathMatch = PathMatch()
    headers: tuple[StringMatch, ...] = ()
    query: tuple[StringMatch, ...] = ()
    method: str | None = None

    def matches(self, method: str, path: str, headers: Mapping[str, str],
                query: Mapping[str, str]) -> bool:
        """`headers` keys are lower case; `query` holds each parameter's first value."""
        if self.method is not None and method.upper() != self.method:
            return False
        if not self.path.matches(path):
            return False
        if not all(h.matches(headers.get(h.name.lower())) for h in self.headers):
            return False
        return all(q.matches(query.get(q.name)) for q in self.query)


@dataclass(frozen=True)
class HeaderFilter:
    """Gateway API's RequestHeaderModifier / ResponseHeaderModifier."""

    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class Redirect:
    """Gateway API's RequestRedirect; None fields keep the request's value."""

    scheme: str | None = None
    hostname: str | None = None
    port: int | None = None
    # ("ReplaceFullPath", "/new") or ("ReplacePrefixMatch", "/new"); None keeps the path.
    path: tuple[str, str] | None = None
    status_code: int = 302


@dataclass(frozen=True)
class Route:
    """One rule: when any of `matches` holds, filters apply, then a redirect or a backend."""

    source: Source
    matches: tuple[Match, ...] = (Match(),)
    backends: tuple[Backend, ...] = ()  # picked by weight; none (and no redirect): 500
    request_headers: HeaderFilter | None = None
    response_headers: HeaderFilter | None = None
    redirect: Redirect | None = None
    # Whole-request timeout in seconds (HTTPRoute `timeouts.request`); None: the engine's.
    timeout: float | None = None


@dataclass(frozen=True)
class VirtualHost:
    """Routes for one host pattern: "" (any host), "example.com" or "*.example.com".

    A Gateway API wildcard matches one or more leading labels; an Ingress wildcard
    exactly one (`*.foo.com` matches `bar.foo.com`, not `baz.bar.foo.com`): the
    builder sets `one_label` for hosts that came from Ingress rules."""

    hostname: str
    routes: tuple[Route, ...]
    one_label: bool = False

    def matches(self, host: str) -> bool:
        return host_rank(self.hostname, host.lower(), one_label=self.one_label) is not None


@dataclass(frozen=True)
class Certificate:
    """A serving certificate and the host patterns it is for (from a TLS Secret)."""

    hostnames: tuple[str, ...]  # "" in it: any host
    cert_pem: bytes
    key_pem: bytes
    source: Source | None = None


@dataclass(frozen=True)
class Listener:
    """One port the engine listens on."""

    port: int
    protocol: Literal["HTTP", "HTTPS"]
    hosts: tuple[VirtualHost, ...] = ()
    certificates: tuple[Certificate, ...] = ()  # HTTPS only, chosen by SNI (`certificate_for`)
    default_certificate: Certificate | None = None  # when no certificate matches the SNI name

    def certificate_for(self, server_name: str | None) -> Certificate | None:
        """The certificate for an SNI name: an exact hostname first, then a wildcard
        (one label, as in X.509), then a certificate for any host, then the default."""
        name = (server_name or "").lower().rstrip(".")
        best: tuple[int, Certificate] | None = None
        for cert in self.certificates:
            for pattern in cert.hostnames:
                rank = host_rank(pattern, name, one_label=True)
                if rank is not None and (best is None or rank > best[0]):
                    best = (rank, cert)
        return best[1] if best is not None else self.default_certificate


@dataclass(frozen=True)
class Selection:
    """What `RouteTable.select` found."""

    host: VirtualHost
    route: Route


@dataclass(frozen=True)
class RouteTable:
    listeners: tuple[Listener, ...] = ()
    # A monotonically increasing number per build, for logs and the engines' own bookkeeping.
    generation: int = 0

    def listener(self, port: int) -> Listener | None:
        for lst in self.listeners:
            if lst.port == port:
                return lst
        return None

    def select(self, port: int, host: str, method: str, path: str,
               headers: Mapping[str, str] | None = None,
               query: Mapping[str, str] | None = None) -> Selection | None:
        """The route a request takes: the first matching host of the listener on
        `port`, then its first matching route.  None: 404.  `host` is the Host header
        without its port; `path` is the decoded path without the query string."""
        lst = self.listener(port)
        if lst is None:
            return None
        name = host.lower().rstrip(".")
        hdrs = headers or {}
        qs = query or {}
        for vhost in lst.hosts:
            if not vhost.matches(name):
                continue
            for route in vhost.routes:
                if any(m.matches(method, path, hdrs, qs) for m in route.matches):
                    return Selection(vhost, route)
            # Once a host matched, its routes decide: no fall-through to a less
            # specific host (the builder appends an Ingress default backend to
            # every host's routes, as the last one).
            return None
        return None


def host_rank(pattern: str, host: str, *, one_label: bool = False) -> int | None:
    """How specifically `pattern` matches `host` (lower case), higher is more specific; None: no match.

    "" matches anything (rank 0); "*.example.com" matches "a.example.com" and, unless
    `one_label`, "a.b.example.com" (rank = length of the suffix); an exact name ranks
    above every wildcard."""
    pattern = pattern.lower()
    if pattern == "":
        return 0
    if pattern.startswith("*."):
        suffix = pattern[1:]  # ".example.com"
        if not host.endswith(suffix) or len(host) <= len(suffix):
            return None
        if one_label and "." in host[: -len(suffix)]:
            return None
        return len(suffix)
    return 10_000 + len(pattern) if host == pattern else None


@dataclass(frozen=True)
class StatusUpdate:
    """The status an object should have (the controller writes it when it differs)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    status: dict = field(hash=False, compare=False, default_factory=dict)


@dataclass(frozen=True)
class RouteEvent:
    """An Event to record about an object (reason in CamelCase, message for humans)."""

    kind: str
    namespace: str
    name: str
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class BuildResult:
    table: RouteTable
    statuses: tuple[StatusUpdate, ...] = ()
    events: tuple[RouteEvent, ...] = ()


#: Called once per proxied request: (route source or None for a 404, HTTP status, seconds).
RequestObserver = Callable[[Source | None, int, float], None]


@dataclass(frozen=True)
class EngineOptions:
    """What every engine is constructed with (`Engine(options)`)."""

    bind_address: str = "0.0.0.0"
    connect_timeout: float = 5.0  # to a backend; then the next endpoint, or 502/504
    response_timeout: float = 60.0  # a backend silent this long: 504
    keepalive_timeout: float = 75.0  # an idle client connection is closed after this
    max_header_bytes: int = 32 * 1024  # request line + headers; over it: 431
    max_body_bytes: int = 0  # 0: no limit; over it: 413
    retries: int = 2  # extra attempts on other endpoints, idempotent requests only
    observe: RequestObserver | None = None
    # Where an engine keeps its files (nginx: config, certificates on tmpfs, logs).
    runtime_dir: str = "/run/fleet/ingress"


class EngineError(RuntimeError):
    """An engine could not apply a table (the previous one stays in force, or — the
    built-in engine — all of it but what failed).

    `ports` names the listener ports it could not listen on (in use by another
    process, not permitted): the controller builds the table again without them and
    reports them on their Gateways (`Accepted=False`, reason `PortUnavailable`), so one
    unusable port never holds up every other route."""

    def __init__(self, message: str, *, ports: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.ports: frozenset[int] = frozenset(ports)


class Engine(Protocol):
    """A data plane.  `run` serves until cancelled (started with `nursery.start`, it
    reports started once it can accept `apply`); `apply` swaps in a whole table,
    opening and closing listening ports as the table's listeners change, without
    dropping connections that are open."""

    name: str

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...

    async def apply(self, table: RouteTable) -> None: ...
