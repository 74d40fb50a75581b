"""Image garbage collection under disk pressure (the kubelet's image GC policy).

When the filesystem holding the image store is more than `high` percent full,
unused images are removed, least recently used first, until usage is back
under `low` percent.  Images any pod on the node still names are kept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from fleet.runtime.images import ImageStore

log = logging.getLogger(__name__)

HIGH_PERCENT = 85
LOW_PERCENT = 80


def bytes_to_free(total: int, free: int, *, high: int = HIGH_PERCENT, low: int = LOW_PERCENT) -> int:
    """How much to free so usage drops to `low`% — 0 while usage is at or under `high`%."""
    if total <= 0:
        return 0
    used = total - free
    if used * 100 <= total * high:
        return 0
    return max(0, used - total * low // 100)


def images_in_use(pods: Iterable[dict]) -> set[str]:
    """Every image reference the given pods' containers name (init and ephemeral too)."""
    refs: set[str] = set()
    for pod in pods:
        spec = pod.get("spec") or {}
        for key in ("initContainers", "containers", "ephemeralContainers"):
            for c in spec.get(key) or []:
                if c.get("image"):
                    refs.add(c["image"])
    return refs


async def collect_once(store: ImageStore, path: Path, in_use: Callable[[], set[str]], *,
                       high: int = HIGH_PERCENT, low: int = LOW_PERCENT) -> int:
    st = await trio.to_thread.run_sync(os.statvfs, path)
    need = bytes_to_free(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, high=high, low=low)
    if need <= 0:
        return 0
    freed = await store.gc(keep=in_use(), bytes_to_free=need)
    log.warning("disk pressure on %s: image GC freed %d of %d bytes wanted", path, freed, need)
    return freed


async def run(store: ImageStore, path: Path, in_use: Callable[[], set[str]], *,
              interval: float = 30.0, high: int = HIGH_PERCENT, low: int = LOW_PERCENT,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        try:
            await collect_once(store, path, in_use, high=high, low=low)
        except OSError as e:  # a full or vanished disk must not end the agent
            log.warning("image GC on %s failed: %s", path, e)
        await trio.sleep(interval)
