"""The shared ingress engine suite: every engine in ingress_engines.ENGINES serves the same
RouteTable and must answer the same way (routing, TLS by SNI, streaming, WebSocket,
splits, retries, error bodies, bad clients, forwarding headers, redirects, filters,
table swaps without cutting requests).  Backends and client: ingress_engines.py.
"""

from __future__ import annotations

import json
import shutil
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest
import trio

from fleet.network.routetable import (
    Backend,
    Certificate,
    Endpoint,
    Engine,
    EngineOptions,
    HeaderFilter,
    Listener,
    Match,
    PathMatch,
    Redirect,
    Route,
    RouteTable,
    Source,
    StringMatch,
    VirtualHost,
)
from tests.integration.ingress_engines import (
    CA,
    ENGINES,
    HttpBackend,
    HttpClient,
    ResetBackend,
    free_port,
    get,
    make_ca,
    make_cert,
    peak_rss_growth,
    raw_exchange,
    ws_echo,
)

SRC = Source("Ingress", "default", "web")
CANARY_SRC = Source("HTTPRoute", "default", "canary")


def be(name: str, *ports: int, weight: int = 1, problem: str = "") -> Backend:
    return Backend("default", name, 80, weight, tuple(Endpoint("127.0.0.1", p) for p in ports), problem)


def prefix(value: str, *backends: Backend, source: Source = SRC, **kw: object) -> Route:
    return Route(source, (Match(PathMatch("Prefix", value)),), tuple(backends), **kw)  # type: ignore[arg-type]


@dataclass
class Rig:
    engine: Engine
    http: int
    https: int
    ca: CA
    a: HttpBackend
    b: HttpBackend
    s: HttpBackend
    reset: ResetBackend
    table: RouteTable
    observed: list[tuple[Source | None, int, float]]

    def tls(self) -> ssl.SSLContext:
        return self.ca.client_context()


def build_table(http: int, https: int, a: int, b: int, s: int, ws: int, reset: int, dead: int,
                certs: tuple[Certificate, ...], default: Certificate) -> RouteTable:
    A, B = be("a", a), be("b", b)
    hosts = (
        VirtualHost("a.example.com", (
            Route(SRC, (Match(PathMatch("Exact", "/foo")),), (B,)),
            prefix("/foo", A),
            prefix("/stream", be("s", s)),
            prefix("/", A),
        )),
        VirtualHost("b.example.com", (prefix("/", B),)),
        VirtualHost("canary.example.com", (
            Route(CANARY_SRC, (Match(PathMatch("Prefix", "/"), headers=(StringMatch("X-Canary", "yes"),)),),
                  (be("b", b),)),
            prefix("/", be("a", a, weight=90), be("b", b, weight=10), source=CANARY_SRC),
        )),
        VirtualHost("retry.example.com", (prefix("/", be("r", dead, reset, a)),)),
        VirtualHost("gone.example.com", (prefix("/", be("gone", problem='service "default/gone" not found')),)),
        VirtualHost("dead.example.com", (prefix("/", be("dead", dead)),)),
        VirtualHost("hang.example.com", (prefix("/", be("a", a), timeout=1.0),)),
        VirtualHost("nobackend.example.com", (prefix("/"),)),
        VirtualHost("redirect.example.com", (
            prefix("/old", redirect=Redirect(path=("ReplacePrefixMatch", "/new"), status_code=301)),
            Route(SRC, (Match(PathMatch("Exact", "/secure")),),
                  redirect=Redirect(scheme="https", hostname="secure.example.com", port=8443)),
        )),
        VirtualHost("filters.example.com", (prefix(
            "/", A,
            request_headers=HeaderFilter(set=(("X-Set", "one"),), add=(("X-Add", "two"),), remove=("X-Remove",)),
            response_headers=HeaderFilter(add=(("X-Resp", "yes"),), remove=("X-Drop-Me",))),)),
        VirtualHost("*.wild.example.com", (prefix("/", B),), one_label=True),
        VirtualHost("", (prefix("/ws", be("ws", ws)),)),
    )
    return RouteTable((Listener(http, "HTTP", hosts),
                       Listener(https, "HTTPS", hosts, certs, default)), generation=1)


