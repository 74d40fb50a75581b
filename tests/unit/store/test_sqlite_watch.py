"""SqliteStore watches: resume from a revision, "from now", history/live
hand-over, prefix exactness, progress, overflow and close."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import trio

from fleet.store import (
    Event,
    RevisionCompacted,
    SqliteStore,
    WatchOverflow,
    open_store,
)

from .helpers import key, next_event, pod


async def take(watch, n: int) -> list[Event]:  # noqa: ANN001
    out = []
    with trio.fail_after(5):
        async for ev in watch:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def test_watch_resumes_from_revision(store: SqliteStore) -> None:
    a = await store.create(key("a"), pod("a"))  # 1
    await store.create(key("b"), pod("b"))  # 2
    a2 = copy.deepcopy(a)
    a2["spec"]["x"] = 1
    a2 = await store.update(key("a"), a2)  # 3
    await store.delete(key("b"))  # 4

    w = await store.watch("/core/pods/", from_revision=1)
    await store.create(key("c"), pod("c"))  # 5, live
    evs = await take(w, 4)
    assert [(e.type, e.key, e.revision) for e in evs] == [
        ("ADDED", key("b"), 2),
        ("MODIFIED", key("a"), 3),
        ("DELETED", key("b"), 4),
        ("ADDED", key("c"), 5),
    ]
    # History carries prev states too, from the log.
    assert evs[1].prev == a and evs[1].obj == a2
    assert evs[2].obj["metadata"]["resourceVersion"] == "4"
    assert evs[2].prev is not None and evs[2].prev["metadata"]["resourceVersion"] == "2"
    assert evs[0].prev is None and evs[3].prev is None
    assert w.progress == 5
    await w.aclose()


async def test_watch_from_zero_means_from_now(store: SqliteStore) -> None:
    await store.create(key("old"), pod("old"))
    w = await store.watch("/core/pods/", from_revision=0)
    assert w.progress == 1
    await store.create(key("new"), pod("new"))
    (ev,) = await take(w, 1)
    assert (ev.key, ev.revision) == (key("new"), 2)
    await w.aclose()


async def test_watch_from_a_revision_not_yet_published(store: SqliteStore) -> None:
    """A list snapshot can see a commit before the writer publishes it; a
    watch from that revision must not repeat it when it is published."""
    await store.create(key("a"), pod("a"))
    w = await store.watch("/core/pods/", from_revision=2)
    await store.create(key("b"), pod("b"))  # revision 2: the caller has it
    await store.create(key("c"), pod("c"))
    (ev,) = await take(w, 1)
    assert (ev.key, ev.revision) == (key("c"), 3)
    await w.aclose()


async def test_watch_from_compacted_revision_is_expired(store: SqliteStore) -> None:
    for i in range(6):
        await store.create(key(f"x{i}"), pod("x"))
    await store.compact(5)
    with pytest.raises(RevisionCompacted):
        await store.watch("/core/pods/", from_revision=4)
    w = await store.watch("/core/pods/", from_revision=5)
    (ev,) = await take(w, 1)
    assert ev.revision == 6
    await w.aclose()


async def test_watch_prefix_is_exact_and_progress_moves_when_idle(store: SqliteStore) -> None:
    w = await store.watch("/core/pods/default/", from_revision=0)
    exact = await store.watch(key("a"), from_revision=0)  # a non-"/" prefix
    await store.create(key("a", "default2"), pod("a", "default2"))
    await store.create(key("b", "default"), pod("b"))
    await store.create(key("a", "default"), pod("a"))
    await store.create(key("ab", "default"), pod("ab"))  # "a" is its prefix
    await store.create("/core/services/default/a", pod("a"))
    got = await take(w, 3)
    assert [e.key for e in got] == [key("b"), key("a"), key("ab")]
    got = await take(exact, 2)
    assert [e.key for e in got] == [key("a"), key("ab")]
    # Nothing for this watch in revision 5, yet its progress covers it.
    assert w.progress == 5 == exact.progress
    await w.aclose()
    await exact.aclose()


async def test_history_and_live_do_not_gap_or_repeat(store: SqliteStore) -> None:
    """Writers keep going while watches start from old revisions."""
    for i in range(50):
        await store.create(key(f"h{i}"), pod("h"))
    stop = 300

    async def writer() -> None:
        for i in range(50, stop):
            await store.create(key(f"h{i}"), pod("h"))

    async def watcher(start: int, seen: dict[int, list[int]]) -> None:
        w = await store.watch("/core/pods/", from_revision=start)
        revs = seen.setdefault(start, [])
        with trio.fail_after(10):
            async for ev in w:
                revs.append(ev.revision)
                if ev.revision == stop:
                    break
        await w.aclose()

    seen: dict[int, list[int]] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        for start in (1, 10, 25, 49, 50):
            nursery.start_soon(watcher, start, seen)
            await trio.sleep(0)
    for start, revs in seen.items():
        assert revs == list(range(start + 1, stop + 1)), start


async def test_slow_watcher_overflows_without_blocking_others(db_path: Path) -> None:
    async with open_store(db_path, sync="OFF", compact_interval=0, watch_buffer=5) as s:
        slow = await s.watch("/core/", from_revision=0)
        fast = await s.watch("/core/", from_revision=0)
        for i in range(4):
            await s.create(key(f"o{i}"), pod("o"))
        assert [e.revision for e in await take(fast, 4)] == [1, 2, 3, 4]
        for i in range(4, 8):
            await s.create(key(f"o{i}"), pod("o"))
        # The fast one keeps up; the slow one (8 behind, buffer 5) is ended.
        assert [e.revision for e in await take(fast, 4)] == [5, 6, 7, 8]
        with pytest.raises(WatchOverflow):
            await next_event(slow)
        assert s.stats()["watchers"] == 1
        await fast.aclose()


async def test_close_ends_watches(db_path: Path) -> None:
    events: list[Event] = []

    async def consume(w) -> None:  # noqa: ANN001
        async for ev in w:
            events.append(ev)

    async with trio.open_nursery() as nursery:
        async with open_store(db_path, sync="OFF", compact_interval=0) as s:
            w = await s.watch("", from_revision=0)
            nursery.start_soon(consume, w)
            await s.create(key("a"), pod("a"))
        # consume() returns on its own once the store is closed.
    assert [e.revision for e in events] == [1]
