"""Driver conformance, CSI-sanity style: every driver through the same calls, as root.

Parametrized over the in-tree drivers (hostpath; local with ext4, with xfs) and a
third-party driver defined here, outside fleet/storage, registered through
`fleet.storage.registry.register` and built by `registry.create` like any other:
create → stage → publish → write → stats → unpublish → unstage → delete, every call
twice, read-only publishing, restarts (a new driver instance finds its mounts and loop
devices), and the local driver's capacity wall, expansion (xfs online, ext4 offline at
the next stage) and Block mode.

Everything lives in a `tdrv-` temporary directory; the fixture unmounts everything
below it and detaches the loop devices of its images in `finally`.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from fleet.storage import mounts, registry
from fleet.storage.driver import (
    Capabilities,
    Code,
    CreateVolumeRequest,
    Driver,
    DriverEnv,
    DriverError,
    Volume,
    VolumeMode,
    VolumeStats,
)
from fleet.storage.local import LocalDriver

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="storage drivers mount and attach loop devices: needs root")

MiB = 1 << 20
NODE = "tdrv-node"


# ---------------------------------------------------------------------------------------
# A third-party driver: written against fleet.storage.driver only, mounting with the
# mount binary, registered from this file.

TMPDIR_DRIVER = "tmpdir.test.fleet.dev"


class TmpDirDriver:
    """Directories under its data dir; stage/publish are `mount --bind`."""

    name = TMPDIR_DRIVER
    capabilities = Capabilities(access_modes=frozenset({"ReadWriteOnce"}), node_local=True,
                                topology_keys=("kubernetes.io/hostname",), expansion="online")

    def __init__(self, env: DriverEnv) -> None:
        self.env = env

    def _dir(self, volume_id: str) -> Path:
        if "/" in volume_id or volume_id.startswith("."):
            raise DriverError(Code.INVALID_ARGUMENT, f"bad id {volume_id}")
        return self.env.data_dir / volume_id

    @staticmethod
    def _mounted(path: Path) -> bool:
        return os.path.realpath(path) in {
            line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}

    async def create_volume(self, req: CreateVolumeRequest) -> Volume:
        d = self._dir(req.name)
        d.mkdir(parents=True, exist_ok=True)
        (self.env.data_dir / f".{req.name}.size").write_text(str(req.capacity_bytes))
        return Volume(req.name, req.capacity_bytes, {"kubernetes.io/hostname": self.env.node_name or ""})

    async def delete_volume(self, volume_id: str, context: Mapping[str, str]) -> None:
        shutil.rmtree(self._dir(volume_id), ignore_errors=True)
        (self.env.data_dir / f".{volume_id}.size").unlink(missing_ok=True)

    async def controller_publish(self, volume_id: str, node: str,
                                 context: Mapping[str, str]) -> Mapping[str, str]:
        raise DriverError(Code.UNIMPLEMENTED, "no attach")

    async def controller_unpublish(self, volume_id: str, node: str) -> None:
        raise DriverError(Code.UNIMPLEMENTED, "no detach")

    async def controller_expand(self, volume_id: str, capacity_bytes: int,
                                context: Mapping[str, str]) -> tuple[int, bool]:
        (self.env.data_dir / f".{volume_id}.size").write_text(str(capacity_bytes))
        return capacity_bytes, False

    async def get_capacity(self, parameters: Mapping[str, str], node: str | None) -> int | None:
        return None

    async def node_stage(self, volume_id: str, staging_path: Path, context: Mapping[str, str],
                         volume_mode: VolumeMode, publish_context: Mapping[str, str]) -> None:
        staging_path.mkdir(parents=True, exist_ok=True)
        if not self._mounted(staging_path):
            subprocess.run(["mount", "--bind", str(self._dir(volume_id)), str(staging_path)],
                           check=True)

    async def node_unstage(self, volume_id: str, staging_path: Path) -> None:
        while self._mounted(staging_path):
            subprocess.run(["umount", str(staging_path)], check=True)

    async def node_publish(self, volume_id: str, staging_path: Path, target_path: Path, *,
                           read_only: bool, volume_mode: VolumeMode,
                           context: Mapping[str, str]) -> None:
        target_path.mkdir(parents=True, exist_ok=True)
        if not self._mounted(target_path):
            subprocess.run(["mount", "--bind", str(staging_path), str(target_path)], check=True)
            if read_only:
                subprocess.run(["mount", "-o", "remount,bind,ro", str(target_path)], check=True)

    async def node_unpublish(self, volume_id: str, target_path: Path) -> None:
        while self._mounted(target_path):
            subprocess.run(["umount", str(target_path)], check=True)
        if target_path.exists():
            target_path.rmdir()

    async def node_expand(self, volume_id: str, volume_path: Path, capacity_bytes: int) -> int:
        return capacity_bytes

    async def node_volume_stats(self, volume_id: str, volume_path: Path) -> VolumeStats:
        used = sum(p.stat().st_blocks * 512 for p in volume_path.rglob("*"))
        cap = int((self.env.data_dir / f".{volume_id}.size").read_text())
        return VolumeStats(cap, max(0, cap - used), used)


# ---------------------------------------------------------------------------------------
# Cases and fixtures


@dataclass(frozen=True)
class Case:
    id: str
    driver: str
    parameters: dict[str, str] = field(default_factory=dict)
    enforces: bool = False
    tool: str = ""


CASES = [
    Case("hostpath", "hostpath.fleet.dev"),
    Case("local-ext4", "local.fleet.dev", {}, True, "mkfs.ext4"),
    Case("local-xfs", "local.fleet.dev", {"csi.storage.k8s.io/fstype": "xfs"}, True, "mkfs.xfs"),
    Case("tmpdir", TMPDIR_DRIVER),
]


@pytest.fixture
def base() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="tdrv-"))
    try:
        yield root
    finally:
        for mp in mounts.mounts_under(root):
            try:
                mounts.umount(mp)
            except OSError:
                pass
        for img in root.rglob("*.img"):
            for lo in mounts.loops_of(img):
                mounts.loop_detach(lo.device)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _third_party() -> Iterator[None]:
    registry.load_plugins()
    registry.register(TMPDIR_DRIVER, TmpDirDriver)
    try:
        yield
    finally:
        registry.unregister(TMPDIR_DRIVER)


def make(case: Case, base: Path) -> Driver:
    if case.tool and not shutil.which(case.tool):
        pytest.skip(f"{case.tool} is not installed")
    driver = registry.create(case.driver, DriverEnv(base / "storage" / case.driver, NODE))
    assert isinstance(driver, Driver)
    return driver


def req(name: str, size: int, case: Case | None = None, **kw: object) -> CreateVolumeRequest:
    return CreateVolumeRequest(name=name, capacity_bytes=size,
                               parameters=dict(case.parameters) if case else {}, node=NODE, **kw)


def size_for(case: Case) -> int:
    return 300 * MiB if case.id == "local-xfs" else 16 * MiB


@dataclass
class Paths:
    staging: Path
    target: Path


def paths(base: Path, vid: str, pod: str = "pod-a") -> Paths:
    return Paths(base / "plugins" / vid / "globalmount", base / "pods" / pod / "volumes" / vid)


async def stage_publish(d: Driver, v: Volume, p: Paths, *, read_only: bool = False,
                        mode: VolumeMode = "Filesystem") -> None:
    await d.node_stage(v.volume_id, p.staging, v.context, mode, {})
    await d.node_publish(v.volume_id, p.staging, p.target, read_only=read_only, volume_mode=mode,
                         context=v.context)


async def teardown(d: Driver, vid: str, p: Paths) -> None:
    await d.node_unpublish(vid, p.target)
    await d.node_unstage(vid, p.staging)


case_param = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
local_cases = [c for c in CASES if c.driver == "local.fleet.dev"]
local_param = pytest.mark.parametrize("case", local_cases, ids=[c.id for c in local_cases])


# ---------------------------------------------------------------------------------------
# The suite


@case_param
async def test_lifecycle(case: Case, base: Path) -> None:
    d = make(case, base)
    vid = f"tdrv-life-{case.id}"
    v = await d.create_volume(req(vid, size_for(case), case))
    assert v.volume_id == vid and v.capacity_bytes >= size_for(case)
    assert v.accessible_topology == {"kubernetes.io/hostname": NODE}
    p = paths(base, vid)
    await stage_publish(d, v, p)
    try:
        assert mounts.mount_at(p.target) is not None
        (p.target / "data").write_bytes(os.urandom(3 * MiB))
        os.sync()
        stats = await d.node_volume_stats(vid, p.target)
        assert stats.used_bytes >= 3 * MiB
        assert stats.capacity_bytes <= v.capacity_bytes
        assert 0 <= stats.available_bytes <= stats.capacity_bytes - 3 * MiB
    finally:
        await teardown(d, vid, p)
    assert mounts.mount_at(p.target) is None and not p.target.exists()
    assert mounts.mount_at(p.staging) is None
    # The data outlives the mounts: stage and publish again in another pod.
    p2 = paths(base, vid, "pod-b")
    await stage_publish(d, v, p2)
    try:
        assert (p2.target / "data").stat().st_size == 3 * MiB
    finally:
        await teardown(d, vid, p2)
    await d.delete_volume(vid, v.context)
    assert not any(vid in str(q) for q in (base / "storage").rglob("*"))


@case_param
async def test_every_call_is_idempotent(case: Case, base: Path) -> None:
    d = make(case, base)
    vid = f"tdrv-idem-{case.id}"
    v = await d.create_volume(req(vid, size_for(case), case))
    assert await d.create_volume(req(vid, size_for(case), case)) == v
    p = paths(base, vid)
    try:
        for _ in range(2):
            await d.node_stage(vid, p.staging, v.context, "Filesystem", {})
        for _ in range(2):
            await d.node_publish(vid, p.staging, p.target, read_only=False,
                                 volume_mode="Filesystem", context=v.context)
        stacked = [e for e in mounts.read_mountinfo()
                   if e.mount_point in (str(p.staging), str(p.target))]
        assert len(stacked) == 2, stacked
    finally:
        for _ in range(2):
            await d.node_unpublish(vid, p.target)
        for _ in range(2):
            await d.node_unstage(vid, p.staging)
    for _ in range(2):
        await d.delete_volume(vid, v.context)


@case_param
async def test_read_only_publish(case: Case, base: Path) -> None:
    d = make(case, base)
    vid = f"tdrv-ro-{case.id}"
    v = await d.create_volume(req(vid, size_for(case), case))
    rw, ro = paths(base, vid, "writer"), paths(base, vid, "reader")
    await stage_publish(d, v, rw)
    await d.node_publish(vid, rw.staging, ro.target, read_only=True, volume_mode="Filesystem",
                         context=v.context)
    try:
        (rw.target / "hello").write_text("hi")
        assert (ro.target / "hello").read_text() == "hi"
        with pytest.raises(OSError) as e:
            (ro.target / "nope").write_text("x")
        assert e.value.errno == errno.EROFS
    finally:
        await d.node_unpublish(vid, ro.target)
        await teardown(d, vid, rw)
        await d.delete_volume(vid, v.context)


@pytest.mark.parametrize("case", CASES[:3], ids=[c.id for c in CASES[:3]])
async def test_incompatible_requests_and_in_use(case: Case, base: Path) -> None:
    d = make(case, base)
    vid = f"tdrv-bad-{case.id}"
    v = await d.create_volume(req(vid, size_for(case), case))
    with pytest.raises(DriverError) as e:
        await d.create_volume(req(vid, size_for(case) * 4, case))
    assert e.value.code is Code.ALREADY_EXISTS
    with pytest.raises(DriverError) as e:
        await d.create_volume(req("../etc", MiB, case))
    assert e.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(DriverError) as e:
        await d.create_volume(req("tdrv-x", MiB, case, access_modes=("ReadWriteOnce", "Bogus")))
    assert e.value.code is Code.INVALID_ARGUMENT
    with pytest.raises(DriverError) as e:
        await d.node_stage("tdrv-missing", base / "st", {}, "Filesystem", {})
    assert e.value.code is Code.NOT_FOUND
    p = paths(base, vid)
    await stage_publish(d, v, p)
    try:
        with pytest.raises(DriverError) as e:
            await d.delete_volume(vid, v.context)
        assert e.value.code is Code.FAILED_PRECONDITION
        with pytest.raises(DriverError) as e:
            await d.node_publish(vid, p.staging, p.target, read_only=True,
                                 volume_mode="Filesystem", context=v.context)
        assert e.value.code is Code.ALREADY_EXISTS
    finally:
        await teardown(d, vid, p)
    await d.delete_volume(vid, v.context)


@pytest.mark.parametrize("case", CASES[:3], ids=[c.id for c in CASES[:3]])
async def test_a_restarted_driver_finds_its_mounts(case: Case, base: Path) -> None:
    d = make(case, base)
    vid = f"tdrv-restart-{case.id}"
    v = await d.create_volume(req(vid, size_for(case), case))
    p = paths(base, vid)
    await stage_publish(d, v, p)
    (p.target / "kept").write_text("yes")
    d2 = make(case, base)  # the agent restarted: a fresh instance, same data dir
    try:
        await stage_publish(d2, v, p)
        assert [e.mount_point for e in mounts.read_mountinfo()].count(str(p.target)) == 1
        assert (p.target / "kept").read_text() == "yes"
    finally:
        await teardown(d2, vid, p)
    if case.driver == "local.fleet.dev":
        assert mounts.loops_of(d2.image(vid)) == []  # type: ignore[attr-defined]
    await d2.delete_volume(vid, v.context)


async def test_hostpath_measures_what_it_does_not_enforce(base: Path) -> None:
    d = make(CASES[0], base)
    v = await d.create_volume(req("tdrv-over", 1 * MiB))
    p = paths(base, "tdrv-over")
    await stage_publish(d, v, p)
    try:
        (p.target / "big").write_bytes(os.urandom(2 * MiB))
        os.sync()
        stats = await d.node_volume_stats("tdrv-over", p.target)
        assert stats.used_bytes >= 2 * MiB and stats.available_bytes == 0
        assert stats.abnormal and "does not enforce" in stats.message
        assert await d.controller_expand("tdrv-over", 4 * MiB, {}) == (4 * MiB, False)
        stats = await d.node_volume_stats("tdrv-over", p.target)
        assert stats.capacity_bytes == 4 * MiB and not stats.abnormal
    finally:
        await teardown(d, "tdrv-over", p)
        await d.delete_volume("tdrv-over", {})
    with pytest.raises(DriverError) as e:
        await d.create_volume(req("tdrv-huge", 1 << 60))
    assert e.value.code is Code.RESOURCE_EXHAUSTED


# ---------------------------------------------------------------------------------------
# local.fleet.dev: the wall, capacity, expansion, Block


@local_param
async def test_capacity_limit_stops_a_writer(case: Case, base: Path) -> None:
    d = make(case, base)
    vid = f"tdrv-wall-{case.id}"
    v = await d.create_volume(req(vid, size_for(case), case))
    p = paths(base, vid)
    await stage_publish(d, v, p)
    written = 0
    try:
        with pytest.raises(OSError) as e, open(p.target / "fill", "wb") as f:
            chunk = b"\xa5" * MiB
            while written < 2 * v.capacity_bytes:
                written += f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        assert e.value.errno == errno.ENOSPC
        assert v.capacity_bytes // 2 < written <= v.capacity_bytes
        stats = await d.node_volume_stats(vid, p.target)
        assert stats.available_bytes < MiB
    finally:
        await teardown(d, vid, p)
        await d.delete_volume(vid, v.context)


async def test_local_capacity_budget_and_resource_exhausted(base: Path) -> None:
    make(CASES[1], base)
    d = LocalDriver(DriverEnv(base / "storage" / "local.fleet.dev", NODE),
                    capacity_bytes=64 * MiB)
    assert await d.get_capacity({}, NODE) == 64 * MiB
    assert await d.get_capacity({}, "another-node") is None
    v = await d.create_volume(req("tdrv-cap-a", 40 * MiB))
    assert await d.get_capacity({}, NODE) == 24 * MiB
    with pytest.raises(DriverError) as e:
        await d.create_volume(req("tdrv-cap-b", 40 * MiB))
    assert e.value.code is Code.RESOURCE_EXHAUSTED
    assert not (d.images / "tdrv-cap-b.img").exists()  # no half-made volume
    with pytest.raises(DriverError) as e:
        await d.controller_expand("tdrv-cap-a", 100 * MiB, {})
    assert e.value.code is Code.RESOURCE_EXHAUSTED
    await d.delete_volume(v.volume_id, v.context)
    assert await d.get_capacity({}, NODE) == 64 * MiB
    # Without a budget the node's disk is the limit.
    free = await make(CASES[1], base).get_capacity({}, NODE)
    assert free is not None
    with pytest.raises(DriverError) as e:
        await make(CASES[1], base).create_volume(req("tdrv-cap-c", free + 1024 * MiB))
    assert e.value.code is Code.RESOURCE_EXHAUSTED


async def test_ext4_expands_offline_at_the_next_stage(base: Path) -> None:
    case = CASES[1]
    d = make(case, base)
    vid = "tdrv-grow-ext4"
    v = await d.create_volume(req(vid, 16 * MiB, case))
    p = paths(base, vid)
    await stage_publish(d, v, p)
    try:
        (p.target / "keep").write_text("data")
        before = (await d.node_volume_stats(vid, p.target)).capacity_bytes
        assert await d.controller_expand(vid, 64 * MiB, {}) == (64 * MiB, True)
        try:
            assert await d.node_expand(vid, p.target, 64 * MiB) == 64 * MiB
            grown_online = True
        except DriverError as e:
            assert e.code is Code.FAILED_PRECONDITION and "next mounted" in e.message
            grown_online = False
        during = (await d.node_volume_stats(vid, p.target)).capacity_bytes
        assert (during > before) == grown_online
    finally:
        await teardown(d, vid, p)
    await stage_publish(d, v, p)
    try:
        after = (await d.node_volume_stats(vid, p.target)).capacity_bytes
        assert after > 3 * before and (p.target / "keep").read_text() == "data"
        assert await d.node_expand(vid, p.target, 64 * MiB) == 64 * MiB  # nothing left to do
    finally:
        await teardown(d, vid, p)
        await d.delete_volume(vid, v.context)


async def test_xfs_expands_online(base: Path) -> None:
    case = CASES[2]
    d = make(case, base)
    vid = "tdrv-grow-xfs"
    v = await d.create_volume(req(vid, 300 * MiB, case))
    p = paths(base, vid)
    await stage_publish(d, v, p)
    try:
        before = (await d.node_volume_stats(vid, p.target)).capacity_bytes
        assert await d.controller_expand(vid, 500 * MiB, {}) == (500 * MiB, True)
        assert await d.node_expand(vid, p.target, 500 * MiB) == 500 * MiB
        after = (await d.node_volume_stats(vid, p.target)).capacity_bytes
        assert after - before >= 190 * MiB
        assert await d.node_expand(vid, p.target, 500 * MiB) == 500 * MiB
    finally:
        await teardown(d, vid, p)
        await d.delete_volume(vid, v.context)


async def test_xfs_rounds_up_to_its_minimum_or_refuses_past_the_limit(base: Path) -> None:
    case = CASES[2]
    d = make(case, base)
    v = await d.create_volume(req("tdrv-xfs-min", 10 * MiB, case))
    assert v.capacity_bytes == 300 * MiB
    await d.delete_volume(v.volume_id, v.context)
    with pytest.raises(DriverError) as e:
        await d.create_volume(req("tdrv-xfs-lim", 10 * MiB, case, limit_bytes=20 * MiB))
    assert e.value.code is Code.OUT_OF_RANGE


async def test_block_volume(base: Path) -> None:
    d = make(CASES[1], base)
    vid = "tdrv-block"
    v = await d.create_volume(req(vid, 8 * MiB, volume_mode="Block"))
    p = paths(base, vid)
    ro = paths(base, vid, "reader")
    await stage_publish(d, v, p, mode="Block")
    try:
        await stage_publish(d, v, p, mode="Block")  # both idempotent
        loops = mounts.loops_of(d.image(vid))  # type: ignore[attr-defined]
        assert [lo.read_only for lo in loops] == [False]
        assert mounts.mount_at(p.staging) is None  # Block stage only attaches
        assert mounts.is_block_device(p.target) and mounts.mount_at(p.target) is not None
        assert os.stat(p.target).st_rdev == os.stat(loops[0].device).st_rdev
        assert mounts.block_size(p.target) == 8 * MiB
        payload = os.urandom(4096)
        fd = os.open(p.target, os.O_RDWR)
        try:
            os.pwrite(fd, payload, MiB)
            os.fsync(fd)
        finally:
            os.close(fd)
        await d.node_publish(vid, p.staging, ro.target, read_only=True, volume_mode="Block",
                             context=v.context)
        await d.node_publish(vid, p.staging, ro.target, read_only=True, volume_mode="Block",
                             context=v.context)
        with open(ro.target, "rb") as f:
            f.seek(MiB)
            assert f.read(4096) == payload
        with pytest.raises(OSError) as e:  # refused at open or at the write
            fd = os.open(ro.target, os.O_WRONLY)
            try:
                os.pwrite(fd, b"x" * 4096, 0)
            finally:
                os.close(fd)
        assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        # Expansion: the device grows (no filesystem to grow).
        assert await d.controller_expand(vid, 16 * MiB, {}) == (16 * MiB, True)
        assert await d.node_expand(vid, p.target, 16 * MiB) == 16 * MiB
        assert mounts.block_size(p.target) == 16 * MiB
        stats = await d.node_volume_stats(vid, p.target)
        assert stats.capacity_bytes == 16 * MiB
        with pytest.raises(DriverError) as e2:
            await d.node_stage(vid, p.staging, v.context, "Filesystem", {})
        assert e2.value.code is Code.INVALID_ARGUMENT
    finally:
        await d.node_unpublish(vid, ro.target)
        await teardown(d, vid, p)
        await teardown(d, vid, p)
    assert mounts.loops_of(d.image(vid)) == []  # type: ignore[attr-defined]
    assert not p.target.exists()
    await d.delete_volume(vid, v.context)


def test_third_party_driver_is_found_by_name() -> None:
    assert TMPDIR_DRIVER in registry.names()
    assert {"hostpath.fleet.dev", "local.fleet.dev"} <= set(registry.names())
    made: Callable[[DriverEnv], Driver] = TmpDirDriver
    assert isinstance(made(DriverEnv(Path("/nonexistent"))), Driver)


@pytest.mark.parametrize("case", CASES[:2], ids=[c.id for c in CASES[:2]])
async def test_concurrent_volumes_do_not_collide(case: Case, base: Path) -> None:
    d = make(case, base)
    n = 6
    vids = [f"tdrv-par-{case.id}-{i}" for i in range(n)]
    vols: dict[str, Volume] = {}

    async def up(vid: str) -> None:
        vols[vid] = await d.create_volume(req(vid, 8 * MiB, case))
        await stage_publish(d, vols[vid], paths(base, vid))
        (paths(base, vid).target / "who").write_text(vid)

    async def down(vid: str) -> None:
        await teardown(d, vid, paths(base, vid))
        await d.delete_volume(vid, {})

    try:
        async with trio.open_nursery() as nursery:
            for vid in vids:
                nursery.start_soon(up, vid)
        for vid in vids:
            assert (paths(base, vid).target / "who").read_text() == vid
        if case.driver == "local.fleet.dev":
            devices = {lo.device for vid in vids
                       for lo in mounts.loops_of(d.image(vid))}  # type: ignore[attr-defined]
            assert len(devices) == n
    finally:
        async with trio.open_nursery() as nursery:
            for vid in vids:
                nursery.start_soon(down, vid)
    assert not any(mounts.mounts_under(base))
