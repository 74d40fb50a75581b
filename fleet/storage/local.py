"""`local.fleet.dev`: a loop-mounted image file per volume, so a volume's size is a wall.

Each volume is a sparse file `<data_dir>/images/<volume id>.img` of exactly the
volume's size, formatted ext4 (default) or xfs (StorageClass parameter
`csi.storage.k8s.io/fstype` or `fsType`); Block volumes are the bare image.  A writer
inside gets ENOSPC at the limit, whatever the node's filesystem has left — project
quotas would do the same without loop devices but need the data dir's filesystem
mounted with quota support, which we cannot count on.

- **Sizes**: rounded up to whole MiB; xfs volumes are at least 300 MiB (mkfs.xfs'
  minimum), rounded up to it unless the claim's limit forbids (OUT_OF_RANGE).
- **Capacity tracking** (`get_capacity`, the CSIStorageCapacity the scheduler reads):
  the node's allocatable for this driver is the data dir filesystem's free space,
  minus what the sparse images may still grow into (their unwritten part), minus a
  reserve (10% of the filesystem by default, the kubelet's nodefs eviction threshold,
  so volumes cannot starve the node; `FLEET_LOCAL_RESERVE` or `reserve_bytes`); with
  a budget (`FLEET_LOCAL_CAPACITY`, a quantity, or the `capacity_bytes` argument)
  also at most the budget minus the sizes already provisioned.  `create_volume` refuses with RESOURCE_EXHAUSTED past it.
- **Node side**: `node_stage` attaches a loop device (reusing one already backed by
  the image: `losetup -j`, which is what survives a restart) and mounts it at the
  staging path; `node_publish` bind-mounts the staging path at the pod's target.
  Block: stage only attaches; publish bind-mounts the loop device node on the target
  file (a read-only publish gets a read-only loop device: a read-only bind of a device
  node would not stop writes).
- **Expansion**: `controller_expand` grows the image (truncate) and asks for node
  expansion; `node_expand` refreshes the loop device's size and grows the filesystem:
  xfs online (xfs_growfs); ext4 online if the kernel lets resize2fs (this one answers
  EPERM) else FAILED_PRECONDITION — the claim stays FileSystemResizePending and
  `node_stage` grows the filesystem offline (e2fsck -f, resize2fs) before it mounts it
  next time.  The grow is decided from the superblock versus the device size, so it is
  idempotent and needs no state of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

import trio

from fleet.api.quantity import QuantityError, int_value
from fleet.storage import mounts
from fleet.storage.driver import (
    NODE_TOPOLOGY_KEY,
    Capabilities,
    Code,
    CreateVolumeRequest,
    DriverEnv,
    DriverError,
    Volume,
    VolumeMode,
    VolumeStats,
)
from fleet.storage.nodelocal import (
    FSTYPE_KEYS,
    NodeLocalBase,
    VolumeRecord,
    check_modes,
    check_parameters,
    check_volume_id,
    os_error,
    publish_bind,
    round_up,
    unmount_target,
)
from fleet.storage.registry import register

NAME = "local.fleet.dev"
CAPACITY_ENV = "FLEET_LOCAL_CAPACITY"
RESERVE_ENV = "FLEET_LOCAL_RESERVE"

MiB = 1 << 20
MIN_SIZE = {"ext4": MiB, "xfs": 300 * MiB, "": MiB}
FS_TYPES = ("ext4", "xfs")
DEFAULT_FS_TYPE = "ext4"
DEFAULT_RESERVE_FRACTION = 0.10

CAPABILITIES = Capabilities(
    access_modes=frozenset({"ReadWriteOnce", "ReadWriteOncePod"}),
    volume_modes=frozenset({"Filesystem", "Block"}),
    node_local=True,
    topology_keys=(NODE_TOPOLOGY_KEY,),
    expansion="online",
    attach_required=False,
    capacity_tracking=True,
    enforces_capacity=True,
)


# ---------------------------------------------------------------------------------------
# Pure decisions


def fs_type_of(parameters: Mapping[str, str], volume_mode: str) -> str:
    """The filesystem a class asks for ("" for Block volumes)."""
    if volume_mode == "Block":
        return ""
    values = {parameters[k].strip().lower() for k in FSTYPE_KEYS if parameters.get(k)}
    if len(values) > 1:
        raise DriverError(Code.INVALID_ARGUMENT,
                          f"conflicting fsType parameters: {', '.join(sorted(values))}")
    fs = values.pop() if values else DEFAULT_FS_TYPE
    if fs not in FS_TYPES:
        raise DriverError(Code.INVALID_ARGUMENT,
                          f'fsType "{fs}" is not supported by {NAME} (supported: ext4, xfs)')
    return fs


def volume_size(capacity: int, limit: int | None, fs_type: str) -> int:
    """The image size for a request: whole MiB, at least the filesystem's minimum, and
    within the limit (OUT_OF_RANGE when the two cannot both hold)."""
    if capacity < 0 or (limit is not None and limit < capacity):
        raise DriverError(Code.OUT_OF_RANGE, f"invalid capacity range [{capacity}, {limit}]")
    size = max(round_up(capacity, MiB), MIN_SIZE[fs_type])
    if limit is not None and size > limit:
        raise DriverError(Code.OUT_OF_RANGE,
                          f"a {fs_type or 'block'} volume of {NAME} is at least "
                          f"{size} bytes ({MIN_SIZE[fs_type] // MiB}Mi minimum, whole Mi), "
                          f"above the claim's limit of {limit}")
    return size


def allocatable(fs_available: int, fs_total: int, images: Iterable[tuple[int, int]],
                budget: int | None, reserve: int | None) -> int:
    """Bytes new volumes may still take on this node.

    `images` are (size, allocated) of the provisioned images: the space they have not
    written yet is promised already, so it is not free.  `reserve` bytes of the
    filesystem stay for the node (None: 10% of it).  With a budget, the sizes of all
    images count against it."""
    images = list(images)
    promised = sum(max(0, size - used) for size, used in images)
    if reserve is None:
        reserve = int(fs_total * DEFAULT_RESERVE_FRACTION)
    room = fs_available - promised - reserve
    if budget is not None:
        room = min(room, budget - sum(size for size, _ in images))
    return max(0, room)


def needs_grow(fs_bytes: int, device_bytes: int) -> bool:
    return fs_bytes < device_bytes


def quantity_from_env(environ: Mapping[str, str], name: str) -> int | None:
    """A byte quantity ("20Gi") from the environment; None when unset."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int_value(raw)
    except QuantityError as e:
        raise ValueError(f"{name}={raw!r}: {e}") from e


