"""SPDY/3.1 framing and the server session (fleet/server/spdy.py)."""

from __future__ import annotations

import struct
import zlib

import pytest

from fleet.server import spdy

# What kubectl 1.32 (KUBECTL_PORT_FORWARD_WEBSOCKETS=false) sent a raw SPDY server after
# the 101 for one forwarded connection to port 80: SYN_STREAM 1 (error), its FIN, SYN_STREAM
# 3 (data), RST_STREAM 3 CANCEL once the data stream ended, and a PING.
KUBECTL_CAPTURE = bytes.fromhex(
    "800300010000003d0000000100000000000078f9e3c6a7c202253a060606ce2248fc6482d22da30138e5"
    "9514a526e6420b17d65450d0430aea2250a266b23000000000ffff0000000101000000800300010000001800"
    "00000300000000000022522ba85c4a44d509000000ffff80030003000000080000000300000005800300060000"
    "000400000001")


def test_dictionary_is_spdy3s() -> None:
    # The dictionary id in kubectl's zlib header (bytes 2..6 of the first block) is the
    # Adler-32 of the dictionary it primed zlib with.
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.DICTIONARY.endswith(b",utf-,*,enq=0.")


EXPECTED = [
    spdy.SynStream(1, (("requestid", "0"), ("streamtype", "error"), ("port", "80"))),
    spdy.DataFrame(1, b"", fin=True),
    spdy.SynStream(3, (("requestid", "0"), ("streamtype", "data"), ("port", "80"))),
    spdy.RstStream(3, spdy.RstStatus.CANCEL),
    spdy.Ping(1),
]


def test_decodes_kubectls_bytes() -> None:
    assert spdy.FrameDecoder().feed(KUBECTL_CAPTURE) == EXPECTED


def test_decodes_kubectls_bytes_split_anywhere() -> None:
    dec = spdy.FrameDecoder()
    frames: list[spdy.Frame] = []
    for i in range(len(KUBECTL_CAPTURE)):
        frames += dec.feed(KUBECTL_CAPTURE[i:i + 1])
    assert frames == EXPECTED


ROUND_TRIP = [
    spdy.SynStream(5, (("port", "8080"), ("streamtype", "data")), associated_to=0, priority=3,
                   slot=0, fin=False, unidirectional=True),
    spdy.SynReply(5, (("status", "200"),)),
    spdy.SynReply(7, (), fin=True),
    spdy.HeadersFrame(5, (("x-multi", "a\x00b"),), fin=True),
    spdy.DataFrame(5, b"payload" * 100),
    spdy.DataFrame(5, b"", fin=True),
    spdy.RstStream(5, spdy.RstStatus.FLOW_CONTROL_ERROR),
    spdy.Settings(((spdy.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20, 0), (4, 100, 1)), clear=True),
    spdy.Ping(2),
    spdy.GoAway(9, spdy.GoAwayStatus.PROTOCOL_ERROR),
    spdy.WindowUpdate(0, 12345),
    spdy.WindowUpdate(5, 1),
]


def test_every_frame_round_trips_through_one_compression_context() -> None:
    enc, dec = spdy.FrameEncoder(), spdy.FrameDecoder()
    wire = b"".join(enc.encode(f) for f in ROUND_TRIP)
    assert dec.feed(wire) == ROUND_TRIP
    # And again: the contexts carry over between frames (a fresh decoder cannot read these).
    wire2 = b"".join(enc.encode(f) for f in ROUND_TRIP)
    assert dec.feed(wire2) == ROUND_TRIP
    with pytest.raises(spdy.ProtocolError):
        spdy.FrameDecoder().feed(wire2)


def test_header_values_and_names() -> None:
    headers = (("port", "80\x0081"), ("streamtype", "data"))
    assert spdy.header_value(headers, "port") == "80"
    assert spdy.header_value(headers, "missing") is None
    assert spdy.decode_header_block(spdy.encode_header_block(headers)) == headers
    for bad in ((("Port", "1"),), (("", "1"),), (("a", "1"), ("a", "2"))):
        raw = struct.pack(">I", len(bad)) + b"".join(
            struct.pack(">I", len(n)) + n.encode() + struct.pack(">I", len(v)) + v.encode()
            for n, v in bad)
        with pytest.raises(spdy.ProtocolError):
            spdy.decode_header_block(raw)
    with pytest.raises(spdy.ProtocolError):
        spdy.decode_header_block(b"\x00\x00\x00\x01\x00\x00\x00\x09ab")
    with pytest.raises(spdy.ProtocolError):
        spdy.decode_header_block(spdy.encode_header_block(headers) + b"x")


