"""One HTTPRoute's rules → single-match `Route`s, and Gateway API hostname intersection.

Each match of each rule becomes its own `Route` (with one `Match`), because the
Gateway API orders *matches*, not rules, across all routes of a host.  Filters:
RequestHeaderModifier / ResponseHeaderModifier → `HeaderFilter`, RequestRedirect →
`Redirect`; any other filter type is not supported, and since the spec forbids
skipping a filter, that rule answers 500 (no backends) with a Warning event.
backendRefs: Services in the route's own namespace only (ReferenceGrant is not
served, so a cross-namespace ref is RefNotPermitted); weight 0 refs carry no
traffic, and a rule whose refs all weigh 0 answers 500, as the spec says.  An
invalid ref keeps its weight share and answers with its `problem` (never silently
moved to the other backends).  `timeouts.request` (GEP-1742 duration) → `Route.timeout`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.network.routebuild_backends import Resolver, backend_reason
from fleet.network.routebuild_common import (
    Collector,
    dicts,
    get,
    int_or_none,
    namespace_of,
    text,
)
from fleet.network.routetable import (
    Backend,
    HeaderFilter,
    Match,
    PathMatch,
    Redirect,
    Route,
    Source,
    StringMatch,
)

__all__ = ["RuleSet", "intersect_hostnames", "parse_duration", "route_rules"]

_PATH_TYPES = {"Exact": "Exact", "PathPrefix": "Prefix", "RegularExpression": "RegularExpression"}
_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(value: Any) -> float | None:
    """A Gateway API Duration ("1h30m", "500ms") in seconds; None for absent, invalid or
    zero (zero disables the timeout, which the table spells as "the engine's")."""
    if not isinstance(value, str) or not _DURATION.match(value):
        return None
    total = sum(float(n) * _UNIT[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", value))
    return total or None


def _wild(pattern: str, host: str) -> bool:
    """Gateway API wildcard: "*.x.com" matches one or more labels before ".x.com"."""
    return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1


def intersect_hostnames(listener: str, route: Sequence[str]) -> list[str]:
    """The host patterns a route serves on a listener ("" listener hostname: any)."""
    if not route:
        return [listener]
    if not listener:
        return sorted(set(route))
    out = set()
    for r in route:
        lw, rw = listener.startswith("*."), r.startswith("*.")
        if r == listener:
            out.add(r)
        elif lw and not rw and _wild(listener, r):
            out.add(r)
        elif rw and not lw and _wild(r, listener):
            out.add(listener)
        elif lw and rw:
            if _wild(listener, r[2:]):
                out.add(r)
            elif _wild(r, listener[2:]):
                out.add(listener)
    return sorted(out)


def _string_matches(items: Any) -> tuple[StringMatch, ...]:
    out = []
    for m in dicts(items):
        mtype = "RegularExpression" if m.get("type") == "RegularExpression" else "Exact"
        out.append(StringMatch(text(m.get("name")), text(m.get("value")), mtype))
    return tuple(out)


def _match(m: Mapping[str, Any]) -> Match:
    p = m.get("path") if isinstance(m.get("path"), Mapping) else {}
    ptype = _PATH_TYPES.get(text(p.get("type"), "PathPrefix"), "Prefix")
    method = m.get("method")
    return Match(path=PathMatch(ptype, text(p.get("value")) or "/"),  # type: ignore[arg-type]
                 headers=_string_matches(m.get("headers")),
                 query=_string_matches(m.get("queryParams")),
                 method=method.upper() if isinstance(method, str) and method else None)


def _header_filter(spec: Any) -> HeaderFilter:
    pairs = lambda key: tuple((text(h.get("name")), text(h.get("value")))  # noqa: E731
                              for h in dicts(get(spec, key)))
    remove = get(spec, "remove")
    return HeaderFilter(set=pairs("set"), add=pairs("add"),
                        remove=tuple(r for r in remove if isinstance(r, str)) if isinstance(remove, list) else ())


def _redirect(spec: Any) -> Redirect:
    path = None
    ptype = get(spec, "path", "type")
    if ptype == "ReplaceFullPath":
        path = ("ReplaceFullPath", text(get(spec, "path", "replaceFullPath")))
    elif ptype == "ReplacePrefixMatch":
        path = ("ReplacePrefixMatch", text(get(spec, "path", "replacePrefixMatch")))
    scheme, hostname = get(spec, "scheme"), get(spec, "hostname")
    code = int_or_none(get(spec, "statusCode"))
    return Redirect(scheme=scheme if isinstance(scheme, str) else None,
                    hostname=hostname if isinstance(hostname, str) else None,
                    port=int_or_none(get(spec, "port")), path=path,
                    status_code=code if code in (301, 302, 303, 307, 308) else 302)


@dataclass
class RuleSet:
    """One HTTPRoute's routes and what its refs resolved to."""

    # (rule index, match index, route with a single match)
    routes: list[tuple[int, int, Route]] = field(default_factory=list)
    # The first backendRef problem: (ResolvedRefs reason, message); None when all resolved.
    ref_problem: tuple[str, str] | None = None
    # Why the route cannot be served at all (a regular expression that does not compile).
    invalid: str = ""


