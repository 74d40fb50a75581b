"""The hot path of the cluster DNS server: plain queries parsed and answered by hand.

Almost every question a pod asks is "plain": one question, no answer/authority
records, at most an EDNS OPT record, a name without compression pointers.  For those,
dnslib's general parser and builder cost ~80 µs a query; this module does the same
work in a few µs, and makes answers cacheable whatever case the name is spelt in:

* `parse_plain(data)` → `Plain` (offsets, name, type, class, EDNS size) or None — None
  sends the query down dnslib's path (`fleet.network.dns`), which also judges
  malformed input;
* `encode(plain, answer, limit)` → (header after the id, sections after the question).
  Records owned by the question's name point at offset 12 (the question as the
  client spelt it), so the reply is `id + header + question-as-sent + tail`, and one
  cache entry serves every spelling (DNS 0x20 clients included).

Equality with what dnslib builds is checked by tests/unit/network/test_dns_wire.py.
"""

from __future__ import annotations

import functools
import socket
import struct
from typing import NamedTuple

from fleet.network.dns_records import RR, Answer

TYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "TXT": 16, "AAAA": 28, "SRV": 33}
TYPE_NAMES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 15: "MX", 16: "TXT", 28: "AAAA",
              33: "SRV", 35: "NAPTR", 41: "OPT", 64: "SVCB", 65: "HTTPS", 255: "ANY"}
CLASS_IN = 1
OPT = 41
_POINTER_TO_QUESTION = b"\xc0\x0c"


class Plain(NamedTuple):
    qtype: int
    qclass: int
    name_end: int  # offset after the name's root label
    qend: int  # offset after the question
    edns: int | None  # the client's EDNS UDP size, None without OPT
    key: bytes  # flags + lowercased name + the rest: the answer cache's key

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.qtype, str(self.qtype))


# Bytes a label may hold on this path: printable ASCII but the separator and the
# backslash (dnslib's path handles escapes).
_PLAIN_BYTES = bytes(c for c in range(33, 127) if c not in (46, 92))


def parse_plain(data: bytes) -> Plain | None:
    """The offsets of a plain query (labels are walked, not decoded: `qname`)."""
    n = len(data)
    # QR=0 and OPCODE=0; QD=1, AN=NS=0, AR<=1.
    if n < 17 or data[2] & 0xF8 or data[4:10] != b"\x00\x01\x00\x00\x00\x00" or data[10]:
        return None
    ar = data[11]
    if ar > 1:
        return None
    i = 12
    while True:
        if i >= n:
            return None
        length = data[i]
        if length == 0:
            break
        if length > 63:
            return None
        i += 1 + length
    name_end = i + 1
    qend = name_end + 4
    if name_end - 12 > 255 or qend > n:
        return None
    qtype, qclass = struct.unpack_from("!HH", data, name_end)
    edns: int | None = None
    if ar:
        if n < qend + 11 or data[qend] != 0 or data[qend + 1:qend + 3] != b"\x00\x29":
            return None
        if qend + 11 + int.from_bytes(data[qend + 9:qend + 11], "big") != n:
            return None
        edns = int.from_bytes(data[qend + 3:qend + 5], "big")
    elif n != qend:
        return None
    key = data[2:4] + data[12:name_end].lower() + data[name_end:]
    return Plain(qtype, qclass, name_end, qend, edns, key)


def qname(data: bytes, plain: Plain) -> str | None:
    """The question's name as spelt, with a trailing dot; None for bytes this path does
    not handle (non-ASCII, dots or backslashes inside a label)."""
    name = data[12:plain.name_end]
    labels = []
    i = 0
    while name[i]:
        label = name[i + 1:i + 1 + name[i]]
        if label.translate(None, _PLAIN_BYTES):
            return None
        labels.append(label.decode())
        i += 1 + name[i]
    return ".".join(labels) + "."


def _name(name: str) -> bytes:
    out = bytearray()
    for label in name.rstrip(".").split("."):
        if label:
            b = label.encode()
            if len(b) > 63:
                raise ValueError(f"DNS label longer than 63 bytes in {name!r}")
            out.append(len(b))
            out += b
    out.append(0)
    if len(out) > 255:
        raise ValueError(f"DNS name longer than 255 bytes: {name!r}")
    return bytes(out)


def _rdata(rr: RR) -> bytes:
    t, d = rr.rtype, rr.data
    if t == "A":
        return socket.inet_pton(socket.AF_INET, d[0])
    if t == "AAAA":
        return socket.inet_pton(socket.AF_INET6, d[0])
    if t in ("CNAME", "PTR", "NS"):
        return _name(d[0])
    if t == "SRV":
        return struct.pack("!HHH", d[0], d[1], d[2]) + _name(d[3])
    if t == "TXT":
        raw = str(d[0]).encode()
        return b"".join(bytes([len(raw[i:i + 255])]) + raw[i:i + 255]
                        for i in range(0, max(len(raw), 1), 255))
    if t == "SOA":
        return _name(d[0]) + _name(d[1]) + struct.pack("!IIIII", *d[2:7])
    raise ValueError(f"no encoder for {t}")


@functools.lru_cache(maxsize=8192)
def _body(rr: RR) -> bytes:
    """Type, class, TTL and rdata of a record (records repeat: SOAs, targets)."""
    rdata = _rdata(rr)
    return struct.pack("!HHIH", TYPES[rr.rtype], CLASS_IN, rr.ttl, len(rdata)) + rdata


@functools.lru_cache(maxsize=8192)
def _named(rr: RR) -> bytes:
    return _name(rr.name) + _body(rr)


def _record(rr: RR, qname_lower: str) -> bytes:
    if rr.name.lower() == qname_lower:
        return _POINTER_TO_QUESTION + _body(rr)
    return _named(rr)


def encode(data: bytes, plain: Plain, name: str, answer: Answer, limit: int | None,
           edns_size: int) -> tuple[bytes, bytes]:
    """(flags + counts, everything after the question) of the authoritative answer."""
    ql = name.lower()
    sections = [[_record(r, ql) for r in s] for s in (answer.answer, answer.authority, answer.additional)]
    opt = b"\x00" + struct.pack("!HHIH", OPT, edns_size, 0, 0) if plain.edns is not None else b""
    rd = data[2] & 0x01
    flags = 0x8400 | rd << 8 | 0x0080 | answer.rcode  # QR, AA, RD copied, RA, rcode
    tail = b"".join(b"".join(s) for s in sections) + opt
    counts = [len(s) for s in sections]
    counts[2] += 1 if opt else 0
    if limit is not None and plain.qend + len(tail) > limit:
        flags |= 0x0200  # TC: only the question (and OPT) go out
        tail = opt
        counts = [0, 0, 1 if opt else 0]
    return struct.pack("!HHHHH", flags, 1, *counts), tail


__all__ = ["Plain", "TYPES", "TYPE_NAMES", "encode", "parse_plain", "qname"]
