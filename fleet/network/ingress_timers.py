"""Coarse timeouts for the built-in ingress proxy's socket waits.

The proxy times two waits per request: the client's next request head (keep-alive
idle time and slow heads) and the backend's answer (route or engine response
timeout).  A trio cancel scope with a deadline around each of them cost about 25 us
per request — a sixth of the engine's CPU — because every scope adds and removes an
entry in trio's deadline heap and the run loop keeps consulting it.  These timeouts
are seconds long, so they are checked instead by one task a few times per shortest
timeout (`resolution`); nginx rounds its timers similarly.

- `Timer`: one per client or backend connection (its socket), armed with a deadline
  just before a wait and disarmed right after (`Timers.arm`/`disarm`: a set insert
  and removal; only armed timers are checked);
- `Timers.expire`: every armed timer past its deadline is marked `expired` and its
  socket's waiters are woken with trio.ClosedResourceError (`notify_closing`); the
  owner sees a broken read, checks `expired` and treats it as the timeout, then closes
  the socket (notify_closing's contract).  An expired timer still armed at the next
  check fires again, so a wait that began after the first notice is woken too.

A timeout fires between its deadline and one `resolution` later.
"""

from __future__ import annotations

import math
import socket

import trio

#: Bounds of the check interval: timers are checked every tenth of the shortest timeout.
MIN_RESOLUTION = 0.02
MAX_RESOLUTION = 0.5


class Timer:
    """One wait's deadline (math.inf: not armed) for the waits on one socket."""

    __slots__ = ("deadline", "expired", "sock")

    def __init__(self, sock: socket.socket | trio.socket.SocketType) -> None:
        self.deadline = math.inf
        self.expired = False
        self.sock = sock


def resolution_for(timeouts: list[float]) -> float:
    """The check interval for these timeouts (seconds): a tenth of the shortest, bounded."""
    shortest = min((t for t in timeouts if t > 0), default=MAX_RESOLUTION * 10)
    return min(MAX_RESOLUTION, max(MIN_RESOLUTION, shortest / 10))


class Timers:
    """The armed Timers of one engine, and the task that checks them."""

    def __init__(self, resolution: float = MAX_RESOLUTION) -> None:
        self.resolution = resolution
        self._live: set[Timer] = set()  # the armed ones

    def arm(self, t: Timer, deadline: float) -> None:
        """Time the wait about to start (math.inf: wait unbounded for now)."""
        t.deadline = deadline
        t.expired = False
        self._live.add(t)

    def disarm(self, t: Timer) -> None:
        t.deadline = math.inf
        self._live.discard(t)

    def __len__(self) -> int:
        return len(self._live)

    def expire(self, now: float) -> list[Timer]:
        """Fire every armed timer past its deadline; the ones fired."""
        fired = [t for t in self._live if t.deadline <= now]
        for t in fired:
            t.expired = True
            if t.sock.fileno() < 0:  # closed already: nothing waits on it
                self._live.discard(t)
                continue
            trio.lowlevel.notify_closing(t.sock)
        return fired

    async def run(self) -> None:
        while True:
            await trio.sleep(self.resolution)
            self.expire(trio.current_time())


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under a plain TCP or TLS stream (None for other streams)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        sock = getattr(getattr(stream, "transport_stream", None), "socket", None)
    return sock
