"""The built-in ingress engine ("builtin"): a Trio reverse proxy serving a RouteTable.

    client ─TCP/TLS─→ listener (one per Listener.port) ─h11─→ route (RouteTable.select)
          ─→ backend by weight, endpoint round-robin ─h11─→ pooled upstream connection

What this module owns is the I/O: listening ports opened and closed as tables change,
one task per client connection, and the exchange of one request with a backend
(streamed both ways, never buffered whole; raw piping after a 101 for WebSocket and
any Upgrade).  Decisions about headers, redirects and error bodies are pure functions
in fleet.network.ingress_http; the backend pick and the connection pool are
fleet.network.ingress_upstream; SNI certificate choice is fleet.network.ingress_tls.

Tables swap atomically: a request reads `self._table` once when its head arrives and
keeps that table; `apply` never touches open connections, so a rule or endpoint change
cuts nothing, and a keep-alive connection's next request sees the newest table.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import h11
import trio

from fleet.network.ingress_http import (
    IDEMPOTENT,
    REASONS,
    RequestInfo,
    downstream_response_headers,
    error_response,
    redirect_location,
    upstream_request_headers,
)
from fleet.network.ingress_tls import TlsContexts
from fleet.network.ingress_upstream import EndpointCursor, UpstreamConn, UpstreamPool, pick_backend
from fleet.network.routetable import (
    Backend,
    EngineError,
    EngineOptions,
    RouteTable,
    Selection,
    Source,
)

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
#: Errors that mean "this TCP/TLS connection is gone".
BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _Closed(Exception):
    """The peer closed (or broke) its connection."""


class _TooLarge(Exception):
    """The request body passed options.max_body_bytes."""


class Downstream:
    """The client's connection: a stream and its h11 server state."""

    def __init__(self, stream: trio.abc.Stream, max_header_bytes: int) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self._out = bytearray()
        self.status = 0  # of the response head sent for the current request (0: none yet)

    async def next_event(self) -> object:
        while True:
            ev = self.h11.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except BROKEN:
                data = b""
            self.h11.receive_data(data)

    async def send(self, event: object, *, flush: bool = True) -> None:
        """Frame `event`; with flush=False it waits in a buffer for the next flush, so a
        response head, a body and its end that arrive together leave in one write."""
        data = self.h11.send(event)  # type: ignore[arg-type]
        if isinstance(event, h11.Response) or (isinstance(event, h11.InformationalResponse)
                                               and event.status_code == 101):
            self.status = event.status_code
        if data:
            self._out += data
        if flush or len(self._out) >= READ_SIZE:
            await self.flush()

    async def flush(self) -> None:
        if self._out:
            data, self._out = bytes(self._out), bytearray()
            try:
                await self.stream.send_all(data)
            except BROKEN as e:
                raise _Closed from e

    @property
    def started(self) -> bool:
        """Whether a response head went out for the current request."""
        return self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE)


async def _upstream_send(conn: UpstreamConn, event: object) -> None:
    data = conn.h11.send(event)  # type: ignore[arg-type]
    if data:
        await conn.stream.send_all(data)


@dataclass
class _Listening:
    scope: trio.CancelScope
    done: trio.Event


