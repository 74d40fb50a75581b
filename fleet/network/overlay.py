"""Routes to the other nodes' pod CIDRs, in the kernel: the thin netlink side of
`fleet.network.peers` (which decides everything).

`PeerRouter` is what a network driver composes to take part in the pod network
across nodes (the bridge driver does): `sync(nodes)` reads the node's directly
connected subnets and what it programmed before (routes with `ROUTE_PROTOCOL`,
neighbour and FDB entries of the VXLAN device), asks `peers.desired_state` and
`peers.plan` what to change, and applies only that.  The VXLAN device is created
only when a peer needs it (or the backend is forced to vxlan), so a one-node
cluster or a flat L2 network never gets one.  `remove` deletes the device and every
route the agent owns (a node reset).

Like the bridge driver, every netlink conversation runs in a Trio worker thread on
a socket opened in the node's namespace (`host_netns`, None: the agent's own).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import trio
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from fleet.network import peers
from fleet.network.driver import NetworkError
from fleet.network.netlink import iproute
from fleet.network.netlink import link_kind as _link_kind
from fleet.network.netlink import lookup as _lookup

log = logging.getLogger(__name__)

_MAIN_TABLE = 254
_RTNH_F_ONLINK = 4
_NUD_PERMANENT = 0x80
_NUD_NOARP = 0x40
_NTF_SELF = 0x02


def _names(ipr: IPRoute) -> dict[int, str]:
    return {link["index"]: str(link.get_attr("IFLA_IFNAME")) for link in ipr.get_links()}


def connected_sync(ipr: IPRoute, exclude: set[str]) -> list[peers.Connected]:
    """The IPv4 subnets of this namespace's interfaces (not loopback, not `exclude`)."""
    names = _names(ipr)
    out = []
    for a in ipr.get_addr(family=socket.AF_INET):
        dev = names.get(a["index"], "")
        if dev == "lo" or dev in exclude or a["prefixlen"] >= 32:
            continue
        net = ipaddress.IPv4Network(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}", strict=False)
        out.append(peers.Connected(network=net, dev=dev))
    return out


def current_sync(ipr: IPRoute, vxlan_dev: str, proto: int = peers.ROUTE_PROTOCOL) -> peers.State:
    """Our routes (by protocol, main table) and the VXLAN device's neighbours and FDB."""
    names = _names(ipr)
    state = peers.State()
    foreign = set()
    for r in ipr.get_routes(family=socket.AF_INET, table=_MAIN_TABLE):
        if r.get_attr("RTA_DST") is None:
            continue
        dst = f"{r.get_attr('RTA_DST')}/{r['dst_len']}"
        if r["proto"] != proto:
            # Only a route with the same key (no metric) would be replaced by ours.
            if not r.get_attr("RTA_PRIORITY"):
                foreign.add(dst)
            continue
        state.routes[dst] = peers.Route(dst=dst, via=str(r.get_attr("RTA_GATEWAY") or ""),
                                        dev=names.get(r.get_attr("RTA_OIF"), ""),
                                        onlink=bool(r["flags"] & _RTNH_F_ONLINK))
    state.foreign = frozenset(foreign)
    idx = _lookup(ipr, vxlan_dev)
    if idx is None:
        return state
    for n in ipr.get_neighbours(ifindex=idx, family=socket.AF_INET):
        if n["ifindex"] == idx and n["state"] & _NUD_PERMANENT and n.get_attr("NDA_LLADDR"):
            state.neighbors[str(n.get_attr("NDA_DST"))] = str(n.get_attr("NDA_LLADDR")).lower()
    for f in ipr.fdb("dump", ifindex=idx):
        if f["ifindex"] == idx and f.get_attr("NDA_DST") and f.get_attr("NDA_LLADDR"):
            state.fdb[str(f.get_attr("NDA_LLADDR")).lower()] = str(f.get_attr("NDA_DST"))
    return state


def _underlay(ipr: IPRoute, address: str) -> tuple[int, int]:
    """(index, mtu) of the interface holding `address`."""
    for a in ipr.get_addr(family=socket.AF_INET):
        if a.get_attr("IFA_ADDRESS") == address:
            (link,) = ipr.get_links(a["index"])
            return a["index"], int(link.get_attr("IFLA_MTU") or 1500)
    raise NetworkError(f"no interface has the node address {address}: cannot build VXLAN on it")


