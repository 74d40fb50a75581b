"""Ownership under Update and Apply: table cases after structured-merge-diff's merge tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from fleet.api.ssa import fieldpath as fp
from fleet.api.ssa import schema as sch
from fleet.api.ssa import updater
from fleet.api.ssa.fieldpath import FieldSet, make_path
from fleet.api.ssa.updater import Conflict, Conflicts

S = sch.SCALAR_TYPE
T = sch.map_type({
    "list": sch.list_type(S, "set"),
    "atomic": sch.list_type(S),
    "items": sch.list_type(sch.map_type({"name": S, "value": S, "other": S}), "map", ("name",)),
    "a": S, "b": S, "c": S,
    "nested": sch.map_type({"inner": sch.map_type({"x": S, "y": S}), "z": S}),
    "labels": sch.map_type(elem=S),
    "lol": sch.list_type(sch.map_type({"name": S, "value": sch.list_type(S, "set")}), "map", ("name",)),
})
V = fp.value
K = fp.key


@dataclass
class Case:
    ops: list[tuple[str, str, Any]]
    object: Any = None
    managed: dict[str, set[tuple]] = field(default_factory=dict)
    conflict: list[tuple[str, tuple]] | None = None  # expected from the last op


def run(case: Case) -> tuple[Any, updater.ManagedFields]:
    live: Any = {}
    managed: updater.ManagedFields = {}
    for i, (op, manager, obj) in enumerate(case.ops):
        last = i == len(case.ops) - 1
        if op == "update":
            managed = updater.update(live, obj, T, managed, manager, "v1")
            live = obj
            continue
        try:
            live, managed = updater.apply(live, obj, T, managed, manager, "v1", force=op == "force")
        except Conflicts as c:
            if last and case.conflict is not None:
                assert sorted((x.manager, x.path) for x in c.conflicts) == \
                    sorted((m, make_path(*p)) for m, p in case.conflict)
                return live, managed
            raise
    assert case.conflict is None, "expected a conflict"
    return live, managed


CASES: dict[str, Case] = {
    # set_test.go
    "set_apply_twice": Case(
        [("apply", "default", {"list": ["a", "c"]}), ("apply", "default", {"list": ["a", "b", "c", "d"]})],
        {"list": ["a", "b", "c", "d"]},
        {"default": {("list", V(x)) for x in "abcd"}}),
    "set_apply_update_apply_no_overlap": Case(
        [("apply", "default", {"list": ["a", "c"]}),
         ("update", "controller", {"list": ["a", "b", "c", "d"]}),
         ("apply", "default", {"list": ["a", "aprime", "c", "cprime"]})],
        {"list": ["a", "aprime", "b", "c", "cprime", "d"]},
        {"default": {("list", V(x)) for x in ("a", "aprime", "c", "cprime")},
         "controller": {("list", V("b")), ("list", V("d"))}}),
    "set_apply_update_apply_with_overlap": Case(
        [("apply", "default", {"list": ["a", "c"]}),
         ("update", "controller", {"list": ["a", "b", "c", "d"]}),
         ("apply", "default", {"list": ["a", "b", "c"]})],
        {"list": ["a", "b", "c", "d"]},
        {"default": {("list", V(x)) for x in "abc"}, "controller": {("list", V("b")), ("list", V("d"))}}),
    "set_apply_twice_reorder": Case(
        [("apply", "default", {"list": ["a", "b", "c", "d"]}), ("apply", "default", {"list": ["a", "d", "c", "b"]})],
        {"list": ["a", "d", "c", "b"]},
        {"default": {("list", V(x)) for x in "abcd"}}),
    "set_apply_twice_remove": Case(
        [("apply", "default", {"list": ["a", "b", "c", "d"]}), ("apply", "default", {"list": ["a", "c"]})],
        {"list": ["a", "c"]},
        {"default": {("list", V("a")), ("list", V("c"))}}),
    # leaf_test.go: removing a field by omitting it; a field another manager owns survives
    "leaf_apply_twice_remove": Case(
        [("apply", "default", {"a": 1, "b": "s"}), ("apply", "default", {"b": "new"})],
        {"b": "new"}, {"default": {("b",)}}),
    "leaf_update_then_apply_keeps_other_owner": Case(
        [("apply", "default", {"a": 1, "b": "s"}), ("update", "controller", {"a": 2, "b": "s"}),
         ("apply", "default", {"b": "s"})],
        {"a": 2, "b": "s"}, {"default": {("b",)}, "controller": {("a",)}}),
    "leaf_conflict_with_updater": Case(
        [("apply", "default", {"a": 1}), ("update", "controller", {"a": 2}), ("apply", "default", {"a": 3})],
        conflict=[("controller", ("a",))]),
    "leaf_force_takes_ownership": Case(
        [("apply", "default", {"a": 1}), ("update", "controller", {"a": 2}), ("force", "default", {"a": 3})],
        {"a": 3}, {"default": {("a",)}}),
    "leaf_reapplying_the_live_value_is_no_conflict": Case(
        [("apply", "default", {"a": 1}), ("update", "controller", {"a": 2}), ("apply", "default", {"a": 2})],
        {"a": 2}, {"default": {("a",)}, "controller": {("a",)}}),
    # multiple_appliers_test.go: shared ownership, conflicts between appliers
    "two_appliers_same_value_share": Case(
        [("apply", "one", {"a": 1, "b": 1}), ("apply", "two", {"a": 1, "c": 2})],
        {"a": 1, "b": 1, "c": 2}, {"one": {("a",), ("b",)}, "two": {("a",), ("c",)}}),
    "shared_field_survives_one_applier_leaving": Case(
        [("apply", "one", {"a": 1, "b": 1}), ("apply", "two", {"a": 1}), ("apply", "one", {"b": 1})],
        {"a": 1, "b": 1}, {"one": {("b",)}, "two": {("a",)}}),
    "two_appliers_conflict": Case(
        [("apply", "one", {"a": 1}), ("apply", "two", {"a": 2})], conflict=[("one", ("a",))]),
    "two_appliers_force": Case(
        [("apply", "one", {"a": 1, "b": 1}), ("force", "two", {"a": 2})],
        {"a": 2, "b": 1}, {"one": {("b",)}, "two": {("a",)}}),
    # associative lists (key_test.go / multiple_appliers_test.go)
    "keyed_items_owned_per_field": Case(
        [("apply", "one", {"items": [{"name": "x", "value": 1}]}),
         ("apply", "two", {"items": [{"name": "x", "other": 2}, {"name": "y", "value": 3}]})],
        {"items": [{"name": "x", "value": 1, "other": 2}, {"name": "y", "value": 3}]},
        {"one": {("items", K({"name": "x"})), ("items", K({"name": "x"}), "name"),
                 ("items", K({"name": "x"}), "value")},
         "two": {("items", K({"name": "x"})), ("items", K({"name": "x"}), "name"),
                 ("items", K({"name": "x"}), "other"), ("items", K({"name": "y"})),
                 ("items", K({"name": "y"}), "name"), ("items", K({"name": "y"}), "value")}}),
    "keyed_item_conflict_path": Case(
        [("apply", "one", {"items": [{"name": "x", "value": 1}]}),
         ("apply", "two", {"items": [{"name": "x", "value": 2}]})],
        conflict=[("one", ("items", K({"name": "x"}), "value"))]),
    "keyed_item_removed_when_applier_drops_it": Case(
        [("apply", "one", {"items": [{"name": "x", "value": 1}, {"name": "y", "value": 2}]}),
         ("apply", "one", {"items": [{"name": "y", "value": 2}]})],
        {"items": [{"name": "y", "value": 2}]},
        {"one": {("items", K({"name": "y"})), ("items", K({"name": "y"}), "name"),
                 ("items", K({"name": "y"}), "value")}}),
    "keyed_item_kept_when_another_applier_holds_it": Case(
        [("apply", "one", {"items": [{"name": "x", "value": 1}]}),
         ("apply", "two", {"items": [{"name": "x"}]}),
         ("apply", "one", {"items": []})],
        {"items": [{"name": "x"}]},
        {"two": {("items", K({"name": "x"})), ("items", K({"name": "x"}), "name")}}),
    # atomic lists
    "atomic_list_replaced_and_owned_whole": Case(
        [("apply", "one", {"atomic": ["a", "b"]}), ("update", "ctl", {"atomic": ["a", "b", "c"]}),
         ("apply", "one", {"atomic": ["z"]})],
        conflict=[("ctl", ("atomic",))]),
    "atomic_list_force": Case(
        [("apply", "one", {"atomic": ["a", "b"]}), ("update", "ctl", {"atomic": ["c"]}),
         ("force", "one", {"atomic": ["z"]})],
        {"atomic": ["z"]}, {"one": {("atomic",)}}),
    # nested maps
    "nested_apply_remove_leaf_drops_empty_parents": Case(
        [("apply", "one", {"nested": {"inner": {"x": 1}, "z": 1}}), ("apply", "one", {"nested": {"z": 1}})],
        {"nested": {"z": 1}}, {"one": {("nested", "z")}}),
    "nested_update_inside_applied_map": Case(
        [("apply", "one", {"nested": {"inner": {"x": 1}}}),
         ("update", "ctl", {"nested": {"inner": {"x": 1, "y": 2}}}),
         ("apply", "one", {"nested": {"z": 3}})],
        {"nested": {"inner": {"y": 2}, "z": 3}},
        {"one": {("nested", "z")}, "ctl": {("nested", "inner", "y")}}),
    "map_of_strings_entries": Case(
        [("apply", "one", {"labels": {"a": "1", "b": "2"}}), ("apply", "two", {"labels": {"c": "3"}}),
         ("apply", "one", {"labels": {"a": "1"}})],
        {"labels": {"a": "1", "c": "3"}}, {"one": {("labels", "a")}, "two": {("labels", "c")}}),
    # multiple_appliers_test.go TestMultipleAppliersNestedType
    "nested_remove_one_keep_one_with_two_sub_items": Case(
        [("apply", "one", {"lol": [{"name": "a"}, {"name": "b", "value": ["c"]}]}),
         ("apply", "two", {"lol": [{"name": "b", "value": ["d"]}]}),
         ("apply", "one", {"lol": [{"name": "a"}]})],
        {"lol": [{"name": "a"}, {"name": "b", "value": ["d"]}]},
        {"one": {("lol", K({"name": "a"})), ("lol", K({"name": "a"}), "name")},
         "two": {("lol", K({"name": "b"})), ("lol", K({"name": "b"}), "name"),
                 ("lol", K({"name": "b"}), "value", V("d"))}}),
    "nested_remove_one_keep_one_with_dangling_subitem": Case(
        [("apply", "one", {"lol": [{"name": "a"}, {"name": "b", "value": ["c"]}]}),
         ("apply", "two", {"lol": [{"name": "b", "value": ["d"]}]}),
         ("update", "controller", {"lol": [{"name": "a"}, {"name": "b", "value": ["c", "d", "e"]}]}),
         ("apply", "one", {"lol": [{"name": "a"}]})],
        {"lol": [{"name": "a"}, {"name": "b", "value": ["d", "e"]}]},
        {"one": {("lol", K({"name": "a"})), ("lol", K({"name": "a"}), "name")},
         "two": {("lol", K({"name": "b"})), ("lol", K({"name": "b"}), "name"),
                 ("lol", K({"name": "b"}), "value", V("d"))},
         "controller": {("lol", K({"name": "b"}), "value", V("e"))}}),
    "nested_remove_one_with_dangling_subitem_keep_one": Case(
        [("apply", "one", {"lol": [{"name": "a"}, {"name": "b", "value": ["c"]}]}),
         ("apply", "two", {"lol": [{"name": "a", "value": ["b"]}]}),
         ("update", "controller", {"lol": [{"name": "a", "value": ["b"]}, {"name": "b", "value": ["c", "d"]}]}),
         ("apply", "one", {"lol": [{"name": "a"}]})],
        # The item `b` one applied goes whole, with the value the controller added to it.
        {"lol": [{"name": "a", "value": ["b"]}]},
        {"one": {("lol", K({"name": "a"})), ("lol", K({"name": "a"}), "name")},
         "two": {("lol", K({"name": "a"})), ("lol", K({"name": "a"}), "name"),
                 ("lol", K({"name": "a"}), "value", V("b"))}}),
    "update_removal_drops_everyones_ownership": Case(
        [("apply", "one", {"a": 1, "b": 2}), ("update", "ctl", {"b": 2})],
        {"b": 2}, {"one": {("b",)}}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name: str) -> None:
    case = CASES[name]
    obj, managed = run(case)
    if case.conflict is not None:
        return
    assert obj == case.object
    assert {m: set(vs.set) for m, vs in managed.items()} == \
        {m: {make_path(*p) for p in ps} for m, ps in case.managed.items()}


def test_update_never_conflicts_and_moves_ownership() -> None:
    managed = {"one": updater.VersionedSet(FieldSet([make_path("a")]), "v1", True)}
    out = updater.update({"a": 1}, {"a": 2}, T, managed, "ctl", "v1")
    assert set(out) == {"ctl"}
    assert out["ctl"].applied is False and set(out["ctl"].set) == {make_path("a")}


def test_apply_records_applied_flag_and_version() -> None:
    _, managed = updater.apply({}, {"a": 1}, T, {}, "one", "example.com/v2")
    assert managed["one"].applied and managed["one"].api_version == "example.com/v2"


def test_conflicts_grouped_by_manager() -> None:
    c = Conflicts([Conflict("b", make_path("x")), Conflict("a", make_path("y")), Conflict("b", make_path("z"))])
    assert c.by_manager() == {"b": [make_path("x"), make_path("z")], "a": [make_path("y")]}
    assert set(c.to_set()) == {make_path("x"), make_path("y"), make_path("z")}


def test_ignored_prefixes_are_never_owned() -> None:
    _, managed = updater.apply({}, {"a": 1, "nested": {"z": 1}}, T, {}, "one", "v1",
                               ignored=[make_path("nested")])
    assert set(managed["one"].set) == {make_path("a")}


def test_package_level_helpers() -> None:
    from fleet.api import ssa

    managed = ssa.update_managers({}, "one", "Apply", {}, {"a": 1, "b": 2}, T)
    obj = ssa.merge_apply({"a": 1, "b": 2}, {"a": 1}, T, managed=managed, manager="one")
    assert obj == {"a": 1}
    managed = ssa.update_managers(managed, "ctl", "Update", {"a": 1, "b": 2}, {"a": 5, "b": 2}, T)
    assert set(managed["ctl"].set) == {make_path("a")} and set(managed["one"].set) == {make_path("b")}
    with pytest.raises(Conflicts):
        ssa.update_managers(managed, "one", "Apply", {"a": 5, "b": 2}, {"a": 6}, T)
