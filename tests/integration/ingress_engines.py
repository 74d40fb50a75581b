"""What the shared ingress engine suite runs against: the engines and small backends.

`ENGINES` maps an engine name to its constructor (`Engine(options)`); every test in
tests/integration/test_ingress_engines.py runs once per entry, so an engine joins the
suite by being added here.

Backends are tiny Trio servers on 127.0.0.1 and ports from the OS:
- `HttpBackend`: answers every request with JSON (its name, method, target, headers,
  the number of body bytes read — bodies are counted, never kept); `/stream?n=&delay=`
  streams n chunks `delay` seconds apart and records when each one was sent; `/hang`
  reads the request and never answers; `/big?mb=` sends that many MiB.
- `ResetBackend`: reads a request head and resets the connection (RST) before answering.
- `ws_echo`: a WebSocket echo (trio-websocket).
- `HttpClient`: a keep-alive HTTP/1.1 client (h11) that can speak TLS with any SNI name.
- `peak_rss_growth`: how far this process's peak RSS rose during a block.
- `make_ca` / `make_cert`: a test CA and certificates signed by it (cryptography).
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import h11
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.network.ingress_nginx import NginxEngine
from fleet.network.ingress_proxy import ProxyEngine
from fleet.network.routetable import Engine, EngineOptions

#: Engines the shared suite runs against.
ENGINES: dict[str, Callable[[EngineOptions], Engine]] = {
    "builtin": ProxyEngine,
    "nginx": NginxEngine,
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a Listener needs a fixed port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- certificates ---------------------------------------------------------------

@dataclass
class CA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.pem.decode())
        return ctx


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca() -> CA:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("fleet test CA")).issuer_name(_name("fleet test CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return CA(cert, key)


def make_cert(ca: CA, *names: str) -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) for `names` (DNS SANs), signed by `ca`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


# ---- a client -------------------------------------------------------------------

@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    chunk_times: list[float] = field(default_factory=list)  # trio.current_time() per body chunk
    length: int = 0  # body bytes received (kept in `body` unless the request said discard)

    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class HttpClient:
    """One keep-alive connection to 127.0.0.1:port, TLS with `sni` when `tls` is given."""

    def __init__(self, port: int, *, tls: ssl.SSLContext | None = None, sni: str | None = None) -> None:
        self.port, self.tls, self.sni = port, tls, sni
        self.stream: trio.abc.Stream | None = None
        self.conn = h11.Connection(h11.CLIENT)
        self.peer_cert: dict | None = None

    async def _connect(self) -> trio.abc.Stream:
        stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        if self.tls is not None:
            ssl_stream = trio.SSLStream(stream, self.tls, server_hostname=self.sni)
            await ssl_stream.do_handshake()
            self.peer_cert = ssl_stream.getpeercert()
            stream = ssl_stream
        return stream

    async def request(self, path: str, *, host: str, method: str = "GET",
                      headers: Sequence[tuple[str, str]] = (), body: bytes | None = None,
                      body_chunks: int = 0, discard: bool = False) -> Response:
        """Send one request (body as Content-Length, or `body_chunks` copies of `body`
        chunked) and read the whole response (counting, not keeping, its body if `discard`)."""
        if self.stream is None or self.conn.our_state is not h11.IDLE:
            if self.stream is not None:
                await self.stream.aclose()
            self.stream = await self._connect()
            self.conn = h11.Connection(h11.CLIENT)
        hdrs = [("host", host), *headers]
        if body is not None and body_chunks:
            hdrs.append(("transfer-encoding", "chunked"))
        elif body is not None:
            hdrs.append(("content-length", str(len(body))))
        await self._send(h11.Request(method=method, target=path, headers=hdrs))
        if body is not None:
            for _ in range(max(1, body_chunks)):
                await self._send(h11.Data(data=body))
        await self._send(h11.EndOfMessage())
        status, rhdrs, parts, times, length = 0, {}, [], [], 0
        while True:
            ev = self.conn.next_event()
            if ev is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
                continue
            if isinstance(ev, h11.Response):
                status = ev.status_code
                rhdrs = {k.decode().lower(): v.decode() for k, v in ev.headers}
            elif isinstance(ev, h11.Data):
                length += len(ev.data)
                if not discard:
                    parts.append(bytes(ev.data))
                    times.append(trio.current_time())
            elif isinstance(ev, h11.EndOfMessage):
                break
            elif isinstance(ev, h11.ConnectionClosed):
                raise ConnectionError("connection closed before the response ended")
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return Response(status, rhdrs, b"".join(parts), times, length)

    async def _send(self, ev: object) -> None:
        data = self.conn.send(ev)  # type: ignore[arg-type]
        if data:
            assert self.stream is not None
            await self.stream.send_all(data)

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None


async def get(port: int, path: str, host: str, **kw: object) -> Response:
    """One request on a new connection."""
    tls = kw.pop("tls", None)
    sni = kw.pop("sni", None)
    client = HttpClient(port, tls=tls, sni=sni)  # type: ignore[arg-type]
    try:
        return await client.request(path, host=host, **kw)  # type: ignore[arg-type]
    finally:
        await client.aclose()


async def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, read until the peer closes (or `timeout`)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    out = bytearray()
    with trio.move_on_after(timeout):
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            out += chunk
    await stream.aclose()
    return bytes(out)


def _status_kib(field_name: str) -> int:
    for line in open("/proc/self/status").read().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise LookupError(field_name)


class peak_rss_growth:  # noqa: N801 - used as a context manager
    """`with peak_rss_growth() as g: ...` then `g.kib`: the peak RSS during the block
    minus the RSS before it (resets the peak through /proc/self/clear_refs; `g.kib` is
    None where that is not allowed)."""

    def __enter__(self) -> peak_rss_growth:
        self.kib: int | None = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._ok = True
        except OSError:
            self._ok = False
        self._before = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ok:
            self.kib = _status_kib("VmHWM") - self._before


# ---- backends -------------------------------------------------------------------

class HttpBackend:
    """A small HTTP/1.1 backend (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self.requests = 0
        self.connections = 0
        self.sent_times: list[float] = []  # /stream: when each chunk was sent

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._conn, listeners)

    async def _conn(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        self.connections += 1
        try:
            while True:
                req = await _next(conn, stream)
                if not isinstance(req, h11.Request):
                    return
                self.requests += 1
                body_bytes = 0
                while True:
                    ev = await _next(conn, stream)
                    if isinstance(ev, h11.Data):
                        body_bytes += len(ev.data)
                    elif isinstance(ev, h11.EndOfMessage):
                        break
                    else:
                        return
                await self._answer(conn, stream, req, body_bytes)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    async def _answer(self, conn: h11.Connection, stream: trio.SocketStream, req: h11.Request,
                      body_bytes: int) -> None:
        url = urlsplit(req.target.decode())
        q = {k: v[0] for k, v in parse_qs(url.query).items()}

        async def send(ev: object) -> None:
            data = conn.send(ev)  # type: ignore[arg-type]
            if data:
                await stream.send_all(data)

        if url.path == "/hang":
            await trio.sleep_forever()
        if url.path == "/stream":
            await send(h11.Response(status_code=200, headers=[("content-type", "text/plain")]))
            self.sent_times = []
            for i in range(int(q.get("n", "5"))):
                if i:
                    await trio.sleep(float(q.get("delay", "0.2")))
                self.sent_times.append(trio.current_time())
                await send(h11.Data(data=f"chunk {i}\n".encode()))
            await send(h11.EndOfMessage())
            return
        if url.path == "/big":
            size = int(float(q.get("mb", "1")) * 1024 * 1024)
            await send(h11.Response(status_code=200, headers=[("content-length", str(size))]))
            block = b"x" * 65536
            left = size
            while left:
                n = min(left, len(block))
                await send(h11.Data(data=block[:n]))
                left -= n
            await send(h11.EndOfMessage())
            return
        payload = json.dumps({
            "backend": self.name, "method": req.method.decode(), "target": req.target.decode(),
            "headers": [[k.decode(), v.decode()] for k, v in req.headers], "body_bytes": body_bytes,
        }).encode()
        status = int(q.get("status", "200"))
        await send(h11.Response(status_code=status, headers=[
            ("content-type", "application/json"), ("content-length", str(len(payload))),
            ("x-backend", self.name), ("x-drop-me", "1"), ("connection", "keep-alive")]))
        await send(h11.Data(data=payload))
        await send(h11.EndOfMessage())


async def _next(conn: h11.Connection, stream: trio.abc.Stream) -> object:
    while True:
        ev = conn.next_event()
        if ev is not h11.NEED_DATA:
            return ev
        conn.receive_data(await stream.receive_some(65536))


class ResetBackend:
    """Accepts, reads the request head, then resets the connection (RST, no answer)."""

    def __init__(self) -> None:
        self.port = 0
        self.hits = 0

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._conn, listeners)

    async def _conn(self, stream: trio.SocketStream) -> None:
        self.hits += 1
        with trio.move_on_after(2):
            await stream.receive_some(65536)
        # SO_LINGER 0: close() sends RST instead of FIN.
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        stream.socket.close()


async def ws_echo(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A WebSocket echo server on 127.0.0.1 (reports its port)."""
    from trio_websocket import ConnectionClosed, serve_websocket

    async def handler(request: object) -> None:
        ws = await request.accept()  # type: ignore[attr-defined]
        try:
            while True:
                msg = await ws.get_message()
                await ws.send_message(msg)
        except ConnectionClosed:
            pass

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        task_status.started(server.port)
