"""The CNI-style seam between the agent and whatever wires pods to the network.

The agent knows pods; a network driver knows interfaces, addresses and routes.  This
module is the whole contract between them:

* `PodRef` — which pod (uid, namespace, name, and whether it uses the host network);
* `PodNetwork` — what setup produced (addresses, gateway, interface, MAC), which the
  agent reports as `status.podIP` / `status.podIPs`;
* `NetworkDriver` — `setup`, `teardown`, `recover` (and `uninstall`), like CNI's ADD /
  DEL / GC, but as async methods on a long-lived object instead of a binary per call;
* a registry of driver factories by name, so the in-tree `bridge` driver and
  third-party ones are chosen the same way — by the name in the node's config.
  Third-party packages register either by calling `register_driver` on import or by
  declaring an entry point in the `fleet.network_drivers` group
  (`name = "package.module:factory"`), which `create_driver` loads on first use.

hostNetwork pods: the caller signals them with `PodRef.host_network=True` (built by
`PodRef.from_pod` from `spec.hostNetwork`).  Drivers must then leave the network alone:
`setup` returns a `PodNetwork` with `host_network=True` and no addresses — the agent
reports the node's own address as the pod IP, as the kubelet does — and `teardown`
does nothing.  The runtime gives such pods no network namespace of their own.

Routes to other nodes' pod CIDRs are an optional capability beside the protocol,
`PeerRouting`: a driver that has it is handed every Node object as the cluster changes
(`sync_peers`) and says what to publish on its own Node (`peer_annotations`, e.g. its
VXLAN VTEP); the agent's node informer drives it (`fleet.agent.podnet`).  A driver
without it (one that routes by itself, or a single-node one) is simply not called.
Service rules live in their own nftables table next to the driver's.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: Entry-point group third-party drivers can declare themselves in.
ENTRY_POINT_GROUP = "fleet.network_drivers"


class NetworkError(Exception):
    """A pod's network could not be set up or torn down."""


class UnknownDriver(NetworkError, LookupError):
    """No driver is registered under the requested name."""


@dataclass(frozen=True)
class PodRef:
    """The pod a network operation is for.  `uid` is the key drivers index by."""

    uid: str
    namespace: str
    name: str
    host_network: bool = False

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodRef:
        """Build from a Pod object (a Kubernetes-shaped dict)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        uid = meta.get("uid")
        if not uid:
            raise ValueError("pod has no metadata.uid")
        return cls(
            uid=str(uid),
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            host_network=bool(spec.get("hostNetwork", False)),
        )

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class PodNetwork:
    """The result of setting up one pod's network."""

    #: Pod addresses, primary first (k8s `status.podIPs`); empty for hostNetwork pods.
    ips: tuple[str, ...] = ()
    #: Prefix length of the pod addresses on `interface` (the node's pod CIDR's).
    prefix_length: int | None = None
    #: The default gateway inside the pod.
    gateway: str | None = None
    #: The pod-side interface name.
    interface: str = "eth0"
    #: The pod-side interface's MAC address.
    mac: str | None = None
    #: The node-side end of the pod's link (e.g. the veth on the bridge); policy and
    #: service code later hang per-pod rules off it.
    host_interface: str | None = None
    #: True when the pod shares the node's network and nothing was set up.
    host_network: bool = False
    #: Driver-specific extras, for debugging and `kfleet describe`.
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def pod_ip(self) -> str | None:
        """The primary address (k8s `status.podIP`), or None."""
        return self.ips[0] if self.ips else None


@runtime_checkable
class NetworkDriver(Protocol):
    """Wires pods into the node's network.  Every method must be safe to retry."""

    name: str

    async def setup(self, pod: PodRef, netns_path: str) -> PodNetwork:
        """Give the pod in `netns_path` an interface and address; idempotent per pod uid."""
        ...

    async def teardown(self, pod: PodRef, netns_path: str) -> None:
        """Undo `setup` and release the pod's address; idempotent, and fine if the
        namespace is already gone."""
        ...

    async def recover(self, existing: Sequence[PodRef]) -> None:
        """After an agent restart: keep what `existing` (the live pods) hold, release
        and remove everything else the driver had made."""
        ...

    async def uninstall(self) -> None:
        """Remove the node-level setup (bridge, firewall table): for a node reset, never
        on a plain agent stop — running pods keep using it."""
        ...