def ensure_vxlan_sync(ipr: IPRoute, *, dev: str, local: str, pod_cidr: str,
                      vni: int = peers.VXLAN_VNI, port: int = peers.VXLAN_PORT) -> str:
    """The VXLAN device (created or fixed up), with the VTEP address, up; its MAC."""
    under, mtu = _underlay(ipr, local)
    idx = _lookup(ipr, dev)
    if idx is not None:
        (link,) = ipr.get_links(idx)
        info = link.get_attr("IFLA_LINKINFO")
        data = info.get_attr("IFLA_INFO_DATA") if info is not None else None
        same = (_link_kind(link) == "vxlan" and data is not None
                and data.get_attr("IFLA_VXLAN_ID") == vni
                and data.get_attr("IFLA_VXLAN_PORT") == port
                and data.get_attr("IFLA_VXLAN_LOCAL") == local)
        if not same:
            if _link_kind(link) != "vxlan":
                raise NetworkError(f"interface {dev} exists but is not a VXLAN device")
            log.info("pod network: re-creating %s (VNI, port or local address changed)", dev)
            ipr.link("del", index=idx)
            idx = None
    if idx is None:
        try:
            ipr.link("add", ifname=dev, kind="vxlan", vxlan_id=vni, vxlan_port=port,
                     vxlan_local=local, vxlan_link=under, vxlan_learning=0,
                     mtu=mtu - peers.VXLAN_OVERHEAD)
        except NetlinkError as e:
            if e.code != errno.EEXIST:
                raise
        idx = _lookup(ipr, dev)
        if idx is None:
            raise NetworkError(f"VXLAN device {dev} vanished right after creation")
    vtep = peers.vtep_address(pod_cidr)
    for a in ipr.get_addr(index=idx, family=socket.AF_INET):
        if (a.get_attr("IFA_ADDRESS"), a["prefixlen"]) != (vtep, 32):
            ipr.addr("del", index=idx, address=a.get_attr("IFA_ADDRESS"), prefixlen=a["prefixlen"])
    if vtep not in [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx, family=socket.AF_INET)]:
        ipr.addr("add", index=idx, address=vtep, prefixlen=32)
    ipr.link("set", index=idx, state="up")
    (link,) = ipr.get_links(idx)
    return str(link.get_attr("IFLA_ADDRESS")).lower()


def apply_sync(ipr: IPRoute, p: peers.Plan, *, vxlan_dev: str,
               proto: int = peers.ROUTE_PROTOCOL) -> list[str]:
    """Apply a plan: entries first, then routes, then removals.  What failed, by entry
    (the rest is still applied; the next sync retries)."""
    errors = [f"route {r.dst}: a route to it exists that is not ours (protocol {proto}); "
              "left alone" for r in p.conflicts]
    vx = _lookup(ipr, vxlan_dev)

    def attempt(what: str, fn: Any, *, missing_ok: bool = False, **kw: Any) -> None:
        try:
            fn(**kw)
        except NetlinkError as e:
            if missing_ok and e.code in (errno.ESRCH, errno.ENOENT, errno.ENODEV):
                return
            errors.append(f"{what}: {e}")

    if vx is not None:
        for mac, dst in p.fdb_replace:
            attempt(f"fdb {mac} dst {dst}", ipr.fdb, command="replace", ifindex=vx, lladdr=mac,
                    dst=dst, state=_NUD_PERMANENT | _NUD_NOARP, flags=_NTF_SELF)
        for ip, mac in p.neigh_replace:
            attempt(f"neighbour {ip}", ipr.neigh, command="replace", ifindex=vx, dst=ip,
                    lladdr=mac, state=_NUD_PERMANENT)
    for r in p.route_replace:
        oif = _lookup(ipr, r.dev)
        if oif is None:
            errors.append(f"route {r.dst}: no interface {r.dev}")
            continue
        attempt(f"route {r.dst} via {r.via}", ipr.route, command="replace", dst=r.dst,
                gateway=r.via, oif=oif, proto=proto, table=_MAIN_TABLE,
                flags=_RTNH_F_ONLINK if r.onlink else 0)
    for r in p.route_delete:
        attempt(f"delete route {r.dst}", ipr.route, missing_ok=True, command="del", dst=r.dst,
                proto=proto, table=_MAIN_TABLE)
    if vx is not None:
        for ip, _mac in p.neigh_delete:
            attempt(f"delete neighbour {ip}", ipr.neigh, missing_ok=True, command="del",
                    ifindex=vx, dst=ip)
        for mac, dst in p.fdb_delete:
            attempt(f"delete fdb {mac}", ipr.fdb, missing_ok=True, command="del", ifindex=vx,
                    lladdr=mac, dst=dst)
    return errors


