"""The nginx ingress engine with a real nginx and real loopback backends.

Each test starts its own `NginxEngine` (its own runtime dir under /run, free ports)
and tiny Trio HTTP backends that answer with their name, so a response says which
route a request took.  nginx is stopped by the engine (by pid, SIGQUIT then SIGTERM)
when the test's nursery is cancelled.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from fleet.network.ingress_nginx import NginxEngine
from fleet.network.routetable import (
    Backend,
    Certificate,
    Endpoint,
    EngineError,
    EngineOptions,
    Listener,
    Match,
    PathMatch,
    Route,
    RouteTable,
    Source,
    StringMatch,
    VirtualHost,
)

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- backends


class Backends:
    """Tiny HTTP/1.1 servers on loopback: GET /anything answers JSON naming the backend;
    /slow sleeps 1.5 s first, /stream sends two chunks 0.8 s apart, /hang never answers,
    an Upgrade: websocket request gets 101 and an echo of whatever follows."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery

    async def start(self, name: str) -> Endpoint:
        serve = functools.partial(trio.serve_tcp, functools.partial(self._serve, name), 0, host="127.0.0.1")
        listeners = await self.nursery.start(serve)
        return Endpoint("127.0.0.1", listeners[0].socket.getsockname()[1])

    async def _serve(self, name: str, stream: trio.SocketStream) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    buf += await stream.receive_some(65536)
                body, buf = buf[:length], buf[length:]
                if headers.get("upgrade", "").lower() == "websocket":
                    await stream.send_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                          b"Connection: Upgrade\r\n\r\n" + buf)
                    while data := await stream.receive_some(65536):
                        await stream.send_all(data)
                    return
                path = target.split("?", 1)[0]
                if path == "/hang":
                    await trio.sleep_forever()
                if path == "/slow":
                    await trio.sleep(1.5)
                if path == "/stream":
                    await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                          b"6\r\nfirst\n\r\n")
                    await trio.sleep(0.8)
                    await stream.send_all(b"7\r\nsecond\n\r\n0\r\n\r\n")
                    continue
                payload = json.dumps({"backend": name, "method": method, "target": target,
                                      "headers": headers, "body": len(body)}).encode()
                await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                      b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        except (trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
            return


def backend(name: str, *endpoints: Endpoint, weight: int = 1, problem: str = "") -> Backend:
    return Backend("default", name, 80, weight, tuple(endpoints), problem)


def route(name: str, *backends: Backend, matches: tuple[Match, ...] = (Match(),), **kw) -> Route:
    return Route(Source("HTTPRoute", "default", name), matches, backends, **kw)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[dict]:
    base = "/run" if os.access("/run", os.W_OK) else str(tmp_path)
    runtime = tempfile.mkdtemp(prefix="fleet-n12-nginx-", dir=base)
    observed: list[tuple[Source | None, int, float]] = []
    engine = NginxEngine(EngineOptions(bind_address="127.0.0.1", runtime_dir=runtime, connect_timeout=1.0,
                                       response_timeout=5.0, observe=lambda *a: observed.append(a)),
                         stop_grace=3.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            yield {"engine": engine, "backends": Backends(nursery), "observed": observed, "runtime": runtime}
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


async def get(port: int, path: str, host: str = "example.com", **kw) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}", headers={"Host": host, **kw.pop("headers", {})},
                                **kw)


def who(resp: httpx.Response) -> str | None:
    return resp.json()["backend"] if resp.status_code == 200 else None



def self_signed(name: str) -> Certificate:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))
    return Certificate((name,), cert.public_bytes(serialization.Encoding.PEM),
                       key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))


# ---------------------------------------------------------------- tests


async def test_hosts_and_paths_route_to_their_services(env) -> None:
    b = env["backends"]
    a1, a2, b1, b2 = [await b.start(n) for n in ("a-web", "a-api", "b-web", "b-api")]
    port = free_port()
    table = RouteTable((Listener(port, "HTTP", (
        VirtualHost("a.example.com", (route("a-api", backend("a-api", a2), matches=(Match(PathMatch("Prefix", "/api")),)),
                                      route("a-web", backend("a-web", a1)))),
        VirtualHost("b.example.com", (route("b-api", backend("b-api", b2), matches=(Match(PathMatch("Prefix", "/api")),)),
                                      route("b-web", backend("b-web", b1)))),
    )),), 1)
    await env["engine"].apply(table)
    assert who(await get(port, "/api/v1", "a.example.com")) == "a-api"
    assert who(await get(port, "/apix", "a.example.com")) == "a-web"  # Prefix is element-wise
    assert who(await get(port, "/", "A.Example.com:8080")) == "a-web"
    assert who(await get(port, "/api", "b.example.com")) == "b-api"
    assert who(await get(port, "/index.html", "b.example.com")) == "b-web"
    r = await get(port, "/", "c.example.com")
    assert r.status_code == 404 and "no route for host c.example.com path /" in r.text
    hdrs = (await get(port, "/api?x=1", "a.example.com", headers={"X-Forwarded-For": "10.9.9.9",
                                                                   "Forwarded": "for=10.9.9.9"})).json()
    assert hdrs["target"] == "/api?x=1"
    assert hdrs["headers"]["x-forwarded-for"] == "10.9.9.9, 127.0.0.1"
    assert hdrs["headers"]["forwarded"] == 'for=10.9.9.9, for=127.0.0.1;host="a.example.com";proto=http'
    assert hdrs["headers"]["x-forwarded-proto"] == "http" and hdrs["headers"]["host"] == "a.example.com"


