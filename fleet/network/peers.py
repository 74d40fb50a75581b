"""The pod network across nodes, as pure decisions: which route, neighbour and FDB entry
each peer node needs (flannel's host-gw and vxlan backends), and how to get there
from what the kernel holds now.

Every node owns one /24 of the cluster CIDR (`node.spec.podCIDR`, from node IPAM).
To reach another node's pods the agent programs, per peer:

* **host-gw** (peer's InternalIP in a subnet this node is directly connected to):
  `<peer pod CIDR> via <peer InternalIP> dev <that interface>` — plain forwarding on
  the shared L2 segment, no encapsulation;
* **vxlan** (peer not directly reachable at L2): a VXLAN device (`fleet.1`, VNI 1, UDP
  8472 as flannel's) whose address is the node's VTEP address (the pod CIDR's network
  address, /32), and for each peer
  - `<peer pod CIDR> via <peer VTEP address> dev fleet.1 onlink`,
  - a permanent neighbour `<peer VTEP address> lladdr <peer VTEP MAC>`,
  - an FDB entry `<peer VTEP MAC> dst <peer InternalIP>` (no learning, no flooding).
  Each node publishes its VTEP MAC in the Node annotation `BACKEND_DATA_ANNOTATION`
  (`{"VNI": 1, "VtepMAC": "..."}`, flannel's `backend-data`); a peer that has not
  published one yet is skipped until it does.

Only Nodes whose agent joined the pod network — it published its address in
`PUBLIC_IP_ANNOTATION` (flannel's `public-ip`) — are peers; simulated nodes and nodes
running another network driver are left alone.

The backend is chosen per peer (`auto`) or forced for all (`host-gw` / `vxlan`).
Routes carry a dedicated route protocol number (`ROUTE_PROTOCOL`), so the agent only
ever changes or removes routes it made; neighbour and FDB entries live on the VXLAN
device, which is the agent's alone.

`desired_state` turns the Nodes into the wanted entries; `plan` diffs them against
the current ones into replace/delete lists that `fleet.network.overlay` applies.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Route protocol number marking the routes the agent owns (`ip route ... proto 70`).
ROUTE_PROTOCOL = 70
VXLAN_DEVICE = "fleet.1"
VXLAN_VNI = 1
VXLAN_PORT = 8472
#: VXLAN's overhead on an IPv4 underlay (outer IP 20 + UDP 8 + VXLAN 8 + inner Ethernet 14).
VXLAN_OVERHEAD = 50
#: Node annotations the agent publishes about itself (flannel's, under our prefix).
BACKEND_DATA_ANNOTATION = "network.fleet.dev/backend-data"
PUBLIC_IP_ANNOTATION = "network.fleet.dev/public-ip"

HOST_GW = "host-gw"
VXLAN = "vxlan"
AUTO = "auto"
BACKENDS = (HOST_GW, VXLAN, AUTO)


@dataclass(frozen=True)
class Peer:
    """Another node as the pod network sees it."""

    name: str
    pod_cidr: str
    # Its InternalIP as it published it (`PUBLIC_IP_ANNOTATION`): the next hop
    # (host-gw) or the VXLAN underlay destination.
    address: str
    vtep_mac: str | None = None  # from its backend-data annotation, if published


@dataclass(frozen=True)
class Route:
    """A route to a peer's pod CIDR."""

    dst: str  # "10.42.3.0/24"
    via: str
    dev: str
    onlink: bool = False


@dataclass
class State:
    """Routes (ours), neighbours and FDB entries (on the VXLAN device): wanted or current."""

    routes: dict[str, Route] = field(default_factory=dict)  # by dst
    neighbors: dict[str, str] = field(default_factory=dict)  # VTEP IP -> MAC
    fdb: dict[str, str] = field(default_factory=dict)  # VTEP MAC -> underlay IP
    # Current state only: destinations of main-table routes that are not ours (a
    # route replace would overwrite them, so they are never replaced).
    foreign: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Connected:
    """A subnet this node is directly attached to, and through which interface."""

    network: ipaddress.IPv4Network
    dev: str


@dataclass
class Desired:
    """What `desired_state` decided."""

    state: State
    backends: dict[str, str]  # peer name -> HOST_GW | VXLAN
    skipped: dict[str, str]  # peer name -> why it gets no route (yet)
    needs_vxlan: bool


