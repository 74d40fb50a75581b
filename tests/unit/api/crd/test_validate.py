"""validate(): kube-openapi's value validation in kube-apiserver's field-error words."""

from __future__ import annotations

import pytest

from fleet.api.crd import validate, validate_custom_resource


def msgs(obj, schema, path=""):
    return [f"{c['field']}: {c['message']}" for c in validate(obj, schema, path)]


def test_crontab_valid_and_type_errors(crontab):
    ok = {"apiVersion": "stable.example.com/v1", "kind": "CronTab", "metadata": {"name": "x"},
          "spec": {"cronSpec": "* * * * */5", "image": "img", "replicas": 3}}
    assert msgs(ok, crontab) == []
    bad = {"spec": {"cronSpec": "* * * *", "image": "img", "replicas": "string"}}
    assert msgs(bad, crontab) == [
        'spec.cronSpec: Invalid value: "* * * *": spec.cronSpec in body should match '
        "'^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$'",
        'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"',
    ]
    assert msgs({"spec": {"replicas": 15}}, crontab) == [
        "spec.replicas: Invalid value: 15: spec.replicas in body should be less than or equal to 10"]
    assert msgs({"spec": {"replicas": 0}}, crontab) == [
        "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"]


def test_required_enum_lengths_items():
    s = {"type": "object", "required": ["spec"], "properties": {"spec": {"type": "object", "required": ["mode"],
         "properties": {
             "mode": {"type": "string", "enum": ["Fast", "Slow"]},
             "name": {"type": "string", "maxLength": 3, "minLength": 2},
             "n": {"type": "integer", "enum": [1, 2]},
             "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "minItems": 1},
             "m": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
         }}}}
    assert msgs({}, s) == ["spec: Required value"]
    got = msgs({"spec": {"mode": "Medium", "name": "abcd", "n": 3, "tags": ["a", 1, "c"]}}, s)
    assert got == [
        'spec.mode: Unsupported value: "Medium": supported values: "Fast", "Slow"',
        "spec.n: Unsupported value: 3: supported values: \"1\", \"2\"",
        "spec.name: Too long: may not be more than 3 bytes",
        'spec.tags[1]: Invalid value: "integer": spec.tags[1] in body must be of type string: "integer"',
        "spec.tags: Too many: 3: must have at most 2 items",
    ]
    assert msgs({"spec": {"mode": "Fast", "name": "a", "tags": []}}, s) == [
        'spec.name: Invalid value: "a": spec.name in body should be at least 2 chars long',
        "spec.tags: Invalid value: 0: spec.tags in body should have at least 1 items",
    ]
    assert msgs({"spec": {"mode": "Fast", "m": {"a": 1, "b": "x"}}}, s) == [
        "spec.m: Too many: 2: must have at most 1 items"]
    assert msgs({"spec": {"mode": "Fast", "m": {"b": "x"}}}, s) == [
        'spec.m.b: Invalid value: "string": spec.m.b in body must be of type integer: "string"']


def test_type_errors_are_type_invalid_causes(crontab):
    (c,) = validate({"spec": {"replicas": "x"}}, crontab)
    assert c == {"reason": "FieldValueTypeInvalid", "field": "spec.replicas",
                 "message": 'Invalid value: "string": spec.replicas in body must be of type integer: "string"'}


def test_numbers_and_nullable():
    s = {"type": "object", "properties": {
        "f": {"type": "number", "exclusiveMinimum": True, "minimum": 0.5, "multipleOf": 0.5},
        "i": {"type": "integer"},
        "n": {"type": "string", "nullable": True},
        "s": {"type": "string"},
    }}
    assert msgs({"f": 1.0, "i": 2.0, "n": None}, s) == []  # 2.0 is an integer to kube-openapi too
    assert msgs({"f": 0.5}, s) == ["f: Invalid value: 0.5: f in body should be greater than 0.5"]
    assert msgs({"f": 0.75}, s) == ["f: Invalid value: 0.75: f in body should be a multiple of 0.5"]
    assert msgs({"i": 1.5}, s) == ['i: Invalid value: "number": i in body must be of type integer: "number"']
    assert msgs({"s": None}, s) == ['s: Invalid value: "null": s in body must be of type string: "null"']


