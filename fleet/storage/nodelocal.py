"""What the in-tree node-local drivers share: volume records, request checks, locks.

`hostpath.fleet.dev` and `local.fleet.dev` both keep their volumes on the node that
runs them, under the driver's data dir:

    <data_dir>/records/<volume id>.json   what was provisioned (size, fsType, mode, node)
    <data_dir>/volumes/<volume id>/       hostpath: the volume itself
    <data_dir>/images/<volume id>.img     local: the volume's image file

The record is written last when creating and removed last when deleting, so it is the
volume's existence: a crash half-way through create leaves no record, and the retried
create starts over.  The volume id is the request's name (the PV name
`pvc-<claim uid>`), which makes CreateVolume idempotent without any lookup table.

`NodeLocalBase` holds the checks both drivers make (the id is a plain name, the request
asks for modes the driver has, the volume belongs on this node) and a lock per volume
shared by every driver instance in the process (the provisioner loop and the agent's
volume manager each make their own instance).  The pure checks raise `DriverError`
with Kubernetes-facing messages; nothing here blocks except the record file I/O, which
callers run in threads.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from fleet.storage import mounts
from fleet.storage.driver import (
    NODE_TOPOLOGY_KEY,
    Capabilities,
    Code,
    CreateVolumeRequest,
    DriverEnv,
    DriverError,
)

_ID = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

# StorageClass parameter keys carrying the filesystem type (external-provisioner's
# reserved key, and the in-tree plugins' older one).
FSTYPE_KEYS = ("csi.storage.k8s.io/fstype", "fsType")


def check_volume_id(volume_id: str) -> str:
    """A volume id is a DNS-1123 subdomain (a PV name): never a path."""
    if not _ID.match(volume_id) or ".." in volume_id:
        raise DriverError(Code.INVALID_ARGUMENT,
                          f"invalid volume id {volume_id!r}: must be a lowercase DNS-1123 subdomain")
    return volume_id


def check_parameters(driver: str, parameters: Mapping[str, str], known: tuple[str, ...]) -> None:
    """Unknown plain parameter keys are refused (a typo must not be silently ignored);
    prefixed keys (`x/y`) belong to other tools and are ignored."""
    unknown = sorted(k for k in parameters if "/" not in k and k not in known)
    if unknown:
        raise DriverError(Code.INVALID_ARGUMENT,
                          f"{driver} does not support StorageClass parameter(s) {', '.join(unknown)}")


def check_modes(driver: str, caps: Capabilities, req: CreateVolumeRequest) -> None:
    bad = sorted(m for m in req.access_modes if m not in caps.access_modes)
    if bad:
        raise DriverError(Code.INVALID_ARGUMENT,
                          f"{driver} does not support access mode(s) {', '.join(bad)}")
    if req.volume_mode not in caps.volume_modes:
        raise DriverError(Code.INVALID_ARGUMENT,
                          f"{driver} does not support volumeMode {req.volume_mode}")


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@dataclass(frozen=True)
class VolumeRecord:
    volume_id: str
    capacity_bytes: int
    node: str
    volume_mode: str = "Filesystem"
    fs_type: str = ""


class RecordStore:
    """`<data_dir>/records/<id>.json`, each replaced atomically (write + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, volume_id: str) -> Path:
        return self.root / f"{volume_id}.json"

    def get(self, volume_id: str) -> VolumeRecord | None:
        try:
            data = json.loads(self.path(volume_id).read_text())
        except FileNotFoundError:
            return None
        return VolumeRecord(**data)

    def put(self, rec: VolumeRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{rec.volume_id}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(rec), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path(rec.volume_id))

    def delete(self, volume_id: str) -> None:
        self.path(volume_id).unlink(missing_ok=True)

    def all(self) -> list[VolumeRecord]:
        out = []
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                rec = self.get(name[:-5])
                if rec is not None:
                    out.append(rec)
        return out


# One lock per (driver data dir, volume id) in the process: CSI calls for one volume
# must not interleave (stage while unstaging), whichever driver instance makes them.
_locks: dict[tuple[str, str], trio.Lock] = {}