@dataclass(frozen=True)
class Plan:
    """The changes that turn the current state into the desired one."""

    route_replace: tuple[Route, ...] = ()
    route_delete: tuple[Route, ...] = ()
    neigh_replace: tuple[tuple[str, str], ...] = ()  # (ip, mac)
    neigh_delete: tuple[tuple[str, str], ...] = ()
    fdb_replace: tuple[tuple[str, str], ...] = ()  # (mac, dst)
    fdb_delete: tuple[tuple[str, str], ...] = ()
    # Wanted routes left alone because a route of someone else has that destination.
    conflicts: tuple[Route, ...] = ()

    @property
    def empty(self) -> bool:
        return not any((self.route_replace, self.route_delete, self.neigh_replace,
                        self.neigh_delete, self.fdb_replace, self.fdb_delete))


def validate_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown pod network backend {backend!r} (one of {', '.join(BACKENDS)})")
    return backend


def vtep_address(pod_cidr: str) -> str:
    """A node's VTEP address: its pod CIDR's network address (flannel's choice)."""
    return str(ipaddress.IPv4Network(pod_cidr, strict=False).network_address)


def backend_data(mac: str, vni: int = VXLAN_VNI) -> str:
    """The value of `BACKEND_DATA_ANNOTATION` for a VTEP."""
    return json.dumps({"VNI": vni, "VtepMAC": mac}, separators=(",", ":"))


def parse_backend_data(value: Any) -> str | None:
    """The VTEP MAC in a backend-data annotation, or None if absent or malformed."""
    if not isinstance(value, str):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    mac = data.get("VtepMAC") if isinstance(data, dict) else None
    if not isinstance(mac, str) or len(mac.split(":")) != 6:
        return None
    try:
        if not all(len(b) == 2 for b in mac.split(":")):
            return None
        bytes.fromhex(mac.replace(":", ""))
    except ValueError:
        return None
    return mac.lower()


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def public_ip(node: Mapping[str, Any]) -> str | None:
    """The address a node published for the pod network (`PUBLIC_IP_ANNOTATION`)."""
    value = _mapping(_mapping(node.get("metadata")).get("annotations")).get(PUBLIC_IP_ANNOTATION)
    try:
        return str(ipaddress.IPv4Address(str(value))) if isinstance(value, str) else None
    except ValueError:
        return None


