"""The API server's ASGI side: from hypercorn's scope and messages to a `Req`,
and from a `Resp` back to ASGI messages.

`FleetASGI` is the entry point `create_app` builds: plain HTTP requests are
adapted straight from the scope (headers, raw path, query, TLS peer chain,
client address) and their bodies read under the body limits (limits.py,
request_params.MAX_BODY); streamed responses (watch, logs) are sent until they
end or the client goes away.  WebSocket and raw SPDY upgrades go to the
APIServer's connect handlers (connect.py); lifespan goes to the Quart app.
The scope helpers here are shared by connect.py, which reads upgrade scopes
without a `Req`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote

import trio
from quart_trio import QuartTrio

from fleet.api import errors
from fleet.server import upgrade
from fleet.server.http import Req, Resp, split_raw_path
from fleet.server.limits import DEFAULT_BODY_TIMEOUT
from fleet.server.paths import resource_route, route_segments
from fleet.server.proxy import WEBSOCKET_SUBRESOURCES
from fleet.server.request_params import MAX_BODY
from fleet.server.requestinfo import is_node_proxy
from fleet.server.tlsconn import scope_peer_certs

if TYPE_CHECKING:
    from fleet.server.app import APIServer


class FleetASGI:
    """The API's ASGI entry point.

    Plain HTTP requests — every REST, watch, discovery and health request —
    are adapted straight from the ASGI scope into a `Req`, without building a
    framework request object: on this hot path Quart's per-request machinery
    cost about a quarter of the server's CPU.  WebSocket upgrades of
    pods/exec and pods/attach are relayed to the node's agent (proxy.py) on
    the raw ASGI websocket protocol.  Everything else (lifespan) goes to the
    Quart app.
    """

    def __init__(self, server: APIServer, fallback: QuartTrio, *,
                 body_timeout: float = DEFAULT_BODY_TIMEOUT) -> None:
        self.server = server
        self.fallback = fallback
        # How long a request body may take to arrive in full (408 after); see limits.py.
        self.body_timeout = body_timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == upgrade.SCOPE_TYPE:  # Upgrade: SPDY/3.1 (kubectl port-forward)
            await self.server.raw_upgrade(scope, receive, send)
            return
        if scope["type"] == "websocket":
            try:
                route = resource_route(route_segments(split_raw_path(raw_path(scope))))
            except errors.APIError:
                route = None  # an impossible name: not an exec/attach target; the fallback refuses it
            if route is not None and route.subresource in WEBSOCKET_SUBRESOURCES and route.name:
                await self.server.websocket_subresource(scope, receive, send, route)
                return
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        t0 = time.perf_counter()
        headers = scope_headers(scope)
        query: dict[str, str] = {}
        qs = scope.get("query_string", b"")
        if qs:
            for k, v in parse_qsl(qs.decode("latin-1"), keep_blank_values=True):
                query.setdefault(k, v)
        method = scope["method"]
        segments = split_raw_path(raw_path(scope))
        if is_node_proxy(segments):
            # Relayed to an agent as it arrives (image archives run to gigabytes);
            # MAX_BODY is for objects, the agent bounds what it accepts.
            body, refused = b"", None
            body_stream: BodyStream | None = BodyStream(receive)
            req = Req(method, scope["path"], query, headers, body,
                      raw_query=qs.decode("latin-1"), body_stream=body_stream, segments=segments,
                      peer_certs=scope_peer_certs(scope), remote=remote_address(scope), request_uri=request_uri(scope))
        else:
            body_stream = None
            body, refused = await _read_body(receive, headers, self.body_timeout)
            req = Req(method, scope["path"], query, headers, body, segments=segments,
                      peer_certs=scope_peer_certs(scope), remote=remote_address(scope), request_uri=request_uri(scope))
        if refused is not None:
            resp: Resp = Resp.error(refused)
            verb, resource = method.lower(), ""
            if self.server.audit is not None:
                await self.server.audit_refused(req, resp)
        else:
            resp, verb, resource = await self.server.handle(req)
        if body_stream is not None:
            await body_stream.drain()
        out_headers = [(b"content-type", resp.content_type.encode())]
        out_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()]
        if isinstance(resp.body, bytes):
            out_headers.append((b"content-length", str(len(resp.body)).encode()))
            await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
            await send({"type": "http.response.body", "body": resp.body})
            self.server.metrics.observe(verb, resource, resp.status, time.perf_counter() - t0)
            return
        await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
        self.server.metrics.observe(verb, resource, resp.status, time.perf_counter() - t0)
        await _stream(resp.body, receive, send)


def raw_path(scope: dict[str, Any]) -> bytes:
    """The path as sent, still percent-encoded (hypercorn's `raw_path`; re-encoded
    from `path` for a server that gives none)."""
    raw = scope.get("raw_path")
    return raw if raw else quote(scope["path"]).encode()


def request_uri(scope: dict[str, Any]) -> str:
    """The request target as sent: raw path and query (Go's `URL.RequestURI()`)."""
    qs = scope.get("query_string", b"")
    path = raw_path(scope).decode("latin-1")
    return f"{path}?{qs.decode('latin-1')}" if qs else path


def remote_address(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


def scope_headers(scope: dict[str, Any]) -> dict[str, str]:
    """Request headers with lower-case names; repeated headers joined with ", "."""
    headers: dict[str, str] = {}
    for k, v in scope["headers"]:
        name = k.decode("latin-1").lower()
        val = v.decode("latin-1")
        headers[name] = f"{headers[name]}, {val}" if name in headers else val
    return headers


def _too_large() -> errors.APIError:
    return errors.RequestEntityTooLarge(f"the request body is too large (limit {MAX_BODY} bytes)")


async def _read_body(receive: Any, headers: dict[str, str],
                     timeout: float) -> tuple[bytes, errors.APIError | None]:
    """The whole request body, or the error to answer instead (413, 408).

    A declared Content-Length beyond MAX_BODY is refused before reading: the
    client would otherwise hold the request open for as long as it promises
    to keep sending.  Everything else is read under one deadline (hypercorn
    times nothing out once the request head is in, see limits.py): a body
    that does not arrive in time is a 408, and hypercorn then closes the
    connection, as it does after any response to a request it has not read
    to the end.
    """
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:  # h11 has checked it is one decimal number
        return b"", _too_large()
    chunks: list[bytes] = []
    size = 0
    refused: errors.APIError | None = None
    with trio.move_on_after(timeout):
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                # A chunked body past the limit.  Drain the rest (under the same
                # deadline) so the client, still uploading, reads the 413 rather
                # than a reset connection, but keep nothing.
                refused = _too_large()
                while msg.get("more_body"):
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        break
                return b"", refused
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks), None
        return b"".join(chunks), None
    if refused is not None:
        return b"", refused
    return b"", errors.APIError(f"the request body did not arrive within {timeout:g}s", code=408,
                                reason="Timeout")


class BodyStream:
    """The request body chunk by chunk, for relays (an async iterator of bytes).

    A client that leaves mid-body raises (rather than ending the stream) so the
    relay aborts its upstream request instead of completing a truncated upload.
    """

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self.done = False

    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> bytes:
        while not self.done:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                self.done = True
                raise errors.BadRequest("the client went away before the request body ended")
            self.done = not msg.get("more_body")
            chunk = msg.get("body", b"")
            if chunk:
                return chunk
        raise StopAsyncIteration

    async def drain(self) -> None:
        """Read and drop what is left.

        Needed before answering a request refused without reading its body (no
        such node, forbidden): a client still uploading reads no response until
        its upload is done, and closing on unread data resets the connection, so
        it would see "connection reset" instead of the Status.
        """
        with contextlib.suppress(errors.BadRequest):
            async for _ in self:
                pass


async def _stream(body: AsyncIterator[bytes], receive: Any, send: Any) -> None:
    """Send a streaming body until it ends or the client goes away."""

    async def watch_disconnect(scope: trio.CancelScope) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                scope.cancel()
                return

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect, nursery.cancel_scope)
            async for chunk in body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            with trio.CancelScope(shield=True):
                await aclose()


def create_app(server: APIServer, *, body_timeout: float = DEFAULT_BODY_TIMEOUT) -> FleetASGI:
    """The API application: the ASGI fast path in front of a Quart app.

    `body_timeout` bounds how long a request body may take to arrive (408)."""
    return FleetASGI(server, QuartTrio("fleet"), body_timeout=body_timeout)
