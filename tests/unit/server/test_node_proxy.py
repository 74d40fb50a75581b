"""`nodes/{name}/proxy/{path}`: the API server's plain-HTTP relay to a node's agent.

A small fake agent (hypercorn on 127.0.0.1) records what reaches it and answers
as told.  Error cases go through `APIServer.handle` in process; the relay itself
also goes through the real ASGI entry point served by hypercorn, since that is
where the request body is streamed instead of read whole and the raw query
string is kept.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from fleet.auth import Decision
from fleet.server.asgi import create_app
from fleet.server.proxy import parse_node_proxy, proxy_request_headers
from fleet.testing.apiserver import TOKEN, InProcessAPI, open_api

NODE = "n1"
AGENT_TOKEN = "agent-secret"


@dataclass
class Seen:
    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    body_size: int
    body_start: bytes


@dataclass
class FakeAgent:
    """Echoes what it got as JSON, or answers /teapot with a 418 and a custom header."""

    seen: list[Seen] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        size, start = 0, b""
        while True:
            msg = await receive()
            chunk = msg.get("body", b"")
            size += len(chunk)
            start = (start + chunk)[:16] if len(start) < 16 else start
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append(Seen(scope["method"], scope["path"], scope["query_string"], headers,
                              size, start))
        if scope["path"] == "/teapot":
            status, ctype, body = 418, b"text/plain; charset=utf-8", b"short and stout"
            extra = [(b"x-agent", b"yes")]
        else:
            status, ctype, extra = 200, b"application/json", []
            body = json.dumps({"path": scope["path"], "size": size}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), *extra]})
        await send({"type": "http.response.body", "body": body})


async def start_http(nursery: trio.Nursery, app: Any) -> int:
    cfg = HyperConfig()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    binds = await nursery.start(serve, app, cfg)
    return int(binds[0].rsplit(":", 1)[1])


async def put_node(api: InProcessAPI, status: dict[str, Any] | None) -> None:
    # A plain-HTTP test agent: the node says so (fleet.server.proxy.agent_address).
    code, body = await api.json("POST", "/api/v1/nodes", {"metadata": {"name": NODE, "annotations": {"fleet.dev/agent-api-scheme": "http"}}})
    assert code == 201, body
    if status is not None:
        code, body = await api.json("PATCH", f"/api/v1/nodes/{NODE}/status", {"status": status},
                                    content_type="application/merge-patch+json")
        assert code == 200, body


def agent_status(port: int) -> dict[str, Any]:
    return {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}


# ---------------------------------------------------------------- pure parts
@pytest.mark.parametrize("path,expected", [
    ("/api/v1/nodes/n1/proxy", ("n1", "/")),
    ("/api/v1/nodes/n1/proxy/", ("n1", "/")),
    ("/api/v1/nodes/n1/proxy/images/import", ("n1", "/images/import")),
    ("/api/v1/nodes/n1/proxy/a/b/", ("n1", "/a/b/")),
    ("/api/v1/nodes/n1", None),
    ("/api/v1/nodes/n1/status", None),
    ("/api/v1/nodes/n1/proxyx", None),
    ("/api/v1/nodes//proxy", None),
    ("/api/v1/namespaces/default/pods/p/proxy", None),
])
def test_parse_node_proxy(path, expected):
    assert parse_node_proxy(path) == expected


def test_request_headers_swap_the_credentials():
    out = proxy_request_headers({"authorization": "Bearer user", "host": "api", "connection": "x",
                                 "content-type": "application/x-tar", "content-length": "5"},
                                AGENT_TOKEN)
    assert out == {"content-type": "application/x-tar", "content-length": "5",
                   "Authorization": f"Bearer {AGENT_TOKEN}"}


# --------------------------------------------------------- through the server
async def test_relay_streams_body_query_status_and_headers(tmp_path):
    agent = FakeAgent()
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        api.server.nodes.token = AGENT_TOKEN
        await put_node(api, agent_status(await start_http(nursery, agent)))
        server_port = await start_http(nursery, create_app(api.server))
        base = f"http://127.0.0.1:{server_port}/api/v1/nodes/{NODE}/proxy"
        # Larger than the server's 3 MiB object-body limit, sent in pieces: the relay
        # must pass it on as a stream, not buffer (and refuse) it.
        piece = b"x" * (1 << 20)

        async def body() -> AsyncIterator[bytes]:
            yield b"ARCHIVE-START..."
            for _ in range(5):
                yield piece

        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            resp = await http.post(f"{base}/images/import?name=a&x=1&x=2", content=body(),
                                   headers={"Content-Type": "application/x-tar"})
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"path": "/images/import", "size": 16 + 5 * (1 << 20)}
            got = agent.seen[-1]
            assert (got.method, got.path, got.query) == ("POST", "/images/import", b"name=a&x=1&x=2")
            assert got.body_start == b"ARCHIVE-START..."
            assert got.headers["authorization"] == f"Bearer {AGENT_TOKEN}"
            assert got.headers["content-type"] == "application/x-tar"

            resp = await http.get(f"{base}/teapot")
            assert resp.status_code == 418
            assert resp.text == "short and stout"
            assert resp.headers["content-type"] == "text/plain; charset=utf-8"
            assert resp.headers["x-agent"] == "yes"

            for method in ("PUT", "DELETE"):
                resp = await http.request(method, f"{base}/things/")
                assert resp.json()["path"] == "/things/"
                assert agent.seen[-1].method == method
            resp = await http.get(base)
            assert resp.json()["path"] == "/"
        nursery.cancel_scope.cancel()


async def test_missing_node_is_404_and_unlocatable_node_is_503(tmp_path):
    async with open_api(tmp_path) as api:
        code, body = await api.json("GET", "/api/v1/nodes/ghost/proxy/images")
        assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")
        assert body["message"] == 'nodes "ghost" not found'

        await put_node(api, None)
        code, body = await api.json("POST", f"/api/v1/nodes/{NODE}/proxy/images/import", b"x")
        assert (code, body["reason"]) == (503, "ServiceUnavailable")
        assert f"no preferred addresses found for node {NODE}" in body["message"]

        code, body = await api.json("PATCH", f"/api/v1/nodes/{NODE}/status",
                                    {"status": {"addresses": [{"type": "InternalIP",
                                                               "address": "127.0.0.1"}]}},
                                    content_type="application/merge-patch+json")
        assert code == 200, body
        code, body = await api.json("GET", f"/api/v1/nodes/{NODE}/proxy/images")
        assert code == 503
        assert "does not report its agent port" in body["message"]


async def test_unreachable_agent_is_503(tmp_path):
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()
    async with open_api(tmp_path) as api:
        await put_node(api, agent_status(port))
        code, body = await api.json("GET", f"/api/v1/nodes/{NODE}/proxy/images")
        assert code == 503
        assert f"error trying to reach the agent of node {NODE} at http://127.0.0.1:{port}/images" \
            in body["message"]


async def test_authentication_and_authorization(tmp_path):
    agent = FakeAgent()
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        await put_node(api, agent_status(await start_http(nursery, agent)))
        path = f"/api/v1/nodes/{NODE}/proxy/images"
        code, body = await api.json("GET", path, token=None)
        assert (code, body["reason"]) == (401, "Unauthorized")
        code, _ = await api.json("GET", path, token="wrong")
        assert code == 401

        asked = []

        class Recording:
            def authorize(self, user: Any, attrs: Any) -> Decision:
                asked.append(attrs)
                return Decision(False, "denied by test")

        api.server.authorizer = Recording()
        code, body = await api.json("POST", f"{path}/import", b"x")
        assert (code, body["reason"]) == (403, "Forbidden")
        # kube-apiserver's words: the object's name, and the resource with its subresource.
        assert body["message"] == (f'nodes "{NODE}" is forbidden: User "system:admin" cannot create resource '
                                   '"nodes/proxy" in API group "" at the cluster scope: denied by test')
        code, _ = await api.json("GET", path)
        assert code == 403
        assert [(a.verb, a.resource, a.subresource, a.name) for a in asked] == [
            ("create", "nodes", "proxy", NODE), ("get", "nodes", "proxy", NODE)]
        assert agent.seen == []  # nothing refused ever reached the agent
        nursery.cancel_scope.cancel()


async def test_unsupported_method_is_405(tmp_path):
    async with open_api(tmp_path) as api:
        code, body = await api.json("OPTIONS", f"/api/v1/nodes/{NODE}/proxy/x")
        assert (code, body["reason"]) == (405, "MethodNotAllowed")


async def test_refusal_reaches_a_client_still_uploading(tmp_path):
    # A large upload to a node that does not exist: the server answers without
    # relaying, and must read the body to its end first or the client, still
    # sending, sees a reset connection instead of the 404 Status.
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        server_port = await start_http(nursery, create_app(api.server))
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            resp = await http.post(
                f"http://127.0.0.1:{server_port}/api/v1/nodes/ghost/proxy/images/import",
                content=b"x" * 8_000_000)
            assert resp.status_code == 404
            assert resp.json()["message"] == 'nodes "ghost" not found'
        nursery.cancel_scope.cancel()
