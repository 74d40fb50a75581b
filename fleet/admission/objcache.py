"""A watch-fed cache of one namespaced kind, by namespace, for admission plugins.

LimitRanger and ResourceQuota look at every pod create (and ResourceQuota at
every create of anything).  Pod creation is hot, and almost every namespace
has neither limit ranges nor quotas, so asking the store each time would put a
SQLite read on the hot path for nothing.  The plugins ask this cache first
("does this namespace have any?") and go to the store only when it matters —
ResourceQuota always re-reads the quotas it charges, under optimistic
concurrency, so a cache a few milliseconds behind can never let usage drift.

A `fleet.store.watchcache.WatchCache` with a namespace index.
"""

from __future__ import annotations

from typing import Any

from fleet.store.watchcache import WatchCache, by_namespace


class NamespacedCache(WatchCache):
    """Objects under one store prefix (e.g. all ResourceQuotas), by namespace."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix, indexes={"namespace": by_namespace})

    def in_namespace(self, namespace: str) -> list[dict[str, Any]]:
        return self.by_index("namespace", namespace)
