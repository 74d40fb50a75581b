"""Baseline: raw SQLite insert rate with the durability the Fleet store promises.

`python -m bench.sqlite_baseline`

WAL mode, synchronous=FULL (every COMMIT waits for the WAL fsync), rows shaped like the
store's append-only log (revision, key, event type, previous revision, JSON value).
Two runs, in the same process and on the same file system as the server's data directory:

- ``per_txn``: one INSERT per transaction, i.e. what the server could acknowledge if each
  write paid its own fsync (no group commit).  Commit latencies are recorded too.
- ``batch_50``: 50 INSERTs per transaction, i.e. what group commit can reach at best.

Each run is bounded by a row count and a time limit, whichever comes first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import log, summarize_ms, write_results

SCHEMA = """
CREATE TABLE log (
    revision INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    type INTEGER NOT NULL,
    prev_revision INTEGER,
    value BLOB
);
CREATE INDEX log_key ON log(key, revision);
"""


def _value(i: int) -> bytes:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"cm-{i}",
            "namespace": "default",
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "resourceVersion": str(i),
            "labels": {"bench": "fleet"},
        },
        "data": {"payload": "x" * 64},
    }
    return json.dumps(obj, separators=(",", ":")).encode()


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode.lower() == "wal", mode
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)
    return db


def run_mode(dirpath: Path, batch: int, max_rows: int, max_seconds: float) -> dict[str, Any]:
    db = _open(dirpath / f"baseline-{batch}.db")
    sql = "INSERT INTO log (revision, key, type, prev_revision, value) VALUES (?, ?, 0, NULL, ?)"
    rev = 0
    commits: list[float] = []
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    while rev < max_rows and time.perf_counter() < deadline:
        c0 = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        for _ in range(batch):
            rev += 1
            db.execute(sql, (rev, f"/core/configmaps/default/cm-{rev}", _value(rev)))
        db.execute("COMMIT")
        commits.append(time.perf_counter() - c0)
    wall = time.perf_counter() - t0
    db.close()
    return {
        "rows_per_txn": batch,
        "rows": rev,
        "transactions": len(commits),
        "wall_s": round(wall, 3),
        "inserts_per_s": round(rev / wall, 1),
        "commit_latency": summarize_ms(commits),
    }


def run(max_seconds: float = 10.0, dirpath: Path | None = None) -> dict[str, Any]:
    own = dirpath is None
    d = Path(tempfile.mkdtemp(prefix="fleet-bench-sqlite-")) if own else dirpath
    try:
        per_txn = run_mode(d, 1, max_rows=100_000, max_seconds=max_seconds)
        log(f"sqlite per-txn: {per_txn['inserts_per_s']:.0f} inserts/s "
            f"(commit p50 {per_txn['commit_latency']['p50_ms']} ms, p99 {per_txn['commit_latency']['p99_ms']} ms)")
        batch = run_mode(d, 50, max_rows=1_000_000, max_seconds=max_seconds)
        log(f"sqlite batch-50: {batch['inserts_per_s']:.0f} inserts/s")
    finally:
        if own:
            shutil.rmtree(d, ignore_errors=True)
    result = {
        "sqlite_version": sqlite3.sqlite_version,
        "journal_mode": "wal",
        "synchronous": "FULL",
        "filesystem_dir": str(d),
        "per_txn": per_txn,
        "batch_50": batch,
        "group_commit_headroom": round(batch["inserts_per_s"] / per_txn["inserts_per_s"], 2),
    }
    write_results("sqlite_baseline", result)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="time limit per mode")
    a = ap.parse_args()
    run(a.seconds)


if __name__ == "__main__":
    main()
