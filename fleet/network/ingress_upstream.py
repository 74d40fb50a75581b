"""Backend side of the built-in ingress proxy: picking a backend and an endpoint, and a
keep-alive connection pool per endpoint.

- `pick_backend`: by weight, at random (Gateway API's weighted backendRefs; a weight of 0
  takes no traffic); `EndpointCursor`: round-robin over a backend's endpoints, with a
  way to skip endpoints that already failed this request (retries go to ANOTHER endpoint).
- `UpstreamPool`: idle connections per (address, port), each an open stream plus the
  h11 client state that already finished a request/response cycle.  Bounded in count
  per endpoint and in idle time; a reused connection may have been closed by the
  backend meanwhile, which the proxy treats as "reset before any response byte".
- `H1Client`: the HTTP/1.1 framing of the backend side (see its section below).
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from fleet.network.http1_body import END, NEED_DATA, BodyFramer
from fleet.network.ingress_timers import Timer
from fleet.network.routetable import Backend, Endpoint, RouteTable


def pick_backend(backends: Sequence[Backend], rng: random.Random | None = None) -> Backend | None:
    """A backend by weight; None when every weight is 0."""
    live = [b for b in backends if b.weight > 0]
    if not live:
        return None
    if len(live) == 1:
        return live[0]
    r = (rng or random).random() * sum(b.weight for b in live)
    for b in live:
        r -= b.weight
        if r < 0:
            return b
    return live[-1]


class EndpointCursor:
    """Round-robin position per backend (keyed by service identity, so it survives table swaps)."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, str, str], int] = {}

    def order(self, backend: Backend) -> list[Endpoint]:
        """The endpoints in the order to try them: this request's pick first, then the rest."""
        eps = backend.endpoints
        if not eps:
            return []
        key = (backend.namespace, backend.service, str(backend.port))
        start = self._next.get(key, 0) % len(eps)
        self._next[key] = start + 1
        return [*eps[start:], *eps[:start]]

    def prune(self, table: RouteTable) -> None:
        """Forget the positions of Services the table no longer routes to."""
        live = {(b.namespace, b.service, str(b.port))
                for lst in table.listeners for vh in lst.hosts for r in vh.routes for b in r.backends}
        for key in list(self._next):
            if key not in live:
                del self._next[key]


@dataclass(eq=False)
class UpstreamConn:
    """An open connection to one endpoint and its HTTP/1.1 client state."""

    endpoint: Endpoint
    stream: trio.abc.Stream
    h1: H1Client = field(default_factory=lambda: H1Client())
    reused: bool = False
    idle_since: float = 0.0
    timer: Timer | None = None  # times waits for the backend's answer (made on first use)

    async def aclose(self) -> None:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


class UpstreamPool:
    """Idle keep-alive connections per endpoint, newest first."""

    def __init__(self, *, connect_timeout: float, max_idle_per_endpoint: int = 32,
                 idle_timeout: float = 60.0) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle_per_endpoint
        self.idle_timeout = idle_timeout
        self._idle: dict[Endpoint, deque[UpstreamConn]] = {}

    def take(self, endpoint: Endpoint) -> UpstreamConn | None:
        """A pooled connection not idle too long (older ones are closed), or None."""
        q = self._idle.get(endpoint)
        now = trio.current_time()
        while q:
            conn = q.pop()
            if now - conn.idle_since <= self.idle_timeout:
                conn.reused = True
                return conn
            _close_nowait(conn)
        return None

    async def connect(self, endpoint: Endpoint) -> UpstreamConn:
        """A new connection; OSError (refused, unreachable) or trio.TooSlowError on failure."""
        with trio.fail_after(self.connect_timeout):
            # trio's SocketStream sets TCP_NODELAY: small request heads go out at once.
            stream = await trio.open_tcp_stream(endpoint.address, endpoint.port)
        return UpstreamConn(endpoint, stream)

    def give_back(self, conn: UpstreamConn) -> None:
        """Keep a connection whose cycle ended cleanly with keep-alive; close it otherwise."""
        h = conn.h1
        if h.reusable:
            h.start_next_cycle()
            q = self._idle.setdefault(conn.endpoint, deque())
            conn.idle_since = trio.current_time()
            q.append(conn)
            while len(q) > self.max_idle:
                _close_nowait(q.popleft())
        else:
            _close_nowait(conn)

    def expire(self) -> None:
        """Close connections idle past the timeout (called periodically)."""
        now = trio.current_time()
        for ep, q in list(self._idle.items()):
            while q and now - q[0].idle_since > self.idle_timeout:
                _close_nowait(q.popleft())
            if not q:
                del self._idle[ep]

    def idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def close_all(self) -> None:
        for q in self._idle.values():
            while q:
                _close_nowait(q.pop())
        self._idle.clear()


def _close_nowait(conn: UpstreamConn) -> None:
    """Close a socket stream without awaiting (plain TCP: closing the fd is enough)."""
    sock = getattr(conn.stream, "socket", None)
    if sock is not None:
        sock.close()


# ---- HTTP/1.1 client framing ------------------------------------------------------
#
# The backend side speaks through this small codec instead of h11: it is about half of
# the proxy's per-request CPU with h11 on both sides, and the client side needs only
# a subset (one request at a time, framing of responses).  Client input has its own
# codec, fleet.network.ingress_h1server.

