"""The SQLite store's watches: `SqliteWatch`, one open watch with a bounded
buffer (history first, then the live events the store fans out to it), ended
with `WatchOverflow` when it falls behind or `StoreClosed` when the store
closes.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import trio

from fleet.store.base import Event, StoreError

if TYPE_CHECKING:
    from fleet.store.sqlite import SqliteStore


class WatchOverflow(StoreError):
    """A watcher fell too far behind and was ended; re-watch from its last revision."""


class StoreClosed(StoreError):
    """The store is closed (or closing) and takes no more requests."""


# --------------------------------------------------------------------------
# Watches


class SqliteWatch:
    """One open watch: history first, then live events, from a bounded buffer."""

    def __init__(self, store: SqliteStore, prefix: str, start: int, limit: int) -> None:
        self._store = store
        self.prefix = prefix
        # Events at or below `start` are not ours (the caller has them).
        self.start = start
        self._limit = limit
        self._history: deque[Event] = deque()
        self._pending: deque[Event] = deque()
        self._waiter: trio.Event | None = None
        self._overflowed = False
        self._closed = False
        self._frozen_progress: int | None = None

    @property
    def progress(self) -> int:
        """Highest revision accounted for.

        Every published batch is offered to every watcher that matches, so a
        live watcher has accounted for everything the store has published;
        reading the store's counter keeps fan-out free of per-watcher work
        for watchers no event concerns.
        """
        if self._frozen_progress is not None:
            return self._frozen_progress
        return max(self.start, self._store._published)

    def _offer(self, ev: Event) -> None:
        if ev.revision <= self.start or self._overflowed or self._closed:
            return
        if len(self._pending) >= self._limit:
            # Drop everything now (the memory is the point) and tell the
            # consumer on its next read.
            self._overflowed = True
            self._frozen_progress = self.progress
            self._pending.clear()
            self._history.clear()
            self._store._unregister(self)
        else:
            self._pending.append(ev)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    def _end(self) -> None:
        """The store is closing: let the consumer finish cleanly."""
        if not self._closed:
            self._frozen_progress = self.progress
            self._closed = True
            self._wake()

    def __aiter__(self) -> SqliteWatch:
        return self

    async def __anext__(self) -> Event:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            if self._overflowed:
                raise WatchOverflow(
                    f"watch on {self.prefix!r} fell more than {self._limit} events behind"
                )
            if self._history:
                return self._history.popleft()
            if self._pending:
                return self._pending.popleft()
            if self._closed:
                raise StopAsyncIteration
            waiter = self._waiter = trio.Event()
            await waiter.wait()

    def take_ready(self, limit: int) -> list[Event]:
        """Up to `limit` more events that are already queued, without waiting.

        A consumer that fell behind (a busy fan-out) uses this to send what
        piled up in one write instead of one write per event.
        """
        out: list[Event] = []
        while len(out) < limit and not self._overflowed:
            if self._history:
                out.append(self._history.popleft())
            elif self._pending:
                out.append(self._pending.popleft())
            else:
                break
        return out

    async def aclose(self) -> None:
        self._store._unregister(self)
        self._end()
        self._history.clear()
        self._pending.clear()
        await trio.lowlevel.checkpoint()
