"""to_field_set, compare, merge and remove_items over typed and deduced values."""

from __future__ import annotations

import pytest

from fleet.api.ssa import fieldpath as fp
from fleet.api.ssa import schema as sch
from fleet.api.ssa import typed
from fleet.api.ssa.fieldpath import FieldSet, make_path

S = sch.SCALAR_TYPE
ITEM = sch.map_type({"name": S, "value": S, "tags": sch.list_type(S, "set")})
T = sch.map_type({
    "atomic": sch.list_type(S),
    "set": sch.list_type(S, "set"),
    "items": sch.list_type(ITEM, "map", ("name",)),
    "ports": sch.list_type(sch.map_type({"port": S, "protocol": S}), "map", ("port", "protocol"),
                           {"protocol": "TCP"}),
    "labels": sch.map_type(elem=S),
    "selector": sch.map_type(elem=S, atomic=True),
    "nested": sch.map_type({"inner": sch.map_type({"a": S, "b": S})}),
    "free": sch.DEDUCED_TYPE,
})
N = fp.key


def paths(*ps: tuple) -> FieldSet:
    return FieldSet(make_path(*p) for p in ps)


def test_to_field_set_of_each_shape() -> None:
    obj = {
        "atomic": ["x", "y"], "set": ["a", "b"], "items": [{"name": "n", "value": 1, "tags": ["t"]}],
        "ports": [{"port": 80}], "labels": {"app": "a"}, "selector": {"k": "v"},
        "nested": {"inner": {"a": 1}}, "free": {"x": [1, 2], "y": {"z": None}},
    }
    got = typed.to_field_set(obj, T)
    n = N({"name": "n"})
    p80 = N({"port": 80, "protocol": "TCP"})
    assert got == paths(
        ("atomic",), ("set", fp.value("a")), ("set", fp.value("b")),
        ("items", n), ("items", n, "name"), ("items", n, "value"), ("items", n, "tags", fp.value("t")),
        ("ports", p80), ("ports", p80, "port"),
        ("labels", "app"), ("selector",), ("nested", "inner", "a"),
        # Deduced: undeclared map entries are members, lists atomic, null a leaf.
        ("free", "x"), ("free", "y"), ("free", "y", "z"),
    )


def test_empty_map_and_null_are_leaves_but_empty_granular_list_is_not() -> None:
    got = typed.to_field_set({"nested": {}, "labels": None, "set": [], "atomic": []}, T)
    assert got == paths(("nested",), ("labels",), ("atomic",))


def test_keyed_item_without_key_or_default_is_an_error() -> None:
    with pytest.raises(typed.SchemaViolation) as e:
        typed.to_field_set({"items": [{"value": 1}]}, T)
    assert str(e.value) == ('.items: associative list with keys has an element that omits key field "name" '
                            "(and doesn't have default value)")


@pytest.mark.parametrize(("obj", "message"), [
    ({"items": [{"name": "a"}, {"name": "a"}]}, '.items: duplicate entries for key [name="a"]'),
    ({"set": ["a", "a"]}, '.set: duplicate entries for key [="a"]'),
    ({"set": [{"a": 1}]}, ".set: associative list without keys has an element that's a map type"),
    ({"items": [None]}, ".items: associative list with keys may not have a null element"),
    ({"items": ["x"]}, ".items: associative list with keys may not have non-map elements"),
])
def test_list_semantics_violations(obj: dict, message: str) -> None:
    with pytest.raises(typed.SchemaViolation) as e:
        typed.to_field_set(obj, T)
    assert str(e.value) == message


def test_duplicates_allowed_when_asked() -> None:
    got = typed.to_field_set({"set": ["a", "a"]}, T, allow_duplicates=True)
    assert got == paths(("set", fp.value("a")))


def test_compare() -> None:
    old = {"labels": {"a": "1", "b": "2"}, "items": [{"name": "x", "value": 1}], "atomic": [1]}
    new = {"labels": {"a": "1", "b": "3", "c": "4"}, "items": [{"name": "y", "value": 1}], "atomic": [1, 2]}
    c = typed.compare(old, new, T)
    x, y = N({"name": "x"}), N({"name": "y"})
    assert c.modified == paths(("labels", "b"), ("atomic",))
    assert c.added == paths(("labels", "c"), ("items", y), ("items", y, "name"), ("items", y, "value"))
    assert c.removed == paths(("items", x), ("items", x, "name"), ("items", x, "value"))
    assert typed.compare(new, new, T).is_same()


def test_compare_numbers_by_value_and_null_vs_empty() -> None:
    assert typed.compare({"labels": {"a": 1}}, {"labels": {"a": 1.0}}, T).is_same()
    assert typed.compare({"nested": {}}, {"nested": None}, T).modified == paths(("nested",))
    assert typed.compare({"labels": {"a": 1}}, {"labels": {"a": True}}, T).modified == paths(("labels", "a"))


def test_merge_shapes() -> None:
    live = {"atomic": [1, 2], "set": ["a", "b"], "labels": {"x": "1"}, "selector": {"a": "1", "b": "2"},
            "items": [{"name": "n", "value": 1, "tags": ["t1"]}, {"name": "m", "value": 2}],
            "nested": {"inner": {"a": 1, "b": 2}}}
    config = {"atomic": [3], "set": ["c"], "labels": {"y": "2"}, "selector": {"c": "3"},
              "items": [{"name": "n", "tags": ["t2"]}], "nested": {"inner": {"b": 5}}}
    assert typed.merge(live, config, T) == {
        # Live-only items after the last shared one (here: all of them) follow the config's items.
        "atomic": [3], "set": ["c", "a", "b"], "labels": {"x": "1", "y": "2"}, "selector": {"c": "3"},
        "items": [{"name": "n", "value": 1, "tags": ["t2", "t1"]}, {"name": "m", "value": 2}],
        "nested": {"inner": {"a": 1, "b": 5}},
    }


