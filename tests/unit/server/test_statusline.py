"""Reason phrases on the API listener's HTTP/1.1 status lines (fleet/server/statusline.py)."""

from __future__ import annotations

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from fleet.server import upgrade
from fleet.server.statusline import reason_phrase


@pytest.mark.parametrize(("code", "phrase"), [
    (200, "OK"), (201, "Created"), (404, "Not Found"), (409, "Conflict"), (410, "Gone"),
    (413, "Request Entity Too Large"), (414, "Request URI Too Long"), (415, "Unsupported Media Type"),
    (422, "Unprocessable Entity"), (429, "Too Many Requests"), (500, "Internal Server Error"),
    (504, "Gateway Timeout"), (599, "status code 599"),
])
def test_reason_phrase_is_gos(code: int, phrase: str) -> None:
    assert reason_phrase(code) == phrase


async def test_the_api_listener_writes_reason_phrases() -> None:
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        code = int(scope["path"].strip("/"))
        await send({"type": "http.response.start", "status": code, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    upgrade.enable(cfg)
    async with trio.open_nursery() as n:
        binds = await n.start(serve, app, cfg)
        port = int(binds[0].rsplit(":", 1)[1])
        lines = []
        for code in (404, 422, 201):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(f"GET /{code} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                data = b""
                with trio.fail_after(5):
                    while b"\r\n" not in data:
                        data += await stream.receive_some()
            lines.append(data.split(b"\r\n", 1)[0])
        n.cancel_scope.cancel()
    assert lines == [b"HTTP/1.1 404 Not Found", b"HTTP/1.1 422 Unprocessable Entity", b"HTTP/1.1 201 Created"]
