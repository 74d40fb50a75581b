"""HTTP/1.1 request parsing for the built-in ingress proxy's client connections.

`H1Server` replaces h11 on the client side of fleet.network.ingress_proxy: h11's
per-event state machine, event objects and per-line parsing were the largest share of
the proxy's CPU per request.  This codec reads a whole request head in one pass (one
search for the blank line, one regex for the request line, one for the header block)
and frames request bodies (Content-Length or chunked).  Responses are framed by
ingress_exchange.Downstream, so nothing here writes.

It is at least as strict as h11 (tests/unit/network/test_ingress_h1server.py compares
the two on generated and mutated heads), and stricter where RFC 9112 allows a server to
refuse what h11 tolerates:

- request line `token SP 1*VCHAR SP HTTP/d.d`; header fields `token ":" OWS value OWS`
  with no whitespace before the colon, no NUL, bare CR or other whitespace controls in
  values; lines end in CRLF or a bare LF (RFC 9112 §2.2 lets a recipient accept one);
  a leading empty line, like any line starting below 0x21, is refused (as h11 does);
- obs-fold (a line starting with SP/HTAB) is refused with 400 — h11 unfolds it; RFC
  9112 §5.2 lets a server do either;
- HTTP/1.1 without Host, or more than one Host: 400 (RFC 9112 §3.2);
- request smuggling: Content-Length together with Transfer-Encoding → 400 (RFC 9112
  §6.1 allows it; h11 lets Transfer-Encoding win and keeps both), several differing
  Content-Lengths (in one field or several) → 400, a Content-Length that is not 1-20
  digits → 400, a Transfer-Encoding other than exactly `chunked`, or two of them → 501;
- a head over `max_head` bytes → 431 (complete or not);
- chunked bodies: `1*20HEXDIG [;ext] OWS CRLF` chunk lines (at most 4 KiB), CRLF after
  each chunk's data, trailer fields validated like headers and dropped.

Connection reuse follows h11: HTTP/1.0 or `Connection: close` ends it after the
response, and so does a request proposing a protocol switch (CONNECT, or an Upgrade
header) that the backend did not accept (h11's MIGHT_SWITCH_PROTOCOL).  Pipelined
bytes stay buffered for the next cycle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleet.network.http1_body import END, NEED_DATA, BodyFramer, Marker

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_VALUE = rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?"
REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/([0-9]\.[0-9])")
#: A block of header lines, each ending in CRLF (validated whole, then split by _FIELD).
HEADER_BLOCK = re.compile(rb"(?:" + _TOKEN + rb":[ \t]*" + _VALUE + rb"[ \t]*\r\n)*")
_FIELD = re.compile(rb"(" + _TOKEN + rb"):[ \t]*(" + _VALUE + rb")[ \t]*\r\n")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*")


class ProtocolError(Exception):
    """The client broke HTTP/1.1: answer `status` (400, 431 or 501) and close."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


CLOSED = Marker("CLOSED")  # the client closed between requests


@dataclass(slots=True)
class Request:
    """A request head.  Header names are lower case (as h11 gives them); a repeated
    equal Content-Length is kept once, with its single value."""

    method: bytes
    target: bytes
    http_version: bytes  # b"1.1", b"1.0", …
    headers: list[tuple[bytes, bytes]]
    chunked: bool  # the body is chunked
    length: int  # the body's Content-Length (0 when chunked or absent)
    size: int  # bytes of the head as received
    switch: bool  # CONNECT or an Upgrade header: a protocol switch is proposed

    @property
    def has_body(self) -> bool:
        return self.chunked or self.length > 0


