"""HTTP/1.1 pieces of the built-in ingress proxy: pure functions over requests and headers.

The proxy (fleet.network.ingress_proxy) parses client requests with
fleet.network.ingress_h1server and frames the rest itself (fleet.network.ingress_exchange,
ingress_upstream.H1Client); what it
does to a request between them is decided here, without I/O, so every rule is testable
on its own:

- `RequestInfo.parse` reads what route selection needs (host without port, decoded
  path, first query values, lower-cased headers) from a parsed request;
- `upstream_request_headers` / `downstream_response_headers` drop hop-by-hop headers
  (RFC 9110 §7.6.1, plus `Proxy-*` and anything `Connection` names), add
  X-Forwarded-* and RFC 7239 `Forwarded`, and apply a route's header filters;
- `redirect_location` builds a RequestRedirect's Location (Gateway API semantics);
- `error_response` makes the short text bodies the proxy answers with itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

from fleet.network.routetable import HeaderFilter, Redirect

Headers = list[tuple[bytes, bytes]]

#: Headers meaningful only for one connection (RFC 9110 §7.6.1); framing headers are
#: re-made by the framing of each side.  `upgrade` is kept for upgrade requests by the caller.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"proxy-connection", b"proxy-authenticate", b"proxy-authorization",
})

_UPSTREAM_DROP = HOP_BY_HOP | {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host",
                               b"x-forwarded-port", b"forwarded"}

#: Methods a proxy may send again to another endpoint (RFC 9110 §9.2.2).
IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


@dataclass(frozen=True)
class RequestInfo:
    """What route selection and header rewriting need from one request."""

    method: str
    host: str  # the Host header without port, lower case
    host_header: str  # as sent (with port), for X-Forwarded-Host and redirects
    path: str  # decoded, without the query string
    raw_path: str  # the request target's path as sent
    query_string: str  # without "?", as sent ("" if none)
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    query: dict[str, str]  # each parameter's first value
    upgrade: bool  # Connection: upgrade with an Upgrade header

    @classmethod
    def parse(cls, method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]]) -> RequestInfo:
        hdrs: dict[str, str] = {}
        for name, value in headers:
            key = name.decode("latin-1").lower()
            val = value.decode("latin-1")
            hdrs[key] = f"{hdrs[key]}, {val}" if key in hdrs else val
        text = target.decode("latin-1")
        if text.startswith(("http://", "https://")):  # absolute form: the authority wins
            rest = text.split("://", 1)[1]
            authority, _, tail = rest.partition("/")
            hdrs["host"] = authority
            text = "/" + tail
        raw_path, _, query_string = text.partition("?")
        host_header = hdrs.get("host", "")
        query: dict[str, str] = {}
        if query_string:
            for k, v in parse_qsl(query_string, keep_blank_values=True):
                query.setdefault(k, v)
        connection = hdrs.get("connection")
        conn_tokens = {t.strip().lower() for t in connection.split(",")} if connection else set()
        return cls(
            method=method.decode("ascii", "replace").upper(),
            host=strip_port(host_header).lower().rstrip("."),
            host_header=host_header,
            path=(unquote(raw_path) if "%" in raw_path else raw_path) or "/",
            raw_path=raw_path or "/",
            query_string=query_string,
            headers=hdrs,
            query=query,
            upgrade="upgrade" in conn_tokens and "upgrade" in hdrs,
        )


def strip_port(host: str) -> str:
    """'example.com:8080' → 'example.com'; '[::1]:80' → '::1'."""
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


def connection_tokens(headers: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names the `Connection` header marks as hop-by-hop."""
    out: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            out.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return out


def strip_hop_by_hop(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    drop = connection_tokens(headers)
    return [(n, v) for n, v in headers
            if (ln := n.lower()) not in HOP_BY_HOP and ln not in drop and not ln.startswith(b"proxy-")]


def forwarded_for_node(ip: str) -> str:
    """RFC 7239 §6: an IPv6 node is bracketed and the whole value quoted."""
    # A peer address from getpeername: a colon means IPv6 (cheaper than ipaddress per request).
    return f'"[{ip}]"' if ":" in ip else ip


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _quote_if_needed(value: str) -> str:
    # A regex: a generator over the characters was a measurable share of each request.
    return value if _TOKEN.fullmatch(value) else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _safe(name: str, value: str) -> bool:
    """A header the proxy may send: a token name, no control characters in the value
    (the proxy writes heads without re-validating them, so nothing may smuggle a CR/LF)."""
    return (bool(name) and all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name)
            and not any(c in value for c in "\r\n\0"))


