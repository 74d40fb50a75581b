"""The DNS server's message handling without sockets (fleet/network/dns.py, dns_wire.py).

The hand-built hot path must say exactly what dnslib would: every case of the record
engine's table is answered both ways and compared after decoding.
"""

from __future__ import annotations

import random
from typing import Any

import dnslib
import pytest
import trio

from fleet.network.dns import DNSHandler, _Query, error_reply
from fleet.network.dns_forward import Forwarder, Resolved
from fleet.network.dns_records import ClusterRecords
from fleet.network.dns_wire import parse_plain
from tests.unit.network.test_dns_records import CASES, ep, eps, make_records, svc


@pytest.fixture
def records() -> ClusterRecords:
    return make_records()


def handler(records: ClusterRecords, forwarder: Any = None) -> DNSHandler:
    return DNSHandler(records, forwarder)


def query(name: str, qtype: str = "A", edns: int | None = None, qid: int = 0x4242) -> bytes:
    q = dnslib.DNSRecord(dnslib.DNSHeader(id=qid, rd=1), q=dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype)))
    if edns is not None:
        q.add_ar(dnslib.EDNS0(udp_len=edns))
    return bytes(q.pack())


def decoded(wire: Any) -> list[Any]:
    r = dnslib.DNSRecord.parse(wire)
    sec = [[(str(x.rname).lower(), x.rtype, x.ttl, str(x.rdata)) for x in s] for s in (r.rr, r.auth, r.ar)]
    return [r.header.rcode, r.header.aa, r.header.tc, r.header.rd, r.header.ra, str(r.q.qname), *sec]


@pytest.mark.parametrize("qname,qtype", [(c[0], c[1]) for c in CASES])
def test_hand_built_answers_equal_dnslib(records: ClusterRecords, qname: str, qtype: str) -> None:
    h = handler(records)
    data = query(qname, qtype, edns=1232)
    plain = parse_plain(data)
    assert plain is not None
    fast = h.quick(data, udp=False)
    assert isinstance(fast, bytes)
    slow = h._answer(data, udp=False)
    assert isinstance(slow, bytes)
    assert decoded(fast) == decoded(slow)
    assert fast[:2] == data[:2]


def test_cache_serves_every_spelling(records: ClusterRecords) -> None:
    h = handler(records)
    first = h.quick(query("web.fs-ns.svc.cluster.local"), udp=True)
    assert isinstance(first, bytes)
    rng = random.Random(3)
    for i in range(5):
        name = "".join(c.upper() if rng.random() < 0.5 else c for c in "web.fs-ns.svc.cluster.local")
        data = query(name, qid=i)
        r = dnslib.DNSRecord.parse(h.quick(data, udp=True))
        assert r.header.id == i and str(r.q.qname) == name + "." and str(r.rr[0].rname) == name + "."
        assert str(r.rr[0].rdata) == "10.43.5.6"
    assert h.stats.wire_hits == 5
    # A change anywhere empties the cache: the next answer is the new one.
    records.set_service(svc("fs-ns", "web", "10.43.5.99"))
    r = dnslib.DNSRecord.parse(h.quick(query("web.fs-ns.svc.cluster.local"), udp=True))
    assert str(r.rr[0].rdata) == "10.43.5.99"


def test_udp_truncation_and_edns(records: ClusterRecords) -> None:
    records.set_service(svc("fs-ns", "many", "None"))
    records.set_slice(eps("fs-ns", "many-1", "many", [ep(f"10.42.9.{i}") for i in range(1, 60)]))
    h = handler(records)
    for data, udp, tc, n in ((query("many.fs-ns.svc.cluster.local"), True, 1, 0),
                             (query("many.fs-ns.svc.cluster.local", edns=4096), True, 0, 59),
                             (query("many.fs-ns.svc.cluster.local"), False, 0, 59)):
        for _ in range(2):  # built, then from the cache
            r = dnslib.DNSRecord.parse(h.quick(data, udp=udp))
            assert (r.header.tc, len(r.rr)) == (tc, n)


