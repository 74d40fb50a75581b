"""The built-in ingress proxy's pure decisions: request reading, header rewriting,
redirect locations, backend and endpoint picks (fleet.network.ingress_http, ingress_upstream)."""

from __future__ import annotations

import random

from fleet.network.ingress_http import (
    RequestInfo,
    apply_filter,
    downstream_response_headers,
    forwarded_for_node,
    redirect_location,
    strip_hop_by_hop,
    strip_port,
    upstream_request_headers,
)
from fleet.network.ingress_upstream import EndpointCursor, pick_backend
from fleet.network.routetable import (
    Backend,
    Endpoint,
    HeaderFilter,
    Listener,
    Redirect,
    Route,
    RouteTable,
    Source,
    VirtualHost,
)


def info(target: bytes = b"/", host: bytes = b"example.com", *extra: tuple[bytes, bytes],
         method: bytes = b"GET") -> RequestInfo:
    return RequestInfo.parse(method, target, [(b"Host", host), *extra])


def test_strip_port() -> None:
    assert strip_port("example.com:8080") == "example.com"
    assert strip_port("example.com") == "example.com"
    assert strip_port("[::1]:80") == "::1"
    assert strip_port("[::1]") == "::1"


def test_request_info_reads_what_selection_needs() -> None:
    i = info(b"/a%20b/c?x=1&x=2&y=&z=3", b"Example.COM.:8080", (b"X-Canary", b"yes"), (b"X-Canary", b"no"))
    assert (i.host, i.host_header) == ("example.com", "Example.COM.:8080")
    assert (i.path, i.raw_path, i.query_string) == ("/a b/c", "/a%20b/c", "x=1&x=2&y=&z=3")
    assert i.query == {"x": "1", "y": "", "z": "3"}  # first values
    assert i.headers["x-canary"] == "yes, no"
    assert not i.upgrade
    ws = info(b"/ws", b"h", (b"Connection", b"keep-alive, Upgrade"), (b"Upgrade", b"websocket"))
    assert ws.upgrade
    absolute = info(b"http://other.example:81/p?q=1", b"ignored")
    assert (absolute.host, absolute.path, absolute.query) == ("other.example", "/p", {"q": "1"})


def test_hop_by_hop_headers_and_the_ones_connection_names_are_dropped() -> None:
    hdrs = [(b"Connection", b"close, X-Secret"), (b"Keep-Alive", b"5"), (b"TE", b"trailers"),
            (b"Trailer", b"x"), (b"Transfer-Encoding", b"chunked"), (b"Upgrade", b"h2c"),
            (b"Proxy-Authorization", b"x"), (b"Proxy-Foo", b"y"), (b"X-Secret", b"1"),
            (b"Accept", b"*/*"), (b"Content-Length", b"3")]
    assert strip_hop_by_hop(hdrs) == [(b"Accept", b"*/*"), (b"Content-Length", b"3")]
    assert downstream_response_headers(hdrs, upgrade=True, flt=None) == hdrs  # a 101 keeps them


def test_forwarded_for_node_quotes_ipv6() -> None:
    assert forwarded_for_node("10.0.0.1") == "10.0.0.1"
    assert forwarded_for_node("2001:db8::1") == '"[2001:db8::1]"'


def test_forwarded_host_quoted_unless_a_token() -> None:
    def host_of(host: bytes) -> bytes:
        out = dict(upstream_request_headers([(b"host", host)], info(b"/", host), client_ip="10.0.0.1",
                                            scheme="http", port=80, flt=None))
        return out[b"forwarded"].split(b";")[1]
    assert host_of(b"shop.example") == b"host=shop.example"  # RFC 7239: a token goes bare
    assert host_of(b"shop.example:80") == b'host="shop.example:80"'  # ':' is no tchar
    assert host_of("caf\xe9.example".encode("latin-1")) == 'host="caf\xe9.example"'.encode("latin-1")


