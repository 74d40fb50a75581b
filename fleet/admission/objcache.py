"""A watch-fed cache of one namespaced kind, by namespace, for admission plugins.

LimitRanger and ResourceQuota look at every pod create (and ResourceQuota at
every create of anything).  Pod creation is hot, and almost every namespace
has neither limit ranges nor quotas, so asking the store each time would put a
SQLite read on the hot path for nothing.  The plugins ask this cache first
("does this namespace have any?") and go to the store only when it matters —
ResourceQuota always re-reads the quotas it charges, under optimistic
concurrency, so a cache a few milliseconds behind can never let usage drift.

Kept current the way `priority.ClassCache` is: list, then watch from the
list's revision, re-list after a watch error (overflow, compaction).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from fleet.store import DELETED, Store, StoreError

log = logging.getLogger(__name__)


class NamespacedCache:
    """Objects under one store prefix (e.g. all ResourceQuotas), grouped by namespace."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._by_ns: dict[str, dict[str, dict[str, Any]]] = {}
        self.synced = False

    def in_namespace(self, namespace: str) -> list[dict[str, Any]]:
        return list(self._by_ns.get(namespace, {}).values())

    def _put(self, obj: dict[str, Any]) -> None:
        md = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(md, dict) or not isinstance(md.get("name"), str):
            return  # a broken stored object: left out rather than stop the cache
        self._by_ns.setdefault(md.get("namespace", ""), {})[md.get("name", "")] = obj

    def _drop(self, obj: dict[str, Any]) -> None:
        md = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(md, dict):
            return
        bucket = self._by_ns.get(md.get("namespace", ""))
        if bucket is not None:
            bucket.pop(md.get("name", ""), None)
            if not bucket:
                del self._by_ns[md.get("namespace", "")]

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            res = await store.list(self.prefix)
            self._by_ns = {}
            for obj in res.items:
                self._put(obj)
            self.synced = True
            if not started:
                task_status.started()
                started = True
            try:
                w = await store.watch(self.prefix, from_revision=res.revision)
                try:
                    async for ev in w:
                        if ev.type == DELETED:
                            self._drop(ev.obj)
                        else:
                            self._put(ev.obj)
                finally:
                    with trio.CancelScope(shield=True):
                        await w.aclose()
            except StoreError as e:
                # Overflow or compaction: relist, like any informer.
                log.debug("%s cache: %r; re-listing", self.prefix, e)
                self.synced = False
                await trio.sleep(0.1)