async def test_first_match_equals_routetable_select(env) -> None:
    b = env["backends"]
    names = [f"r{i}" for i in range(9)]
    eps = {n: await b.start(n) for n in names}

    def r(i: int, *matches: Match) -> Route:
        return route(names[i], backend(names[i], eps[names[i]]), matches=matches or (Match(),))

    port = free_port()
    hosts = (
        VirtualHost("api.example.com", (
            r(0, Match(PathMatch("Exact", "/v1/users"))),
            r(1, Match(PathMatch("Prefix", "/v1"), headers=(StringMatch("X-Canary", "yes"),))),
            r(2, Match(PathMatch("Prefix", "/v1"), query=(StringMatch("debug", "1"),))),
            r(3, Match(PathMatch("RegularExpression", r"/v[0-9]+/(?P<id>item-\d+)"), method="POST")),
            r(4, Match(PathMatch("Prefix", "/v1")), Match(PathMatch("Prefix", "/v2"))),
        )),
        VirtualHost("*.example.com", (r(5, Match(PathMatch("Prefix", "/static/"))),), one_label=True),
        VirtualHost("*.com", (r(6, Match(PathMatch("Prefix", "/"), headers=(StringMatch("X-Env", "st.*",
                                                                                          "RegularExpression"),))),
                              r(7, Match(PathMatch("Exact", "/")))),
                    ),
        VirtualHost("", (r(8, Match(PathMatch("Prefix", "/health"))),)),
    )
    table = RouteTable((Listener(port, "HTTP", hosts),), 1)
    await env["engine"].apply(table)
    rng = random.Random(12)
    host_choices = ["api.example.com", "www.example.com", "a.b.example.com", "shop.com", "other.org", "API.example.com"]
    path_choices = ["/v1/users", "/v1/users/1", "/v1", "/v2/x", "/v3/item-12", "/v1/item-7", "/static/a.css",
                    "/static", "/", "/health", "/healthz", "/other"]
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(48):
            host, path = rng.choice(host_choices), rng.choice(path_choices)
            method = rng.choice(["GET", "GET", "POST"])
            headers = {}
            if rng.random() < 0.4:
                headers["X-Canary"] = rng.choice(["yes", "no"])
            if rng.random() < 0.4:
                headers["X-Env"] = rng.choice(["staging", "prod", "st"])
            query = {"debug": rng.choice(["1", "0"])} if rng.random() < 0.4 else {}
            sel = table.select(port, host, method, path, {k.lower(): v for k, v in headers.items()}, query)
            expected = sel.route.source.name if sel else None
            url = f"http://127.0.0.1:{port}{path}" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
            resp = await client.request(method, url, headers={"Host": host, **headers})
            assert who(resp) == expected, (method, host, path, headers, query, resp.status_code, resp.text)


async def test_tls_sni_picks_the_certificate(env) -> None:
    a = await env["backends"].start("secure")
    port = free_port()
    one, two, fallback = self_signed("one.example.com"), self_signed("two.example.com"), self_signed("default.local")
    vhost = VirtualHost("", (route("secure", backend("secure", a)),))
    await env["engine"].apply(RouteTable((Listener(port, "HTTPS", (vhost,), (one, two), fallback),), 1))

    def served_certificate(server_name: str | None) -> bytes:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=server_name) as tls:
            return ssl.DER_cert_to_PEM_cert(tls.getpeercert(binary_form=True)).encode()

    def same(pem: bytes, cert: Certificate) -> bool:
        return ssl.PEM_cert_to_DER_cert(pem.decode()) == ssl.PEM_cert_to_DER_cert(cert.cert_pem.decode())

    assert same(await trio.to_thread.run_sync(served_certificate, "one.example.com"), one)
    assert same(await trio.to_thread.run_sync(served_certificate, "two.example.com"), two)
    assert same(await trio.to_thread.run_sync(served_certificate, "three.example.com"), fallback)
    if shutil.which("curl"):
        ca = Path(env["runtime"]) / "ca-two.pem"
        ca.write_bytes(two.cert_pem)
        out = await trio.run_process(["curl", "-sS", "--max-time", "5", "--cacert", str(ca), "--resolve",
                                      f"two.example.com:{port}:127.0.0.1", f"https://two.example.com:{port}/x"],
                                     capture_stdout=True, capture_stderr=True, check=False)
        assert out.returncode == 0, out.stderr
        body = json.loads(out.stdout)
        assert body["backend"] == "secure" and body["headers"]["x-forwarded-proto"] == "https"


