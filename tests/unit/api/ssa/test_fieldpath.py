"""Field paths, FieldSet algebra and the FieldsV1 encoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api.ssa import fieldpath as fp
from fleet.api.ssa.fieldpath import FieldPathError, FieldSet, make_path, path_string

KUBE_EXAMPLE = {
    "f:metadata": {"f:labels": {"f:app": {}}},
    "f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}, "f:image": {}}}},
}


def test_fields_v1_example_from_kube_round_trips() -> None:
    s = FieldSet.from_fields_v1(KUBE_EXAMPLE)
    c = fp.key({"name": "c"})
    assert set(s) == {
        make_path("metadata", "labels", "app"),
        make_path("spec", "containers", c),
        make_path("spec", "containers", c, "image"),
    }
    assert s.to_fields_v1() == KUBE_EXAMPLE
    # The serialized key is exactly kube's: compact JSON with sorted key names.
    assert json.dumps(s.to_fields_v1(), separators=(",", ":")) == \
        '{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\\"name\\":\\"c\\"}":{".":{},"f:image":{}}}}}'


def test_from_fields_v1_accepts_json_text_and_none() -> None:
    assert FieldSet.from_fields_v1(json.dumps(KUBE_EXAMPLE)) == FieldSet.from_fields_v1(KUBE_EXAMPLE)
    assert FieldSet.from_fields_v1(None).empty()


def test_multi_key_elements_sort_their_keys() -> None:
    pe = fp.key({"protocol": "TCP", "containerPort": 80})
    assert fp.serialize_element(pe) == 'k:{"containerPort":80,"protocol":"TCP"}'
    assert fp.parse_element('k:{"protocol":"TCP","containerPort":80}') == pe


@pytest.mark.parametrize("text", ["x", "f", "fx", "q:abc", "k:[1]", "k:{bad", "v:{", "i:one"])
def test_bad_elements_are_errors(text: str) -> None:
    with pytest.raises(FieldPathError):
        fp.parse_element(text)


@pytest.mark.parametrize("doc", [[], "[]", {"f:a": 1}, {"f:a": {"zz": {}}}, "{nope"])
def test_bad_documents_are_errors(doc: object) -> None:
    with pytest.raises(FieldPathError):
        FieldSet.from_fields_v1(doc)


@pytest.mark.parametrize(("path", "text"), [
    (make_path("spec", "replicas"), ".spec.replicas"),
    (make_path("spec", "containers", fp.key({"name": "c"}), "image"), '.spec.containers[name="c"].image'),
    (make_path("spec", "ports", fp.key({"port": 80, "protocol": "TCP"})), '.spec.ports[port=80,protocol="TCP"]'),
    (make_path("metadata", "finalizers", fp.value("x")), '.metadata.finalizers[="x"]'),
    (make_path("spec", "args", 2), ".spec.args[2]"),
    (make_path("a", fp.value(True)), ".a[=true]"),
])
def test_path_string_matches_kube(path: fp.Path, text: str) -> None:
    assert path_string(path) == text


def test_set_algebra() -> None:
    a = FieldSet([make_path("a"), make_path("b", "c"), make_path("b", "d")])
    b = FieldSet([make_path("b", "c"), make_path("e")])
    assert set(a.union(b)) == {make_path("a"), make_path("b", "c"), make_path("b", "d"), make_path("e")}
    assert set(a.intersection(b)) == {make_path("b", "c")}
    assert set(a.difference(b)) == {make_path("a"), make_path("b", "d")}
    assert a.difference(a).empty() and not a.empty()
    assert a.has(make_path("b", "c")) and not a.has(make_path("b"))
    assert set(a.with_prefix(fp.field("b"))) == {make_path("c"), make_path("d")}
    assert len(a) == 3


def test_leaves_drop_members_with_children() -> None:
    item = fp.key({"name": "c"})
    s = FieldSet([make_path("l", item), make_path("l", item, "x"), make_path("y")])
    assert set(s.leaves()) == {make_path("l", item, "x"), make_path("y")}


def test_prefixed_and_without_prefixes() -> None:
    s = FieldSet([make_path("x"), make_path("y", "z")])
    moved = s.prefixed(make_path("status"))
    assert set(moved) == {make_path("status", "x"), make_path("status", "y", "z")}
    assert set(moved.without_prefixes([make_path("status", "y")])) == {make_path("status", "x")}


def test_iteration_order_is_fields_then_keys_then_values_then_indexes() -> None:
    s = FieldSet([make_path(3), make_path(fp.value("v")), make_path(fp.key({"k": 1})), make_path("f")])
    assert [p[0][0] for p in s] == ["f", "k", "v", "i"]


# -- properties ------------------------------------------------------------------------------

_names = st.text(alphabet="abcxyz.:{}\"\\<>&é", min_size=1, max_size=4)
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3))
_elements = st.one_of(
    _names.map(fp.field),
    st.dictionaries(_names, _scalars, min_size=1, max_size=2).map(fp.key),
    _scalars.map(fp.value),
    st.integers(0, 9).map(fp.index),
)
_paths = st.lists(_elements, min_size=1, max_size=4).map(tuple)
_sets = st.lists(_paths, max_size=12).map(FieldSet)


@settings(max_examples=150, deadline=None)
@given(_sets)
def test_fields_v1_round_trip(s: FieldSet) -> None:
    doc = s.to_fields_v1()
    again = FieldSet.from_fields_v1(json.loads(json.dumps(doc)))
    assert again == s
    assert again.to_fields_v1() == doc


@settings(max_examples=100, deadline=None)
@given(_sets, _sets)
def test_algebra_laws(a: FieldSet, b: FieldSet) -> None:
    assert set(a.union(b)) == set(a) | set(b)
    assert set(a.intersection(b)) == set(a) & set(b)
    assert set(a.difference(b)) == set(a) - set(b)
