"""The store file: initialization, reopen, refusing foreign files, WAL size,
and nothing acknowledged lost on SIGKILL."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from fleet.store import StoreClosed, StoreCorrupt, integrity_check, open_store
from fleet.store.sqlite_file import APPLICATION_ID

from .helpers import key, pod

REPO = Path(__file__).resolve().parents[3]


async def test_new_file_is_a_marked_fleet_store(db_path: Path) -> None:
    async with open_store(db_path, compact_interval=0) as s:
        await s.create(key("a"), pod("a"))
    header = db_path.read_bytes()[:100]
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    assert not Path(f"{db_path}.init-tmp").exists()
    assert await integrity_check(db_path) == "ok"


async def test_reopen_preserves_data_and_revision(db_path: Path) -> None:
    async with open_store(db_path, compact_interval=0) as s:
        a = await s.create(key("a"), pod("a"))
        await s.create(key("b"), pod("b"))
        await s.delete(key("b"))
        await s.create(key("c"), pod("c"))
        await s.delete(key("c"))  # the last write is a tombstone
        await s.compact(5)  # ... and compaction removed it
    async with open_store(db_path, compact_interval=0) as s:
        assert s.current_revision() == 5
        assert s.compacted_revision() == 5
        assert await s.get(key("a")) == a
        assert s.stats()["keys"] == 1
        d = await s.create(key("d"), pod("d"))
        assert d["metadata"]["resourceVersion"] == "6"
        listed = await s.list("/core/pods/")
        assert listed.revision == 6 and [o["metadata"]["name"] for o in listed.items] == [
            "a",
            "d",
        ]


async def test_closed_store_refuses_requests_and_errors_pass_through(db_path: Path) -> None:
    # An error raised in the body comes out as itself, not in an ExceptionGroup.
    with pytest.raises(KeyError):
        async with open_store(db_path, compact_interval=0) as s:
            await s.create(key("a"), pod("a"))
            raise KeyError("boom")
    with pytest.raises(StoreClosed):
        await s.create(key("b"), pod("b"))
    with pytest.raises(StoreClosed):
        await s.get(key("a"))
    with pytest.raises(StoreClosed):
        await s.watch("", from_revision=0)
    # The write acknowledged before the error is there.
    async with open_store(db_path, compact_interval=0) as s:
        assert (await s.get(key("a")))["metadata"]["resourceVersion"] == "1"
    # Cleanly closed: the WAL was checkpointed away.
    assert not Path(f"{db_path}-wal").exists()


def _fingerprint(path: Path) -> tuple[bytes, int, list[str]]:
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))


async def test_foreign_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "someone-elses.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE important (x)")
    conn.execute("INSERT INTO important VALUES (1)")
    conn.commit()
    conn.close()
    before = _fingerprint(path)
    with pytest.raises(StoreCorrupt, match="not a Fleet store"):
        async with open_store(path):
            pass
    with pytest.raises(StoreCorrupt):
        await integrity_check(path)
    assert _fingerprint(path) == before


async def test_garbage_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(8192))
    before = _fingerprint(path)
    with pytest.raises(StoreCorrupt, match="not a SQLite database"):
        async with open_store(path):
            pass
    assert _fingerprint(path) == before


async def test_empty_file_is_initialized(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    async with open_store(path, compact_interval=0) as s:
        await s.create(key("a"), pod("a"))
    async with open_store(path, compact_interval=0) as s:
        assert s.current_revision() == 1


async def test_damaged_fleet_store_is_refused(db_path: Path) -> None:
    async with open_store(db_path, compact_interval=0) as s:
        for i in range(200):
            await s.create(key(f"p{i}"), pod(f"p{i}", extra="x" * 2000))
    data = bytearray(db_path.read_bytes())
    page = 4096
    # Scribble over a few pages after the header page: the header still
    # says "Fleet", the contents are broken.
    for p in range(2, min(8, len(data) // page)):
        data[p * page : p * page + 64] = b"\xff" * 64
    db_path.write_bytes(bytes(data))
    with pytest.raises(StoreCorrupt, match="damaged"):
        async with open_store(db_path, compact_interval=0):
            pass


async def test_wal_stays_bounded(db_path: Path) -> None:
    pages = 64
    async with open_store(db_path, sync="NORMAL", compact_interval=0, checkpoint_pages=pages) as s:
        big = "y" * 1500
        for round_ in range(10):
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(s.create, key(f"w{round_}-{i}"), pod("w", data=big))
            # A sequential tail: many small commits.
            for i in range(20):
                await s.create(key(f"t{round_}-{i}"), pod("t", data=big))
            # Bound: the threshold plus what one batch can add on top.
            assert s.stats()["wal_bytes"] <= (pages + 200) * 4096
        assert s.stats()["revision"] == 1200
        assert s.stats()["db_bytes"] > 1200 * 1500


CHILD = textwrap.dedent(
    """
    import sys, trio
    from fleet.store import open_store

    async def main(path):
        async with open_store(path, sync="FULL", compact_interval=0) as s:
            async def one(i):
                obj = await s.create(f"/core/pods/default/k{i}", {"metadata": {"name": f"k{i}"}})
                print(obj["metadata"]["resourceVersion"], i, flush=True)
            async with trio.open_nursery() as nursery:
                for i in range(100000):
                    nursery.start_soon(one, i)
                    if i % 50 == 0:
                        await trio.sleep(0.001)

    trio.run(main, sys.argv[1])
    """
)


async def test_acknowledged_writes_survive_sigkill(db_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db_path)],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    acked: dict[int, int] = {}
    try:
        assert proc.stdout is not None
        while len(acked) < 2000:
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            assert line, "child exited early"
            rev, i = map(int, line.split())
            acked[i] = rev
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert await integrity_check(db_path) == "ok"
    async with open_store(db_path, compact_interval=0) as s:
        top = max(acked.values())
        assert s.current_revision() >= top
        for i, rev in acked.items():
            obj = await s.get(f"/core/pods/default/k{i}")
            assert obj["metadata"]["resourceVersion"] == str(rev)
        nxt = await s.create(key("after"), pod("after"))
        assert int(nxt["metadata"]["resourceVersion"]) == s.current_revision() > top
