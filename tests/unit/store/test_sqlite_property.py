"""Property: the SQLite store behaves like a plain in-memory model.

Concurrent trio tasks run random creates, updates and deletes (with
finalizers, revision and uid preconditions, right and stale) while watchers
start at different revisions on different prefixes.  Every operation is also
applied to `Model` -- a dict of key -> (value, revision) and a list of the
events it implies -- written from the `Store` protocol's documentation, not
from the store's tables.  The test then checks that

- every operation's outcome is the one the model predicts: the returned
  object with its revision, or the specific error (`KeyExists` only when the
  model holds the key, `KeyNotFound` only when it does not,
  `RevisionConflict` only when the expected revision or uid differs);
- every watcher sees exactly the model's events after its start revision
  under its prefix, once each, in order, with the model's `prev` (a watch
  "from now" may start anywhere between the last revision a writer had been
  told and the `progress` the watch reports on return -- the protocol promises
  no more -- and must then match the model from that revision);
- the final list and gets equal the model's state.

Operations are applied to the model in the order they are handed to the
store: the store has one FIFO write queue, so that is the order it applies
them in.  Server-stamped times cannot be predicted; they are checked to be
RFC 3339 strings that never change for one object, then compared as a
placeholder.
"""

from __future__ import annotations

import copy
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.store import (
    ADDED,
    DELETED,
    MODIFIED,
    Event,
    KeyExists,
    KeyNotFound,
    RevisionConflict,
    SqliteStore,
    Watch,
    open_store,
)

KEYS = ["/t/a/k0", "/t/a/k1", "/t/a2/k0", "/t/b/k0"]
# "/t/a/" must not match "/t/a2/"; "/t/a" (no slash) must match both.
PREFIXES = ["", "/t/", "/t/a/", "/t/a2/", "/t/a"]
SENTINELS = ["/t/a/~end", "/t/a2/~end", "/t/b/~end"]
TS = "<time>"
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

key_ix = st.integers(0, len(KEYS) - 1)
# Below len(KEYS) a key of KEYS; above (mostly), one the model holds then
# (so that most writes find their object).
live_ix = st.integers(0, 3 * len(KEYS) - 1)
# (kind, key index, precondition choice, value)
op = st.one_of(
    st.tuples(st.just("create"), key_ix, st.integers(0, 1), st.integers(0, 3)),
    st.tuples(st.just("update"), live_ix, st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("status"), live_ix, st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("unfinalize"), live_ix, st.integers(0, 2), st.just(0)),
    st.tuples(st.just("delete"), live_ix, st.integers(0, 4), st.just(0)),
    st.tuples(st.just("yield"), st.integers(0, 3), st.just(0), st.just(0)),
)
writers = st.lists(st.lists(op, max_size=16), min_size=1, max_size=4)
# (start as a fraction of the revision at start time, prefix, checkpoints to wait)
watchers = st.lists(
    st.tuples(st.floats(0, 1), st.integers(0, len(PREFIXES) - 1), st.integers(0, 30)),
    min_size=1,
    max_size=5,
)