async def test_websocket_and_streaming_pass_through(env) -> None:
    a = await env["backends"].start("ws")
    port = free_port()
    await env["engine"].apply(RouteTable((Listener(port, "HTTP", (VirtualHost("", (route("ws", backend("ws", a)),)),)),), 1))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        data = b""
        with trio.fail_after(5):
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(4096)
        assert data.startswith(b"HTTP/1.1 101")
        for message in (b"hello", b"over nginx"):
            await stream.send_all(message)
            got = b""
            with trio.fail_after(5):
                while len(got) < len(message):
                    got += await stream.receive_some(4096)
            assert got == message
    # Streaming: the first chunk arrives before the backend has sent the second.
    async with httpx.AsyncClient(timeout=10) as client:
        start = trio.current_time()
        async with client.stream("GET", f"http://127.0.0.1:{port}/stream") as resp:
            chunks = []
            async for chunk in resp.aiter_raw():
                chunks.append((trio.current_time() - start, chunk))
    assert b"".join(c for _, c in chunks) == b"first\nsecond\n"
    assert chunks[0][1].startswith(b"first") and chunks[0][0] < 0.6


async def test_reload_does_not_cut_an_inflight_request(env) -> None:
    a, b2 = await env["backends"].start("old"), await env["backends"].start("new")
    port = free_port()
    engine = env["engine"]

    def table(name: str, ep: Endpoint, generation: int) -> RouteTable:
        return RouteTable((Listener(port, "HTTP", (VirtualHost("", (route(name, backend(name, ep)),)),)),), generation)

    await engine.apply(table("old", a, 1))
    result: dict = {}

    async def slow() -> None:
        result["resp"] = await get(port, "/slow")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await trio.sleep(0.3)
        await engine.apply(table("new", b2, 2))
        assert who(await get(port, "/")) == "new"  # the reload is live when apply returns
    assert who(result["resp"]) == "old"


async def test_weighted_split_and_header_canary(env) -> None:
    b = env["backends"]
    main, canary = await b.start("main"), await b.start("canary")
    port = free_port()
    routes = (
        route("pinned", backend("canary", canary), matches=(Match(headers=(StringMatch("X-Canary", "always"),)),)),
        route("split", backend("main", main, weight=90), backend("canary", canary, weight=10)),
    )
    await env["engine"].apply(RouteTable((Listener(port, "HTTP", (VirtualHost("", routes),)),), 1))
    counts = {"main": 0, "canary": 0}

    async def requests(n: int) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(n):
                counts[(await client.get(f"http://127.0.0.1:{port}/")).json()["backend"]] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(requests, 250)
    assert sum(counts.values()) == 1000
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(20):
            r = await client.get(f"http://127.0.0.1:{port}/", headers={"X-Canary": "always"})
            assert r.json()["backend"] == "canary"
    assert 70 <= counts["canary"] <= 130, counts


async def test_error_bodies_and_observer(env) -> None:
    b = env["backends"]
    hang = await b.start("hang")
    port, dead = free_port(), free_port()  # nothing listens on `dead`
    routes = (
        route("empty", backend("missing", problem='service "default/missing" not found'),
              matches=(Match(PathMatch("Prefix", "/empty")),)),
        route("refused", backend("dead", Endpoint("127.0.0.1", dead)), matches=(Match(PathMatch("Prefix", "/dead")),)),
        route("slow", backend("hang", hang), matches=(Match(PathMatch("Prefix", "/hang")),), timeout=0.5),
        route("ok", backend("hang", hang)),
    )
    await env["engine"].apply(RouteTable((Listener(port, "HTTP", (VirtualHost("", routes),)),), 1))
    r = await get(port, "/empty")
    assert r.status_code == 503 and 'service "default/missing" not found' in r.text
    r = await get(port, "/dead")
    assert r.status_code == 502 and "Bad Gateway" in r.text and f"127.0.0.1:{dead}" in r.text
    r = await get(port, "/hang")
    assert r.status_code == 504 and "Gateway Timeout" in r.text
    r = await get(port, "/", headers={"X-Big": "x" * 40_000})
    assert r.status_code == 431 and "Too Large" in r.text
    assert who(await get(port, "/anything")) == "hang"
    expected = {("empty", 503), ("refused", 502), ("slow", 504), ("ok", 200)}
    expected |= {("(none)", 431)}  # answered before routing: no route
    with trio.fail_after(5):
        while not expected <= {(s.name if s else "(none)", code) for s, code, _ in env["observed"]}:
            await trio.sleep(0.05)
    assert all(secs >= 0 for _, _, secs in env["observed"])


