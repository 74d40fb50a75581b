"""The SQLite backend of the revision store (the default `Store`).

This module owns the on-disk format and everything that keeps it honest:
file validation at open, the single group-committing writer, the reader
connection pool, watch fan-out, compaction and WAL checkpointing.

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
import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio

from fleet.api import writes
from fleet.api.meta import now_rfc3339
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
    StoreCorrupt,
    StoreError,
)

log = logging.getLogger(__name__)

APPLICATION_ID = 0x464C4554  # b"FLET"
SCHEMA_VERSION = 1
MAGIC = "fleet-revision-store"
_MAX_INT64 = 2**63 - 1  # the largest integer SQLite binds

_SQLITE_HEADER = b"SQLite format 3\x00"
_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

# Upper bound of requests per transaction: keeps one commit (and so the WAL
# growth between checkpoints and the latency of the first caller) bounded.
MAX_BATCH = 1000
# Revisions examined per compaction transaction.
COMPACT_BATCH = 1000
# Queue depth before writers feel back-pressure.
WRITE_QUEUE = 10000
# Concurrent reader threads (each owns one pooled connection).
READERS = 8
# With no writes for this long, truncate a non-empty WAL.
IDLE_CHECKPOINT_SECONDS = 1.0

_TYPE_OF_KIND = {"created": ADDED, "updated": MODIFIED, "deleted": DELETED}

_SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE log (
    revision INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('created', 'updated', 'deleted')),
    prev_revision INTEGER,
    value TEXT NOT NULL
);
CREATE INDEX log_key_revision ON log (key, revision);
CREATE TABLE live (key TEXT PRIMARY KEY, revision INTEGER NOT NULL) WITHOUT ROWID;
"""

T = TypeVar("T")


class WatchOverflow(StoreError):
    """A watcher fell too far behind and was ended; re-watch from its last revision."""


class StoreClosed(StoreError):
    """The store is closed (or closing) and takes no more requests."""


# --------------------------------------------------------------------------
# Small helpers


def _clone(obj: Any) -> Any:
    """A deep copy through JSON: faster than copy.deepcopy for plain JSON
    data, and it rejects what could not be stored anyway."""
    return json.loads(json.dumps(obj))


def _dump(obj: Any) -> str:
    # ensure_ascii stays on: a lone surrogate would otherwise fail the UTF-8
    # encode inside SQLite and take the whole batch down with it.
    return json.dumps(obj, separators=(",", ":"))


def prefix_range(prefix: str) -> tuple[str, str | None]:
    """[low, high) bounds selecting exactly the keys that start with `prefix`.

    Range bounds instead of LIKE: no wildcard escaping, and the (key, ...)
    indexes are used directly.  SQLite's BINARY collation compares UTF-8
    bytes, which orders like Python compares code points.
    """
    chars = list(prefix)
    while chars:
        nxt = ord(chars[-1]) + 1
        if 0xD800 <= nxt <= 0xDFFF:  # surrogates cannot be encoded; skip them
            nxt = 0xE000
        if nxt <= 0x10FFFF:
            chars[-1] = chr(nxt)
            return prefix, "".join(chars)
        chars.pop()
    return prefix, None


def _range_sql(column: str, prefix: str) -> tuple[str, list[Any]]:
    low, high = prefix_range(prefix)
    if high is None:
        return f"{column} >= ?", [low]
    return f"{column} >= ? AND {column} < ?", [low, high]


