"""NetworkPolicy evaluation: which peers and ports one pod may talk to, as plain data.

This module owns the *meaning* of `networking.k8s.io/v1` NetworkPolicies, and nothing
else: it reads snapshots of the informer caches (`PolicyView`) and answers, for one pod,
`PodRules` — per direction, whether the pod is isolated and, if so, the union of what
the policies selecting it allow.  `fleet.network.policy_nft` renders that into the
nftables table the agent loads inside the pod's network namespace; the agent loop
(which watches, decides when to re-apply and records Events) lives elsewhere.  Pure:
no I/O, no clock, so hypothesis can check it against an independent reading of the
semantics (tests/unit/network/test_policy_properties.py).

The semantics, from the Kubernetes "Network Policies" concept page and the API
reference:

* A pod is non-isolated (everything allowed) for a direction until some policy *in its
  own namespace* selects it (`spec.podSelector`) with that direction in `policyTypes`.
  `policyTypes` left empty means `Ingress`, plus `Egress` if `spec.egress` has rules.
* An isolated direction allows only the union of the selecting policies' rules.  A rule
  allows traffic matching one of its peers *and* one of its ports; an empty/missing
  `from`/`to` means every peer, an empty/missing `ports` every port of every protocol.
* Peers: `podSelector` alone = pods of the policy's namespace; `namespaceSelector`
  alone = every pod of the matching namespaces; both in one peer = matching pods in
  matching namespaces; `ipBlock` = a CIDR minus its `except` CIDRs.  A pod is a peer
  through its `status.podIPs`; pods without IPs, host-network pods (their IP is the
  node's) and finished pods (Succeeded/Failed) contribute nothing.
* Ports: `protocol` (default TCP), a number with optional `endPort` (a range), a
  missing `port` (every port of that protocol), or a *named* port.  A named ingress port
  is resolved against the selected pod's own container ports; a named egress port
  against each destination pod's container ports, so it yields one (ip, port) element
  per destination pod.  A name that resolves nowhere allows nothing (a `problem`).
* Traffic to/from the pod's node is always allowed; that is the renderer's
  `always_allow`, not a rule here.

**Services (egress).** Inside the pod's netns, egress to a Service is seen with the
ClusterIP as destination — the node DNATs it to an endpoint only after the packet left
the pod.  So for egress, each rule also allows `(ClusterIP, service port, protocol)`
whenever it allows at least one ready endpoint of that port (EndpointSlices: the
endpoint's address, its `targetRef` pod's namespace/labels/container ports, the
endpoint port).  Caveat: this is decided per Service port, not per connection; when a
rule allows only *some* endpoints, a connection through the ClusterIP may be DNATed to
an endpoint the rule does not allow and still pass.  (Real Kubernetes implementations
filter after DNAT on the node; we filter in the pod, before it.)

Endpoints that are not pods (no `targetRef`, e.g. `kube-system/kube-dns`, whose
endpoint is the API server's DNS listener at port 10053) stand for a *pseudo-pod* in
the Service's namespace with labels = the Service's `spec.selector`, else its
`metadata.labels`, listening on the Service's own ports (numbers and names).  So the
usual "allow UDP/TCP 53 to pods labelled k8s-app=kube-dns in kube-system" policy
admits cluster DNS, and DNS is blocked when egress is isolated and no rule allows it.

Both address families are kept here (`allowed` compares like with like); the renderer
programs IPv4 only, which is what the cluster uses.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleet.api.errors import BadRequest
from fleet.api.selectors import LabelSelector, parsed_label_selector

PROTOCOLS = ("TCP", "UDP", "SCTP")
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"
ALL_V4 = "0.0.0.0/0"
ALL_V6 = "::/0"
MAX_PORT = 65535

Direction = Literal["ingress", "egress"]
_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, order=True)
class PortRange:
    """Ports `first`..`last` (inclusive) of one protocol ("TCP", "UDP" or "SCTP")."""

    protocol: str
    first: int
    last: int

    def covers(self, protocol: str, port: int) -> bool:
        return self.protocol == protocol and self.first <= port <= self.last


@dataclass(frozen=True, order=True)
class Allow:
    """Traffic to/from any of `cidrs` (ipBlock excepts already cut out) on any of
    `ports`; `ports == ()` means every port of every protocol."""

    cidrs: tuple[str, ...]
    ports: tuple[PortRange, ...] = ()


@dataclass(frozen=True)
class PodRules:
    """What the policies selecting one pod allow; a non-isolated direction allows all."""

    ingress_isolated: bool = False
    egress_isolated: bool = False
    ingress: tuple[Allow, ...] = ()
    egress: tuple[Allow, ...] = ()
    policies: tuple[str, ...] = ()   # "namespace/name" of the policies selecting the pod
    problems: tuple[str, ...] = ()   # what could not be resolved (informational, for Events)


@dataclass(frozen=True)
class PolicyView:
    """Snapshots of the informer caches, as plain Kubernetes dicts."""

    policies: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()
    namespaces: Sequence[Mapping[str, Any]] = ()
    services: Sequence[Mapping[str, Any]] = ()
    endpoint_slices: Sequence[Mapping[str, Any]] = ()


# ---------------------------------------------------------------------------------------
# Small readers (forgiving: malformed fields read as absent)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    labels = _meta(obj).get("labels")
    return dict(labels) if isinstance(labels, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> str:
    m = _meta(obj)
    return f"{m.get('namespace') or ''}/{m.get('name') or ''}"


def _protocol(value: Any) -> str | None:
    """A rule's protocol (default TCP); None for one we do not know."""
    if value is None or value == "":
        return "TCP"
    return value if value in PROTOCOLS else None


