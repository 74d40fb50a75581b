"""Request-arrival bounds that need no socket: FleetASGI's body read and the
agent's BodyIdleTimeout middleware (the real-socket side is
tests/integration/test_api_hardening.py)."""

from __future__ import annotations

import pytest
import trio
from hypercorn.config import Config as HyperConfig

from fleet.server.asgi import _read_body
from fleet.server.limits import BodyIdleTimeout, ClientTimeouts
from fleet.server.request_params import MAX_BODY


def receiver(*msgs: dict, then_block: bool = True):
    queue = list(msgs)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        if then_block:
            await trio.sleep_forever()
        return {"type": "http.disconnect"}
    return receive


async def test_body_that_never_ends_is_408_in_time():
    with trio.fail_after(5):
        body, err = await _read_body(receiver({"type": "http.request", "body": b"{", "more_body": True}),
                                     {"content-length": "100"}, 0.2)
    assert body == b"" and err is not None and err.code == 408 and err.reason == "Timeout"


async def test_declared_length_beyond_the_limit_is_413_before_reading():
    async def never(): raise AssertionError("must not read")  # noqa: E704
    body, err = await _read_body(never, {"content-length": str(MAX_BODY + 1)}, 10)
    assert err is not None and err.code == 413
    body, err = await _read_body(never, {"content-length": "1" + "0" * 19}, 10)
    assert err is not None and err.code == 413


async def test_chunked_body_past_the_limit_drains_under_the_deadline():
    big = {"type": "http.request", "body": b"x" * (MAX_BODY + 1), "more_body": True}
    with trio.fail_after(5):
        _, err = await _read_body(receiver(big), {}, 0.2)  # then the client stalls: still bounded
    assert err is not None and err.code == 413


async def test_whole_body_is_read():
    body, err = await _read_body(receiver({"type": "http.request", "body": b"ab", "more_body": True},
                                          {"type": "http.request", "body": b"c"}), {}, 5)
    assert (body, err) == (b"abc", None)


async def test_body_idle_timeout_turns_silence_into_disconnect():
    seen: list[dict] = []

    async def app(scope, receive, send):
        while True:
            msg = await receive()
            seen.append(msg)
            if msg["type"] == "http.disconnect" or not msg.get("more_body"):
                return

    mw = BodyIdleTimeout(app, 0.2)
    with trio.fail_after(5):
        await mw({"type": "http"}, receiver({"type": "http.request", "body": b"a", "more_body": True}), None)
    assert [m["type"] for m in seen] == ["http.request", "http.disconnect"]


async def test_body_idle_timeout_leaves_a_finished_body_alone():
    # After the body, a streaming response waits on receive() for the disconnect: never cut.
    got: list[str] = []

    async def app(scope, receive, send):
        await receive()
        with trio.move_on_after(0.5):
            await receive()
            got.append("returned")
        got.append("still waiting")

    await BodyIdleTimeout(app, 0.1)({"type": "http"}, receiver({"type": "http.request", "body": b""}), None)
    assert got == ["still waiting"]


def test_timeouts_apply_to_hypercorn_but_never_read_timeout():
    cfg = HyperConfig()
    ClientTimeouts(3, 4, 5).apply(cfg)
    assert (cfg.keep_alive_timeout, cfg.ssl_handshake_timeout, cfg.read_timeout) == (3, 4, None)
    with pytest.raises(ValueError):
        ClientTimeouts(keep_alive_timeout=float("inf"))
    with pytest.raises(ValueError):
        ClientTimeouts(body_timeout=0)