# ---------------------------------------------------------------------------------------


class LocalDriver(NodeLocalBase):
    name = NAME
    capabilities = CAPABILITIES

    def __init__(self, env: DriverEnv, *, capacity_bytes: int | None = None,
                 reserve_bytes: int | None = None) -> None:
        super().__init__(env)
        self.images = env.data_dir / "images"
        self.budget = capacity_bytes
        self.reserve = reserve_bytes

    def image(self, volume_id: str) -> Path:
        return self.images / f"{check_volume_id(volume_id)}.img"

    # -- controller service ----------------------------------------------------------

    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        check_parameters(NAME, req.parameters, ("fsType",))
        check_modes(NAME, CAPABILITIES, req)
        fs_type = fs_type_of(req.parameters, req.volume_mode)
        size = volume_size(req.capacity_bytes, req.limit_bytes, fs_type)
        node = self.check_node(req)
        check_volume_id(req.name)
        async with self._create_lock, self.lock(req.name):
            rec = await trio.to_thread.run_sync(self._create, req, node, size, fs_type)
        return Volume(volume_id=rec.volume_id, capacity_bytes=rec.capacity_bytes,
                      accessible_topology=self.topology(),
                      context={"fsType": rec.fs_type} if rec.fs_type else {})

    def _create(self, req: CreateVolumeRequest, node: str, size: int, fs_type: str) -> VolumeRecord:
        image = self.image(req.name)
        rec = self.records.get(req.name)
        if rec is not None and image.exists():
            if (rec.capacity_bytes < req.capacity_bytes
                    or (req.limit_bytes is not None and rec.capacity_bytes > req.limit_bytes)
                    or rec.volume_mode != req.volume_mode or rec.fs_type != fs_type):
                raise DriverError(Code.ALREADY_EXISTS,
                                  f"volume {req.name} exists ({rec.volume_mode} {rec.fs_type} "
                                  f"{rec.capacity_bytes} bytes), incompatible with the request")
            return rec
        self.records.delete(req.name)
        room = self._allocatable()
        if size > room:
            raise DriverError(Code.RESOURCE_EXHAUSTED,
                              f"node {node} has {room} bytes left for {NAME}, "
                              f"the volume needs {size}")
        tmp = self.images / f".{req.name}.img.tmp"
        try:
            self.images.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            with open(tmp, "xb") as f:
                f.truncate(size)
            if fs_type:
                mounts.mkfs(fs_type, tmp)
            os.replace(tmp, image)
        except (OSError, mounts.CommandError) as e:
            tmp.unlink(missing_ok=True)
            raise os_error(f"make volume {req.name}", e) from e
        rec = VolumeRecord(volume_id=req.name, capacity_bytes=size, node=node,
                           volume_mode=req.volume_mode, fs_type=fs_type)
        self.records.put(rec)
        return rec

    def _allocatable(self, exclude: str = "") -> int:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fs = mounts.fs_stats(self.data_dir)
        images = [(r.capacity_bytes, mounts.allocated_bytes(self.images / f"{r.volume_id}.img"))
                  for r in self.records.all() if r.volume_id != exclude]
        return allocatable(fs.available_bytes, fs.capacity_bytes, images, self.budget,
                           self.reserve)

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        image = self.image(volume_id)
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._delete, volume_id, image)

    def _delete(self, volume_id: str, image: Path) -> None:
        loops = self._loops(image)
        if loops:
            raise DriverError(Code.FAILED_PRECONDITION,
                              f"volume {volume_id} is in use (attached as "
                              f"{', '.join(lo.device for lo in loops)})")
        image.unlink(missing_ok=True)
        (self.images / f".{volume_id}.img.tmp").unlink(missing_ok=True)
        self.records.delete(volume_id)

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        async with self._create_lock, self.lock(volume_id):
            rec = await trio.to_thread.run_sync(self._expand, volume_id, capacity_bytes)
        return rec.capacity_bytes, True

    def _expand(self, volume_id: str, capacity: int) -> VolumeRecord:
        rec = self.record(volume_id)
        size = round_up(capacity, MiB)
        if size <= rec.capacity_bytes:
            return rec
        room = self._allocatable()
        if size - rec.capacity_bytes > room:
            raise DriverError(Code.RESOURCE_EXHAUSTED,
                              f"node {rec.node} has {room} bytes left for {NAME}, growing volume "
                              f"{volume_id} to {size} needs {size - rec.capacity_bytes} more")
        try:
            os.truncate(self.image(volume_id), size)
        except OSError as e:
            raise os_error(f"grow volume {volume_id}", e) from e
        rec = replace(rec, capacity_bytes=size)
        self.records.put(rec)
        return rec

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        if node is not None and node != self.env.node_name:
            return None
        return await trio.to_thread.run_sync(self._allocatable)

    # -- node service ----------------------------------------------------------------

    def _loops(self, image: Path) -> list[mounts.Loop]:
        try:
            return mounts.loops_of(image)
        except (OSError, mounts.CommandError) as e:
            raise os_error(f"look up loop devices of {image}", e) from e

    def _rw_loop(self, volume_id: str, image: Path, *, attach: bool) -> str | None:
        rw = [lo.device for lo in self._loops(image) if not lo.read_only]
        if rw:
            return rw[0]
        if not attach:
            return None
        try:
            return mounts.loop_attach(image)
        except (OSError, mounts.CommandError) as e:
            raise os_error(f"attach volume {volume_id}", e) from e

    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: VolumeMode, publish_context: Mapping[str, str]) -> None:
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._stage, volume_id, staging_path, volume_mode)

    def _stage(self, volume_id: str, staging: Path, volume_mode: str) -> None:
        rec = self.record(volume_id)
        if rec.volume_mode != volume_mode:
            raise DriverError(Code.INVALID_ARGUMENT,
                              f"volume {volume_id} is a {rec.volume_mode} volume, not {volume_mode}")
        image = self.image(volume_id)
        if not image.exists():
            raise DriverError(Code.NOT_FOUND, f"volume {volume_id}: {image} is missing")
        try:
            staging.mkdir(parents=True, exist_ok=True)
            if volume_mode == "Filesystem" and mounts.mount_at(staging) is not None:
                dev = mounts.device_of_mount(staging)
                if any(os.stat(lo.device).st_rdev == dev for lo in self._loops(image)):
                    return
                raise DriverError(Code.FAILED_PRECONDITION,
                                  f"{staging} is mounted, but not from volume {volume_id}")
            device = self._rw_loop(volume_id, image, attach=True)
            assert device is not None
            if mounts.block_size(device) < os.stat(image).st_size:
                mounts.loop_refresh(device)
            if volume_mode == "Block":
                return
            self._mount_fs(volume_id, rec, device, staging)
        except (OSError, mounts.CommandError) as e:
            raise os_error(f"stage volume {volume_id}", e) from e

    def _mount_fs(self, volume_id: str, rec: VolumeRecord, device: str, staging: Path) -> None:
        found = mounts.fs_size(device)
        if found is None:
            # Made by create; missing only if the image was replaced by hand: format it,
            # as kubelet's FormatAndMount does with an empty device.
            mounts.mkfs(rec.fs_type, device)
            found = mounts.fs_size(device)
            assert found is not None
        fs_type, fs_bytes = found
        if fs_type != rec.fs_type:
            raise DriverError(Code.FAILED_PRECONDITION,
                              f"volume {volume_id} holds {fs_type}, expected {rec.fs_type}")
        grow = needs_grow(fs_bytes, mounts.block_size(device))
        if grow and fs_type == "ext4":
            mounts.grow_ext4_offline(device)
        mounts.mount_fs(device, staging, fs_type)
        if grow and fs_type == "xfs":
            mounts.grow_xfs(staging)

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        image = self.image(volume_id)
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._unstage, volume_id, image, staging_path)

    def _unstage(self, volume_id: str, image: Path, staging: Path) -> None:
        unmount_target(volume_id, staging, False)
        for lo in self._loops(image):
            try:
                mounts.loop_detach(lo.device)
            except (OSError, mounts.CommandError) as e:
                raise os_error(f"detach volume {volume_id} ({lo.device})", e) from e

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: VolumeMode,
                           context: Mapping[str, str]) -> None:
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._publish, volume_id, staging_path, target_path,
                                          read_only, volume_mode)

    def _publish(self, volume_id: str, staging: Path, target: Path, read_only: bool,
                 volume_mode: str) -> None:
        rec = self.record(volume_id)
        if rec.volume_mode != volume_mode:
            raise DriverError(Code.INVALID_ARGUMENT,
                              f"volume {volume_id} is a {rec.volume_mode} volume, not {volume_mode}")
        image = self.image(volume_id)
        loops = self._loops(image)
        rw = [lo for lo in loops if not lo.read_only]
        not_staged = DriverError(Code.FAILED_PRECONDITION,
                                 f"volume {volume_id} is not staged at {staging}")
        try:
            if volume_mode == "Filesystem":
                dev = mounts.device_of_mount(staging) if mounts.mount_at(staging) else None
                if dev is None or not any(os.stat(lo.device).st_rdev == dev for lo in rw):
                    raise not_staged
                publish_bind(volume_id, staging, target, read_only)
                return
            if not rw:
                raise not_staged
            self._publish_block(volume_id, image, loops, target, read_only)
        except (OSError, mounts.CommandError) as e:
            raise os_error(f"publish volume {volume_id} at {target}", e) from e

    def _publish_block(self, volume_id: str, image: Path, loops: list[mounts.Loop],
                       target: Path, read_only: bool) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch(mode=0o600)
        if mounts.mount_at(target) is not None:
            rdev = os.stat(target).st_rdev
            mine = [lo for lo in loops if os.stat(lo.device).st_rdev == rdev]
            if not mine:
                raise DriverError(Code.FAILED_PRECONDITION,
                                  f"{target} is mounted, but not from volume {volume_id}")
            if mine[0].read_only != read_only:
                raise DriverError(Code.ALREADY_EXISTS,
                                  f"volume {volume_id} is published at {target} "
                                  f"{'read-only' if mine[0].read_only else 'read-write'}")
            return
        if read_only:
            ro = [lo.device for lo in loops if lo.read_only]
            device = ro[0] if ro else mounts.loop_attach(image, read_only=True)
        else:
            device = next(lo.device for lo in loops if not lo.read_only)
        mounts.bind_mount(Path(device), target, read_only=read_only)

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        check_volume_id(volume_id)
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(unmount_target, volume_id, target_path, True)

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        async with self.lock(volume_id):
            return await trio.to_thread.run_sync(self._node_expand, volume_id, volume_path)

    def _node_expand(self, volume_id: str, volume_path: Path) -> int:
        rec = self.record(volume_id)
        image = self.image(volume_id)
        try:
            loops = self._loops(image)
            for lo in loops:
                if mounts.block_size(lo.device) < os.stat(image).st_size:
                    mounts.loop_refresh(lo.device)
            rw = [lo.device for lo in loops if not lo.read_only]
            if rec.volume_mode == "Block" or not rw:
                return rec.capacity_bytes  # not staged: node_stage grows it
            device = rw[0]
            rdev = os.stat(device).st_rdev
            mount_point = None
            if mounts.mount_at(volume_path) and mounts.device_of_mount(volume_path) == rdev:
                mount_point = volume_path
            else:
                for e in mounts.read_mountinfo():
                    if e.source == device:
                        mount_point = Path(e.mount_point)
            found = mounts.fs_size(device)
            if found is None or not needs_grow(found[1], mounts.block_size(device)):
                return rec.capacity_bytes
            if mount_point is None:
                if rec.fs_type == "ext4":
                    mounts.grow_ext4_offline(device)
                return rec.capacity_bytes
            if rec.fs_type == "xfs":
                mounts.grow_xfs(mount_point)
                return rec.capacity_bytes
            try:
                mounts.grow_ext4_online(device)
            except mounts.CommandError as e:
                raise DriverError(
                    Code.FAILED_PRECONDITION,
                    f"volume {volume_id}: this node's kernel does not resize a mounted ext4 "
                    f"filesystem ({e.output.strip().splitlines()[-1] if e.output.strip() else e}); "
                    f"it grows to {rec.capacity_bytes} bytes when the volume is next mounted "
                    "on the node (after the pods using it stop)") from e
        except (OSError, mounts.CommandError) as e:
            raise os_error(f"expand volume {volume_id}", e) from e
        return rec.capacity_bytes

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        return await trio.to_thread.run_sync(self._stats, volume_id, volume_path)

    def _stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        rec = self.record(volume_id)
        if rec.volume_mode == "Block":
            return VolumeStats(capacity_bytes=rec.capacity_bytes, available_bytes=0, used_bytes=0,
                               message="a Block volume: only its size is known")
        rdevs = {os.stat(lo.device).st_rdev for lo in self._loops(self.image(volume_id))}
        if mounts.mount_at(volume_path) is None or mounts.device_of_mount(volume_path) not in rdevs:
            raise DriverError(Code.NOT_FOUND, f"volume {volume_id} is not mounted at {volume_path}")
        fs = mounts.fs_stats(volume_path)
        return VolumeStats(capacity_bytes=fs.capacity_bytes, available_bytes=fs.available_bytes,
                           used_bytes=fs.used_bytes, inodes=fs.inodes, inodes_free=fs.inodes_free,
                           inodes_used=fs.inodes_used)


def _factory(env: DriverEnv) -> LocalDriver:
    return LocalDriver(env, capacity_bytes=quantity_from_env(os.environ, CAPACITY_ENV),
                       reserve_bytes=quantity_from_env(os.environ, RESERVE_ENV))


register(NAME, _factory)

__all__ = ["CAPABILITIES", "CAPACITY_ENV", "NAME", "RESERVE_ENV", "LocalDriver", "allocatable",
           "fs_type_of", "needs_grow", "quantity_from_env", "volume_size"]
