"""The backend-side HTTP/1.1 framing of the built-in ingress proxy (ingress_upstream.H1Client)."""

from __future__ import annotations

import pytest

from fleet.network.ingress_upstream import END, NEED_DATA, H1Client, Head, UpstreamError


def events(client: H1Client, *pieces: bytes) -> list[object]:
    """Feed `pieces` (b"" = EOF) one by one, collecting events until END or the data runs out."""
    out: list[object] = []
    for piece in pieces:
        client.receive_data(piece)
        while client.state in ("head", "body"):
            ev = client.next_event()
            if ev is NEED_DATA:
                break
            out.append(ev)
            if ev is END:
                return out
    return out


def fresh(method: bytes = b"GET") -> H1Client:
    c = H1Client()
    c.request(method, b"/", [(b"host", b"x")], chunked=False)
    c.end()
    return c


def test_request_framing() -> None:
    c = H1Client()
    head = c.request(b"POST", b"/p?q=1", [(b"Host", b"h"), (b"transfer-encoding", b"chunked")], chunked=True)
    assert head == b"POST /p?q=1 HTTP/1.1\r\nHost: h\r\ntransfer-encoding: chunked\r\n\r\n"
    assert c.body(b"abc") == b"3\r\nabc\r\n" and c.body(b"") == b""
    assert c.end() == b"0\r\n\r\n"
    plain = H1Client()
    plain.request(b"PUT", b"/", [], chunked=False)
    assert plain.body(b"abc") == b"abc" and plain.end() == b""


def test_content_length_response_split_anywhere_and_reusable() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A:  b \r\n\r\nhello"
    for cut in range(1, len(raw)):
        c = fresh()
        evs = events(c, raw[:cut], raw[cut:])
        head = evs[0]
        assert isinstance(head, Head) and head.status_code == 200 and head.reason == b"OK"
        assert (b"X-A", b"b") in head.headers
        assert b"".join(e for e in evs[1:-1]) == b"hello" and evs[-1] is END  # type: ignore[misc]
        assert c.reusable
        c.start_next_cycle()
        assert c.state == "head"


def test_chunked_response_decoded_and_trailers_dropped() -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nX-T: 1\r\n\r\n"
    for cut in (10, 45, 50, 60, len(raw) - 3):
        c = fresh()
        evs = events(c, raw[:cut], raw[cut:])
        assert b"".join(e for e in evs[1:-1]) == b"hello!" and evs[-1] is END  # type: ignore[misc]
        assert c.reusable


def test_bodyless_responses_and_close_delimited() -> None:
    c = fresh(b"HEAD")
    evs = events(c, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    assert evs[-1] is END and c.reusable
    c = fresh()
    evs = events(c, b"HTTP/1.1 204 No Content\r\n\r\n")
    assert evs[-1] is END
    c = fresh()
    evs = events(c, b"HTTP/1.1 200 OK\r\n\r\nsome", b" more", b"")
    assert b"".join(e for e in evs[1:-1]) == b"some more" and evs[-1] is END  # type: ignore[misc]
    assert not c.reusable
    c = fresh()
    events(c, b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert not c.reusable  # HTTP/1.0: no keep-alive
    c = fresh()
    events(c, b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert not c.reusable


def test_informational_and_switching_protocols() -> None:
    c = fresh()
    evs = events(c, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert [e.status_code for e in evs if isinstance(e, Head)] == [100, 200]
    c = fresh()
    c.receive_data(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x02hi")
    head = c.next_event()
    assert isinstance(head, Head) and head.status_code == 101 and c.state == "switched"
    assert c.trailing_data == (b"\x81\x02hi", False)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"FTP 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_responses_are_errors(raw: bytes) -> None:
    c = fresh()
    with pytest.raises(UpstreamError):
        events(c, raw)


def test_early_close_is_an_error_and_mid_body_too() -> None:
    c = fresh()
    with pytest.raises(UpstreamError):
        events(c, b"")
    c = fresh()
    with pytest.raises(UpstreamError):
        events(c, b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", b"")


def test_heads_whose_lines_end_in_a_bare_lf() -> None:
    # busybox httpd relays a CGI script's "\n" line ends after its own "\r\n" status
    # line; RFC 9112 §2.2 lets a recipient take a bare LF as a line end (h11 does).
    for raw in (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\n\nslow\n",
                b"HTTP/1.1 200 OK\nContent-Type: text/plain\nX-B: 2\r\n\nslow\n",
                b"HTTP/1.0 200 OK\n\nslow\n"):
        for cut in range(1, len(raw)):
            c = fresh()
            evs = events(c, raw[:cut], raw[cut:], b"")
            head = evs[0]
            assert isinstance(head, Head) and head.status_code == 200, (raw, cut)
            assert all(b"\n" not in n + v for n, v in head.headers)
            assert b"".join(e for e in evs[1:-1]) == b"slow\n" and evs[-1] is END  # type: ignore[misc]
    # The earliest blank line ends the head, even when the body holds a CRLF CRLF.
    c = fresh()
    evs = events(c, b"HTTP/1.1 200 OK\nContent-Length: 6\n\nab\r\n\r\n")
    assert b"".join(e for e in evs[1:-1]) == b"ab\r\n\r\n"  # type: ignore[misc]
@pytest.mark.parametrize("head", [
    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\n\n",  # busybox httpd + a CGI script's echo
    b"HTTP/1.1 200 OK\nContent-Type: text/plain\nConnection: close\n\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\n",
])
def test_bare_lf_line_ends_are_accepted(head: bytes) -> None:
    c = fresh()
    out = events(c, head + b"hello\n", b"")
    assert isinstance(out[0], Head) and out[0].status_code == 200
    assert out[0].headers[0] == (b"Content-Type", b"text/plain")
    assert b"".join(e for e in out[1:-1]) == b"hello\n" and out[-1] is END  # type: ignore[misc]


def test_a_bare_cr_is_refused() -> None:
    with pytest.raises(UpstreamError):
        events(fresh(), b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n")
