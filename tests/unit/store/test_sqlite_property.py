"""Property: concurrent writers and watchers started at different revisions.

For random interleavings of creates/updates/deletes (with finalizers) by
concurrent trio tasks, every watcher sees exactly the committed events after
its start revision that match its prefix, once each, in strictly increasing
revision order, with `prev` the key's previous state; replaying the events
reconstructs the final store state.  The committed history is read straight
from the log table, so the store cannot grade its own homework.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.store import (
    Event,
    KeyExists,
    KeyNotFound,
    RevisionConflict,
    SqliteStore,
    open_store,
)

KEYS = ["/t/a/k0", "/t/a/k1", "/t/a2/k0", "/t/b/k0"]
# "/t/a/" must not match "/t/a2/"; "/t/a" (no slash) must match both.
PREFIXES = ["", "/t/", "/t/a/", "/t/a2/", "/t/a"]
SENTINELS = ["/t/a/~end", "/t/a2/~end", "/t/b/~end"]

key_ix = st.integers(0, len(KEYS) - 1)
op = st.one_of(
    st.tuples(st.just("create"), key_ix, st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("update"), key_ix, st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("status"), key_ix, st.booleans(), st.integers(0, 3)),
    st.tuples(st.just("unfinalize"), key_ix, st.booleans(), st.just(0)),
    st.tuples(st.just("delete"), key_ix, st.booleans(), st.just(0)),
    st.tuples(st.just("yield"), st.integers(0, 3), st.booleans(), st.just(0)),
)
writers = st.lists(st.lists(op, max_size=12), min_size=1, max_size=4)
# (start as a fraction of the revision at start time, prefix, checkpoints to wait)
watchers = st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, len(PREFIXES) - 1), st.integers(0, 30)),
    min_size=1,
    max_size=5,
)


async def run_writer(
    store: SqliteStore, ops: list[tuple[str, int, bool, int]], results: list
) -> None:
    for kind, k, flag, v in ops:
        if kind == "yield":
            for _ in range(k):
                await trio.sleep(0)
            continue
        key = KEYS[k]
        try:
            if kind == "create":
                md: dict[str, Any] = {"name": key.rsplit("/", 1)[1]}
                if flag:
                    md["finalizers"] = ["test/f"]
                results.append((key, await store.create(key, {"metadata": md, "spec": {"v": v}})))
            elif kind == "delete":
                expected_uid = None
                if flag:
                    expected_uid = (await store.get(key))["metadata"]["uid"]
                obj, _removed = await store.delete(key, expected_uid=expected_uid)
                results.append((key, obj))
            else:
                cur = await store.get(key)
                if kind == "update":
                    cur["spec"] = {"v": v}
                elif kind == "status":
                    cur["status"] = {"v": v}
                else:
                    cur["metadata"]["finalizers"] = []
                expected = int(cur["metadata"]["resourceVersion"]) if flag else None
                results.append((key, await store.update(key, cur, expected_revision=expected)))
        except (KeyExists, KeyNotFound, RevisionConflict):
            pass  # legitimate outcomes of racing writers; anything else fails


async def run_watcher(
    store: SqliteStore,
    spec: tuple[float, int, int],
    out: list[tuple[str, int, list[Event]]],
) -> None:
    frac, p, delay = spec
    for _ in range(delay):
        await trio.sleep(0)
    start = int(frac * store.current_revision())
    if start == 0:
        start = store.current_revision()  # "from now"
        w = await store.watch(PREFIXES[p], from_revision=0)
    else:
        w = await store.watch(PREFIXES[p], from_revision=start)
    seen: list[Event] = []
    out.append((PREFIXES[p], start, seen))
    async for ev in w:
        seen.append(ev)


def read_log(path: Path) -> list[tuple[int, str, str, int | None, dict[str, Any]]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT revision, key, type, prev_revision, value FROM log ORDER BY revision"
        ).fetchall()
    finally:
        conn.close()
    return [(r, k, t, p, json.loads(v)) for r, k, t, p, v in rows]


async def scenario(path: Path, plan: list[list[tuple]], watch_specs: list[tuple]) -> None:
    results: list[tuple[str, dict[str, Any]]] = []
    seen: list[tuple[str, int, list[Event]]] = []
    async with open_store(path, sync="OFF", compact_interval=0) as store:
        full = await store.watch("", from_revision=0)
        seen.append(("", 0, []))

        async def consume_full() -> None:
            async for ev in full:
                seen[0][2].append(ev)

        async with trio.open_nursery() as watch_nursery:
            watch_nursery.start_soon(consume_full)
            for spec in watch_specs:
                watch_nursery.start_soon(run_watcher, store, spec, seen)
            async with trio.open_nursery() as writer_nursery:
                for ops in plan:
                    writer_nursery.start_soon(run_writer, store, ops, results)
            for s in SENTINELS:
                await store.create(s, {"metadata": {"name": "end"}})
            final = store.current_revision()
            log = read_log(path)
            with trio.fail_after(3):
                # Wait for every watcher (some may still be starting) to
                # reach the last revision it should see.
                while len(seen) < len(watch_specs) + 1:
                    await trio.sleep(0)
                for prefix, start, events in seen:
                    wanted = [r for r in log if r[0] > start and r[1].startswith(prefix)]
                    while wanted and (not events or events[-1].revision < wanted[-1][0]):
                        await trio.sleep(0)
            for _ in range(5):
                await trio.sleep(0)  # room for any (wrong) extra event
            watch_nursery.cancel_scope.cancel()
        final_items = (await store.list("")).items
        listed = {k: await store.get(k) for k in KEYS + SENTINELS if _exists(log, k)}

    # The log itself: one row per revision, 1..final, no gaps.
    assert [r[0] for r in log] == list(range(1, final + 1))
    by_rev = {r[0]: r for r in log}
    # Every acknowledged write is in the log, exactly as returned.
    for key, obj in results:
        row = by_rev[int(obj["metadata"]["resourceVersion"])]
        assert row[1] == key and row[4] == obj

    kinds = {"created": "ADDED", "updated": "MODIFIED", "deleted": "DELETED"}
    for prefix, start, events in seen:
        wanted = [r for r in log if r[0] > start and r[1].startswith(prefix)]
        got = [(e.revision, e.key, e.type, e.obj) for e in events]
        assert got == [(r[0], r[1], kinds[r[2]], r[4]) for r in wanted], (prefix, start)
        for e in events:
            prev_rev = by_rev[e.revision][3]
            assert e.prev == (by_rev[prev_rev][4] if prev_rev else None)

    # Replaying the complete watch reconstructs the final state.
    state: dict[str, dict[str, Any]] = {}
    for e in seen[0][2]:
        if e.type == "DELETED":
            del state[e.key]
        else:
            state[e.key] = e.obj
    assert state == listed
    by_rv = lambda o: int(o["metadata"]["resourceVersion"])  # noqa: E731
    assert sorted(state.values(), key=by_rv) == sorted(final_items, key=by_rv)


def _exists(log: list[tuple], key: str) -> bool:
    last = [r for r in log if r[1] == key]
    return bool(last) and last[-1][2] != "deleted"


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=writers, watch_specs=watchers)
def test_watchers_see_exactly_the_committed_history(
    plan: list[list[tuple]], watch_specs: list[tuple]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(scenario, Path(tmp) / "p.db", plan, watch_specs)
