"""The cluster DNS server: DNS messages in and out over UDP and TCP, on Trio.

The records come from `fleet.network.dns_records.ClusterRecords` (the Kubernetes DNS
spec), everything outside the cluster domain goes to `fleet.network.dns_forward`.
This module owns only the wire: dnslib parses and builds messages.

* **UDP**: one non-blocking socket; the loop waits until it is readable, then drains
  up to a batch of datagrams without yielding, answering each one synchronously when
  the answer is local (the common case).  Answers larger than 512 bytes (or the
  client's EDNS size) go out with only the question and the TC bit, so the client
  retries over TCP.
* **TCP**: two-byte length prefix (RFC 1035 4.2.2), several queries per connection,
  idle connections closed after `TCP_IDLE_TIMEOUT`, at most `MAX_TCP_CONNECTIONS`.
* **Bad input**: a datagram shorter than a header, or one that is itself a response, is
  dropped; one that does not parse gets FORMERR (its id and opcode echoed); an opcode
  other than QUERY gets NOTIMP, a class other than IN REFUSED.  A handler error answers
  SERVFAIL and is logged; nothing a client sends ends a loop.
* **Answer cache**: local answers are kept as bytes keyed by the query's bytes after
  its id (same name spelling, flags and EDNS), per transport, and dropped whenever the
  records' `generation` moves, so a repeated question costs one dict look-up.
* **Forwarding**: questions outside the zone (and ExternalName targets outside it) are
  resolved in their own task; with `max_inflight` forwards already running the answer
  is REFUSED.

Counts (answers by rcode, cache hits) are plain integers read by `DNSStats.collect`,
a Prometheus collector the server registers in its registry.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import dnslib
import trio
from prometheus_client.core import CounterMetricFamily

from fleet.network.dns_forward import Forwarder, Resolved, read_exactly
from fleet.network.dns_records import (
    FORMERR,
    NOERROR,
    NOTIMP,
    REFUSED,
    RR,
    SERVFAIL,
    Answer,
    ClusterRecords,
)
from fleet.network.dns_wire import Plain, encode, parse_plain, qname

log = logging.getLogger(__name__)

UDP_PLAIN_LIMIT = 512
UDP_MAX_LIMIT = 4096
EDNS_SIZE = 1232
UDP_BATCH = 64
TCP_IDLE_TIMEOUT = 10.0
MAX_TCP_CONNECTIONS = 256
WIRE_CACHE_ENTRIES = 20000
RCODE_NAMES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}

_QTYPE_NAMES = dnslib.QTYPE.forward  # int → name


def parse_bind(text: str, default_port: int = 53) -> tuple[str, int]:
    """"0.0.0.0:10053", "[::]:53", "127.0.0.1" → (host, port); ValueError otherwise."""
    t = text.strip()
    if t.startswith("["):
        if "]" not in t:
            raise ValueError(f"{t!r}: unbalanced [")
        host, _, rest = t[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else default_port
    elif t.count(":") == 1:
        host, p = t.split(":")
        port = int(p)
    else:
        host, port = t, default_port
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError as e:
        raise ValueError(f"DNS bind address {text!r}: not an IP address[:port]") from e
    if not 0 <= port < 65536:
        raise ValueError(f"DNS bind address {text!r}: port out of range")
    return host, port


# Who may ask (CoreDNS is only reachable inside the cluster network; a DNS server that
# forwards must not be an open resolver on a public interface): loopback, the private
# and CGNAT ranges (pod, service and node networks), IPv6 ULA and link-local.
DEFAULT_ALLOWED_CLIENTS = ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                           "100.64.0.0/10", "::1/128", "fc00::/7", "fe80::/10")


class ClientFilter:
    """Which source addresses get answers; others are dropped (no reflection)."""

    def __init__(self, networks: Iterable[str] = DEFAULT_ALLOWED_CLIENTS) -> None:
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]
        self._seen: dict[str, bool] = {}

    def allowed(self, host: str) -> bool:
        v = self._seen.get(host)
        if v is None:
            try:
                ip = ipaddress.ip_address(host.split("%", 1)[0])
            except ValueError:
                return False
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            v = any(ip in n for n in self.networks)
            if len(self._seen) >= 65536:
                self._seen.clear()
            self._seen[host] = v
        return v


class DNSStats:
    """Answers by rcode, answer-cache and forward-cache hits: a Prometheus collector."""

    def __init__(self) -> None:
        self.rcodes: dict[int, int] = {}
        self.wire_hits = 0
        self.forwarded = 0
        self.refused_busy = 0
        self.dropped_clients = 0
        self.forwarder: Forwarder | None = None

    def count(self, rcode: int) -> None:
        self.rcodes[rcode] = self.rcodes.get(rcode, 0) + 1

    def collect(self) -> Iterator[Any]:
        c = CounterMetricFamily("fleet_dns_responses", "Cluster DNS responses by rcode.",
                                labels=["rcode"])
        for rcode, n in sorted(self.rcodes.items()):
            c.add_metric([RCODE_NAMES.get(rcode, str(rcode))], n)
        yield c
        yield CounterMetricFamily("fleet_dns_answer_cache_hits",
                                  "Cluster answers served from the answer cache.",
                                  value=self.wire_hits)
        yield CounterMetricFamily("fleet_dns_forwarded_requests",
                                  "Questions sent to the forwarder (its cache included).",
                                  value=self.forwarded)
        yield CounterMetricFamily("fleet_dns_dropped_clients",
                                  "Queries dropped because their source is not an allowed client.",
                                  value=self.dropped_clients)
        yield CounterMetricFamily("fleet_dns_forward_refused",
                                  "Questions refused because too many forwards were in flight.",
                                  value=self.refused_busy)
        fw = self.forwarder
        if fw is not None:
            yield CounterMetricFamily("fleet_dns_forward_cache_hits", "Forward cache hits.",
                                      value=fw.cache.hits)
            yield CounterMetricFamily("fleet_dns_forward_cache_misses", "Forward cache misses.",
                                      value=fw.cache.misses)
            yield CounterMetricFamily("fleet_dns_forward_failures",
                                      "Forwarded questions no upstream answered (SERVFAIL).",
                                      value=fw.failures)


def error_reply(data: bytes, rcode: int) -> bytes | None:
    """A header-only answer echoing the query's id and opcode (FORMERR for what does not
    parse); None when there is not even a header, or the packet is itself a response."""
    if len(data) < 12 or data[2] & 0x80:
        return None
    flags = 0x8000 | (data[2] & 0x79) << 8 | rcode  # QR, opcode and RD copied; RA off
    return data[:2] + struct.pack("!HHHHH", flags, 0, 0, 0, 0)


def to_dnslib(rr: RR) -> dnslib.RR:
    d = rr.data
    t = rr.rtype
    rdata: Any
    if t == "A":
        rdata = dnslib.A(d[0])
    elif t == "AAAA":
        rdata = dnslib.AAAA(d[0])
    elif t == "SRV":
        rdata = dnslib.SRV(priority=d[0], weight=d[1], port=d[2], target=d[3])
    elif t == "SOA":
        rdata = dnslib.SOA(d[0], d[1], d[2:])
    elif t == "TXT":
        rdata = dnslib.TXT(d[0])
    else:
        rdata = getattr(dnslib, t)(d[0])
    return dnslib.RR(rr.name, getattr(dnslib.QTYPE, t), ttl=rr.ttl, rdata=rdata)


@dataclass
class _Query:
    """A parsed question waiting for its slow (forwarded) answer."""

    request: dnslib.DNSRecord
    limit: int | None  # UDP size limit, None over TCP
    edns: bool
    answer: Answer | None = None  # a local answer with a CNAME to chase


class DNSHandler:
    """Turns one query's bytes into the answer's bytes (transport-independent)."""

    def __init__(self, records: ClusterRecords, forwarder: Forwarder | None = None,
                 stats: DNSStats | None = None, clients: ClientFilter | None = None) -> None:
        self.records = records
        self.clients = clients  # None: everyone
        self.forwarder = forwarder
        self.stats = stats or DNSStats()
        self.stats.forwarder = forwarder
        self._gen = -1
        # Answer caches (TCP, UDP): query key → (header after the id, tail, rcode).
        self._wire: tuple[dict[bytes, tuple[bytes, bytes, int]], ...] = ({}, {})
        # In front of those, by the query's exact bytes after its id (TCP, UDP):
        # → (the reply after its id, rcode).  The UDP loop reads it directly.
        self.exact: tuple[dict[bytes, tuple[bytes, int]], ...] = ({}, {})

    # -- the fast, synchronous path ------------------------------------------------------
    def refresh(self) -> None:
        """Empty the answer caches if the records changed since they were filled."""
        if self.records.generation != self._gen:
            self._gen = self.records.generation
            for c in (*self._wire, *self.exact):
                c.clear()

    def quick(self, data: bytes, udp: bool) -> bytes | _Query | None:
        """The answer's bytes, a `_Query` that needs `slow()`, or None (drop)."""
        data = bytes(data)
        self.refresh()
        exact = self.exact[udp]
        hit2 = exact.get(data[2:])
        if hit2 is not None:
            self.stats.wire_hits += 1
            self.stats.count(hit2[1])
            return data[:2] + hit2[0]
        cache = self._wire[udp]
        plain = parse_plain(data)
        reply: bytes | _Query | None = None
        if plain is not None:
            hit = cache.get(plain.key)
            if hit is not None:
                self.stats.wire_hits += 1
                self.stats.count(hit[2])
                reply = data[:2] + hit[0] + data[12:plain.qend] + hit[1]
                self._remember(exact, data, reply, hit[2])
                return reply
        try:
            if plain is not None and plain.qclass == dnslib.CLASS.IN:
                reply = self._plain(data, udp, plain, cache)
                if reply is not None:
                    return reply
            return self._answer(data, udp)
        except ValueError as e:  # a stored name that cannot go on the wire
            log.warning("cluster DNS: cannot answer: %s", e)
            return self._error(data, SERVFAIL)
        except Exception:
            log.exception("cluster DNS: answering a query failed")
            return self._error(data, SERVFAIL)

    @staticmethod
    def _remember(exact: dict[bytes, tuple[bytes, int]], data: bytes, reply: bytes, rcode: int) -> None:
        if len(exact) >= WIRE_CACHE_ENTRIES:
            exact.clear()
        exact[data[2:]] = (reply[2:], rcode)

    def _plain(self, data: bytes, udp: bool, plain: Plain,
               cache: dict[bytes, tuple[bytes, bytes, int]]) -> bytes | None:
        """A local answer built by hand (fleet.network.dns_wire) and cached; None: not
        local (forwarded, chased) or not plain enough — dnslib's path takes it."""
        name = qname(data, plain)
        if name is None:
            return None
        ans = self.records.answer(name, plain.type_name)
        if ans.forward or ans.chase:
            return None
        limit = None
        if udp:
            limit = UDP_PLAIN_LIMIT if plain.edns is None else max(UDP_PLAIN_LIMIT, min(plain.edns, UDP_MAX_LIMIT))
        head, tail = encode(data, plain, name, ans, limit, EDNS_SIZE)
        if len(cache) >= WIRE_CACHE_ENTRIES:
            cache.clear()
        cache[plain.key] = (head, tail, ans.rcode)
        self.stats.count(ans.rcode)
        reply = data[:2] + head + data[12:plain.qend] + tail
        self._remember(self.exact[udp], data, reply, ans.rcode)
        return reply

    def _error(self, data: bytes, rcode: int) -> bytes | None:
        reply = error_reply(data, rcode)
        if reply is not None:
            self.stats.count(rcode)
        return reply

    def _answer(self, data: bytes, udp: bool) -> bytes | _Query | None:
        """dnslib's path: anything not plain, forwarded questions, and malformed input."""
        if len(data) < 12 or data[2] & 0x80:
            return None
        try:
            req = dnslib.DNSRecord.parse(data)
        except Exception:  # dnslib raises DNSError, and sometimes others, on junk
            return self._error(data, FORMERR)
        if req.header.opcode != 0:
            return self._error(data, NOTIMP)
        if len(req.questions) != 1:
            return self._error(data, FORMERR)
        edns = None
        for rr in req.ar:
            if rr.rtype == dnslib.QTYPE.OPT:
                edns = rr
        limit: int | None = None
        if udp:
            limit = UDP_PLAIN_LIMIT if edns is None else max(UDP_PLAIN_LIMIT, min(edns.rclass, UDP_MAX_LIMIT))
        q = req.q
        if q.qclass != dnslib.CLASS.IN:
            return self._pack(req, REFUSED, (), (), (), limit, edns is not None, aa=False)
        ans = self.records.answer(str(q.qname), _QTYPE_NAMES.get(q.qtype, str(q.qtype)))
        if ans.forward or ans.chase:
            return _Query(req, limit, edns is not None, ans if ans.chase else None)
        return self._pack(req, ans.rcode, [to_dnslib(r) for r in ans.answer],
                          [to_dnslib(r) for r in ans.authority],
                          [to_dnslib(r) for r in ans.additional], limit, edns is not None)

    def _pack(self, req: dnslib.DNSRecord, rcode: int, answer: Any, authority: Any,
              additional: Any, limit: int | None, edns: bool, aa: bool = True) -> bytes:
        h = req.header
        r = dnslib.DNSRecord(dnslib.DNSHeader(id=h.id, qr=1, aa=int(aa), ra=1, rd=h.rd, rcode=rcode),
                             q=req.q)
        r.rr = list(answer)
        r.auth = list(authority)
        r.ar = list(additional)
        if edns:
            r.add_ar(dnslib.EDNS0(udp_len=EDNS_SIZE))
        wire = bytes(r.pack())
        if limit is not None and len(wire) > limit:
            t = dnslib.DNSRecord(dnslib.DNSHeader(id=h.id, qr=1, aa=int(aa), ra=1, rd=h.rd, tc=1,
                                                  rcode=rcode), q=req.q)
            if edns:
                t.add_ar(dnslib.EDNS0(udp_len=EDNS_SIZE))
            wire = bytes(t.pack())
        self.stats.count(rcode)
        return wire

    # -- the slow path: upstream resolvers ----------------------------------------------
    def busy(self) -> bool:
        return self.forwarder is not None and self.forwarder.busy()

    def refuse(self, query: _Query) -> bytes:
        self.stats.refused_busy += 1
        return self._pack(query.request, REFUSED, (), (), (), query.limit, query.edns, aa=False)

    async def slow(self, query: _Query) -> bytes:
        req = query.request
        if query.answer is not None:  # an ExternalName: the CNAME, then its target's records
            ans = query.answer
            cname = [to_dnslib(r) for r in ans.answer]
            assert ans.chase is not None
            res = await self._forward(ans.chase, req.q.qtype)
            rcode = res.rcode if res.rcode in (NOERROR, 3) else NOERROR
            return self._pack(req, rcode, cname + res.answer, res.authority, [], query.limit,
                              query.edns)
        res = await self._forward(str(req.q.qname), req.q.qtype)
        return self._pack(req, res.rcode, res.answer, res.authority, res.additional,
                          query.limit, query.edns, aa=False)

    async def _forward(self, qname: str, qtype: int) -> Resolved:
        if self.forwarder is None or not self.forwarder.upstreams:
            return Resolved(REFUSED)
        self.stats.forwarded += 1
        return await self.forwarder.resolve(qname, qtype)


