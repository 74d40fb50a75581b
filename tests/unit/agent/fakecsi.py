"""A storage driver for tests: a directory per volume under a temporary root.

`TmpDirDriver` implements the node service of `fleet.storage.driver.Driver` over
`<root>/<volume id>` directories.  With `bind=True` (root) it stages and publishes
with real bind mounts (mount(2) MS_BIND), as a real node driver does; without, a
symlink stands for the publish (what a non-root test can do).  Every call is logged
in `calls` so tests can check what the agent asked for, and `fail` makes the next
call of a method raise a DriverError.  Register it with `register(name, root)`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleet.storage import registry
from fleet.storage.driver import (
    Capabilities,
    Code,
    CreateVolumeRequest,
    DriverEnv,
    DriverError,
    Volume,
    VolumeStats,
)

MS_BIND = 4096
MS_RDONLY = 1
MS_REMOUNT = 32
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def bind(src: Path, dst: Path, read_only: bool = False) -> None:
    if _libc.mount(os.fsencode(src), os.fsencode(dst), None, MS_BIND, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bind {src} {dst}: {os.strerror(e)}")
    if read_only and _libc.mount(None, os.fsencode(dst), None,
                                 MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"remount ro {dst}: {os.strerror(e)}")


def is_mount(path: Path) -> bool:
    """By mountinfo (os.path.ismount misses a bind mount within one file system)."""
    from fleet.agent.volumes import mounts_under

    return not Path(path).is_symlink() and Path(os.path.realpath(path)) in mounts_under(path)


def umount(path: Path) -> None:
    if is_mount(path) and _libc.umount2(os.fsencode(path), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"umount {path}: {os.strerror(e)}")


def umount_lazy(path: Path) -> None:
    """Detach `path` (test clean-up; errors ignored)."""
    _libc.umount2(os.fsencode(path), 2)


class TmpDirDriver:
    def __init__(self, name: str, root: Path, *, bind_mounts: bool = False,
                 caps: Capabilities | None = None) -> None:
        self.name = name
        self.root = Path(root)
        self.bind = bind_mounts
        self.capabilities = caps or Capabilities(
            volume_modes=frozenset({"Filesystem", "Block"}), node_local=True,
            topology_keys=("kubernetes.io/hostname",), expansion="online")
        self.calls: list[tuple[str, str]] = []
        self.fail: dict[str, DriverError] = {}
        self.publish_context: list[Mapping[str, str]] = []

    def _call(self, method: str, volume_id: str) -> None:
        self.calls.append((method, volume_id))
        err = self.fail.pop(method, None)
        if err is not None:
            raise err

    def backing(self, volume_id: str) -> Path:
        return self.root / volume_id

    # controller service: enough for the tests that provision through it.
    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        self.backing(req.name).mkdir(parents=True, exist_ok=True)
        return Volume(volume_id=req.name, capacity_bytes=req.capacity_bytes)

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        shutil.rmtree(self.backing(volume_id), ignore_errors=True)

    async def controller_publish(self, volume_id: str, node: str,
                                 context: Mapping[str, str]) -> Mapping[str, str]:
        return {"device": f"/dev/fake-{volume_id}"}

    async def controller_unpublish(self, volume_id: str, node: str) -> None:
        return None

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        return capacity_bytes, True

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        return None

    # node service
    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: str, publish_context: Mapping[str, str]) -> None:
        self._call("node_stage", volume_id)
        self.publish_context.append(dict(publish_context))
        src = self.backing(volume_id)
        src.mkdir(parents=True, exist_ok=True)
        staging_path.mkdir(parents=True, exist_ok=True)
        if self.bind and not is_mount(staging_path):
            bind(src, staging_path)

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        self._call("node_unstage", volume_id)
        if self.bind:
            umount(staging_path)

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: str,
                           context: Mapping[str, str]) -> None:
        self._call("node_publish", volume_id)
        if volume_mode == "Block":
            # The "device" of a fake block volume: the node's /dev/null.
            if not target_path.is_symlink():
                target_path.symlink_to("/dev/null")
            return
        if self.bind:
            target_path.mkdir(exist_ok=True)
            if not is_mount(target_path):
                bind(staging_path, target_path, read_only)
        elif not target_path.is_symlink():
            target_path.symlink_to(self.backing(volume_id))

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        self._call("node_unpublish", volume_id)
        if self.bind and not target_path.is_symlink():
            umount(target_path)
        elif target_path.is_symlink():
            target_path.unlink()

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        self._call("node_expand", volume_id)
        return capacity_bytes

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        self._call("node_volume_stats", volume_id)
        used = sum(f.stat().st_size for f in self.backing(volume_id).rglob("*") if f.is_file())
        return VolumeStats(capacity_bytes=1 << 30, available_bytes=(1 << 30) - used,
                           used_bytes=used, inodes=1000, inodes_free=990, inodes_used=10)


def register(name: str, root: Path, **kw: Any) -> dict[str, TmpDirDriver]:
    """Register a TmpDirDriver factory; the instances it made, by node name."""
    made: dict[str, TmpDirDriver] = {}

    def factory(env: DriverEnv) -> TmpDirDriver:
        d = TmpDirDriver(name, root, **kw)
        made[env.node_name or ""] = d
        return d

    registry.register(name, factory)
    return made


def precondition() -> DriverError:
    return DriverError(Code.FAILED_PRECONDITION, "online resize of a mounted ext4 refused")


__all__ = ["TmpDirDriver", "bind", "is_mount", "precondition", "register", "umount", "umount_lazy"]