def peer_view(node: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """What of a Node the pod network depends on: a change elsewhere (heartbeats,
    conditions, labels) needs no pass."""
    if node is None:
        return ()
    meta = _mapping(node.get("metadata"))
    ann = _mapping(meta.get("annotations"))
    return (meta.get("name"), bool(meta.get("deletionTimestamp")),
            _mapping(node.get("spec")).get("podCIDR"), ann.get(PUBLIC_IP_ANNOTATION),
            ann.get(BACKEND_DATA_ANNOTATION))


def peers_from_nodes(nodes: Iterable[Mapping[str, Any]], self_name: str) -> list[Peer]:
    """The other nodes in the pod network: with a pod CIDR and a published public IP.

    As with flannel's node leases, a Node without the annotation — a simulated node, a
    node whose agent runs another network driver or none, an agent not started yet —
    gets no route; deleting Nodes are left out too."""
    out = []
    for node in nodes:
        meta = _mapping(node.get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str) or name == self_name or meta.get("deletionTimestamp"):
            continue
        cidr = _mapping(node.get("spec")).get("podCIDR")
        address = public_ip(node)
        if not isinstance(cidr, str) or address is None:
            continue
        try:
            net = ipaddress.IPv4Network(cidr)
        except ValueError:
            continue
        mac = parse_backend_data(_mapping(meta.get("annotations")).get(BACKEND_DATA_ANNOTATION))
        out.append(Peer(name=name, pod_cidr=str(net), address=address, vtep_mac=mac))
    return sorted(out, key=lambda p: p.name)


def connected_dev(address: str, connected: Sequence[Connected]) -> str | None:
    """The interface whose subnet holds `address` (longest prefix), or None."""
    ip = ipaddress.IPv4Address(address)
    best: Connected | None = None
    for c in connected:
        if ip in c.network and (best is None or c.network.prefixlen > best.network.prefixlen):
            best = c
    return best.dev if best else None


def choose_backend(mode: str, address: str, connected: Sequence[Connected]) -> str:
    """HOST_GW or VXLAN for a peer at `address`: forced by `mode`, else host-gw exactly
    when the peer shares a directly connected subnet with this node."""
    if mode in (HOST_GW, VXLAN):
        return mode
    return HOST_GW if connected_dev(address, connected) else VXLAN


def desired_state(peers: Sequence[Peer], *, mode: str, own_pod_cidr: str, own_address: str,
                  connected: Sequence[Connected], vxlan_dev: str = VXLAN_DEVICE) -> Desired:
    """The routes, neighbours and FDB entries the peers need (see the module docstring)."""
    validate_backend(mode)
    own = ipaddress.IPv4Network(own_pod_cidr)
    state, backends, skipped = State(), {}, {}
    for p in peers:
        net = ipaddress.IPv4Network(p.pod_cidr)
        if net.overlaps(own):
            skipped[p.name] = f"its pod CIDR {net} overlaps ours ({own})"
            continue
        if p.address == own_address:
            skipped[p.name] = f"it has our address {own_address}"
            continue
        if str(net) in state.routes:
            skipped[p.name] = f"another node already has pod CIDR {net}"
            continue
        backend = choose_backend(mode, p.address, connected)
        if backend == HOST_GW:
            dev = connected_dev(p.address, connected)
            if dev is None:
                skipped[p.name] = (f"host-gw needs {p.address} on a directly connected "
                                   "subnet (use the vxlan or auto backend)")
                continue
            state.routes[str(net)] = Route(dst=str(net), via=p.address, dev=dev)
        else:
            backends[p.name] = VXLAN  # the device is needed even while the MAC is unknown
            if p.vtep_mac is None:
                skipped[p.name] = "it has not published its VTEP MAC yet"
                continue
            vtep = vtep_address(str(net))
            state.routes[str(net)] = Route(dst=str(net), via=vtep, dev=vxlan_dev, onlink=True)
            state.neighbors[vtep] = p.vtep_mac
            state.fdb[p.vtep_mac] = p.address
        backends[p.name] = backend
    needs = mode == VXLAN or any(b == VXLAN for b in backends.values())
    return Desired(state=state, backends=backends, skipped=skipped, needs_vxlan=needs)


def plan(desired: State, current: State) -> Plan:
    """Replace what is missing or different, delete what is no longer wanted; a wanted
    route whose destination holds a route that is not ours is a conflict, not a replace."""
    return Plan(
        route_replace=tuple(r for dst, r in sorted(desired.routes.items())
                            if current.routes.get(dst) != r and dst not in current.foreign),
        conflicts=tuple(r for dst, r in sorted(desired.routes.items())
                        if dst in current.foreign and dst not in current.routes),
        route_delete=tuple(r for dst, r in sorted(current.routes.items())
                           if dst not in desired.routes),
        neigh_replace=tuple((ip, mac) for ip, mac in sorted(desired.neighbors.items())
                            if current.neighbors.get(ip) != mac),
        neigh_delete=tuple((ip, mac) for ip, mac in sorted(current.neighbors.items())
                           if ip not in desired.neighbors),
        fdb_replace=tuple((mac, dst) for mac, dst in sorted(desired.fdb.items())
                          if current.fdb.get(mac) != dst),
        fdb_delete=tuple((mac, dst) for mac, dst in sorted(current.fdb.items())
                         if mac not in desired.fdb),
    )


__all__ = [
    "AUTO", "BACKENDS", "BACKEND_DATA_ANNOTATION", "HOST_GW", "PUBLIC_IP_ANNOTATION",
    "ROUTE_PROTOCOL", "VXLAN", "VXLAN_DEVICE", "VXLAN_OVERHEAD", "VXLAN_PORT", "VXLAN_VNI",
    "Connected", "Desired", "Peer", "Plan", "Route", "State", "backend_data", "choose_backend",
    "connected_dev", "desired_state", "parse_backend_data", "peer_view", "public_ip", "peers_from_nodes",
    "plan", "validate_backend", "vtep_address",
]
