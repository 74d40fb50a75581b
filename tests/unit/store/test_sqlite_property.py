"""Property: concurrent writers and watchers started at different revisions.

For random interleavings of creates/updates/deletes (with finalizers) by
concurrent trio tasks, every watcher sees exactly the committed events after
its start revision that match its prefix, once each, in strictly increasing
revision order, with `prev` the key's previous state; replaying the events
reconstructs the final store state.  The committed history is read straight
from the log table.

Racing writers make some outcomes (KeyExists, a conflict) legitimate there, so
that test cannot say whether each one was right; the second property grades a
single writer against an independent in-memory model written from Kubernetes'
rules: every operation's outcome (success with its resourceVersion,
generation, deletion mark and finalizers, or the exact error), the watch
stream and the final state must be what the model predicts.
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


# ---------------------------------------------------------------------------
# Graded against an independent model: every outcome predicted, not excused.
# ---------------------------------------------------------------------------

seq_op = st.one_of(
    st.tuples(st.just("create"), key_ix, st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("update"), key_ix, st.sampled_from(["none", "current", "stale"]), st.integers(0, 2)),
    st.tuples(st.just("status"), key_ix, st.sampled_from(["none", "current", "stale"]), st.integers(0, 2)),
    st.tuples(st.just("unfinalize"), key_ix, st.sampled_from(["none", "current", "stale"]), st.just(0)),
    st.tuples(st.just("delete"), key_ix, st.sampled_from(["none", "right", "wrong"]), st.just(0)),
)


class Model:
    """What the store must do, written from Kubernetes' rules, not from the store."""

    def __init__(self) -> None:
        self.rev = 0
        self.objs: dict[str, dict[str, Any]] = {}  # key -> {rv, gen, v, status, fins, deleting, uid}
        self.events: list[tuple[str, str, int]] = []  # (type, key, revision)

    def apply(self, kind: str, key: str, flag: Any, v: int, uid: str | None) -> tuple[str, dict | None]:
        cur = self.objs.get(key)
        if kind == "create":
            if cur is not None:
                return "KeyExists", None
            self.rev += 1
            self.objs[key] = {"rv": self.rev, "gen": 1, "v": v, "status": None, "fins": bool(flag),
                              "deleting": False, "uid": uid}
            self.events.append(("ADDED", key, self.rev))
            return "ok", self.objs[key]
        if cur is None:
            return "KeyNotFound", None
        if kind == "delete":
            if flag == "wrong":
                return "RevisionConflict", None
            if cur["fins"]:
                if cur["deleting"]:
                    return "ok", cur  # already marked with grace 0: nothing written
                self.rev += 1
                cur.update(rv=self.rev, gen=cur["gen"] + 1, deleting=True)
                self.events.append(("MODIFIED", key, self.rev))
                return "ok", cur
            self.rev += 1
            del self.objs[key]
            self.events.append(("DELETED", key, self.rev))
            return "ok", None
        if flag == "stale":
            return "RevisionConflict", None
        self.rev += 1
        if kind == "update":
            if v != cur["v"]:
                cur["gen"] += 1
            cur["v"] = v
        elif kind == "status":
            cur["status"] = v
        else:
            removes = cur["fins"] and cur["deleting"]
            cur["fins"] = False
            if removes:
                del self.objs[key]
                self.events.append(("DELETED", key, self.rev))
                return "ok", None
        cur["rv"] = self.rev
        self.events.append(("MODIFIED", key, self.rev))
        return "ok", cur


async def sequential(path: Path, ops: list[tuple]) -> None:
    model = Model()
    async with open_store(path, sync="OFF", compact_interval=0) as store:
        w = await store.watch("", from_revision=0)
        for kind, k, flag, v in ops:
            key = KEYS[k]
            uid = None
            try:
                if kind == "create":
                    md: dict[str, Any] = {"name": key.rsplit("/", 1)[1]}
                    if flag:
                        md["finalizers"] = ["test/f"]
                    got = await store.create(key, {"metadata": md, "spec": {"v": v}})
                    uid = got["metadata"]["uid"]
                elif kind == "delete":
                    expected_uid = None
                    if flag != "none":
                        stored = model.objs.get(key)
                        expected_uid = (stored["uid"] if stored and flag == "right" else "0" * 8 + "-wrong")
                    got, _removed = await store.delete(key, expected_uid=expected_uid)
                else:
                    stored = model.objs.get(key)
                    body: dict[str, Any] = {"metadata": {"name": key.rsplit("/", 1)[1],
                                                         "finalizers": ["test/f"] if stored and stored["fins"] else []},
                                            "spec": {"v": stored["v"] if stored else 0}}
                    if stored and stored["status"] is not None:
                        body["status"] = {"v": stored["status"]}
                    if kind == "update":
                        body["spec"] = {"v": v}
                    elif kind == "status":
                        body["status"] = {"v": v}
                    else:
                        body["metadata"]["finalizers"] = []
                    expected = None
                    if flag == "current" and stored:
                        expected = stored["rv"]
                    elif flag == "stale":
                        expected = (stored["rv"] - 1) if stored else 1
                    got = await store.update(key, body, expected_revision=expected)
                outcome = "ok"
            except (KeyExists, KeyNotFound, RevisionConflict) as e:
                outcome, got = type(e).__name__, None
            want, state = model.apply(kind, key, flag, v, uid)
            assert outcome == want, (kind, key, flag, outcome, want)
            if outcome == "ok" and state is not None and got is not None:
                md = got["metadata"]
                assert int(md["resourceVersion"]) == state["rv"], (kind, key)
                assert md["generation"] == state["gen"], (kind, key, md, state)
                assert bool(md.get("deletionTimestamp")) == state["deleting"], (kind, key)
                assert bool(md.get("finalizers")) == state["fins"], (kind, key)
        assert store.current_revision() == model.rev
        listed = {k: int(o["metadata"]["resourceVersion"])
                  for k in KEYS if (o := await _get_or_none(store, k)) is not None}
        assert listed == {k: s["rv"] for k, s in model.objs.items()}
        seen: list[tuple[str, str, int]] = []
        with trio.fail_after(3):
            while len(seen) < len(model.events):
                ev = await w.__anext__()
                seen.append((ev.type, ev.key, ev.revision))
        assert seen == model.events
        assert w.take_ready(10) == []  # nothing the model did not predict
        await w.aclose()


async def _get_or_none(store: SqliteStore, key: str) -> dict[str, Any] | None:
    try:
        return await store.get(key)
    except KeyNotFound:
        return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(seq_op, max_size=25))
def test_every_outcome_matches_an_independent_model(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(sequential, Path(tmp) / "m.db", ops)