@pytest.mark.parametrize("wire,why", [
    (struct.pack(">HHI", 0x8002, 1, 10) + bytes(10), "version"),
    (struct.pack(">HHI", 0x8003, 4, 8) + struct.pack(">II", 3, 0), "SETTINGS length"),
    (struct.pack(">HHI", 0x8003, 6, 2) + b"\x00\x01", "too short"),
    (struct.pack(">HHI", 0x8003, 1, spdy.MAX_CONTROL_LENGTH + 1), "control frame of"),
    (struct.pack(">HHI", 0x8003, 2, 8) + b"\x00\x00\x00\x01garb", "inflate"),
])
def test_malformed_frames_are_protocol_errors(wire: bytes, why: str) -> None:
    with pytest.raises(spdy.ProtocolError, match=why):
        spdy.FrameDecoder().feed(wire)


def test_header_bomb_is_refused() -> None:
    z = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, spdy.DICTIONARY)
    block = spdy.encode_header_block((("x", "a" * (spdy.MAX_HEADER_BLOCK + 10)),))
    comp = z.compress(block) + z.flush(zlib.Z_SYNC_FLUSH)
    wire = struct.pack(">HHI", 0x8003, 1, 10 + len(comp)) + struct.pack(">IIBB", 1, 0, 0, 0) + comp
    with pytest.raises(spdy.ProtocolError, match="too large"):
        spdy.FrameDecoder().feed(wire)


def test_unknown_control_frames_are_skipped() -> None:
    wire = struct.pack(">HHI", 0x8003, 0x42, 3) + b"abc" + spdy.FrameEncoder().encode(spdy.Ping(3))
    assert spdy.FrameDecoder().feed(wire) == [spdy.Ping(3)]


# ------------------------------------------------------------------ session
def _client() -> tuple[spdy.FrameEncoder, spdy.FrameDecoder]:
    return spdy.FrameEncoder(), spdy.FrameDecoder()


def test_session_with_kubectls_bytes() -> None:
    s = spdy.ServerSession()
    events = s.receive_data(KUBECTL_CAPTURE[:109])  # both SYN_STREAMs' worth and the FIN
    assert [type(e) for e in events] == [spdy.StreamOpened, spdy.DataReceived, spdy.StreamOpened]
    s.reply(1)
    s.reply(3)
    s.send_data(3, b"hello", fin=True)
    s.send_data(1, b"", fin=True)
    out = spdy.FrameDecoder().feed(s.data_to_send())
    assert out == [spdy.SynReply(1), spdy.SynReply(3), spdy.DataFrame(3, b"hello", fin=True),
                   spdy.DataFrame(1, b"", fin=True)]
    assert not s.is_open(1)  # both sides FIN: forgotten
    assert s.is_open(3)      # ours only; the client's RST comes next
    events = s.receive_data(KUBECTL_CAPTURE[109:])
    assert events == [spdy.StreamReset(3, spdy.RstStatus.CANCEL)]
    assert s.open_streams == 0
    # The client's PING (odd id) is echoed.
    assert spdy.FrameDecoder().feed(s.data_to_send()) == [spdy.Ping(1)]


def test_session_refuses_bad_stream_ids_and_unknown_streams() -> None:
    enc, _ = _client()
    s = spdy.ServerSession()
    assert s.receive_data(enc.encode(spdy.SynStream(2))) == []       # even: not a client's
    assert s.receive_data(enc.encode(spdy.SynStream(5))) == [spdy.StreamOpened(5, (), False)]
    assert s.receive_data(enc.encode(spdy.SynStream(3))) == []       # going backwards
    assert s.receive_data(enc.encode(spdy.DataFrame(9, b"x"))) == []  # never opened
    assert s.receive_data(enc.encode(spdy.SynReply(5))) == []         # we open no streams
    assert s.receive_data(enc.encode(spdy.Ping(4))) == []             # an even (our) ping
    assert spdy.FrameDecoder().feed(s.data_to_send()) == [
        spdy.RstStream(2, spdy.RstStatus.PROTOCOL_ERROR),
        spdy.RstStream(3, spdy.RstStatus.PROTOCOL_ERROR),
        spdy.RstStream(9, spdy.RstStatus.INVALID_STREAM),
        spdy.RstStream(5, spdy.RstStatus.PROTOCOL_ERROR),
    ]


