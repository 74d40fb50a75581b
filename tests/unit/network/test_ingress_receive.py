"""The built-in ingress proxy's hot-path socket read (ingress_exchange.receive): direct
reads, waiting first, and EOF, on a real socket pair."""

from __future__ import annotations

import pytest
import trio

from fleet.network.ingress_exchange import receive


@pytest.mark.parametrize("wait_first", [False, True])
def test_receive_reads_what_is_there_and_waits_for_what_is_not(wait_first: bool) -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        ours, peer = trio.SocketStream(a), trio.SocketStream(b)
        async with ours, peer:
            await peer.send_all(b"ready")
            assert await receive(ours, wait_first=wait_first) == b"ready"  # there already
            got: list[bytes] = []
            async with trio.open_nursery() as nursery:
                async def reader() -> None:
                    got.append(await receive(ours, wait_first=wait_first))
                nursery.start_soon(reader)
                await trio.sleep(0.05)
                assert got == []  # nothing yet: it waits
                await peer.send_all(b"later")
            assert got == [b"later"]
            await peer.aclose()
            with trio.fail_after(5):
                assert await receive(ours, wait_first=wait_first) == b""  # EOF
    trio.run(main)
