"""Raw HTTP/1.1 connection upgrades (`Upgrade: SPDY/3.1`) on hypercorn.

kubectl falls back to plain SPDY/3.1 for port forwarding: a `POST` with
`Connection: Upgrade`, `Upgrade: SPDY/3.1`, answered by `101 Switching
Protocols`, after which the TCP (TLS) connection carries SPDY frames.  ASGI has
no such upgrade (only WebSocket), and hypercorn turns every other request into a
plain HTTP stream, so this module adds one, the way hypercorn does WebSocket:

* `UpgradeH11Protocol` replaces hypercorn's HTTP/1.1 protocol (installed once by
  `enable(config)`; `hypercorn.protocol.ProtocolWrapper` looks the class up at
  connection time).  For a request whose `Upgrade` token is one the listener's
  config names (`config.fleet_raw_upgrades`) it hands the connection to a
  `RawUpgradeStream` and passes every later byte through untouched — hypercorn's
  own WebSocket pass-through connection (`H11WSConnection`) does that part.  Every
  other request, and every listener without the attribute (the agent's, the
  metrics port), behaves exactly as before — but for the reason phrase its
  status line gets (statusline.py).
* `RawUpgradeStream` gives the application an ASGI-like scope of type
  `fleet.raw_upgrade` (the HTTP scope's fields) with these messages:

      receive: {"type": "raw.receive", "bytes": b"..."} | {"type": "raw.disconnect"}
      send:    {"type": "raw.accept", "headers": [...]}          101, then raw bytes
               {"type": "raw.send", "bytes": b"..."}
               {"type": "raw.response", "status": N, "headers": [...], "body": b"..."}
               {"type": "raw.close"}

  A refusal (`raw.response`) is an ordinary HTTP response — the Status JSON kubectl
  prints — after which the connection closes.

Backpressure is hypercorn's: incoming bytes go through the app's bounded queue
(`max_app_queue_size`), outgoing ones are written before `send` returns.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import h11
import hypercorn.protocol
from hypercorn.config import Config
from hypercorn.protocol.events import (
    Body,
    Data,
    EndBody,
    Event,
    Request,
    Response,
    StreamClosed,
)
from hypercorn.protocol.h11 import STREAM_ID, H11Protocol, H11WSConnection

from fleet.server.statusline import with_reason

SCOPE_TYPE = "fleet.raw_upgrade"
CONFIG_ATTR = "fleet_raw_upgrades"


def enable(config: Config, protocols: tuple[str, ...] = ("spdy/3.1",)) -> None:
    """Serve raw upgrades to `protocols` (lower-case Upgrade tokens) on this listener."""
    setattr(config, CONFIG_ATTR, tuple(p.lower() for p in protocols))
    hypercorn.protocol.H11Protocol = UpgradeH11Protocol  # type: ignore[misc]


def upgrade_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The Upgrade token of a request asking for one (Connection: upgrade), lower-case."""
    upgrade, connection = "", ""
    for name, value in headers:
        n = name.decode("latin-1").strip().lower()
        if n == "upgrade":
            upgrade = value.decode("latin-1").strip()
        elif n == "connection":
            connection = value.decode("latin-1")
    tokens = {t.strip().lower() for t in connection.split(",")}
    return upgrade.lower() if upgrade and "upgrade" in tokens else None


class UpgradeH11Protocol(H11Protocol):
    async def _send_h11_event(self, event: Any) -> None:
        # The status line's reason phrase, which hypercorn leaves empty (statusline.py).
        if isinstance(event, (h11.Response, h11.InformationalResponse)):
            event = with_reason(event)
        await super()._send_h11_event(event)

    async def _create_stream(self, request: h11.Request) -> None:
        wanted = getattr(self.config, CONFIG_ATTR, ())
        headers = list(request.headers)
        token = upgrade_token(headers) if wanted else None
        if token is None or token not in wanted or token == "websocket":
            await super()._create_stream(request)
            return
        self.stream = RawUpgradeStream(  # type: ignore[assignment]
            self.app, self.config, self.context, self.task_group, self.ssl, self.client,
            self.server, self.stream_send, STREAM_ID)
        self.connection = H11WSConnection(self.connection)  # type: ignore[arg-type]
        await self.stream.handle(Request(
            stream_id=STREAM_ID, headers=headers, http_version=request.http_version.decode(),
            method=request.method.decode("ascii").upper(), raw_path=request.target,
            state=self.connection_state))
        self.keep_alive_requests += 1
        await self.context.mark_request()


class RawUpgradeStream:
    """One upgraded (or refused) request; the mirror of hypercorn's WSStream."""

    def __init__(self, app: Any, config: Config, context: Any, task_group: Any, ssl: bool,
                 client: tuple[str, int] | None, server: tuple[str, int] | None,
                 send: Callable[[Event], Awaitable[None]], stream_id: int) -> None:
        self.app, self.config, self.context, self.task_group = app, config, context, task_group
        self.scheme = "https" if ssl else "http"
        self.client, self.server, self.send, self.stream_id = client, server, send, stream_id
        self.app_put: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self.accepted = False
        self.responded = False
        self.closed = False
        self.start_time = time.time()

    @property
    def idle(self) -> bool:
        return self.closed

    async def handle(self, event: Event) -> None:
        if self.closed:
            return
        if isinstance(event, Request):
            path, _, query = event.raw_path.partition(b"?")
            scope = {
                "type": SCOPE_TYPE, "http_version": event.http_version, "method": event.method,
                "scheme": self.scheme, "path": unquote(path.decode("ascii")), "raw_path": path,
                "query_string": query, "root_path": self.config.root_path,
                "headers": event.headers, "client": self.client, "server": self.server,
                "asgi": {"version": "3.0"}, "extensions": {},
            }
            self.app_put = await self.task_group.spawn_app(self.app, self.config, scope,
                                                           self.app_send)
        elif isinstance(event, (Data, Body)) and self.app_put is not None:
            if event.data:
                await self.app_put({"type": "raw.receive", "bytes": bytes(event.data)})
        elif isinstance(event, StreamClosed):
            self.closed = True
            if self.app_put is not None:
                await self.app_put({"type": "raw.disconnect"})

    async def app_send(self, message: dict[str, Any] | None) -> None:
        if self.closed:
            return
        if message is None:  # the application is done
            if not self.accepted and not self.responded:
                await self._respond(500, [], b"")
            self.closed = True
            await self.send(StreamClosed(stream_id=self.stream_id))
            return
        kind = message["type"]
        if kind == "raw.accept" and not (self.accepted or self.responded):
            self.accepted = True
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            await self.send(Response(stream_id=self.stream_id, status_code=101, headers=headers))
        elif kind == "raw.send" and self.accepted:
            data = bytes(message.get("bytes") or b"")
            if data:
                await self.send(Data(stream_id=self.stream_id, data=data))
        elif kind == "raw.response" and not (self.accepted or self.responded):
            await self._respond(int(message["status"]), list(message.get("headers", [])),
                                bytes(message.get("body") or b""))
        elif kind == "raw.close":
            self.closed = True
            await self.send(StreamClosed(stream_id=self.stream_id))
        else:
            raise RuntimeError(f"unexpected {kind!r} on a raw upgrade stream")

    async def _respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.responded = True
        headers = [h for h in headers if h[0].lower() not in (b"content-length", b"connection")]
        headers += [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await self.send(Response(stream_id=self.stream_id, status_code=status, headers=headers))
        if body:
            await self.send(Body(stream_id=self.stream_id, data=body))
        await self.send(EndBody(stream_id=self.stream_id))
