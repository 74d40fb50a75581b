"""`pods/{name}/portforward`: kubectl's and the Python client's port forwarding.

Three client protocols end here, all relayed to the pod's node agent:

* **SPDY tunnelled in a WebSocket** (kubectl 1.31+, KEP-4006): a GET upgrade
  with subprotocol `SPDY/3.1+portforward.k8s.io`; every binary message carries
  SPDY bytes (`fleet.server.spdy`).
* **Plain SPDY/3.1** (kubectl's fallback when the WebSocket upgrade fails, and
  `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`): `POST` with `Upgrade: SPDY/3.1`,
  `X-Stream-Protocol-Version: portforward.k8s.io` (connect.py turns that into a raw
  byte stream).
* **The channel protocol** (`v4.channel.k8s.io`, the kubelet's WebSocket port
  forward; the Python client's `portforward()`): `?ports=80,81`; port i gets
  channel 2i (data) and 2i+1 (error), each opened by a message holding the port
  as two little-endian bytes.

In the SPDY protocols every forwarded connection is a pair of client streams
with headers `streamType` (`error` | `data`), `port` and `requestID`; the
server answers each SYN_STREAM, and once a pair is complete dials the agent.
A failed connect writes the agent's error text on the error stream (what the
kubelet writes) and ends that connection only: other connections and ports go
on.  Pod EOF ends the data stream (FIN) and then the error stream (FIN), which
is what makes kubectl finish the connection; the client's FIN on the data stream
is passed to the pod as a half-close.

To the agent, each forwarded connection is one WebSocket,
`/portForward/{namespace}/{pod}?port=N` (`fleet.agent.portforward`): a first
text message with a Status (Success, or Failure with the connect error), then
binary messages both ways; an empty binary message is a half-close.

`StreamPairs` (the requestID bookkeeping) and the header checks are pure; the
rest are thin Trio loops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

import trio
import trio_websocket

from fleet.api import errors
from fleet.server import spdy

log = logging.getLogger(__name__)

PROTOCOL_V1 = "portforward.k8s.io"
TUNNEL_PREFIX = "SPDY/3.1+"
TUNNEL_PROTOCOL = TUNNEL_PREFIX + PROTOCOL_V1
CHANNEL_V4 = "v4.channel.k8s.io"
# How long the second stream of a pair may take (the kubelet's streamCreationTimeout).
STREAM_CREATION_TIMEOUT = 30.0
# Chunks of client data buffered per connection before the session stops reading.
INBOUND_CHUNKS = 16
READ_SIZE = 32 * 1024
AGENT_MESSAGE_LIMIT = 1024 * 1024


# ------------------------------------------------------------------ pure parts
def parse_port(value: str | None, what: str = "port") -> int:
    """A port header/query value as the kubelet checks it; raises ValueError with its words."""
    if not value:
        raise ValueError(f'"{what}" header is required')
    try:
        port = int(value, 10)
        if not value.isdigit() or port > 65535:
            raise ValueError
    except ValueError:
        raise ValueError(f'unable to parse "{value}" as a port') from None
    if port < 1:
        raise ValueError(f'port "{value}" must be > 0')
    return port


def parse_ports_query(values: Iterable[str]) -> list[int]:
    """`?ports=80,81&ports=82` (PodPortForwardOptions) → [80, 81, 82]; BadRequest if bad."""
    ports: list[int] = []
    seen = False
    for raw in values:
        seen = True
        if not raw:
            raise errors.BadRequest('query parameter "ports" cannot be empty')
        for p in raw.split(","):
            try:
                ports.append(parse_port(p.strip(), "ports"))
            except ValueError as e:
                raise errors.BadRequest(str(e)) from None
    if not seen:
        raise errors.BadRequest('query parameter "ports" is required')
    return ports


def tunnel_requested(offered: Iterable[str]) -> bool:
    return any(p.strip() == TUNNEL_PROTOCOL for p in offered)


@dataclass
class Pair:
    """The two streams of one forwarded connection."""

    request_id: str
    port: int
    error_id: int | None = None
    data_id: int | None = None

    @property
    def complete(self) -> bool:
        return self.error_id is not None and self.data_id is not None


@dataclass(frozen=True)
class Rejected:
    """A stream to refuse (RST_STREAM); `pair` is set when the refusal is written on its
    error stream too (a second stream of a type the pair already has)."""

    message: str
    pair: Pair | None = None


@dataclass
class StreamPairs:
    """requestID → Pair, from the headers of each SYN_STREAM (the kubelet's rules)."""

    pairs: dict[str, Pair] = field(default_factory=dict)

    def add(self, stream_id: int, headers: spdy.Headers) -> tuple[Pair, bool] | Rejected:
        """(pair, created) for an accepted stream, or Rejected."""
        try:
            port = parse_port(spdy.header_value(headers, "port"))
        except ValueError as e:
            return Rejected(str(e))
        stype = spdy.header_value(headers, "streamtype")
        if not stype:
            return Rejected('"streamType" header is required')
        if stype not in ("error", "data"):
            return Rejected(f'invalid stream type "{stype}"')
        request_id = spdy.header_value(headers, "requestid")
        if not request_id:
            # Old clients: consecutive odd ids, error first (the kubelet's best effort).
            request_id = str(stream_id if stype == "error" else stream_id - 2)
        pair = self.pairs.get(request_id)
        created = pair is None
        if pair is None:
            pair = self.pairs[request_id] = Pair(request_id, port)
        attr = "error_id" if stype == "error" else "data_id"
        if getattr(pair, attr) is not None:
            return Rejected(f"error processing stream for request {request_id}: "
                            f"{stype} stream already assigned", pair)
        setattr(pair, attr, stream_id)
        return pair, created

    def remove(self, request_id: str) -> None:
        self.pairs.pop(request_id, None)


def port_prefix(port: int) -> bytes:
    """The two little-endian bytes opening each channel of the channel protocol."""
    return port.to_bytes(2, "little")


# ------------------------------------------------------------ agent streams
class ForwardError(Exception):
    """The connection to the pod's port could not be made; the text is for the client."""


class PodStream(Protocol):
    """One forwarded connection as the server sees it (the agent at the other end)."""

    async def receive(self) -> bytes | None:
        """The pod's next bytes; None once the pod has sent all (EOF) or is gone."""

    async def send(self, data: bytes) -> None: ...

    async def send_eof(self) -> None: ...


# port → the connection to that port of the pod, as an async context manager whose
# entry raises ForwardError when the connection cannot be made.
Dialer = Callable[[int], AbstractAsyncContextManager[PodStream]]


class AgentPodStream:
    """A forwarded connection over a WebSocket to the agent (see the module docstring)."""

    def __init__(self, conn: trio_websocket.WebSocketConnection) -> None:
        self.conn = conn

    async def receive(self) -> bytes | None:
        while True:
            try:
                msg = await self.conn.get_message()
            except trio_websocket.ConnectionClosed:
                return None
            if isinstance(msg, bytes):
                return msg or None  # empty: the pod's half-close

    async def send(self, data: bytes) -> None:
        if data:
            try:
                await self.conn.send_message(data)
            except trio_websocket.ConnectionClosed:
                pass

    async def send_eof(self) -> None:
        try:
            await self.conn.send_message(b"")
        except trio_websocket.ConnectionClosed:
            pass


@asynccontextmanager
async def agent_pod_stream(host: str, port: int, namespace: str, pod: str, pod_port: int,
                           token: str | None, *, connect_timeout: float = 10.0,
                           ssl_context: Any = None) -> AsyncIterator[AgentPodStream]:
    """The agent's WebSocket for one connection; ForwardError on entry, with the text the
    client should see, when the agent (or the pod's port) refuses."""
    resource = (f"/portForward/{quote(namespace, safe='')}/{quote(pod, safe='')}"
                f"?port={pod_port}")
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    entered = False
    try:
        async with trio_websocket.open_websocket(
                host, port, resource, use_ssl=ssl_context or False, extra_headers=headers,
                max_message_size=AGENT_MESSAGE_LIMIT, connect_timeout=connect_timeout,
                disconnect_timeout=5) as conn:
            try:
                with trio.fail_after(connect_timeout + 5):
                    first = await conn.get_message()
                status = json.loads(first) if isinstance(first, str) else {}
            except (trio_websocket.ConnectionClosed, trio.TooSlowError, ValueError):
                raise ForwardError(f"the agent at {host}:{port} ended the connection to port "
                                   f"{pod_port} before it was made") from None
            if not isinstance(status, dict) or status.get("status") != "Success":
                message = status.get("message") if isinstance(status, dict) else None
                raise ForwardError(str(message or "port forward failed"))
            entered = True
            yield AgentPodStream(conn)
    except trio_websocket.ConnectionRejected as e:
        if entered:
            raise
        raise ForwardError(_rejection_text(e.status_code, e.body or b"")) from None
    except (trio_websocket.HandshakeError, OSError) as e:
        if entered:
            raise
        raise ForwardError(f"error dialing the agent at {host}:{port}: "
                           f"{e.__cause__ or e or type(e).__name__}") from None


def _rejection_text(code: int, body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("message"):
        return str(doc["message"])
    return body.decode("utf-8", "replace").strip() or f"the agent answered {code}"


# ------------------------------------------------------------ byte transports
class ByteTransport(Protocol):
    """The client connection carrying SPDY: raw bytes in, raw bytes out."""

    async def receive(self) -> bytes | None:
        """Next bytes; None at the end."""

    async def send(self, data: bytes) -> None: ...


# -------------------------------------------------------------- SPDY server
class SpdyPortForward:
    """Serves one SPDY session: pairs streams, dials, copies, closes."""

    def __init__(self, transport: ByteTransport, dial: Dialer, *,
                 stream_creation_timeout: float = STREAM_CREATION_TIMEOUT) -> None:
        self.transport = transport
        self.dial = dial
        self.session = spdy.ServerSession()
        self.pairs = StreamPairs()
        self.timeout = stream_creation_timeout
        self._write_lock = trio.Lock()
        self._window = trio.Condition()
        # data stream id → sender of the client's bytes for that connection
        self._inbound: dict[int, trio.MemorySendChannel[bytes | None]] = {}
        self._inbound_rx: dict[int, trio.MemoryReceiveChannel[bytes | None]] = {}
        # stream id → cancel scope of the connection it belongs to
        self._scopes: dict[int, trio.CancelScope] = {}
        self._ready: dict[str, trio.Event] = {}
        self.connections = 0  # forwarded connections handled (tests, logs)

    async def flush(self) -> None:
        async with self._write_lock:
            data = self.session.data_to_send()
            if data:
                await self.transport.send(data)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            try:
                await self._read_loop(nursery)
            finally:
                nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            self.session.goaway()
            try:
                await self.flush()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        while True:
            data = await self.transport.receive()
            if data is None:
                return
            try:
                events = self.session.receive_data(data)
            except spdy.ProtocolError as e:
                log.info("port-forward session ended: %s", e)
                await self.flush()
                return
            for ev in events:
                if isinstance(ev, spdy.StreamOpened):
                    self._opened(ev, nursery)
                elif isinstance(ev, spdy.DataReceived):
                    await self._data(ev)
                elif isinstance(ev, spdy.StreamReset):
                    self._reset(ev.stream_id)
                elif isinstance(ev, spdy.GoAwayReceived):
                    await self.flush()
                    return
                elif isinstance(ev, spdy.WindowOpened):
                    async with self._window:
                        self._window.notify_all()
            await self.flush()

    def _opened(self, ev: spdy.StreamOpened, nursery: trio.Nursery) -> None:
        found = self.pairs.add(ev.stream_id, ev.headers)
        if isinstance(found, Rejected):
            log.info("port-forward stream %d refused: %s", ev.stream_id, found.message)
            self.session.reset(ev.stream_id, spdy.RstStatus.CANCEL)
            if found.pair is not None and found.pair.error_id is not None:
                self.session.send_data(found.pair.error_id, found.message.encode())
            return
        pair, created = found
        self.session.reply(ev.stream_id)
        if ev.stream_id == pair.data_id:
            tx, rx = trio.open_memory_channel[bytes | None](INBOUND_CHUNKS)
            self._inbound[ev.stream_id], self._inbound_rx[ev.stream_id] = tx, rx
        if created:
            self._ready[pair.request_id] = trio.Event()
            nursery.start_soon(self._connection, pair)
        elif pair.complete:
            self._ready[pair.request_id].set()

    async def _data(self, ev: spdy.DataReceived) -> None:
        tx = self._inbound.get(ev.stream_id)
        if tx is None:
            # The error stream (the client writes nothing there) or a finished connection.
            self.session.consumed(ev.stream_id, len(ev.data))
            return
        try:
            if ev.data:
                await tx.send(ev.data)
            if ev.fin:
                await tx.send(None)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the connection is over; drop what the client still sends

    def _reset(self, stream_id: int) -> None:
        scope = self._scopes.get(stream_id)
        if scope is not None:
            scope.cancel()
        tx = self._inbound.pop(stream_id, None)
        if tx is not None:
            tx.close()

    async def _connection(self, pair: Pair) -> None:
        ready = self._ready[pair.request_id]
        with trio.move_on_after(self.timeout):
            await ready.wait()
        try:
            if not pair.complete:
                if pair.error_id is not None:
                    self.session.send_data(pair.error_id, f"(request={pair.request_id}) timed out "
                                           "waiting for streams".encode(), fin=True)
                    await self.flush()
                return
            assert pair.error_id is not None and pair.data_id is not None
            self.connections += 1
            with trio.CancelScope() as scope:
                self._scopes[pair.data_id] = self._scopes[pair.error_id] = scope
                try:
                    await self._forward(pair.port, pair.error_id, pair.data_id)
                except Exception:
                    # One connection's failure never ends the session's other connections.
                    log.exception("port-forward connection to port %d failed", pair.port)
                    self.session.reset(pair.data_id, spdy.RstStatus.INTERNAL_ERROR)
                    self.session.reset(pair.error_id, spdy.RstStatus.INTERNAL_ERROR)
                    await self.flush()
        finally:
            self.pairs.remove(pair.request_id)
            self._ready.pop(pair.request_id, None)
            for sid in (pair.error_id, pair.data_id):
                if sid is not None:
                    self._scopes.pop(sid, None)
                    tx = self._inbound.pop(sid, None)
                    if tx is not None:
                        tx.close()
                    rx = self._inbound_rx.pop(sid, None)
                    if rx is not None:
                        rx.close()

    async def _forward(self, port: int, error_id: int, data_id: int) -> None:
        rx = self._inbound_rx[data_id]
        try:
            async with self.dial(port) as pod, trio.open_nursery() as nursery:
                nursery.start_soon(self._to_pod, pod, rx, data_id)
                # Until the pod is done sending; the client then closes its side (what
                # it still sends goes on to the pod until it does, or resets).
                await self._from_pod(pod, error_id, data_id)
        except ForwardError as e:
            self.session.send_data(error_id, str(e).encode(), fin=True)
            self.session.send_data(data_id, b"", fin=True)
            await self.flush()

    async def _to_pod(self, pod: PodStream, rx: trio.MemoryReceiveChannel[bytes | None],
                      data_id: int) -> None:
        async for chunk in rx:
            if chunk is None:
                await pod.send_eof()
                return
            await pod.send(chunk)
            self.session.consumed(data_id, len(chunk))
            await self.flush()  # a WINDOW_UPDATE a flow-controlling client may wait for

    async def _from_pod(self, pod: PodStream, error_id: int, data_id: int) -> None:
        while True:
            data = await pod.receive()
            if data is None:
                break
            view = memoryview(data)
            while view:
                n = len(view)
                if self.session.peer_flow_control:
                    async with self._window:
                        while self.session.is_open(data_id) and not self.session.sendable(data_id):
                            await self._window.wait()
                    if not self.session.is_open(data_id):
                        return
                    n = min(n, self.session.sendable(data_id) or 0)
                self.session.send_data(data_id, bytes(view[:n]))
                view = view[n:]
                await self.flush()
        self.session.send_data(data_id, b"", fin=True)
        self.session.send_data(error_id, b"", fin=True)
        await self.flush()


# ---------------------------------------------------------- channel protocol
class MessageEndpoint(Protocol):
    async def receive(self) -> bytes | str | None: ...

    async def send(self, message: bytes | str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


async def serve_channels(ws: MessageEndpoint, ports: list[int], dial: Dialer) -> None:
    """The kubelet's WebSocket port forward: one connection per requested port."""
    inbound: list[trio.MemorySendChannel[bytes]] = []
    receivers: list[trio.MemoryReceiveChannel[bytes]] = []
    for i, port in enumerate(ports):
        await ws.send(bytes((2 * i,)) + port_prefix(port))
        await ws.send(bytes((2 * i + 1,)) + port_prefix(port))
        tx, rx = trio.open_memory_channel[bytes](INBOUND_CHUNKS)
        inbound.append(tx)
        receivers.append(rx)

    async def one(i: int, port: int) -> None:
        try:
            async with dial(port) as pod, trio.open_nursery() as inner:
                async def to_pod() -> None:
                    async for chunk in receivers[i]:
                        await pod.send(chunk)

                inner.start_soon(to_pod)
                while (data := await pod.receive()) is not None:
                    await ws.send(bytes((2 * i,)) + data)
                inner.cancel_scope.cancel()
        except ForwardError as e:
            await ws.send(bytes((2 * i + 1,)) + str(e).encode())
        finally:
            receivers[i].close()

    async def reader(scope: trio.CancelScope) -> None:
        while (msg := await ws.receive()) is not None:
            if not isinstance(msg, bytes) or not msg:
                continue
            channel, data = msg[0], msg[1:]
            if channel % 2 or channel // 2 >= len(ports) or not data:
                continue  # nothing is read from error channels
            try:
                await inbound[channel // 2].send(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        scope.cancel()  # the client left: every connection ends

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as ports_nursery:
            nursery.start_soon(reader, ports_nursery.cancel_scope)
            for i, port in enumerate(ports):
                ports_nursery.start_soon(one, i, port)
        # Every port is done (kubelet: the connection closes once all are).
        nursery.cancel_scope.cancel()
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        await ws.close(1000, "")


# ------------------------------------------------------------ the API glue
class WebSocketBytes:
    """A ByteTransport over an accepted WebSocket (the SPDY tunnel): binary messages."""

    def __init__(self, ws: MessageEndpoint) -> None:
        self.ws = ws

    async def receive(self) -> bytes | None:
        while True:
            msg = await self.ws.receive()
            if msg is None or isinstance(msg, bytes):
                return msg

    async def send(self, data: bytes) -> None:
        await self.ws.send(data)


def choose_protocol(offered: list[str]) -> str | None:
    """The subprotocol to accept: the SPDY tunnel, v4 channels, "" (none offered: the
    original channel protocol), or None when nothing offered is served."""
    wanted = [p.strip() for p in offered if p.strip()]
    if TUNNEL_PROTOCOL in wanted:
        return TUNNEL_PROTOCOL
    if CHANNEL_V4 in wanted:
        return CHANNEL_V4
    return "" if not wanted else None


class PortForwardProxy:
    """pods/portforward for the API server: resolve the pod's agent, then serve."""

    def __init__(self, pods: Any) -> None:
        # fleet.server.proxy.PodProxy: the pod → agent lookup, token and timeouts.
        self.pods = pods

    def dialer(self, namespace: str, name: str, agent: Any) -> Dialer:
        def dial(port: int) -> AbstractAsyncContextManager[PodStream]:
            ctx = agent.ssl_context(self.pods.tls) if hasattr(agent, "ssl_context") else None
            return agent_pod_stream(agent.host, agent.port, namespace, name, port,
                                    self.pods.token if ctx is None else None,
                                    connect_timeout=self.pods.connect_timeout, ssl_context=ctx)
        return dial

    async def websocket(self, namespace: str, name: str, query: list[tuple[str, str]],
                        offered: list[str], receive: Callable[[], Any],
                        send: Callable[[dict[str, Any]], Any],
                        extensions: dict[str, Any]) -> int:
        """Serve one WebSocket upgrade; returns its HTTP status (101 or the refusal's)."""
        from fleet.server.proxy import ASGIEndpoint, reject_websocket

        try:
            agent = await self.pods.pod_agent(namespace, name)
            protocol = choose_protocol(offered)
            if protocol is None:
                raise errors.BadRequest(
                    f"none of the requested subprotocols are supported: {offered}; supported: "
                    f"{[TUNNEL_PROTOCOL, CHANNEL_V4]}")
            ports = ([] if protocol == TUNNEL_PROTOCOL
                     else parse_ports_query(v for k, v in query if k == "ports"))
        except errors.APIError as e:
            await reject_websocket(send, extensions, e)
            return e.code
        await send({"type": "websocket.accept", "subprotocol": protocol or None})
        ws = ASGIEndpoint(receive, send)
        dial = self.dialer(namespace, name, agent)
        if protocol == TUNNEL_PROTOCOL:
            await SpdyPortForward(WebSocketBytes(ws), dial).run()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await ws.close(1000, "")
        else:
            await serve_channels(ws, ports, dial)
        return 101

    async def raw(self, namespace: str, name: str, offered: list[str],
                  receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]) -> int:
        """Serve a plain SPDY/3.1 upgrade (fleet.server.upgrade's raw scope); returns its
        HTTP status.  `offered`: the X-Stream-Protocol-Version values."""
        try:
            if offered and PROTOCOL_V1 not in offered:
                raise errors.Forbidden(  # the kubelet's httpstream.Handshake wording
                    f"unable to upgrade: unable to negotiate protocol: client supports "
                    f"{offered}, server accepts {[PROTOCOL_V1]}")
            agent = await self.pods.pod_agent(namespace, name)
        except errors.APIError as e:
            await send({"type": "raw.response", "status": e.code,
                        "headers": [(b"content-type", b"application/json")],
                        "body": json.dumps(e.status()).encode()})
            return e.code
        headers = [(b"connection", b"Upgrade"), (b"upgrade", b"SPDY/3.1")]
        if offered:
            headers.append((b"x-stream-protocol-version", PROTOCOL_V1.encode()))
        await send({"type": "raw.accept", "headers": headers})
        try:
            await SpdyPortForward(RawBytes(receive, send), self.dialer(namespace, name, agent)).run()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await send({"type": "raw.close"})
        return 101


class RawBytes:
    """A ByteTransport over fleet.server.upgrade's raw stream messages."""

    def __init__(self, receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]) -> None:
        self._receive, self._send = receive, send
        self.closed = False

    async def receive(self) -> bytes | None:
        while not self.closed:
            msg = await self._receive()
            if msg["type"] == "raw.receive":
                return bytes(msg.get("bytes") or b"")
            if msg["type"] == "raw.disconnect":
                self.closed = True
        return None

    async def send(self, data: bytes) -> None:
        await self._send({"type": "raw.send", "bytes": data})
