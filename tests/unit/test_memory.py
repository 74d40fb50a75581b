"""malloc_trim returns freed heap to the OS (glibc)."""

import ctypes.util

import pytest

from fleet._core import memory


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(memory._TRIM is None, reason="needs a C library with malloc_trim (glibc)")
def test_trim_returns_freed_memory():
    assert ctypes.util.find_library("c")
    memory.trim()
    base = rss_kb()
    # Many small objects (like parsed watch events) land in heap pages that
    # glibc keeps after they are freed; trimming hands them back.
    junk = [bytearray(600) for _ in range(200_000)]
    # Something allocated after the burst pins the top of the heap, so glibc
    # cannot shrink it by itself: only a trim releases the pages below.
    keep = [bytearray(600) for _ in range(10)]
    grown = rss_kb()
    assert grown - base > 50_000
    del junk
    memory.trim()
    after = rss_kb()
    assert after - base < (grown - base) / 2
    assert keep
