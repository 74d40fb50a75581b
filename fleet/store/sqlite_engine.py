"""The SQLite store's write engine: `_Engine.apply` runs one batch of create,
update and delete requests in one transaction on the writer's connection
(preconditions checked against the database plus an overlay of the earlier
requests of the batch), and the compaction and WAL-checkpoint steps.  It runs
in the writer's worker thread; `sqlite.py` owns the task that feeds it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

import trio

from fleet.api import writes
from fleet.api.meta import now_rfc3339
from fleet.store.base import (
    ADDED,
    DELETED,
    Event,
    KeyExists,
    KeyNotFound,
    RevisionConflict,
    StoreError,
)
from fleet.store.codec import PLAIN, ValueCodec
from fleet.store.sqlite_file import _TYPE_OF_KIND, _clone, _dump

# --------------------------------------------------------------------------
# The write path

# Revisions examined per compaction transaction.
COMPACT_BATCH = 1000


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

    def __init__(self, conn: sqlite3.Connection, revision: int, compact_done: int,
                 codec: ValueCodec = PLAIN) -> None:
        self.conn = conn
        self.codec = codec
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
        return None if row is None else (row[0], json.loads(self.codec.open(key, row[1])))

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
        text = _dump(new)
        value = self.codec.seal(key, text)
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
        ev = Event(_TYPE_OF_KIND[kind], key, rev, json.loads(text), prev)
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
