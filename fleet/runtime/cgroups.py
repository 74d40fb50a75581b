"""Cgroups: pod cgroup parents, limits for plain processes, and resource readings.

The OCI runtime creates and limits each container's own cgroup from config.json; this
module owns what sits around that: the pod's cgroup parent (created before the first
container, removed after the last), limits for the process driver (which has no runtime
to do it), the readings the agent reports (cpu, memory, pids) and the OOM-kill counter the
shim uses to tell an OOM kill from any other SIGKILL.

Both cgroup versions are handled behind one `Cgroups` object, chosen by looking at the
mount (`<root>/cgroup.controllers` exists only on the unified v2 hierarchy):

    v1: one hierarchy per controller (or co-mounted set) under <root>/<name>; a cgroup is
        the same relative path in each.  cpuacct.usage, memory.usage_in_bytes,
        memory.stat, memory.oom_control (oom_kill), pids.current.
    v2: one tree under <root>; controllers are enabled for children through each parent's
        cgroup.subtree_control.  cpu.stat, memory.current, memory.stat,
        memory.events (oom_kill), pids.current.

Relative paths ("fleet/pod<uid>/<container>") are what the rest of Fleet passes around.
The root is a parameter so tests can point it at a fake tree.  Plain blocking file I/O:
callers on the event loop go through trio.to_thread.  Stdlib only (the shim uses it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/sys/fs/cgroup")

# The v2 controllers Fleet enables down the tree (those the kernel offers).
V2_CONTROLLERS = ("cpu", "cpuset", "io", "memory", "pids")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupStats:
    cpu_usage_ns: int | None
    memory_usage_bytes: int | None
    # Kubernetes' working set: usage minus inactive file cache (what eviction uses).
    memory_working_set_bytes: int | None
    memory_limit_bytes: int | None
    pids_current: int | None
    oom_kills: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_flat_keyed(text: str | None) -> dict[str, int]:
    """'key value' lines (memory.stat, cpu.stat, memory.events, memory.oom_control)."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            with contextlib.suppress(ValueError):
                out[parts[0]] = int(parts[1])
    return out


