"""Message-body framing shared by the ingress proxy's two HTTP/1.1 codecs.

The client side (`ingress_h1server.H1Server`, requests) and the backend side
(`ingress_upstream.H1Client`, responses) both buffer received bytes, track end of
input, hand out Content-Length bodies and decode chunked ones.  `BodyFramer` does
that once; each codec keeps what really differs:

- its error type (`error`: a 400-class ProtocolError towards clients, an
  UpstreamError — a 502 — towards backends);
- how strictly a chunk-size line is read (`_chunk_size`): clients get RFC 9112's
  grammar exactly, backends the tolerant reading proxies give them;
- what happens to trailer fields (`_trailer`): validated and dropped for clients,
  skipped for backends.

Sans-I/O: `receive_data(b"")` marks EOF; the body methods return bytes, END or
NEED_DATA and raise `error` on malformed input or input that ended early.
"""

from __future__ import annotations


class Marker:
    """A sentinel event, compared with `is`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = Marker("NEED_DATA")  # read more and call receive_data
END = Marker("END")  # the message (its body) ended
MAX_CHUNK_LINE = 4096


class BodyFramer:
    """Receive buffer, EOF and body framing; see the module docstring."""

    error: type[Exception] = ValueError
    eof_message = "peer closed connection without sending complete message body"

    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False
        self.left = 0  # body bytes left (length framing) or in this chunk
        self.chunk_state = "size"  # size → data → crlf → size …; trailer after the 0 chunk

    def receive_data(self, data: bytes) -> None:
        if data:
            self.buf += data
        else:
            self.eof = True

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        """Bytes received and not yet parsed (after a 101: the new protocol's first bytes)."""
        return bytes(self.buf), self.eof

    def _reset_body(self) -> None:
        self.left = 0
        self.chunk_state = "size"

    def _body_done(self) -> None:
        """The body ended: the codec's state moves on (`done`)."""
        raise NotImplementedError

    def _length_body(self) -> object:
        if self.left == 0:
            self._body_done()
            return END
        buf = self.buf
        if buf:
            n = min(self.left, len(buf))
            data = bytes(buf[:n])
            del buf[:n]
            self.left -= n
            return data
        if self.eof:
            raise self.error(self.eof_message)
        return NEED_DATA

    def _chunk_size(self, idx: int) -> int:
        """The size on the chunk line `buf[:idx]` (its CRLF not included)."""
        raise NotImplementedError

    def _trailer(self) -> object:
        """After the last chunk: consume the trailer section → END, or NEED_DATA."""
        raise NotImplementedError

    def _chunked_body(self) -> object:
        buf = self.buf
        while True:
            state = self.chunk_state
            if state == "data":
                if not buf:
                    break
                n = min(self.left, len(buf))
                data = bytes(buf[:n])
                del buf[:n]
                self.left -= n
                if self.left == 0:
                    self.chunk_state = "crlf"
                return data
            if state == "crlf":
                if len(buf) < 2:
                    if buf[:1] not in (b"", b"\r"):
                        raise self.error("malformed chunk footer")
                    break
                if buf[:2] != b"\r\n":
                    raise self.error("malformed chunk footer")
                del buf[:2]
                self.chunk_state = "size"
                continue
            if state == "trailer":
                return self._trailer()
            idx = buf.find(b"\r\n")
            if idx < 0:
                if len(buf) > MAX_CHUNK_LINE:
                    raise self.error("chunk line too long")
                break
            if idx > MAX_CHUNK_LINE:
                raise self.error("chunk line too long")
            self.left = self._chunk_size(idx)
            del buf[: idx + 2]
            self.chunk_state = "trailer" if self.left == 0 else "data"
        if self.eof:
            raise self.error(self.eof_message + " (incomplete chunked read)")
        return NEED_DATA


__all__ = ["END", "MAX_CHUNK_LINE", "NEED_DATA", "BodyFramer", "Marker"]