@pytest.mark.parametrize("data,rcode", [
    (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xff\xfe\xfd", 1),  # a question cut short
    (b"\x12\x34\x01\x00\x00\x02\x00\x00\x00\x00\x00\x00" + query("a.b")[12:] * 2, None),
    (b"\x12\x34\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00", 1),  # no question
    (b"\x12\x34\x11\x00" + query("a.b")[4:], 4),  # opcode STATUS → NOTIMP
    (b"\x12\x34\x81\x00" + query("a.b")[4:], "drop"),  # a response: dropped
    (b"\x12\x34\x01", "drop"),  # shorter than a header: dropped
    (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01", 1),  # pointer loop
])
def test_malformed_input(records: ClusterRecords, data: bytes, rcode: Any) -> None:
    h = handler(records)
    reply = h.quick(data, udp=True)
    if rcode == "drop":
        assert reply is None
        return
    assert isinstance(reply, bytes)
    r = dnslib.DNSRecord.parse(reply)
    assert r.header.id == 0x1234 and r.header.qr == 1
    if rcode is not None:
        assert r.header.rcode == rcode
    # And the handler still answers.
    ok = dnslib.DNSRecord.parse(h.quick(query("web.fs-ns.svc.cluster.local"), udp=True))
    assert str(ok.rr[0].rdata) == "10.43.5.6"


def test_fuzzed_packets_never_raise(records: ClusterRecords) -> None:
    h = handler(records)
    rng = random.Random(11)
    base = query("_http._tcp.web.fs-ns.svc.cluster.local", "SRV", edns=1232)
    for _ in range(3000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))] if rng.random() < 0.3 else data
        out = h.quick(bytes(data), udp=True)
        assert out is None or isinstance(out, (bytes, _Query))
    assert error_reply(b"\x00" * 11, 1) is None


def test_class_other_than_in_is_refused(records: ClusterRecords) -> None:
    q = dnslib.DNSRecord(dnslib.DNSHeader(id=9), q=dnslib.DNSQuestion("version.bind", dnslib.QTYPE.TXT,
                                                                     dnslib.CLASS.CH))
    r = dnslib.DNSRecord.parse(handler(records).quick(bytes(q.pack()), udp=True))
    assert r.header.rcode == 5


class FakeForwarder(Forwarder):
    def __init__(self, busy: bool = False) -> None:
        super().__init__([], max_inflight=0 if busy else 10)
        self.upstreams = []
        self.asked: list[tuple[str, int]] = []

    async def resolve(self, qname: str, qtype: int, qclass: int = 1) -> Resolved:
        self.asked.append((qname, qtype))
        return Resolved(0, [dnslib.RR(qname, qtype, ttl=60, rdata=dnslib.A("192.0.2.7"))])


async def test_forward_and_chase(records: ClusterRecords) -> None:
    fw = FakeForwarder()
    fw.upstreams = [object()]  # type: ignore[list-item]
    h = handler(records, fw)
    q = h.quick(query("example.org"), udp=True)
    assert isinstance(q, _Query)
    r = dnslib.DNSRecord.parse(await h.slow(q))
    assert [str(x.rdata) for x in r.rr] == ["192.0.2.7"] and r.header.aa == 0 and r.header.id == 0x4242
    q = h.quick(query("ext.fs-ns.svc.cluster.local"), udp=True)
    assert isinstance(q, _Query)
    r = dnslib.DNSRecord.parse(await h.slow(q))
    assert [(dnslib.QTYPE[x.rtype], str(x.rdata)) for x in r.rr] == [
        ("CNAME", "www.example.com."), ("A", "192.0.2.7")]
    assert fw.asked == [("example.org.", 1), ("www.example.com.", 1)]


async def test_no_upstream_is_refused_and_busy_is_refused(records: ClusterRecords) -> None:
    h = handler(records, Forwarder([]))
    q = h.quick(query("example.org"), udp=True)
    assert isinstance(q, _Query)
    assert dnslib.DNSRecord.parse(await h.slow(q)).header.rcode == 5
    busy = handler(records, FakeForwarder(busy=True))
    assert busy.busy()
    q = busy.quick(query("example.org"), udp=True)
    assert isinstance(q, _Query)
    assert dnslib.DNSRecord.parse(busy.refuse(q)).header.rcode == 5
    await trio.lowlevel.checkpoint()


def test_an_unencodable_target_is_servfail_not_a_broken_packet(records: ClusterRecords) -> None:
    records.set_service(svc("fs-ns", "long", None, type="ExternalName", externalName="x" * 70 + ".example"))
    h = handler(records)
    r = dnslib.DNSRecord.parse(h.quick(query("long.fs-ns.svc.cluster.local", "CNAME"), udp=True))
    assert r.header.rcode == 2
