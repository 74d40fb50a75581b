"""Port-forward bookkeeping and the SPDY / channel servers with fake transports and pods
(fleet/server/portforward.py; the agent's error text from fleet/agent/portforward.py)."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio

from fleet.agent.portforward import PodSandboxRef, _go_errno, connect_error_text
from fleet.api import errors
from fleet.server import portforward as pf
from fleet.server import spdy


@pytest.mark.parametrize("value,want", [
    ("80", 80), ("65535", 65535), (None, '"port" header is required'),
    ("", '"port" header is required'), ("0", 'port "0" must be > 0'),
    ("65536", 'unable to parse "65536" as a port'), ("-1", 'unable to parse "-1" as a port'),
    ("http", 'unable to parse "http" as a port'),
])
def test_parse_port(value: str | None, want: int | str) -> None:
    if isinstance(want, int):
        assert pf.parse_port(value) == want
    else:
        with pytest.raises(ValueError, match=want):
            pf.parse_port(value)


def test_parse_ports_query() -> None:
    assert pf.parse_ports_query(["80,81", "82"]) == [80, 81, 82]
    for values, msg in (([], 'query parameter "ports" is required'),
                        ([""], "cannot be empty"), (["80,x"], 'unable to parse "x"')):
        with pytest.raises(errors.BadRequest, match=msg):
            pf.parse_ports_query(values)


@pytest.mark.parametrize("offered,want", [
    (["SPDY/3.1+portforward.k8s.io"], pf.TUNNEL_PROTOCOL),
    (["v5.channel.k8s.io", "v4.channel.k8s.io"], pf.CHANNEL_V4),
    ([], ""), (["v5.channel.k8s.io"], None), (["base64.channel.k8s.io"], None),
])
def test_choose_protocol(offered: list[str], want: str | None) -> None:
    assert pf.choose_protocol(offered) == want


def _h(**kw: str) -> spdy.Headers:
    return tuple((k.lower(), v) for k, v in kw.items())


def test_stream_pairs() -> None:
    pairs = pf.StreamPairs()
    got = pairs.add(1, _h(streamType="error", port="80", requestID="0"))
    assert got == (pf.Pair("0", 80, error_id=1), True)
    got = pairs.add(3, _h(streamType="data", port="80", requestID="0"))
    assert isinstance(got, tuple) and got[0].complete and got[1] is False
    dup = pairs.add(5, _h(streamType="data", port="80", requestID="0"))
    assert isinstance(dup, pf.Rejected) and dup.pair is not None
    assert dup.message == "error processing stream for request 0: data stream already assigned"
    # Old clients without requestID: error stream n and data stream n+2 pair up.
    a = pairs.add(7, _h(streamType="error", port="81"))
    b = pairs.add(9, _h(streamType="data", port="81"))
    assert isinstance(a, tuple) and isinstance(b, tuple) and a[0] is b[0] and b[0].complete
    pairs.remove("0")
    assert "0" not in pairs.pairs


@pytest.mark.parametrize("headers,msg", [
    (_h(streamType="data"), '"port" header is required'),
    (_h(streamType="data", port="0"), 'port "0" must be > 0'),
    (_h(port="80"), '"streamType" header is required'),
    (_h(streamType="stdin", port="80"), 'invalid stream type "stdin"'),
])
def test_stream_pairs_rejects(headers: spdy.Headers, msg: str) -> None:
    got = pf.StreamPairs().add(1, headers)
    assert got == pf.Rejected(msg)


def test_connect_error_text_matches_containerds() -> None:
    ref = PodSandboxRef("abc", "/run/fleet/netns/abc")
    refused = _go_errno(OSError(errno.ECONNREFUSED, "x"))
    assert refused == "connection refused"
    text = connect_error_text(81, ref, f"dial tcp4 127.0.0.1:81: connect: {refused}",
                              "dial tcp6: address localhost: no suitable address found")
    assert text == (
        'error forwarding port 81 to pod abc, uid : failed to execute portforward in network '
        'namespace "/run/fleet/netns/abc": failed to connect to localhost:81 inside namespace '
        '"abc", IPv4: dial tcp4 127.0.0.1:81: connect: connection refused IPv6 dial tcp6: '
        'address localhost: no suitable address found ')
    assert 'network namespace "host"' in connect_error_text(1, PodSandboxRef("s", None), "a", "b")


# ------------------------------------------------------------ fakes
@dataclass
class FakePod:
    """Upper-cases what it gets; ends (EOF) once the client half-closes."""

    port: int
    received: list[bytes] = field(default_factory=list)
    eof: bool = False
    closed: bool = False

    def __post_init__(self) -> None:
        self._tx, self._rx = trio.open_memory_channel[bytes | None](100)

    async def receive(self) -> bytes | None:
        return await self._rx.receive()

    async def send(self, data: bytes) -> None:
        self.received.append(data)
        await self._tx.send(data.upper())

    async def send_eof(self) -> None:
        self.eof = True
        await self._tx.send(None)


@dataclass
class FakeDialer:
    pods: list[FakePod] = field(default_factory=list)
    refused: tuple[int, ...] = (81,)

    def __call__(self, port: int) -> AbstractAsyncContextManager[FakePod]:
        @asynccontextmanager
        async def cm() -> AsyncIterator[FakePod]:
            if port in self.refused:
                raise pf.ForwardError(f"nothing listens on {port}")
            pod = FakePod(port)
            self.pods.append(pod)
            try:
                yield pod
            finally:
                pod.closed = True
        return cm()


class MemoryTransport:
    def __init__(self) -> None:
        self.to_server_tx, self.to_server_rx = trio.open_memory_channel[bytes | None](100)
        self.to_client_tx, self.to_client_rx = trio.open_memory_channel[bytes](100)

    async def receive(self) -> bytes | None:
        return await self.to_server_rx.receive()

    async def send(self, data: bytes) -> None:
        await self.to_client_tx.send(data)


class Client:
    """kubectl's side: opens error+data stream pairs and reads the server's frames."""

    def __init__(self, t: MemoryTransport) -> None:
        self.t, self.enc, self.dec = t, spdy.FrameEncoder(), spdy.FrameDecoder()
        self.frames: list[spdy.Frame] = []

    async def send(self, *frames: spdy.Frame) -> None:
        await self.t.to_server_tx.send(b"".join(self.enc.encode(f) for f in frames))

    async def open(self, error_id: int, port: int, rid: str) -> None:
        await self.send(
            spdy.SynStream(error_id, _h(streamType="error", port=str(port), requestID=rid)),
            spdy.DataFrame(error_id, b"", fin=True),
            spdy.SynStream(error_id + 2, _h(streamType="data", port=str(port), requestID=rid)))

    async def until(self, pred: object) -> list[spdy.Frame]:
        with trio.fail_after(5):
            while not pred(self.frames):  # type: ignore[operator]
                self.frames += self.dec.feed(await self.t.to_client_rx.receive())
        return self.frames

    def data(self, sid: int) -> tuple[bytes, bool]:
        fs = [f for f in self.frames if isinstance(f, spdy.DataFrame) and f.stream_id == sid]
        return b"".join(f.data for f in fs), any(f.fin for f in fs)


async def test_spdy_two_connections_and_a_refused_port() -> None:
    t, dial = MemoryTransport(), FakeDialer()
    server = pf.SpdyPortForward(t, dial)
    c = Client(t)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await c.open(1, 80, "0")
        await c.open(5, 80, "1")
        await c.open(9, 81, "2")
        await c.send(spdy.DataFrame(3, b"hello"), spdy.DataFrame(7, b"world"))
        frames = await c.until(lambda fs: c.data(3)[0] == b"HELLO" and c.data(7)[0] == b"WORLD"
                               and c.data(9)[1] and c.data(11)[1])
        assert sorted(f.stream_id for f in frames if isinstance(f, spdy.SynReply)) == \
            [1, 3, 5, 7, 9, 11]
        # The refused port: its error stream carries the text, both streams end.
        assert c.data(9) == (b"nothing listens on 81", True)
        assert c.data(11) == (b"", True)
        # The other connections go on: half-close one, it ends cleanly (data, then error FIN).
        await c.send(spdy.DataFrame(3, b" again", fin=True))
        await c.until(lambda fs: c.data(3)[1] and c.data(1)[1])
        assert c.data(3) == (b"HELLO AGAIN", True) and c.data(1) == (b"", True)
        await c.send(spdy.DataFrame(7, b"!"))
        await c.until(lambda fs: c.data(7)[0] == b"WORLD!")
        # A reset ends the connection and closes its pod side.
        await c.send(spdy.RstStream(7, spdy.RstStatus.CANCEL))
        with trio.fail_after(5):
            while not all(p.closed for p in dial.pods):
                await trio.sleep(0.01)
        assert [p.received for p in dial.pods] == [[b"hello", b" again"], [b"world", b"!"]]
        assert dial.pods[0].eof and not dial.pods[1].eof
        assert server.connections == 3 and not server.pairs.pairs
        await t.to_server_tx.send(None)  # the client goes away
    # The session says goodbye.
    rest = b""
    while True:
        try:
            rest += t.to_client_rx.receive_nowait()
        except trio.WouldBlock:
            break
    assert spdy.GoAway(11, spdy.GoAwayStatus.OK) in c.dec.feed(rest)


async def test_spdy_lone_stream_times_out_and_bad_headers_are_reset() -> None:
    t = MemoryTransport()
    server = pf.SpdyPortForward(t, FakeDialer(), stream_creation_timeout=0.2)
    c = Client(t)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await c.send(spdy.SynStream(1, _h(streamType="error", port="80", requestID="7")),
                     spdy.SynStream(3, _h(streamType="bogus", port="80", requestID="7")))
        await c.until(lambda fs: c.data(1)[1])
        assert c.data(1) == (b"(request=7) timed out waiting for streams", True)
        assert spdy.RstStream(3, spdy.RstStatus.CANCEL) in c.frames
        nursery.cancel_scope.cancel()


async def test_garbage_ends_the_session_with_goaway() -> None:
    t = MemoryTransport()
    c = Client(t)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pf.SpdyPortForward(t, FakeDialer()).run)
        await t.to_server_tx.send(b"\x80\x02\x00\x01" + bytes(4))
        await c.until(lambda fs: any(isinstance(f, spdy.GoAway) for f in fs))
    assert spdy.GoAway(0, spdy.GoAwayStatus.PROTOCOL_ERROR) in c.frames


class FakeWS:
    def __init__(self) -> None:
        self.in_tx, self.in_rx = trio.open_memory_channel[bytes | None](100)
        self.out: list[bytes | str] = []
        self.closed: tuple[int, str] | None = None

    async def receive(self) -> bytes | str | None:
        return await self.in_rx.receive()

    async def send(self, message: bytes | str) -> None:
        self.out.append(message)

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


async def test_channel_protocol() -> None:
    ws, dial = FakeWS(), FakeDialer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pf.serve_channels, ws, [80, 81, 8080], dial)
        with trio.fail_after(5):
            while len(dial.pods) < 2:
                await trio.sleep(0.01)
        await ws.in_tx.send(b"\x00abc")
        await ws.in_tx.send(b"\x04xyz")
        await ws.in_tx.send(b"\x01ignored")  # error channels are write-only
        with trio.fail_after(5):
            while b"\x00ABC" not in ws.out or b"\x04XYZ" not in ws.out:
                await trio.sleep(0.01)
        await ws.in_tx.send(None)  # the client closes: every port ends
    # Each channel opens with its port, little-endian; the refused port's error channel
    # carries the text, and the other ports kept working.
    assert ws.out[:6] == [b"\x00\x50\x00", b"\x01\x50\x00", b"\x02\x51\x00", b"\x03\x51\x00",
                          b"\x04\x90\x1f", b"\x05\x90\x1f"]
    assert b"\x03nothing listens on 81" in ws.out
    assert ws.closed == (1000, "") and all(p.closed for p in dial.pods)


# ------------------------------------------------- through the API app, in process
async def serve_pf_agent(nursery: trio.Nursery, seen: list[str]) -> int:
    """A fake agent: /portForward/... answers Success and echoes upper-cased, except for
    port 81, which it refuses with a Failure Status (the real agent's first message)."""
    import json

    import trio_websocket

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        seen.append(request.path)
        ws = await request.accept()
        if request.path.endswith("port=81"):
            await ws.send_message(json.dumps({"status": "Failure", "message": "refused 81"}))
            await ws.aclose()
            return
        await ws.send_message(json.dumps({"status": "Success"}))
        while True:
            try:
                msg = await ws.get_message()
            except trio_websocket.ConnectionClosed:
                return
            await ws.send_message(msg.upper())

    server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None)
    return server.port


