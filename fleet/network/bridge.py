"""The in-tree `bridge` network driver: pods on a Linux bridge, masqueraded outwards.

The topology on a node whose pod CIDR is 10.42.3.0/24:

    node netns                                   pod netns (one per pod)
    ┌──────────────────────────────────┐         ┌─────────────────────────┐
    │ fleet0 (bridge) 10.42.3.1/24     │         │ eth0 10.42.3.N/24       │
    │   ├── veth<hash(uid)> ───────────┼─ veth ──┤ default via 10.42.3.1   │
    │   └── ...                        │         │ lo up                   │
    │ ip_forward=1                     │         └─────────────────────────┘
    │ table ip fleet: masquerade pod   │
    │   traffic leaving the cluster    │
    └──────────────────────────────────┘

What this module owns:

* the bridge (`fleet0` unless configured), holding the gateway address — the pod
  CIDR's first host address — and kept up.  Its MAC is pinned at creation: a Linux
  bridge otherwise takes the lowest MAC among its ports, so the gateway's MAC would
  change as pods come and go and every pod's ARP entry for it would go stale;
* one veth pair per pod: the node end `veth` + 11 hex digits of sha256(uid) (15
  characters, the kernel's limit, and stable so a restarted agent finds it again) on
  the bridge, in hairpin mode (a pod reaching itself through a Service ClusterIP); the pod end created directly inside the pod's namespace as `eth0`, so
  no temporary name ever appears in the node namespace;
* the pod's address from `IPAM` (persisted under the state dir), loopback up, and a
  default route via the gateway;
* IPv4 forwarding on in the node namespace, and our own nftables table (`table ip
  fleet`) that masquerades pod traffic leaving the cluster CIDR, so replies from the
  outside come back to the node's address.  The table is replaced atomically as a
  whole and deleted by `uninstall`;
* nothing for `hostNetwork` pods (`PodRef.host_network`): see `fleet.network.driver`.

Every netlink conversation happens in a Trio worker thread.  A pyroute2 `IPRoute`
keeps thread-local state, so each one is opened, used and closed inside one thread
call; sockets for other namespaces are opened after `enter_netns` switched that
thread there (a netlink socket stays bound to the namespace it was created in).

All operations are idempotent and rebuild whatever is missing, so the agent can retry
any of them after a failure or a restart.  Calls for the same pod must not overlap
(the agent runs one worker per pod); calls for different pods may.

Routes to other nodes' pod CIDRs (host-gw or VXLAN, option `backend`: auto, host-gw,
vxlan) come from `fleet.network.overlay.PeerRouter`, which the driver composes when it
knows its node's name and address (`PeerRouting`: `sync_peers`); `cluster_cidr` keeps
pod-to-pod traffic across nodes unmasqueraded.  `uninstall` removes the VXLAN device
and those routes too.  Service/policy rules get tables of their own beside `table ip
fleet`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import ipaddress
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from fleet.network import nft
from fleet.network.driver import (
    NetworkConfig,
    NetworkError,
    PodNetwork,
    PodRef,
)
from fleet.network.ipam import IPAM
from fleet.network.netlink import iproute as _iproute
from fleet.network.netlink import link_kind as _link_kind
from fleet.network.netlink import lookup as _lookup
from fleet.network.netns import enter_netns, is_netns

log = logging.getLogger(__name__)

DRIVER_NAME = "bridge"
DEFAULT_BRIDGE = "fleet0"
DEFAULT_NFT_TABLE = "fleet"
POD_INTERFACE = "eth0"
HOST_VETH_PREFIX = "veth"
_IFNAMSIZ = 15  # usable characters in a Linux interface name


def host_veth_name(uid: str) -> str:
    """The node-side veth name of the pod with this uid: `veth` + 11 hex digits."""
    digest = hashlib.sha256(uid.encode()).hexdigest()
    return HOST_VETH_PREFIX + digest[: _IFNAMSIZ - len(HOST_VETH_PREFIX)]


def render_nat_table(pod_cidr: str, cluster_cidr: str) -> str:
    """The body of `table ip fleet`: masquerade pod traffic that leaves the cluster.

    Traffic to other pods (the cluster CIDR) keeps its source address, so pods see
    each other's real IPs — the Kubernetes network model — once multi-node routes
    exist.  `priority 100` is srcnat, spelled numerically for older nft releases.
    """
    pod = ipaddress.IPv4Network(pod_cidr)
    cluster = ipaddress.IPv4Network(cluster_cidr)
    return (
        "chain postrouting {\n"
        "  type nat hook postrouting priority 100; policy accept;\n"
        f"  ip saddr {pod} ip daddr != {cluster} masquerade\n"
        "}\n"
    )


@dataclass(frozen=True)
class BridgeOptions:
    """The bridge driver's own settings (`NetworkConfig.options`)."""

    bridge: str = DEFAULT_BRIDGE
    mtu: int | None = None  # None: the kernel's default (1500)
    nft_table: str = DEFAULT_NFT_TABLE
    masquerade: bool = True
    backend: str = "auto"  # routes to other nodes: auto | host-gw | vxlan

    @classmethod
    def from_mapping(cls, options: Any) -> BridgeOptions:
        opts = dict(options or {})
        unknown = set(opts) - {"bridge", "mtu", "nft_table", "masquerade", "backend"}
        if unknown:
            raise ValueError(f"unknown bridge driver options: {sorted(unknown)}")
        out = cls(**opts)
        if not out.bridge or len(out.bridge) > _IFNAMSIZ or "/" in out.bridge:
            raise ValueError(f"invalid bridge name {out.bridge!r}")
        from fleet.network.peers import validate_backend

        validate_backend(out.backend)
        return out


