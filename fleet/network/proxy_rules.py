"""The node's Service dataplane as data: Services + EndpointSlices → one nftables table.

This is the pure half of Fleet's service proxy (kube-proxy's nftables mode, KEP-3866,
in our own words); `fleet.network.proxy_diff` turns two renderings into one atomic
`nft -f` transaction and `fleet.network.service_proxy` is the thin Trio loop around
both.  Nothing here does I/O, so every decision is tested table-driven.

The table (`ip fleet-proxy` unless configured; IPv4 only) looks like this:

    base chains (hooked)                       regular chains
    nat-prerouting   dstnat  → jump services   services: ip daddr . l4proto . dport vmap @service-ips
    nat-output       dstnat  → jump services             fib daddr local … l4proto . dport vmap @service-nodeports
    nat-postrouting  srcnat  → jump masquerading          (or ip daddr @nodeport-ips … with nodeport_addresses=primary)
    filter-input     dstnat-10 ct new → service-endpoints-check (vmap @no-endpoint-services / -nodeports)
    filter-forward   dstnat-10 ct new → service-endpoints-check, cluster-ips-check
    filter-output    dstnat-10 ct new → service-endpoints-check
    filter-output-post-dnat dstnat+10 ct new → cluster-ips-check
    mark-for-masquerade: set the masquerade mark   masquerading: masquerade marked packets
    reject-chain: tcp reset / ICMP port-unreachable

and per service port (`HASH-ns/name/proto/portname`, HASH = 8 base32 characters of
sha256 of the rest, so names are stable and one service's change touches only its own):

* `service-…`  (Cluster policy) — masquerade-mark traffic to the ClusterIP from outside
  the cluster CIDR, then `numgen random mod N vmap { 0 : goto endpoint-…, … }`;
  with sessionAffinity ClientIP first `ip saddr @affinity-… goto endpoint-…` per endpoint;
* `local-…`    (Local policy) — the same over this node's endpoints only;
* `external-…` (NodePort, externalIPs, LoadBalancer ingress) — masquerade-mark and go to
  `service-…` for externalTrafficPolicy Cluster; for Local, pod and node-local sources
  short-circuit to `service-…` and everything else goes to `local-…` unmarked (client
  source IP kept), or is dropped by the no-endpoint map when there is no local endpoint;
* `endpoint-…` — mark for masquerade when the source is the endpoint itself (hairpin),
  `update @affinity-… { ip saddr }` with affinity, `dnat to IP:PORT`;
* sets `affinity-…` (`flags dynamic,timeout`) — ClientIP affinity per endpoint.

Which endpoints (kube-proxy's CategorizeEndpoints, in `fleet.network.proxy_objects`,
which also reads the objects): ready ones (`conditions.ready`
absent counts as ready); when a policy has none, the serving-and-terminating ones.
An EndpointSlice port is the service port's when the names (and protocols) match.
A Service without any usable endpoint has its addresses in `no-endpoint-services`
(→ `goto reject-chain`, so clients get "connection refused" at once); one whose Local
policy finds no endpoint on this node gets `drop` there.  Headless, ExternalName and
IP-less Services are not proxied.  Anything malformed (a bad IP, protocol, port) is
skipped, never raised: one bad object must not take the node's rules down.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.network.proxy_conntrack import UdpPort
from fleet.network.proxy_objects import (
    Endpoint,
    ServicePort,
    categorize,
    ipv4_or_none,
    object_meta,
    service_ports,
    slice_endpoints,
    slices_by_service,
)

log = logging.getLogger(__name__)

DEFAULT_TABLE = "fleet-proxy"
DEFAULT_MASQUERADE_MARK = 0x4000

# Fixed object names (kube-proxy's, for operators who know its table).
SERVICES_CHAIN = "services"
MASQUERADING_CHAIN = "masquerading"
MARK_MASQ_CHAIN = "mark-for-masquerade"
ENDPOINTS_CHECK_CHAIN = "service-endpoints-check"
CLUSTER_IPS_CHECK_CHAIN = "cluster-ips-check"
REJECT_CHAIN = "reject-chain"
SERVICE_IPS_MAP = "service-ips"
SERVICE_NODEPORTS_MAP = "service-nodeports"
NO_ENDPOINT_SERVICES_MAP = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS_MAP = "no-endpoint-nodeports"
CLUSTER_IPS_SET = "cluster-ips"
NODEPORT_IPS_SET = "nodeport-ips"

# Clashes already logged (each once per process, not once per sync).
_reported_clashes: set[tuple[str, str, str]] = set()

_NAME_BASE_MAX = 240  # nftables allows 256 characters; leave room for the prefix
_DSTNAT = -100
_SRCNAT = 100


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Chain:
    """A chain: its rules in order, and for base chains the hook declaration."""

    rules: tuple[str, ...] = ()
    hook: str | None = None  # e.g. "type nat hook prerouting priority -100; policy accept;"


@dataclass(frozen=True)
class SetDecl:
    """A named set or map: `kind` is "set" or "map", `body` its declaration."""

    kind: str
    body: str


@dataclass
class Table:
    """One rendered nftables table.  `elements[name]` maps key → value ("" for sets)."""

    name: str = DEFAULT_TABLE
    family: str = "ip"
    chains: dict[str, Chain] = field(default_factory=dict)
    sets: dict[str, SetDecl] = field(default_factory=dict)
    elements: dict[str, dict[str, str]] = field(default_factory=dict)

    def rule_count(self) -> int:
        """Rules plus map/set elements: what `fleet_service_proxy_rules` reports."""
        return (sum(len(c.rules) for c in self.chains.values())
                + sum(len(e) for e in self.elements.values()))

    def normalized(self) -> Table:
        """The same table without empty element lists (a set's absent and empty
        element lists mean the same thing)."""
        t = self.copy()
        t.elements = {k: v for k, v in t.elements.items() if v}
        return t

    def copy(self) -> Table:
        return Table(self.name, self.family, dict(self.chains), dict(self.sets),
                     {k: dict(v) for k, v in self.elements.items()})


@dataclass(frozen=True)
class ProxyOptions:
    """What the renderer needs to know about the node and the cluster."""

    node_name: str = ""
    node_ips: tuple[str, ...] = ()
    cluster_cidr: str | None = "10.42.0.0/16"
    service_cidr: str | None = "10.43.0.0/16"
    table: str = DEFAULT_TABLE
    masquerade_mark: int = DEFAULT_MASQUERADE_MARK
    #: Masquerade every packet to a ClusterIP, not only those from outside the cluster.
    masquerade_all: bool = False
    #: "all": NodePorts on every local address (`fib daddr type local`);
    #: "primary": only on `node_ips` (kube-proxy's --nodeport-addresses=primary).
    nodeport_addresses: str = "all"


# --------------------------------------------------------------------------- names


@functools.lru_cache(maxsize=1 << 16)
def hash_name(name: str) -> str:
    """`HASH-name`: 8 base32 characters of sha256(name) in front, truncated to fit."""
    # 5 bytes are exactly 8 base32 characters: the start of the whole digest's encoding.
    digest = base64.b32encode(hashlib.sha256(name.encode()).digest()[:5]).decode()
    out = f"{digest}-{name}"
    return out if len(out) <= _NAME_BASE_MAX else out[: _NAME_BASE_MAX - 3] + "..."


def service_chain(sp: ServicePort) -> str:
    return "service-" + hash_name(sp.key)


def local_chain(sp: ServicePort) -> str:
    return "local-" + hash_name(sp.key)


def external_chain(sp: ServicePort) -> str:
    return "external-" + hash_name(sp.key)


def endpoint_chain(sp: ServicePort, ep: Endpoint) -> str:
    return "endpoint-" + hash_name(f"{sp.key}__{ep.ip}/{ep.port}")


def affinity_set(sp: ServicePort, ep: Endpoint) -> str:
    return "affinity-" + hash_name(f"{sp.key}__{ep.ip}/{ep.port}")


def is_service_object(name: str) -> bool:
    """True for per-service chains and sets (they carry a "/"); the fixed ones do not."""
    return "/" in name


# --------------------------------------------------------------------------- rendering


def _base_table(opts: ProxyOptions) -> Table:
    """The fixed skeleton: base chains, helper chains, the maps and fixed sets."""
    mark = f"0x{opts.masquerade_mark:x}"
    hook = "type {t} hook {h} priority {p}; policy accept;".format
    t = Table(name=opts.table, family="ip")
    t.chains.update({
        "nat-prerouting": Chain((f"jump {SERVICES_CHAIN}",), hook(t="nat", h="prerouting", p=_DSTNAT)),
        "nat-output": Chain((f"jump {SERVICES_CHAIN}",), hook(t="nat", h="output", p=_DSTNAT)),
        "nat-postrouting": Chain((f"jump {MASQUERADING_CHAIN}",), hook(t="nat", h="postrouting", p=_SRCNAT)),
        # Filtering looks at the pre-DNAT address, so it runs just before dstnat...
        "filter-input": Chain((f"ct state new jump {ENDPOINTS_CHECK_CHAIN}",),
                              hook(t="filter", h="input", p=_DSTNAT - 10)),
        "filter-forward": Chain((f"ct state new jump {ENDPOINTS_CHECK_CHAIN}",
                                 f"ct state new jump {CLUSTER_IPS_CHECK_CHAIN}"),
                                hook(t="filter", h="forward", p=_DSTNAT - 10)),
        "filter-output": Chain((f"ct state new jump {ENDPOINTS_CHECK_CHAIN}",),
                               hook(t="filter", h="output", p=_DSTNAT - 10)),
        # ... except the ClusterIP check on output, which must see what DNAT left
        # alone: a packet still addressed to a ClusterIP matched no service port.
        "filter-output-post-dnat": Chain((f"ct state new jump {CLUSTER_IPS_CHECK_CHAIN}",),
                                         hook(t="filter", h="output", p=_DSTNAT + 10)),
        MARK_MASQ_CHAIN: Chain((f"meta mark set meta mark | {mark}",)),
        MASQUERADING_CHAIN: Chain((f"meta mark & {mark} == 0 return",
                                   f"meta mark set meta mark ^ {mark}",
                                   "masquerade fully-random")),
        REJECT_CHAIN: Chain(("meta l4proto tcp reject with tcp reset", "reject")),
    })
    if opts.nodeport_addresses == "primary":
        nodeport_match = f"ip daddr @{NODEPORT_IPS_SET}"
        t.sets[NODEPORT_IPS_SET] = SetDecl("set", "type ipv4_addr;")
        t.elements[NODEPORT_IPS_SET] = {ip: "" for ip in opts.node_ips if ipv4_or_none(ip)}
    else:
        nodeport_match = "fib daddr type local ip daddr != 127.0.0.0/8"
    t.chains[SERVICES_CHAIN] = Chain((
        f"ip daddr . meta l4proto . th dport vmap @{SERVICE_IPS_MAP}",
        f"{nodeport_match} meta l4proto . th dport vmap @{SERVICE_NODEPORTS_MAP}"))
    t.chains[ENDPOINTS_CHECK_CHAIN] = Chain((
        f"ip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES_MAP}",
        f"{nodeport_match} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS_MAP}"))
    check = [f"ip daddr @{CLUSTER_IPS_SET} reject"]
    if opts.service_cidr:
        # An address of the service range nobody was given: drop, as kube-proxy does.
        check.append(f"ip daddr {ipaddress.IPv4Network(opts.service_cidr)} drop")
    t.chains[CLUSTER_IPS_CHECK_CHAIN] = Chain(tuple(check))
    ip_key = "type ipv4_addr . inet_proto . inet_service : verdict;"
    port_key = "type inet_proto . inet_service : verdict;"
    for name, body in ((SERVICE_IPS_MAP, ip_key), (SERVICE_NODEPORTS_MAP, port_key),
                       (NO_ENDPOINT_SERVICES_MAP, ip_key), (NO_ENDPOINT_NODEPORTS_MAP, port_key)):
        t.sets[name] = SetDecl("map", body)
        t.elements[name] = {}
    t.sets[CLUSTER_IPS_SET] = SetDecl("set", "type ipv4_addr;")
    t.elements[CLUSTER_IPS_SET] = {}
    return t


def skeleton(table: Table) -> tuple[Any, ...]:
    """What a transaction cannot change in place: table identity, hooks, the fixed
    sets' declarations.  Two renderings with different skeletons need a full replace."""
    return (table.name, table.family,
            tuple(sorted((n, c.hook) for n, c in table.chains.items() if c.hook)),
            tuple(sorted((n, d) for n, d in table.sets.items() if not is_service_object(n))))


