"""The in-tree drivers' pure decisions and their controller side (no mounts needed):
ids, parameters, sizes, allocatable capacity, records, create/delete/expand."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from importlib import metadata
from pathlib import Path

import pytest

from fleet.storage import mounts, registry
from fleet.storage.driver import Code, CreateVolumeRequest, Driver, DriverEnv, DriverError
from fleet.storage.hostpath import HostPathDriver, hostpath_stats
from fleet.storage.local import (
    CAPACITY_ENV,
    RESERVE_ENV,
    LocalDriver,
    allocatable,
    fs_type_of,
    needs_grow,
    quantity_from_env,
    volume_size,
)
from fleet.storage.nodelocal import check_parameters, check_volume_id

MiB = 1 << 20
needs_mkfs = pytest.mark.skipif(not shutil.which("mkfs.ext4") or not shutil.which("mkfs.xfs"),
                                reason="mkfs.ext4 and mkfs.xfs are needed")


def _code(e: pytest.ExceptionInfo[DriverError]) -> Code:
    return e.value.code


@pytest.mark.parametrize("vid", ["pvc-0a1b", "a", "a.b-c", "x" * 253])
def test_volume_ids_that_are_names(vid: str) -> None:
    assert check_volume_id(vid) == vid


@pytest.mark.parametrize("vid", ["", "../x", "a/b", "A", "-a", "a..b", ".a", "x" * 254, "a b"])
def test_volume_ids_that_could_be_paths_are_refused(vid: str) -> None:
    with pytest.raises(DriverError) as e:
        check_volume_id(vid)
    assert _code(e) is Code.INVALID_ARGUMENT


def test_unknown_plain_parameters_are_refused_prefixed_ones_ignored() -> None:
    check_parameters("d", {"fsType": "ext4", "csi.storage.k8s.io/fstype": "xfs", "x.io/y": "1"},
                     ("fsType",))
    with pytest.raises(DriverError) as e:
        check_parameters("d", {"fstpye": "ext4"}, ("fsType",))
    assert _code(e) is Code.INVALID_ARGUMENT and "fstpye" in e.value.message


def test_fs_type_of() -> None:
    assert fs_type_of({}, "Filesystem") == "ext4"
    assert fs_type_of({"csi.storage.k8s.io/fstype": "XFS"}, "Filesystem") == "xfs"
    assert fs_type_of({"fsType": "xfs", "csi.storage.k8s.io/fstype": "xfs"}, "Filesystem") == "xfs"
    assert fs_type_of({"fsType": "xfs"}, "Block") == ""
    for bad in ({"fsType": "btrfs"}, {"fsType": "xfs", "csi.storage.k8s.io/fstype": "ext4"}):
        with pytest.raises(DriverError) as e:
            fs_type_of(bad, "Filesystem")
        assert _code(e) is Code.INVALID_ARGUMENT


def test_volume_size_rounds_to_mib_and_minimums_within_the_limit() -> None:
    assert volume_size(1, None, "ext4") == MiB
    assert volume_size(5 * MiB + 1, None, "ext4") == 6 * MiB
    assert volume_size(0, None, "") == MiB
    assert volume_size(10 * MiB, None, "xfs") == 300 * MiB
    assert volume_size(10 * MiB, 300 * MiB, "xfs") == 300 * MiB
    for cap, limit, fs in ((10 * MiB, 20 * MiB, "xfs"), (MiB + 1, MiB + 10, "ext4"),
                           (4 * MiB, 2 * MiB, "ext4")):
        with pytest.raises(DriverError) as e:
            volume_size(cap, limit, fs)
        assert _code(e) is Code.OUT_OF_RANGE


def test_allocatable_counts_promised_space_reserve_and_budget() -> None:
    # 100 free of 1000; a 50-byte image has 10 written: 40 promised; reserve 10%.
    assert allocatable(100, 1000, [(50, 10)], None, 0) == 60
    assert allocatable(100, 1000, [(50, 10)], None, 50) == 10
    assert allocatable(100, 1000, [(50, 10)], None, None) == 0  # 10% of 1000 by default
    assert allocatable(1000, 1000, [(50, 10)], None, None) == 860
    assert allocatable(10_000, 100_000, [(50, 10), (30, 30)], 200, 0) == 120
    assert allocatable(10_000, 100_000, [], 200, 0) == 200
    assert allocatable(10, 100, [(500, 0)], 100, 0) == 0


def test_needs_grow_and_quantity_from_env() -> None:
    assert needs_grow(MiB, 2 * MiB) and not needs_grow(2 * MiB, 2 * MiB)
    assert quantity_from_env({}, CAPACITY_ENV) is None
    assert quantity_from_env({CAPACITY_ENV: "2Gi"}, CAPACITY_ENV) == 2 << 30
    with pytest.raises(ValueError, match=CAPACITY_ENV):
        quantity_from_env({CAPACITY_ENV: "lots"}, CAPACITY_ENV)


def test_hostpath_stats_measures_against_the_nominal_size() -> None:
    fs = mounts.FsStats(capacity_bytes=10_000, available_bytes=500, used_bytes=9_500,
                        inodes=100, inodes_free=40)
    s = hostpath_stats(1_000, mounts.DirUsage(200, 3), fs)
    assert (s.capacity_bytes, s.used_bytes, s.available_bytes) == (1_000, 200, 500)
    assert (s.inodes, s.inodes_free, s.inodes_used, s.abnormal) == (43, 40, 3, False)
    s = hostpath_stats(100, mounts.DirUsage(200, 3), fs)
    assert s.available_bytes == 0 and s.abnormal and "does not enforce" in s.message


def _req(name: str, size: int, **kw: object) -> CreateVolumeRequest:
    return CreateVolumeRequest(name=name, capacity_bytes=size, node="n1", **kw)  # type: ignore[arg-type]


async def test_hostpath_controller_side(tmp_path: Path) -> None:
    d = HostPathDriver(DriverEnv(tmp_path, "n1", {"kubernetes.io/hostname": "n1-host"}))
    assert isinstance(d, Driver)
    v = await d.create_volume(_req("pvc-1", 5 * MiB))
    vol = tmp_path / "volumes" / "pvc-1"
    assert stat.S_IMODE(vol.stat().st_mode) == 0o777
    assert v.accessible_topology == {"kubernetes.io/hostname": "n1-host"}
    assert v.context == {"path": str(vol)}
    (vol / "data").write_text("x")
    assert await d.create_volume(_req("pvc-1", 5 * MiB)) == v
    assert (vol / "data").exists()
    with pytest.raises(DriverError) as e:
        await d.create_volume(_req("pvc-1", 6 * MiB))
    assert _code(e) is Code.ALREADY_EXISTS
    with pytest.raises(DriverError) as e:
        await d.create_volume(_req("pvc-2", MiB, volume_mode="Block"))
    assert _code(e) is Code.INVALID_ARGUMENT
    with pytest.raises(DriverError) as e:
        await d.create_volume(CreateVolumeRequest("pvc-3", MiB, node="n2"))
    assert _code(e) is Code.INVALID_ARGUMENT
    with pytest.raises(DriverError) as e:
        await HostPathDriver(DriverEnv(tmp_path)).create_volume(CreateVolumeRequest("pvc-3", MiB))
    assert _code(e) is Code.FAILED_PRECONDITION
    assert await d.controller_expand("pvc-1", 9 * MiB, {}) == (9 * MiB, False)
    assert await d.controller_expand("pvc-1", 2 * MiB, {}) == (9 * MiB, False)
    with pytest.raises(DriverError) as e:
        await d.controller_expand("pvc-9", 2 * MiB, {})
    assert _code(e) is Code.NOT_FOUND
    free = await d.get_capacity({}, "n1")
    assert free is not None and free > 0 and await d.get_capacity({}, "n2") is None
    await d.delete_volume("pvc-1", {})
    await d.delete_volume("pvc-1", {})
    assert not vol.exists() and d.records.all() == []


@needs_mkfs
async def test_local_controller_side(tmp_path: Path) -> None:
    d = LocalDriver(DriverEnv(tmp_path, "n1"), capacity_bytes=400 * MiB)
    v = await d.create_volume(_req("pvc-a", 10 * MiB + 5))
    assert v.capacity_bytes == 11 * MiB and v.context == {"fsType": "ext4"}
    img = tmp_path / "images" / "pvc-a.img"
    assert mounts.fs_size(img) == ("ext4", 11 * MiB)
    assert await d.create_volume(_req("pvc-a", 10 * MiB)) == v
    with pytest.raises(DriverError) as e:
        await d.create_volume(_req("pvc-a", 10 * MiB, parameters={"fsType": "xfs"}))
    assert _code(e) is Code.ALREADY_EXISTS
    x = await d.create_volume(_req("pvc-x", MiB, parameters={"csi.storage.k8s.io/fstype": "xfs"}))
    assert x.capacity_bytes == 300 * MiB
    assert mounts.fs_size(tmp_path / "images" / "pvc-x.img") == ("xfs", 300 * MiB)
    b = await d.create_volume(_req("pvc-b", 3 * MiB, volume_mode="Block"))
    assert b.context == {} and mounts.fs_size(tmp_path / "images" / "pvc-b.img") is None
    assert await d.get_capacity({}, "n1") == 400 * MiB - 314 * MiB
    with pytest.raises(DriverError) as e:
        await d.create_volume(_req("pvc-c", 100 * MiB))
    assert _code(e) is Code.RESOURCE_EXHAUSTED
    assert e.value.message == (f"node n1 has {86 * MiB} bytes left for local.fleet.dev, "
                               f"the volume needs {100 * MiB}")
    assert not list((tmp_path / "images").glob("*pvc-c*"))
    assert await d.controller_expand("pvc-a", 20 * MiB, {}) == (20 * MiB, True)
    assert os.stat(img).st_size == 20 * MiB and d.records.get("pvc-a").capacity_bytes == 20 * MiB
    with pytest.raises(DriverError) as e:
        await d.controller_expand("pvc-a", 200 * MiB, {})
    assert _code(e) is Code.RESOURCE_EXHAUSTED
    for vid in ("pvc-a", "pvc-x", "pvc-b", "pvc-a"):
        await d.delete_volume(vid, {})
    assert list((tmp_path / "images").iterdir()) == [] and d.records.all() == []


@needs_mkfs
async def test_local_create_recovers_from_a_crash_half_way(tmp_path: Path) -> None:
    d = LocalDriver(DriverEnv(tmp_path, "n1"))
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / ".pvc-a.img.tmp").write_bytes(b"junk")
    (tmp_path / "images" / "pvc-a.img").write_bytes(b"no record: not a volume")
    v = await d.create_volume(_req("pvc-a", 4 * MiB))
    assert mounts.fs_size(tmp_path / "images" / "pvc-a.img") == ("ext4", v.capacity_bytes)
    assert not (tmp_path / "images" / ".pvc-a.img.tmp").exists()


def test_the_registry_builds_in_tree_drivers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.load_plugins()
    monkeypatch.setenv(CAPACITY_ENV, "5Gi")
    monkeypatch.setenv(RESERVE_ENV, "1Gi")
    d = registry.create("local.fleet.dev", DriverEnv(tmp_path, "n1"))
    assert isinstance(d, LocalDriver) and (d.budget, d.reserve) == (5 << 30, 1 << 30)
    assert d.capabilities.enforces_capacity and d.capabilities.capacity_tracking
    h = registry.create("hostpath.fleet.dev", DriverEnv(tmp_path, "n1"))
    assert isinstance(h, HostPathDriver) and not h.capabilities.enforces_capacity
    for drv in (d, h):
        assert drv.capabilities.node_local and not drv.capabilities.attach_required
        assert drv.capabilities.topology_keys == ("kubernetes.io/hostname",)


# An installed package's way in: a `fleet.storage.drivers` entry point naming a callable
# that registers its driver.
EP_DRIVER = "entry-point.fleet.test"


def _register_entry_point_driver() -> None:
    registry.register(EP_DRIVER, HostPathDriver)


def test_entry_point_plugins_register_and_a_broken_one_is_only_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    group = registry.ENTRY_POINT_GROUP
    eps = [metadata.EntryPoint(name="good", value=f"{__name__}:_register_entry_point_driver", group=group),
           metadata.EntryPoint(name="broken", value="tests.unit.storage.no_such_plugin", group=group)]
    asked: list[str] = []

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        asked.append(group)
        return eps if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry.metadata, "entry_points", entry_points)
    registry.unregister(EP_DRIVER)
    try:
        with caplog.at_level(logging.ERROR, logger=registry.__name__):
            registry.load_plugins()
        assert asked == [group]
        assert registry.known(EP_DRIVER) and EP_DRIVER in registry.names()
        assert isinstance(registry.create(EP_DRIVER, DriverEnv(tmp_path, "n1")), HostPathDriver)
        assert registry.capabilities(EP_DRIVER) == HostPathDriver.capabilities
        assert "storage plugin broken (tests.unit.storage.no_such_plugin) failed to load" in caplog.text
        # A module the operator names (--storage-plugin) must load: its failure is an error.
        with pytest.raises(ModuleNotFoundError):
            registry.load_plugins(["tests.unit.storage.no_such_plugin"])
    finally:
        registry.unregister(EP_DRIVER)
    assert not registry.known(EP_DRIVER)