def parse_head(head: bytes) -> Request:
    """One complete head (through its blank line) → Request, or ProtocolError."""
    if head[:1] in (b"\r", b"\n"):
        raise ProtocolError("no request line received")
    if head.count(b"\n") == head.count(b"\r\n"):  # CRLF only: the usual case, no copies
        first = head.find(b"\r\n")
        line, block = head[:first], head[first + 2: -2]
    else:  # some bare LFs: normalise each line's end to CRLF (h11 drops one CR per line)
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in head.split(b"\n")[:-2]]
        line = lines[0]
        block = b"".join([ln + b"\r\n" for ln in lines[1:]])
    m = REQUEST_LINE.fullmatch(line)
    if m is None:
        raise ProtocolError(f"illegal request line: {line[:100]!r}")
    method, target, version = m.groups()
    if block and block[0] in b" \t":
        raise ProtocolError("continuation line at start of headers")
    if HEADER_BLOCK.fullmatch(block) is None:
        if re.search(rb"\n[ \t]", block):
            raise ProtocolError("obsolete line folding (obs-fold) in the headers")
        raise ProtocolError("illegal header line")
    headers: list[tuple[bytes, bytes]] = []
    hosts = 0
    length: bytes | None = None
    chunked = False
    switch = method == b"CONNECT"
    for name, value in _FIELD.findall(block):
        name = name.lower()
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            lengths = {v.strip() for v in value.split(b",")}
            if len(lengths) != 1:
                raise ProtocolError("conflicting Content-Length headers")
            value = lengths.pop()
            if not (value.isdigit() and value.isascii() and len(value) <= 20):
                raise ProtocolError("bad Content-Length")
            if length is not None:
                if value != length:
                    raise ProtocolError("conflicting Content-Length headers")
                continue  # the same length again: kept once
            length = value
        elif name == b"transfer-encoding":
            if chunked:
                raise ProtocolError("multiple Transfer-Encoding headers", 501)
            value = value.lower()
            if value != b"chunked":
                raise ProtocolError("only Transfer-Encoding: chunked is supported", 501)
            chunked = True
        elif name == b"upgrade" and not switch:
            switch = any(t.strip() for t in value.split(b","))
        headers.append((name, value))
    if hosts == 0 and version == b"1.1":
        raise ProtocolError("missing mandatory Host header")
    if hosts > 1:
        raise ProtocolError("found multiple Host headers")
    if chunked and length is not None:
        raise ProtocolError("both Content-Length and Transfer-Encoding (a smuggling attempt?)")
    return Request(method, target, version, headers, chunked,
                   int(length) if length is not None and not chunked else 0, len(head), switch)


class H1Server(BodyFramer):
    """The client side of one connection: `receive_data` (b"" for EOF), then
    `next_event` → Request, body bytes, END, CLOSED or NEED_DATA; ProtocolError on
    malformed input.  `start_next_cycle` after a finished exchange keeps pipelined bytes."""

    error = ProtocolError

    def __init__(self, max_head: int) -> None:
        super().__init__()
        self.max_head = max_head
        self._search_from = 0  # where the blank-line search resumes in an incomplete head
        self.start_next_cycle()

    def start_next_cycle(self) -> None:
        self.state = "idle"  # idle → body → done
        self.chunked = False
        self._reset_body()

    def next_event(self) -> object:
        if self.state == "idle":
            return self._head()
        if self.state == "body":
            return self._chunked_body() if self.chunked else self._length_body()
        raise RuntimeError("next_event after the request ended (start_next_cycle first)")

    def _body_done(self) -> None:
        self.state = "done"

    def _head(self) -> object:
        buf = self.buf
        if not buf:
            if self.eof:
                return CLOSED
            return NEED_DATA
        if buf[0] < 0x21:
            raise ProtocolError("illegal request line")
        m = _BLANK_LINE.search(buf, self._search_from)
        if m is None:
            self._search_from = max(0, len(buf) - 2)
            if len(buf) > self.max_head:
                raise ProtocolError("request head too large", 431)
            if self.eof:
                raise ProtocolError("peer unexpectedly closed connection")
            return NEED_DATA
        end = m.end()
        self._search_from = 0
        if end > self.max_head:
            raise ProtocolError("request head too large", 431)
        head = bytes(buf[:end])
        del buf[:end]
        req = parse_head(head)
        if req.chunked:
            self.state, self.chunked = "body", True
        elif req.length:
            self.state, self.left = "body", req.length
        else:
            self.state = "done"
        return req

    def _chunk_size(self, idx: int) -> int:
        m = _CHUNK_LINE.fullmatch(self.buf, 0, idx)
        if m is None:
            raise ProtocolError(f"illegal chunk header: {bytes(self.buf[:min(idx, 40)])!r}")
        return int(m.group(1), 16)

    def _trailer(self) -> object:
        """Trailer fields after the last chunk: validated like headers, then dropped."""
        buf = self.buf
        for empty in (b"\r\n", b"\n"):
            if buf.startswith(empty):
                del buf[: len(empty)]
                self.state = "done"
                return END
        m = _BLANK_LINE.search(buf)
        if m is None:
            if len(buf) > self.max_head:
                raise ProtocolError("trailer too large", 431)
            if self.eof:
                raise ProtocolError("peer closed connection in the trailer")
            return NEED_DATA
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in bytes(buf[: m.end()]).split(b"\n")[:-2]]
        del buf[: m.end()]
        block = b"".join([ln + b"\r\n" for ln in lines])
        if block[:1] in (b" ", b"\t") or HEADER_BLOCK.fullmatch(block) is None:
            raise ProtocolError("illegal trailer field")
        self.state = "done"
        return END
