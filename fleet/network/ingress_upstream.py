"""Backend side of the built-in ingress proxy: picking a backend and an endpoint, and a
keep-alive connection pool per endpoint.

- `pick_backend`: by weight, at random (Gateway API's weighted backendRefs; a weight of 0
  takes no traffic); `EndpointCursor`: round-robin over a backend's endpoints, with a
  way to skip endpoints that already failed this request (retries go to ANOTHER endpoint).
- `UpstreamPool`: idle connections per (address, port), each an open stream plus the
  h11 client state that already finished a request/response cycle.  Bounded in count
  per endpoint and in idle time; a reused connection may have been closed by the
  backend meanwhile, which the proxy treats as "reset before any response byte".
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import h11
import trio

from fleet.network.routetable import Backend, Endpoint


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


@dataclass(eq=False)
class UpstreamConn:
    """An open connection to one endpoint and its h11 client state."""

    endpoint: Endpoint
    stream: trio.abc.Stream
    h11: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    reused: bool = False
    idle_since: float = 0.0

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
        h = conn.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
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
