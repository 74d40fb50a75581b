"""SqliteStore writes and reads: metadata rules, preconditions, finalizers,
group commit, list paging at a consistent revision, compaction."""

from __future__ import annotations

import copy
import sqlite3

import pytest
import trio

from fleet.store import (
    KeyExists,
    KeyNotFound,
    RevisionCompacted,
    RevisionConflict,
    SqliteStore,
    StoreError,
)

from .helpers import key, next_event, pod


async def test_create_sets_server_metadata_and_keeps_caller_dict(store: SqliteStore) -> None:
    obj = pod("a")
    obj["metadata"]["uid"] = "forged"
    obj["metadata"]["deletionTimestamp"] = "2020-01-01T00:00:00Z"
    before = copy.deepcopy(obj)
    created = await store.create(key("a"), obj)
    assert obj == before  # the caller's dict is never mutated
    md = created["metadata"]
    assert md["uid"] != "forged" and len(md["uid"]) == 36
    assert md["creationTimestamp"].endswith("Z")
    assert md["generation"] == 1
    assert md["resourceVersion"] == "1"
    assert "deletionTimestamp" not in md
    assert store.current_revision() == 1
    assert await store.get(key("a")) == created
    # What get() returns is a copy too.
    got = await store.get(key("a"))
    got["spec"] = {}
    assert (await store.get(key("a")))["spec"] == created["spec"]


async def test_update_generation_only_follows_spec(store: SqliteStore) -> None:
    created = await store.create(key("a"), pod("a"))
    uid, ts = created["metadata"]["uid"], created["metadata"]["creationTimestamp"]

    labelled = copy.deepcopy(created)
    labelled["metadata"]["labels"] = {"x": "y"}
    labelled["metadata"]["uid"] = "other"  # ignored: uid is the store's
    labelled["metadata"]["creationTimestamp"] = "1999-01-01T00:00:00Z"
    labelled["metadata"]["generation"] = 42  # ignored too
    u1 = await store.update(key("a"), labelled)
    assert u1["metadata"]["generation"] == 1
    assert u1["metadata"]["uid"] == uid
    assert u1["metadata"]["creationTimestamp"] == ts
    assert u1["metadata"]["resourceVersion"] == "2"

    with_status = copy.deepcopy(u1)
    with_status["status"] = {"phase": "Running"}
    u2 = await store.update(key("a"), with_status)
    assert u2["metadata"]["generation"] == 1
    assert u2["metadata"]["resourceVersion"] == "3"

    new_spec = copy.deepcopy(u2)
    new_spec["spec"]["containers"][0]["image"] = "nginx"
    u3 = await store.update(key("a"), new_spec)
    assert u3["metadata"]["generation"] == 2

    extra_field = copy.deepcopy(u3)
    extra_field["data"] = {"k": "v"}  # outside metadata/status counts as spec
    u4 = await store.update(key("a"), extra_field)
    assert u4["metadata"]["generation"] == 3
    assert await store.get(key("a")) == u4


async def test_preconditions(store: SqliteStore) -> None:
    created = await store.create(key("a"), pod("a"))
    with pytest.raises(KeyExists):
        await store.create(key("a"), pod("a"))
    with pytest.raises(KeyNotFound):
        await store.get(key("nope"))
    with pytest.raises(KeyNotFound):
        await store.update(key("nope"), pod("nope"))
    with pytest.raises(KeyNotFound):
        await store.delete(key("nope"))

    rev = int(created["metadata"]["resourceVersion"])
    updated = await store.update(key("a"), created, expected_revision=rev)
    with pytest.raises(RevisionConflict):
        await store.update(key("a"), created, expected_revision=rev)  # stale now
    with pytest.raises(RevisionConflict):
        await store.delete(key("a"), expected_revision=rev)
    with pytest.raises(RevisionConflict):
        await store.delete(key("a"), expected_uid="not-the-uid")
    new_rev = int(updated["metadata"]["resourceVersion"])
    obj, removed = await store.delete(
        key("a"), expected_revision=new_rev, expected_uid=created["metadata"]["uid"]
    )
    assert removed and obj["metadata"]["resourceVersion"] == str(new_rev + 1)
    with pytest.raises(KeyNotFound):
        await store.get(key("a"))
    # The key can be created again, as a new object.
    again = await store.create(key("a"), pod("a"))
    assert again["metadata"]["uid"] != created["metadata"]["uid"]
    # Failed requests consumed no revisions.
    assert store.current_revision() == new_rev + 2


