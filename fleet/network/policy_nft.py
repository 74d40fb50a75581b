"""Render one pod's `PodRules` as the nftables table the agent loads in the pod's netns.

This module owns the text of table `inet fleet-policy` (nothing else: the rules' meaning
is `fleet.network.policy`, loading them is the agent's through `fleet.network.nft`).
The table lives inside the *pod's* network namespace, so `input` is the pod's ingress
and `output` its egress, and no rule needs to name the pod's own address or interface.

    table inet fleet-policy {
      set always_allow  { type ipv4_addr; flags interval; ... }   # the node, the gateway
      set ingress_any   { type ipv4_addr; flags interval; ... }   # peers allowed every port
      set ingress_ports { type ipv4_addr . inet_proto . inet_service; flags interval; ... }
      chain input { type filter hook input priority filter; policy drop;
        ct state established,related accept
        ct state invalid drop
        iif "lo" accept
        ip saddr @always_allow accept
        ip saddr @ingress_any accept
        ip saddr . meta l4proto . th dport @ingress_ports accept }
      (egress: the same with `output`, `ip daddr`, `oif`)
    }

Why sets: a new connection costs one lookup per set however many peers and ports the
policies name (nftables' interval sets are trees / pipapo tables), and established
traffic is accepted by the first rule before any lookup — so the cost of 200 policies
is in building the sets, not in forwarding.  The kernel refuses overlapping elements
in an interval set ("File exists"), so elements are first cut into disjoint boxes
(`disjoint_elements`).

What is dropped under isolation: anything no set admits — including ICMP (ping) and
other protocols, unless a rule without ports admits the peer (`*_any`: every protocol),
and all IPv6 traffic (the cluster is IPv4; IPv6 CIDRs in the rules are skipped, not an
error).  A non-isolated direction gets a chain with `policy accept` and no rules.
Traffic to and from the node's own addresses and the pod's gateway (`always_allow`)
is always allowed, as Kubernetes requires for kubelet probes.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import Counter
from collections.abc import Iterable, Sequence

from fleet.network.nft import replace_table_script
from fleet.network.policy import Allow, PodRules

FAMILY = "inet"
TABLE = "fleet-policy"
_PROTO = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}

# An IPv4 interval [first, last] as integers, and a port interval.
_Span = tuple[int, int]


@functools.lru_cache(maxsize=65536)
def _v4_span(cidr: str) -> _Span | None:
    """`cidr` (or a bare address) as an integer interval; None for IPv6 or garbage."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return None
    if net.version != 4:
        return None
    return int(net.network_address), int(net.broadcast_address)


def _merge(spans: Iterable[_Span]) -> list[_Span]:
    """Sorted, disjoint, non-adjacent union of `spans`."""
    out: list[_Span] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def merged_addresses(cidrs: Iterable[str]) -> list[_Span]:
    """The IPv4 part of `cidrs` as disjoint intervals (IPv6 dropped)."""
    return _merge(s for c in cidrs if (s := _v4_span(c)) is not None)


def disjoint_elements(allows: Iterable[Allow]) -> list[tuple[_Span, str, _Span]]:
    """The (address interval, protocol, port interval) boxes the port-limited `allows`
    cover, cut into disjoint boxes (an interval set refuses overlaps).

    A sweep over the address axis per protocol: between two consecutive box edges the
    set of covering port ranges is constant; merge it, and join neighbouring address
    segments whose merged ports are equal.
    """
    boxes: dict[str, list[tuple[_Span, _Span]]] = {}
    for a in allows:
        if not a.ports:
            continue
        spans = merged_addresses(a.cidrs)
        for pr in a.ports:
            if pr.protocol not in _PROTO or pr.first > pr.last:
                continue
            for s in spans:
                boxes.setdefault(pr.protocol, []).append((s, (max(pr.first, 0), min(pr.last, 65535))))
    out: list[tuple[_Span, str, _Span]] = []
    for proto in sorted(boxes):
        events: dict[int, list[tuple[int, _Span]]] = {}
        for (lo, hi), ports in boxes[proto]:
            events.setdefault(lo, []).append((1, ports))
            events.setdefault(hi + 1, []).append((-1, ports))
        active: Counter[_Span] = Counter()
        segments: list[tuple[_Span, tuple[_Span, ...]]] = []
        points = sorted(events)
        for i, at in enumerate(points):
            for delta, ports in events[at]:
                active[ports] += delta
                if active[ports] == 0:
                    del active[ports]
            if not active or i + 1 == len(points):
                continue
            merged = tuple(_merge(active))
            seg = (at, points[i + 1] - 1)
            if segments and segments[-1][1] == merged and segments[-1][0][1] + 1 == seg[0]:
                segments[-1] = ((segments[-1][0][0], seg[1]), merged)
            else:
                segments.append((seg, merged))
        out.extend((seg, proto, p) for seg, ports in segments for p in ports)
    return out