def _ip(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value)
    except (TypeError, ValueError):
        return None


def pod_ips(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The addresses a pod is a peer by: `status.podIPs` (or `podIP`); none for
    host-network pods, finished pods and pods not yet given an address."""
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    if spec.get("hostNetwork") or status.get("phase") in ("Succeeded", "Failed"):
        return ()
    raw = [_dict(e).get("ip") for e in _list(status.get("podIPs"))] or [status.get("podIP")]
    ips = [_ip(v) for v in raw]
    return tuple(dict.fromkeys(str(ip) for ip in ips if ip is not None))


def _host_net(ip: str) -> str:
    return f"{ip}/{32 if ':' not in ip else 128}"


def container_ports(pod: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """(protocol, name) → number of a pod's named container ports."""
    out: dict[tuple[str, str], int] = {}
    spec = _dict(pod.get("spec"))
    for c in _list(spec.get("containers")) + _list(spec.get("initContainers")):
        for p in _list(_dict(c).get("ports")):
            p = _dict(p)
            name, number, proto = p.get("name"), p.get("containerPort"), _protocol(p.get("protocol"))
            if isinstance(name, str) and name and isinstance(number, int) and proto:
                out.setdefault((proto, name), number)
    return out


def policy_types(policy: Mapping[str, Any]) -> tuple[bool, bool]:
    """(affects ingress, affects egress), with Kubernetes' defaulting of `policyTypes`."""
    spec = _dict(policy.get("spec"))
    types = _list(spec.get("policyTypes"))
    if not types:
        return True, bool(_list(spec.get("egress")))
    return "Ingress" in types, "Egress" in types


def cut_excepts(cidr: str, excepts: Iterable[str]) -> tuple[str, ...]:
    """`cidr` minus the `except` networks, as a minimal list of CIDRs.  Raises
    ValueError for a malformed CIDR."""
    nets: list[_Net] = [ipaddress.ip_network(cidr, strict=False)]
    for text in excepts:
        ex = ipaddress.ip_network(text, strict=False)
        cut: list[_Net] = []
        for n in nets:
            if n.version != ex.version or not n.overlaps(ex):
                cut.append(n)
            elif ex.supernet_of(n):  # type: ignore[arg-type]
                continue
            else:
                cut.extend(n.address_exclude(ex))  # type: ignore[arg-type]
        nets = cut
    v4 = ipaddress.collapse_addresses(n for n in nets if n.version == 4)
    v6 = ipaddress.collapse_addresses(n for n in nets if n.version == 6)
    return tuple(str(n) for n in [*v4, *v6])


# ---------------------------------------------------------------------------------------
# Peers: pods and the pseudo-pods standing for non-pod endpoints


@dataclass(frozen=True)
class _Peer:
    namespace: str
    labels: Mapping[str, str]
    ips: tuple[str, ...]
    ports: Mapping[tuple[str, str], int]  # (protocol, name) → number


def _pod_peer(pod: Mapping[str, Any]) -> _Peer:
    return _Peer(str(_meta(pod).get("namespace") or ""), _labels(pod), pod_ips(pod),
                 container_ports(pod))


@dataclass(frozen=True)
class _PortSpec:
    protocol: str
    first: int | None = None   # None: a named port, or every port (name empty)
    last: int | None = None
    name: str = ""


@dataclass(frozen=True, eq=False)
class _PeerSpec:
    pod_selector: LabelSelector | None = None        # None: not given
    namespace_selector: LabelSelector | None = None  # None: not given
    cidrs: tuple[str, ...] | None = None  # ipBlock (excepts cut); None: not an ipBlock


def _selector(sel: Any, problems: list[str], where: str) -> LabelSelector:
    """A parsed API label selector; one that does not parse selects nothing (as
    Kubernetes' controllers treat a selector LabelSelectorAsSelector refuses)."""
    try:
        return parsed_label_selector(sel if sel is not None else {})
    except BadRequest as e:
        problems.append(f"{where}: {e}")
        return LabelSelector(nothing=True)


@dataclass(frozen=True)
class _Rule:
    namespace: str                  # the policy's namespace
    peers: tuple[_PeerSpec, ...] | None  # None: every peer
    ports: tuple[_PortSpec, ...] | None  # None: every port of every protocol


def _parse_rule(namespace: str, rule: Any, peers_key: str, problems: list[str],
                where: str) -> _Rule:
    rule = _dict(rule)
    peers: list[_PeerSpec] | None = None
    if _list(rule.get(peers_key)):
        peers = []
        for p in _list(rule.get(peers_key)):
            p = _dict(p)
            block = p.get("ipBlock")
            if isinstance(block, Mapping):
                try:
                    cidrs = cut_excepts(str(block.get("cidr")),
                                        [str(e) for e in _list(block.get("except"))])
                except ValueError as e:
                    problems.append(f"{where}: ipBlock {block.get('cidr')!r}: {e}")
                    continue
                peers.append(_PeerSpec(cidrs=cidrs))
            elif "podSelector" in p or "namespaceSelector" in p:
                peers.append(_PeerSpec(
                    pod_selector=_selector(p["podSelector"], problems, where)
                    if "podSelector" in p else None,
                    namespace_selector=_selector(p["namespaceSelector"], problems, where)
                    if "namespaceSelector" in p else None))
    ports: list[_PortSpec] | None = None
    if _list(rule.get("ports")):
        ports = []
        for p in _list(rule.get("ports")):
            p = _dict(p)
            proto = _protocol(p.get("protocol"))
            if proto is None:
                problems.append(f"{where}: unknown protocol {p.get('protocol')!r}")
                continue
            port, end = p.get("port"), p.get("endPort")
            if port is None:
                ports.append(_PortSpec(proto, 0, MAX_PORT))
            elif isinstance(port, int) and not isinstance(port, bool):
                last = end if isinstance(end, int) and end >= port else port
                ports.append(_PortSpec(proto, port, min(last, MAX_PORT)))
            elif isinstance(port, str) and port.isdigit():
                ports.append(_PortSpec(proto, int(port), int(port)))
            elif isinstance(port, str) and port:
                ports.append(_PortSpec(proto, name=port))
    return _Rule(namespace, tuple(peers) if peers is not None else None,
                 tuple(ports) if ports is not None else None)


@dataclass
class _Policy:
    key: str
    namespace: str
    pod_selector: LabelSelector
    ingress_on: bool
    egress_on: bool
    ingress: tuple[_Rule, ...]
    egress: tuple[_Rule, ...]
    problems: tuple[str, ...]
    egress_allows: tuple[Allow, ...] | None = None   # resolved lazily, once per index
    ingress_parts: tuple[tuple[tuple[str, ...], _Rule], ...] | None = None


def _parse_policy(policy: Mapping[str, Any]) -> _Policy:
    key = _key(policy)
    ns = str(_meta(policy).get("namespace") or "")
    spec = _dict(policy.get("spec"))
    problems: list[str] = []
    ingress_on, egress_on = policy_types(policy)
    ingress = tuple(_parse_rule(ns, r, "from", problems, f"{key} ingress[{i}]")
                    for i, r in enumerate(_list(spec.get("ingress"))))
    egress = tuple(_parse_rule(ns, r, "to", problems, f"{key} egress[{i}]")
                   for i, r in enumerate(_list(spec.get("egress"))))
    # A missing podSelector is what the API defaults to {}: every pod of the namespace.
    sel = _selector(spec.get("podSelector"), problems, f"{key} podSelector")
    return _Policy(key, ns, sel, ingress_on, egress_on, ingress, egress, tuple(problems))


# ---------------------------------------------------------------------------------------
# The index


class PolicyIndex:
    """Evaluates many pods against one `PolicyView`: policies are parsed, and every
    rule's peers (and, for egress, its Service translation) resolved, once per index
    rather than once per pod.  Build a new index when the view changes."""

    def __init__(self, view: PolicyView) -> None:
        self._policies_by_ns: dict[str, list[_Policy]] = defaultdict(list)
        for p in view.policies:
            parsed = _parse_policy(p)
            self._policies_by_ns[parsed.namespace].append(parsed)
        self._ns_labels: dict[str, dict[str, str]] = {}
        for ns in view.namespaces:
            name = str(_meta(ns).get("name") or "")
            labels = _labels(ns)
            labels.setdefault(LABEL_NAMESPACE_NAME, name)  # the API server sets it on every namespace
            self._ns_labels[name] = labels
        self._pods_by_key: dict[str, Mapping[str, Any]] = {_key(p): p for p in view.pods}
        self._peers: list[_Peer] = [pp for pp in map(_pod_peer, view.pods) if pp.ips]
        self._services = list(view.services)
        self._slices: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for s in view.endpoint_slices:
            svc = _labels(s).get(LABEL_SERVICE_NAME)
            if svc:
                self._slices[f"{_meta(s).get('namespace') or ''}/{svc}"].append(s)
        # (id of a parsed namespace selector, namespace) → match; the selectors live as
        # long as this index (they are held by its parsed policies).
        self._ns_matches: dict[tuple[int, str], bool] = {}
        self._service_targets: list[tuple[str, PortRange, list[tuple[_Peer, str, int]]]] | None = None

    # -- matching --------------------------------------------------------------------------

    def _namespace_labels(self, name: str) -> dict[str, str]:
        return self._ns_labels.get(name) or {LABEL_NAMESPACE_NAME: name}

    def _namespace_matches(self, sel: LabelSelector, namespace: str) -> bool:
        key = (id(sel), namespace)
        hit = self._ns_matches.get(key)
        if hit is None:
            hit = self._ns_matches[key] = sel.matches(self._namespace_labels(namespace))
        return hit

    def _peer_matches(self, spec: _PeerSpec, rule_ns: str, peer: _Peer, ip: str) -> bool:
        if spec.cidrs is not None:
            return _in_cidrs(ip, spec.cidrs)
        if spec.namespace_selector is None:
            if peer.namespace != rule_ns:
                return False
        elif not self._namespace_matches(spec.namespace_selector, peer.namespace):
            return False
        return spec.pod_selector is None or spec.pod_selector.matches(peer.labels)

    def _rule_peer_matches(self, rule: _Rule, peer: _Peer, ip: str) -> bool:
        if rule.peers is None:
            return True
        return any(self._peer_matches(s, rule.namespace, peer, ip) for s in rule.peers)

    @staticmethod
    def _rule_port_matches(rule: _Rule, peer: _Peer, protocol: str, port: int) -> bool:
        """For egress: the destination `peer` listens on `port`; named ports resolve
        against the peer's own ports."""
        if rule.ports is None:
            return True
        for p in rule.ports:
            if p.protocol != protocol:
                continue
            if p.name:
                if peer.ports.get((protocol, p.name)) == port:
                    return True
            elif p.first is not None and p.last is not None and p.first <= port <= p.last:
                return True
        return False

    # -- resolution ------------------------------------------------------------------------

    def _rule_sources(self, rule: _Rule) -> tuple[list[str], list[_Peer]]:
        """The CIDRs a rule's peers stand for, and the pods its selectors pick (all
        pods when the rule names no peers)."""
        if rule.peers is None:
            return [ALL_V4, ALL_V6], self._peers
        cidrs: list[str] = []
        pods: list[_Peer] = []
        for peer in self._peers:
            if any(s.cidrs is None and self._peer_matches(s, rule.namespace, peer, "")
                   for s in rule.peers):
                pods.append(peer)
                cidrs.extend(_host_net(ip) for ip in peer.ips)
        for s in rule.peers:
            if s.cidrs is not None:
                cidrs.extend(s.cidrs)
        return cidrs, pods

    def _egress_allows(self, pol: _Policy) -> tuple[Allow, ...]:
        if pol.egress_allows is not None:
            return pol.egress_allows
        out: list[Allow] = []
        for rule in pol.egress:
            cidrs, pods = self._rule_sources(rule)
            numeric = _numeric_ranges(rule)
            if rule.ports is None:
                out.append(Allow(tuple(cidrs)))
            elif numeric:
                out.append(Allow(tuple(cidrs), numeric))
            named = [p for p in rule.ports or () if p.name]
            if named:
                blocks = [c for x in rule.peers or () if x.cidrs is not None for c in x.cidrs]
                chosen = {id(p) for p in pods}
                for peer in self._peers:
                    for ip in peer.ips:
                        if id(peer) not in chosen and not (blocks and _in_cidrs(ip, blocks)):
                            continue
                        ranges = tuple(PortRange(p.protocol, n, n) for p in named
                                       if (n := peer.ports.get((p.protocol, p.name))) is not None)
                        if ranges:
                            out.append(Allow((_host_net(ip),), ranges))
            out.extend(self._service_allows(rule))
        pol.egress_allows = tuple(out)
        return pol.egress_allows

    def _ingress_parts(self, pol: _Policy) -> tuple[tuple[tuple[str, ...], _Rule], ...]:
        if pol.ingress_parts is None:
            pol.ingress_parts = tuple((tuple(self._rule_sources(r)[0]), r) for r in pol.ingress)
        return pol.ingress_parts

    def _service_target_list(self) -> list[tuple[str, PortRange, list[tuple[_Peer, str, int]]]]:
        """Per (ClusterIP, service port): the ready endpoints as (peer, address, port the
        policy sees) — a pod endpoint's own port, a pseudo-pod's Service port."""
        if self._service_targets is not None:
            return self._service_targets
        out: list[tuple[str, PortRange, list[tuple[_Peer, str, int]]]] = []
        for svc in self._services:
            spec = _dict(svc.get("spec"))
            ns = str(_meta(svc).get("namespace") or "")
            cluster_ips = [str(ip) for v in (_list(spec.get("clusterIPs")) or [spec.get("clusterIP")])
                           if (ip := _ip(v)) is not None]
            if not cluster_ips:
                continue  # headless, or not allocated yet
            sel = spec.get("selector")
            pseudo_labels = dict(sel) if isinstance(sel, Mapping) and sel else _labels(svc)
            sports = [_dict(p) for p in _list(spec.get("ports"))]
            pseudo_ports = {(proto, str(p["name"])): int(p["port"]) for p in sports
                            if (proto := _protocol(p.get("protocol"))) and p.get("name")
                            and isinstance(p.get("port"), int)}
            slices = self._slices.get(f"{ns}/{_meta(svc).get('name') or ''}", [])
            for sp in sports:
                proto, number = _protocol(sp.get("protocol")), sp.get("port")
                if proto is None or not isinstance(number, int):
                    continue
                name = str(sp.get("name") or "")
                targets: list[tuple[_Peer, str, int]] = []
                for sl in slices:
                    eport = next((q.get("port") for q in map(_dict, _list(sl.get("ports")))
                                  if str(q.get("name") or "") == name
                                  and _protocol(q.get("protocol")) == proto), None)
                    if not isinstance(eport, int):
                        continue
                    for ep in map(_dict, _list(sl.get("endpoints"))):
                        if _dict(ep.get("conditions")).get("ready") is False:
                            continue
                        ref = _dict(ep.get("targetRef"))
                        if ref:
                            pod = self._pods_by_key.get(f"{ref.get('namespace') or ns}/{ref.get('name')}")
                            if pod is None:
                                continue  # not in the cache yet: the next view will have it
                            peer, seen_port = _pod_peer(pod), eport
                        else:
                            peer = _Peer(ns, pseudo_labels, (), pseudo_ports)
                            seen_port = number
                        for addr in _list(ep.get("addresses")):
                            if _ip(addr) is not None:
                                targets.append((peer, str(_ip(addr)), seen_port))
                for cip in cluster_ips:
                    out.append((cip, PortRange(proto, number, number), targets))
        self._service_targets = out
        return out

    def _service_allows(self, rule: _Rule) -> list[Allow]:
        out: list[Allow] = []
        for cip, pr, targets in self._service_target_list():
            if any(self._rule_peer_matches(rule, peer, addr)
                   and self._rule_port_matches(rule, peer, pr.protocol, port)
                   for peer, addr, port in targets):
                out.append(Allow((_host_net(cip),), (pr,)))
        return out

    # -- the answer ------------------------------------------------------------------------

    def rules_for(self, pod: Mapping[str, Any]) -> PodRules:
        """The rules for `pod` (its namespace's policies that select it)."""
        ns = str(_meta(pod).get("namespace") or "")
        labels = _labels(pod)
        selecting = [p for p in self._policies_by_ns.get(ns, ())
                     if p.pod_selector.matches(labels)]
        if not selecting:
            return PodRules()
        problems: list[str] = []
        own_ports = container_ports(pod)
        ingress: set[Allow] = set()
        egress: set[Allow] = set()
        for pol in selecting:
            problems.extend(pol.problems)
            if pol.ingress_on:
                for cidrs, rule in self._ingress_parts(pol):
                    if rule.ports is None:
                        ingress.add(Allow(cidrs))
                        continue
                    ranges = list(_numeric_ranges(rule))
                    for p in rule.ports:
                        if p.name:
                            n = own_ports.get((p.protocol, p.name))
                            if n is None:
                                problems.append(f"{pol.key}: named port {p.name}/{p.protocol} "
                                                f"is not a port of {_key(pod)}")
                            else:
                                ranges.append(PortRange(p.protocol, n, n))
                    if ranges:
                        ingress.add(Allow(cidrs, tuple(sorted(set(ranges)))))
            if pol.egress_on:
                egress.update(self._egress_allows(pol))
        return PodRules(
            ingress_isolated=any(p.ingress_on for p in selecting),
            egress_isolated=any(p.egress_on for p in selecting),
            ingress=tuple(sorted(a for a in ingress if a.cidrs)),
            egress=tuple(sorted(a for a in egress if a.cidrs)),
            policies=tuple(sorted(p.key for p in selecting)),
            problems=tuple(dict.fromkeys(problems)),
        )


def _numeric_ranges(rule: _Rule) -> tuple[PortRange, ...]:
    return tuple(sorted({PortRange(p.protocol, p.first, p.last) for p in rule.ports or ()
                         if not p.name and p.first is not None and p.last is not None}))


def _in_cidrs(ip: str, cidrs: Iterable[str]) -> bool:
    addr = _ip(ip)
    if addr is None:
        return False
    for c in cidrs:
        net = _network(c)
        if net is not None and net.version == addr.version and addr in net:
            return True
    return False


_NETS: dict[str, _Net | None] = {}


def _network(cidr: str) -> _Net | None:
    if cidr not in _NETS:
        try:
            _NETS[cidr] = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            _NETS[cidr] = None
        if len(_NETS) > 65536:  # a bound, not an LRU: the working set is the cluster's peers
            _NETS.clear()
    return _NETS[cidr]


def rules_for(pod: Mapping[str, Any], view: PolicyView) -> PodRules:
    """The rules for one pod; for many pods build one `PolicyIndex` instead."""
    return PolicyIndex(view).rules_for(pod)


def allowed(rules: PodRules, direction: Direction, peer_ip: str, protocol: str, port: int) -> bool:
    """Whether `rules` let a new connection through: `direction` "ingress" (from
    `peer_ip` to the pod's `port`) or "egress" (to `peer_ip`:`port`)."""
    if direction == "ingress":
        isolated, allows = rules.ingress_isolated, rules.ingress
    elif direction == "egress":
        isolated, allows = rules.egress_isolated, rules.egress
    else:
        raise ValueError(f"direction must be 'ingress' or 'egress', not {direction!r}")
    if not isolated:
        return True
    return any(_in_cidrs(peer_ip, a.cidrs)
               and (not a.ports or any(r.covers(protocol, port) for r in a.ports))
               for a in allows)


__all__ = ["Allow", "PodRules", "PolicyIndex", "PolicyView", "PortRange", "allowed",
           "cut_excepts", "pod_ips", "policy_types", "rules_for"]
