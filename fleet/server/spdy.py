"""SPDY/3.1 framing and the server's side of a session, without I/O.

kubectl port-forward speaks SPDY/3.1 (draft-mbelshe-httpbis-spdy-00 plus the 3.1
session window): over a plain `Upgrade: SPDY/3.1` connection, or — kubectl's
default since 1.31 (KEP-4006) — tunnelled byte for byte inside WebSocket binary
messages.  Both transports feed the same bytes into `ServerSession`, which turns
them into events and queues what to answer; the port-forward layer above
(`fleet.server.portforward`) owns the I/O.

Frames (all big-endian):

    control: |1| version(15) | type(16) |  flags(8) | length(24) |  payload
    data:    |0| stream id(31)          |  flags(8) | length(24) |  payload

SYN_STREAM, SYN_REPLY and HEADERS carry a name/value header block compressed with
zlib: one compression context per direction for the whole session, primed with
SPDY/3's dictionary and sync-flushed after every block, so each frame's bytes
inflate to exactly its block.

Flow control: the peer that matters here (moby/spdystream, inside kubectl and
the kubelet) never sends WINDOW_UPDATE and ignores ours.  So windows are kept as
SPDY/3.1 says, WINDOW_UPDATEs are sent for data the application has consumed, and
our send windows are honoured once the peer has shown it does flow control (it
sent a WINDOW_UPDATE or an initial window SETTING); a peer that never does gets
TCP backpressure only, as every Kubernetes port-forward has.  Receive windows are
not enforced, for the same peer's sake.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum

VERSION = 3

SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_SETTINGS_CLEAR = 0x01

SETTINGS_INITIAL_WINDOW_SIZE = 7

MAX_LENGTH = (1 << 24) - 1
DEFAULT_WINDOW = 64 * 1024
MAX_WINDOW = (1 << 31) - 1
# Inbound bounds: a header block inflates to at most this, a control frame is at most
# this long (ours are tiny; the peer's hold a handful of headers).
MAX_HEADER_BLOCK = 256 * 1024
MAX_CONTROL_LENGTH = 64 * 1024
# Outbound DATA frames are cut to this (client-go writes 32 KiB chunks too).
MAX_DATA_CHUNK = 32 * 1024


class RstStatus(IntEnum):
    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    INVALID_CREDENTIALS = 10
    FRAME_TOO_LARGE = 11


class GoAwayStatus(IntEnum):
    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


def _dictionary() -> bytes:
    """SPDY/3's zlib dictionary (spec section 2.6.10.1): length-prefixed header names
    and values, then a run of common status lines, dates and media types."""
    words = (
        "options head post put delete trace accept accept-charset accept-encoding "
        "accept-language accept-ranges age allow authorization cache-control connection "
        "content-base content-encoding content-language content-length content-location "
        "content-md5 content-range content-type date etag expect expires from host "
        "if-match if-modified-since if-none-match if-range if-unmodified-since "
        "last-modified location max-forwards pragma proxy-authenticate "
        "proxy-authorization range referer retry-after server te trailer "
        "transfer-encoding upgrade user-agent vary via warning www-authenticate method "
        "get status").split()
    words += ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive",
              "origin"]
    tail = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416"
        "417502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server "
        "Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug "
        "Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,"
        "image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
        "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-"
        "8859-1,utf-,*,enq=0.")
    out = b"".join(struct.pack(">I", len(w)) + w.encode() for w in words)
    return out + tail.encode()


DICTIONARY = _dictionary()


class ProtocolError(Exception):
    """The peer broke the protocol at the session level (answered with GOAWAY)."""


# ------------------------------------------------------------------- frames
Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DataFrame:
    stream_id: int
    data: bytes = b""
    fin: bool = False


@dataclass(frozen=True)
class SynStream:
    stream_id: int
    headers: Headers = ()
    associated_to: int = 0
    priority: int = 0
    slot: int = 0
    fin: bool = False
    unidirectional: bool = False


@dataclass(frozen=True)
class SynReply:
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True)
class Settings:
    # (id, value, flags) entries.
    entries: tuple[tuple[int, int, int], ...] = ()
    clear: bool = False


@dataclass(frozen=True)
class Ping:
    ping_id: int


@dataclass(frozen=True)
class GoAway:
    last_good_stream_id: int
    status: int = GoAwayStatus.OK


@dataclass(frozen=True)
class HeadersFrame:
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True)
class WindowUpdate:
    stream_id: int
    delta: int


Frame = (DataFrame | SynStream | SynReply | RstStream | Settings | Ping | GoAway
         | HeadersFrame | WindowUpdate)


def encode_header_block(headers: Headers) -> bytes:
    """The uncompressed name/value block: count, then length-prefixed names and values."""
    parts = [struct.pack(">I", len(headers))]
    for name, value in headers:
        n, v = name.lower().encode(), value.encode()
        parts += [struct.pack(">I", len(n)), n, struct.pack(">I", len(v)), v]
    return b"".join(parts)


def decode_header_block(block: bytes) -> Headers:
    """Parse an inflated block; names must be lowercase, non-empty and unique."""
    try:
        (count,), pos = struct.unpack_from(">I", block, 0), 4
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        for _ in range(count):
            (n,) = struct.unpack_from(">I", block, pos)
            name = block[pos + 4:pos + 4 + n]
            pos += 4 + n
            (vlen,) = struct.unpack_from(">I", block, pos)
            value = block[pos + 4:pos + 4 + vlen]
            pos += 4 + vlen
            if len(name) != n or len(value) != vlen:
                raise ProtocolError("header block truncated")
            text = name.decode("utf-8")
            if not text or text != text.lower():
                raise ProtocolError(f"invalid header name {text!r}")
            if text in seen:
                raise ProtocolError(f"duplicate header {text!r}")
            seen.add(text)
            out.append((text, value.decode("utf-8", "replace")))
    except struct.error:
        raise ProtocolError("header block truncated") from None
    except UnicodeDecodeError:
        raise ProtocolError("header name is not UTF-8") from None
    if pos != len(block):
        raise ProtocolError("trailing bytes after the header block")
    return tuple(out)


def header_value(headers: Headers, name: str) -> str | None:
    """The first value of `name` (values joined by NUL in SPDY are split)."""
    for n, v in headers:
        if n == name:
            return v.split("\x00", 1)[0]
    return None


class FrameEncoder:
    """Frames to bytes; owns the outbound header compression context."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(zlib.Z_BEST_COMPRESSION, zlib.DEFLATED, 15, 8,
                                   zlib.Z_DEFAULT_STRATEGY, DICTIONARY)

    def _headers(self, headers: Headers) -> bytes:
        block = encode_header_block(headers)
        return self._z.compress(block) + self._z.flush(zlib.Z_SYNC_FLUSH)

    @staticmethod
    def _control(ftype: int, flags: int, payload: bytes) -> bytes:
        if len(payload) > MAX_LENGTH:
            raise ValueError("control frame too long")
        return struct.pack(">HHI", 0x8000 | VERSION, ftype, (flags << 24) | len(payload)) + payload

    def encode(self, frame: Frame) -> bytes:
        if isinstance(frame, DataFrame):
            if len(frame.data) > MAX_LENGTH:
                raise ValueError("data frame too long")
            flags = FLAG_FIN if frame.fin else 0
            return struct.pack(">II", frame.stream_id & 0x7FFFFFFF,
                               (flags << 24) | len(frame.data)) + frame.data
        if isinstance(frame, SynStream):
            flags = (FLAG_FIN if frame.fin else 0) | (FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
            payload = struct.pack(">IIBB", frame.stream_id, frame.associated_to,
                                  (frame.priority & 7) << 5, frame.slot)
            return self._control(SYN_STREAM, flags, payload + self._headers(frame.headers))
        if isinstance(frame, SynReply):
            payload = struct.pack(">I", frame.stream_id) + self._headers(frame.headers)
            return self._control(SYN_REPLY, FLAG_FIN if frame.fin else 0, payload)
        if isinstance(frame, HeadersFrame):
            payload = struct.pack(">I", frame.stream_id) + self._headers(frame.headers)
            return self._control(HEADERS, FLAG_FIN if frame.fin else 0, payload)
        if isinstance(frame, RstStream):
            return self._control(RST_STREAM, 0, struct.pack(">II", frame.stream_id, frame.status))
        if isinstance(frame, Settings):
            payload = struct.pack(">I", len(frame.entries)) + b"".join(
                struct.pack(">II", (flags << 24) | sid, value) for sid, value, flags in frame.entries)
            return self._control(SETTINGS, FLAG_SETTINGS_CLEAR if frame.clear else 0, payload)
        if isinstance(frame, Ping):
            return self._control(PING, 0, struct.pack(">I", frame.ping_id))
        if isinstance(frame, GoAway):
            return self._control(GOAWAY, 0, struct.pack(">II", frame.last_good_stream_id,
                                                         frame.status))
        if isinstance(frame, WindowUpdate):
            return self._control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id, frame.delta))
        raise TypeError(f"not a SPDY frame: {frame!r}")


