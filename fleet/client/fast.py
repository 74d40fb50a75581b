"""A minimal keep-alive HTTP/1.1 client for the hottest internal request paths.

The scheduler binds hundreds of pods a second, each one POST.  Through httpx a request
costs several times what the server spends answering it (URL and header models, the
pool, auth and redirect layers — measured with py-spy: ~half of the scheduler's CPU at
full speed).  `FastConnection` is one TLS (or plain) connection speaking HTTP/1.1 with
h11 directly: the request is a few bytes built by hand, the response parsed by h11, the
connection kept alive and re-opened when the server closed it.  One request at a time
per connection; callers keep a pool of them.  Everything else keeps using
`fleet.client.Client`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import h11
import trio

from fleet.client.rest import ApiException, ClientConfig, ssl_context


class FastConnection:
    def __init__(self, config: ClientConfig, *, user_agent: str = "fleet",
                 timeout: float = 30.0) -> None:
        url = urlsplit(config.server)
        self.tls = url.scheme == "https"
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if self.tls else 80)
        self.base = url.path.rstrip("/")
        self.ssl = ssl_context(config) if self.tls else None
        self.timeout = timeout
        self._headers = [("Host", url.netloc), ("User-Agent", user_agent),
                         ("Accept", "application/json")]
        if config.token:
            self._headers.append(("Authorization", f"Bearer {config.token}"))
        self._stream: trio.abc.Stream | None = None
        self._conn: h11.Connection | None = None

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with trio.CancelScope(shield=True):
                try:
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def __aenter__(self) -> FastConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _connect(self) -> None:
        if self.tls:
            assert self.ssl is not None
            stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                self.host, self.port, ssl_context=self.ssl, https_compatible=True)
        else:
            stream = await trio.open_tcp_stream(self.host, self.port)
        self._stream = stream
        self._conn = h11.Connection(our_role=h11.CLIENT)

    async def post_json(self, path: str, body: Any) -> dict[str, Any]:
        """POST a JSON body; the decoded answer, or ApiException for a non-2xx status."""
        data = json.dumps(body, separators=(",", ":")).encode()
        status, payload = await self.request("POST", path, data, "application/json")
        return _decode(status, payload)

    async def request(self, method: str, path: str, data: bytes = b"",
                      content_type: str | None = None) -> tuple[int, bytes]:
        """One request; (status, body).  A connection the server closed while idle is
        re-opened once, before anything was sent on it."""
        with trio.fail_after(self.timeout):
            for attempt in (0, 1):
                fresh = self._stream is None or self._conn is None or \
                    self._conn.our_state is not h11.IDLE
                if fresh:
                    await self.aclose()
                    await self._connect()
                try:
                    return await self._roundtrip(method, path, data, content_type)
                except _Stale:
                    await self.aclose()
                    if attempt or fresh:
                        raise OSError("the API server closed the connection") from None
                except BaseException:
                    await self.aclose()
                    raise
        raise AssertionError("unreachable")

    async def _roundtrip(self, method: str, path: str, data: bytes,
                         content_type: str | None) -> tuple[int, bytes]:
        assert self._stream is not None and self._conn is not None
        conn = self._conn
        headers = list(self._headers)
        headers.append(("Content-Length", str(len(data))))
        if content_type:
            headers.append(("Content-Type", content_type))
        out = conn.send(h11.Request(method=method, target=self.base + path, headers=headers))
        out += conn.send(h11.Data(data=data)) if data else b""
        out += conn.send(h11.EndOfMessage())
        try:
            await self._stream.send_all(out)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise _Stale() from None
        status = 0
        chunks: list[bytes] = []
        got_any = False
        while True:
            try:
                event = conn.next_event()
            except h11.ProtocolError as e:
                raise OSError(f"bad HTTP from the API server: {e}") from None
            if event is h11.NEED_DATA:
                try:
                    raw = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    raw = b""
                if not raw and not got_any:
                    raise _Stale()  # closed while idle: nothing was processed
                got_any = got_any or bool(raw)
                conn.receive_data(raw)
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise OSError("the API server closed the connection mid-response")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.aclose()
        return status, b"".join(chunks)


class _Stale(Exception):
    """The kept-alive connection turned out to be closed before the request was read."""


def _decode(status: int, payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload) if payload else {}
    except ValueError:
        body = None
    if 200 <= status < 300:
        return body if isinstance(body, dict) else {}
    if isinstance(body, dict) and body.get("kind") == "Status":
        raise ApiException(body, status)
    raise ApiException({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": payload.decode(errors="replace").strip()
                        or f"the server responded with status {status}", "code": status}, status)