def _bad_regex(match: Match) -> str:
    """The first regular expression of a match that does not compile ("" when none)."""
    patterns = [match.path.value] if match.path.type == "RegularExpression" else []
    patterns += [s.value for s in (*match.headers, *match.query) if s.type == "RegularExpression"]
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            return f"regular expression {p!r} is not valid: {e}"
    return ""


def _backends(route: Mapping[str, Any], refs: Any, resolver: Resolver, col: Collector,
              rs: RuleSet) -> list[Backend]:
    ns = namespace_of(route)
    out = []
    for br in dicts(refs):
        group, kind = text(br.get("group")), text(br.get("kind"), "Service")
        bns, name = text(br.get("namespace")) or ns, text(br.get("name"))
        port = int_or_none(br.get("port"))
        weight = int_or_none(br.get("weight"))
        weight = 1 if weight is None or weight < 0 else weight
        ref = f'"{bns}/{name}"'
        reason = ""
        if group not in ("", "core") or kind != "Service":
            reason, b = "InvalidKind", Backend(bns, name, port or 0, weight,
                                               problem=f"backendRef {ref}: kind {group or 'core'}/{kind} "
                                                       "is not supported")
        elif bns != ns:
            reason, b = "RefNotPermitted", Backend(
                bns, name, port or 0, weight,
                problem=f"backendRef to service {ref} in another namespace is not permitted "
                        "(ReferenceGrant is not served)")
        elif port is None:
            reason, b = "BackendNotFound", Backend(bns, name, 0, weight,
                                                   problem=f"backendRef to service {ref} has no port")
        else:
            b = resolver.backend(bns, name, port, weight)
            reason = backend_reason(b)
        if reason:
            col.warn("HTTPRoute", route, reason, b.problem)
            if reason != "NoEndpoints" and rs.ref_problem is None:
                rs.ref_problem = (reason, b.problem)
        if weight > 0:
            out.append(b)
    return out


def route_rules(route: Mapping[str, Any], resolver: Resolver, col: Collector) -> RuleSet:
    """Every (rule, match) of an HTTPRoute as a single-match Route."""
    rs = RuleSet()
    source = Source("HTTPRoute", namespace_of(route), text(get(route, "metadata", "name")))
    for ri, rule in enumerate(dicts(get(route, "spec", "rules"))):
        req = resp = redirect = None
        unsupported = []
        for f in dicts(rule.get("filters")):
            ftype = text(f.get("type"))
            if ftype == "RequestHeaderModifier":
                req = _header_filter(f.get("requestHeaderModifier"))
            elif ftype == "ResponseHeaderModifier":
                resp = _header_filter(f.get("responseHeaderModifier"))
            elif ftype == "RequestRedirect":
                redirect = _redirect(f.get("requestRedirect"))
            else:
                unsupported.append(ftype or "?")
        if any(dicts(br.get("filters")) for br in dicts(rule.get("backendRefs"))):
            unsupported.append("backendRef filters")
        backends = _backends(route, rule.get("backendRefs"), resolver, col, rs)
        if unsupported:
            col.warn("HTTPRoute", route, "UnsupportedFilter",
                     f"rule {ri}: filter {', '.join(unsupported)} is not supported; the rule answers 500")
            backends, redirect = [], None
        timeout = parse_duration(get(rule, "timeouts", "request"))
        matches = dicts(rule.get("matches")) or [{}]
        for mi, m in enumerate(matches):
            match = _match(m)
            rs.invalid = rs.invalid or _bad_regex(match)
            rs.routes.append((ri, mi, Route(source, (match,), tuple(backends), req, resp,
                                            redirect, timeout)))
    if rs.invalid:
        col.warn("HTTPRoute", route, "UnsupportedValue", rs.invalid + "; the route is not served")
        rs.routes = []
    return rs