@dataclass(frozen=True)
class NetworkConfig:
    """What every driver is created from: the node's share of the cluster network."""

    #: This node's pod CIDR (assigned by the server at registration), e.g. 10.42.3.0/24.
    pod_cidr: str
    #: Where the driver keeps its state (IPAM allocations).
    state_dir: str
    #: The whole cluster's pod CIDR; traffic to it is not masqueraded.  Defaults to
    #: the node's pod CIDR (a one-node cluster).
    cluster_cidr: str | None = None
    #: Path of the network namespace that plays "the node" (None: the agent's own).
    #: Tests run a whole node inside a namespace of their own this way.
    host_netns: str | None = None
    #: Driver-specific options (e.g. the bridge name).
    options: Mapping[str, Any] = field(default_factory=dict)
    #: This node's name and InternalIP: what routes to it from other nodes go through
    #: (None: no routes to other nodes, a single-node setup).
    node_name: str | None = None
    node_address: str | None = None


@runtime_checkable
class PeerRouting(Protocol):
    """A driver that connects this node's pods with the other nodes' (see the module
    docstring); the bridge driver's is `fleet.network.overlay.PeerRouter`."""

    async def sync_peers(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        """Make the routes to the pods of every node in `nodes` (all Node objects,
        this one included) match them, removing those of nodes that are gone;
        idempotent.  Raises `NetworkError` naming what could not be programmed."""
        ...

    def peer_annotations(self) -> Mapping[str, str]:
        """Annotations this node's Node must carry for peers to reach it."""
        ...


DriverFactory = Callable[[NetworkConfig], NetworkDriver]

_registry: dict[str, DriverFactory] = {}
# In-tree drivers, imported on first use so that importing this module does not pull
# in pyroute2 (the CLI and the server import `fleet.network` without needing it).
_IN_TREE: dict[str, str] = {"bridge": "fleet.network.bridge:create_bridge_driver"}
_registry_lock = threading.Lock()


def register_driver(name: str, factory: DriverFactory, *, replace: bool = False) -> None:
    """Make `factory` the driver called `name`.  Registering a taken name is an error
    unless `replace` is given, so two plugins cannot silently shadow each other."""
    if not name:
        raise ValueError("a network driver needs a name")
    with _registry_lock:
        if name in _registry and _registry[name] is not factory and not replace:
            raise ValueError(f"network driver {name!r} is already registered")
        _registry[name] = factory


def unregister_driver(name: str) -> None:
    """Forget the driver called `name` (no error if unknown)."""
    with _registry_lock:
        _registry.pop(name, None)


def registered_drivers() -> list[str]:
    """Names of the in-tree drivers and those registered so far (entry points that have
    not been loaded yet are not listed)."""
    with _registry_lock:
        return sorted(set(_registry) | set(_IN_TREE))


def _load_in_tree(name: str) -> DriverFactory | None:
    target = _IN_TREE.get(name)
    if target is None:
        return None
    module, _, attr = target.partition(":")
    factory: DriverFactory = getattr(importlib.import_module(module), attr)
    register_driver(name, factory, replace=True)
    return factory


def _load_entry_point(name: str) -> DriverFactory | None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            factory = ep.load()
            register_driver(name, factory)
            return factory
    return None


def get_driver_factory(name: str) -> DriverFactory:
    """The factory registered as `name`, loading it from an entry point if need be."""
    with _registry_lock:
        factory = _registry.get(name)
    if factory is None:
        factory = _load_in_tree(name)
    if factory is None:
        factory = _load_entry_point(name)
    if factory is None:
        known = ", ".join(registered_drivers()) or "none"
        raise UnknownDriver(f"no network driver named {name!r} (registered: {known})")
    return factory


def create_driver(name: str, config: NetworkConfig) -> NetworkDriver:
    """Create the driver called `name` for this node."""
    driver = get_driver_factory(name)(config)
    if not isinstance(driver, NetworkDriver):
        raise NetworkError(f"network driver factory {name!r} returned {driver!r}, not a driver")
    return driver


__all__ = [
    "ENTRY_POINT_GROUP",
    "DriverFactory",
    "NetworkConfig",
    "NetworkDriver",
    "NetworkError",
    "PeerRouting",
    "PodNetwork",
    "PodRef",
    "UnknownDriver",
    "create_driver",
    "get_driver_factory",
    "register_driver",
    "registered_drivers",
    "unregister_driver",
]