class Stamps:
    """Server-stamped times: RFC 3339, and fixed per (uid, field) once seen."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], str] = {}

    def normalize(self, obj: Any) -> Any:
        if not isinstance(obj, dict):
            return obj
        obj = copy.deepcopy(obj)
        md = obj.get("metadata") or {}
        for name in ("creationTimestamp", "deletionTimestamp"):
            if name in md:
                value = md[name]
                assert isinstance(value, str) and _RFC3339.match(value), (name, value)
                first = self.seen.setdefault((md.get("uid"), name), value)
                assert value == first, (md.get("uid"), name, first, value)
                md[name] = TS
        return obj


@dataclass
class Model:
    """What the store must do, from the protocol's rules alone."""

    revision: int = 0
    state: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    events: list[tuple[str, str, int, dict[str, Any], dict[str, Any] | None]] = field(
        default_factory=list
    )

    def _emit(self, typ: str, key: str, obj: dict[str, Any], prev: dict[str, Any] | None) -> int:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.events.append((typ, key, self.revision, copy.deepcopy(obj), copy.deepcopy(prev)))
        if typ == DELETED:
            del self.state[key]
        else:
            self.state[key] = (copy.deepcopy(obj), self.revision)
        return self.revision

    def create(self, key: str, obj: dict[str, Any]) -> Any:
        if key in self.state:
            return KeyExists
        new = copy.deepcopy(obj)
        md = new["metadata"]
        md.pop("deletionTimestamp", None)
        md.pop("deletionGracePeriodSeconds", None)
        md["creationTimestamp"] = TS
        md["generation"] = 1
        self._emit(ADDED, key, new, None)
        return new

    def update(self, key: str, obj: dict[str, Any], expected: int | None) -> Any:
        if key not in self.state:
            return KeyNotFound
        old, old_rev = self.state[key]
        if expected is not None and expected != old_rev:
            return RevisionConflict
        new = copy.deepcopy(obj)
        md, omd = new["metadata"], old["metadata"]
        md["uid"] = omd["uid"]
        md["creationTimestamp"] = omd["creationTimestamp"]
        deleting = "deletionTimestamp" in omd
        if deleting:  # deletion is one-way
            md["deletionTimestamp"] = omd["deletionTimestamp"]
            md["deletionGracePeriodSeconds"] = omd["deletionGracePeriodSeconds"]
        spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }
        md["generation"] = omd["generation"] + (1 if spec_changed else 0)
        # The update that removes the last finalizer of a deleting object deletes it.
        # (A pod still in a grace period is the exception; deletes here use 0.)
        removed = (
            deleting
            and not md.get("finalizers")
            and bool(omd.get("finalizers"))
            and not md.get("deletionGracePeriodSeconds")
        )
        self._emit(DELETED if removed else MODIFIED, key, new, old)
        return new

    def delete(self, key: str, expected: int | None, expected_uid: str | None) -> Any:
        if key not in self.state:
            return KeyNotFound
        old, old_rev = self.state[key]
        if expected is not None and expected != old_rev:
            return RevisionConflict
        if expected_uid is not None and expected_uid != old["metadata"]["uid"]:
            return RevisionConflict
        new = copy.deepcopy(old)
        md = new["metadata"]
        if not md.get("finalizers"):
            self._emit(DELETED, key, new, old)
            return (new, True)
        if md.get("deletionTimestamp") and md.get("deletionGracePeriodSeconds") == 0:
            return (new, False)  # already marked: no write, no event
        if not md.get("deletionTimestamp"):
            md["deletionTimestamp"] = TS
            md["generation"] += 1
        md["deletionGracePeriodSeconds"] = 0
        self._emit(MODIFIED, key, new, old)
        return (new, False)


@dataclass
class Run:
    model: Model = field(default_factory=Model)
    stamps: Stamps = field(default_factory=Stamps)
    # The highest revision a writer has been told about.
    acked: int = 0
    outcomes: list[tuple[Any, Any, Any]] = field(default_factory=list)
    watches: list[Watch] = field(default_factory=list)


def _expected_revision(m: Model, key: str, choice: int) -> int | None:
    """0: no precondition, 1: the current revision, 2: a stale one."""
    if choice == 0:
        return None
    cur = m.state[key][1] if key in m.state else m.revision + 1
    return cur if choice == 1 else max(cur - 1, 0)


async def run_writer(store: SqliteStore, ops: list[tuple[str, int, int, int]], run: Run) -> None:
    m = run.model
    for kind, k, choice, v in ops:
        if kind == "yield":
            for _ in range(k):
                await trio.sleep(0)
            continue
        live = sorted(m.state)
        key = live[k % len(live)] if k >= len(KEYS) and live else KEYS[k % len(KEYS)]
        name = key.rsplit("/", 1)[1]
        # From building the request to handing it to the store nothing yields,
        # so the model sees the operations in the store's queue order.
        if kind == "create":
            md: dict[str, Any] = {"name": name, "uid": str(uuid.uuid4())}
            if choice:
                md["finalizers"] = ["test/f"]
            body = {"metadata": md, "spec": {"v": v}}
            predicted = m.create(key, body)
            call = store.create(key, body)
        elif kind == "delete":
            if choice in (0, 1, 2):
                expected, expected_uid = _expected_revision(m, key, choice), None
            else:
                right = m.state[key][0]["metadata"]["uid"] if key in m.state else None
                expected = None
                expected_uid = right if choice == 3 and right else str(uuid.uuid4())
            predicted = m.delete(key, expected, expected_uid)
            call = store.delete(key, expected_revision=expected, expected_uid=expected_uid)
        else:
            if key in m.state:
                body = copy.deepcopy(m.state[key][0])
            else:
                body = {"metadata": {"name": name}, "spec": {"v": 0}}
            if kind == "update":
                body["spec"] = {"v": v}
            elif kind == "status":
                body["status"] = {"v": v}
            else:
                body["metadata"]["finalizers"] = []
            expected = _expected_revision(m, key, choice)
            predicted = m.update(key, body, expected)
            call = store.update(key, body, expected_revision=expected)
        try:
            got: Any = await call
        except (KeyExists, KeyNotFound, RevisionConflict) as exc:
            got = type(exc)
        run.outcomes.append(((kind, key, choice, v), predicted, got))
        if not isinstance(got, type):
            obj = got[0] if isinstance(got, tuple) else got
            run.acked = max(run.acked, int(obj["metadata"]["resourceVersion"]))