def check_file(path: str | os.PathLike[str]) -> bool:
    """Decide, without letting SQLite open it, whether `path` may be used.

    Returns True when the file must be initialized (absent or empty), False
    when it is an existing Fleet store; raises StoreCorrupt otherwise.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        size = 0
    if size == 0:
        wal = Path(f"{p}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreCorrupt(
                f"{p}: empty database file next to a non-empty {wal.name}; "
                "refusing to guess whose log that is"
            )
        return True
    with open(p, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        raise StoreCorrupt(f"{p}: not a SQLite database (bad header); refusing to touch it")
    (app_id,) = struct.unpack(">I", header[68:72])
    if app_id != APPLICATION_ID:
        raise StoreCorrupt(
            f"{p}: a SQLite database but not a Fleet store "
            f"(application_id {app_id:#x}, expected {APPLICATION_ID:#x}); refusing to touch it"
        )
    return False


def _initialize(path: Path) -> None:
    """Create a fresh store atomically: build it next to `path`, then rename.

    The schema and application_id are written in rollback-journal mode so
    they land in the main file (not in a WAL that a crash could lose) before
    the switch to WAL; a crash during initialization leaves only the
    temporary file behind, never a half-made store under the real name.
    """
    tmp = path.with_name(path.name + ".init-tmp")
    for leftover in (tmp, Path(f"{tmp}-journal"), Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=FULL")
        # One script, one transaction (executescript would commit any
        # transaction opened around it).
        conn.executescript(
            "BEGIN IMMEDIATE;"
            f"PRAGMA application_id={APPLICATION_ID};"
            + _SCHEMA
            + "INSERT INTO meta (name, value) VALUES"
            f" ('magic', '{MAGIC}'), ('schema_version', '{SCHEMA_VERSION}'),"
            " ('compacted', '0'), ('compact_done', '1');"
            "COMMIT;"
        )
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(f"{path}: cannot enable WAL mode (got {mode!r})")
    finally:
        conn.close()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _integrity_check_sync(path: str | os.PathLike[str]) -> str:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    return "\n".join(str(r[0]) for r in rows)


async def integrity_check(path: str | os.PathLike[str]) -> str:
    """Run `PRAGMA integrity_check` on a store file; "ok" when it is sound.

    Refuses (StoreCorrupt) a file that is not a Fleet store, so pointing it
    at the wrong file never modifies that file.
    """

    def run() -> str:
        if check_file(path):
            raise StoreCorrupt(f"{path}: no Fleet store here")
        return _integrity_check_sync(path)

    return await trio.to_thread.run_sync(run)


# --------------------------------------------------------------------------
# The write path


@dataclass(slots=True, eq=False)
class _Request:
    op: str  # create | update | delete | compact
    key: str = ""
    obj: dict[str, Any] | None = None
    expected_revision: int | None = None
    expected_uid: str | None = None
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Outcome:
    """What one committed batch changed, handed back to the event loop."""

    events: list[Event]
    revision: int
    live_delta: int


class _Engine:
    """The write connection and the revision counter.

    Only ever used from worker threads, one call at a time: the writer task
    serializes every call, so no locking is needed here.
    """

    def __init__(self, conn: sqlite3.Connection, revision: int, compact_done: int) -> None:
        self.conn = conn
        self.revision = revision
        self.compact_done = compact_done

    # ---- user writes

    def apply(self, reqs: list[_Request]) -> _Outcome:
        """Apply a batch in one transaction; per-request precondition errors
        land on the request, anything else aborts (and rolls back) the batch."""
        conn = self.conn
        rev = self.revision
        # key -> (revision, object) or None (deleted in this batch).  The
        # transaction already sees its own earlier writes; the overlay saves
        # re-reading and re-parsing them, and lets the next event's `prev`
        # be the very object the previous event carries.
        overlay: dict[str, tuple[int, dict[str, Any]] | None] = {}
        events: list[Event] = []
        live_delta = 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            for req in reqs:
                try:
                    if req.op == "create":
                        ev = self._create(req, rev + 1, overlay)
                    elif req.op == "update":
                        ev = self._update(req, rev + 1, overlay)
                    elif req.op == "delete":
                        ev = self._delete(req, rev + 1, overlay)
                    else:
                        raise AssertionError(f"unknown op {req.op}")
                except (StoreError, TypeError, ValueError) as exc:
                    # Raised before any SQL of this request ran, so the
                    # transaction holds nothing of it.
                    req.error = exc
                    continue
                if ev is None:
                    continue
                rev = ev.revision
                events.append(ev)
                if ev.type == ADDED:
                    live_delta += 1
                elif ev.type == DELETED:
                    live_delta -= 1
            self._commit()
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        self.revision = rev
        return _Outcome(events, rev, live_delta)

    def _commit(self) -> None:
        self.conn.execute("COMMIT")

    def _current(
        self, key: str, overlay: dict[str, tuple[int, dict[str, Any]] | None]
    ) -> tuple[int, dict[str, Any]] | None:
        if key in overlay:
            return overlay[key]
        row = self.conn.execute(
            "SELECT l.revision, l.value FROM live v JOIN log l ON l.revision = v.revision"
            " WHERE v.key = ?",
            (key,),
        ).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    def _append(
        self,
        key: str,
        kind: str,
        rev: int,
        prev_rev: int | None,
        new: dict[str, Any],
        prev: dict[str, Any] | None,
        overlay: dict[str, tuple[int, dict[str, Any]] | None],
    ) -> Event:
        value = _dump(new)
        conn = self.conn
        conn.execute(
            "INSERT INTO log (revision, key, type, prev_revision, value) VALUES (?, ?, ?, ?, ?)",
            (rev, key, kind, prev_rev, value),
        )
        if kind == "created":
            conn.execute("INSERT INTO live (key, revision) VALUES (?, ?)", (key, rev))
        elif kind == "updated":
            conn.execute("UPDATE live SET revision = ? WHERE key = ?", (rev, key))
        else:
            conn.execute("DELETE FROM live WHERE key = ?", (key,))
        # Watchers get their own copy: the caller may mutate what we return.
        ev = Event(_TYPE_OF_KIND[kind], key, rev, json.loads(value), prev)
        overlay[key] = None if kind == "deleted" else (rev, ev.obj)
        return ev

    def _create(
        self, req: _Request, rev: int, overlay: dict[str, tuple[int, dict[str, Any]] | None]
    ) -> Event:
        key = req.key
        if key in overlay:
            exists = overlay[key] is not None
        else:
            exists = (
                self.conn.execute("SELECT 1 FROM live WHERE key = ?", (key,)).fetchone() is not None
            )
        if exists:
            raise KeyExists(key)
        new = _clone(req.obj)
        if not isinstance(new, dict):
            raise TypeError("a stored object must be a JSON object")
        writes.prepare_create(new, rev, now_rfc3339())
        ev = self._append(key, "created", rev, None, new, None, overlay)
        req.result = new
        return ev

    def _update(
        self, req: _Request, rev: int, overlay: dict[str, tuple[int, dict[str, Any]] | None]
    ) -> Event:
        cur = self._current(req.key, overlay)
        if cur is None:
            raise KeyNotFound(req.key)
        old_rev, old = cur
        if req.expected_revision is not None and req.expected_revision != old_rev:
            raise RevisionConflict(
                f"{req.key}: expected revision {req.expected_revision}, stored {old_rev}"
            )
        new = _clone(req.obj)
        if not isinstance(new, dict):
            raise TypeError("a stored object must be a JSON object")
        removed = writes.prepare_update(new, old, rev)
        ev = self._append(
            req.key, "deleted" if removed else "updated", rev, old_rev, new, old, overlay
        )
        req.result = new
        return ev

    def _delete(
        self, req: _Request, rev: int, overlay: dict[str, tuple[int, dict[str, Any]] | None]
    ) -> Event | None:
        cur = self._current(req.key, overlay)
        if cur is None:
            raise KeyNotFound(req.key)
        old_rev, old = cur
        if req.expected_revision is not None and req.expected_revision != old_rev:
            raise RevisionConflict(
                f"{req.key}: expected revision {req.expected_revision}, stored {old_rev}"
            )
        omd = old.get("metadata") or {}
        if req.expected_uid is not None and omd.get("uid") != req.expected_uid:
            raise RevisionConflict(
                f"{req.key}: expected uid {req.expected_uid}, stored {omd.get('uid')}"
            )
        new = _clone(old)
        step = writes.prepare_delete(new, rev, now_rfc3339())
        req.result = (new, step.removed)
        if not step.write:
            return None  # already marked: nothing to write, nothing to tell watchers
        return self._append(req.key, "deleted" if step.removed else "updated", rev, old_rev, new, old,
                            overlay)

    # ---- compaction and checkpoints

    def compact_batch(self, target: int) -> bool:
        """Process one window of history toward `target`; True when done.

        Every row r in the window makes r.prev_revision obsolete (a newer row
        of the same key exists at or below the target), and a tombstone at or
        below the target is obsolete itself.  Rows above the target are never
        touched, so reads at or after the compacted revision stay exact even
        while a compaction is half done.
        """
        lo = self.compact_done
        hi = min(target, lo + COMPACT_BATCH - 1)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            doomed: list[tuple[int]] = []
            for rev, kind, prev in conn.execute(
                "SELECT revision, type, prev_revision FROM log"
                " WHERE revision >= ? AND revision <= ?",
                (lo, hi),
            ):
                if prev is not None:
                    doomed.append((prev,))
                if kind == "deleted":
                    doomed.append((rev,))
            conn.executemany("DELETE FROM log WHERE revision = ?", doomed)
            conn.execute(
                "UPDATE meta SET value = CAST(MAX(CAST(value AS INTEGER), ?) AS TEXT)"
                " WHERE name = 'compacted'",
                (target,),
            )
            conn.execute("UPDATE meta SET value = ? WHERE name = 'compact_done'", (str(hi + 1),))
            conn.execute("COMMIT")
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        self.compact_done = hi + 1
        return self.compact_done > target

    def checkpoint(self, mode: str) -> tuple[int, int, int]:
        busy, log_pages, done = self.conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
        return busy, log_pages, done


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
        return _Engine(conn, revision, compact_done)

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
        def read(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT l.value FROM live v JOIN log l ON l.revision = v.revision WHERE v.key = ?",
                (key,),
            ).fetchone()
            return None if row is None else row[0]

        value = await self._read(read)
        if value is None:
            raise KeyNotFound(key)
        return json.loads(value)

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
            items = [json.loads(r[1]) for r in rows]
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
                items.append(json.loads(value))
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
                    json.loads(value),
                    json.loads(prev) if prev is not None and kind != "created" else None,
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