def _netlink_errno(e: BaseException) -> int | None:
    return e.code if isinstance(e, NetlinkError) else None


@dataclass(frozen=True)
class LinkInfo:
    """One network interface as the agent's clean-up sees it."""

    name: str
    kind: str | None      # "veth", "bridge", ... (None for plain devices)
    master: str | None    # the bridge it is enslaved to, by name


def list_links_sync(netns_path: str | None = None) -> list[LinkInfo]:
    """The interfaces of a network namespace (None: this thread's), with kind and master."""
    with _iproute(netns_path) as ipr:
        links = list(ipr.get_links())
    names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in links}
    return [LinkInfo(name=str(link.get_attr("IFLA_IFNAME")), kind=_link_kind(link),
                     master=names.get(link.get_attr("IFLA_MASTER")))
            for link in links]


def delete_link_sync(name: str, netns_path: str | None = None) -> bool:
    """Delete interface `name` (a veth takes its peer with it); False if it was not there."""
    with _iproute(netns_path) as ipr:
        idx = _lookup(ipr, name)
        if idx is None:
            return False
        try:
            ipr.link("del", index=idx)
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                return False
            raise NetworkError(f"deleting link {name}: {e}") from e
    return True


def _ipv4_addrs(ipr: IPRoute, index: int) -> list[tuple[str, int]]:
    return [
        (a.get_attr("IFA_ADDRESS"), a["prefixlen"])
        for a in ipr.get_addr(index=index, family=socket.AF_INET)
    ]


