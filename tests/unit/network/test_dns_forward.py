"""Forwarding to upstream resolvers and its cache (fleet/network/dns_forward.py).

The upstreams are tiny dnslib resolvers on 127.0.0.1 run by the test itself.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import dnslib
import pytest
import trio

from fleet.network.dns_forward import (
    ForwardCache,
    Forwarder,
    Resolved,
    Upstream,
    parse_upstream,
    upstreams_from_resolv_conf,
)


def a(name: str, ip: str, ttl: int) -> dnslib.RR:
    return dnslib.RR(name, dnslib.QTYPE.A, ttl=ttl, rdata=dnslib.A(ip))


def soa(ttl: int, minimum: int) -> dnslib.RR:
    return dnslib.RR("example.", dnslib.QTYPE.SOA, ttl=ttl,
                     rdata=dnslib.SOA("ns.example.", "h.example.", (1, 2, 3, 4, minimum)))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_positive_entries_count_down_and_expire() -> None:
    clock = Clock()
    c = ForwardCache(clock=clock)
    key = ("x.example.", 1, 1)
    c.put(key, Resolved(0, [a("x.example.", "192.0.2.1", 30), a("x.example.", "192.0.2.2", 20)]))
    clock.t += 5
    hit = c.get(key)
    assert hit is not None and hit.cached and [r.ttl for r in hit.answer] == [25, 15]
    clock.t += 15  # the smallest TTL is the entry's
    assert c.get(key) is None
    assert (c.hits, c.misses) == (1, 1)


@pytest.mark.parametrize("res,cached_for", [
    (Resolved(3, [], [soa(60, 10)]), 10),  # NXDOMAIN: min(SOA TTL, MINIMUM)
    (Resolved(0, [], [soa(5, 100)]), 5),  # NODATA
    (Resolved(3, [], [soa(3600, 3600)]), 30),  # capped at max_negative_ttl
    (Resolved(3, [], []), 0),  # no SOA: not cached (RFC 2308)
    (Resolved(2, [], [soa(60, 60)]), 0),  # SERVFAIL: never
    (Resolved(0, [a("x.", "192.0.2.1", 86400 * 7)]), 3600),  # capped at max_ttl
])
def test_what_is_cached_and_for_how_long(res: Resolved, cached_for: int) -> None:
    clock = Clock()
    c = ForwardCache(clock=clock, max_negative_ttl=30, max_ttl=3600)
    c.put(("x.", 1, 1), res)
    if not cached_for:
        assert c.get(("x.", 1, 1)) is None
        return
    clock.t += cached_for - 0.5
    assert c.get(("x.", 1, 1)) is not None
    clock.t += 1
    assert c.get(("x.", 1, 1)) is None


def test_cache_is_bounded_lru() -> None:
    c = ForwardCache(max_entries=3)
    for i in range(3):
        c.put((f"{i}.", 1, 1), Resolved(0, [a(f"{i}.", "192.0.2.1", 60)]))
    assert c.get(("0.", 1, 1)) is not None  # 0 is now the most recent
    c.put(("3.", 1, 1), Resolved(0, [a("3.", "192.0.2.1", 60)]))
    assert len(c) == 3 and c.get(("1.", 1, 1)) is None and c.get(("0.", 1, 1)) is not None


def test_upstream_parsing() -> None:
    assert parse_upstream("192.0.2.1") == Upstream("192.0.2.1", 53)
    assert parse_upstream("127.0.0.1:5353") == Upstream("127.0.0.1", 5353)
    assert parse_upstream("::1") == Upstream("::1", 53)
    assert parse_upstream("[::1]:54") == Upstream("::1", 54)
    for bad in ("example.com", "1.2.3.4:0", "1.2.3.4:99999", "[::1"):
        with pytest.raises(ValueError):
            parse_upstream(bad)
    assert upstreams_from_resolv_conf(
        "# c\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nnameserver bogus\nsearch x\n") == [
        Upstream("127.0.0.53"), Upstream("fe80::1")]


async def _upstream(answer: Callable[[dnslib.DNSRecord], dnslib.DNSRecord | None],
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    task_status.started(sock.getsockname()[1])
    with sock:
        while True:
            data, addr = await sock.recvfrom(4096)
            reply = answer(dnslib.DNSRecord.parse(data))
            if reply is not None:
                await sock.sendto(bytes(reply.pack()), addr)


async def test_failover_to_the_next_upstream_and_cache() -> None:
    asked: list[str] = []

    def good(q: dnslib.DNSRecord) -> dnslib.DNSRecord:
        asked.append(str(q.q.qname))
        r = q.reply()
        r.add_answer(a(str(q.q.qname), "192.0.2.9", 120))
        return r

    def refusing(q: dnslib.DNSRecord) -> dnslib.DNSRecord:
        r = q.reply()
        r.header.rcode = 5
        return r

    async with trio.open_nursery() as n:
        silent = await n.start(_upstream, lambda q: None)
        refuse = await n.start(_upstream, refusing)
        ok = await n.start(_upstream, good)
        fw = Forwarder([Upstream("127.0.0.1", silent), Upstream("127.0.0.1", refuse),
                        Upstream("127.0.0.1", ok)], timeout=0.3)
        with trio.fail_after(5):
            res = await fw.resolve("www.example.", dnslib.QTYPE.A)
        assert res.rcode == 0 and [str(r.rdata) for r in res.answer] == ["192.0.2.9"]
        again = await fw.resolve("WWW.example.", dnslib.QTYPE.A)
        assert again.cached and asked == ["www.example."]
        dead = Forwarder([Upstream("127.0.0.1", silent)], timeout=0.2)
        with trio.fail_after(5):
            assert (await dead.resolve("www.example.", 1)).rcode == 2
        assert dead.failures == 1 and dead.inflight == 0
        n.cancel_scope.cancel()


async def test_the_same_question_in_flight_is_asked_once() -> None:
    asked: list[str] = []

    async def slow_upstream(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        await sock.bind(("127.0.0.1", 0))
        task_status.started(sock.getsockname()[1])
        with sock:
            while True:
                data, addr = await sock.recvfrom(4096)
                q = dnslib.DNSRecord.parse(data)
                asked.append(str(q.q.qname))
                await trio.sleep(0.2)
                r = q.reply()
                r.add_answer(a(str(q.q.qname), "192.0.2.3", 60))
                await sock.sendto(bytes(r.pack()), addr)

    async with trio.open_nursery() as n:
        port = await n.start(slow_upstream)
        fw = Forwarder([Upstream("127.0.0.1", port)], timeout=2)
        results: list[Resolved] = []

        async def one() -> None:
            results.append(await fw.resolve("same.example.", 1))

        with trio.fail_after(5):
            async with trio.open_nursery() as inner:
                for _ in range(5):
                    inner.start_soon(one)
        assert asked == ["same.example."]
        assert [str(r.answer[0].rdata) for r in results] == ["192.0.2.3"] * 5
        assert fw.inflight == 0
        n.cancel_scope.cancel()