@dataclass(frozen=True)
class _Fragment:
    """What one service port adds to the table (reused while its inputs are unchanged)."""

    owner: str
    chains: tuple[tuple[str, Chain], ...]
    sets: tuple[tuple[str, SetDecl], ...]
    elements: tuple[tuple[str, str, str], ...]  # (map or set, key, value)


class _Builder:
    """Builds the fragment of one service port."""

    def __init__(self, opts: ProxyOptions, cluster_cidr: str | None) -> None:
        self.opts = opts
        self.chains: dict[str, list[str]] = {}
        self.sets: dict[str, SetDecl] = {}
        self.elements: list[tuple[str, str, str]] = []
        self.cluster_cidr = cluster_cidr

    def element(self, map_name: str, key: str, value: str, owner: str) -> None:
        self.elements.append((map_name, key, value))

    def chain(self, name: str) -> list[str]:
        return self.chains.setdefault(name, [])

    def dispatch(self, sp: ServicePort, chain: str, eps: Sequence[Endpoint]) -> None:
        rules = self.chain(chain)
        if sp.affinity_timeout is not None:
            for ep in eps:
                rules.append(f"ip saddr @{affinity_set(sp, ep)} goto {endpoint_chain(sp, ep)}")
        vmap = ", ".join(f"{i} : goto {endpoint_chain(sp, ep)}" for i, ep in enumerate(eps))
        rules.append(f"numgen random mod {len(eps)} vmap {{ {vmap} }}")

    def endpoint(self, sp: ServicePort, ep: Endpoint) -> None:
        name = endpoint_chain(sp, ep)
        if name in self.chains:
            return
        rules = self.chain(name)
        rules.append(f"ip saddr {ep.ip} jump {MARK_MASQ_CHAIN}")  # hairpin
        if sp.affinity_timeout is not None:
            aff = affinity_set(sp, ep)
            self.sets[aff] = SetDecl(
                "set", f"type ipv4_addr; flags dynamic,timeout; timeout {sp.affinity_timeout}s;")
            rules.append(f"update @{aff} {{ ip saddr }}")
        rules.append(f"meta l4proto {sp.protocol} dnat to {ep.addr}")

    def service_port(self, sp: ServicePort, endpoints: Sequence[Endpoint]) -> None:
        cat = categorize(endpoints, self.opts.node_name)
        owner = sp.key
        proto_port = f"{sp.protocol} . {sp.port}"
        svc_chain, loc_chain, ext_chain = service_chain(sp), local_chain(sp), external_chain(sp)
        uses_cluster = bool(cat.cluster) and (
            sp.uses_cluster_endpoints or (sp.externally_accessible and sp.external_local))
        uses_local = bool(cat.local) and sp.uses_local_endpoints
        internal_chain = loc_chain if sp.internal_local else svc_chain
        has_internal = cat.has_any and (not sp.internal_local or bool(cat.local))
        external_target = loc_chain if sp.external_local else svc_chain
        has_external = cat.has_any and (not sp.external_local or bool(cat.local))
        uses_external = cat.has_any and sp.externally_accessible
        if not cat.has_any:
            internal_verdict = external_verdict = f"goto {REJECT_CHAIN}"
        else:
            internal_verdict = external_verdict = "drop"

        self.element(CLUSTER_IPS_SET, sp.cluster_ip, "", owner)
        key = f"{sp.cluster_ip} . {proto_port}"
        if has_internal:
            self.element(SERVICE_IPS_MAP, key, f"goto {internal_chain}", owner)
            masq = f"ip daddr {sp.cluster_ip} {sp.protocol} dport {sp.port}"
            if self.opts.masquerade_all:
                self.chain(internal_chain).append(f"{masq} jump {MARK_MASQ_CHAIN}")
            elif self.cluster_cidr:
                # Off-cluster clients reaching a ClusterIP (a route to the service
                # range through this node): the reply must come back through us.
                self.chain(internal_chain).append(
                    f"{masq} ip saddr != {self.cluster_cidr} jump {MARK_MASQ_CHAIN}")
        else:
            self.element(NO_ENDPOINT_SERVICES_MAP, key, internal_verdict, owner)
        for ip in (*sp.external_ips, *sp.lb_ips):
            key = f"{ip} . {proto_port}"
            if uses_external:
                self.element(SERVICE_IPS_MAP, key, f"goto {ext_chain}", owner)
            if not has_external:
                self.element(NO_ENDPOINT_SERVICES_MAP, key, external_verdict, owner)
        if sp.node_port:
            key = f"{sp.protocol} . {sp.node_port}"
            if uses_external:
                self.element(SERVICE_NODEPORTS_MAP, key, f"goto {ext_chain}", owner)
            if not has_external:
                self.element(NO_ENDPOINT_NODEPORTS_MAP, key, external_verdict, owner)

        if uses_external:
            rules = self.chain(ext_chain)
            if not sp.external_local:
                # Cluster policy may pick an endpoint on another node: masquerade so
                # the reply comes back through this node.
                rules.append(f"jump {MARK_MASQ_CHAIN}")
            else:
                if self.cluster_cidr:
                    # Pods reaching an external address behave as if they went out and
                    # came back in: no traffic policy applies to them.
                    rules.append(f"ip saddr {self.cluster_cidr} goto {svc_chain}")
                rules.append(f"fib saddr type local jump {MARK_MASQ_CHAIN}")
                rules.append(f"fib saddr type local goto {svc_chain}")
            if has_external:
                rules.append(f"goto {external_target}")
        if uses_cluster:
            self.dispatch(sp, svc_chain, cat.cluster)
            for ep in cat.cluster:
                self.endpoint(sp, ep)
        if uses_local:
            self.dispatch(sp, loc_chain, cat.local)
            for ep in cat.local:
                self.endpoint(sp, ep)
        if uses_external and sp.external_local and not uses_cluster:
            # The short-circuit rules above go to the Cluster chain; give them one even
            # when no Cluster policy uses it (both policies Local).
            if cat.cluster:
                self.dispatch(sp, svc_chain, cat.cluster)
                for ep in cat.cluster:
                    self.endpoint(sp, ep)
            else:
                self.chain(svc_chain).append(f"goto {REJECT_CHAIN}")

    def finish(self, owner: str) -> _Fragment:
        return _Fragment(owner, tuple((n, Chain(tuple(r))) for n, r in self.chains.items()),
                         tuple(self.sets.items()), tuple(self.elements))


