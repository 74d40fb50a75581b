"""Give freed memory back to the operating system when the process is idle.

After a burst (a thousand watch streams opened and closed, a big list),
CPython frees its objects but glibc keeps the freed heap pages mapped, so
the server's RSS stays at its high-water mark.  `malloc_trim(0)` returns
them; it is cheap enough to run every few seconds and does nothing on a C
library that lacks it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

import trio

log = logging.getLogger(__name__)


def _load_trim():  # type: ignore[no-untyped-def]
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _load_trim()


def trim() -> bool:
    """Collect garbage and return free heap pages to the OS; True if the C library could."""
    gc.collect()
    if _TRIM is None:
        return False
    return bool(_TRIM(0))


async def trim_periodically(interval: float = 10.0, *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        await trio.sleep(interval)
        trim()