def remove_sync(ipr: IPRoute, vxlan_dev: str, proto: int = peers.ROUTE_PROTOCOL) -> list[str]:
    """Delete every route of ours and the VXLAN device; what was removed."""
    removed = []
    for dst in current_sync(ipr, vxlan_dev, proto).routes:
        try:
            ipr.route("del", dst=dst, proto=proto, table=_MAIN_TABLE)
            removed.append(f"route {dst}")
        except NetlinkError as e:
            if e.code not in (errno.ESRCH, errno.ENOENT):
                raise NetworkError(f"deleting route {dst}: {e}") from e
    idx = _lookup(ipr, vxlan_dev)
    if idx is not None:
        try:
            ipr.link("del", index=idx)
            removed.append(f"vxlan {vxlan_dev}")
        except NetlinkError as e:
            if e.code != errno.ENODEV:
                raise NetworkError(f"deleting {vxlan_dev}: {e}") from e
    return removed


class PeerRouter:
    """Keeps this node's routes to the other nodes' pod CIDRs in line with the Nodes."""

    def __init__(self, *, node_name: str, pod_cidr: str, node_address: str,
                 backend: str = peers.AUTO, host_netns: str | None = None,
                 vxlan_dev: str = peers.VXLAN_DEVICE, exclude: Sequence[str] = ()) -> None:
        self.node_name = node_name
        self.pod_cidr = str(ipaddress.IPv4Network(pod_cidr))
        self.node_address = str(ipaddress.IPv4Address(node_address))
        self.backend = peers.validate_backend(backend)
        self.host_netns = host_netns
        self.vxlan_dev = vxlan_dev
        # Our own pod-facing interfaces are not "networks the peers live on".
        self.exclude = {vxlan_dev, *exclude}
        self.vtep_mac: str | None = None
        self.last: peers.Desired | None = None
        self._lock = trio.Lock()

    def annotations(self) -> dict[str, str]:
        """What this node publishes on its Node: its address (which makes it a peer of
        the others), and its VTEP once it has one."""
        out = {peers.PUBLIC_IP_ANNOTATION: self.node_address}
        if self.vtep_mac is not None:
            out[peers.BACKEND_DATA_ANNOTATION] = peers.backend_data(self.vtep_mac)
        return out

    async def sync(self, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
        """Program what the Nodes call for; returns the entries that failed."""
        async with self._lock:
            return await trio.to_thread.run_sync(self._sync_sync, list(nodes))

    def _sync_sync(self, nodes: list[Mapping[str, Any]]) -> list[str]:
        peer_list = peers.peers_from_nodes(nodes, self.node_name)
        try:
            with iproute(self.host_netns) as ipr:
                connected = connected_sync(ipr, self.exclude)
                want = peers.desired_state(peer_list, mode=self.backend, own_pod_cidr=self.pod_cidr,
                                           own_address=self.node_address, connected=connected,
                                           vxlan_dev=self.vxlan_dev)
                if want.needs_vxlan:
                    self.vtep_mac = ensure_vxlan_sync(ipr, dev=self.vxlan_dev,
                                                      local=self.node_address,
                                                      pod_cidr=self.pod_cidr)
                have = current_sync(ipr, self.vxlan_dev)
                todo = peers.plan(want.state, have)
                errors = (apply_sync(ipr, todo, vxlan_dev=self.vxlan_dev)
                          if not todo.empty or todo.conflicts else [])
        except NetlinkError as e:
            raise NetworkError(f"programming routes to other nodes: {e}") from e
        if self.last is None or self.last.skipped != want.skipped or not todo.empty:
            for name, why in sorted(want.skipped.items()):
                log.info("pod network: no route to node %s yet: %s", name, why)
        if not todo.empty:
            log.info("pod network: %d route(s) set, %d removed (%s)", len(todo.route_replace),
                     len(todo.route_delete),
                     ", ".join(f"{n}: {b}" for n, b in sorted(want.backends.items())) or "no peers")
        self.last = want
        return errors

    async def remove(self) -> list[str]:
        """Delete the VXLAN device and every route this agent owns."""
        async with self._lock:
            def run() -> list[str]:
                with iproute(self.host_netns) as ipr:
                    return remove_sync(ipr, self.vxlan_dev)
            removed = await trio.to_thread.run_sync(run)
            self.vtep_mac = None
            return removed


__all__ = ["PeerRouter", "apply_sync", "connected_sync", "current_sync", "ensure_vxlan_sync",
           "remove_sync"]
