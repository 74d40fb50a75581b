"""Hypothesis properties of apply and update over random objects and operation sequences."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api.ssa import typed, updater
from fleet.api.ssa.fieldpath import Path
from fleet.api.ssa.updater import Conflicts
from tests.unit.api.ssa.test_updater import T

_small = st.integers(0, 3)
_word = st.sampled_from(["a", "b", "c", "d"])
_item = st.fixed_dictionaries({"name": _word}, optional={"value": _small, "other": _small})
_objects = st.fixed_dictionaries({}, optional={
    "a": _small, "b": _small, "c": _small,
    "list": st.lists(_word, unique=True, max_size=4),
    "atomic": st.lists(_word, max_size=3),
    "items": st.lists(_item, unique_by=lambda i: i["name"], max_size=3),
    "nested": st.fixed_dictionaries({}, optional={
        "inner": st.fixed_dictionaries({}, optional={"x": _small, "y": _small}), "z": _small}),
    "labels": st.dictionaries(_word, _word, max_size=3),
})
_ops = st.lists(st.tuples(st.sampled_from(["apply", "update", "force"]), st.sampled_from(["m1", "m2", "m3"]),
                          _objects), min_size=1, max_size=6)


def exists(obj: Any, path: Path) -> bool:
    """Whether `path` names something present in `obj`."""
    cur = obj
    for kind, data in path:
        if kind == "f":
            if not isinstance(cur, dict) or data not in cur:
                return False
            cur = cur[data]
        elif isinstance(cur, list):
            matches = [x for i, x in enumerate(cur)
                       if typed.item_element(_list_type(obj, path), x, i, ()) == (kind, data)]
            if not matches:
                return False
            cur = matches[0]
        else:
            return False
    return True


def _get(obj: Any, path: Path) -> Any:
    for kind, data in path:
        obj = obj[data] if kind == "f" else None
    return obj


def _list_type(obj: Any, path: Path) -> Any:
    # Every list in T sits directly under a top-level field.
    return T.field(path[0][1])


def run(ops: list[tuple[str, str, dict[str, Any]]]) -> tuple[Any, updater.ManagedFields]:
    live: Any = {}
    managed: updater.ManagedFields = {}
    for op, manager, obj in ops:
        if op == "update":
            managed = updater.update(live, obj, T, managed, manager, "v1")
            live = obj
        else:
            try:
                live, managed = updater.apply(live, obj, T, managed, manager, "v1", force=op == "force")
            except Conflicts:
                pass
    return live, managed


@settings(max_examples=120, deadline=None)
@given(_ops)
def test_owned_paths_always_exist(ops: list) -> None:
    live, managed = run(ops)
    for vs in managed.values():
        for p in vs.set:
            assert exists(live, p), (p, live)


@settings(max_examples=120, deadline=None)
@given(_ops, st.sampled_from(["m1", "m2", "m3"]), _objects)
def test_applying_the_same_config_twice_is_a_no_op(ops: list, manager: str, config: dict) -> None:
    live, managed = run(ops)
    once, managed1 = updater.apply(live, config, T, managed, manager, "v1", force=True)
    twice, managed2 = updater.apply(once, config, T, managed1, manager, "v1", force=False)
    assert twice == once
    assert {m: set(v.set) for m, v in managed2.items()} == {m: set(v.set) for m, v in managed1.items()}


@settings(max_examples=120, deadline=None)
@given(_ops, st.sampled_from(["m1", "m2", "m3"]), _objects)
def test_applied_result_sets_every_field_of_the_config(ops: list, manager: str, config: dict) -> None:
    live, managed = run(ops)
    new, out = updater.apply(live, config, T, managed, manager, "v1", force=True)
    want = typed.to_field_set(config, T)
    have = typed.to_field_set(new, T)
    # Everything the config sets is there; an empty map it sets may hold others' entries.
    for p in want:
        assert have.has(p) or (exists(new, p) and isinstance(_get(config, p), dict)), p
    assert set(out[manager].set) == set(want) if not want.empty() else manager not in out
    # ... with the config's values.
    assert typed.compare(typed.merge(new, config, T), new, T).is_same()


@settings(max_examples=120, deadline=None)
@given(_ops, st.sampled_from(["m1", "m2", "m3"]), _objects)
def test_update_gives_the_writer_every_change(ops: list, manager: str, new: dict) -> None:
    live, managed = run(ops)
    out = updater.update(live, new, T, managed, manager, "v1")
    cmp = typed.compare(live, new, T)
    mine = out[manager].set if manager in out else None
    changed = cmp.changed()
    if not changed.empty():
        assert mine is not None and changed.difference(mine).empty()
    for m, vs in out.items():
        if m != manager:
            assert vs.set.intersection(changed).empty()