@pytest.mark.parametrize("fmt,good,bad", [
    ("date-time", "2024-01-02T03:04:05Z", "2024-13-02T03:04:05Z"),
    ("date", "2024-02-29", "2023-02-29"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123"),
    ("byte", "aGVsbG8=", "not base64!"),
    ("ipv4", "10.0.0.1", "10.0.0.300"),
    ("ipv6", "::1", "10.0.0.1"),
    ("cidr", "10.0.0.0/8", "10.0.0.0"),
    ("hostname", "a.example.com", "-bad-"),
])
def test_formats(fmt, good, bad):
    s = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}}
    assert msgs({"v": good}, s) == []
    assert msgs({"v": bad}, s) == [f'v: Invalid value: "{bad}": v in body must be of type {fmt}: "{bad}"']


def test_unknown_format_and_int_or_string():
    s = {"type": "object", "properties": {"v": {"type": "string", "format": "k8s-whatever"},
                                          "p": {"x-kubernetes-int-or-string": True}}}
    assert msgs({"v": "x", "p": 80}, s) == []
    assert msgs({"p": "http"}, s) == []
    assert msgs({"p": True}, s) == [
        'p: Invalid value: "boolean": p in body must be of type integer,string: "boolean"']


def test_junctors():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        "not": {"required": ["a", "b"]}}}}
    assert msgs({"spec": {"a": "x"}}, s) == []
    got = msgs({"spec": {}}, s)
    assert got[0] == '<nil>: Invalid value: "": "spec" must validate one and only one schema (oneOf). Found none valid'
    assert "spec.a: Required value" in got
    assert msgs({"spec": {"a": "x", "b": "y"}}, s) == [
        '<nil>: Invalid value: "": "spec" must validate one and only one schema (oneOf). Found 2 valid alternatives',
        '<nil>: Invalid value: "": "spec" must not validate the schema (not)',
    ]
    anyof = {"type": "object", "properties": {"v": {"type": "string", "anyOf": [{"maxLength": 1}, {"pattern": "^x"}]}}}
    assert msgs({"v": "xyz"}, anyof) == []
    assert msgs({"v": "abc"}, anyof)[0] == '<nil>: Invalid value: "": "v" must validate at least one schema (anyOf)'


def test_embedded_resources_typemeta_and_metadata():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"template": {
        "type": "object", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}}}}}
    ok = {"spec": {"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}}}
    assert validate_custom_resource(ok, s) == []
    bad = {"spec": {"template": {"kind": "a b", "metadata": {"name": "a/b"}}}}
    got = [f"{c['field']}: {c['message']}" for c in validate_custom_resource(bad, s)]
    assert got[0] == "spec.template.apiVersion: Required value: must not be empty"
    assert got[1].startswith('spec.template.kind: Invalid value: "a b": may have mixed case, but should otherwise '
                             "match: a DNS-1035 label must consist of")
    assert got[2] == "spec.template.metadata.name: Invalid value: \"a/b\": may not contain '/'"


def test_sets_and_map_lists_refuse_duplicates():
    # Recorded kube-apiserver answers: `env[28]: Duplicate value: map[string]interface {}{"name":"CPU_REQUEST"}`.
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "env": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"},
                                                                               "value": {"type": "string"}}}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "protocol"],
                  "items": {"type": "object", "required": ["port"], "properties": {
                      "port": {"type": "integer"}, "protocol": {"type": "string", "default": "TCP"}}}},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
    }}}}
    obj = {"spec": {"env": [{"name": "A", "value": "1"}, {"name": "CPU_REQUEST"}, {"name": "CPU_REQUEST", "value": "2"}],
                    "ports": [{"port": 80, "protocol": "TCP"}, {"port": 80, "protocol": "UDP"},
                              {"port": 80, "protocol": "TCP"}],
                    "tags": ["a", "b", "a"]}}
    got = [f"{c['field']}: {c['message']}" for c in validate_custom_resource(obj, s)]
    assert got == [
        'spec.env[2]: Duplicate value: map[string]interface {}{"name":"CPU_REQUEST"}',
        'spec.ports[2]: Duplicate value: map[string]interface {}{"port":80, "protocol":"TCP"}',
        'spec.tags[2]: Duplicate value: "a"',
    ]


def test_status_subresource_validator_is_rooted_at_status():
    # kube validates /status writes with a validator built from properties.status and the path
    # `status` (recorded: `status: Invalid value: "null": in body must be of type object`).
    status = {"type": "object", "properties": {"replicas": {"type": "integer"}}}
    assert msgs(None, status, "status") == ['status: Invalid value: "null": in body must be of type object: "null"']
    assert msgs({"replicas": "x"}, status, "status") == [
        'status.replicas: Invalid value: "string": replicas in body must be of type integer: "string"']
