"""The one /proc/<pid>/stat parser: command names with spaces and parentheses, gone pids."""

from __future__ import annotations

import os

from fleet.runtime.procfs import all_stats, parse_stat, proc_start_time, read_stat

# Field 2 (comm) holds spaces and a ')': the split must happen after the last ')'.
LINE = (b"4242 (a) b (c)) Z 17 4242 4242 0 -1 4194304 0 0 0 0 7 3 0 0 20 0 1 0 "
        b"987654 12345678 99 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")


def test_parse_stat_splits_after_the_last_parenthesis() -> None:
    st = parse_stat(4242, LINE)
    assert (st.state, st.ppid, st.pgid) == ("Z", 17, 4242)
    assert (st.utime, st.stime, st.start_time, st.rss_pages) == (7, 3, 987654, 99)
    assert st.gone


def test_this_process_is_read_and_listed() -> None:
    me = read_stat(os.getpid())
    assert me is not None and not me.gone and me.ppid == os.getppid()
    assert proc_start_time(os.getpid()) == me.start_time > 0
    assert any(st.pid == os.getpid() for st in all_stats())


def test_a_missing_pid_is_none() -> None:
    assert read_stat(2**22 + 12345) is None
    assert proc_start_time(2**22 + 12345) is None
