"""fleet.client.fast against a real `fleet server` (TLS, bearer token) and a server that
drops kept-alive connections."""

from __future__ import annotations

import base64
import functools
import uuid

import pytest
import trio

from fleet.client import ApiException, ClientConfig
from fleet.client.fast import FastConnection
from tests.conftest import FleetServer


def config(srv: FleetServer) -> ClientConfig:
    ca = srv._kubeconfig_cluster().get("certificate-authority-data")
    return ClientConfig(server=srv.url, token=srv.token, ca_data=base64.b64decode(ca) if ca else None)


def cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def test_posts_reuse_one_connection_and_errors_are_statuses(fleet_server: FleetServer) -> None:
    async with FastConnection(config(fleet_server)) as fc:
        names = [f"fast-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
        for n in names:
            got = await fc.post_json("/api/v1/namespaces/default/configmaps", cm(n))
            assert got["metadata"]["name"] == n and got["data"] == {"k": "v"}
        stream = fc._stream
        await fc.post_json("/api/v1/namespaces/default/configmaps", cm(names[0] + "x"))
        assert fc._stream is stream  # kept alive, not re-opened
        with pytest.raises(ApiException) as e:
            await fc.post_json("/api/v1/namespaces/default/configmaps", cm(names[0]))
        assert e.value.code == 409 and e.value.reason == "AlreadyExists"
        # The connection survives an error answer.
        status, _ = await fc.request("GET", "/api/v1/namespaces/default/configmaps/" + names[1])
        assert status == 200
    bad = ClientConfig(server=fleet_server.url, token="wrong", ca_data=config(fleet_server).ca_data)
    async with FastConnection(bad) as fc:
        with pytest.raises(ApiException) as e:
            await fc.post_json("/api/v1/namespaces/default/configmaps", cm("never"))
        assert e.value.code == 401


async def test_reopens_a_connection_the_server_closed_while_idle() -> None:
    """A server that answers one request per connection, then closes it."""
    accepted = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            buf += chunk
        body = b'{"kind":"ConfigMap"}'
        await stream.send_all(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await stream.aclose()

    async with trio.open_nursery() as n:
        listeners = await n.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with FastConnection(ClientConfig(server=f"http://127.0.0.1:{port}")) as fc:
            for _ in range(3):
                assert await fc.post_json("/x", {}) == {"kind": "ConfigMap"}
        assert accepted == 3
        n.cancel_scope.cancel()
