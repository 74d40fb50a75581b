"""An in-memory view of namespaces, kept current by a store watch.

Every create checks that its namespace exists and is not terminating; doing
that against SQLite costs a worker-thread round trip per request.  This cache
answers from memory; a namespace it has not seen yet (created a moment ago,
event still in flight) falls back to a store read, so the cache can only
make the check faster, never wrong.
"""

from __future__ import annotations

from typing import Any

import trio

from fleet.api import meta
from fleet.store import DELETED, Store, StoreError

PREFIX = meta.store_key("", "namespaces", None)


class NamespaceCache:
    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, Any]] = {}
        self.synced = False

    def get(self, name: str) -> dict[str, Any] | None:
        return self._by_name.get(name) if self.synced else None

    async def run(self, store: Store, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            res = await store.list(PREFIX)
            # An object without a usable name (a broken write from before validation)
            # is left out: one bad object must not stop the cache, or the server.
            self._by_name = {n: o for o in res.items if (n := _name(o))}
            self.synced = True
            if not started:
                task_status.started()
                started = True
            try:
                w = await store.watch(PREFIX, from_revision=res.revision)
                try:
                    async for ev in w:
                        name = _name(ev.obj)
                        if not name:
                            continue
                        if ev.type == DELETED:
                            self._by_name.pop(name, None)
                        else:
                            self._by_name[name] = ev.obj
                finally:
                    with trio.CancelScope(shield=True):
                        await w.aclose()
            except StoreError:
                # Overflow or compaction: relist, like any informer.
                self.synced = False
                await trio.sleep(0.1)


def _name(obj: Any) -> str:
    """metadata.name, or "" when the stored object has none that is a string."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    name = md.get("name") if isinstance(md, dict) else None
    return name if isinstance(name, str) else ""
