"""One server-side watch cache: the objects under a store prefix, kept current.

The API server's own hot paths ask questions of a few kinds on every request
(does this namespace exist and is it terminating, which PriorityClass is the
global default, does this namespace have LimitRanges or quotas, which nodes
can be scraped).  Asking SQLite each time costs a worker-thread round trip per
request, so each of those answers from a `WatchCache`: a store list, then a
watch from the list's revision, re-listed after a watch error (overflow,
compaction) — the server-side counterpart of the client informer.

The cache is a read-only `Mapping` from key (`name` for cluster-scoped
objects, `namespace/name` for namespaced ones) to object, with optional
indexes (`by_index("namespace", "default")`).  It can be behind the store by
the events in flight, never wrong about what it has seen; callers that must
be exact (quota charging) re-read the store.  Objects without a usable name
(written before typed validation) are left out: one bad object must not stop
the cache, or the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import trio

from fleet.store import DELETED, Store, StoreError

log = logging.getLogger(__name__)

IndexFunc = Callable[[dict[str, Any]], Iterable[str]]


def cache_key(obj: Any) -> str | None:
    """`name` or `namespace/name`; None for an object without a usable name."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(md, dict):
        return None
    name, ns = md.get("name"), md.get("namespace")
    if not isinstance(name, str) or not name:
        return None
    if ns in (None, ""):
        return name
    return f"{ns}/{name}" if isinstance(ns, str) else None


def by_namespace(obj: dict[str, Any]) -> list[str]:
    """Index function: the object's namespace."""
    ns = (obj.get("metadata") or {}).get("namespace")
    return [ns] if isinstance(ns, str) else []


class WatchCache(Mapping[str, dict[str, Any]]):
    """The objects under `prefix`, by key, with optional named indexes."""

    def __init__(self, prefix: str, *, indexes: Mapping[str, IndexFunc] | None = None,
                 relist_delay: float = 0.1) -> None:
        self.prefix = prefix
        self.synced = False
        self._indexes = dict(indexes or {})
        self._relist_delay = relist_delay
        self._objs: dict[str, dict[str, Any]] = {}
        # index name → value → keys
        self._index: dict[str, dict[str, set[str]]] = {n: {} for n in self._indexes}

    # -- reading ---------------------------------------------------------------------
    def __getitem__(self, key: str) -> dict[str, Any]:
        return self._objs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._objs)

    def __len__(self) -> int:
        return len(self._objs)

    def by_index(self, index: str, value: str) -> list[dict[str, Any]]:
        return [self._objs[k] for k in sorted(self._index[index].get(value, ()))]

    # -- keeping it current ------------------------------------------------------------
    def replace(self, objs: Iterable[dict[str, Any]]) -> None:
        self._objs = {}
        self._index = {n: {} for n in self._indexes}
        for o in objs:
            self.put(o)

    def put(self, obj: dict[str, Any]) -> None:
        key = cache_key(obj)
        if key is None:
            return
        if key in self._objs:
            self._unindex(key, self._objs[key])
        self._objs[key] = obj
        for name, fn in self._indexes.items():
            try:
                values = list(fn(obj))
            except Exception:  # noqa: BLE001 - an index that trips on one object skips it
                log.warning("%s cache: index %s failed on %s", self.prefix, name, key, exc_info=True)
                continue
            for v in values:
                self._index[name].setdefault(v, set()).add(key)

    def drop(self, obj: dict[str, Any]) -> None:
        key = cache_key(obj)
        if key is not None and key in self._objs:
            self._unindex(key, self._objs.pop(key))

    def _unindex(self, key: str, obj: dict[str, Any]) -> None:
        for name, fn in self._indexes.items():
            try:
                values = list(fn(obj))
            except Exception:  # noqa: BLE001 - it was never indexed either
                continue
            for v in values:
                keys = self._index[name].get(v)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[name][v]

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """List, then watch; re-list after a watch error.  Started once first synced."""
        started = False
        while True:
            res = await store.list(self.prefix)
            self.replace(res.items)
            self.synced = True
            if not started:
                task_status.started()
                started = True
            try:
                w = await store.watch(self.prefix, from_revision=res.revision)
                try:
                    async for ev in w:
                        if ev.type == DELETED:
                            self.drop(ev.obj)
                        else:
                            self.put(ev.obj)
                finally:
                    with trio.CancelScope(shield=True):
                        await w.aclose()
            except StoreError as e:
                # Overflow or compaction: relist, like any informer.
                log.debug("%s cache: %r; re-listing", self.prefix, e)
                self.synced = False
                await trio.sleep(self._relist_delay)


__all__ = ["WatchCache", "by_namespace", "cache_key"]
