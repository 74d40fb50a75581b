"""A third-party storage driver, outside `fleet/`, for tests/e2e/test_storage.py.

`fleet server --storage-plugin tests.e2e.storage_plugin_tmpdir` (and the same flag on
`fleet agent`) imports this module, which registers the driver `DRIVER_NAME` with
`fleet.storage.registry.register` — the way an operator's own plugin would.  It only
uses the public interface of `fleet/storage/driver.py`, so a test passing with it shows
that a driver written against that interface provisions, mounts and deletes volumes
through the same machinery as the in-tree ones.

What it does: a node-local directory per volume under the driver's data dir
(`<agent data dir>/storage/<DRIVER_NAME>/volumes/<volume id>`), no size enforcement,
node_stage bind-mounts the directory at the staging path, node_publish bind-mounts the
staging path at the pod's target path (read-only when asked).  Every call is appended
to `<driver data dir>/calls.log` ("<method> <volume id>") so the test can check which
calls the node and the provisioner made.  Volume ids are `VOLUME_PREFIX + <PV name>`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import trio

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
from fleet.storage.registry import register

DRIVER_NAME = "tmpdir.e2e.fleet.test"
VOLUME_PREFIX = "tmpdir-"
JOURNAL = "calls.log"

_MS_RDONLY = 1
_MS_REMOUNT = 32
_MS_BIND = 4096
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _mount_points() -> set[str]:
    out = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split(" ")
            if len(parts) > 4:
                # mountinfo escapes space, tab, newline and backslash as \ooo.
                out.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4]))
    return out


def is_mounted(path: Path) -> bool:
    """`path` is a mount point (os.path.ismount misses binds within one file system)."""
    return os.path.realpath(path) in _mount_points()


def _bind(source: Path, target: Path, read_only: bool) -> None:
    if _libc.mount(os.fsencode(source), os.fsencode(target), None, _MS_BIND, None) != 0:
        e = ctypes.get_errno()
        raise DriverError(Code.INTERNAL, f"bind mount {source} on {target}: {os.strerror(e)}")
    if read_only:
        flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY
        if _libc.mount(None, os.fsencode(target), None, flags, None) != 0:
            e = ctypes.get_errno()
            _libc.umount2(os.fsencode(target), _MNT_DETACH)
            raise DriverError(Code.INTERNAL, f"remount {target} read-only: {os.strerror(e)}")


def _unmount(target: Path) -> None:
    if not is_mounted(target):
        return
    if _libc.umount2(os.fsencode(target), 0) != 0 and \
            _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise DriverError(Code.INTERNAL, f"umount {target}: {os.strerror(e)}")


class TmpdirDriver:
    """A directory per volume on the node that made it (see the module docstring)."""

    name = DRIVER_NAME
    capabilities = Capabilities(
        access_modes=frozenset({"ReadWriteOnce", "ReadWriteOncePod"}),
        volume_modes=frozenset({"Filesystem"}),
        node_local=True,
        topology_keys=(NODE_TOPOLOGY_KEY,),
        expansion="none",
        attach_required=False,
        capacity_tracking=False,
        enforces_capacity=False,
    )

    def __init__(self, env: DriverEnv) -> None:
        self.env = env
        self.volumes = Path(env.data_dir) / "volumes"

    # -- helpers ---------------------------------------------------------------------
    def _journal(self, method: str, volume_id: str) -> None:
        Path(self.env.data_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.env.data_dir) / JOURNAL, "a") as f:
            f.write(f"{method} {volume_id}\n")

    def _dir(self, volume_id: str) -> Path:
        if not volume_id.startswith(VOLUME_PREFIX) or "/" in volume_id or volume_id in (".", ".."):
            raise DriverError(Code.NOT_FOUND, f"volume {volume_id!r} is not a {DRIVER_NAME} volume")
        return self.volumes / volume_id

    # -- controller service ----------------------------------------------------------
    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        if self.env.node_name is None:
            raise DriverError(Code.FAILED_PRECONDITION,
                              f"{DRIVER_NAME} volumes are made on their node, not in the server")
        if req.node not in (None, self.env.node_name):
            raise DriverError(Code.INVALID_ARGUMENT,
                              f"asked for node {req.node}, this is {self.env.node_name}")
        if req.volume_mode != "Filesystem":
            raise DriverError(Code.INVALID_ARGUMENT, f"{DRIVER_NAME} has no {req.volume_mode} volumes")
        volume_id = VOLUME_PREFIX + req.name
        path = self._dir(volume_id)

        def make() -> None:
            path.mkdir(parents=True, exist_ok=True)
            (path.parent / f"{volume_id}.json").write_text(json.dumps(
                {"claim": f"{req.claim_namespace}/{req.claim_name}", "bytes": req.capacity_bytes}))
            self._journal("create_volume", volume_id)

        await trio.to_thread.run_sync(make)
        return Volume(volume_id=volume_id, capacity_bytes=req.capacity_bytes,
                      accessible_topology={NODE_TOPOLOGY_KEY: self.env.node_name},
                      context={"node": self.env.node_name})

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        path = self._dir(volume_id)

        def remove() -> None:
            shutil.rmtree(path, ignore_errors=True)
            (path.parent / f"{volume_id}.json").unlink(missing_ok=True)
            self._journal("delete_volume", volume_id)

        await trio.to_thread.run_sync(remove)

    async def controller_publish(self, volume_id: str, node: str,
                                 context: Mapping[str, str]) -> Mapping[str, str]:
        raise DriverError(Code.UNIMPLEMENTED, f"{DRIVER_NAME} needs no attach")

    async def controller_unpublish(self, volume_id: str, node: str) -> None:
        raise DriverError(Code.UNIMPLEMENTED, f"{DRIVER_NAME} needs no detach")

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        raise DriverError(Code.UNIMPLEMENTED, f"{DRIVER_NAME} volumes do not expand")

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        return None

    # -- node service ----------------------------------------------------------------
    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: VolumeMode, publish_context: Mapping[str, str]) -> None:
        path = self._dir(volume_id)

        def stage() -> None:
            if not path.is_dir():
                raise DriverError(Code.NOT_FOUND, f"volume {volume_id} is not on this node")
            Path(staging_path).mkdir(parents=True, exist_ok=True)
            if not is_mounted(Path(staging_path)):
                _bind(path, Path(staging_path), read_only=False)
            self._journal("node_stage", volume_id)

        await trio.to_thread.run_sync(stage)

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        def unstage() -> None:
            _unmount(Path(staging_path))
            with contextlib.suppress(FileNotFoundError):
                Path(staging_path).rmdir()
            self._journal("node_unstage", volume_id)

        await trio.to_thread.run_sync(unstage)

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: VolumeMode,
                           context: Mapping[str, str]) -> None:
        def publish() -> None:
            if not is_mounted(Path(staging_path)):
                raise DriverError(Code.FAILED_PRECONDITION, f"volume {volume_id} is not staged")
            Path(target_path).mkdir(parents=True, exist_ok=True)
            if not is_mounted(Path(target_path)):
                _bind(Path(staging_path), Path(target_path), read_only=read_only)
            self._journal("node_publish", volume_id)

        await trio.to_thread.run_sync(publish)

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        def unpublish() -> None:
            _unmount(Path(target_path))
            with contextlib.suppress(FileNotFoundError):
                Path(target_path).rmdir()
            self._journal("node_unpublish", volume_id)

        await trio.to_thread.run_sync(unpublish)

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        raise DriverError(Code.UNIMPLEMENTED, f"{DRIVER_NAME} volumes do not expand")

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        def stats() -> VolumeStats:
            st = os.statvfs(volume_path)
            used = 0
            for root, _dirs, files in os.walk(self._dir(volume_id)):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        used += os.lstat(os.path.join(root, name)).st_blocks * 512
            return VolumeStats(capacity_bytes=st.f_blocks * st.f_frsize,
                               available_bytes=st.f_bavail * st.f_frsize, used_bytes=used,
                               inodes=st.f_files, inodes_free=st.f_ffree,
                               inodes_used=st.f_files - st.f_ffree)

        return await trio.to_thread.run_sync(stats)


def factory(env: DriverEnv) -> TmpdirDriver:
    return TmpdirDriver(env)


def register_driver() -> None:
    """What importing this module does (again, for a process that imported it before)."""
    register(DRIVER_NAME, factory)


register_driver()