# -- listeners ------------------------------------------------------------------------------

async def serve_udp(handler: DNSHandler, sock: socket.socket) -> None:
    """Answer datagrams on a bound non-blocking socket until cancelled."""
    async with trio.open_nursery() as nursery:
        while True:
            await trio.lowlevel.wait_readable(sock)
            # The records change only between batches (informer tasks), so the
            # answer cache is checked once per batch and read inline.
            handler.refresh()
            clients = handler.clients
            exact = handler.exact[1]
            rcodes = handler.stats.rcodes
            hits = 0
            for _ in range(UDP_BATCH):
                try:
                    data, addr = sock.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:  # ICMP errors surface here on some kernels
                    log.debug("cluster DNS: udp receive: %s", e)
                    continue
                if clients is not None and not clients.allowed(addr[0]):
                    handler.stats.dropped_clients += 1
                    continue
                hit = exact.get(data[2:])
                if hit is not None:
                    hits += 1
                    rcodes[hit[1]] = rcodes.get(hit[1], 0) + 1
                    try:
                        sock.sendto(data[:2] + hit[0], addr)
                    except OSError:
                        pass
                    continue
                reply = handler.quick(data, True)
                if isinstance(reply, _Query):
                    if handler.busy():
                        _send(sock, handler.refuse(reply), addr)
                    else:
                        nursery.start_soon(_udp_slow, handler, sock, reply, addr)
                elif reply is not None:
                    _send(sock, reply, addr)
            handler.stats.wire_hits += hits
            await trio.lowlevel.checkpoint()