async def test_a_refused_configuration_keeps_the_previous_one(env) -> None:
    a = await env["backends"].start("a")
    port = free_port()
    good = RouteTable((Listener(port, "HTTP", (VirtualHost("", (route("a", backend("a", a)),)),)),), 1)
    await env["engine"].apply(good)
    broken = Certificate(("x.example.com",), b"not a certificate", b"not a key")
    bad = RouteTable((*good.listeners, Listener(free_port(), "HTTPS", (), (broken,))), 2)
    with pytest.raises(EngineError, match="nginx refused"):
        await env["engine"].apply(bad)
    assert who(await get(port, "/")) == "a"
    # A port nginx cannot bind would pass `nginx -t` and fail the reload: the engine
    # finds it first and names it, for the controller to leave out.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        clash = RouteTable((*good.listeners, Listener(taken.getsockname()[1], "HTTP", ())), 3)
        with pytest.raises(EngineError, match="cannot listen") as raised:
            await env["engine"].apply(clash)
        assert raised.value.ports == {taken.getsockname()[1]}
    assert who(await get(port, "/")) == "a"
    await env["engine"].apply(good)


async def test_nginx_is_restarted_when_it_dies(env) -> None:
    a = await env["backends"].start("a")
    port = free_port()
    await env["engine"].apply(RouteTable((Listener(port, "HTTP", (VirtualHost("", (route("a", backend("a", a)),)),)),), 1))
    pid = int(Path(env["runtime"], "nginx.pid").read_text())
    os.kill(pid, 9)
    with trio.fail_after(10):
        while True:
            try:
                if who(await get(port, "/")) == "a":
                    break
            except httpx.TransportError:
                pass
            await trio.sleep(0.1)
    assert int(Path(env["runtime"], "nginx.pid").read_text()) != pid


ENGINE_SCRIPT = """
import sys, trio
from fleet.network.ingress_nginx import NginxEngine
from fleet.network.routetable import EngineOptions

async def main():
    engine = NginxEngine(EngineOptions(bind_address="127.0.0.1", runtime_dir=sys.argv[1]))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        print("ready", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def test_nginx_goes_with_a_killed_engine_process(tmp_path: Path) -> None:
    """SIGKILL gives the engine no chance to stop nginx: the kernel's parent-death
    signal must (else nginx would hold the ports with nobody to reload or stop it)."""
    if shutil.which("setpriv") is None:
        pytest.skip("util-linux setpriv is not installed")
    runtime = tempfile.mkdtemp(prefix="fleet-n12-nginx-", dir="/run" if os.access("/run", os.W_OK) else tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc: subprocess.Popen | None = None
    nginx_pid = None
    try:
        proc = subprocess.Popen([sys.executable, "-c", ENGINE_SCRIPT, runtime], stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        nginx_pid = int(Path(runtime, "nginx.pid").read_text())
        os.kill(proc.pid, 9)
        proc.wait(timeout=10)
        for _ in range(100):
            if not Path(f"/proc/{nginx_pid}").exists():
                break
            time.sleep(0.05)
        assert not Path(f"/proc/{nginx_pid}").exists(), "nginx outlived its engine"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if nginx_pid is not None and Path(f"/proc/{nginx_pid}").exists():
            os.killpg(nginx_pid, 9)
        shutil.rmtree(runtime, ignore_errors=True)


def test_ports_nginx_could_not_bind_are_found_before_and_after_a_reload() -> None:
    from fleet.network.ingress_nginx import _BIND_FAILED, unbindable_ports

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = free_port()
        assert unbindable_ports(frozenset({busy, free}), "127.0.0.1") == {busy}
    line = ('2026/12/02 18:00:00 [emerg] 123#123: bind() to 0.0.0.0:8081 failed (98: Address already in use)'
            ' | 2026/12/02 18:00:00 [emerg] 123#123: bind() to [::]:8443 failed (98: Address already in use)')
    assert sorted(int(p) for p in _BIND_FAILED.findall(line)) == [8081, 8443]
