"""A trivial HTTP/1.1 server on plain asyncio: `python -m bench.stub_server PORT DURATION [CERT KEY]`.

Answers every request with `200 ok` on a keep-alive connection and does nothing else, so
hammering it with `bench.loadgen` measures what the load generator alone can push (the
client ceiling), independent of Fleet.  With CERT and KEY it serves TLS, as Fleet does.  It exits by itself
after DURATION seconds.
"""

from __future__ import annotations

import asyncio
import ssl
import sys

RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


class Stub(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        # Requests from the load generator are GETs without a body: one per blank line.
        self.buf += data
        n = self.buf.count(b"\r\n\r\n")
        if n:
            self.buf = self.buf[self.buf.rfind(b"\r\n\r\n") + 4 :]
            self.transport.write(RESPONSE * n)


async def main(port: int, duration: float, cert: str | None = None, key: str | None = None) -> None:
    loop = asyncio.get_running_loop()
    ctx = None
    if cert and key:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
    server = await loop.create_server(Stub, "127.0.0.1", port, backlog=1024, ssl=ctx)
    print("READY", flush=True)
    async with server:
        await asyncio.sleep(duration)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:5]))
