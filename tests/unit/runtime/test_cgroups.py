"""fleet.runtime.cgroups: version detection, readings and limits on fake v1 and v2 trees,
plus create/remove on the machine's real hierarchy (root only)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.runtime import cgroups
from fleet.runtime.cgroups import Cgroups


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_v1(root: Path, rel: str) -> Cgroups:
    # cpu and cpuacct co-mounted with the usual symlinks, as on most distributions.
    for h in ("cpu,cpuacct", "memory", "pids", "systemd"):
        write(root / h / "cgroup.procs", "")
    (root / "cpu").symlink_to("cpu,cpuacct")
    (root / "cpuacct").symlink_to("cpu,cpuacct")
    write(root / "cpu,cpuacct" / rel / "cpuacct.usage", "123456789\n")
    write(root / "cpu,cpuacct" / rel / "cpu.shares", "1024\n")
    write(root / "cpu,cpuacct" / rel / "cpu.cfs_quota_us", "-1\n")
    write(root / "cpu,cpuacct" / rel / "cpu.cfs_period_us", "100000\n")
    mem = root / "memory" / rel
    write(mem / "memory.usage_in_bytes", "10485760\n")
    write(mem / "memory.limit_in_bytes", "9223372036854771712\n")
    write(mem / "memory.memsw.limit_in_bytes", "9223372036854771712\n")
    write(mem / "memory.stat", "cache 0\ninactive_file 100\ntotal_inactive_file 4194304\n")
    write(mem / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    write(root / "pids" / rel / "pids.current", "7\n")
    write(root / "pids" / rel / "pids.max", "max\n")
    return Cgroups(root)


def fake_v2(root: Path, rel: str) -> Cgroups:
    write(root / "cgroup.controllers", "cpuset cpu io memory hugetlb pids\n")
    write(root / "cgroup.subtree_control", "")
    d = root / rel
    write(d / "cpu.stat", "usage_usec 5000\nuser_usec 3000\nsystem_usec 2000\n")
    write(d / "memory.current", "2097152\n")
    write(d / "memory.max", "max\n")
    write(d / "memory.stat", "anon 1000\ninactive_file 1048576\n")
    write(d / "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    write(d / "pids.current", "3\n")
    for f in ("cpu.weight", "cpu.max", "memory.swap.max", "pids.max"):
        write(d / f, "")
    return Cgroups(root)


def test_detect(tmp_path: Path) -> None:
    assert Cgroups(tmp_path / "missing").version == 0
    assert fake_v1(tmp_path / "v1", "a").version == 1
    assert fake_v2(tmp_path / "v2", "a").version == 2
    assert not Cgroups(tmp_path / "missing").writable()


def test_v1_paths_dedupe_comounts(tmp_path: Path) -> None:
    cg = fake_v1(tmp_path, "fleet/pod1")
    paths = cg.paths("fleet/pod1")
    # one entry per hierarchy, whatever the symlinks
    assert sorted(p.parent.parent.name for p in paths.values()) == [
        "cpu,cpuacct", "memory", "pids", "systemd"]
    assert cg._dir("cpuacct", "fleet/pod1") == (tmp_path / "cpu,cpuacct" / "fleet/pod1")


def test_v1_stats(tmp_path: Path) -> None:
    cg = fake_v1(tmp_path, "fleet/pod1/c")
    s = cg.stats("fleet/pod1/c")
    assert s == cgroups.CgroupStats(
        cpu_usage_ns=123456789, memory_usage_bytes=10485760,
        memory_working_set_bytes=10485760 - 4194304, memory_limit_bytes=None,
        pids_current=7, oom_kills=2)


def test_v2_stats(tmp_path: Path) -> None:
    cg = fake_v2(tmp_path, "fleet/pod1/c")
    s = cg.stats("fleet/pod1/c")
    assert s == cgroups.CgroupStats(
        cpu_usage_ns=5_000_000, memory_usage_bytes=2097152,
        memory_working_set_bytes=2097152 - 1048576, memory_limit_bytes=None,
        pids_current=3, oom_kills=1)


def test_missing_files_read_as_none(tmp_path: Path) -> None:
    cg = fake_v2(tmp_path, "x")
    s = cg.stats("does/not/exist")
    assert s.cpu_usage_ns is None and s.memory_usage_bytes is None and s.oom_kills == 0


def test_v1_set_limits(tmp_path: Path) -> None:
    rel = "fleet/pod1/c"
    cg = fake_v1(tmp_path, rel)
    cg.set_limits(rel, cpu_request_millis=500, cpu_limit_millis=250,
                  memory_limit_bytes=1 << 25, pids_limit=20)
    cpu = tmp_path / "cpu,cpuacct" / rel
    assert (cpu / "cpu.shares").read_text() == "512"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "25000"
    assert (tmp_path / "memory" / rel / "memory.limit_in_bytes").read_text() == str(1 << 25)
    assert (tmp_path / "memory" / rel / "memory.memsw.limit_in_bytes").read_text() == \
        str(1 << 25)
    assert (tmp_path / "pids" / rel / "pids.max").read_text() == "20"


def test_v2_set_limits(tmp_path: Path) -> None:
    rel = "fleet/pod1/c"
    cg = fake_v2(tmp_path, rel)
    cg.set_limits(rel, cpu_request_millis=1000, memory_limit_bytes=1 << 25, pids_limit=20)
    d = tmp_path / rel
    assert (d / "cpu.weight").read_text() == "39"  # 1024 shares
    assert (d / "cpu.max").read_text() == "max 100000"
    assert (d / "memory.max").read_text() == str(1 << 25)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "pids.max").read_text() == "20"
    cg.set_limits(rel, cpu_limit_millis=1500)
    assert (d / "cpu.max").read_text() == "150000 100000"


def test_v2_create_enables_controllers(tmp_path: Path) -> None:
    cg = fake_v2(tmp_path, "other")
    cg.create("fleet/pod9")
    assert (tmp_path / "fleet" / "pod9").is_dir()
    # A plain file stands in for subtree_control: the last controller written wins, and
    # each one was written on its own ("+cpu", "+cpuset", ...), ending with pids.
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+pids"


@pytest.mark.parametrize(("millis", "shares", "quota"), [
    (None, 2, None), (0, 2, None), (1, 2, 1000), (100, 102, 10000), (1000, 1024, 100000),
    (2500, 2560, 250000),
])
def test_cpu_conversions(millis: int | None, shares: int, quota: int | None) -> None:
    assert cgroups.cpu_shares(millis) == shares
    assert cgroups.cpu_quota(millis) == quota


@pytest.mark.parametrize(("shares", "weight"), [(2, 1), (1024, 39), (262144, 10000)])
def test_shares_to_weight(shares: int, weight: int) -> None:
    assert cgroups.shares_to_weight(shares) == weight


def test_parse_flat_keyed() -> None:
    assert cgroups.parse_flat_keyed("a 1\nb x\nc 3 4\n\nd 5") == {"a": 1, "d": 5}
    assert cgroups.parse_flat_keyed(None) == {}


# -- the machine's real hierarchy ---------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not Cgroups().writable(),
    reason="needs root (creates cgroups in /sys/fs/cgroup)")


@pytest.fixture
def real_rel() -> Iterator[str]:
    rel = f"fleet-test/pod{os.getpid()}_{time.monotonic_ns()}"
    yield rel
    cg = Cgroups()
    cg.remove(rel, timeout=5)
    cg.remove("fleet-test", timeout=1)


@needs_root
def test_real_create_limit_stats_remove(real_rel: str) -> None:
    cg = Cgroups()
    cg.create(real_rel)
    cg.create(real_rel)  # idempotent
    child = f"{real_rel}/c1"
    cg.create(child)
    cg.set_limits(child, memory_limit_bytes=64 << 20, pids_limit=10)
    proc = subprocess.Popen(["sleep", "30"])
    try:
        cg.add_process(child, proc.pid)
        assert cg.pids(child) == [proc.pid]
        s = cg.stats(child)
        assert s.memory_limit_bytes == 64 << 20
        assert s.pids_current == 1
        assert s.cpu_usage_ns is not None and s.memory_usage_bytes is not None
        # busy while the process lives: bounded retry, then False
        t0 = time.monotonic()
        assert cg.remove(real_rel, timeout=0.3) is False
        assert time.monotonic() - t0 < 3
        assert cg.exists(child)
    finally:
        proc.kill()
        proc.wait()
    # the task leaves its cgroup as it is reaped: removal (children first) succeeds
    assert cg.remove(real_rel, timeout=5) is True
    assert not cg.exists(real_rel) and not cg.exists(child)
