"""Forwarding of names outside the cluster domain to upstream resolvers, with a cache.

CoreDNS's `forward` and `cache` plugins, small: the upstreams come from `--dns-upstream`
or the host's resolv.conf (`nameserver` lines); each question goes over UDP to the
upstreams in order (the next one after a timeout), and again over TCP when the answer
comes back truncated.  Answers are cached by (name, type, class):

* positive answers for the smallest TTL of their answer section (capped at `max_ttl`),
  served with their TTLs counted down;
* negative answers (NXDOMAIN, NODATA) for the SOA's negative TTL (RFC 2308: min of the
  SOA record's TTL and its MINIMUM), capped at `max_negative_ttl`; without a SOA, not
  cached; SERVFAIL and truncated answers are never cached;
* at most `max_entries` entries, least recently used evicted first.

The same question asked while it is out waits for that answer (one upstream query).
At most `max_inflight` questions are forwarded at once; `busy()` tells the server to
refuse (REFUSED, as CoreDNS's `max_concurrent`) rather than queue without bound.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dnslib
import trio

log = logging.getLogger(__name__)

NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_INFLIGHT = 256


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int = 53

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_upstream(text: str) -> Upstream:
    """"1.2.3.4", "1.2.3.4:5353", "::1", "[::1]:5353" → Upstream; ValueError otherwise."""
    t = text.strip()
    host, port = t, 53
    if t.startswith("["):
        if "]" not in t:
            raise ValueError(f"{t!r}: unbalanced [")
        host, _, rest = t[1:].partition("]")
        if rest:
            port = int(rest.lstrip(":"))
    elif t.count(":") == 1:
        host, p = t.split(":")
        port = int(p)
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError as e:
        raise ValueError(f"upstream resolver {text!r}: not an IP address[:port]") from e
    if not 0 < port < 65536:
        raise ValueError(f"upstream resolver {text!r}: port out of range")
    return Upstream(host, port)


def upstreams_from_resolv_conf(text: str) -> list[Upstream]:
    """The `nameserver` lines of a resolv.conf (invalid ones skipped)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                out.append(parse_upstream(parts[1].split("%")[0]))
            except ValueError:
                continue
    return out


def read_resolv_conf_upstreams(path: str | Path = "/etc/resolv.conf") -> list[Upstream]:
    try:
        return upstreams_from_resolv_conf(Path(path).read_text())
    except OSError:
        return []


@dataclass
class Resolved:
    """An upstream's answer, ready to be copied into a reply."""

    rcode: int
    answer: list[dnslib.RR] = field(default_factory=list)
    authority: list[dnslib.RR] = field(default_factory=list)
    additional: list[dnslib.RR] = field(default_factory=list)
    cached: bool = False


def _copy(rrs: list[dnslib.RR], elapsed: int) -> list[dnslib.RR]:
    return [dnslib.RR(r.rname, r.rtype, r.rclass, max(0, r.ttl - elapsed), r.rdata) for r in rrs]


def negative_ttl(authority: list[dnslib.RR]) -> int | None:
    """RFC 2308's negative TTL from the SOA in the authority section, or None."""
    for r in authority:
        if r.rtype == dnslib.QTYPE.SOA:
            return min(r.ttl, r.rdata.times[4])
    return None


class ForwardCache:
    """The answer cache (TTL-respecting, bounded, negative entries)."""

    def __init__(self, max_entries: int = 10000, max_ttl: int = 3600, max_negative_ttl: int = 30,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_ttl = max_ttl
        self.max_negative_ttl = max_negative_ttl
        self.clock = clock
        self._entries: OrderedDict[tuple[str, int, int], tuple[float, float, Resolved]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, int, int]) -> Resolved | None:
        e = self._entries.get(key)
        now = self.clock()
        if e is None or e[0] <= now:
            if e is not None:
                del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        expires, stored, res = e
        elapsed = int(now - stored)
        return Resolved(res.rcode, _copy(res.answer, elapsed), _copy(res.authority, elapsed),
                        _copy(res.additional, elapsed), cached=True)

    def put(self, key: tuple[str, int, int], res: Resolved) -> None:
        if res.rcode == NOERROR and res.answer:
            ttl = min(min(r.ttl for r in res.answer), self.max_ttl)
        elif res.rcode in (NOERROR, NXDOMAIN):
            neg = negative_ttl(res.authority)
            if neg is None:
                return
            ttl = min(neg, self.max_negative_ttl)
        else:
            return
        if ttl <= 0 or self.max_entries <= 0:
            return
        now = self.clock()
        self._entries[key] = (now + ttl, now, res)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


