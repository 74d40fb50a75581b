"""Schemas and objects are untrusted JSON: no input makes the library raise (a raise would be a 500)."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleet.api import crd

KEYWORDS = ["type", "properties", "items", "additionalProperties", "required", "enum", "default", "nullable",
            "format", "pattern", "minimum", "maximum", "exclusiveMinimum", "multipleOf", "minLength", "maxLength",
            "minItems", "maxItems", "maxProperties", "uniqueItems", "anyOf", "allOf", "oneOf", "not",
            "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
            "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
            "x-kubernetes-validations"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False),
                    st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "map", "set",
                                     "atomic", "date-time", "uuid", "(", "^a", "name", "self > 0", "oldSelf == self",
                                     "self.a.all(x, x > 0)", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(KEYWORDS + ["a", "name", "spec", "metadata", "rule", "message"]), inner,
                    max_size=4)), max_leaves=20)
schemas = st.dictionaries(st.sampled_from(KEYWORDS), values, max_size=6)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schemas, values, values)
@example({"type": "object", "properties": {"l": {
    "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [[1], {}],
    "items": {"type": "object", "required": [[1]], "properties": {"a": {}}}}}}, {"l": [{"a": 1}, 5]}, None)
@example({"type": ["object"], "properties": {"a": {"type": "integer", "default": {"x": [1]}}}}, {}, None)
@example({"type": "object", "properties": {"a": {"type": "object", "required": [["b"]], "enum": [{"b": [1]}]}}},
         {"a": {"b": [1]}}, {"a": {}})
def test_nothing_raises(schema, obj, old):
    crd.schema_violations(schema, "p")
    crd.structural_violations(schema, "p")
    crd.rule_violations(schema, "p")
    x = copy.deepcopy(obj)
    crd.prune(x, schema)
    crd.apply_defaults(x, schema)
    crd.validate(x, schema)
    if isinstance(x, dict):
        crd.validate_custom_resource(x, schema, old if isinstance(old, dict) else None)
