"""Reading /proc/<pid>/stat: the one parser the runtime and the agent's clean-up share.

A process is named by (pid, start time) wherever Fleet records one (shim pid files,
the agent record), because a pid alone is reused; the shim measures process groups of
containers without a cgroup; `fleet killall` walks the process tree below the agent.
All of them read the same file, whose second field (the command name) may hold spaces
and parentheses — so it is split after the *last* ')', in one place.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat Fleet uses (proc(5) numbering in comments)."""

    pid: int
    state: str          # (3) R, S, D, Z (zombie), X (dead), ...
    ppid: int           # (4)
    pgid: int           # (5)
    utime: int          # (14) clock ticks
    stime: int          # (15) clock ticks
    start_time: int     # (22) clock ticks since boot
    rss_pages: int      # (24)

    @property
    def gone(self) -> bool:
        """A zombie or dead process: it runs no more, whoever reaps it."""
        return self.state in ("Z", "X")


def parse_stat(pid: int, data: bytes) -> ProcStat:
    """Parse the content of /proc/<pid>/stat."""
    f = data[data.rindex(b")") + 2:].split()
    return ProcStat(pid=pid, state=f[0].decode(), ppid=int(f[1]), pgid=int(f[2]),
                    utime=int(f[11]), stime=int(f[12]), start_time=int(f[19]),
                    rss_pages=int(f[21]))


def read_stat(pid: int) -> ProcStat | None:
    """The stat of `pid`, None when there is no such process (any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return parse_stat(pid, f.read())
    except (OSError, ValueError, IndexError):
        return None


def all_stats() -> Iterator[ProcStat]:
    """The stat of every process visible now (those that exit meanwhile are skipped)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_stat(int(entry))
            if st is not None:
                yield st


def proc_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (None: no such process)."""
    st = read_stat(pid)
    return st.start_time if st is not None else None


__all__ = ["ProcStat", "all_stats", "parse_stat", "proc_start_time", "read_stat"]