def test_data_after_fin_resets_the_stream() -> None:
    enc, _ = _client()
    s = spdy.ServerSession()
    s.receive_data(enc.encode(spdy.SynStream(1)) + enc.encode(spdy.DataFrame(1, b"a", fin=True)))
    events = s.receive_data(enc.encode(spdy.DataFrame(1, b"b")))
    assert events == [spdy.StreamReset(1, spdy.RstStatus.STREAM_ALREADY_CLOSED)]
    assert spdy.FrameDecoder().feed(s.data_to_send()) == [
        spdy.RstStream(1, spdy.RstStatus.STREAM_ALREADY_CLOSED)]


def test_protocol_error_sends_goaway() -> None:
    s = spdy.ServerSession()
    s.receive_data(spdy.FrameEncoder().encode(spdy.SynStream(7)))
    with pytest.raises(spdy.ProtocolError):
        s.receive_data(struct.pack(">HHI", 0x8002, 1, 0))
    assert spdy.FrameDecoder().feed(s.data_to_send()) == [
        spdy.GoAway(7, spdy.GoAwayStatus.PROTOCOL_ERROR)]
    assert s.closed and s.receive_data(b"anything") == []


def test_send_data_is_cut_into_chunks() -> None:
    s = spdy.ServerSession()
    s.receive_data(spdy.FrameEncoder().encode(spdy.SynStream(1)))
    s.send_data(1, b"x" * (spdy.MAX_DATA_CHUNK * 2 + 5), fin=True)
    frames = spdy.FrameDecoder().feed(s.data_to_send())
    assert [len(f.data) for f in frames] == [spdy.MAX_DATA_CHUNK, spdy.MAX_DATA_CHUNK, 5]
    assert [f.fin for f in frames] == [False, False, True]
    s.send_data(1, b"after fin")  # ignored: our side is closed
    assert s.data_to_send() == b""


def test_flow_control_only_with_a_peer_that_does_it() -> None:
    enc, _ = _client()
    s = spdy.ServerSession()
    s.receive_data(enc.encode(spdy.SynStream(1)))
    assert s.sendable(1) is None  # spdystream: no WINDOW_UPDATE ever, no limit
    s.send_data(1, b"x" * 100_000)
    assert s.sendable(1) is None
    events = s.receive_data(enc.encode(spdy.WindowUpdate(1, 10)))
    assert events == [spdy.WindowOpened(1)]
    # The stream may send 64 KiB + 10, the session (not updated) 64 KiB.
    assert s.peer_flow_control and s.sendable(1) == spdy.DEFAULT_WINDOW
    s.receive_data(enc.encode(spdy.WindowUpdate(0, 100)))
    assert s.sendable(1) == spdy.DEFAULT_WINDOW + 10
    s.send_data(1, b"y" * 1000)
    assert s.sendable(1) == spdy.DEFAULT_WINDOW + 10 - 1000
    # A smaller initial window shrinks the open stream's by the difference.
    s.receive_data(enc.encode(spdy.Settings(((spdy.SETTINGS_INITIAL_WINDOW_SIZE, 1000, 0),))))
    assert s.sendable(1) == 10
    # An update overflowing 2^31-1 is a FLOW_CONTROL_ERROR for the stream.
    s.data_to_send()
    events = s.receive_data(enc.encode(spdy.WindowUpdate(1, spdy.MAX_WINDOW)))
    assert events == [spdy.StreamReset(1, spdy.RstStatus.FLOW_CONTROL_ERROR)]


def test_consumed_data_returns_window_updates() -> None:
    enc, _ = _client()
    s = spdy.ServerSession()
    s.receive_data(enc.encode(spdy.SynStream(1)))
    s.data_to_send()
    s.consumed(1, 1000)
    assert s.data_to_send() == b""
    s.consumed(1, spdy.DEFAULT_WINDOW // 2)
    assert spdy.FrameDecoder().feed(s.data_to_send()) == [
        spdy.WindowUpdate(0, 1000 + spdy.DEFAULT_WINDOW // 2),
        spdy.WindowUpdate(1, 1000 + spdy.DEFAULT_WINDOW // 2)]


def test_reset_and_goaway() -> None:
    s = spdy.ServerSession()
    s.receive_data(spdy.FrameEncoder().encode(spdy.SynStream(1)))
    s.reset(1)
    s.reset(1)  # once only
    s.goaway()
    s.goaway()
    assert spdy.FrameDecoder().feed(s.data_to_send()) == [
        spdy.RstStream(1, spdy.RstStatus.CANCEL), spdy.GoAway(1, spdy.GoAwayStatus.OK)]