class FrameDecoder:
    """Bytes to frames, however the bytes are split; owns the inbound header context."""

    def __init__(self, *, max_data_length: int = MAX_LENGTH) -> None:
        self._buf = bytearray()
        self._z = zlib.decompressobj(zdict=DICTIONARY)
        self._max_data = max_data_length

    def _headers(self, compressed: bytes) -> Headers:
        try:
            block = self._z.decompress(compressed, MAX_HEADER_BLOCK)
        except zlib.error as e:
            raise ProtocolError(f"header block does not inflate: {e}") from None
        if self._z.unconsumed_tail:
            raise ProtocolError("header block too large")
        return decode_header_block(block)

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= 8:
            first, second = struct.unpack_from(">II", self._buf, 0)
            flags, length = second >> 24, second & 0xFFFFFF
            control = bool(first & 0x80000000)
            if control and length > MAX_CONTROL_LENGTH:
                raise ProtocolError(f"control frame of {length} bytes")
            if not control and length > self._max_data:
                raise ProtocolError(f"data frame of {length} bytes")
            if len(self._buf) < 8 + length:
                break
            payload = bytes(self._buf[8:8 + length])
            del self._buf[:8 + length]
            if not control:
                frames.append(DataFrame(first & 0x7FFFFFFF, payload, bool(flags & FLAG_FIN)))
                continue
            version, ftype = (first >> 16) & 0x7FFF, first & 0xFFFF
            if version != VERSION:
                raise ProtocolError(f"unsupported SPDY version {version}")
            frame = self._control(ftype, flags, payload)
            if frame is not None:
                frames.append(frame)
        return frames

    def _control(self, ftype: int, flags: int, p: bytes) -> Frame | None:
        def need(n: int) -> None:
            if len(p) < n:
                raise ProtocolError(f"control frame type {ftype} too short ({len(p)} bytes)")

        if ftype == SYN_STREAM:
            need(10)
            sid, assoc, pri, slot = struct.unpack_from(">IIBB", p, 0)
            return SynStream(sid & 0x7FFFFFFF, self._headers(p[10:]), assoc & 0x7FFFFFFF, pri >> 5,
                             slot, bool(flags & FLAG_FIN), bool(flags & FLAG_UNIDIRECTIONAL))
        if ftype in (SYN_REPLY, HEADERS):
            need(4)
            (sid,) = struct.unpack_from(">I", p, 0)
            cls = SynReply if ftype == SYN_REPLY else HeadersFrame
            return cls(sid & 0x7FFFFFFF, self._headers(p[4:]), bool(flags & FLAG_FIN))
        if ftype == RST_STREAM:
            need(8)
            sid, status = struct.unpack_from(">II", p, 0)
            return RstStream(sid & 0x7FFFFFFF, status)
        if ftype == SETTINGS:
            need(4)
            (count,) = struct.unpack_from(">I", p, 0)
            if len(p) != 4 + 8 * count:
                raise ProtocolError("SETTINGS length does not match its entry count")
            entries = []
            for i in range(count):
                word, value = struct.unpack_from(">II", p, 4 + 8 * i)
                entries.append((word & 0xFFFFFF, value, word >> 24))
            return Settings(tuple(entries), bool(flags & FLAG_SETTINGS_CLEAR))
        if ftype == PING:
            need(4)
            return Ping(struct.unpack_from(">I", p, 0)[0])
        if ftype == GOAWAY:
            need(8)
            last, status = struct.unpack_from(">II", p, 0)
            return GoAway(last & 0x7FFFFFFF, status)
        if ftype == WINDOW_UPDATE:
            need(8)
            sid, delta = struct.unpack_from(">II", p, 0)
            return WindowUpdate(sid & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        return None  # unknown control frames are ignored (spec section 2.2.1)


# ------------------------------------------------------------------- session
@dataclass(frozen=True)
class StreamOpened:
    stream_id: int
    headers: Headers
    fin: bool


@dataclass(frozen=True)
class DataReceived:
    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True)
