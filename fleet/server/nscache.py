"""An in-memory view of namespaces, kept current by a store watch.

Every create checks that its namespace exists and is not terminating; doing
that against SQLite costs a worker-thread round trip per request.  This cache
answers from memory; a namespace it has not seen yet (created a moment ago,
event still in flight) falls back to a store read, so the cache can only
make the check faster, never wrong.
"""

from __future__ import annotations

from typing import Any

from fleet.api import meta
from fleet.store.watchcache import WatchCache

PREFIX = meta.store_key("", "namespaces", None)


class NamespaceCache(WatchCache):
    """Namespaces by name (see fleet/store/watchcache.py)."""

    def __init__(self) -> None:
        super().__init__(PREFIX)

    def get(self, name: str, default: Any = None) -> dict[str, Any] | None:  # type: ignore[override]
        # Before the first list nothing is known: the caller reads the store.
        return super().get(name, default) if self.synced else default