def _merge(table: Table, frag: _Fragment) -> None:
    table.chains.update(frag.chains)
    table.sets.update(frag.sets)
    for map_name, key, value in frag.elements:
        elems = table.elements[map_name]
        if key in elems:
            if map_name == CLUSTER_IPS_SET:
                continue
            # Two Services claiming one address:port (a race the allocator lost, or
            # hand-made objects): the first in name order keeps it; nft would refuse
            # the whole transaction otherwise.
            if (map_name, key, frag.owner) not in _reported_clashes:
                _reported_clashes.add((map_name, key, frag.owner))
                log.warning("service proxy: %s %s of %s is taken; skipped", map_name, key, frag.owner)
            continue
        elems[key] = value


class Renderer:
    """`render` with a memory: the fragment of a service port whose Service and
    endpoints did not change since the previous rendering, and the endpoints of an
    EndpointSlice whose resourceVersion did not change, are reused, so a change
    costs about the work of the Services it touches (plus one pass over the rest)."""

    def __init__(self, opts: ProxyOptions) -> None:
        self.opts = opts
        self.cluster_cidr = (str(ipaddress.IPv4Network(opts.cluster_cidr))
                             if opts.cluster_cidr else None)
        self._fragments: dict[tuple[ServicePort, tuple[Endpoint, ...]], _Fragment] = {}
        self._parsed: dict[tuple[str, str, str, str], list[Endpoint]] = {}
        # Fragments by the identity of their inputs (service port + each slice's uid and
        # resourceVersion): an untouched Service costs a dict lookup, not a re-parse.
        self._by_revision: dict[tuple[Any, ...], _Fragment] = {}
        self._services: dict[tuple[str, str], list[ServicePort]] = {}
        #: The UDP service ports of the latest rendering with their endpoints, for the
        #: conntrack clean-up (`fleet.network.proxy_conntrack`).
        self.udp_ports: dict[tuple[str, str, str, str], UdpPort] = {}
        self._udp_by_revision: dict[tuple[Any, ...], UdpPort] = {}
        _base_table(opts)  # bad options fail here, not at the first render

    def _service_ports(self, svc: Mapping[str, Any],
                       seen: dict[tuple[str, str], list[ServicePort]]) -> list[ServicePort]:
        md = object_meta(svc)
        uid, rv = md.get("uid"), md.get("resourceVersion")
        if not (isinstance(uid, str) and uid and isinstance(rv, str) and rv):
            return service_ports(svc)
        got = self._services.get((uid, rv))
        if got is None:
            got = service_ports(svc)
        seen[(uid, rv)] = got
        return got

    def _slice_endpoints(self, es: Mapping[str, Any], sp: ServicePort,
                         parsed: dict[tuple[str, str, str, str], list[Endpoint]]) -> list[Endpoint]:
        md = object_meta(es)
        uid, rv = md.get("uid"), md.get("resourceVersion")
        if not (isinstance(uid, str) and uid and isinstance(rv, str) and rv):
            return slice_endpoints(es, sp.port_name, sp.protocol)  # hand-made: no identity
        key = (uid, rv, sp.port_name, sp.protocol)
        got = self._parsed.get(key)
        if got is None:
            got = slice_endpoints(es, sp.port_name, sp.protocol)
        parsed[key] = got
        return got

    def render(self, services: Iterable[Mapping[str, Any]],
               slices: Iterable[Mapping[str, Any]]) -> Table:
        """The whole desired table for these Services and EndpointSlices on this node."""
        table = _base_table(self.opts)
        by_svc = slices_by_service(slices)
        ports: list[ServicePort] = []
        services_seen: dict[tuple[str, str], list[ServicePort]] = {}
        for svc in services:
            try:
                ports.extend(self._service_ports(svc, services_seen))
            except (TypeError, ValueError, AttributeError) as e:  # one object never stops the node
                md = object_meta(svc) if isinstance(svc, Mapping) else {}
                log.warning("service proxy: skipping %s/%s: %r", md.get("namespace"), md.get("name"), e)
        ports.sort(key=lambda p: (p.namespace, p.name, p.protocol, p.port_name, p.port))
        seen: set[tuple[str, str, str, str]] = set()
        fragments: dict[tuple[ServicePort, tuple[Endpoint, ...]], _Fragment] = {}
        parsed: dict[tuple[str, str, str, str], list[Endpoint]] = {}
        by_revision: dict[tuple[Any, ...], _Fragment] = {}
        udp_ports: dict[tuple[str, str, str, str], UdpPort] = {}
        udp_by_revision: dict[tuple[Any, ...], UdpPort] = {}
        for sp in ports:
            ident = (sp.namespace, sp.name, sp.protocol, sp.port_name)
            if ident in seen:  # two ports with one name and protocol: invalid, keep the first
                continue
            seen.add(ident)
            mine = sorted(by_svc.get((sp.namespace, sp.name), []),
                          key=lambda s: str(object_meta(s).get("name") or ""))
            revisions = tuple((object_meta(es).get("uid"), object_meta(es).get("resourceVersion")) for es in mine)
            rev_key = (sp, revisions) if all(u and r for u, r in revisions) else None
            frag = self._by_revision.get(rev_key) if rev_key is not None else None
            udp = self._udp_by_revision.get(rev_key) if rev_key is not None else None
            if frag is None or (sp.protocol == "udp" and udp is None):
                found: dict[tuple[str, int], Endpoint] = {}
                for es in mine:
                    for e in self._slice_endpoints(es, sp, parsed):
                        found.setdefault((e.ip, e.port), e)
                key = (sp, tuple(sorted(found.values())))
                frag = self._fragments.get(key)
                if frag is None:
                    b = _Builder(self.opts, self.cluster_cidr)
                    b.service_port(sp, key[1])
                    frag = b.finish(sp.key)
                fragments[key] = frag
                if sp.protocol == "udp":
                    udp = UdpPort.of(sp, key[1])
            else:
                for uid, rv in revisions:  # keep their parsed endpoints for next time
                    pkey = (uid, rv, sp.port_name, sp.protocol)
                    if pkey in self._parsed:
                        parsed[pkey] = self._parsed[pkey]
            if rev_key is not None:
                by_revision[rev_key] = frag
            if udp is not None:
                udp_ports[ident] = udp
                if rev_key is not None:
                    udp_by_revision[rev_key] = udp
            _merge(table, frag)
        # Only what this rendering used is kept: memory follows the cluster's size.
        self._fragments, self._parsed, self._by_revision = fragments, parsed, by_revision
        self._services = services_seen
        self.udp_ports, self._udp_by_revision = udp_ports, udp_by_revision
        return table


def render(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
           opts: ProxyOptions) -> Table:
    """The whole desired table for these Services and EndpointSlices on this node."""
    return Renderer(opts).render(services, slices)


def render_text(table: Table) -> str:
    """The table in `nft list table` style (for humans, docs and debugging)."""
    lines = [f"table {table.family} {table.name} {{"]
    for name, decl in sorted(table.sets.items()):
        lines.append(f"  {decl.kind} {name} {{ {decl.body} }}")
    for name, chain in sorted(table.chains.items()):
        lines.append(f"  chain {name} {{")
        if chain.hook:
            lines.append(f"    {chain.hook}")
        lines += [f"    {r}" for r in chain.rules]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


__all__ = [
    "DEFAULT_TABLE",
    "Chain",
    "ProxyOptions",
    "Renderer",
    "SetDecl",
    "Table",
    "affinity_set",
    "endpoint_chain",
    "external_chain",
    "hash_name",
    "local_chain",
    "render",
    "render_text",
    "service_chain",
    "skeleton",
]
