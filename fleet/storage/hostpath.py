"""`hostpath.fleet.dev`: a directory per volume under the node's data dir.

What k3s users know as local-path: the volume is `<data_dir>/volumes/<volume id>`
(mode 0777, as local-path-provisioner makes it, so non-root containers can write) on
the node that provisioned it, pinned there by the PV's node affinity.

- Capacity is not enforced (`enforces_capacity=False`): the directory shares the
  node's filesystem.  `node_volume_stats` measures what the volume really uses (a
  walk, like `du`) and reports the claim's size as capacity, flagging the volume
  abnormal when it has outgrown it.  `get_capacity` is the free space of the
  filesystem holding the data dir, and a claim larger than that is refused with
  RESOURCE_EXHAUSTED, so the scheduler's capacity check and create agree.
- Staging bind-mounts the directory at the staging path; publishing bind-mounts the
  staging path at the pod's target (then remounts it read-only when asked).
- Expansion only records the new size (nothing on the node limits it).
- Access modes: all four; ReadWriteMany/ReadOnlyMany only ever on this one node.

Every call is idempotent and rediscovers its state from the mount table and the
record files, so an agent restart with volumes mounted is a non-event.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import replace
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
    Volume,
    VolumeMode,
    VolumeStats,
)
from fleet.storage.nodelocal import (
    NodeLocalBase,
    VolumeRecord,
    check_modes,
    check_parameters,
    check_volume_id,
    os_error,
    publish_bind,
    unmount_target,
)
from fleet.storage.registry import register

NAME = "hostpath.fleet.dev"

CAPABILITIES = Capabilities(
    access_modes=frozenset({"ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"}),
    volume_modes=frozenset({"Filesystem"}),
    node_local=True,
    topology_keys=(NODE_TOPOLOGY_KEY,),
    expansion="online",
    attach_required=False,
    capacity_tracking=True,
    enforces_capacity=False,
)


class HostPathDriver(NodeLocalBase):
    name = NAME
    capabilities = CAPABILITIES

    def __init__(self, env: DriverEnv) -> None:
        super().__init__(env)
        self.volumes = env.data_dir / "volumes"

    def volume_dir(self, volume_id: str) -> Path:
        return self.volumes / check_volume_id(volume_id)

    # -- controller service ----------------------------------------------------------

    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        check_parameters(NAME, req.parameters, ())
        check_modes(NAME, CAPABILITIES, req)
        node = self.check_node(req)
        check_volume_id(req.name)
        async with self._create_lock, self.lock(req.name):
            rec = await trio.to_thread.run_sync(self._create, req, node)
        return self._volume(rec)

    def _create(self, req: CreateVolumeRequest, node: str) -> VolumeRecord:
        rec = self.records.get(req.name)
        if rec is not None:
            if rec.capacity_bytes < req.capacity_bytes or (
                    req.limit_bytes is not None and rec.capacity_bytes > req.limit_bytes):
                raise DriverError(Code.ALREADY_EXISTS,
                                  f"volume {req.name} exists with size {rec.capacity_bytes}, "
                                  f"incompatible with the requested {req.capacity_bytes}")
            return rec
        free = mounts.fs_stats(self._fs_root()).available_bytes
        if req.capacity_bytes > free:
            raise DriverError(Code.RESOURCE_EXHAUSTED,
                              f"node {node} has {free} bytes free for {NAME}, "
                              f"the claim asks for {req.capacity_bytes}")
        path = self.volume_dir(req.name)
        try:
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o777)
        except OSError as e:
            raise os_error(f"create {path}", e) from e
        rec = VolumeRecord(volume_id=req.name, capacity_bytes=req.capacity_bytes, node=node)
        self.records.put(rec)
        return rec

    def _volume(self, rec: VolumeRecord) -> Volume:
        return Volume(volume_id=rec.volume_id, capacity_bytes=rec.capacity_bytes,
                      accessible_topology=self.topology(),
                      context={"path": os.fspath(self.volumes / rec.volume_id)})

    def _fs_root(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return self.data_dir

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        path = self.volume_dir(volume_id)
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._delete, volume_id, path)

    def _delete(self, volume_id: str, path: Path) -> None:
        if path.exists():
            used = [e.mount_point for e in mounts.binds_of(path)] + [
                os.fspath(p) for p in mounts.mounts_under(path)]
            if used:
                raise DriverError(Code.FAILED_PRECONDITION,
                                  f"volume {volume_id} is in use: mounted at {', '.join(used)}")
            try:
                shutil.rmtree(path)
            except OSError as e:
                raise os_error(f"remove {path}", e) from e
        self.records.delete(volume_id)

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        async with self.lock(volume_id):
            rec = await trio.to_thread.run_sync(self.record, volume_id)
            if capacity_bytes > rec.capacity_bytes:
                rec = replace(rec, capacity_bytes=capacity_bytes)
                await trio.to_thread.run_sync(self.records.put, rec)
        return rec.capacity_bytes, False

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        if node is not None and node != self.env.node_name:
            return None
        stats = await trio.to_thread.run_sync(lambda: mounts.fs_stats(self._fs_root()))
        return stats.available_bytes

    # -- node service ----------------------------------------------------------------

    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: VolumeMode, publish_context: Mapping[str, str]) -> None:
        if volume_mode != "Filesystem":
            raise DriverError(Code.INVALID_ARGUMENT, f"{NAME} has no Block volumes")
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._stage, volume_id, staging_path)

    def _stage(self, volume_id: str, staging: Path) -> None:
        self.record(volume_id)
        source = self.volume_dir(volume_id)
        if not source.is_dir():
            raise DriverError(Code.NOT_FOUND, f"volume {volume_id}: {source} is missing")
        try:
            staging.mkdir(parents=True, exist_ok=True)
            if mounts.mount_at(staging) is not None:
                if mounts.same_file(staging, source):
                    return
                raise DriverError(Code.FAILED_PRECONDITION,
                                  f"{staging} is mounted, but not from volume {volume_id}")
            mounts.bind_mount(source, staging)
        except OSError as e:
            raise os_error(f"stage volume {volume_id}", e) from e

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        check_volume_id(volume_id)
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(unmount_target, volume_id, staging_path, False)

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: VolumeMode,
                           context: Mapping[str, str]) -> None:
        if volume_mode != "Filesystem":
            raise DriverError(Code.INVALID_ARGUMENT, f"{NAME} has no Block volumes")
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(self._publish, volume_id, staging_path, target_path,
                                          read_only)

    def _publish(self, volume_id: str, staging: Path, target: Path, read_only: bool) -> None:
        source = self.volume_dir(volume_id)
        if mounts.mount_at(staging) is None or not mounts.same_file(staging, source):
            raise DriverError(Code.FAILED_PRECONDITION,
                              f"volume {volume_id} is not staged at {staging}")
        publish_bind(volume_id, staging, target, read_only)

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        check_volume_id(volume_id)
        async with self.lock(volume_id):
            await trio.to_thread.run_sync(unmount_target, volume_id, target_path, True)

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        rec = await trio.to_thread.run_sync(self.record, volume_id)
        return rec.capacity_bytes

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        rec = await trio.to_thread.run_sync(self.record, volume_id)
        source = self.volume_dir(volume_id)

        def measure() -> tuple[mounts.DirUsage, mounts.FsStats]:
            if not source.is_dir():
                raise DriverError(Code.NOT_FOUND, f"volume {volume_id}: {source} is missing")
            return mounts.dir_usage(source), mounts.fs_stats(source)

        usage, fs = await trio.to_thread.run_sync(measure)
        return hostpath_stats(rec.capacity_bytes, usage, fs)


def hostpath_stats(capacity: int, usage: mounts.DirUsage, fs: mounts.FsStats) -> VolumeStats:
    """A measured directory's stats against the claim's nominal size (pure)."""
    over = usage.bytes > capacity
    return VolumeStats(
        capacity_bytes=capacity,
        available_bytes=max(0, min(capacity - usage.bytes, fs.available_bytes)),
        used_bytes=usage.bytes,
        inodes=usage.inodes + fs.inodes_free, inodes_free=fs.inodes_free, inodes_used=usage.inodes,
        abnormal=over,
        message=(f"the volume uses {usage.bytes} bytes, more than its {capacity} "
                 f"({NAME} does not enforce capacity)") if over else "")


def _factory(env: DriverEnv) -> HostPathDriver:
    return HostPathDriver(env)


register(NAME, _factory)

__all__ = ["CAPABILITIES", "NAME", "HostPathDriver", "hostpath_stats"]