async def test_finalizer_protocol(store: SqliteStore) -> None:
    obj = pod("a")
    obj["metadata"]["finalizers"] = ["example.com/wait"]
    created = await store.create(key("a"), obj)
    watch = await store.watch("/core/pods/", from_revision=store.current_revision())

    marked, removed = await store.delete(key("a"))
    assert removed is False
    md = marked["metadata"]
    assert md["deletionTimestamp"] and md["deletionGracePeriodSeconds"] == 0
    assert md["generation"] == 2  # a newly set deletionTimestamp bumps it
    assert md["resourceVersion"] == "2"
    ev = await next_event(watch)
    assert (ev.type, ev.revision) == ("MODIFIED", 2)
    assert ev.prev == created

    # Deleting again writes nothing.
    again, removed = await store.delete(key("a"))
    assert removed is False and store.current_revision() == 2
    assert again == marked

    # An update cannot take the deletionTimestamp away.
    sneaky = copy.deepcopy(marked)
    del sneaky["metadata"]["deletionTimestamp"]
    sneaky["metadata"]["labels"] = {"l": "1"}
    still = await store.update(key("a"), sneaky)
    assert still["metadata"]["deletionTimestamp"] == md["deletionTimestamp"]
    assert still["metadata"]["generation"] == 2
    assert (await next_event(watch)).type == "MODIFIED"

    # Removing the last finalizer deletes the object.
    done = copy.deepcopy(still)
    done["metadata"]["finalizers"] = []
    final = await store.update(key("a"), done)
    assert final["metadata"]["resourceVersion"] == "4"
    ev = await next_event(watch)
    assert (ev.type, ev.revision, ev.key) == ("DELETED", 4, key("a"))
    assert ev.obj["metadata"]["resourceVersion"] == "4"
    assert ev.prev == still
    with pytest.raises(KeyNotFound):
        await store.get(key("a"))
    assert store.stats()["keys"] == 0
    await watch.aclose()


async def test_batch_failures_are_per_request(store: SqliteStore) -> None:
    await store.create(key("exists"), pod("exists"))
    results: dict[str, object] = {}

    async def attempt(name: str, op) -> None:  # noqa: ANN001
        try:
            results[name] = await op()
        except StoreError as exc:
            results[name] = exc

    # Queued together these land in one transaction: the failures must not
    # take the successes down with them.
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(
                attempt, f"new{i}", lambda i=i: store.create(key(f"n{i}"), pod(f"n{i}"))
            )
        nursery.start_soon(attempt, "dup", lambda: store.create(key("exists"), pod("exists")))
        nursery.start_soon(attempt, "missing", lambda: store.update(key("zz"), pod("zz")))
        nursery.start_soon(attempt, "twice-a", lambda: store.create(key("twice"), pod("twice")))
        nursery.start_soon(attempt, "twice-b", lambda: store.create(key("twice"), pod("twice")))
    assert isinstance(results["dup"], KeyExists)
    assert isinstance(results["missing"], KeyNotFound)
    # Exactly one of the two creates of the same key wins, even within a batch.
    outcomes = sorted(type(results[n]).__name__ for n in ("twice-a", "twice-b"))
    assert outcomes == ["KeyExists", "dict"]
    revs = sorted(int(results[f"new{i}"]["metadata"]["resourceVersion"]) for i in range(20))  # type: ignore[index]
    assert len(set(revs)) == 20
    assert store.current_revision() == 22
    assert store.stats()["keys"] == 22