def _send(sock: socket.socket, data: bytes, addr: Any) -> None:
    try:
        sock.sendto(data, addr)
    except OSError:  # a full buffer or a vanished client: UDP may drop
        pass


async def _udp_slow(handler: DNSHandler, sock: socket.socket, query: _Query, addr: Any) -> None:
    try:
        reply = await handler.slow(query)
    except Exception:
        log.exception("cluster DNS: forwarding failed")
        reply = handler._pack(query.request, SERVFAIL, (), (), (), query.limit, query.edns)
    _send(sock, reply, addr)


class _TCPServer:
    def __init__(self, handler: DNSHandler) -> None:
        self.handler = handler
        self.connections = 0

    async def __call__(self, stream: trio.SocketStream) -> None:
        clients = self.handler.clients
        if self.connections >= MAX_TCP_CONNECTIONS or (
                clients is not None and not clients.allowed(str(stream.socket.getpeername()[0]))):
            if self.connections < MAX_TCP_CONNECTIONS:
                self.handler.stats.dropped_clients += 1
            await stream.aclose()
            return
        self.connections += 1
        try:
            async with stream:
                while True:
                    with trio.move_on_after(TCP_IDLE_TIMEOUT) as idle:
                        head = await read_exactly(stream, 2)
                        data = await read_exactly(stream, int.from_bytes(head, "big")) if head else None
                    if idle.cancelled_caught or not data:
                        return
                    reply = self.handler.quick(data, False)
                    if isinstance(reply, _Query):
                        reply = (self.handler.refuse(reply) if self.handler.busy()
                                 else await self.handler.slow(reply))
                    if reply is None:
                        return  # not a query: close, as for a stream out of sync
                    await stream.send_all(len(reply).to_bytes(2, "big") + reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self.connections -= 1


def _bind_pair(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket bound to the same port (port 0: one the kernel picks for
    UDP and free for TCP too, tried a few times)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for attempt in range(20):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        tcp = socket.socket(family, socket.SOCK_STREAM)
        try:
            udp.bind((host, port))
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((host, udp.getsockname()[1]))
            return udp, tcp
        except OSError as e:
            udp.close()
            tcp.close()
            if port != 0 or e.errno != errno.EADDRINUSE or attempt == 19:
                raise
    raise AssertionError("unreachable")


async def serve(handler: DNSHandler, host: str, port: int, *,
                task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on host:port over UDP and TCP; reports (host, port) once both are bound."""
    udp, tcp_sock = _bind_pair(host, port)
    try:
        udp.setblocking(False)
        port = udp.getsockname()[1]
        tcp = trio.socket.from_stdlib_socket(tcp_sock)
        tcp.listen(128)
        listener = trio.SocketListener(tcp)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_udp, handler, udp)
            nursery.start_soon(trio.serve_listeners, _TCPServer(handler), [listener])
            log.info("cluster DNS listening on %s port %d (udp, tcp)", host, port)
            task_status.started((host, port))
    finally:
        udp.close()
        tcp_sock.close()


__all__ = ["DEFAULT_ALLOWED_CLIENTS", "ClientFilter", "DNSHandler", "DNSStats", "error_reply",
           "parse_bind", "serve", "serve_udp", "to_dnslib"]
