"""The built-in ingress engine ("builtin"): a Trio reverse proxy serving a RouteTable.

    client ─TCP/TLS─→ listener (one per Listener.port) ─H1Server parse─→ route (RouteTable.select)
          ─→ backend by weight, endpoint round-robin ─H1Client─→ pooled upstream connection

What this module owns: listening ports opened and closed as tables change, one task
per client connection (keep-alive, timeouts, 400/431/501), and per request the route,
redirect, error answers and the attempts over a backend's endpoints (retries).  The
exchange with one backend connection — streamed both ways, never buffered whole, raw
piping after a 101 — is fleet.network.ingress_exchange; parsing client requests is
fleet.network.ingress_h1server; decisions about headers,
redirects and error bodies are pure functions in fleet.network.ingress_http; the
backend pick and the connection pool are fleet.network.ingress_upstream; SNI
certificate choice is fleet.network.ingress_tls.

Tables swap atomically: a request reads `self._table` once when its head arrives and
keeps that table; `apply` never touches open connections, so a rule or endpoint change
cuts nothing, and a keep-alive connection's next request sees the newest table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from fleet.network.ingress_exchange import (
    BROKEN,
    Closed,
    Downstream,
    Exchange,
    UpstreamRequest,
    receive,
    respond,
    why,
)
from fleet.network.ingress_h1server import ProtocolError, Request
from fleet.network.ingress_http import (
    IDEMPOTENT,
    RequestInfo,
    redirect_location,
    upstream_request_headers,
)
from fleet.network.ingress_timers import Timer, Timers, resolution_for, socket_of
from fleet.network.ingress_tls import TlsContexts
from fleet.network.ingress_upstream import EndpointCursor, UpstreamPool, pick_backend
from fleet.network.routetable import (
    Backend,
    EngineError,
    EngineOptions,
    RouteTable,
    Selection,
    Source,
)

log = logging.getLogger(__name__)


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
        self._timers = Timers(resolution_for([options.keepalive_timeout, options.response_timeout]))
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
                nursery.start_soon(self._timers.run)
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
            unbound: list[int] = []
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
            opts = self.options
            self._timers.resolution = resolution_for(
                [opts.keepalive_timeout, opts.response_timeout,
                 *(r.timeout for lst in table.listeners for vh in lst.hosts for r in vh.routes
                   if r.timeout is not None)])
            self._tls.prune(table)
            self._cursor.prune(table)
            wanted = {lst.port for lst in table.listeners}
            for port in sorted(wanted - set(self._listening)):
                try:
                    listeners = await trio.open_tcp_listeners(port, host=self.options.bind_address)
                except OSError as e:
                    problems.append(f"port {port}: cannot listen on {self.options.bind_address}: {e}")
                    unbound.append(port)
                    continue
                scope, done = trio.CancelScope(), trio.Event()
                self._listening[port] = _Listening(scope, done)
                self._nursery.start_soon(self._accept, port, listeners, scope, done)
            for port in sorted(set(self._listening) - wanted):
                gone = self._listening.pop(port)
                gone.scope.cancel()  # the accept loop only: open connections live on
                await gone.done.wait()
            if problems:
                raise EngineError("; ".join(problems), ports=unbound)

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
        # A bug met by one connection must not take the engine (and every other
        # connection) down with it: log it and close that connection only.
        try:
            await self._serve_conn(stream, port)
        except Exception:
            log.exception("ingress connection on port %d failed", port)

    async def _serve_conn(self, stream: trio.SocketStream, port: int) -> None:
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
        sock = socket_of(down.stream)
        await self._serve_requests(down, port, scheme, client_ip, Timer(sock) if sock is not None else None)

    async def _next_request(self, down: Downstream, timer: Timer | None) -> object:
        """The client's next request head (None: idle timeout or the client closed).
        Idle wait and the head itself share one deadline: a client that never finishes
        its headers (slowloris) is closed like an idle one.  Timed by a coarse Timer
        (see ingress_timers), or a cancel scope for a stream without a socket."""
        deadline = trio.current_time() + self.options.keepalive_timeout
        if timer is None:
            with trio.CancelScope(deadline=deadline):
                return await down.next_event()
            return None
        self._timers.arm(timer, deadline)
        try:
            return await down.next_event()
        except ProtocolError:
            if timer.expired:  # the read broke because the timer fired: no 400
                return None
            raise
        finally:
            self._timers.disarm(timer)

    async def _serve_requests(self, down: Downstream, port: int, scheme: str, client_ip: str,
                              timer: Timer | None) -> None:
        while True:
            try:
                ev = await self._next_request(down, timer)
            except ProtocolError as e:
                await self._client_error(down, e)
                return
            if ev.__class__ is not Request:
                return  # idle timeout or the client closed
            down.begin(ev)  # type: ignore[arg-type]
            try:
                await self._request(down, ev, port, scheme, client_ip)  # type: ignore[arg-type]
            except Closed:
                return
            except ProtocolError as e:
                await self._client_error(down, e)
                return
            if down.switched:
                return
            if down.h1.state == "body":
                await self._drain(down)
                return
            if not down.next_cycle():
                return

    async def _client_error(self, down: Downstream, e: ProtocolError) -> None:
        """400 (malformed), 431 (head too large) or 501 (a transfer coding other than
        chunked) for this connection only, then close."""
        status = e.status
        if status == 431:
            text = "request header fields too large"
        elif status == 501:
            text = f"not implemented: {e}"
        else:
            text = f"bad request: {e}"
        if not down.started:
            try:
                await respond(down, status, text, close=True)
            except Closed:
                pass
        self._observe(None, status, 0.0)

    async def _drain(self, down: Downstream) -> None:
        """Read (and drop) what is left of a request body for a moment before closing, so
        the client sees our answer rather than a reset."""
        with trio.move_on_after(1.0):
            for _ in range(64):
                try:
                    data = await receive(down.stream)
                except BROKEN:
                    return
                if not data:
                    return

    def _observe(self, source: Source | None, status: int, seconds: float) -> None:
        if self.options.observe is not None:
            try:
                self.options.observe(source, status, seconds)
            except Exception:  # an observer's bug must not break the proxy
                log.exception("ingress request observer failed")

    # ---- one request -----------------------------------------------------------

    async def _request(self, down: Downstream, req: Request, port: int, scheme: str,
                       client_ip: str) -> None:
        started = trio.current_time()
        table = self._table  # this request keeps this table, whatever apply does meanwhile
        info = RequestInfo.parse(req.method, req.target, req.headers)
        sel = table.select(port, info.host, info.method, info.path, info.headers, info.query)
        source = sel.route.source if sel is not None else None
        try:
            await self._route(down, req, info, sel, port, scheme, client_ip)
        finally:
            # What the client got; 499 (nginx's "client closed request") when the
            # exchange broke before any response head went out.
            self._observe(source, down.status or 499, trio.current_time() - started)

    async def _route(self, down: Downstream, req: Request, info: RequestInfo,
                     sel: Selection | None, port: int, scheme: str, client_ip: str) -> int:
        if sel is None:
            await respond(down, 404, f"no route for host {info.host or '(none)'} path {info.path}")
            return 404
        route = sel.route
        if route.redirect is not None:
            prefix = next((m.path.value for m in route.matches
                           if m.path.type == "Prefix"
                           and m.matches(info.method, info.path, info.headers, info.query)), None)
            location = redirect_location(route.redirect, info, scheme=scheme, listener_port=port,
                                         matched_prefix=prefix)
            code = route.redirect.status_code
            await respond(down, code, f"redirecting to {location}",
                                [(b"location", location.encode("latin-1"))])
            return code
        backend = pick_backend(route.backends)
        if backend is None:
            src = route.source
            await respond(down, 500, f"no backends for this route ({src.kind} {src.namespace}/{src.name})")
            return 500
        if not backend.endpoints:
            await respond(down, 503, backend.problem
                                or f'no ready endpoints for service "{backend.namespace}/{backend.service}"')
            return 503
        limit = self.options.max_body_bytes
        length = info.headers.get("content-length", "")
        if limit and length.isdigit() and int(length) > limit:
            await respond(down, 413, f"request body over {limit} bytes", close=True)
            return 413
        return await self._proxy(down, req, info, sel, backend, port, scheme, client_ip)

    async def _proxy(self, down: Downstream, req: Request, info: RequestInfo, sel: Selection,
                     backend: Backend, port: int, scheme: str, client_ip: str) -> int:
        route = sel.route
        timeout = route.timeout if route.timeout is not None else self.options.response_timeout
        has_body = req.has_body
        headers = upstream_request_headers(req.headers, info, client_ip=client_ip, scheme=scheme,
                                           port=port, flt=route.request_headers)
        chunked = "transfer-encoding" in info.headers
        if chunked:
            headers.append((b"transfer-encoding", b"chunked"))
        # The method, target and headers came out of H1Server's parser; what the proxy adds
        # is well-formed (filter names and values are checked in apply_filter).
        upstream_req = UpstreamRequest(req.method, req.target, headers, chunked)
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
                        last_error = f"cannot connect to {endpoint.address}:{endpoint.port}: {why(e)}"
                        break  # nothing was sent: the next endpoint, whatever the method
                outcome = await Exchange(self._pool, down, conn, upstream_req, info, sel, has_body, timeout,
                                         self.options.max_body_bytes, self._timers).run()
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
        await respond(down, 502, f"bad gateway: {last_error}")
        return 502


