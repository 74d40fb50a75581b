"""The agent's side of port forwarding (fleet/agent/portforward.py) on the node's own
loopback — a pod without a network namespace of its own, as with hostNetwork — so no
root is needed; the netns case runs in tests/e2e/test_port_forward.py."""

from __future__ import annotations

import json
import socket

import pytest
import trio

from fleet.agent import portforward as apf
from fleet.api.errors import BadRequest, NotFound

HOST = apf.PodSandboxRef("sandbox-1", None)


def _refused_port() -> int:
    with socket.socket() as s:  # bound, never listening: connecting is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_refused_gives_containerds_text() -> None:
    port = _refused_port()
    with pytest.raises(apf.ConnectError) as info:
        apf.connect_in_pod(HOST, port)
    text = str(info.value)
    assert text.startswith(f"error forwarding port {port} to pod sandbox-1, uid : failed to "
                           'execute portforward in network namespace "host": failed to connect '
                           f'to localhost:{port} inside namespace "sandbox-1", IPv4: dial tcp4 '
                           f"127.0.0.1:{port}: connect: connection refused IPv6 ")


def test_missing_netns_is_reported() -> None:
    with pytest.raises(apf.ConnectError, match='network namespace "/nonexistent/ns": '):
        apf.connect_in_pod(apf.PodSandboxRef("s", "/nonexistent/ns"), 80)


class FakeWS:
    def __init__(self) -> None:
        self.accepted = False
        self.sent: list[bytes | str] = []
        self.in_tx, self.in_rx = trio.open_memory_channel[bytes | None](10)

    async def accept(self) -> None:
        self.accepted = True

    async def receive(self) -> bytes | None:
        return await self.in_rx.receive()

    async def send(self, message: bytes | str) -> None:
        self.sent.append(message)


async def test_relay_refused_sends_failure_status() -> None:
    ws = FakeWS()
    await apf.relay(HOST, _refused_port(), accept=ws.accept, receive=ws.receive, send=ws.send)
    assert ws.accepted and len(ws.sent) == 1
    status = json.loads(ws.sent[0])
    assert status["status"] == "Failure" and "connection refused" in status["message"]


async def test_relay_copies_both_ways_with_half_close() -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    got: list[bytes] = []

    async def server() -> None:
        conn, _ = await listener.accept()
        with conn:
            while data := await conn.recv(65536):  # until the client's half-close
                got.append(data)
            await trio.SocketStream(conn).send_all(b"reply:" + b"".join(got))
        # closing ends the pod's side: the agent sends an empty message

    ws = FakeWS()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        nursery.start_soon(lambda: apf.relay(HOST, port, accept=ws.accept, receive=ws.receive,
                                             send=ws.send))
        with trio.fail_after(5):
            while not ws.sent:
                await trio.sleep(0.01)
        assert json.loads(ws.sent[0])["status"] == "Success"
        await ws.in_tx.send(b"abc")
        await ws.in_tx.send(b"def")
        await ws.in_tx.send(None)  # half-close (Quart hands an empty message over as None)
        with trio.fail_after(5):
            while ws.sent[-1] != b"":
                await trio.sleep(0.01)
    listener.close()
    assert b"".join(got) == b"abcdef"
    assert b"".join(m for m in ws.sent[1:] if isinstance(m, bytes)) == b"reply:abcdef"


class Args(dict):  # Quart's websocket.args is a MultiDict; .get is all serve() uses
    pass


class Route:
    def __init__(self, port: str) -> None:
        self.args = Args(port=port)


async def test_serve_refuses_bad_input_before_the_upgrade() -> None:
    with pytest.raises(BadRequest, match='unable to parse "x" as a port'):
        await apf.serve(lambda ns, pod: HOST, "ns", "p", Route("x"))
    with pytest.raises(BadRequest):
        await apf.serve(lambda ns, pod: HOST, "ns", "p", Route("70000"))
    with pytest.raises(NotFound, match=r'pod not found \("p_ns"\)'):
        await apf.serve(lambda ns, pod: None, "ns", "p", Route("80"))
    with pytest.raises(NotFound):
        await apf.serve(None, "ns", "p", Route("80"))


def test_pod_sync_says_where_a_pods_ports_are() -> None:
    from types import SimpleNamespace

    from fleet.agent.sync import PodSync

    def sync_with(driver: object, sandbox: object, netns: str | None) -> PodSync:
        s = PodSync("node", SimpleNamespace(driver=driver))  # type: ignore[arg-type]
        s.workers["uid"] = SimpleNamespace(namespace="ns", name="p", sandbox=sandbox,  # type: ignore[assignment]
                                           netns_path=netns)
        return s

    oci, process = SimpleNamespace(), SimpleNamespace(joins_pod_netns=False)
    sb = SimpleNamespace(id="sb1")
    assert sync_with(oci, sb, "/run/x").pod_sandbox("ns", "p") == apf.PodSandboxRef("sb1", "/run/x")
    assert sync_with(oci, sb, None).pod_sandbox("ns", "p") == apf.PodSandboxRef("sb1", None)
    # The process driver's containers share the node's network: loopback, not the netns.
    assert sync_with(process, sb, "/run/x").pod_sandbox("ns", "p") == apf.PodSandboxRef("sb1", None)
    assert sync_with(oci, None, "/run/x").pod_sandbox("ns", "p") is None   # no sandbox yet
    assert sync_with(oci, sb, "/run/x").pod_sandbox("ns", "other") is None
