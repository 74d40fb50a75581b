"""How long a client may take to send a request, on every Fleet HTTP listener.

Modelled on kube-apiserver, whose Go http.Server has ReadHeaderTimeout 32 s
(which also bounds the TLS handshake) and whose --request-timeout is 60 s.
Hypercorn 0.18 offers three relevant knobs, and what they really cover
(hypercorn/trio/tcp_server.py, hypercorn/protocol/h11.py) decides which we use:

- `ssl_handshake_timeout`: a `fail_after` around the TLS handshake.  Without
  a bound that is lower than its 60 s default, an idle TCP connection to the TLS
  port holds a task for a minute.
- `keep_alive_timeout`: the connection's idle timer.  It runs from the moment
  the connection is accepted (after the handshake) and again after every
  response, and stops only once a *complete* request head (request line and
  headers) is parsed, so it bounds both the idle time between requests and a
  slowloris dribbling header bytes.  Long responses are not affected: the timer
  does not run while a request is in progress.
- `read_timeout`: a `fail_after` around *every* socket read, including while a
  response streams.  A watch or `logs -f` client sends nothing for minutes, so
  any read_timeout would cut those streams; it stays None.

What hypercorn leaves open, a request body that never arrives (a partial body,
a Content-Length of 10^20, a 2^64 chunk size), is bounded by the application:
FleetASGI reads the whole body under `body_timeout` (408), and refuses a
declared Content-Length beyond its limit before reading (413).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import trio
from hypercorn.config import Config as HyperConfig

# kube-apiserver's ReadHeaderTimeout ("just shy of requestTimeoutUpperBound").
DEFAULT_HEADER_TIMEOUT = 32.0
# kube-apiserver's --request-timeout default.
DEFAULT_BODY_TIMEOUT = 60.0


@dataclass(frozen=True)
class ClientTimeouts:
    """The three bounds, in seconds; each must be positive and finite."""

    keep_alive_timeout: float = DEFAULT_HEADER_TIMEOUT
    tls_handshake_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("keep_alive_timeout", "tls_handshake_timeout", "body_timeout"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number of seconds (got {v!r})")

    def apply(self, cfg: HyperConfig) -> None:
        """Set what hypercorn enforces itself (see the module docstring for why not read_timeout)."""
        cfg.keep_alive_timeout = self.keep_alive_timeout
        cfg.ssl_handshake_timeout = self.tls_handshake_timeout
        cfg.read_timeout = None


class BodyIdleTimeout:
    """ASGI middleware for apps that read bodies themselves (the agent's Quart app).

    A request body that stops arriving for `timeout` seconds reads as the
    client's disconnect, which ends the request (Quart cancels its handler;
    hypercorn closes the connection).  The bound is on silence between chunks,
    not on the whole body, so a multi-GB image upload that keeps moving is
    fine.  Once the body is complete, receive() is passed through untouched: a
    streaming response (logs -f) waits on it for the disconnect for as long as
    it runs.
    """

    def __init__(self, app: Any, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False

        async def guarded() -> dict[str, Any]:
            nonlocal body_done
            if body_done:
                return await receive()
            with trio.move_on_after(self.timeout):
                msg = await receive()
                if msg["type"] != "http.request" or not msg.get("more_body"):
                    body_done = True
                return msg
            body_done = True
            return {"type": "http.disconnect"}

        await self.app(scope, guarded, send)