#: Every header line of a head at once: a token name, a value without CR, LF or NUL.
_HEADER_BLOCK = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n\0]*\r\n)*")
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: (.*))?")
MAX_HEAD = 64 * 1024
#: The end of a head: an empty line, after CRLF or a bare LF (RFC 9112 §2.2 lets a
#: recipient accept LF alone; busybox httpd passes a CGI script's bare-LF headers on).
_HEAD_END = re.compile(rb"\n\r?\n")


class UpstreamError(Exception):
    """The backend broke HTTP/1.1 (or closed early): a 502 when nothing went out yet."""


@dataclass(slots=True)
class Head:
    """A response head (1xx included) from the backend."""

    status_code: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]


class H1Client(BodyFramer):
    """Framing for one backend connection: `request`/`body`/`end` give the bytes to send;
    `receive_data` + `next_event` give Head, body bytes, END or NEED_DATA."""

    error = UpstreamError
    eof_message = "the backend closed the connection mid-body"

    def __init__(self) -> None:
        super().__init__()
        self.start_next_cycle()

    def start_next_cycle(self) -> None:
        self.method = b""
        self.chunked_out = False
        self.sent_done = False
        self.state = "head"  # head → body → done; or switched after a 101
        self.framing = ""  # length | chunked | close | none
        self._reset_body()
        self.keep_alive = True

    def request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], *,
                chunked: bool) -> bytes:
        self.method, self.chunked_out = method, chunked
        parts = [method, b" ", target, b" HTTP/1.1\r\n"]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def body(self, data: bytes) -> bytes:
        if not self.chunked_out:
            return data
        return b"%x\r\n" % len(data) + data + b"\r\n" if data else b""

    def end(self) -> bytes:
        self.sent_done = True
        return b"0\r\n\r\n" if self.chunked_out else b""

    @property
    def reusable(self) -> bool:
        return (self.state == "done" and self.sent_done and self.keep_alive
                and not self.buf and not self.eof)

    def next_event(self) -> object:
        if self.state == "head":
            return self._head()
        if self.state == "body":
            return self._body()
        raise UpstreamError(f"no event in state {self.state}")

    def _head(self) -> object:
        buf = self.buf
        end = _HEAD_END.search(buf)
        if end is None:
            if len(buf) > MAX_HEAD:
                raise UpstreamError("response head too large")
            if self.eof:
                raise UpstreamError("the backend closed the connection before answering")
            return NEED_DATA
        raw = bytes(buf[: end.end()])
        del buf[: end.end()]
        if raw.count(b"\n") == raw.count(b"\r\n"):
            raw = raw[:-2]  # every line ends in CRLF: drop the empty line
        else:  # some bare LFs: every line to CRLF (one CR dropped per line, as h11 does)
            lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in raw.split(b"\n")[:-2]]
            raw = b"\r\n".join(lines) + b"\r\n"
        status_line, _, block = raw.partition(b"\r\n")
        m = _STATUS_LINE.fullmatch(status_line)
        if m is None:
            raise UpstreamError(f"bad status line {status_line[:80]!r}")
        if _HEADER_BLOCK.fullmatch(block) is None:
            raise UpstreamError("bad header line in the response")
        status = int(m.group(2))
        headers: list[tuple[bytes, bytes]] = []
        length: bytes | None = None
        chunked = False
        for line in block.split(b"\r\n")[:-1]:
            name, _, value = line.partition(b":")
            value = value.strip(b" \t")
            headers.append((name, value))
            lname = name.lower()
            if lname == b"content-length":
                if length is not None and length != value or not value.isdigit():
                    raise UpstreamError("bad Content-Length")
                length = value
            elif lname == b"transfer-encoding":
                chunked = value.lower().rsplit(b",", 1)[-1].strip() == b"chunked"
                if not chunked:
                    self.keep_alive = False  # another coding last: the body runs to close
            elif lname == b"connection" and b"close" in value.lower():
                self.keep_alive = False
        if m.group(1) == b"0":
            self.keep_alive = False
        head = Head(status, m.group(3) or b"", headers)
        if status < 200:
            if status == 101:
                self.state = "switched"
            return head
        self.state = "body"
        if self.method == b"HEAD" or status in (204, 304):
            self.framing = "none"
        elif chunked:
            self.framing = "chunked"
        elif length is not None:
            self.framing, self.left = "length", int(length)
        else:
            self.framing, self.keep_alive = "close", False
        return head

    def _body_done(self) -> None:
        self.state = "done"

    def _body(self) -> object:
        framing = self.framing
        if framing == "length":
            return self._length_body()
        if framing == "close":
            buf = self.buf
            if buf:
                data = bytes(buf)
                buf.clear()
                return data
            if self.eof:
                self.state = "done"
                return END
            return NEED_DATA
        if framing == "none":
            self.state = "done"
            return END
        return self._chunked_body()

    def _chunk_size(self, idx: int) -> int:
        # Backends get the tolerant reading: whitespace around the size and extensions.
        size = bytes(self.buf[:idx]).split(b";", 1)[0].strip()
        try:
            return int(size, 16)
        except ValueError:
            raise UpstreamError(f"bad chunk size {size[:20]!r}") from None

    def _trailer(self) -> object:
        """Trailer fields are not passed on: skip lines up to the empty one."""
        buf = self.buf
        while True:
            idx = buf.find(b"\r\n")
            if idx < 0:
                if len(buf) > MAX_HEAD:
                    raise UpstreamError("trailer too large")
                if self.eof:
                    raise UpstreamError(self.eof_message)
                return NEED_DATA
            line = bytes(buf[:idx])
            del buf[: idx + 2]
            if not line:
                self.state = "done"
                return END