@pytest.fixture(params=sorted(ENGINES))
async def rig(request: pytest.FixtureRequest, nursery: trio.Nursery, tmp_path) -> AsyncIterator[Rig]:
    if request.param == "nginx" and shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (apt-get install nginx; tests/run.sh does as root)")
    a, b, s, reset = HttpBackend("a"), HttpBackend("b"), HttpBackend("s"), ResetBackend()
    for srv in (a, b, s, reset):
        await nursery.start(srv.serve)
    ws = await nursery.start(ws_echo)
    ca = make_ca()
    cert_a = Certificate(("a.example.com",), *make_cert(ca, "a.example.com"))
    cert_b = Certificate(("b.example.com", "*.wild.example.com"), *make_cert(ca, "b.example.com", "*.wild.example.com"))
    default = Certificate(("",), *make_cert(ca, "default.example.com"))
    http, https = free_port(), free_port()
    table = build_table(http, https, a.port, b.port, s.port, ws, reset.port, free_port(), (cert_a, cert_b), default)
    observed: list[tuple[Source | None, int, float]] = []
    options = EngineOptions(bind_address="127.0.0.1", connect_timeout=2.0, response_timeout=5.0,
                            keepalive_timeout=3.0, max_header_bytes=8192, max_body_bytes=200 * 1024 * 1024,
                            retries=2, observe=lambda src, st, sec: observed.append((src, st, sec)),
                            runtime_dir=str(tmp_path / "ingress"))
    engine = ENGINES[request.param](options)
    await nursery.start(engine.run)
    await engine.apply(table)
    yield Rig(engine, http, https, ca, a, b, s, reset, table, observed)


async def test_hosts_and_paths_route_over_http(rig: Rig) -> None:
    seen = {}
    for host, path in [("a.example.com", "/"), ("a.example.com", "/foo"), ("a.example.com", "/foo/bar"),
                       ("a.example.com", "/foobar"), ("b.example.com", "/anything"),
                       ("x.wild.example.com", "/"), ("B.Example.COM:80", "/")]:
        r = await get(rig.http, path, host)
        assert r.status == 200, (host, path, r.text)
        seen[(host, path)] = r.json()["backend"]
    assert seen == {("a.example.com", "/"): "a", ("a.example.com", "/foo"): "b",  # Exact before Prefix
                    ("a.example.com", "/foo/bar"): "a", ("a.example.com", "/foobar"): "a",
                    ("b.example.com", "/anything"): "b", ("x.wild.example.com", "/"): "b",
                    ("B.Example.COM:80", "/"): "b"}
    # an Ingress wildcard covers one label only: y.x.wild... falls to the catch-all host, which has no /
    r = await get(rig.http, "/", "y.x.wild.example.com")
    assert r.status == 404 and "no route for host y.x.wild.example.com path /" in r.text
    # observe: once per request, with the route's source (None for the 404)
    assert [(src, st) for src, st, _ in rig.observed] == [(SRC, 200)] * 7 + [(None, 404)]
    assert all(0 <= sec < 5 for _, _, sec in rig.observed)