def test_upstream_headers_append_forwarding_and_keep_host() -> None:
    i = info(b"/", b"shop.example:8080", (b"X-Forwarded-For", b"1.2.3.4"),
             (b"Forwarded", b"for=1.2.3.4"), (b"X-Forwarded-Proto", b"spoofed"))
    out = upstream_request_headers([(b"Host", b"shop.example:8080"), (b"X-Forwarded-For", b"1.2.3.4"),
                                    (b"Forwarded", b"for=1.2.3.4"), (b"X-Forwarded-Proto", b"spoofed")],
                                   i, client_ip="2001:db8::7", scheme="https", port=8443, flt=None)
    d = dict(out)
    assert d[b"Host"] == b"shop.example:8080"
    assert d[b"x-forwarded-for"] == b"1.2.3.4, 2001:db8::7"
    assert d[b"x-forwarded-proto"] == b"https"
    assert d[b"x-forwarded-host"] == b"shop.example:8080"
    assert d[b"x-forwarded-port"] == b"8443"
    assert d[b"forwarded"] == b'for=1.2.3.4, for="[2001:db8::7]";host="shop.example:8080";proto=https'
    assert [k for k, _ in out].count(b"x-forwarded-proto") == 1
    ws = info(b"/ws", b"h", (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"))
    out = upstream_request_headers([(b"Host", b"h"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")],
                                   ws, client_ip="127.0.0.1", scheme="http", port=80, flt=None)
    assert (b"connection", b"upgrade") in out and (b"upgrade", b"websocket") in out


def test_header_filter_set_add_remove_and_refuses_smuggling() -> None:
    flt = HeaderFilter(set=(("X-A", "new"),), add=(("X-B", "2"), ("X-Bad", "a\r\nInjected: 1")),
                       remove=("x-c",))
    out = apply_filter([(b"x-a", b"old"), (b"X-B", b"1"), (b"X-C", b"gone")], flt)
    assert out == [(b"X-B", b"1"), (b"X-A", b"new"), (b"X-B", b"2")]
    assert apply_filter([(b"a", b"b")], None) == [(b"a", b"b")]


def test_redirect_location() -> None:
    i = info(b"/old/page?x=1", b"shop.example:8080")
    loc = redirect_location(Redirect(path=("ReplacePrefixMatch", "/new")), i, scheme="http",
                            listener_port=8080, matched_prefix="/old")
    assert loc == "http://shop.example:8080/new/page?x=1"
    loc = redirect_location(Redirect(path=("ReplacePrefixMatch", "/")), i, scheme="http",
                            listener_port=8080, matched_prefix="/old/")
    assert loc == "http://shop.example:8080/page?x=1"
    loc = redirect_location(Redirect(scheme="https"), i, scheme="http", listener_port=8080, matched_prefix=None)
    assert loc == "https://shop.example/old/page?x=1"  # a scheme change alone: its default port
    loc = redirect_location(Redirect(hostname="b.example", port=80, path=("ReplaceFullPath", "/x")), i,
                            scheme="http", listener_port=8080, matched_prefix="/old")
    assert loc == "http://b.example/x?x=1"


def test_pick_backend_by_weight() -> None:
    rng = random.Random(7)
    a, b, zero = Backend("d", "a", 80, 90), Backend("d", "b", 80, 10), Backend("d", "z", 80, 0)
    picks = [pick_backend((a, b, zero), rng).service for _ in range(10_000)]  # type: ignore[union-attr]
    assert 850 <= picks.count("b") <= 1150 and "z" not in picks
    assert pick_backend((zero,)) is None
    assert pick_backend(()) is None


def test_endpoint_cursor_rotates_and_lists_the_others_for_retries() -> None:
    eps = tuple(Endpoint(f"10.0.0.{i}", 80) for i in range(3))
    be = Backend("d", "web", 80, 1, eps)
    cur = EndpointCursor()
    orders = [cur.order(be) for _ in range(4)]
    assert [o[0] for o in orders] == [eps[0], eps[1], eps[2], eps[0]]
    assert all(sorted(o, key=str) == sorted(eps, key=str) for o in orders)
    # a new table with the same Service keeps rotating
    assert cur.order(Backend("d", "web", 80, 1, eps))[0] == eps[1]
    assert cur.order(Backend("d", "empty", 80)) == []
    # positions of Services no longer routed to are dropped
    table = RouteTable((Listener(80, "HTTP", (VirtualHost("", (Route(Source("Ingress", "d", "i"), backends=(be,)),)),)),))
    cur.order(Backend("d", "gone", 80, 1, eps))
    cur.prune(table)
    assert cur.order(be)[0] == eps[2] and cur.order(Backend("d", "gone", 80, 1, eps))[0] == eps[0]
