"""The storage driver interface: what a volume plugin implements, CSI-style.

Fleet's volume plugins follow the Container Storage Interface's split, in Python
instead of gRPC, so that a CSI driver's logic maps one-to-one and a third-party
driver can be written against a small, documented surface:

- **controller service** — `create_volume`, `delete_volume`, `controller_publish`
  / `controller_unpublish` (attach/detach, only when `attach_required`),
  `controller_expand`, `get_capacity`.  Run by the provisioner loop
  (`fleet.storage.provisioner`): in the server for drivers whose volumes can be
  made from anywhere, and in each agent for `node_local` drivers (the
  external-provisioner's "distributed provisioning": the node that will use a
  volume makes it, for claims whose selected node is itself).
- **node service** — `node_stage` (once per volume per node, at the global
  mount path), `node_publish` (once per pod, a bind of the staged volume at the
  pod's target path), `node_unpublish`, `node_unstage`, `node_expand`,
  `node_volume_stats`.  Run by the agent's volume manager.

A driver is selected by name: a StorageClass's `provisioner`, a PersistentVolume's
`spec.csi.driver`.  Drivers register a factory with `fleet.storage.registry`
(in-tree ones at import, third-party ones from a module named by
`--storage-plugin` or the `fleet.storage.drivers` entry-point group); the factory
gets a `DriverEnv` saying where it runs.

Every call is idempotent, as in CSI: creating a volume that exists with the same
name and size returns it, deleting a missing volume succeeds, publishing twice is
one publish.  Failures raise `DriverError` with a CSI status code; callers retry
the retryable ones with back-off and report the message in an Event.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

# The label node-local drivers use as their topology key (volumes are pinned with
# a PV nodeAffinity term on it; Node objects carry it).
NODE_TOPOLOGY_KEY = "kubernetes.io/hostname"

VolumeMode = Literal["Filesystem", "Block"]
Expansion = Literal["none", "offline", "online"]


class Code(enum.Enum):
    """The CSI status codes a driver may answer with (gRPC codes CSI uses)."""

    INVALID_ARGUMENT = "InvalidArgument"      # bad parameters: final until the object changes
    NOT_FOUND = "NotFound"                    # the volume does not exist
    ALREADY_EXISTS = "AlreadyExists"          # same name, incompatible size/parameters
    RESOURCE_EXHAUSTED = "ResourceExhausted"  # no capacity (on this node)
    FAILED_PRECONDITION = "FailedPrecondition"  # e.g. expanding while in use, offline-only
    OUT_OF_RANGE = "OutOfRange"               # size beyond what the driver can make
    UNAVAILABLE = "Unavailable"               # transient: retry
    INTERNAL = "Internal"                     # unexpected: retry with back-off
    UNIMPLEMENTED = "Unimplemented"           # the driver lacks this capability

    @property
    def final(self) -> bool:
        """True when retrying the same request cannot succeed."""
        return self in (Code.INVALID_ARGUMENT, Code.ALREADY_EXISTS, Code.OUT_OF_RANGE,
                        Code.UNIMPLEMENTED)


class DriverError(Exception):
    """A driver call failed; `code` says how, `message` is shown to users in Events."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Capabilities:
    """What a driver can do; the controllers and the scheduler read only this."""

    access_modes: frozenset[str] = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})
    volume_modes: frozenset[str] = frozenset({"Filesystem"})
    # Volumes live on one node: provisioning runs on that node's agent, the PV gets a
    # nodeAffinity on NODE_TOPOLOGY_KEY, and the scheduler places pods with them.
    node_local: bool = False
    # Topology keys this driver reports (CSINode.spec.drivers[].topologyKeys).
    topology_keys: tuple[str, ...] = ()
    expansion: Expansion = "none"
    # controller_publish/unpublish must run (a VolumeAttachment per volume and node)
    # before node_stage (CSIDriver.spec.attachRequired).
    attach_required: bool = False
    # The driver answers get_capacity; CSIStorageCapacity objects are published and
    # the scheduler refuses nodes without room (CSIDriver.spec.storageCapacity).
    capacity_tracking: bool = False
    # The filesystem size is enforced (a writer stops at the claim's size), not only
    # measured.  Shown in docs and in `kubectl describe csidriver` as an annotation.
    enforces_capacity: bool = False


@dataclass(frozen=True)
class DriverEnv:
    """Where a driver instance runs.  `node_name` is None in the server (controller
    service of a central driver); `data_dir` is the driver's own directory
    (`<agent data dir>/storage/<driver name>` on a node, under the server's data dir
    in the server), created by the caller."""

    data_dir: Path
    node_name: str | None = None
    node_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CreateVolumeRequest:
    name: str                      # the PV name to be ("pvc-<claim uid>"): idempotency key
    capacity_bytes: int            # the claim's request
    limit_bytes: int | None = None  # the claim's limit, if any
    parameters: Mapping[str, str] = field(default_factory=dict)  # StorageClass.parameters
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)
    volume_mode: VolumeMode = "Filesystem"
    # The node the volume must be reachable from (the selected node of a
    # WaitForFirstConsumer claim); None for Immediate binding.
    node: str | None = None
    claim_namespace: str = ""
    claim_name: str = ""


@dataclass(frozen=True)
class Volume:
    volume_id: str                 # PV spec.csi.volumeHandle
    capacity_bytes: int
    # Labels the volume is reachable from (PV nodeAffinity), e.g.
    # {"kubernetes.io/hostname": "node-1"}; None = everywhere.
    accessible_topology: Mapping[str, str] | None = None
    context: Mapping[str, str] = field(default_factory=dict)  # PV spec.csi.volumeAttributes


@dataclass(frozen=True)
class VolumeStats:
    """NodeGetVolumeStats: what kubelet_volume_stats_* report."""

    capacity_bytes: int
    available_bytes: int
    used_bytes: int
    inodes: int | None = None
    inodes_free: int | None = None
    inodes_used: int | None = None
    abnormal: bool = False          # VolumeCondition
    message: str = ""


@runtime_checkable
class Driver(Protocol):
    """A volume plugin.  Methods a driver does not support raise
    DriverError(Code.UNIMPLEMENTED, ...); `capabilities` says which those are."""

    name: str
    capabilities: Capabilities

    # -- controller service ----------------------------------------------------------
    async def create_volume(self, req: CreateVolumeRequest) -> Volume: ...

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None: ...

    async def controller_publish(self, volume_id: str, node: str,
                                 context: Mapping[str, str]) -> Mapping[str, str]: ...

    async def controller_unpublish(self, volume_id: str, node: str) -> None: ...

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        """-> (new capacity, node expansion required)."""
        ...

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        """Bytes a new volume could still get (on `node`); None when unknown."""
        ...

    # -- node service ----------------------------------------------------------------
    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: VolumeMode, publish_context: Mapping[str, str]) -> None: ...

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None: ...

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: VolumeMode,
                           context: Mapping[str, str]) -> None:
        """Filesystem: make `target_path` (a directory) show the volume.  Block: make
        `target_path` (a file) a bind of the block device."""
        ...

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None: ...

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        """Grow the filesystem on this node; -> the new capacity."""
        ...

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats: ...


__all__ = ["NODE_TOPOLOGY_KEY", "Capabilities", "Code", "CreateVolumeRequest", "Driver",
           "DriverEnv", "DriverError", "Volume", "VolumeMode", "VolumeStats"]