async def test_https_sni_chooses_the_certificate(rig: Rig) -> None:
    for sni, host, want_backend, want_cn in [("a.example.com", "a.example.com", "a", "a.example.com"),
                                             ("b.example.com", "b.example.com", "b", "b.example.com"),
                                             ("z.wild.example.com", "z.wild.example.com", "b", "b.example.com")]:
        client = HttpClient(rig.https, tls=rig.tls(), sni=sni)  # verifies chain and hostname
        r = await client.request("/", host=host)
        await client.aclose()
        assert r.status == 200 and r.json()["backend"] == want_backend
        assert dict(x[0] for x in client.peer_cert["subject"])["commonName"] == want_cn
        fwd = dict(r.json()["headers"])
        assert fwd["x-forwarded-proto"] == "https" and "proto=https" in fwd["forwarded"]
    # no SNI: the default certificate
    ctx = rig.tls()
    ctx.check_hostname = False
    client = HttpClient(rig.https, tls=ctx, sni=None)
    r = await client.request("/", host="a.example.com")
    await client.aclose()
    assert r.status == 200
    assert dict(x[0] for x in client.peer_cert["subject"])["commonName"] == "default.example.com"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_resolve_over_tls(rig: Rig, tmp_path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(rig.ca.pem)
    argv = ["curl", "-sS", "--max-time", "5", "--cacert", str(ca_file), "--resolve",
            f"b.example.com:{rig.https}:127.0.0.1", f"https://b.example.com:{rig.https}/x"]
    p = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["backend"] == "b"


async def test_websocket_echo_passes(rig: Rig) -> None:
    from trio_websocket import open_websocket

    async with open_websocket("127.0.0.1", rig.http, "/ws", use_ssl=False) as ws:
        for msg in ["hello", "x" * 100_000, "bye"]:
            await ws.send_message(msg)
            assert await ws.get_message() == msg


async def test_streaming_response_arrives_incrementally(rig: Rig) -> None:
    r = await get(rig.http, "/stream?n=5&delay=0.3", "a.example.com")
    assert r.status == 200 and r.text == "".join(f"chunk {i}\n" for i in range(5))
    assert len(rig.s.sent_times) == 5
    # the first chunk reached the client before the backend even sent the last one
    assert r.chunk_times[0] < rig.s.sent_times[-1] - 0.5


async def test_table_swap_does_not_cut_an_inflight_request(rig: Rig) -> None:
    results = []

    async def slow() -> None:
        results.append(await get(rig.http, "/stream?n=6&delay=0.25", "a.example.com"))

    client = HttpClient(rig.http)  # a keep-alive connection open across the swap
    assert (await client.request("/", host="b.example.com")).json()["backend"] == "b"
    async with trio.open_nursery() as n:
        n.start_soon(slow)
        await trio.sleep(0.4)
        # b.example.com now goes to backend a; a.example.com disappears
        lst = rig.table.listeners[0]
        hosts = (VirtualHost("b.example.com", (prefix("/", be("a", rig.a.port)),)),)
        await rig.engine.apply(RouteTable((replace(lst, hosts=hosts),), generation=2))
    assert results[0].status == 200 and results[0].text.count("chunk") == 6
    if rig.engine.name == "nginx":
        # nginx's old workers close their idle keep-alive connections when they hand
        # over to a new configuration (no request is cut; the client reconnects).
        await client.aclose()
        client = HttpClient(rig.http)
    # the keep-alive connection's next request takes the new table
    assert (await client.request("/", host="b.example.com")).json()["backend"] == "a"
    await client.aclose()
    assert (await get(rig.http, "/", "a.example.com")).status == 404
    # the HTTPS port left the table: it is closed
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", rig.https)


async def test_weighted_split_and_header_match(rig: Rig) -> None:
    client = HttpClient(rig.http)
    counts = {"a": 0, "b": 0}
    for _ in range(1000):
        r = await client.request("/", host="canary.example.com")
        counts[r.headers["x-backend"]] += 1
    assert 70 <= counts["b"] <= 130, counts  # 10% ± 3%
    # upstream connections are kept alive and reused
    assert rig.a.connections <= rig.a.requests / 10, (rig.a.connections, rig.a.requests)
    for _ in range(20):
        r = await client.request("/", host="canary.example.com", headers=[("X-Canary", "yes")])
        assert r.headers["x-backend"] == "b"
    await client.aclose()


async def test_retries_go_to_the_healthy_endpoint(rig: Rig) -> None:
    for _ in range(6):  # the round-robin start visits the dead, the resetting and the healthy endpoint
        r = await get(rig.http, "/", "retry.example.com")
        assert r.status == 200 and r.json()["backend"] == "a"
    assert rig.reset.hits >= 1
    # not idempotent: a reset after the request was sent is not retried (connect failures are)
    statuses = {(await get(rig.http, "/", "retry.example.com", method="POST", body=b"x")).status
                for _ in range(6)}
    assert statuses == {200, 502}


async def test_error_bodies(rig: Rig) -> None:
    r = await get(rig.http, "/", "gone.example.com")
    assert r.status == 503 and 'service "default/gone" not found' in r.text
    r = await get(rig.http, "/", "dead.example.com")
    assert r.status == 502 and r.text.strip()
    r = await get(rig.http, "/hang", "hang.example.com")
    assert r.status == 504 and r.text.strip()
    r = await get(rig.http, "/", "nobackend.example.com")
    assert r.status == 500 and r.text.strip()
    r = await get(rig.http, "/nothing", "a.example.com.invalid")
    assert r.status == 404 and "no route for host a.example.com.invalid path /nothing" in r.text
    # An engine may report a moment after answering (nginx: over its access-log socket).
    with trio.move_on_after(5):
        while not {503, 502, 504, 500, 404} <= {st for _, st, _ in rig.observed}:
            await trio.sleep(0.05)
    statuses = [st for _, st, _ in rig.observed]
    assert {503, 502, 504, 500, 404} <= set(statuses)
    assert (None, 404) in [(src, st) for src, st, _ in rig.observed]


async def test_bad_clients_get_4xx_and_others_keep_working(rig: Rig) -> None:
    client = HttpClient(rig.http)
    assert (await client.request("/", host="a.example.com")).status == 200
    out = await raw_exchange(rig.http, b"GET / HTTP/1.1\r\nHost a.example.com\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")
    out = await raw_exchange(rig.http, b"GET / HTTP/1.1\r\nHost: a.example.com\r\nX-Big: "
                             + b"y" * 20_000 + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431")
    out = await raw_exchange(rig.http, b"POST / HTTP/1.1\r\nHost: a.example.com\r\n"
                             b"Content-Length: 300000000\r\n\r\nabc")
    assert out.startswith(b"HTTP/1.1 413")
    assert (await client.request("/", host="a.example.com")).status == 200
    # `client` now idles on its keep-alive connection: closed after the keep-alive timeout.
    # slowloris: a head never finished is closed after the keep-alive timeout (3 s here),
    # while other clients are served
    async with trio.open_nursery() as n:
        outs: list[bytes] = []

        async def slowloris() -> None:
            outs.append(await raw_exchange(rig.http, b"GET / HTTP/1.1\r\nHost: a.exa", timeout=7))

        start = trio.current_time()
        n.start_soon(slowloris)
        await trio.sleep(0.5)
        assert (await get(rig.http, "/", "a.example.com")).status == 200
    assert outs == [b""] and 2.5 < trio.current_time() - start < 6.5
    assert client.stream is not None
    with trio.fail_after(2):
        assert await client.stream.receive_some(100) == b""
    await client.aclose()


async def test_large_bodies_stream_both_ways(rig: Rig) -> None:
    client = HttpClient(rig.http)
    chunk = b"z" * (1 << 20)
    # Client, backends and (for the builtin engine) the proxy share this process: neither
    # 100 MiB body may be held whole anywhere in it.
    with peak_rss_growth() as growth:
        r = await client.request("/upload", host="a.example.com", method="PUT", body=chunk, body_chunks=100)
        assert r.status == 200 and r.json()["body_bytes"] == 100 << 20
        r = await client.request("/big?mb=100", host="a.example.com", discard=True)
        assert r.status == 200 and r.length == 100 << 20
    await client.aclose()
    if growth.kib is not None:
        assert growth.kib < 40 * 1024, f"peak RSS grew {growth.kib} KiB moving 2 x 100 MiB"


async def test_forwarding_headers(rig: Rig) -> None:
    r = await get(rig.http, "/p?q=1", f"b.example.com:{rig.http}",
                  headers=[("X-Forwarded-For", "10.0.0.1"), ("Connection", "keep-alive, X-Hop"),
                           ("X-Hop", "secret"), ("Proxy-Authorization", "x"), ("TE", "trailers")])
    h = r.json()
    headers = {}
    for k, v in h["headers"]:
        headers.setdefault(k.lower(), v)
    assert h["target"] == "/p?q=1"
    assert headers["host"] == f"b.example.com:{rig.http}"
    assert headers["x-forwarded-for"] == "10.0.0.1, 127.0.0.1"
    assert headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-host"] == f"b.example.com:{rig.http}"
    assert headers["x-forwarded-port"] == str(rig.http)
    assert headers["forwarded"] == f'for=127.0.0.1;host="b.example.com:{rig.http}";proto=http'
    hops = ["proxy-authorization", "te"]
    # RFC 9110 §7.6.1: headers the client's Connection names are hop-by-hop too.  nginx
    # drops only a fixed list of hop-by-hop headers (a documented difference).
    if rig.engine.name != "nginx":
        hops.append("x-hop")
    for hop in hops:
        assert hop not in headers


async def test_redirects_and_header_filters(rig: Rig) -> None:
    r = await get(rig.http, "/old/page?x=1", "redirect.example.com")
    assert r.status == 301
    assert r.headers["location"] == f"http://redirect.example.com:{rig.http}/new/page?x=1"
    r = await get(rig.http, "/secure", "redirect.example.com")
    assert r.status == 302 and r.headers["location"] == "https://secure.example.com:8443/secure"
    r = await get(rig.http, "/", "filters.example.com", headers=[("X-Set", "zero"), ("X-Remove", "gone")])
    sent = [(k.lower(), v) for k, v in r.json()["headers"]]
    assert ("x-set", "one") in sent and ("x-set", "zero") not in sent
    assert ("x-add", "two") in sent and not any(k == "x-remove" for k, _ in sent)
    assert r.headers["x-resp"] == "yes" and "x-drop-me" not in r.headers


async def test_port_busy_is_an_engine_error_and_the_rest_serves(rig: Rig) -> None:
    from fleet.network.routetable import EngineError

    busy = trio.socket.socket()
    await busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    lst = rig.table.listeners[0]
    table = RouteTable((*rig.table.listeners, replace(lst, port=port)), generation=3)
    with pytest.raises(EngineError) as raised:
        await rig.engine.apply(table)
    assert raised.value.ports == {port}  # what the controller leaves out and reports
    busy.close()
    assert (await get(rig.http, "/", "a.example.com")).status == 200



async def test_pipelined_requests_and_http10_clients(rig: Rig) -> None:
    out = await raw_exchange(rig.http, b"GET /one HTTP/1.1\r\nHost: a.example.com\r\n\r\n"
                             b"HEAD /two HTTP/1.1\r\nHost: b.example.com\r\n\r\n"
                             b"GET /three HTTP/1.1\r\nHost: a.example.com\r\nConnection: close\r\n\r\n",
                             timeout=3)
    assert out.count(b"HTTP/1.1 200") == 3
    assert out.index(b'"target": "/one"') < out.index(b'"target": "/three"')
    assert b'"target": "/two"' not in out  # HEAD: no body
    with trio.fail_after(3):  # the proxy closes after answering an HTTP/1.0 request
        out = await raw_exchange(rig.http, b"GET / HTTP/1.0\r\nHost: a.example.com\r\n\r\n")
    assert out.startswith(b"HTTP/1.") and b" 200 " in out.split(b"\r\n", 1)[0]
    assert b'"backend": "a"' in out