@dataclass
class _Flight:
    """A question out to the upstreams, that the same question asked meanwhile waits for."""

    done: trio.Event = field(default_factory=trio.Event)
    result: Resolved | None = None


class Forwarder:
    """Asks the upstream resolvers (UDP, TCP on truncation), through the cache."""

    def __init__(self, upstreams: list[Upstream], *, timeout: float = DEFAULT_TIMEOUT,
                 max_inflight: int = DEFAULT_MAX_INFLIGHT, cache: ForwardCache | None = None) -> None:
        self.upstreams = list(upstreams)
        self.timeout = timeout
        self.max_inflight = max_inflight
        self.cache = cache if cache is not None else ForwardCache()
        self.inflight = 0
        self.failures = 0  # questions no upstream answered
        self._flights: dict[tuple[str, int, int], _Flight] = {}

    def busy(self) -> bool:
        return self.inflight >= self.max_inflight

    async def resolve(self, qname: str, qtype: int, qclass: int = 1) -> Resolved:
        """The upstreams' answer to one question (SERVFAIL when none answers).  The same
        question asked again while it is out waits for that answer (one upstream query)."""
        key = (qname.lower().rstrip(".") + ".", qtype, qclass)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        flight = self._flights.get(key)
        if flight is not None:  # counted too: `busy()` bounds the tasks waiting
            self.inflight += 1
            try:
                await flight.done.wait()
            finally:
                self.inflight -= 1
            res = flight.result or Resolved(SERVFAIL)
            return Resolved(res.rcode, list(res.answer), list(res.authority), list(res.additional))
        flight = self._flights[key] = _Flight()
        self.inflight += 1
        try:
            res = await self._ask(qname, qtype, qclass)
            if res is None:
                self.failures += 1
                res = Resolved(SERVFAIL)
            else:
                self.cache.put(key, res)
            flight.result = res
            return res
        finally:
            self.inflight -= 1
            del self._flights[key]
            flight.done.set()

    async def _ask(self, qname: str, qtype: int, qclass: int) -> Resolved | None:
        q = dnslib.DNSRecord(dnslib.DNSHeader(id=random.randrange(1 << 16), rd=1),
                             q=dnslib.DNSQuestion(qname, qtype, qclass))
        q.add_ar(dnslib.EDNS0(udp_len=1232))
        wire = q.pack()
        for up in self.upstreams:
            try:
                data = await self._udp(up, wire)
                if data is not None and dnslib.DNSHeader.parse(dnslib.DNSBuffer(data)).tc:
                    data = await self._tcp(up, wire)
            except (OSError, dnslib.DNSError) as e:
                log.debug("dns upstream %s: %s", up, e)
                continue
            if data is None:
                continue
            try:
                r = dnslib.DNSRecord.parse(data)
            except Exception as e:  # a broken answer: try the next upstream
                log.debug("dns upstream %s: bad answer: %s", up, e)
                continue
            if r.header.id != q.header.id or len(r.questions) != 1 or \
                    str(r.q.qname).lower() != str(q.q.qname).lower():
                continue
            if r.header.rcode in (SERVFAIL, 5):  # SERVFAIL / REFUSED: the next one may know
                continue
            return Resolved(r.header.rcode, list(r.rr), list(r.auth),
                            [a for a in r.ar if a.rtype != dnslib.QTYPE.OPT])
        return None

    async def _udp(self, up: Upstream, wire: bytes) -> bytes | None:
        family = socket.AF_INET6 if ":" in up.host else socket.AF_INET
        with trio.socket.socket(family, socket.SOCK_DGRAM) as s:
            await s.connect((up.host, up.port))
            await s.send(wire)
            with trio.move_on_after(self.timeout):
                while True:
                    data = await s.recv(65535)
                    if data[:2] == wire[:2]:  # an answer to our id (others are stale)
                        return data
        return None

    async def _tcp(self, up: Upstream, wire: bytes) -> bytes | None:
        with trio.move_on_after(self.timeout):
            stream = await trio.open_tcp_stream(up.host, up.port)
            async with stream:
                await stream.send_all(len(wire).to_bytes(2, "big") + wire)
                head = await read_exactly(stream, 2)
                if head is None:
                    return None
                return await read_exactly(stream, int.from_bytes(head, "big"))
        return None


async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes | None:
    """`n` bytes from `stream`, or None if it ends first (DNS over TCP's framing)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


__all__ = ["DEFAULT_MAX_INFLIGHT", "DEFAULT_TIMEOUT", "ForwardCache", "Forwarder", "Resolved", "read_exactly",
           "Upstream", "negative_ttl", "parse_upstream", "read_resolv_conf_upstreams",
           "upstreams_from_resolv_conf"]
