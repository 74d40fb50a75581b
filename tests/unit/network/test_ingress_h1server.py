"""The client-side HTTP/1.1 parser of the built-in ingress proxy (ingress_h1server.H1Server):
each rule on its own, then a differential test against h11 (which parsed client
requests before) on generated and mutated heads."""

from __future__ import annotations

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.network.ingress_h1server import (
    CLOSED,
    END,
    NEED_DATA,
    H1Server,
    ProtocolError,
    Request,
    parse_head,
)

BIG = 1 << 20


def feed(server: H1Server, *pieces: bytes) -> list[object]:
    """Feed `pieces` (b"" = EOF) one by one, collecting events until the request ends."""
    out: list[object] = []
    for piece in pieces:
        server.receive_data(piece)
        while server.state != "done":
            ev = server.next_event()
            if ev is NEED_DATA or ev is CLOSED:
                break
            out.append(ev)
            if ev is END:
                return out
        if server.state == "done" and out and out[-1] is not END:
            return out
    return out


def status_of(head: bytes, max_head: int = BIG) -> int:
    """200 when `head` parses, else the ProtocolError's status."""
    s = H1Server(max_head)
    s.receive_data(head)
    try:
        ev = s.next_event()
    except ProtocolError as e:
        return e.status
    assert isinstance(ev, Request), ev
    return 200


H = b"Host: a\r\n"


@pytest.mark.parametrize(("head", "status"), [
    (b"GET / HTTP/1.1\r\n" + H + b"\r\n", 200),
    (b"GET / HTTP/1.0\r\n\r\n", 200),  # HTTP/1.0 needs no Host
    (b"GET / HTTP/1.1\nHost: a\n\n", 200),  # bare LF line ends (RFC 9112 §2.2)
    (b"GET http://x/y?z HTTP/1.1\r\n" + H + b"\r\n", 200),  # absolute form
    (b"GET / HTTP/1.1\r\nHost: a\r\nX:\r\n\r\n", 200),  # empty value
    (b"GET / HTTP/1.1\r\nHost:   a b\t \r\n\r\n", 200),  # OWS around, SP inside
    # request line
    (b"\r\nGET / HTTP/1.1\r\n" + H + b"\r\n", 400),  # leading empty line
    (b" GET / HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET  / HTTP/1.1\r\n" + H + b"\r\n", 400),  # two spaces
    (b"G(T / HTTP/1.1\r\n" + H + b"\r\n", 400),  # method not a token
    (b"GET /a b HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET / HTTP/1.1 \r\n" + H + b"\r\n", 400),
    (b"GET / HTTP/11\r\n" + H + b"\r\n", 400),
    (b"GET / http/1.1\r\n" + H + b"\r\n", 400),
    (b"GET /\x7f HTTP/1.1\r\n" + H + b"\r\n", 400),
    (b"GET / HTTP/1.1\r\r\n" + H + b"\r\n", 400),  # bare CR
    # header fields
    (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),  # whitespace before ':'
    (b"GET / HTTP/1.1\r\n" + H + b"X\x01: y\r\n\r\n", 400),  # name not a token
    (b"GET / HTTP/1.1\r\n" + H + b"no-colon\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n" + H + b": v\r\n\r\n", 400),  # empty name
    (b"GET / HTTP/1.1\r\n" + H + b"X: a\rb\r\n\r\n", 400),  # bare CR in a value
    (b"GET / HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n", 400),  # NUL
    (b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n b\r\n\r\n", 400),  # obs-fold
    (b"GET / HTTP/1.1\r\n\tX: a\r\n" + H + b"\r\n", 400),  # continuation first
    (b"GET / HTTP/1.1\r\nX: a\r\n\r\n", 400),  # HTTP/1.1 without Host
    (b"GET / HTTP/1.1\r\n" + H + H + b"\r\n", 400),  # two Hosts
    # framing / smuggling
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3, 4\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\n", 200),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3, 3\r\n\r\n", 200),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: -3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0x3\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: \r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: " + b"1" * 21 + b"\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, gzip\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: identity\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: Chunked\r\n\r\n", 200),
])
def test_head_rules(head: bytes, status: int) -> None:
    assert status_of(head) == status