class ProxyEngine:
    """The built-in data plane (see the module docstring)."""

    name = "builtin"

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self._table = RouteTable()
        self._listening: dict[int, _Listening] = {}
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()
        self._pool = UpstreamPool(connect_timeout=options.connect_timeout)
        self._cursor = EndpointCursor()
        self._tls = TlsContexts(lambda port: self._table.listener(port))
        self.open_connections = 0

    @property
    def table(self) -> RouteTable:
        return self._table

    def ports(self) -> list[int]:
        """The ports listening now."""
        return sorted(self._listening)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._janitor)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._listening.clear()
            self._pool.close_all()

    async def _janitor(self) -> None:
        while True:
            await trio.sleep(5)
            self._pool.expire()

    async def apply(self, table: RouteTable) -> None:
        """Swap in `table`, then open the ports it adds and close the ones it drops.
        A port that cannot be bound (or a certificate that does not load) raises
        EngineError after everything else was applied; the next apply retries it."""
        if self._nursery is None:
            raise EngineError("the builtin ingress engine is not running")
        async with self._lock:
            problems: list[str] = []
            for lst in table.listeners:
                if lst.protocol == "HTTPS":
                    for cert in (*lst.certificates, lst.default_certificate):
                        if cert is None:
                            continue
                        try:
                            self._tls.context_for(lst.port, cert)
                        except (OSError, ValueError) as e:
                            src = cert.source
                            who = f" from {src.kind} {src.namespace}/{src.name}" if src else ""
                            problems.append(f"port {lst.port}: certificate{who} does not load: {e}")
            self._table = table
            self._tls.prune(table)
            wanted = {lst.port for lst in table.listeners}
            for port in sorted(wanted - set(self._listening)):
                try:
                    listeners = await trio.open_tcp_listeners(port, host=self.options.bind_address)
                except OSError as e:
                    problems.append(f"port {port}: cannot listen on {self.options.bind_address}: {e}")
                    continue
                scope, done = trio.CancelScope(), trio.Event()
                self._listening[port] = _Listening(scope, done)
                self._nursery.start_soon(self._accept, port, listeners, scope, done)
            for port in sorted(set(self._listening) - wanted):
                gone = self._listening.pop(port)
                gone.scope.cancel()  # the accept loop only: open connections live on
                await gone.done.wait()
            if problems:
                raise EngineError("; ".join(problems))

    async def _accept(self, port: int, listeners: list[trio.SocketListener],
                      scope: trio.CancelScope, done: trio.Event) -> None:
        assert self._nursery is not None
        try:
            with scope:
                await trio.serve_listeners(lambda s: self._serve(s, port), listeners,
                                           handler_nursery=self._nursery)
        finally:
            for lst in listeners:
                lst.socket.close()
            done.set()

    # ---- one client connection -------------------------------------------------

    async def _serve(self, stream: trio.SocketStream, port: int) -> None:
        self.open_connections += 1
        try:
            try:
                peer = stream.socket.getpeername()
            except OSError:
                return
            client_ip = peer[0]
            lst = self._table.listener(port)
            scheme = "http"
            conn_stream: trio.abc.Stream = stream
            if lst is not None and lst.protocol == "HTTPS":
                scheme = "https"
                ssl_stream = trio.SSLStream(stream, self._tls.initial(port), server_side=True)
                with trio.move_on_after(min(self.options.keepalive_timeout, 30.0)) as cs:
                    try:
                        await ssl_stream.do_handshake()
                    except BROKEN:
                        return
                if cs.cancelled_caught:
                    return
                conn_stream = ssl_stream
            await self._serve_http(Downstream(conn_stream, self.options.max_header_bytes),
                                   port, scheme, client_ip)
        finally:
            self.open_connections -= 1
            with trio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except BROKEN:
                    pass

    async def _serve_http(self, down: Downstream, port: int, scheme: str, client_ip: str) -> None:
        while True:
            # Idle wait and the head itself share one deadline: a client that never
            # finishes its headers (slowloris) is closed like an idle one.
            ev: object = None
            with trio.CancelScope(deadline=trio.current_time() + self.options.keepalive_timeout):
                try:
                    ev = await down.next_event()
                except h11.RemoteProtocolError as e:
                    await self._client_error(down, e)
                    return
            if not isinstance(ev, h11.Request):
                return  # idle timeout, the client closed, or a protocol state we do not serve
            if head_size(ev) > self.options.max_header_bytes:
                # h11's own limit only catches a head still incomplete at that size.
                await self._client_error(down, h11.RemoteProtocolError("head too large", 431))
                return
            if not _has_body(ev):
                down.h11.next_event()  # h11 has the EndOfMessage already: no body to stream
            try:
                await self._request(down, ev, port, scheme, client_ip)
            except (_Closed, h11.LocalProtocolError):
                return
            except h11.RemoteProtocolError as e:
                await self._client_error(down, e)
                return
            if down.h11.our_state is h11.SWITCHED_PROTOCOL:
                return
            if down.h11.their_state is h11.SEND_BODY:
                await self._drain(down)
                return
            if down.h11.our_state is not h11.DONE or down.h11.their_state is not h11.DONE:
                return
            try:
                down.h11.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _client_error(self, down: Downstream, e: h11.RemoteProtocolError) -> None:
        """400 (malformed) or 431 (head too large) for this connection only, then close."""
        status = e.error_status_hint if e.error_status_hint in (400, 431) else 400
        text = "request header fields too large" if status == 431 else f"bad request: {e}"
        if down.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await self._respond(down, status, text, close=True)
            except (_Closed, h11.LocalProtocolError):
                pass
        self._observe(None, status, 0.0)

    async def _drain(self, down: Downstream) -> None:
        """Read (and drop) what is left of a request body for a moment before closing, so
        the client sees our answer rather than a reset."""
        with trio.move_on_after(1.0):
            for _ in range(64):
                try:
                    data = await down.stream.receive_some(READ_SIZE)
                except BROKEN:
                    return
                if not data:
                    return

    async def _respond(self, down: Downstream, status: int, text: str,
                       extra: list[tuple[bytes, bytes]] | None = None, close: bool = False) -> None:
        headers, body = error_response(status, text, extra or [])
        if close:
            headers.append((b"connection", b"close"))
        await down.send(h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, b"")),
                        flush=False)
        await down.send(h11.Data(data=body), flush=False)
        await down.send(h11.EndOfMessage())

    def _observe(self, source: Source | None, status: int, seconds: float) -> None:
        if self.options.observe is not None:
            try:
                self.options.observe(source, status, seconds)
            except Exception:  # an observer's bug must not break the proxy
                log.exception("ingress request observer failed")

    # ---- one request -----------------------------------------------------------

    async def _request(self, down: Downstream, req: h11.Request, port: int, scheme: str,
                       client_ip: str) -> None:
        started = trio.current_time()
        table = self._table  # this request keeps this table, whatever apply does meanwhile
        info = RequestInfo.parse(req.method, req.target, req.headers)
        sel = table.select(port, info.host, info.method, info.path, info.headers, info.query)
        source = sel.route.source if sel is not None else None
        down.status = 0
        try:
            await self._route(down, req, info, sel, port, scheme, client_ip)
        finally:
            # What the client got; 499 (nginx's "client closed request") when the
            # exchange broke before any response head went out.
            self._observe(source, down.status or 499, trio.current_time() - started)

    async def _route(self, down: Downstream, req: h11.Request, info: RequestInfo,
                     sel: Selection | None, port: int, scheme: str, client_ip: str) -> int:
        if sel is None:
            await self._respond(down, 404, f"no route for host {info.host or '(none)'} path {info.path}")
            return 404
        route = sel.route
        if route.redirect is not None:
            prefix = next((m.path.value for m in route.matches
                           if m.path.type == "Prefix"
                           and m.matches(info.method, info.path, info.headers, info.query)), None)
            location = redirect_location(route.redirect, info, scheme=scheme, listener_port=port,
                                         matched_prefix=prefix)
            code = route.redirect.status_code
            await self._respond(down, code, f"redirecting to {location}",
                                [(b"location", location.encode("latin-1"))])
            return code
        backend = pick_backend(route.backends)
        if backend is None:
            src = route.source
            await self._respond(down, 500, f"no backends for this route ({src.kind} {src.namespace}/{src.name})")
            return 500
        if not backend.endpoints:
            await self._respond(down, 503, backend.problem
                                or f'no ready endpoints for service "{backend.namespace}/{backend.service}"')
            return 503
        limit = self.options.max_body_bytes
        length = info.headers.get("content-length", "")
        if limit and length.isdigit() and int(length) > limit:
            await self._respond(down, 413, f"request body over {limit} bytes", close=True)
            return 413
        return await self._proxy(down, req, info, sel, backend, port, scheme, client_ip)

    async def _proxy(self, down: Downstream, req: h11.Request, info: RequestInfo, sel: Selection,
                     backend: Backend, port: int, scheme: str, client_ip: str) -> int:
        route = sel.route
        timeout = route.timeout if route.timeout is not None else self.options.response_timeout
        has_body = _has_body(req)
        headers = upstream_request_headers(req.headers, info, client_ip=client_ip, scheme=scheme,
                                           port=port, flt=route.request_headers)
        if "transfer-encoding" in info.headers:
            headers.append((b"transfer-encoding", b"chunked"))
        # _parsed=True skips h11's re-validation: the method, target and headers came out
        # of h11's parser, what the proxy adds is well-formed (filter values are checked
        # in apply_filter).  It is h11's own switch for exactly this case.
        upstream_req = h11.Request(method=req.method, target=req.target, headers=headers, _parsed=True)
        retryable = req.method in IDEMPOTENT
        order = self._cursor.order(backend)
        attempts = order[: 1 + max(0, self.options.retries)]
        last_error = "no endpoint answered"
        for endpoint in attempts:
            conn = self._pool.take(endpoint)
            fresh_tries = 1  # a stale pooled connection may be replaced by one new connection
            while True:
                if conn is None:
                    try:
                        conn = await self._pool.connect(endpoint)
                    except (OSError, trio.TooSlowError) as e:
                        last_error = f"cannot connect to {endpoint.address}:{endpoint.port}: {_why(e)}"
                        break  # nothing was sent: the next endpoint, whatever the method
                outcome = await _Exchange(self, down, conn, upstream_req, info, sel, has_body, timeout).run()
                if outcome.status is not None:
                    return outcome.status
                # Reset before any response byte, with no body byte sent.
                last_error = outcome.error
                if conn.reused and fresh_tries > 0:
                    fresh_tries -= 1
                    conn = None
                    continue
                break
            if not retryable and conn is not None:
                break  # sent to the backend, not idempotent: no second try
        await self._respond(down, 502, f"bad gateway: {last_error}")
        return 502


