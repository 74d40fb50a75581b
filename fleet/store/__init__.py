"""The revision store: the `Store` protocol and its default SQLite backend.

Everything above the store (API server, controllers) imports from here and
only relies on the protocol in `base`; `open_store` is how a process gets
the SQLite implementation with its background tasks running.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from fleet.store.base import (
    ADDED,
    DELETED,
    MODIFIED,
    Event,
    KeyExists,
    KeyNotFound,
    ListResult,
    RevisionCompacted,
    RevisionConflict,
    RevisionTooLarge,
    Store,
    StoreCorrupt,
    StoreError,
    Watch,
)
from fleet.store.codec import PLAIN, ValueCodec
from fleet.store.sqlite import SqliteStore
from fleet.store.sqlite_file import integrity_check
from fleet.store.sqlite_watch import SqliteWatch, StoreClosed, WatchOverflow

__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "Event",
    "KeyExists",
    "KeyNotFound",
    "ListResult",
    "RevisionCompacted",
    "RevisionTooLarge",
    "RevisionConflict",
    "SqliteStore",
    "SqliteWatch",
    "Store",
    "ValueCodec",
    "StoreClosed",
    "StoreCorrupt",
    "StoreError",
    "Watch",
    "WatchOverflow",
    "integrity_check",
    "open_store",
]


@asynccontextmanager
async def open_store(
    path: str | os.PathLike[str],
    *,
    retention: int = 10000,
    sync: str = "FULL",
    compact_interval: float = 60.0,
    checkpoint_pages: int = 1000,
    watch_buffer: int = 10000,
    codec: ValueCodec = PLAIN,
) -> AsyncIterator[SqliteStore]:
    """Open (or create) the store at `path` with its writer and compactor
    running in a nursery of their own; close it (queued writes committed,
    watches ended) when the block exits.

    StoreCorrupt if `path` holds something that is not a Fleet store; the
    file is left untouched in that case.
    """
    store = SqliteStore(
        path,
        retention=retention,
        sync=sync,
        compact_interval=compact_interval,
        checkpoint_pages=checkpoint_pages,
        watch_buffer=watch_buffer,
        codec=codec,
    )
    await store.open()
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            try:
                yield store
            except BaseException as exc:
                # Re-raised below, outside the nursery: raised inside it, a
                # caller's KeyError would come out wrapped in an ExceptionGroup.
                body_error = exc
            finally:
                with trio.CancelScope(shield=True):
                    await store.aclose()
    finally:
        if not store._closed:
            with trio.CancelScope(shield=True):
                await store.aclose()
    if body_error is not None:
        raise body_error