def apply_filter(headers: Headers, flt: HeaderFilter | None) -> Headers:
    """Gateway API HTTPHeaderFilter: `set` replaces, `add` appends, `remove` drops.
    Malformed names or values (which validation should have refused) are skipped."""
    if flt is None:
        return headers
    out = list(headers)
    for name, value in flt.set:
        if not _safe(name, value):
            continue
        key = name.lower().encode("latin-1")
        out = [(n, v) for n, v in out if n.lower() != key]
        out.append((name.encode("latin-1"), value.encode("latin-1")))
    for name, value in flt.add:
        if not _safe(name, value):
            continue
        out.append((name.encode("latin-1"), value.encode("latin-1")))
    if flt.remove:
        gone = {r.lower().encode("latin-1") for r in flt.remove}
        out = [(n, v) for n, v in out if n.lower() not in gone]
    return out


def upstream_request_headers(headers: Sequence[tuple[bytes, bytes]], info: RequestInfo, *,
                             client_ip: str, scheme: str, port: int,
                             flt: HeaderFilter | None) -> Headers:
    """The headers sent to the backend: hop-by-hop gone (Upgrade kept for upgrades),
    X-Forwarded-For appended, X-Forwarded-Proto/Host/Port set, `Forwarded` appended,
    Host passed through, then the route's RequestHeaderModifier."""
    # One pass (this runs for every request): hop-by-hop and the forwarding headers
    # the proxy re-makes are dropped.
    drop = connection_tokens(headers) if "connection" in info.headers else ()
    out = [(n, v) for n, v in headers
           if (ln := n.lower()) not in _UPSTREAM_DROP and ln not in drop and not ln.startswith(b"proxy-")]
    xff = info.headers.get("x-forwarded-for")
    out.append((b"x-forwarded-for", (f"{xff}, {client_ip}" if xff else client_ip).encode("latin-1")))
    out.append((b"x-forwarded-proto", scheme.encode()))
    if info.host_header:
        out.append((b"x-forwarded-host", info.host_header.encode("latin-1")))
    out.append((b"x-forwarded-port", str(port).encode()))
    element = f"for={forwarded_for_node(client_ip)}"
    if info.host_header:
        element += f";host={_quote_if_needed(info.host_header)}"
    element += f";proto={scheme}"
    prior = info.headers.get("forwarded")
    out.append((b"forwarded", (f"{prior}, {element}" if prior else element).encode("latin-1")))
    if info.upgrade:
        out.append((b"connection", b"upgrade"))
        out.append((b"upgrade", info.headers["upgrade"].encode("latin-1")))
    return apply_filter(out, flt)


def downstream_response_headers(headers: Sequence[tuple[bytes, bytes]], *, upgrade: bool,
                                flt: HeaderFilter | None) -> Headers:
    """The backend's response headers for the client: hop-by-hop gone (kept for a 101)."""
    if upgrade:
        return apply_filter(list(headers), flt)
    return apply_filter(strip_hop_by_hop(headers), flt)


def redirect_location(redirect: Redirect, info: RequestInfo, *, scheme: str, listener_port: int,
                      matched_prefix: str | None) -> str:
    """Gateway API RequestRedirect: each None field keeps the request's value; the port
    is left out when it is the scheme's default; ReplacePrefixMatch swaps only the
    matched prefix of the path."""
    new_scheme = redirect.scheme or scheme
    host = redirect.hostname or info.host or "localhost"
    if redirect.port is not None:
        port: int | None = redirect.port
    elif redirect.scheme is not None:
        port = None  # a scheme change without a port: that scheme's well-known port
    else:
        port = listener_port
    default = {"http": 80, "https": 443}.get(new_scheme)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    authority = host if port is None or port == default else f"{host}:{port}"
    path = info.raw_path
    if redirect.path is not None:
        kind, value = redirect.path
        if kind == "ReplaceFullPath":
            path = value or "/"
        elif kind == "ReplacePrefixMatch" and matched_prefix is not None:
            prefix = matched_prefix.rstrip("/")
            rest = path[len(prefix):] if path.startswith(prefix) else path
            base = value.rstrip("/")
            path = (base + rest) if rest.startswith("/") or not rest else f"{base}/{rest}"
            path = path or "/"
    query = f"?{info.query_string}" if info.query_string else ""
    return f"{new_scheme}://{authority}{path}{query}"


REASONS = {301: b"Moved Permanently", 302: b"Found", 303: b"See Other", 307: b"Temporary Redirect",
           308: b"Permanent Redirect", 400: b"Bad Request", 404: b"Not Found", 413: b"Content Too Large",
           431: b"Request Header Fields Too Large", 500: b"Internal Server Error", 502: b"Bad Gateway",
           501: b"Not Implemented", 503: b"Service Unavailable", 504: b"Gateway Timeout"}


def error_response(status: int, text: str, extra: Sequence[tuple[bytes, bytes]] = ()) -> tuple[Headers, bytes]:
    """Headers and a one-line text body for a response the proxy makes itself."""
    body = (text.rstrip("\n") + "\n").encode("utf-8")
    headers: Headers = [(b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()), *extra]
    return headers, body