@dataclass
class _Outcome:
    status: int | None  # None: failed before any response byte and before any body byte
    error: str = ""


class _Exchange:
    """One request/response cycle with one upstream connection."""

    def __init__(self, engine: ProxyEngine, down: Downstream, conn: UpstreamConn, req: h11.Request,
                 info: RequestInfo, sel: Selection, has_body: bool, timeout: float) -> None:
        self.engine, self.down, self.conn, self.req = engine, down, conn, req
        self.info, self.sel, self.has_body, self.timeout = info, sel, has_body, timeout
        self.body_sent = 0
        self.body_error: BaseException | None = None
        self.body_done = trio.Event()
        self.read_scope: trio.CancelScope | None = None

    async def run(self) -> _Outcome:
        conn, down = self.conn, self.down
        try:
            await _upstream_send(conn, self.req)
            if not self.has_body:
                await _upstream_send(conn, h11.EndOfMessage())
        except BROKEN as e:
            await conn.aclose()
            return _Outcome(None, f"connection to the backend broke: {_why(e)}")
        # Exceptions of the response side are carried out of the nursery by hand, so
        # they are not wrapped in an ExceptionGroup.
        result: list[int | Exception] = []

        async def respond(cancel: trio.CancelScope) -> None:
            try:
                result.append(await self._response())
            except (_Retry, _Closed) as e:
                result.append(e)
            if self.has_body and not self.body_done.is_set():
                cancel.cancel()  # the backend answered before taking the whole body

        if self.has_body:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump_body, nursery.cancel_scope)
                nursery.start_soon(respond, nursery.cancel_scope)
        else:
            await respond(trio.CancelScope())
        status: int | None = None
        if result:
            if isinstance(result[0], _Retry):
                await conn.aclose()
                return _Outcome(None, str(result[0]))
            if isinstance(result[0], Exception):
                await conn.aclose()
                raise result[0]
            status = result[0]
        if status is None:  # the body pump stopped the exchange
            await conn.aclose()
            err = self.body_error
            if isinstance(err, _TooLarge) and not down.started:
                limit = self.engine.options.max_body_bytes
                await self.engine._respond(down, 413, f"request body over {limit} bytes", close=True)
                return _Outcome(413)
            raise _Closed("client or backend gone while sending the request body")
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            self.engine._pool.give_back(conn)
        elif conn.h11.our_state is not h11.SWITCHED_PROTOCOL:
            await conn.aclose()
        return _Outcome(status)

    async def _pump_body(self, cancel: trio.CancelScope) -> None:
        limit = self.engine.options.max_body_bytes
        try:
            while True:
                ev = await self.down.next_event()
                if isinstance(ev, h11.Data):
                    self.body_sent += len(ev.data)
                    if limit and self.body_sent > limit:
                        raise _TooLarge
                    if not await self._to_backend(ev):
                        return
                elif isinstance(ev, h11.EndOfMessage):
                    await self._to_backend(h11.EndOfMessage())
                    return
                else:  # the client went away mid-body
                    raise _Closed
        except (_TooLarge, _Closed, h11.RemoteProtocolError) as e:
            # The client's side failed: stop the whole exchange.
            self.body_error = e
            cancel.cancel()
        finally:
            self.body_done.set()
            if self.read_scope is not None:  # the backend's silence counts from now
                self.read_scope.deadline = trio.current_time() + self.timeout

    async def _upstream_event(self) -> object:
        """The backend's next h11 event; trio.TooSlowError past the timeout of silence.
        The clock runs only once the request body is all sent (a slow upload is not a
        silent backend).  What was queued for the client goes out before waiting."""
        conn = self.conn
        while True:
            ev = conn.h11.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            await self.down.flush()
            # A bare CancelScope: fail_after's context-manager wrapper costs more per read.
            with trio.CancelScope(deadline=self._read_deadline()) as scope:
                self.read_scope = scope
                data = await conn.stream.receive_some(READ_SIZE)
            self.read_scope = None
            if scope.cancelled_caught:
                raise trio.TooSlowError
            conn.h11.receive_data(data)

    def _read_deadline(self) -> float:
        if self.has_body and not self.body_done.is_set():
            return math.inf
        return trio.current_time() + self.timeout

    async def _to_backend(self, ev: object) -> bool:
        """Send body to the backend; False once it broke (the response side reports that)."""
        try:
            await _upstream_send(self.conn, ev)
            return True
        except (h11.LocalProtocolError, *BROKEN):
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
                        raise _Closed("backend went silent mid-response") from None
                    await self.engine._respond(down, 504, f"gateway timeout: the backend sent no response "
                                               f"within {self.timeout:g}s")
                    return 504
                if isinstance(ev, h11.InformationalResponse):
                    got_bytes = True
                    if ev.status_code == 101 and self.info.upgrade:
                        return await self._switch(ev)
                    if ev.status_code != 101:
                        await down.send(h11.InformationalResponse(status_code=ev.status_code,
                                                                  headers=ev.headers, reason=ev.reason))
                    continue
                if isinstance(ev, h11.Response):
                    got_bytes = True
                    headers = downstream_response_headers(ev.headers, upgrade=False, flt=route.response_headers)
                    await down.send(h11.Response(status_code=ev.status_code, headers=headers, reason=ev.reason,
                                                 _parsed=True), flush=False)
                    status = ev.status_code
                    break
                return await self._early_failure("the backend closed the connection before answering")
            while True:
                try:
                    ev = await self._upstream_event()
                except trio.TooSlowError:
                    raise _Closed("backend went silent mid-response") from None
                if isinstance(ev, h11.Data):
                    await down.send(ev, flush=False)
                elif isinstance(ev, h11.EndOfMessage):
                    await down.send(h11.EndOfMessage())
                    return status
                else:
                    raise _Closed("the backend closed the connection mid-response")
        except (h11.RemoteProtocolError, *BROKEN) as e:
            got_bytes = got_bytes or bool(conn.h11.trailing_data[0])
            if got_bytes or down.started:
                if not down.started:
                    await self.engine._respond(down, 502, f"bad gateway: the backend's response broke: {_why(e)}")
                    return 502
                raise _Closed from e
            return await self._early_failure(f"the backend reset the connection: {_why(e)}")

    async def _early_failure(self, why: str) -> int:
        """No response byte came: retry elsewhere when that is safe, else 502."""
        if not self.body_sent and (self.req.method in IDEMPOTENT or self.conn.reused):
            raise _Retry(why)
        await self.engine._respond(self.down, 502, f"bad gateway: {why}")
        return 502

    async def _switch(self, ev: h11.InformationalResponse) -> int:
        """After the backend's 101: answer 101 to the client, then pipe raw bytes both ways."""
        conn, down = self.conn, self.down
        headers = downstream_response_headers(ev.headers, upgrade=True, flt=self.sel.route.response_headers)
        await down.send(h11.InformationalResponse(status_code=101, headers=headers, reason=ev.reason))
        client_extra, _ = down.h11.trailing_data
        backend_extra, _ = conn.h11.trailing_data
        try:
            if backend_extra:
                await down.stream.send_all(bytes(backend_extra))
            if client_extra:
                await conn.stream.send_all(bytes(client_extra))
        except BROKEN:
            await conn.aclose()
            return 101
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pipe, down.stream, conn.stream, nursery.cancel_scope)
            nursery.start_soon(_pipe, conn.stream, down.stream, nursery.cancel_scope)
        await conn.aclose()
        return 101


class _Retry(Exception):
    """The backend failed before any response byte: another endpoint may be tried."""


async def _pipe(src: trio.abc.Stream, dst: trio.abc.Stream, done: trio.CancelScope) -> None:
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


def head_size(req: h11.Request) -> int:
    """Bytes of a request line and headers as sent (give or take whitespace)."""
    return len(req.method) + len(req.target) + 12 + sum(len(k) + len(v) + 4 for k, v in req.headers)


def _has_body(req: h11.Request) -> bool:
    for name, value in req.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _why(e: BaseException) -> str:
    if isinstance(e, trio.TooSlowError):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return str(e) or type(e).__name__
