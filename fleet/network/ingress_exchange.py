"""One request's exchange between a client connection and one backend connection.

The I/O half of the built-in ingress proxy's request handling (ProxyEngine owns
listeners and connections, fleet.network.ingress_http the decisions):

- `Downstream`: the client's stream, ingress_h1server.H1Server parsing what the client
  sends and the proxy's own response framing (keep-alive, chunked, HEAD), with writes coalesced so a
  response head, body and end that arrive together leave in one write;
- `Exchange`: send the request head, stream the request body (a task of its own, so a
  backend that answers while still reading works), relay the response chunk by chunk,
  and after a 101 to an Upgrade pipe raw bytes both ways;  it tells the caller whether
  a failure happened before any response byte and any body byte (`Outcome(None)`), the
  only case in which another endpoint may be tried;
- `respond`: the proxy's own short text responses (404, 413, 502, 504, …).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import trio

from fleet.network.ingress_h1server import END as REQUEST_END
from fleet.network.ingress_h1server import NEED_DATA as CLIENT_NEED_DATA
from fleet.network.ingress_h1server import H1Server, ProtocolError, Request
from fleet.network.ingress_http import (
    IDEMPOTENT,
    REASONS,
    RequestInfo,
    downstream_response_headers,
    error_response,
)
from fleet.network.ingress_timers import Timer, Timers, socket_of
from fleet.network.ingress_upstream import (
    END,
    NEED_DATA,
    Head,
    UpstreamConn,
    UpstreamError,
    UpstreamPool,
)
from fleet.network.routetable import Selection

READ_SIZE = 64 * 1024
#: Errors that mean "this TCP/TLS connection is gone".
BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


async def receive(stream: trio.abc.Stream, *, wait_first: bool = False) -> bytes:
    """`stream.receive_some` for the proxy's hot path.  On a plain TCP stream it reads the
    socket directly when data is already there and waits for readability otherwise:
    trio's SocketStream adds a scheduler round trip to every call (a checkpoint), which
    at two reads a request was a tenth of the proxy's CPU.  Every exchange still waits
    for its backend's answer, so a busy connection cannot starve the others.
    `wait_first`: the peer has had no time to answer yet (a backend just sent a
    request): wait for readability before reading rather than fail a read first."""
    sock = getattr(stream, "socket", None)
    if sock is None:  # TLS and other streams: the ordinary way
        return await stream.receive_some(READ_SIZE)
    if wait_first:
        await trio.lowlevel.wait_readable(sock)
    while True:
        try:
            return os.read(sock.fileno(), READ_SIZE)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def send_all(stream: trio.abc.Stream, data: bytes) -> None:
    """`stream.send_all` without the per-call checkpoint on a plain TCP stream (see `receive`)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        await stream.send_all(data)
        return
    view = memoryview(data)
    while view:
        try:
            sent = os.write(sock.fileno(), view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[sent:]


class Closed(Exception):
    """The peer closed (or broke) its connection."""


class TooLarge(Exception):
    """The request body passed options.max_body_bytes."""


class Downstream:
    """The client's connection: H1Server parses what the client sends (strictly: 400,
    431 or 501 on bad input); the proxy frames its responses itself and decides
    keep-alive as RFC 9112 §9.3 says.
    Writes are coalesced: a head, body and end that arrive together leave in one write."""

    def __init__(self, stream: trio.abc.Stream, max_header_bytes: int) -> None:
        self.stream = stream
        self.max_header_bytes = max_header_bytes
        self.h1 = H1Server(max_header_bytes)
        self.answered = False  # a response just went out (see next_event)
        self._out = bytearray()
        self.begin(None)

    def begin(self, req: Request | None) -> None:
        """A new request cycle (None before the first request)."""
        self.status = 0  # of the final (or 101) response head sent (0: none yet)
        self.started = False  # a final response head was queued
        self.finished = False  # the response ended
        self.switched = False  # a 101 went out: raw bytes from now on
        self._framing = "length"  # length | chunked | none | close
        self._head_method = req.method if req is not None else b"GET"
        self._http11 = req is None or req.http_version == b"1.1"
        # A proposed protocol switch (CONNECT, Upgrade) the backend turned down ends the
        # connection after the response, as h11's MIGHT_SWITCH_PROTOCOL state did.
        self._switch_proposed = req is not None and req.switch
        close = False
        if req is not None:
            for name, value in req.headers:
                if name == b"connection" and b"close" in value.lower():
                    close = True
        # HTTP/1.0 clients get one response per connection (no keep-alive token dance).
        self.keep_alive = self._http11 and not close

    async def next_event(self) -> object:
        """The client's next Request, body bytes, REQUEST_END or ingress_h1server.CLOSED
        (ProtocolError on malformed input)."""
        h1 = self.h1
        while True:
            ev = h1.next_event()
            if ev is not CLIENT_NEED_DATA:
                return ev
            # A keep-alive client sends its next request only after our response: wait
            # before reading (a first request or a body may well be there already).
            wait_first = self.answered and h1.state == "idle" and not h1.buf
            self.answered = False
            try:
                data = await receive(self.stream, wait_first=wait_first)
            except BROKEN:
                data = b""
            h1.receive_data(data)

    async def head(self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes = b"",
                   *, flush: bool = False) -> None:
        """Queue a response head: 1xx (a 101 switches), or the final one, framed by its
        Content-Length, else chunked for HTTP/1.1, else up to the close."""
        extra: list[tuple[bytes, bytes]] = []
        if status >= 200 or status == 101:
            self.status = status
        if status >= 200:
            self.started = True
            length = False
            for name, value in headers:
                lname = name.lower()
                if lname == b"content-length":
                    length = True
                elif lname == b"connection" and b"close" in value.lower():
                    self.keep_alive = False
            if self._head_method == b"HEAD" or status in (204, 304):
                self._framing = "none"
            elif length:
                self._framing = "length"
            elif self._http11:
                self._framing = "chunked"
                extra.append((b"transfer-encoding", b"chunked"))
            else:
                self._framing = "close"
                self.keep_alive = False
            if not self.keep_alive and not any(n.lower() == b"connection" for n, _ in headers):
                extra.append((b"connection", b"close"))
        elif status == 101:
            self.switched = True
        parts = [b"HTTP/1.1 %d " % status, reason, b"\r\n"]
        for name, value in (*headers, *extra):
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        self._out += b"".join(parts)
        if flush:
            await self.flush()

    async def data(self, data: bytes, *, flush: bool = False) -> None:
        if self._framing == "none" or not data:
            return
        if self._framing == "chunked":
            self._out += b"%x\r\n" % len(data)
            self._out += data
            self._out += b"\r\n"
        else:
            self._out += data
        if flush or len(self._out) >= READ_SIZE:
            await self.flush()

    async def end(self) -> None:
        """The response is complete: flush it."""
        if self._framing == "chunked":
            self._out += b"0\r\n\r\n"
        self.finished = True
        await self.flush()

    async def flush(self) -> None:
        if self._out:
            data, self._out = bytes(self._out), bytearray()
            try:
                await send_all(self.stream, data)
            except BROKEN as e:
                raise Closed from e

    def next_cycle(self) -> bool:
        """Ready the connection for the client's next request; False: close it instead."""
        if not (self.keep_alive and self.finished and self.h1.state == "done"
                and not self._switch_proposed):
            return False
        self.h1.start_next_cycle()  # pipelined bytes of the next request stay buffered
        self.begin(None)
        self.answered = True
        return True


@dataclass(slots=True)
class UpstreamRequest:
    """The request head as the backend gets it (the same for every attempt)."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    chunked: bool  # the body goes chunked (the client sent it chunked)


@dataclass(slots=True)
class Outcome:
    status: int | None  # None: failed before any response byte and before any body byte
    error: str = ""


class Exchange:
    """One request/response cycle with one upstream connection."""

    def __init__(self, pool: UpstreamPool, down: Downstream, conn: UpstreamConn, req: UpstreamRequest,
                 info: RequestInfo, sel: Selection, has_body: bool, timeout: float, max_body_bytes: int,
                 timers: Timers) -> None:
        self.pool, self.down, self.conn, self.req = pool, down, conn, req
        # The backend's silence is timed by a coarse Timer (ingress_timers: a cancel
        # scope per read cost a sixth of the proxy's CPU); a stream without a socket
        # falls back to a scope (`read_scope`).
        self.timers = timers
        self.timer = conn.timer
        if self.timer is None and (sock := socket_of(conn.stream)) is not None:
            self.timer = conn.timer = Timer(sock)
        self.reading = False
        self.max_body_bytes = max_body_bytes
        self.info, self.sel, self.has_body, self.timeout = info, sel, has_body, timeout
        self.body_sent = 0
        self.body_error: BaseException | None = None
        self.body_done = False  # the body pump finished (a plain flag: nothing waits on it)
        self.read_scope: trio.CancelScope | None = None

    async def run(self) -> Outcome:
        conn, down = self.conn, self.down
        req = self.req
        try:
            head = conn.h1.request(req.method, req.target, req.headers, chunked=req.chunked)
            if not self.has_body:
                head += conn.h1.end()
            await send_all(conn.stream, head)
        except BROKEN as e:
            await conn.aclose()
            return Outcome(None, f"connection to the backend broke: {why(e)}")
        # Exceptions of the response side are carried out of the nursery by hand, so
        # they are not wrapped in an ExceptionGroup.
        result: list[int | Exception] = []

        async def relay(cancel: trio.CancelScope) -> None:
            try:
                result.append(await self._response())
            except (Retry, Closed) as e:
                result.append(e)
            if self.has_body and not self.body_done:
                cancel.cancel()  # the backend answered before taking the whole body

        if self.has_body:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump_body, nursery.cancel_scope)
                nursery.start_soon(relay, nursery.cancel_scope)
        else:  # no body to pump: no task, no scope (the common case, kept cheap)
            try:
                result.append(await self._response())
            except (Retry, Closed) as e:
                result.append(e)
        status: int | None = None
        if result:
            if isinstance(result[0], Retry):
                await conn.aclose()
                return Outcome(None, str(result[0]))
            if isinstance(result[0], Exception):
                await conn.aclose()
                raise result[0]
            status = result[0]
        if status is None:  # the body pump stopped the exchange
            await conn.aclose()
            err = self.body_error
            if isinstance(err, TooLarge) and not down.started:
                limit = self.max_body_bytes
                await respond(down, 413, f"request body over {limit} bytes", close=True)
                return Outcome(413)
            raise Closed("client or backend gone while sending the request body")
        if conn.h1.reusable:
            self.pool.give_back(conn)
        elif conn.h1.state != "switched":
            await conn.aclose()
        return Outcome(status)

    async def _pump_body(self, cancel: trio.CancelScope) -> None:
        limit = self.max_body_bytes
        try:
            while True:
                ev = await self.down.next_event()
                if ev.__class__ is bytes:
                    self.body_sent += len(ev)  # type: ignore[arg-type]
                    if limit and self.body_sent > limit:
                        raise TooLarge
                    if not await self._to_backend(self.conn.h1.body(ev)):  # type: ignore[arg-type]
                        return
                elif ev is REQUEST_END:
                    await self._to_backend(self.conn.h1.end())
                    return
                else:  # the client went away mid-body
                    raise Closed
        except (TooLarge, Closed, ProtocolError) as e:
            # The client's side failed: stop the whole exchange.
            self.body_error = e
            cancel.cancel()
        finally:
            self.body_done = True
            # The backend's silence counts from now.
            if self.timer is not None and self.reading:
                self.timers.arm(self.timer, trio.current_time() + self.timeout)
            if self.read_scope is not None:
                self.read_scope.deadline = trio.current_time() + self.timeout

    async def _upstream_event(self) -> object:
        """The backend's next event (Head, body bytes or END); trio.TooSlowError past the timeout of silence.
        The clock runs only once the request body is all sent (a slow upload is not a
        silent backend).  What was queued for the client goes out before waiting."""
        conn = self.conn
        h1 = conn.h1
        while True:
            ev = h1.next_event()
            if ev is not NEED_DATA:
                return ev
            await self.down.flush()
            timer = self.timer
            if timer is not None:
                self.timers.arm(timer, self._read_deadline())
                self.reading = True
                try:
                    # Right after the request head went out nothing can be there yet.
                    data = await receive(conn.stream, wait_first=not h1.buf and h1.state == "head")
                except BROKEN:
                    if timer.expired:
                        raise trio.TooSlowError from None
                    raise
                finally:
                    self.reading = False
                    self.timers.disarm(timer)
                conn.h1.receive_data(data)
                continue
            # A bare CancelScope: fail_after's context-manager wrapper costs more per read.
            with trio.CancelScope(deadline=self._read_deadline()) as scope:
                self.read_scope = scope
                data = await receive(conn.stream)
            self.read_scope = None
            if scope.cancelled_caught:
                raise trio.TooSlowError
            conn.h1.receive_data(data)

    def _read_deadline(self) -> float:
        if self.has_body and not self.body_done:
            return math.inf
        return trio.current_time() + self.timeout

    async def _to_backend(self, data: bytes) -> bool:
        """Send framed body bytes to the backend; False once it broke (the response side
        reports that)."""
        try:
            if data:
                await send_all(self.conn.stream, data)
            return True
        except BROKEN:
            return False

    async def _response(self) -> int | None:
        """Relay the backend's response; None when the body pump cancelled us first."""
        conn, down, route = self.conn, self.down, self.sel.route
        got_bytes = False
        try:
            while True:
                try:
                    ev = await self._upstream_event()
                except trio.TooSlowError:
                    if down.started:
                        raise Closed("backend went silent mid-response") from None
                    await respond(down, 504, f"gateway timeout: the backend sent no response "
                                               f"within {self.timeout:g}s")
                    return 504
                assert isinstance(ev, Head)
                got_bytes = True
                if ev.status_code < 200:
                    if ev.status_code == 101:
                        if self.info.upgrade:
                            return await self._switch(ev)
                        raise UpstreamError("101 to a request that asked for no upgrade")
                    await down.head(ev.status_code, ev.headers, ev.reason, flush=True)
                    continue
                headers = downstream_response_headers(ev.headers, upgrade=False, flt=route.response_headers)
                # H1Client checked the names and values when it parsed them.
                await down.head(ev.status_code, headers, ev.reason)
                status = ev.status_code
                break
            while True:
                try:
                    ev = await self._upstream_event()
                except trio.TooSlowError:
                    raise Closed("backend went silent mid-response") from None
                if ev is END:
                    await down.end()
                    return status
                await down.data(ev)  # type: ignore[arg-type]
        except (UpstreamError, *BROKEN) as e:
            got_bytes = got_bytes or bool(conn.h1.buf)
            if got_bytes or down.started:
                if not down.started:
                    await respond(down, 502, f"bad gateway: the backend's response broke: {why(e)}")
                    return 502
                raise Closed from e
            return await self._early_failure(f"the backend reset the connection: {why(e)}")

    async def _early_failure(self, why: str) -> int:
        """No response byte came: retry elsewhere when that is safe, else 502."""
        if not self.body_sent and (self.req.method in IDEMPOTENT or self.conn.reused):
            raise Retry(why)
        await respond(self.down, 502, f"bad gateway: {why}")
        return 502

    async def _switch(self, ev: Head) -> int:
        """After the backend's 101: answer 101 to the client, then pipe raw bytes both ways."""
        conn, down = self.conn, self.down
        headers = downstream_response_headers(ev.headers, upgrade=True, flt=self.sel.route.response_headers)
        await down.head(101, headers, ev.reason, flush=True)
        client_extra, _ = down.h1.trailing_data
        backend_extra, _ = conn.h1.trailing_data
        try:
            if backend_extra:
                await down.stream.send_all(bytes(backend_extra))
            if client_extra:
                await conn.stream.send_all(bytes(client_extra))
        except BROKEN:
            await conn.aclose()
            return 101
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipe, down.stream, conn.stream, nursery.cancel_scope)
            nursery.start_soon(pipe, conn.stream, down.stream, nursery.cancel_scope)
        await conn.aclose()
        return 101


class Retry(Exception):
    """The backend failed before any response byte: another endpoint may be tried."""


async def pipe(src: trio.abc.Stream, dst: trio.abc.Stream, done: trio.CancelScope) -> None:
    try:
        while True:
            data = await src.receive_some(READ_SIZE)
            if not data:
                break
            await dst.send_all(data)
    except BROKEN:
        pass
    finally:
        done.cancel()


def why(e: BaseException) -> str:
    if isinstance(e, trio.TooSlowError):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__


async def respond(down: Downstream, status: int, text: str,
                   extra: list[tuple[bytes, bytes]] | None = None, close: bool = False) -> None:
    """A response the proxy makes itself: a one-line text body (and `Connection: close`
    when the connection ends after it)."""
    headers, body = error_response(status, text, extra or [])
    if close:
        headers.append((b"connection", b"close"))
    await down.head(status, headers, REASONS.get(status, b""))
    await down.data(body)
    await down.end()