class StreamReset:
    stream_id: int
    status: int


@dataclass(frozen=True)
class GoAwayReceived:
    last_good_stream_id: int
    status: int


@dataclass(frozen=True)
class WindowOpened:
    """Our send window grew (stream 0: the session's)."""

    stream_id: int


Event = StreamOpened | DataReceived | StreamReset | GoAwayReceived | WindowOpened


@dataclass
class _Stream:
    send_window: int
    remote_closed: bool = False
    local_closed: bool = False
    unacked: int = 0  # received bytes consumed but not yet returned by WINDOW_UPDATE


@dataclass
class ServerSession:
    """The server's side of one SPDY/3.1 session (client streams are odd)."""

    _enc: FrameEncoder = field(default_factory=FrameEncoder)
    _dec: FrameDecoder = field(default_factory=FrameDecoder)
    _out: bytearray = field(default_factory=bytearray)
    _streams: dict[int, _Stream] = field(default_factory=dict)
    _last_client_id: int = 0
    _initial_window: int = DEFAULT_WINDOW
    session_send_window: int = DEFAULT_WINDOW
    _session_unacked: int = 0
    # Whether the peer does flow control (see the module docstring).
    peer_flow_control: bool = False
    closed: bool = False

    # -- input ----------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the peer; returns what happened.  Raises ProtocolError after
        queueing a GOAWAY for a broken session."""
        if self.closed:
            return []
        try:
            frames = self._dec.feed(data)
        except ProtocolError:
            self.goaway(GoAwayStatus.PROTOCOL_ERROR)
            raise
        events: list[Event] = []
        for f in frames:
            events.extend(self._handle(f))
        return events

    def _handle(self, f: Frame) -> list[Event]:
        if isinstance(f, SynStream):
            sid = f.stream_id
            if sid % 2 == 0 or sid <= self._last_client_id:
                self._emit(RstStream(sid, RstStatus.PROTOCOL_ERROR))
                return []
            self._last_client_id = sid
            self._streams[sid] = _Stream(self._initial_window, remote_closed=f.fin or f.unidirectional)
            return [StreamOpened(sid, f.headers, f.fin)]
        if isinstance(f, DataFrame):
            st = self._streams.get(f.stream_id)
            if st is None:
                self._emit(RstStream(f.stream_id, RstStatus.INVALID_STREAM))
                return []
            if st.remote_closed:
                self._emit(RstStream(f.stream_id, RstStatus.STREAM_ALREADY_CLOSED))
                self._streams.pop(f.stream_id, None)
                return [StreamReset(f.stream_id, RstStatus.STREAM_ALREADY_CLOSED)]
            st.remote_closed = f.fin
            self._maybe_forget(f.stream_id)
            return [DataReceived(f.stream_id, f.data, f.fin)]
        if isinstance(f, RstStream):
            if self._streams.pop(f.stream_id, None) is None:
                return []
            return [StreamReset(f.stream_id, f.status)]
        if isinstance(f, Ping):
            if f.ping_id % 2 == 1:  # the client's: echo it (ours would be even)
                self._emit(f)
            return []
        if isinstance(f, GoAway):
            return [GoAwayReceived(f.last_good_stream_id, f.status)]
        if isinstance(f, WindowUpdate):
            return self._window_update(f)
        if isinstance(f, Settings):
            for sid, value, _flags in f.entries:
                if sid == SETTINGS_INITIAL_WINDOW_SIZE and 0 < value <= MAX_WINDOW:
                    self.peer_flow_control = True
                    delta = value - self._initial_window
                    self._initial_window = value
                    for st in self._streams.values():
                        st.send_window += delta
            return []
        if isinstance(f, HeadersFrame):
            st = self._streams.get(f.stream_id)
            if st is not None and f.fin:
                st.remote_closed = True
                self._maybe_forget(f.stream_id)
                return [DataReceived(f.stream_id, b"", True)]
            return []
        # SYN_REPLY: we never open streams, so none can be answered.
        self._emit(RstStream(f.stream_id, RstStatus.PROTOCOL_ERROR))
        return []

    def _window_update(self, f: WindowUpdate) -> list[Event]:
        if f.delta == 0:
            return []
        self.peer_flow_control = True
        if f.stream_id == 0:
            self.session_send_window = min(self.session_send_window + f.delta, MAX_WINDOW)
            return [WindowOpened(0)]
        st = self._streams.get(f.stream_id)
        if st is None:
            return []
        if st.send_window + f.delta > MAX_WINDOW:
            self._emit(RstStream(f.stream_id, RstStatus.FLOW_CONTROL_ERROR))
            self._streams.pop(f.stream_id, None)
            return [StreamReset(f.stream_id, RstStatus.FLOW_CONTROL_ERROR)]
        st.send_window += f.delta
        return [WindowOpened(f.stream_id)]

    # -- output ----------------------------------------------------------------
    def _emit(self, frame: Frame) -> None:
        self._out += self._enc.encode(frame)

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def reply(self, stream_id: int, headers: Headers = (), *, fin: bool = False) -> None:
        """SYN_REPLY: accept a stream the client opened."""
        self._emit(SynReply(stream_id, headers, fin))
        if fin:
            self._local_close(stream_id)

    def sendable(self, stream_id: int) -> int | None:
        """How many bytes may be sent on the stream now; None = no limit (see above)."""
        if not self.peer_flow_control:
            return None
        st = self._streams.get(stream_id)
        if st is None:
            return 0
        return max(0, min(st.send_window, self.session_send_window))

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        """DATA frames (cut to MAX_DATA_CHUNK), FIN on the last when `fin`.  Data beyond
        the windows of a flow-controlling peer is the caller's error (check sendable)."""
        st = self._streams.get(stream_id)
        if st is None or st.local_closed:
            return
        view = memoryview(data)
        while True:
            chunk, view = bytes(view[:MAX_DATA_CHUNK]), view[MAX_DATA_CHUNK:]
            last = not len(view)
            if self.peer_flow_control:
                st.send_window -= len(chunk)
                self.session_send_window -= len(chunk)
            if chunk or (last and fin):
                self._emit(DataFrame(stream_id, chunk, fin and last))
            if last:
                break
        if fin:
            self._local_close(stream_id)

    def consumed(self, stream_id: int, n: int) -> None:
        """The application has taken `n` received bytes: return them to the peer's windows
        (one WINDOW_UPDATE per half window, stream and session)."""
        if n <= 0:
            return
        self._session_unacked += n
        if self._session_unacked >= DEFAULT_WINDOW // 2:
            self._emit(WindowUpdate(0, self._session_unacked))
            self._session_unacked = 0
        st = self._streams.get(stream_id)
        if st is None or st.remote_closed:
            return
        st.unacked += n
        if st.unacked >= self._initial_window // 2:
            self._emit(WindowUpdate(stream_id, st.unacked))
            st.unacked = 0

    def reset(self, stream_id: int, status: int = RstStatus.CANCEL) -> None:
        if self._streams.pop(stream_id, None) is not None:
            self._emit(RstStream(stream_id, status))

    def goaway(self, status: int = GoAwayStatus.OK) -> None:
        if not self.closed:
            self.closed = True
            self._emit(GoAway(self._last_client_id, status))

    def _local_close(self, stream_id: int) -> None:
        st = self._streams.get(stream_id)
        if st is not None:
            st.local_closed = True
            self._maybe_forget(stream_id)

    def _maybe_forget(self, stream_id: int) -> None:
        st = self._streams.get(stream_id)
        if st is not None and st.local_closed and st.remote_closed:
            del self._streams[stream_id]

    @property
    def open_streams(self) -> int:
        return len(self._streams)
