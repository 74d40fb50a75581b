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
import tempfile
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


async def test_smoke(env) -> None:
    a = await env["backends"].start("a")
    port = free_port()
    await env["engine"].apply(RouteTable((Listener(port, "HTTP", (VirtualHost("", (route("r", backend("a", a)),)),)),), 1))
    r = await get(port, "/x")
    print(r.status_code, r.text)
    assert who(r) == "a"