async def test_commit_failure_fails_the_whole_batch(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create(key("a"), pod("a"))
    watch = await store.watch("", from_revision=1)
    engine = store._engine
    assert engine is not None
    real_commit = engine._commit
    calls = 0

    def failing_commit() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise sqlite3.OperationalError("disk I/O error (injected)")
        real_commit()

    monkeypatch.setattr(engine, "_commit", failing_commit)
    errors: list[BaseException] = []

    async def create(i: int) -> None:
        try:
            await store.create(key(f"b{i}"), pod(f"b{i}"))
        except StoreError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(create, i)
    assert len(errors) == 5 and all("injected" in str(e) for e in errors)
    assert store.current_revision() == 1
    with pytest.raises(KeyNotFound):
        await store.get(key("b0"))
    # Nothing was published; the next write reuses revision 2.
    created = await store.create(key("c"), pod("c"))
    assert created["metadata"]["resourceVersion"] == "2"
    ev = await next_event(watch)
    assert (ev.key, ev.revision) == (key("c"), 2)
    await watch.aclose()


async def test_list_paging_is_consistent_while_writes_happen(store: SqliteStore) -> None:
    for i in range(10):
        await store.create(key(f"p{i:02}"), pod(f"p{i:02}"))
    first = await store.list("/core/pods/default/", limit=4)
    at = first.revision
    assert at == 10
    assert [o["metadata"]["name"] for o in first.items] == ["p00", "p01", "p02", "p03"]
    assert first.continue_key == key("p03") and first.remaining == 6
    snapshot = {o["metadata"]["name"]: o for o in (await store.list("/core/pods/")).items}

    # Writes between pages: none of them may show up in the continued list.
    await store.delete(key("p05"))
    await store.create(key("p045"), pod("p045"))
    changed = copy.deepcopy(snapshot["p07"])
    changed["spec"]["x"] = 1
    await store.update(key("p07"), changed)
    await store.create(key("p99"), pod("p99"))

    pages = [first]
    while pages[-1].continue_key:
        pages.append(
            await store.list(
                "/core/pods/default/", revision=at, limit=4, start_after=pages[-1].continue_key
            )
        )
    assert all(p.revision == at for p in pages)
    got = [o for p in pages for o in p.items]
    assert got == [snapshot[n] for n in sorted(snapshot)]
    assert pages[-1].continue_key is None

    # The current list sees the new state.
    now = await store.list("/core/pods/default/")
    names = [o["metadata"]["name"] for o in now.items]
    assert "p05" not in names and "p045" in names and "p99" in names
    assert now.revision == store.current_revision() == 14


async def test_list_at_compacted_revision_is_expired(store: SqliteStore) -> None:
    for i in range(5):
        await store.create(key(f"c{i}"), pod(f"c{i}"))
    await store.compact(4)
    assert store.compacted_revision() == 4
    with pytest.raises(RevisionCompacted) as info:
        await store.list("/core/pods/", revision=3)
    assert (info.value.requested, info.value.compacted) == (3, 4)
    at4 = await store.list("/core/pods/", revision=4)
    assert len(at4.items) == 4
    with pytest.raises(RevisionCompacted):
        await store.watch("/core/pods/", from_revision=3)


async def test_prefix_is_exact(store: SqliteStore) -> None:
    await store.create(key("a", "default"), pod("a", "default"))
    await store.create(key("b", "default2"), pod("b", "default2"))
    await store.create("/core/pods/de%ault/c", pod("c", "de%ault"))
    await store.create("/core/pods/de_ault/d", pod("d", "de_ault"))
    names = lambda r: [o["metadata"]["name"] for o in r.items]  # noqa: E731
    assert names(await store.list("/core/pods/default/")) == ["a"]
    assert names(await store.list("/core/pods/default2/")) == ["b"]
    assert names(await store.list("/core/pods/de_ault/")) == ["d"]
    assert names(await store.list("/core/pods/de%ault/")) == ["c"]
    assert len((await store.list("/core/pods/")).items) == 4
    assert len((await store.list("")).items) == 4
    # A historic read (revision given) uses the same exact ranges.
    assert names(await store.list("/core/pods/default/", revision=3)) == ["a"]


async def test_compaction_keeps_latest_state(store: SqliteStore, db_path) -> None:  # noqa: ANN001
    for i in range(20):
        await store.create(key(f"k{i}"), pod(f"k{i}"))
    for round_ in range(5):
        for i in range(0, 20, 2):
            obj = await store.get(key(f"k{i}"))
            obj["spec"]["round"] = round_
            await store.update(key(f"k{i}"), obj)
    for i in range(0, 20, 5):
        await store.delete(key(f"k{i}"))
    await store.create(key("k0"), pod("k0"))  # re-created after its tombstone
    before = await store.list("")
    rev = store.current_revision()

    await store.compact(rev)
    after = await store.list("")
    assert after.items == before.items and after.revision == rev
    conn = sqlite3.connect(db_path)
    try:
        (rows,) = conn.execute("SELECT COUNT(*) FROM log").fetchone()
        (tombstones,) = conn.execute("SELECT COUNT(*) FROM log WHERE type='deleted'").fetchone()
    finally:
        conn.close()
    assert rows == len(after.items)  # exactly one row per live key is left
    assert tombstones == 0
    # Writes continue from the same counter; a watch from the compacted
    # revision still works.
    w = await store.watch("", from_revision=rev)
    await store.create(key("new"), pod("new"))
    assert (await next_event(w)).revision == rev + 1
    await w.aclose()


async def test_background_compaction_honours_retention(db_path) -> None:  # noqa: ANN001
    from fleet.store import open_store

    async with open_store(db_path, sync="OFF", retention=5, compact_interval=0.01) as s:
        for i in range(30):
            await s.create(key(f"r{i % 3}x{i}"), pod("r"))
        with trio.fail_after(5):
            while s.compacted_revision() < 25:
                await trio.sleep(0.01)
        assert s.compacted_revision() == 25
        assert len((await s.list("")).items) == 30


async def test_stats(store: SqliteStore) -> None:
    await store.create(key("a"), pod("a"))
    w = await store.watch("/core/", from_revision=0)
    stats = store.stats()
    assert stats["revision"] == 1 and stats["compacted_revision"] == 0
    assert stats["keys"] == 1 and stats["watchers"] == 1
    assert stats["db_bytes"] > 0 and stats["wal_bytes"] >= 0
    await w.aclose()
    assert store.stats()["watchers"] == 0
    assert await store.integrity_check() == "ok"