class BridgeDriver:
    """Pods on a Linux bridge with host-local IPAM and egress masquerade."""

    name = DRIVER_NAME

    def __init__(self, config: NetworkConfig) -> None:
        self.config = config
        self.options = BridgeOptions.from_mapping(config.options)
        self.pod_cidr = ipaddress.IPv4Network(config.pod_cidr)
        self.cluster_cidr = ipaddress.IPv4Network(config.cluster_cidr or config.pod_cidr)
        if not self.pod_cidr.subnet_of(self.cluster_cidr):
            raise ValueError(f"pod CIDR {self.pod_cidr} is not inside cluster CIDR {self.cluster_cidr}")
        self.gateway = self.pod_cidr.network_address + 1
        self.host_netns = config.host_netns
        # One state file per bridge, so two drivers on one node (tests, or a second
        # agent) never share allocations by accident.
        self.state_path = Path(config.state_dir) / f"ipam-{self.options.bridge}.json"
        self._ipam: IPAM | None = None
        self._ipam_lock = trio.Lock()
        self._node_lock = trio.Lock()
        self._rules_applied = False
        from fleet.network.overlay import PeerRouter

        self.router = (PeerRouter(node_name=config.node_name, pod_cidr=str(self.pod_cidr),
                                  node_address=config.node_address, backend=self.options.backend,
                                  host_netns=self.host_netns, exclude=[self.options.bridge])
                       if config.node_name and config.node_address else None)

    # -- properties the agent and later network code use -----------------------
    @property
    def bridge_name(self) -> str:
        return self.options.bridge

    @property
    def nft_table(self) -> str:
        return self.options.nft_table

    async def ipam(self) -> IPAM:
        """The IPAM of this node's pod CIDR (loaded from the state file on first use)."""
        async with self._ipam_lock:
            if self._ipam is None:
                self._ipam = await trio.to_thread.run_sync(
                    IPAM, str(self.pod_cidr), self.state_path
                )
            return self._ipam

    # -- NetworkDriver --------------------------------------------------------
    async def setup(self, pod: PodRef, netns_path: str) -> PodNetwork:
        if pod.host_network:
            return PodNetwork(host_network=True, interface="", extra={"driver": self.name})
        await self._ensure_node()
        ipam = await self.ipam()
        ip = await trio.to_thread.run_sync(ipam.allocate, pod.uid)
        try:
            return await trio.to_thread.run_sync(self._setup_pod_sync, pod, netns_path, ip)
        except BaseException:
            # Leave nothing half-built behind: the next attempt starts clean, and an
            # address is never held by a pod with no interface.
            with trio.CancelScope(shield=True):
                try:
                    await self.teardown(pod, netns_path)
                except Exception:
                    log.exception("cleaning up after a failed setup of %s", pod)
            raise

    async def teardown(self, pod: PodRef, netns_path: str) -> None:
        if not pod.host_network:
            await trio.to_thread.run_sync(self._teardown_pod_sync, pod, netns_path)
        # Release after the interfaces are gone, so the address is never live twice.
        ipam = await self.ipam()
        await trio.to_thread.run_sync(ipam.release, pod.uid)

    async def recover(self, existing: Sequence[PodRef]) -> None:
        live = [p for p in existing if not p.host_network]
        await self._ensure_node(force_rules=True)
        ipam = await self.ipam()
        released = await trio.to_thread.run_sync(ipam.retain, [p.uid for p in live])
        for uid, ip in sorted(released.items()):
            log.info("network recover: released %s of vanished pod %s", ip, uid)
        keep = {host_veth_name(p.uid) for p in live}
        removed = await trio.to_thread.run_sync(self._remove_orphan_veths_sync, keep)
        for name in removed:
            log.info("network recover: removed orphan interface %s", name)

    # -- PeerRouting ------------------------------------------------------------
    async def sync_peers(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        if self.router is None:
            return
        errors = await self.router.sync(nodes)
        if errors:
            raise NetworkError("routes to other nodes: " + "; ".join(errors))

    def peer_annotations(self) -> Mapping[str, str]:
        return self.router.annotations() if self.router is not None else {}

    async def uninstall(self) -> None:
        from fleet.network.overlay import PeerRouter

        router = self.router or PeerRouter(node_name="", pod_cidr=str(self.pod_cidr),
                                           node_address="0.0.0.0", host_netns=self.host_netns)
        await router.remove()
        await trio.to_thread.run_sync(self._delete_bridge_sync)
        await nft.delete_table("ip", self.nft_table, netns=self.host_netns)
        self._rules_applied = False

    # -- node level -----------------------------------------------------------
    async def _ensure_node(self, *, force_rules: bool = False) -> None:
        async with self._node_lock:
            # Cheap netlink checks: done every time, so a bridge someone deleted comes back.
            await trio.to_thread.run_sync(self._ensure_bridge_sync)
            if self.options.masquerade and (force_rules or not self._rules_applied):
                body = render_nat_table(str(self.pod_cidr), str(self.cluster_cidr))
                await nft.replace_table("ip", self.nft_table, body, netns=self.host_netns)
                self._rules_applied = True

    def _ensure_bridge_sync(self) -> None:
        name = self.bridge_name
        try:
            with _iproute(self.host_netns) as ipr:
                idx = _lookup(ipr, name)
                if idx is None:
                    spec: dict[str, Any] = {"ifname": name, "kind": "bridge"}
                    if self.options.mtu:
                        spec["mtu"] = self.options.mtu
                    try:
                        ipr.link("add", **spec)
                    except NetlinkError as e:
                        if e.code != errno.EEXIST:
                            raise
                    idx = _lookup(ipr, name)
                    if idx is None:
                        raise NetworkError(f"bridge {name} vanished right after creation")
                    (link,) = ipr.get_links(idx)
                    # Pin the MAC (see the module docstring): setting it, even to its
                    # current value, stops the kernel from following the ports'.
                    ipr.link("set", index=idx, address=link.get_attr("IFLA_ADDRESS"))
                else:
                    (link,) = ipr.get_links(idx)
                    kind = _link_kind(link)
                    if kind != "bridge":
                        raise NetworkError(f"interface {name} exists but is a {kind}, not a bridge")
                gw = str(self.gateway)
                plen = self.pod_cidr.prefixlen
                if (gw, plen) not in _ipv4_addrs(ipr, idx):
                    try:
                        ipr.addr("add", index=idx, address=gw, prefixlen=plen)
                    except NetlinkError as e:
                        if e.code != errno.EEXIST:
                            raise
                ipr.link("set", index=idx, state="up")
            with enter_netns(self.host_netns):
                # /proc/sys/net is per namespace, resolved for the opening thread.
                with open("/proc/sys/net/ipv4/ip_forward", "r+") as f:
                    if f.read().strip() != "1":
                        f.seek(0)
                        f.write("1\n")
        except NetlinkError as e:
            raise NetworkError(f"setting up bridge {name}: {e}") from e

    def _delete_bridge_sync(self) -> None:
        with _iproute(self.host_netns) as ipr:
            idx = _lookup(ipr, self.bridge_name)
            if idx is None:
                return
            try:
                ipr.link("del", index=idx)
            except NetlinkError as e:
                if e.code != errno.ENODEV:
                    raise NetworkError(f"deleting bridge {self.bridge_name}: {e}") from e

    def _remove_orphan_veths_sync(self, keep: set[str]) -> list[str]:
        removed = []
        for link in list_links_sync(self.host_netns):
            # Only veths on *our* bridge: anything else belongs to someone else.
            if link.master != self.bridge_name or link.kind != "veth" or link.name in keep:
                continue
            if delete_link_sync(link.name, self.host_netns):
                removed.append(link.name)
        return removed

    def _setup_pod_sync(
        self, pod: PodRef, netns_path: str, ip: ipaddress.IPv4Address
    ) -> PodNetwork:
        host_if = host_veth_name(pod.uid)
        plen = self.pod_cidr.prefixlen
        gw = str(self.gateway)
        if not is_netns(netns_path):
            raise NetworkError(f"{pod}: {netns_path} is not a network namespace")
        try:
            with _iproute(self.host_netns) as hipr, _iproute(netns_path) as pipr:
                bridge = _lookup(hipr, self.bridge_name)
                if bridge is None:
                    raise NetworkError(f"bridge {self.bridge_name} is missing")
                hidx = _lookup(hipr, host_if)
                pidx = _lookup(pipr, POD_INTERFACE)
                if hidx is not None and pidx is None:
                    # Our end survived but the pod's did not: a stale pair, start over.
                    hipr.link("del", index=hidx)
                    hidx = None
                elif pidx is not None and hidx is None:
                    pipr.link("del", index=pidx)
                    pidx = None
                if hidx is None:
                    self._create_veth(hipr, host_if, netns_path)
                    hidx = _lookup(hipr, host_if)
                    pidx = _lookup(pipr, POD_INTERFACE)
                    if hidx is None or pidx is None:
                        raise NetworkError(f"{pod}: veth {host_if} was not created")
                hipr.link("set", index=hidx, master=bridge, state="up")
                # Hairpin mode (kubelet's hairpin-veth): a pod reaching itself through
                # its own Service goes out of its veth and must come back in on it.
                hipr.brport("set", index=hidx, mode=1)

                want = (str(ip), plen)
                for addr in _ipv4_addrs(pipr, pidx):
                    if addr != want:  # an address from an earlier, released allocation
                        pipr.addr("del", index=pidx, address=addr[0], prefixlen=addr[1])
                if want not in _ipv4_addrs(pipr, pidx):
                    pipr.addr("add", index=pidx, address=str(ip), prefixlen=plen)
                lo = _lookup(pipr, "lo")
                if lo is not None:
                    pipr.link("set", index=lo, state="up")
                pipr.link("set", index=pidx, state="up")
                # After eth0 is up, so the gateway is reachable through its subnet route.
                pipr.route("replace", dst="0.0.0.0/0", gateway=gw, oif=pidx)
                (plink,) = pipr.get_links(pidx)
                mac = plink.get_attr("IFLA_ADDRESS")
        except NetlinkError as e:
            raise NetworkError(f"{pod}: setting up the pod network: {e}") from e
        return PodNetwork(
            ips=(str(ip),),
            prefix_length=plen,
            gateway=gw,
            interface=POD_INTERFACE,
            mac=mac,
            host_interface=host_if,
            extra={"driver": self.name, "bridge": self.bridge_name},
        )

    def _create_veth(self, hipr: IPRoute, host_if: str, netns_path: str) -> None:
        mtu = self.options.mtu
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            peer: dict[str, Any] = {"ifname": POD_INTERFACE, "net_ns_fd": fd}
            spec: dict[str, Any] = {"ifname": host_if, "kind": "veth", "peer": peer}
            if mtu:
                peer["mtu"] = mtu
                spec["mtu"] = mtu
            hipr.link("add", **spec)
        finally:
            os.close(fd)

    def _teardown_pod_sync(self, pod: PodRef, netns_path: str) -> None:
        host_if = host_veth_name(pod.uid)
        try:
            with _iproute(self.host_netns) as hipr:
                idx = _lookup(hipr, host_if)
                if idx is not None:
                    # Deleting one end of a veth deletes both.
                    with contextlib.suppress(NetlinkError):
                        hipr.link("del", index=idx)
                if _lookup(hipr, host_if) is not None:
                    raise NetworkError(f"{pod}: could not delete {host_if}")
            if netns_path and is_netns(netns_path):
                with _iproute(netns_path) as pipr:
                    pidx = _lookup(pipr, POD_INTERFACE)
                    if pidx is not None:
                        pipr.link("del", index=pidx)
        except NetlinkError as e:
            if _netlink_errno(e) != errno.ENODEV:
                raise NetworkError(f"{pod}: tearing down the pod network: {e}") from e


def create_bridge_driver(config: NetworkConfig) -> BridgeDriver:
    """The registry factory for `bridge` (see `fleet.network.driver`)."""
    return BridgeDriver(config)


__all__ = [
    "DEFAULT_BRIDGE",
    "DEFAULT_NFT_TABLE",
    "DRIVER_NAME",
    "BridgeDriver",
    "BridgeOptions",
    "create_bridge_driver",
    "host_veth_name",
    "render_nat_table",
]
