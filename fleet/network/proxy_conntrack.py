"""Stale UDP conntrack entries after a service proxy sync: which to delete, and deleting them.

UDP has no connection to close, so conntrack keeps steering a client's flow (same source
address and port) to the endpoint its first datagram was DNATed to — after that endpoint
left the Service, until the entry times out (30 s, 120 s once "assured"), however
often the client sends.  Our nftables rules only see a flow's first packet.  kube-proxy
therefore deletes such entries after each sync (`pkg/proxy/conntrack`); this module does
the same, in two halves:

* `stale_flows(old, new)` — pure: from the UDP service ports (and their serving
  endpoints) the previous sync applied and the ones this sync applied, the `FlowFilter`s
  to delete.  The rules, as kube-proxy's (1.28-era, state-diff form; the first sync
  after a start reconciles as newer versions do, see `stale_flows`):
    - a serving endpoint of a UDP port went (removed, or no longer serving): flows sent
      to each of the port's frontends — ClusterIP:port, each externalIP:port and
      load-balancer IP:port — whose reply source is that endpoint's IP, and for a
      NodePort flows to *:nodePort with that reply source;
    - a UDP port goes from no serving endpoints to some: every flow to its frontends
      (those are the entries made while the port was rejecting; they were never DNATed
      and would keep bypassing the new endpoints).
  kube-proxy 1.32+ reconciles the whole table against the current state on every
  sync instead; the state diff deletes the same entries without a full dump per sync
  when nothing changed.
* `delete_flows(filters, netns)` — blocking, for a worker thread: dump the UDP entries of
  the namespace over netlink (pyroute2's `Conntrack`) and delete each one a filter
  matches (`matches`, pure).

`fleet.network.service_proxy.ServiceRules.sync` calls both after a successful sync.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleet.network.proxy_objects import Endpoint, ServicePort

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UdpPort:
    """One UDP service port as a sync applied it: its frontends and serving endpoints."""

    port: ServicePort
    serving: frozenset[tuple[str, int]]  # (ip, port) of every serving endpoint

    @classmethod
    def of(cls, sp: ServicePort, endpoints: Iterable[Endpoint]) -> UdpPort:
        return cls(sp, frozenset((e.ip, e.port) for e in endpoints if e.serving))

    def frontends(self) -> list[tuple[str, int]]:
        """Every address:port the port answers on (ClusterIP, externalIPs, LB IPs)."""
        sp = self.port
        return [(ip, sp.port) for ip in (sp.cluster_ip, *sp.external_ips, *sp.lb_ips)]


#: UDP ports by (namespace, service, protocol, port name).
UdpState = Mapping[tuple[str, str, str, str], UdpPort]


@dataclass(frozen=True)
class FlowFilter:
    """UDP conntrack entries to delete: original destination `orig_dst` (None: any
    address) and port `orig_dport`, and reply source `reply_src` (None: any) — except
    those whose reply source is in `keep` (the serving endpoints, for a reconcile)."""

    orig_dst: str | None
    orig_dport: int
    reply_src: str | None = None
    keep: frozenset[str] = frozenset()

    def __str__(self) -> str:  # conntrack(8) style, for logs
        parts = ["-p udp"]
        if self.orig_dst:
            parts.append(f"--orig-dst {self.orig_dst}")
        parts.append(f"--orig-port-dst {self.orig_dport}")
        if self.reply_src:
            parts.append(f"--reply-src {self.reply_src}")
        if self.keep:
            parts.append(f"(reply source not {','.join(sorted(self.keep))})")
        return " ".join(parts)


def stale_flows(old: UdpState | None, new: UdpState) -> list[FlowFilter]:
    """The conntrack deletions a sync from `old` to `new` calls for (sorted, no
    duplicates).  `old` None — the first sync after a start, nothing known of what the
    kernel's flows were built from — reconciles instead, as kube-proxy 1.32+ does on
    every sync: flows to a frontend of a UDP port whose reply source is not one of its
    serving endpoints (for a port with none, every flow to it: whatever answers is
    gone — kubernetes/kubernetes#139629 fixed the reconciler skipping those)."""
    out: set[FlowFilter] = set()
    if old is None:
        for after in new.values():
            keep = frozenset(ip for ip, _ in after.serving)
            out.update(FlowFilter(addr, port, keep=keep) for addr, port in after.frontends())
            if after.port.node_port:
                out.add(FlowFilter(None, after.port.node_port, keep=keep))
        return _sorted(out)
    for ident, before in old.items():
        after = new.get(ident)
        gone_ips = {ip for ip, _ in before.serving - (after.serving if after else frozenset())}
        if not gone_ips:
            continue
        # An endpoint served under the old frontends; a changed Service (an externalIP
        # dropped or added) may have flows to either.
        frontends = set(before.frontends()) | set(after.frontends() if after else ())
        node_ports = {p.port.node_port for p in (before, after) if p and p.port.node_port}
        for ip in gone_ips:  # conntrack knows the IP a flow went to, not the pod's port
            out.update(FlowFilter(addr, port, ip) for addr, port in frontends)
            out.update(FlowFilter(None, np, ip) for np in node_ports)
    for ident, after in new.items():
        before = old.get(ident)
        if after.serving and not (before and before.serving):
            out.update(FlowFilter(addr, port) for addr, port in after.frontends())
            if after.port.node_port:
                out.add(FlowFilter(None, after.port.node_port))
    return _sorted(out)


def _sorted(filters: Iterable[FlowFilter]) -> list[FlowFilter]:
    return sorted(filters, key=lambda f: (f.orig_dst or "", f.orig_dport, f.reply_src or "",
                                          sorted(f.keep)))


def matches(filters: Iterable[FlowFilter], orig_dst: str, orig_dport: int, reply_src: str) -> bool:
    """Whether a UDP entry (original destination address and port, reply source) is
    one of `filters`."""
    return any((f.orig_dst is None or f.orig_dst == orig_dst) and f.orig_dport == orig_dport
               and (f.reply_src is None or f.reply_src == reply_src) and reply_src not in f.keep
               for f in filters)


def _index(filters: Iterable[FlowFilter]) -> dict[int, list[FlowFilter]]:
    by_port: dict[int, list[FlowFilter]] = {}
    for f in filters:
        by_port.setdefault(f.orig_dport, []).append(f)
    return by_port


def delete_flows(filters: Iterable[FlowFilter], netns: str | None = None) -> int:
    """Delete the UDP conntrack entries `filters` match in `netns` (None: this thread's
    namespace); returns how many went.  Blocking: run it in a worker thread."""
    from pyroute2 import Conntrack
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    from fleet.network.netns import enter_netns

    by_port = _index(filters)
    if not by_port:
        return 0
    # pyroute2 opens its socket on first use, not in the constructor: the whole
    # conversation runs with the thread inside the namespace (it starts no threads).
    with enter_netns(netns):
        ct = Conntrack()
        try:
            doomed = []
            for entry in ct.dump_entries(tuple_orig=NFCTAttrTuple(proto=socket.IPPROTO_UDP)):
                orig, reply = entry.tuple_orig, entry.tuple_reply
                if orig.proto != socket.IPPROTO_UDP:
                    continue
                cands = by_port.get(orig.dport or 0)
                if cands and matches(cands, orig.daddr, orig.dport, reply.saddr):
                    doomed.append(orig)
            deleted = 0
            for orig in doomed:
                try:
                    ct.delete(orig)
                    deleted += 1
                except NetlinkError as e:
                    if e.code != errno.ENOENT:  # gone meanwhile (timed out): fine
                        raise
            return deleted
        finally:
            ct.close()


__all__ = ["FlowFilter", "UdpPort", "UdpState", "delete_flows", "matches", "stale_flows"]