def test_parsed_fields() -> None:
    req = parse_head(b"POST /p?q=1 HTTP/1.1\r\nHost: a:8080\r\nX-Y:  v  w \r\n"
                     b"Content-Length: 5, 5\r\nContent-Length: 5\r\n\r\n")
    assert (req.method, req.target, req.http_version) == (b"POST", b"/p?q=1", b"1.1")
    assert req.headers == [(b"host", b"a:8080"), (b"x-y", b"v  w"), (b"content-length", b"5")]
    assert (req.length, req.chunked, req.has_body, req.switch) == (5, False, True, False)
    chunked = parse_head(b"PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n")
    assert chunked.chunked and chunked.has_body and chunked.length == 0
    assert (b"transfer-encoding", b"chunked") in chunked.headers
    assert parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n").switch
    assert parse_head(b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n").switch
    assert not parse_head(b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: ,\r\n\r\n").switch


def test_head_size_limit_431() -> None:
    head = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * 200 + b"\r\n\r\n"
    assert status_of(head, max_head=len(head)) == 200
    assert status_of(head, max_head=len(head) - 1) == 431  # complete but too large
    s = H1Server(100)
    s.receive_data(b"GET / HTTP/1.1\r\nX: " + b"v" * 100)  # incomplete and too large
    with pytest.raises(ProtocolError) as e:
        s.next_event()
    assert e.value.status == 431


def test_head_in_pieces_and_eof() -> None:
    s = H1Server(BIG)
    head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    for b in head[:-1]:
        s.receive_data(bytes([b]))
        assert s.next_event() is NEED_DATA
    s.receive_data(head[-1:])
    assert isinstance(s.next_event(), Request) and s.state == "done"
    s.start_next_cycle()
    s.receive_data(b"")
    assert s.next_event() is CLOSED  # closed between requests
    cut = H1Server(BIG)
    cut.receive_data(b"GET / HT")
    cut.receive_data(b"")
    with pytest.raises(ProtocolError):
        cut.next_event()  # closed mid-head


def test_pipelining_keeps_the_next_request() -> None:
    s = H1Server(BIG)
    s.receive_data(b"POST /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                   b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\nGET /3 HTTP/1.0\r\n\r\n")
    first = s.next_event()
    assert isinstance(first, Request) and first.target == b"/1"
    assert s.next_event() == b"abc" and s.next_event() is END and s.state == "done"
    with pytest.raises(RuntimeError):
        s.next_event()  # no parsing of the next request before start_next_cycle
    s.start_next_cycle()
    second = s.next_event()
    assert isinstance(second, Request) and second.target == b"/2" and not second.has_body
    s.start_next_cycle()
    third = s.next_event()
    assert isinstance(third, Request) and third.http_version == b"1.0"
    assert s.trailing_data == (b"", False)


def test_upgrade_leaves_the_new_protocol_bytes() -> None:
    s = H1Server(BIG)
    s.receive_data(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\nRAW")
    req = s.next_event()
    assert isinstance(req, Request) and req.switch and s.trailing_data == (b"RAW", False)


def test_length_body() -> None:
    s = H1Server(BIG)
    assert feed(s, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab", b"cde")[1:] == [b"ab", b"cde", END]
    s = H1Server(BIG)
    with pytest.raises(ProtocolError):
        feed(s, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab", b"")  # EOF mid-body


CH = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(("body", "data"), [
    (b"3\r\nabc\r\n0\r\n\r\n", b"abc"),
    (b"3;ext=1\r\nabc\r\nA \r\n0123456789\r\n0\r\n\r\n", b"abc0123456789"),
    (b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", b"abc"),  # a trailer, dropped
    (b"0\r\n\n", b""),
])
def test_chunked_body(body: bytes, data: bytes) -> None:
    events = feed(H1Server(BIG), CH + body)
    assert events[-1] is END and b"".join(e for e in events[1:-1]) == data  # type: ignore[misc]
    # the same, one byte at a time
    events = feed(H1Server(BIG), CH, *[bytes([b]) for b in body])
    assert events[-1] is END and b"".join(e for e in events[1:-1]) == data  # type: ignore[misc]


@pytest.mark.parametrize("body", [
    b"x\r\n",  # not hex
    b"-1\r\n",
    b"\r\n",  # empty size
    b"1" * 21 + b"\r\n",  # over 20 hex digits
    b"3\r\nabcX\r\n",  # no CRLF after the data
    b"3\rabc\r\n",  # bare CR
    b"0\r\nbad trailer\r\n\r\n",
    b"0\r\n x: folded\r\n\r\n",
    b"1;" + b"e" * 5000 + b"\r\n",  # chunk line too long
    b"1;" + b"e" * 5000,  # … even before its CRLF
])
def test_chunked_body_rejects(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        feed(H1Server(BIG), CH + body)


def test_chunked_eof_mid_body() -> None:
    with pytest.raises(ProtocolError):
        feed(H1Server(BIG), CH + b"5\r\nab", b"")


# ---- differential: the same verdicts and fields as h11 ---------------------------------

def h11_verdict(head: bytes) -> tuple[str, object]:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=BIG)
    conn.receive_data(head)
    try:
        ev = conn.next_event()
    except h11.RemoteProtocolError as e:
        return "reject", e.error_status_hint
    if ev is h11.NEED_DATA:
        return "need", None
    assert isinstance(ev, h11.Request)
    return "accept", (ev.method, ev.target, ev.http_version, list(ev.headers))


def ours_verdict(head: bytes) -> tuple[str, object]:
    s = H1Server(BIG)
    s.receive_data(head)
    try:
        ev = s.next_event()
    except ProtocolError as e:
        return "reject", e.status
    if ev is NEED_DATA:
        return "need", None
    assert isinstance(ev, Request)
    return "accept", (ev.method, ev.target, ev.http_version, ev.headers)


def stricter_on_purpose(head: bytes) -> bool:
    """Heads h11 accepts and H1Server refuses by design: obs-fold, Content-Length with
    Transfer-Encoding."""
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    folded = any(ln[:1] in (b" ", b"\t") for ln in lines[1:] if ln)
    names = {ln.split(b":", 1)[0].strip().lower() for ln in lines[1:]}
    return folded or {b"content-length", b"transfer-encoding"} <= names


def check_same(head: bytes) -> None:
    theirs, ours = h11_verdict(head), ours_verdict(head)
    if ours[0] == "reject" and theirs[0] != "need" and stricter_on_purpose(head):
        return  # refused on purpose (h11 accepts, or refuses later for another reason)
    assert ours[0] == theirs[0], (head, theirs, ours)
    assert ours[1] == theirs[1], (head, theirs, ours)


def mostly(valid: list[bytes], invalid: list[bytes]) -> st.SearchStrategy[bytes]:
    """Valid parts four times as often as invalid ones, so most heads parse until mutated."""
    return st.sampled_from(valid * 4 + invalid)


TOKENS = mostly([b"GET", b"POST", b"HEAD", b"X-Y", b"get"], [b"G(T", b""])
TARGETS = mostly([b"/", b"/a?b=c", b"http://h/p", b"*"], [b"/a b", b"/\x80", b""])
VERSIONS = mostly([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0"], [b"HTTP/1", b"http/1.1", b"HTTP/1.1 ", b"HTTP/1.10"])
NAMES = mostly([b"Content-Length", b"Transfer-Encoding", b"X-A", b"Upgrade", b"Connection",
                b"Expect"], [b"X A", b"X:", b"", b"X\x00", b"HOST"])
VALUES = mostly([b"a", b"", b" a ", b"a b", b"5", b"5, 5", b"chunked", b"Chunked", b"close", b"upgrade",
                 b"100-continue", b"\x80\xff", b"\ta\t", b"x" * 30, b"a\x01"],
                [b"5, 6", b"-1", b"gzip, chunked", b"a\rb", b"a\x00"])
SEPARATORS = mostly([b":", b": ", b":  ", b":\t"], [b" :"])
EOLS = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"])
MUTATION_BYTES = st.sampled_from(list(b"\r\n \t:\x00\x7f\x80,;Aa0"))


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    eol = draw(EOLS)
    line = draw(TOKENS) + b" " + draw(TARGETS) + b" " + draw(VERSIONS)
    fields = draw(st.lists(st.tuples(NAMES, SEPARATORS, VALUES),
                           max_size=5))
    if draw(st.integers(0, 3)):
        fields.insert(draw(st.integers(0, len(fields))), (b"Host", b": ", b"example"))
    head = line + eol + b"".join(n + sep + v + draw(EOLS) for n, sep, v in fields) + draw(EOLS)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # mutate: replace, insert or delete one byte
        if not head:
            break
        i = draw(st.integers(0, len(head) - 1))
        kind = draw(st.sampled_from(["replace", "insert", "delete"]))
        b = bytes([draw(MUTATION_BYTES)])
        head = (head[:i] + b + head[i + 1:] if kind == "replace"
                else head[:i] + b + head[i:] if kind == "insert" else head[:i] + head[i + 1:])
    return head


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads())
def test_same_verdicts_as_h11(head: bytes) -> None:
    check_same(head)


def test_stricter_than_h11_only_on_purpose() -> None:
    folded = b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n"
    both = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    for head in (folded, both):
        assert h11_verdict(head)[0] == "accept" and ours_verdict(head)[0] == "reject"