class NodeLocalBase:
    """Common state of a node-local driver; subclasses set `name` and `capabilities`."""

    name: str
    capabilities: Capabilities

    def __init__(self, env: DriverEnv) -> None:
        self.env = env
        self.data_dir = env.data_dir
        self.records = RecordStore(env.data_dir / "records")
        self._create_lock = _lock(os.fspath(env.data_dir), "")

    def lock(self, volume_id: str) -> trio.Lock:
        return _lock(os.fspath(self.data_dir), volume_id)

    def topology(self) -> dict[str, str]:
        node = self.env.node_name or ""
        return {NODE_TOPOLOGY_KEY: self.env.node_labels.get(NODE_TOPOLOGY_KEY, node)}

    def check_node(self, req: CreateVolumeRequest) -> str:
        """The node to make the volume on: this one, which must be the one asked for."""
        node = self.env.node_name
        if node is None:
            raise DriverError(Code.FAILED_PRECONDITION,
                              f"{self.name} makes volumes on their node: no node to provision on "
                              "(the claim needs a selected node)")
        if req.node is not None and req.node != node:
            raise DriverError(Code.INVALID_ARGUMENT,
                              f"{self.name} on node {node} cannot make a volume for node {req.node}")
        return node

    def record(self, volume_id: str) -> VolumeRecord:
        rec = self.records.get(check_volume_id(volume_id))
        if rec is None:
            raise DriverError(Code.NOT_FOUND, f"volume {volume_id} not found on node "
                                              f"{self.env.node_name}")
        return rec

    async def controller_publish(self, volume_id: str, node: str,
                                 context: Mapping[str, str]) -> Mapping[str, str]:
        raise DriverError(Code.UNIMPLEMENTED, f"{self.name} needs no attach")

    async def controller_unpublish(self, volume_id: str, node: str) -> None:
        raise DriverError(Code.UNIMPLEMENTED, f"{self.name} needs no detach")


def _lock(data_dir: str, volume_id: str) -> trio.Lock:
    key = (data_dir, volume_id)
    lock = _locks.get(key)
    if lock is None:
        lock = _locks[key] = trio.Lock()
    return lock


def os_error(what: str, e: OSError | Exception) -> DriverError:
    """A failed system call or tool, as the INTERNAL error the caller retries."""
    return DriverError(Code.INTERNAL, f"{what}: {e}")


def publish_bind(volume_id: str, staging: Path, target: Path, read_only: bool) -> None:
    """Bind the staged directory at `target` (idempotent; CSI's ALREADY_EXISTS when the
    target already shows the volume with the other read-only setting)."""
    try:
        target.mkdir(parents=True, exist_ok=True)
        entry = mounts.mount_at(target)
        if entry is not None:
            if not mounts.same_file(target, staging):
                raise DriverError(Code.FAILED_PRECONDITION,
                                  f"{target} is mounted, but not from volume {volume_id}")
            if entry.read_only != read_only:
                raise DriverError(Code.ALREADY_EXISTS,
                                  f"volume {volume_id} is published at {target} "
                                  f"{'read-only' if entry.read_only else 'read-write'}")
            return
        mounts.bind_mount(staging, target, read_only=read_only)
    except OSError as e:
        raise os_error(f"publish volume {volume_id} at {target}", e) from e


def unmount_target(volume_id: str, path: Path, remove: bool) -> None:
    """Unmount everything on `path`; with `remove`, delete the (now empty) mount point,
    as CSI's NodeUnpublish does with the target it made."""
    try:
        mounts.umount_all(path)
        if remove:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.exists() or path.is_symlink():
                path.unlink()
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno == errno.ENOTEMPTY:
            raise DriverError(Code.INTERNAL, f"{path} is not empty after unmounting volume "
                                             f"{volume_id}") from e
        raise os_error(f"unmount volume {volume_id} at {path}", e) from e


__all__ = ["FSTYPE_KEYS", "NodeLocalBase", "RecordStore", "VolumeRecord", "check_modes",
           "check_parameters", "check_volume_id", "os_error", "publish_bind", "round_up",
           "unmount_target"]