@pytest.mark.parametrize(("live", "config", "want"), [
    # structured-merge-diff set_test.go orders
    (["a", "b", "c", "d"], ["a", "aprime", "c", "cprime"], ["a", "aprime", "b", "c", "cprime", "d"]),
    (["a", "b", "c", "d"], ["a", "b", "c"], ["a", "b", "c", "d"]),
    (["a", "d", "c", "b"], ["a", "b", "c", "d"], ["a", "b", "c", "d"]),
    ([], ["x"], ["x"]),
    (["x"], [], ["x"]),
])
def test_set_merge_order(live: list, config: list, want: list) -> None:
    assert typed.merge({"set": live}, {"set": config}, T)["set"] == want


def test_merge_does_not_mutate_inputs() -> None:
    live = {"labels": {"a": "1"}}
    config = {"labels": {"b": "2"}}
    typed.merge(live, config, T)
    assert live == {"labels": {"a": "1"}} and config == {"labels": {"b": "2"}}


def test_remove_items() -> None:
    obj = {"labels": {"a": "1", "b": "2"}, "items": [{"name": "n", "value": 1}, {"name": "m"}],
           "nested": {"inner": {"a": 1}}, "set": ["x", "y"]}
    n = N({"name": "n"})
    out = typed.remove_items(obj, paths(("labels", "a"), ("items", n), ("nested", "inner", "a"),
                                        ("set", fp.value("y"))), T)
    # `nested` was emptied by the removal and goes; containers are never left as null.
    assert out == {"labels": {"b": "2"}, "items": [{"name": "m"}], "set": ["x"]}
    assert obj["labels"] == {"a": "1", "b": "2"}


def test_remove_items_keeps_originally_empty_containers() -> None:
    assert typed.remove_items({"labels": {}, "x": 1}, paths(("x",)), T) == {"labels": {}}


def test_builtin_deployment_schema() -> None:
    t = sch.for_kind("apps", "v1", "Deployment")
    tpl = t.field("spec").field("template").field("spec")
    containers = tpl.field("containers")
    assert (containers.kind, containers.list_type, containers.keys) == ("list", "map", ("name",))
    ports = containers.elem().field("ports")
    assert ports.keys == ("containerPort", "protocol") and ports.key_defaults == {"protocol": "TCP"}
    assert containers.elem().field("command").list_type == "atomic"
    assert tpl.field("tolerations").list_type == "atomic"
    assert t.field("spec").field("selector").atomic
    assert t.field("metadata").field("finalizers").list_type == "set"
    assert t.field("metadata").field("labels").kind == "map"
    assert not t.field("metadata").declared("app") and t.field("metadata").declared("labels")
    assert sch.for_kind("example.com", "v1", "Nope").kind == "deduced"


def test_service_ports_keyed_by_port_and_protocol() -> None:
    t = sch.for_kind("", "v1", "Service")
    svc = {"spec": {"ports": [{"port": 80}, {"port": 80, "protocol": "UDP"}], "selector": {"a": "b"}}}
    got = typed.to_field_set(svc, t)
    assert got.has(make_path("spec", "ports", N({"port": 80, "protocol": "UDP"})))
    assert got.has(make_path("spec", "ports", N({"port": 80, "protocol": "TCP"})))
    assert got.has(make_path("spec", "selector"))  # +mapType=atomic


def test_openapi_schema() -> None:
    t = sch.from_openapi({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"],
                      "items": {"type": "object", "properties": {
                          "id": {"type": "string"}, "proto": {"type": "string", "default": "TCP"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "args": {"type": "array", "items": {"type": "string"}},
            "sel": {"type": "object", "x-kubernetes-map-type": "atomic",
                    "additionalProperties": {"type": "string"}},
            "port": {"x-kubernetes-int-or-string": True},
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        }}}})
    spec = t.field("spec")
    assert spec.field("items").keys == ("id",)
    assert spec.field("tags").list_type == "set"
    assert spec.field("args").list_type == "atomic"
    assert spec.field("sel").atomic
    assert spec.field("port").kind == "scalar"
    assert t.field("metadata").field("finalizers").list_type == "set"
    obj = {"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
           "spec": {"items": [{"id": "a", "proto": "UDP"}], "raw": {"deep": {"x": 1}}}}
    got = typed.to_field_set(obj, t)
    assert got.has(make_path("spec", "items", N({"id": "a"}), "proto"))
    assert got.has(make_path("spec", "raw", "deep", "x"))


def test_override_tables_name_real_types_and_fields() -> None:
    from fleet.api import schema as fleet_schema

    types = fleet_schema.types()
    for type_name, fname in list(sch._LIST_OVERRIDES) + list(sch._ATOMIC_MAPS):
        assert fname in types[type_name]["fields"], (type_name, fname)
    for type_name in sch._ATOMIC_TYPES:
        assert type_name in types, type_name


def test_every_builtin_root_builds() -> None:
    from fleet.api import schema as fleet_schema

    for r in fleet_schema._data()["roots"]:
        t = sch.for_kind(r["group"], r["version"], r["kind"])
        obj = {"apiVersion": "x", "kind": r["kind"], "metadata": {"name": "n", "labels": {"a": "b"}}}
        assert typed.to_field_set(obj, t).has(make_path("metadata", "labels", "a"))