def _addr(span: _Span) -> str:
    lo, hi = span
    first, last = ipaddress.IPv4Address(lo), ipaddress.IPv4Address(hi)
    if lo == hi:
        return str(first)
    nets = list(ipaddress.summarize_address_range(first, last))
    return str(nets[0]) if len(nets) == 1 else f"{first}-{last}"


def _port(span: _Span) -> str:
    return str(span[0]) if span[0] == span[1] else f"{span[0]}-{span[1]}"


def _set(name: str, typ: str, elements: Sequence[str]) -> str:
    body = f"  set {name} {{\n    type {typ}\n    flags interval\n"
    if elements:
        body += "    elements = {\n" + "".join(f"      {e},\n" for e in elements) + "    }\n"
    return body + "  }\n"


def _addr_set(name: str, spans: Sequence[_Span]) -> str:
    return _set(name, "ipv4_addr", [_addr(s) for s in spans])


def _chain(name: str, hook: str, policy: str, rules: Sequence[str]) -> str:
    lines = [f"  chain {name} {{", f"    type filter hook {hook} priority filter; policy {policy};"]
    lines += [f"    {r}" for r in rules]
    return "\n".join(lines) + "\n  }\n"


def _direction(rules: Sequence[Allow], *, name: str, hook: str, isolated: bool,
               always: bool) -> tuple[str, str]:
    """(sets, chain) of one direction."""
    if not isolated:
        return "", _chain(name, hook, "accept", [])
    d = "ingress" if hook == "input" else "egress"
    addr = "ip saddr" if hook == "input" else "ip daddr"
    iface = 'iif "lo"' if hook == "input" else 'oif "lo"'
    any_spans = merged_addresses(c for a in rules if not a.ports for c in a.cidrs)
    elements = [f"{_addr(s)} . {_PROTO[p]} . {_port(ports)}" for s, p, ports in disjoint_elements(rules)]
    sets = (_addr_set(f"{d}_any", any_spans)
            + _set(f"{d}_ports", "ipv4_addr . inet_proto . inet_service", elements))
    chain_rules = ["ct state established,related accept", "ct state invalid drop", f"{iface} accept"]
    if always:
        chain_rules.append(f"{addr} @always_allow accept")
    chain_rules += [f"{addr} @{d}_any accept", f"{addr} . meta l4proto . th dport @{d}_ports accept"]
    return sets, _chain(name, hook, "drop", chain_rules)


def render(rules: PodRules, *, always_allow: Sequence[str] = ()) -> str:
    """A whole `nft -f` script replacing table `inet fleet-policy` (in the pod's netns)
    with one enforcing `rules`; `always_allow` = the node's addresses and the pod's
    gateway (addresses or CIDRs; IPv6 ones are skipped)."""
    always = merged_addresses(always_allow)
    in_sets, in_chain = _direction(rules.ingress, name="input", hook="input",
                                   isolated=rules.ingress_isolated, always=bool(always))
    out_sets, out_chain = _direction(rules.egress, name="output", hook="output",
                                     isolated=rules.egress_isolated, always=bool(always))
    head = _addr_set("always_allow", always) if always else ""
    return replace_table_script(FAMILY, TABLE, head + in_sets + out_sets + in_chain + out_chain)


def deny_all(*, always_allow: Sequence[str] = ()) -> str:
    """Strict mode's fail-closed table: both directions drop everything but loopback and
    `always_allow` (the node's addresses), established connections included."""
    always = merged_addresses(always_allow)
    head = _addr_set("always_allow", always) if always else ""
    chains = ""
    for hook, addr, iface in (("input", "ip saddr", 'iif "lo"'), ("output", "ip daddr", 'oif "lo"')):
        rules = [f"{iface} accept"] + ([f"{addr} @always_allow accept"] if always else [])
        chains += _chain(hook, hook, "drop", rules)
    return replace_table_script(FAMILY, TABLE, head + chains)


def delete_script() -> str:
    """Text that removes the table (idempotent): the pod is back to no filtering."""
    return f"table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"


__all__ = ["FAMILY", "TABLE", "delete_script", "deny_all", "disjoint_elements", "render"]
