"""The SQLite store's file: the on-disk format (schema version 1, the
`application_id` header), the header check that refuses a foreign file before
SQLite touches it, creating a new file, the integrity check, and the small
JSON and key-range helpers every part of the backend uses.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
from pathlib import Path
from typing import Any

import trio

from fleet.store.base import ADDED, DELETED, MODIFIED, StoreCorrupt, StoreError

APPLICATION_ID = 0x464C4554  # b"FLET"
SCHEMA_VERSION = 1
MAGIC = "fleet-revision-store"
_MAX_INT64 = 2**63 - 1  # the largest integer SQLite binds

_SQLITE_HEADER = b"SQLite format 3\x00"
_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

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
