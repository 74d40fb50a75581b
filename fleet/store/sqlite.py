"""The SQLite backend of the revision store (the default `Store`).

This module and its three companions own the on-disk format and everything
that keeps it honest: file validation at open and the format itself
(`sqlite_file.py`), the single group-committing writer (this module's task,
feeding the transactions of `sqlite_engine.py`), the reader connection pool,
watch fan-out (here; the watches themselves are `sqlite_watch.py`),
compaction and WAL checkpointing.

On-disk format (schema version 1)::

    log(revision INTEGER PRIMARY KEY, key, type, prev_revision, value)
        append-only history; `type` is created | updated | deleted, `value`
        the object's JSON (for a delete: the last state, resourceVersion set
        to the delete revision); index on (key, revision).
    live(key PRIMARY KEY, revision)
        the latest revision of every live key (what get/list read).
    meta(name PRIMARY KEY, value)
        magic, schema_version, compacted (revision), compact_done (the
        first revision compaction has not processed yet).

The file header carries `PRAGMA application_id` = APPLICATION_ID ("FLET").
We read the header with plain file I/O before SQLite ever touches the file,
so a foreign database or garbage is refused (`StoreCorrupt`) without being
modified -- SQLite itself would happily create `-wal`/`-shm` files or roll
back a hot journal next to somebody else's data.

Why one writer.  SQLite allows one writer at a time; several connections
writing concurrently is exactly how k3s/kine ends up with "database is
locked".  Here a single task owns the write connection; callers enqueue
requests on a trio memory channel and the writer takes *everything* queued,
applies it in one transaction in a worker thread and commits once.  With
`synchronous=FULL` the fsync per commit is then shared by the whole batch
(group commit), which is what makes FULL affordable.  Preconditions are
checked against the database plus an overlay of the earlier requests of the
same batch, so a failed precondition fails only its own request.

Why watches are cheap.  Each committed write becomes one `Event` object that
is shared by every matching watcher (nothing is serialized per watcher).
Watchers are indexed by prefix: a prefix that is empty or ends in "/" (the
shape every API-server prefix has) is found by a dict lookup per "/" of the
event key, so fan-out is O(depth of key + matching watchers), not
O(watchers).  Every watcher has a bounded buffer; a watcher that falls
behind is ended with `WatchOverflow` rather than slowing down the writer or
its siblings (the HTTP client then re-watches from its last revision).

Compaction keeps, for every key, the newest row at or below the compacted
revision (unless it is a tombstone) and drops everything older.  It walks
the rows *after* the previous compaction point in bounded revision windows:
each such row makes its `prev_revision` row obsolete (and a tombstone makes
itself obsolete), so each batch is a small, short write transaction queued
behind user writes and the whole thing always makes progress.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import trio

from fleet.store.base import (
    Event,
    KeyNotFound,
    ListResult,
    RevisionCompacted,
    RevisionTooLarge,
    StoreCorrupt,
    StoreError,
)
from fleet.store.codec import PLAIN, ValueCodec
from fleet.store.sqlite_engine import _Engine, _Request
from fleet.store.sqlite_file import (
    _MAX_INT64,
    _SYNC_MODES,
    _TYPE_OF_KIND,
    MAGIC,
    SCHEMA_VERSION,
    _initialize,
    _range_sql,
    check_file,
)
from fleet.store.sqlite_watch import SqliteWatch, StoreClosed

log = logging.getLogger(__name__)

# Upper bound of requests per transaction: keeps one commit (and so the WAL
# growth between checkpoints and the latency of the first caller) bounded.
MAX_BATCH = 1000
# Queue depth before writers feel back-pressure.
WRITE_QUEUE = 10000
# Concurrent reader threads (each owns one pooled connection).
READERS = 8
# With no writes for this long, truncate a non-empty WAL.
IDLE_CHECKPOINT_SECONDS = 1.0

T = TypeVar("T")


# --------------------------------------------------------------------------
# The store


class SqliteStore:
    """The `Store` protocol over one SQLite file.  Use `open_store()`.

    Lifecycle: `await open()` validates the file and loads the counters,
    `await nursery.start(store.run)` starts the writer and the compactor,
    `await aclose()` drains queued writes, stops `run` and closes the file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention: int = 10000,
        sync: str = "FULL",
        compact_interval: float = 60.0,
        checkpoint_pages: int = 1000,
        watch_buffer: int = 10000,
        codec: ValueCodec = PLAIN,
    ) -> None:
        sync = sync.upper()
        if sync not in _SYNC_MODES:
            raise ValueError(f"sync must be one of {_SYNC_MODES}, not {sync!r}")
        if retention < 0:
            raise ValueError("retention must be >= 0")
        self.path = Path(path)
        self.retention = retention
        self.sync = sync
        self.compact_interval = compact_interval
        self.checkpoint_pages = checkpoint_pages
        self.watch_buffer = watch_buffer
        # Every value passes through it between JSON text and the row (codec.py).
        self.codec = codec

        self._engine: _Engine | None = None
        self._page_size = 4096
        self._published = 0  # highest revision committed and published
        self._compacted = 0
        self._live_keys = 0
        self._commits = 0
        self._writes = 0

        self._send, self._recv = trio.open_memory_channel[_Request](WRITE_QUEUE)
        self._write_limiter = trio.CapacityLimiter(1)
        self._read_limiter = trio.CapacityLimiter(READERS)
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._compact_lock = trio.Lock()
        self._wal_dirty = False

        # prefix ("" or ending in "/") -> watchers; found by key walk.
        self._indexed: dict[str, set[SqliteWatch]] = {}
        # any other prefix -> watchers; found by startswith.
        self._other: dict[str, set[SqliteWatch]] = {}
        self._watch_count = 0

        self._opened = False
        self._closing = False
        self._closed = False
        self._running = False
        self._stopped = trio.Event()

    # ---- lifecycle

    async def open(self) -> None:
        """Validate (or create) the file and load counters; StoreCorrupt if not ours."""
        await trio.to_thread.run_sync(self._open_sync)
        self._opened = True

    def _open_sync(self) -> None:
        if check_file(self.path):
            _initialize(self.path)
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreCorrupt(f"{self.path}: cannot open: {exc}") from exc
        try:
            self._engine = self._load(conn)
        except BaseException:
            conn.close()
            raise

    def _load(self, conn: sqlite3.Connection) -> _Engine:
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot enable WAL mode (got {mode!r})")
            conn.execute(f"PRAGMA synchronous={self.sync}")
            conn.execute("PRAGMA busy_timeout=100")
            self._page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA wal_autocheckpoint={max(1, self.checkpoint_pages)}")
            conn.execute(
                f"PRAGMA journal_size_limit={max(1, self.checkpoint_pages) * self._page_size}"
            )
            check = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
            if check != ["ok"]:
                detail = "; ".join(" ".join(check).split("\n")[:6])
                raise StoreCorrupt(f"{self.path}: damaged (quick_check: {detail[:400]})")
            try:
                meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            except sqlite3.OperationalError as exc:
                raise StoreCorrupt(f"{self.path}: not a Fleet store ({exc})") from exc
            if meta.get("magic") != MAGIC:
                raise StoreCorrupt(f"{self.path}: not a Fleet store (magic {meta.get('magic')!r})")
            version = int(meta.get("schema_version", "0"))
            if version != SCHEMA_VERSION:
                raise StoreCorrupt(
                    f"{self.path}: schema version {version}, this Fleet reads {SCHEMA_VERSION}"
                )
            compacted = int(meta.get("compacted", "0"))
            compact_done = int(meta.get("compact_done", "1"))
            (max_rev,) = conn.execute("SELECT MAX(revision) FROM log").fetchone()
            (live,) = conn.execute("SELECT COUNT(*) FROM live").fetchone()
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise StoreCorrupt(f"{self.path}: {exc}") from exc
        # Compaction may have dropped a trailing tombstone; the counter never
        # goes below the compacted revision.
        revision = max(max_rev or 0, compacted)
        self._published = revision
        self._compacted = compacted
        self._live_keys = live
        return _Engine(conn, revision, compact_done, self.codec)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The store's own tasks: the writer and the periodic compactor."""
        if not self._opened:
            await self.open()
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._compactor)
                task_status.started()
                await self._writer()
                nursery.cancel_scope.cancel()
        finally:
            self._running = False
            self._fail_queued()
            self._stopped.set()

    async def aclose(self) -> None:
        """Finish queued writes, end watches, stop `run` and close the file."""
        if self._closed:
            return
        self._closing = True
        # Closing our send side ends the writer once the queue is drained
        # (callers blocked in send get StoreClosed).
        self._send.close()
        if self._running:
            await self._stopped.wait()
        for watch in _all([*self._indexed.values(), *self._other.values()]):
            watch._end()
        self._indexed.clear()
        self._other.clear()
        self._watch_count = 0
        self._closed = True
        engine, self._engine = self._engine, None
        readers = []
        while True:
            try:
                readers.append(self._readers.get_nowait())
            except queue.Empty:
                break

        def close_all() -> None:
            if engine is not None:
                try:
                    engine.checkpoint("TRUNCATE")
                except sqlite3.Error:
                    pass
                engine.conn.close()
            for conn in readers:
                conn.close()

        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(close_all)

    def _fail_queued(self) -> None:
        while True:
            try:
                req = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            req.error = StoreClosed("store is closed")
            req.done.set()

    # ---- writer

    async def _submit(self, req: _Request) -> Any:
        if self._closing:
            raise StoreClosed("store is closed")
        try:
            await self._send.send(req)
        except trio.ClosedResourceError:
            raise StoreClosed("store is closed") from None
        await req.done.wait()
        if req.error is not None:
            raise req.error
        return req.result

    async def _writer(self) -> None:
        while True:
            # Only arm the idle timer when there is a WAL to truncate, so an
            # idle store schedules nothing (and MockClock tests see no timer).
            idle_for = IDLE_CHECKPOINT_SECONDS if self._wal_dirty else math.inf
            with trio.move_on_after(idle_for) as idle:
                try:
                    first = await self._recv.receive()
                except trio.EndOfChannel:
                    return
            if idle.cancelled_caught:
                if self._wal_dirty:
                    await self._checkpoint(force=True)
                continue
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._recv.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            writes = [r for r in batch if r.op != "compact"]
            if writes:
                await self._commit_writes(writes)
            for req in batch:
                if req.op == "compact":
                    await self._compact_step(req)
            await self._checkpoint(force=False)

    async def _commit_writes(self, reqs: list[_Request]) -> None:
        engine = self._engine
        assert engine is not None
        try:
            outcome = await trio.to_thread.run_sync(engine.apply, reqs, limiter=self._write_limiter)
        except BaseException as exc:
            # The transaction is gone: nobody in the batch got a revision.
            log.error("store commit failed for %d writes: %r", len(reqs), exc)
            for req in reqs:
                req.result = None
                req.error = StoreError(f"commit failed: {exc}")
                req.error.__cause__ = exc
                req.done.set()
            if not isinstance(exc, Exception):
                raise
            return
        self._wal_dirty = True
        self._commits += 1
        self._writes += len(outcome.events)
        self._live_keys += outcome.live_delta
        self._published = max(self._published, outcome.revision)
        self._publish(outcome.events)
        for req in reqs:
            req.done.set()

    async def _compact_step(self, req: _Request) -> None:
        engine = self._engine
        assert engine is not None and req.obj is not None
        try:
            req.result = await trio.to_thread.run_sync(
                engine.compact_batch, req.obj["target"], limiter=self._write_limiter
            )
            self._wal_dirty = True
        except Exception as exc:
            req.error = exc
        finally:
            req.done.set()

    async def _checkpoint(self, *, force: bool) -> None:
        """Keep the WAL bounded.

        SQLite's own autocheckpoint (PASSIVE) copies frames back but never
        shrinks the file and skips frames a reader still needs; TRUNCATE
        resets it.  It waits (busy_timeout, 100 ms) only for readers that
        began before the checkpoint finished -- later readers read the main
        file -- so short read transactions cannot starve it.
        """
        engine = self._engine
        if engine is None:
            return
        if not force:
            try:
                wal = os.stat(f"{self.path}-wal").st_size
            except FileNotFoundError:
                return
            if wal <= self.checkpoint_pages * self._page_size:
                return
        try:
            busy, _, _ = await trio.to_thread.run_sync(
                engine.checkpoint, "TRUNCATE", limiter=self._write_limiter
            )
        except sqlite3.Error as exc:
            log.warning("WAL checkpoint failed: %r", exc)
            return
        if not busy:
            self._wal_dirty = False

    # ---- fan-out

    def _publish(self, events: list[Event]) -> None:
        if not self._watch_count:
            return
        indexed, other = self._indexed, self._other
        for ev in events:
            key = ev.key
            # list(): an overflowing watcher unregisters itself mid-loop.
            subs = indexed.get("")
            if subs:
                for w in list(subs):
                    w._offer(ev)
            i = key.find("/")
            while i >= 0:
                subs = indexed.get(key[: i + 1])
                if subs:
                    for w in list(subs):
                        w._offer(ev)
                i = key.find("/", i + 1)
            for prefix, subs in other.items() if other else ():
                if key.startswith(prefix):
                    for w in list(subs):
                        w._offer(ev)

    def _register(self, watch: SqliteWatch) -> None:
        prefix = watch.prefix
        table = self._indexed if (prefix == "" or prefix.endswith("/")) else self._other
        table.setdefault(prefix, set()).add(watch)
        self._watch_count += 1

    def _unregister(self, watch: SqliteWatch) -> None:
        prefix = watch.prefix
        table = self._indexed if (prefix == "" or prefix.endswith("/")) else self._other
        subs = table.get(prefix)
        if subs is not None and watch in subs:
            subs.discard(watch)
            self._watch_count -= 1
            if not subs:
                del table[prefix]

    # ---- reads

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed or not self._opened:
            raise StoreClosed("store is closed")

        def run() -> T:
            try:
                conn = self._readers.get_nowait()
            except queue.Empty:
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA query_only=ON")
                conn.execute("PRAGMA busy_timeout=5000")
            try:
                conn.execute("BEGIN")
                try:
                    return fn(conn, *args)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"read failed: {exc}") from exc
            finally:
                if self._closed:
                    conn.close()
                else:
                    self._readers.put(conn)

        return await trio.to_thread.run_sync(run, limiter=self._read_limiter)

    @staticmethod
    def _snapshot_revisions(conn: sqlite3.Connection) -> tuple[int, int]:
        """(revision, compacted) as of this read transaction's snapshot."""
        (max_rev,) = conn.execute("SELECT MAX(revision) FROM log").fetchone()
        (compacted,) = conn.execute(
            "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'compacted'"
        ).fetchone()
        return max(max_rev or 0, compacted), compacted

    async def get(self, key: str) -> dict[str, Any]:
        def read(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT l.value FROM live v JOIN log l ON l.revision = v.revision WHERE v.key = ?",
                (key,),
            ).fetchone()
            return None if row is None else json.loads(self.codec.open(key, row[0]))

        obj = await self._read(read)
        if obj is None:
            raise KeyNotFound(key)
        return obj

    async def list(
        self,
        prefix: str,
        *,
        revision: int | None = None,
        limit: int = 0,
        start_after: str | None = None,
    ) -> ListResult:
        # Refused before SQL: SQLite binds only int64 (`limit + 1` of 2**63 raised
        # OverflowError, a 500), and a start key outside the prefix is no page of
        # this list (the range bounds would still hold, but a caller passing one
        # has mixed up two lists).
        if not 0 <= limit <= _MAX_INT64:
            raise ValueError(f"limit {limit} is out of range")
        if revision is not None and not 0 <= revision <= _MAX_INT64:
            raise ValueError(f"revision {revision} is out of range")
        if start_after is not None and not start_after.startswith(prefix):
            raise ValueError(f"start key {start_after!r} is not under {prefix!r}")
        if revision is not None and revision < self._compacted:
            raise RevisionCompacted(revision, self._compacted)
        return await self._read(self._list_sync, prefix, revision, limit, start_after)

    def _list_sync(
        self,
        conn: sqlite3.Connection,
        prefix: str,
        revision: int | None,
        limit: int,
        start_after: str | None,
    ) -> ListResult:
        current, compacted = self._snapshot_revisions(conn)
        if revision is not None and revision < compacted:
            raise RevisionCompacted(revision, compacted)
        if revision is not None and revision > current:
            # Checked against this snapshot, not `_published`: a list's revision
            # may be committed a moment before it is published, and a client
            # continuing from it at once must not be refused.
            raise RevisionTooLarge(revision, current)
        where, params = _range_sql("{col}", prefix)
        if start_after is not None:
            where += " AND {col} > ?"
            params.append(start_after)
        items: list[dict[str, Any]] = []
        more = False
        if revision is None or revision >= current:
            # The live table *is* the state at `current`.
            at = current
            sql = (
                "SELECT v.key, l.value FROM live v JOIN log l ON l.revision = v.revision"
                f" WHERE {where.format(col='v.key')} ORDER BY v.key"
            )
            if limit > 0:
                sql += " LIMIT ?"
                # One more than asked tells whether there is more; capped to what binds.
                rows = conn.execute(sql, [*params, min(limit, _MAX_INT64 - 1) + 1]).fetchall()
            else:
                rows = conn.execute(sql, params).fetchall()
            if limit > 0 and len(rows) > limit:
                more = True
                rows = rows[:limit]
            keys = [r[0] for r in rows]
            items = [json.loads(self.codec.open(r[0], r[1])) for r in rows]
        else:
            # State as of `revision`: per key, its newest row at or below
            # it (SQLite takes bare columns from the MAX() row); a tombstone
            # there means the key did not exist.
            at = revision
            cur = conn.execute(
                "SELECT key, MAX(revision), type, value FROM log"
                f" WHERE {where.format(col='key')} AND revision <= ?"
                " GROUP BY key ORDER BY key",
                [*params, revision],
            )
            keys = []
            for key, _rev, kind, value in cur:
                if kind == "deleted":
                    continue
                if limit > 0 and len(items) == limit:
                    more = True
                    break
                keys.append(key)
                items.append(json.loads(self.codec.open(key, value)))
        result = ListResult(items=items, revision=at)
        if more:
            result.continue_key = keys[-1]
            if revision is None or revision >= current:
                rest_where, rest_params = _range_sql("key", prefix)
                (remaining,) = conn.execute(
                    f"SELECT COUNT(*) FROM live WHERE {rest_where} AND key > ?",
                    [*rest_params, keys[-1]],
                ).fetchone()
                result.remaining = remaining
        return result

    # ---- writes

    async def create(self, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._submit(_Request("create", key, obj))

    async def update(
        self,
        key: str,
        obj: dict[str, Any],
        *,
        expected_revision: int | None = None,
    ) -> dict[str, Any]:
        return await self._submit(_Request("update", key, obj, expected_revision))

    async def delete(
        self,
        key: str,
        *,
        expected_revision: int | None = None,
        expected_uid: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        return await self._submit(_Request("delete", key, None, expected_revision, expected_uid))

    # ---- watch

    async def watch(self, prefix: str, *, from_revision: int) -> SqliteWatch:
        if self._closing:
            raise StoreClosed("store is closed")
        if from_revision and from_revision < self._compacted:
            raise RevisionCompacted(from_revision, self._compacted)
        # Register before reading history, with no checkpoint in between:
        # every revision above `registered` reaches the buffer live, and the
        # history read below covers (from_revision, registered].  A caller
        # whose list snapshot ran ahead of what is published (from_revision >
        # registered) simply has the overlap filtered out by `start`.
        registered = self._published
        start = from_revision if from_revision else registered
        watch = SqliteWatch(self, prefix, start, self.watch_buffer)
        self._register(watch)
        if start >= registered:
            await trio.lowlevel.checkpoint()
            return watch
        try:
            history = await self._read(self._history_sync, prefix, start, registered)
        except BaseException:
            self._unregister(watch)
            raise
        watch._history.extend(history)
        return watch

    def _history_sync(
        self, conn: sqlite3.Connection, prefix: str, after: int, upto: int
    ) -> list[Event]:
        _, compacted = self._snapshot_revisions(conn)
        if after < compacted:
            raise RevisionCompacted(after, compacted)
        where, params = _range_sql("l.key", prefix)
        events = []
        for rev, key, kind, value, prev in conn.execute(
            "SELECT l.revision, l.key, l.type, l.value, p.value FROM log l"
            " LEFT JOIN log p ON p.revision = l.prev_revision"
            f" WHERE l.revision > ? AND l.revision <= ? AND {where} ORDER BY l.revision",
            [after, upto, *params],
        ):
            events.append(
                Event(
                    _TYPE_OF_KIND[kind],
                    key,
                    rev,
                    json.loads(self.codec.open(key, value)),
                    json.loads(self.codec.open(key, prev))
                    if prev is not None and kind != "created" else None,
                )
            )
        return events

    # ---- counters, compaction, stats

    def current_revision(self) -> int:
        return self._published

    def compacted_revision(self) -> int:
        return self._compacted

    async def compact(self, revision: int) -> None:
        """Drop history older than `revision` in bounded batches.

        Each batch is its own short transaction queued behind user writes,
        so writers wait at most one batch; a compaction interrupted by a
        crash resumes from `compact_done` the next time one runs.
        """
        async with self._compact_lock:
            target = min(revision, self._published)
            if target > self._compacted:
                # Readers refuse older revisions from now on, before any row
                # is gone (the snapshot check covers reads already running).
                self._compacted = target
            target = self._compacted
            engine = self._engine
            while engine is not None and engine.compact_done <= target:
                req = _Request("compact", obj={"target": target})
                if await self._submit(req):
                    break

    async def _compactor(self) -> None:
        if self.compact_interval <= 0 or math.isinf(self.compact_interval):
            return
        while True:
            await trio.sleep(self.compact_interval)
            target = self._published - self.retention
            engine = self._engine
            if engine is None:
                return
            if target > self._compacted or engine.compact_done <= self._compacted:
                try:
                    await self.compact(max(target, self._compacted))
                except StoreClosed:
                    return
                except StoreError as exc:
                    log.warning("compaction to %d failed: %r", target, exc)

    def stats(self) -> dict[str, Any]:
        def size(p: str) -> int:
            try:
                return os.stat(p).st_size
            except FileNotFoundError:
                return 0

        return {
            "revision": self._published,
            "compacted_revision": self._compacted,
            "db_bytes": size(str(self.path)),
            "wal_bytes": size(f"{self.path}-wal"),
            "watchers": self._watch_count,
            "keys": self._live_keys,
            "queued_writes": self._recv.statistics().current_buffer_used,
            "commits": self._commits,
            "writes": self._writes,
        }

    async def integrity_check(self) -> str:
        """`PRAGMA integrity_check` on the open store; "ok" when sound."""
        return await self._read(
            lambda conn: "\n".join(
                str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall()
            )
        )


def _all(watches: Iterable[set[SqliteWatch]]) -> list[SqliteWatch]:
    return [w for ws in watches for w in ws]