async def run_watcher(
    store: SqliteStore, spec: tuple[float, int, int], run: Run, out: list
) -> None:
    frac, p, delay = spec
    for _ in range(delay):
        await trio.sleep(0)
    start = int(frac * run.model.revision)
    if start == 0:
        # "From now" starts somewhere between what writers had been told when
        # it was asked for and what the watch has accounted for on return.
        low = run.acked
        w = await store.watch(PREFIXES[p], from_revision=0)
        window = (low, w.progress)
        assert w.progress <= run.model.revision, (w.progress, run.model.revision)
    else:
        w = await store.watch(PREFIXES[p], from_revision=start)
        window = (start, start)
    run.watches.append(w)
    seen: list[Event] = []
    out.append((PREFIXES[p], window, seen))
    async for ev in w:
        seen.append(ev)


async def scenario(path: Path, plan: list[list[tuple]], watch_specs: list[tuple]) -> None:
    run = Run()
    m = run.model
    seen: list[tuple[str, tuple[int, int], list[Event]]] = []
    async with open_store(path, sync="OFF", compact_interval=0) as store:
        full = await store.watch("", from_revision=0)
        run.watches.append(full)
        seen.append(("", (0, 0), []))

        async def consume_full() -> None:
            async for ev in full:
                seen[0][2].append(ev)

        async with trio.open_nursery() as watch_nursery:
            watch_nursery.start_soon(consume_full)
            for spec in watch_specs:
                watch_nursery.start_soon(run_watcher, store, spec, run, seen)
            async with trio.open_nursery() as writer_nursery:
                for ops in plan:
                    writer_nursery.start_soon(run_writer, store, ops, run)
            for s in SENTINELS:
                body = {"metadata": {"name": "end", "uid": str(uuid.uuid4())}}
                predicted = m.create(s, body)
                run.outcomes.append((("create", s, 0, 0), predicted, await store.create(s, body)))
            with trio.move_on_after(10):  # a stream that falls short fails below
                # Wait for every watcher to start and to have accounted for
                # the last revision (yielded or queued it, if it matches) ...
                while len(seen) < len(watch_specs) + 1:
                    await trio.sleep(0)
                while any(w.progress < m.revision for w in run.watches):
                    await trio.sleep(0)
            for _ in range(5):
                await trio.sleep(0)  # ... and for the consumers to drain them
            watch_nursery.cancel_scope.cancel()
        listed = (await store.list("")).items
        gets = {}
        for k in KEYS + SENTINELS:
            try:
                gets[k] = await store.get(k)
            except KeyNotFound:
                gets[k] = KeyNotFound
        final_revision = store.current_revision()

    norm = run.stamps.normalize
    # Every operation ended exactly as the model said it would.
    for what, predicted, got in run.outcomes:
        if isinstance(predicted, tuple):
            assert isinstance(got, tuple), (what, predicted, got)
            assert (norm(got[0]), got[1]) == predicted, what
        else:
            assert norm(got) == predicted, (what, predicted, got)

    # Every watcher saw the model's events for its prefix after its start.
    for prefix, (low, high), events in seen:
        got_events = [(e.type, e.key, e.revision, norm(e.obj), norm(e.prev)) for e in events]
        wanted = [
            [ev for ev in m.events if ev[2] > start and ev[1].startswith(prefix)]
            for start in range(low, high + 1)
        ]
        assert got_events in wanted, (prefix, (low, high), got_events, wanted[-1])

    # The final state is the model's.
    assert final_revision == m.revision
    live = {k: v for k, (v, _rev) in m.state.items()}
    assert [norm(o) for o in listed] == [live[k] for k in sorted(live)]
    for k, obj in gets.items():
        assert (norm(obj) if k in live else obj) == live.get(k, KeyNotFound), k


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=writers, watch_specs=watchers)
def test_store_matches_the_model(plan: list[list[tuple]], watch_specs: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(scenario, Path(tmp) / "p.db", plan, watch_specs)


# ---------------------------------------------------------------------------
# One writer at a time, every step checked as it happens (the concurrent property
# above checks outcomes too, but only once the run is over).
# ---------------------------------------------------------------------------

seq_op = st.one_of(
    st.tuples(st.just("create"), key_ix, st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("update"), key_ix, st.sampled_from(["none", "current", "stale"]), st.integers(0, 2)),
    st.tuples(st.just("status"), key_ix, st.sampled_from(["none", "current", "stale"]), st.integers(0, 2)),
    st.tuples(st.just("unfinalize"), key_ix, st.sampled_from(["none", "current", "stale"]), st.just(0)),
    st.tuples(st.just("delete"), key_ix, st.sampled_from(["none", "right", "wrong"]), st.just(0)),
)


class SequentialModel:
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
    model = SequentialModel()
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
