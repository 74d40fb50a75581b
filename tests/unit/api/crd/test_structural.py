"""structural_violations: kube's structural-schema and CRD schema rules, exact words."""

from __future__ import annotations

from fleet.api.crd import schema_violations, structural_violations

P = "spec.validation.openAPIV3Schema"


def msgs(schema, path=P):
    return [f"{c['field']}: {c['message']}" for c in structural_violations(schema, path)]


def test_crontab_is_structural(crontab):
    assert structural_violations(crontab, P) == []
    assert schema_violations(crontab, P) == []


def test_missing_type_of_a_field():
    s = {"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}}}}
    assert msgs(s) == [f"{P}.properties[spec].type: Required value: must not be empty for specified object fields"]


def test_missing_type_at_root_and_items():
    s = {"properties": {"l": {"type": "array", "items": {}}}}
    assert msgs(s) == [
        f"{P}.properties[l].items.type: Required value: must not be empty for specified array items",
        f"{P}.type: Required value: must not be empty at the root",
    ]


def test_array_needs_items_and_root_object():
    assert msgs({"type": "object", "properties": {"l": {"type": "array"}}}) == [
        f"{P}.properties[l].items: Required value: must be specified"]
    assert msgs({"type": "string"}) == [f'{P}.type: Invalid value: "string": must be object at the root']


def test_junctor_forbidden_constructs():
    s = {"type": "object", "properties": {"spec": {"type": "object", "anyOf": [
        {"type": "object", "description": "d", "default": {}, "nullable": True,
         "x-kubernetes-preserve-unknown-fields": True, "additionalProperties": {"type": "string"}},
    ]}}}
    got = msgs(s)
    base = f"{P}.properties[spec].anyOf[0]"
    for want in (f"{base}.type: Forbidden: must be empty to be structural",
                 f"{base}.description: Forbidden: must be empty to be structural",
                 f"{base}.default: Forbidden: must be undefined to be structural",
                 f"{base}.nullable: Forbidden: must be false to be structural",
                 f"{base}.additionalProperties: Forbidden: must be undefined to be structural",
                 f"{base}.x-kubernetes-preserve-unknown-fields: Forbidden: must be false to be structural"):
        assert want in got
    assert got == sorted(got)  # kube sorts the structural errors


def test_junctor_properties_must_be_specified_outside():
    s = {"type": "object", "anyOf": [{"properties": {"x": {"minLength": 1}}}]}
    assert msgs(s) == [f"{P}.properties[x]: Required value: because it is defined in {P}.anyOf[0].properties[x]"]


def test_int_or_string_patterns():
    ok = {"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": True, "anyOf": [
        {"type": "integer"}, {"type": "string"}]}}}
    assert msgs(ok) == []
    ok2 = {"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": True, "allOf": [
        {"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"maxLength": 3}]}}}
    assert msgs(ok2) == []
    bad = {"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": True,
                                                     "x-kubernetes-preserve-unknown-fields": True}}}
    assert msgs(bad) == [f"{P}.properties[port].x-kubernetes-preserve-unknown-fields: Invalid value: true: "
                         "must be false if x-kubernetes-int-or-string is true"]


def test_embedded_resource_rules():
    s = {"type": "object", "properties": {"t": {"x-kubernetes-embedded-resource": True}}}
    assert msgs(s) == [
        f"{P}.properties[t].properties: Required value: must not be empty if x-kubernetes-embedded-resource is "
        "true without x-kubernetes-preserve-unknown-fields",
        f"{P}.properties[t].type: Required value: must be object if x-kubernetes-embedded-resource is true",
    ]


def test_additional_properties_rules():
    s = {"type": "object", "additionalProperties": {"type": "string"}}
    assert f"{P}.additionalProperties: Forbidden: must not be used at the root" in msgs(s)
    s = {"type": "object", "properties": {"m": {"type": "object", "properties": {"a": {"type": "string"}},
                                                "additionalProperties": {"type": "string"}}}}
    assert msgs(s) == [f"{P}.properties[m].additionalProperties: Forbidden: additionalProperties and properties "
                       "are mutual exclusive"]


def test_metadata_at_root_only_name_and_generate_name():
    ok = {"type": "object", "properties": {"metadata": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}}}}}
    assert msgs(ok) == []
    bad = {"type": "object", "properties": {"metadata": {"type": "object", "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}}}
    assert msgs(bad) == [f"{P}.properties[metadata]: Forbidden: must not specify anything other than name and "
                         "generateName, but metadata is implicitly specified"]
    dflt = {"type": "object", "properties": {"metadata": {"type": "object", "default": {"name": "x"}}}}
    assert msgs(dflt) == [f"{P}.properties[metadata].default: Forbidden: must not be set in top-level metadata"]


def test_list_types():
    def arr(**kw):
        return {"type": "object", "properties": {"l": {"type": "array", **kw}}}
    assert msgs(arr(items={"type": "string"}, **{"x-kubernetes-list-type": "bag"})) == [
        f'{P}.properties[l].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", "set", "map"']
    assert msgs(arr(items={"type": "object", "properties": {"name": {"type": "string"}}},
                    **{"x-kubernetes-list-type": "map"})) == [
        f"{P}.properties[l].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"]
    assert msgs(arr(items={"type": "object", "properties": {"name": {"type": "string"}}},
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})) == [
        f"{P}.properties[l].items.properties[name].default: Required value: this property is in "
        "x-kubernetes-list-map-keys, so it must have a default or be a required property"]
    ok = arr(items={"type": "object", "required": ["name"], "properties": {"name": {"type": "string"},
                                                                          "port": {"type": "integer", "default": 80}}},
             **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name", "port"]})
    assert msgs(ok) == []
    assert msgs(arr(items={"type": "object", "properties": {"a": {"type": "object"}}, "required": ["a"]},
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["a", "b"]})) == [
        f'{P}.properties[l].items.properties[a].type: Invalid value: "object": must be a scalar type if parent '
        "array's x-kubernetes-list-type is map",
        f'{P}.properties[l].x-kubernetes-list-map-keys: Invalid value: ["a","b"]: entries must all be names of '
        "item properties"]
    assert msgs(arr(items={"type": "string"}, **{"x-kubernetes-list-map-keys": ["a"]})) == [
        f"{P}.properties[l].x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty"]
    assert msgs({"type": "object", "properties": {"s": {"type": "string", "x-kubernetes-list-type": "set"}}}) == [
        f'{P}.properties[s].type: Invalid value: "string": must be array if x-kubernetes-list-type is specified']


def test_map_type_and_misc_keywords():
    s = {"type": "object", "properties": {
        "m": {"type": "string", "x-kubernetes-map-type": "granular"},
        "u": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "r": {"type": "string", "$ref": "#/x"},
        "p": {"type": "string", "pattern": "("},
    }}
    got = msgs(s)
    assert f'{P}.properties[m].type: Invalid value: "string": must be object if x-kubernetes-map-type is specified' in got
    assert (f"{P}.properties[u].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime "
            "complexity becomes quadratic") in got
    assert f"{P}.properties[r].$ref: Forbidden: $ref is not supported" in got
    assert any(m.startswith(f'{P}.properties[p].pattern: Invalid value: "(": must be a valid regular expression, '
                            "but isn't: ") for m in got)


def test_defaults_must_validate_and_be_pruned():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "replicas": {"type": "integer", "default": "x"},
        "o": {"type": "object", "properties": {"a": {"type": "string"}}, "default": {"a": "1", "b": 2}},
    }}}}
    got = msgs(s)
    d = f"{P}.properties[spec].properties"
    assert f'{d}[o].default: Invalid value: {{"a":"1","b":2}}: must not have unknown fields' in got
    # kube-openapi validates a default as its own body: no name before "in body"
    assert f'{d}[replicas].default: Invalid value: "string": in body must be of type integer: "string"' in got


def test_defaults_are_checked_by_formats_and_cel_rules():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "mail": {"type": "string", "format": "email", "default": "abc"},
        "n": {"type": "integer", "default": 0, "x-kubernetes-validations": [{"rule": "self >= 1"}]},
        "worker": {"type": "object", "default": {}, "properties": {"min": {"type": "integer"},
                                                                    "max": {"type": "integer"}},
                   "x-kubernetes-validations": [{"rule": "self.min <= self.max"}]},
    }}}}
    d = f"{P}.properties[spec].properties"
    assert msgs(s) == [
        f'{d}[mail].default: Invalid value: "abc": in body must be of type email: "abc"',
        f'{d}[n].default: Invalid value: "integer": failed rule: self >= 1',
        f'{d}[worker].default: Invalid value: "object": no such key: min evaluating rule: self.min <= self.max',
    ]


def test_root_nullable_and_v1_path():
    got = msgs({"type": "object", "nullable": True}, "spec.versions[0].schema.openAPIV3Schema")
    assert got == ["spec.versions[0].schema.openAPIV3Schema.nullable: Forbidden: nullable cannot be true at the root"]