async def test_channel_protocol_through_the_api(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fleet.server.asgi import create_app
    from fleet.testing.apiserver import open_api
    from tests.unit.server.test_proxy import ASGIClient, put_node, put_pod

    seen: list[str] = []
    async with open_api(tmp_path) as api, trio.open_nursery() as nursery:
        await put_node(api, await serve_pf_agent(nursery, seen))
        await put_pod(api, "p", "a", "b")  # two containers: port forwarding names none
        client = ASGIClient("/api/v1/namespaces/default/pods/p/portforward", b"ports=80,81")
        with trio.fail_after(10):
            async with trio.open_nursery() as inner:
                inner.start_soon(create_app(api.server), client.scope, client.receive, client.send)
                await client.accepted.wait()
                client.client_sends(b"\x00hi")
                while b"\x00HI" not in client.frames() or b"\x03refused 81" not in client.frames():
                    await trio.sleep(0.01)
                # The client leaves: every port's connection ends and the app returns.
                client.inbox_send.send_nowait({"type": "websocket.disconnect", "code": 1000})
        nursery.cancel_scope.cancel()
    assert client.sent[0] == {"type": "websocket.accept", "subprotocol": "v4.channel.k8s.io"}
    assert client.frames()[:4] == [b"\x00\x50\x00", b"\x01\x50\x00", b"\x02\x51\x00",
                                   b"\x03\x51\x00"]
    assert sorted(seen) == ["/portForward/default/p?port=80", "/portForward/default/p?port=81"]


@pytest.mark.parametrize("path,query,token,protocols,code,fragment", [
    ("p", b"ports=80", None, ("v4.channel.k8s.io",), 401, "Unauthorized"),
    ("nope", b"ports=80", "ok", ("v4.channel.k8s.io",), 404, 'pods "nope" not found'),
    ("p", b"", "ok", ("v4.channel.k8s.io",), 400, 'query parameter "ports" is required'),
    ("p", b"ports=0", "ok", ("v4.channel.k8s.io",), 400, 'port "0" must be > 0'),
    ("p", b"ports=80", "ok", ("v5.channel.k8s.io",), 400, "subprotocols are supported"),
])
async def test_websocket_bad_input_is_a_status(tmp_path, path: str, query: bytes,  # type: ignore[no-untyped-def]
                                               token: str | None, protocols: tuple[str, ...],
                                               code: int, fragment: str) -> None:
    from fleet.server.asgi import create_app
    from fleet.testing.apiserver import TOKEN, open_api
    from tests.unit.server.test_proxy import ASGIClient, put_node, put_pod

    async with open_api(tmp_path) as api:
        await put_node(api, 9301)
        await put_pod(api, "p", "a")
        client = ASGIClient(f"/api/v1/namespaces/default/pods/{path}/portforward", query,
                            token=TOKEN if token else None, subprotocols=protocols)
        with trio.fail_after(10):
            await create_app(api.server)(client.scope, client.receive, client.send)
    got, body = client.rejection()
    assert got == code and fragment in body["message"], body


async def test_plain_requests_need_an_upgrade(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fleet.testing.apiserver import open_api
    from tests.unit.server.test_proxy import put_node, put_pod

    async with open_api(tmp_path) as api:
        await put_node(api, 9301)
        await put_pod(api, "p", "a")
        got, body = await api.json("POST", "/api/v1/namespaces/default/pods/p/portforward")
        assert got == 400 and body["message"] == "Upgrade request required"
        got, body = await api.json("GET", "/api/v1/namespaces/default/pods/nope/portforward")
        assert got == 404


async def test_a_slow_pod_stops_the_session_reading() -> None:
    """Backpressure toward the client: when the pod takes nothing, the server buffers a
    bounded amount and then stops reading the client's bytes (TCP then pushes back)."""

    class StuckPod(FakePod):
        async def send(self, data: bytes) -> None:
            self.received.append(data)
            await trio.sleep_forever()

    class StuckDialer(FakeDialer):
        def __call__(self, port: int) -> AbstractAsyncContextManager[FakePod]:
            @asynccontextmanager
            async def cm() -> AsyncIterator[FakePod]:
                pod = StuckPod(port)
                self.pods.append(pod)
                yield pod
            return cm()

    t = MemoryTransport()
    t.to_server_tx, t.to_server_rx = trio.open_memory_channel[bytes | None](0)  # unbuffered
    dial = StuckDialer()
    c = Client(t)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pf.SpdyPortForward(t, dial).run)
        await c.open(1, 80, "0")
        await c.until(lambda fs: sum(isinstance(f, spdy.SynReply) for f in fs) == 2)
        sent = 0
        with trio.move_on_after(1):
            while True:
                await c.send(spdy.DataFrame(3, b"x" * 1000))
                sent += 1
        # The pod holds one chunk, the connection's buffer INBOUND_CHUNKS, the session
        # loop one more: then nothing more is read.
        assert pf.INBOUND_CHUNKS <= sent <= pf.INBOUND_CHUNKS + 3, sent
        assert len(dial.pods[0].received) == 1
        nursery.cancel_scope.cancel()


async def test_a_flow_controlling_client_gets_windows_honoured_and_updates() -> None:
    t, dial = MemoryTransport(), FakeDialer()
    c = Client(t)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pf.SpdyPortForward(t, dial).run)
        await c.send(spdy.Settings(((spdy.SETTINGS_INITIAL_WINDOW_SIZE, spdy.DEFAULT_WINDOW, 0),)))
        await c.open(1, 80, "0")
        await c.send(spdy.DataFrame(3, b"x" * 100_000))  # echoed back, upper-cased
        # The server returns the consumed bytes to our windows...
        await c.until(lambda fs: any(isinstance(f, spdy.WindowUpdate) and f.stream_id == 3
                                     for f in fs))
        # ...and sends no more than our 64 KiB window until we open it.
        await c.until(lambda fs: len(c.data(3)[0]) >= spdy.DEFAULT_WINDOW)
        await trio.sleep(0.2)
        assert len(c.data(3)[0]) == spdy.DEFAULT_WINDOW
        await c.send(spdy.WindowUpdate(0, 50_000), spdy.WindowUpdate(3, 50_000))
        await c.until(lambda fs: len(c.data(3)[0]) == 100_000)
        assert c.data(3)[0] == b"X" * 100_000
        nursery.cancel_scope.cancel()