def cpu_shares(request_millis: int | None) -> int:
    """Kubernetes MilliCPUToShares: 1 cpu = 1024 shares, at least 2 (also for no request)."""
    if not request_millis:
        return 2
    return max(2, request_millis * 1024 // 1000)


def cpu_quota(limit_millis: int | None, period_us: int = CPU_PERIOD_US) -> int | None:
    """Kubernetes MilliCPUToQuota: CFS quota in µs per period, at least 1 ms; None = no limit."""
    if not limit_millis:
        return None
    return max(1000, limit_millis * period_us // 1000)


def shares_to_weight(shares: int) -> int:
    """cgroup v2 cpu.weight from v1 shares (the conversion runc and the kernel docs use)."""
    return 1 + ((shares - 2) * 9999) // 262142


class Cgroups:
    """The host's cgroup tree (v1 or v2, detected), addressed by relative paths."""

    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = Path(root)
        self.version = self._detect()

    def _detect(self) -> int:
        if (self.root / "cgroup.controllers").exists():
            return 2
        if self.root.is_dir() and any(self._v1_hierarchies()):
            return 1
        return 0  # no cgroup fs visible (some containers, non-Linux): no limits, no stats

    def _v1_hierarchies(self) -> dict[str, Path]:
        """Controller name → hierarchy dir, including named ones ("name=systemd" →
        "systemd") and a hybrid-mode "unified" v2 mount, so teardown visits them all."""
        out: dict[str, Path] = {}
        try:
            entries = sorted(self.root.iterdir())
        except OSError:
            return out
        seen: set[Path] = set()
        for d in entries:
            if not (d / "cgroup.procs").exists():
                continue
            real = d.resolve()
            if real in seen:
                # A co-mount symlink (cpu → cpu,cpuacct): same hierarchy.
                for name in d.name.split(","):
                    out.setdefault(name, real)
                continue
            seen.add(real)
            for name in d.name.split(","):
                out.setdefault(name, real)
        return out

    # -- paths --------------------------------------------------------------------------
    def paths(self, rel: str) -> dict[str, Path]:
        """Controller → directory of cgroup `rel` (v2: {"unified": dir}); one per
        hierarchy."""
        rel = rel.strip("/")
        if self.version == 2:
            return {"unified": self.root / rel}
        out: dict[str, Path] = {}
        seen: set[Path] = set()
        for name, hier in self._v1_hierarchies().items():
            if hier in seen:
                continue
            seen.add(hier)
            out[name] = hier / rel
        return out

    def _dir(self, controller: str, rel: str) -> Path:
        rel = rel.strip("/")
        if self.version == 2:
            return self.root / rel
        hier = self._v1_hierarchies().get(controller)
        return (hier / rel) if hier else self.root / controller / rel

    def exists(self, rel: str) -> bool:
        return any(p.is_dir() for p in self.paths(rel).values())

    def writable(self) -> bool:
        """Whether this process may create cgroups here (root, or a delegated v2 tree)."""
        if self.version == 0:
            return False
        probe = self.root if self.version == 2 else self._dir("memory", "")
        return os.access(probe, os.W_OK)

    # -- create / limit / remove --------------------------------------------------------
    def create(self, rel: str) -> None:
        """Create cgroup `rel` (and its parents) in every hierarchy; idempotent."""
        rel = rel.strip("/")
        if self.version == 2:
            self._v2_enable_down(rel)
            (self.root / rel).mkdir(parents=True, exist_ok=True)
            return
        for name, path in self.paths(rel).items():
            # Every hierarchy, named ones and hybrid mode's controller-less v2 mount
            # included, as runc does: a process is in exactly one cgroup of each.
            self._v1_mkdir(name, path)

    def _v1_mkdir(self, controller: str, path: Path) -> None:
        hier = path
        parts = []
        while not hier.exists():
            parts.append(hier)
            hier = hier.parent
        for d in reversed(parts):
            d.mkdir(exist_ok=True)
            if controller == "cpuset":
                # A new v1 cpuset starts with no cpus/mems and refuses tasks: copy the
                # parent's (what runc does for its own cgroups).
                for f in ("cpuset.cpus", "cpuset.mems"):
                    cur = _read(d / f)
                    if cur is not None and not cur.strip():
                        val = _read(d.parent / f)
                        if val is not None:
                            (d / f).write_text(val.strip())

    def _v2_enable_down(self, rel: str) -> None:
        """Enable the controllers on every ancestor of `rel` (subtree_control) so `rel`
        and its children get cpu/memory/pids files."""
        cur = self.root
        for part in [p for p in rel.split("/") if p]:
            available = set((_read(cur / "cgroup.controllers") or "").split())
            enabled = set((_read(cur / "cgroup.subtree_control") or "").split())
            want = [c for c in V2_CONTROLLERS if c in available and c not in enabled]
            for c in want:
                # One at a time: one refused controller must not block the others.
                with contextlib.suppress(OSError):
                    (cur / "cgroup.subtree_control").write_text(f"+{c}")
            cur = cur / part
            cur.mkdir(exist_ok=True)

    def set_limits(self, rel: str, *, cpu_request_millis: int | None = None,
                   cpu_limit_millis: int | None = None, memory_limit_bytes: int | None = None,
                   pids_limit: int | None = None) -> None:
        """Write limits on an existing cgroup (the process driver's containers; pods)."""
        shares = cpu_shares(cpu_request_millis)
        quota = cpu_quota(cpu_limit_millis)
        if self.version == 2:
            d = self.root / rel.strip("/")
            self._write_if(d / "cpu.weight", str(shares_to_weight(shares)))
            self._write_if(d / "cpu.max", f"{quota if quota else 'max'} {CPU_PERIOD_US}")
            if memory_limit_bytes:
                self._write_if(d / "memory.max", str(memory_limit_bytes))
                self._write_if(d / "memory.swap.max", "0")
            if pids_limit:
                self._write_if(d / "pids.max", str(pids_limit))
            return
        self._write_if(self._dir("cpu", rel) / "cpu.shares", str(shares))
        if quota:
            self._write_if(self._dir("cpu", rel) / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            self._write_if(self._dir("cpu", rel) / "cpu.cfs_quota_us", str(quota))
        if memory_limit_bytes:
            mem = self._dir("memory", rel)
            self._write_if(mem / "memory.limit_in_bytes", str(memory_limit_bytes))
            # No swap beyond the limit (kubelet does the same when swap is off).
            self._write_if(mem / "memory.memsw.limit_in_bytes", str(memory_limit_bytes))
        if pids_limit:
            self._write_if(self._dir("pids", rel) / "pids.max", str(pids_limit))

    @staticmethod
    def _write_if(path: Path, value: str) -> None:
        if path.exists():
            path.write_text(value)

    def add_process(self, rel: str, pid: int) -> None:
        for path in self.paths(rel).values():
            if path.is_dir():
                (path / "cgroup.procs").write_text(str(pid))

    def pids(self, rel: str) -> list[int]:
        out: set[int] = set()
        for path in self.paths(rel).values():
            for line in (_read(path / "cgroup.procs") or "").split():
                out.add(int(line))
        return sorted(out)

    def remove(self, rel: str, *, timeout: float = 5.0) -> bool:
        """Remove cgroup `rel` and any child cgroups, deepest first, in every hierarchy.

        rmdir fails with EBUSY while a cgroup still has tasks; those leave a moment after
        their processes die (zombies still count on v1), so retry until `timeout`.
        True once everything is gone."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            left = [p for p in self.paths(rel).values() if p.is_dir()]
            busy = False
            for path in left:
                for d in sorted((p for p in path.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True) + [path]:
                    try:
                        d.rmdir()
                    except FileNotFoundError:
                        pass
                    except OSError as e:
                        if e.errno not in (errno.EBUSY, errno.ENOTEMPTY, errno.EAGAIN):
                            raise
                        busy = True
            if not busy:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    # -- readings -------------------------------------------------------------------------
    def oom_kills(self, rel: str) -> int:
        """How many processes the kernel OOM-killed in this cgroup (and below)."""
        if self.version == 2:
            d = self.root / rel.strip("/")
            events = parse_flat_keyed(_read(d / "memory.events"))
            return events.get("oom_kill", 0)
        ctl = parse_flat_keyed(_read(self._dir("memory", rel) / "memory.oom_control"))
        if "oom_kill" in ctl:
            return ctl["oom_kill"]
        # Kernels before 4.13 lack the counter; an allocation failure at the limit is the
        # best remaining sign that the kill was the OOM killer's.
        return 1 if (_read_int(self._dir("memory", rel) / "memory.failcnt") or 0) > 0 and \
            ctl.get("under_oom", 0) else 0

    def stats(self, rel: str) -> CgroupStats:
        if self.version == 2:
            d = self.root / rel.strip("/")
            cpu = parse_flat_keyed(_read(d / "cpu.stat"))
            usage = _read_int(d / "memory.current")
            mstat = parse_flat_keyed(_read(d / "memory.stat"))
            inactive = mstat.get("inactive_file", 0)
            return CgroupStats(
                cpu_usage_ns=cpu["usage_usec"] * 1000 if "usage_usec" in cpu else None,
                memory_usage_bytes=usage,
                memory_working_set_bytes=max(0, usage - inactive) if usage is not None
                else None,
                memory_limit_bytes=_read_int(d / "memory.max"),
                pids_current=_read_int(d / "pids.current"),
                oom_kills=self.oom_kills(rel))
        mem = self._dir("memory", rel)
        usage = _read_int(mem / "memory.usage_in_bytes")
        mstat = parse_flat_keyed(_read(mem / "memory.stat"))
        inactive = mstat.get("total_inactive_file", mstat.get("inactive_file", 0))
        limit = _read_int(mem / "memory.limit_in_bytes")
        # v1 reports "no limit" as a huge page-rounded number, not "max".
        if limit is not None and limit >= (1 << 62):
            limit = None
        return CgroupStats(
            cpu_usage_ns=_read_int(self._dir("cpuacct", rel) / "cpuacct.usage"),
            memory_usage_bytes=usage,
            memory_working_set_bytes=max(0, usage - inactive) if usage is not None else None,
            memory_limit_bytes=limit,
            pids_current=_read_int(self._dir("pids", rel) / "pids.current"),
            oom_kills=self.oom_kills(rel))


def swap_accounting(root: Path = DEFAULT_ROOT) -> bool:
    """Whether memory+swap can be limited (v1 memsw files; v2 memory.swap.max)."""
    cg = Cgroups(root)
    if cg.version == 2:
        # memory.swap.max only exists below the root, and only with swap accounting on.
        return any(root.glob("*/memory.swap.max"))
    if cg.version == 1:
        return (cg._dir("memory", "") / "memory.memsw.limit_in_bytes").exists()
    return False
