"""Algebra of pruning and defaulting (Hypothesis): pruning is idempotent and leaves only what the
schema knows; defaulting is idempotent and never changes a value the client set."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api.crd import apply_defaults, prune, validate

SCHEMA = {"type": "object", "properties": {
    "spec": {"type": "object", "default": {}, "properties": {
        "a": {"type": "string", "default": "x"},
        "n": {"type": "integer", "default": 1},
        "l": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "default": "d"}}}},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }},
}}

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "k", "n", "x", "zz"]), inner, max_size=3)),
    max_leaves=12)
objects = st.fixed_dictionaries({}, optional={
    "spec": st.fixed_dictionaries({}, optional={
        "a": st.text(max_size=3), "n": st.integers(0, 9), "bogus": json_values,
        "l": st.lists(st.fixed_dictionaries({}, optional={"k": st.text(max_size=2), "junk": json_values}), max_size=3),
        "m": st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=3),
        "free": st.dictionaries(st.text(max_size=2), json_values, max_size=3)}),
    "extra": json_values})


@settings(max_examples=150, deadline=None)
@given(objects)
def test_prune_is_idempotent_and_reports_what_it_removed(obj):
    once = copy.deepcopy(obj)
    pruned = prune(once, SCHEMA)
    assert prune(copy.deepcopy(once), SCHEMA) == []
    assert ("extra" in obj) == ("extra" in pruned)
    assert ("bogus" in obj.get("spec", {})) == ("spec.bogus" in pruned)
    if "free" in obj.get("spec", {}):
        assert once["spec"]["free"] == obj["spec"]["free"]


@settings(max_examples=150, deadline=None)
@given(objects)
def test_defaults_are_idempotent_keep_set_values_and_validate(obj):
    prune(obj, SCHEMA)
    before = copy.deepcopy(obj)
    once = apply_defaults(copy.deepcopy(obj), SCHEMA)
    assert apply_defaults(copy.deepcopy(once), SCHEMA) == once
    for k, v in before.get("spec", {}).items():
        if k in ("a", "n", "m", "free"):
            assert once["spec"][k] == v
    assert once["spec"]["a"] is not None and "n" in once["spec"]
    assert validate(once, SCHEMA) == []


nullish = st.one_of(st.none(), json_values)
objects_with_nulls = st.fixed_dictionaries({}, optional={
    "spec": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "a": st.one_of(st.none(), st.text(max_size=3)), "n": st.one_of(st.none(), st.integers(0, 9)),
        "l": st.lists(st.one_of(st.none(), st.fixed_dictionaries({}, optional={"k": st.one_of(st.none(), st.text(max_size=2))})),
                      max_size=3),
        "m": st.dictionaries(st.text(max_size=2), st.one_of(st.none(), st.integers(0, 3)), max_size=3),
        "free": st.dictionaries(st.text(max_size=2), nullish, max_size=3)}))})


@settings(max_examples=300, deadline=None)
@given(st.one_of(objects, objects_with_nulls))
def test_needs_defaults_says_exactly_when_defaulting_changes_the_object(obj):
    # The read path copies an object only when needs_defaults says so: it must never miss a change.
    from fleet.api.crd.defaults import needs_defaults

    before = copy.deepcopy(obj)
    assert needs_defaults(obj, SCHEMA) == (apply_defaults(copy.deepcopy(obj), SCHEMA) != obj)
    assert obj == before  # read-only
