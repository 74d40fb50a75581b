"""x-kubernetes-validations: compilation at CRD creation, evaluation on writes, cost guard."""

from __future__ import annotations

from fleet.api.crd import (
    rule_violations,
    schema_violations,
    validate_custom_resource,
    validate_rules,
)
from fleet.api.crd.rules import STATIC_RULE_COST_LIMIT, cost_error

P = "spec.validation.openAPIV3Schema"

# The Kubernetes docs' example ("Validation rules").
REPLICAS = {"type": "object", "properties": {"spec": {
    "type": "object",
    "x-kubernetes-validations": [
        {"rule": "self.minReplicas <= self.replicas", "message": "replicas should be greater than or equal to minReplicas."},
        {"rule": "self.replicas <= self.maxReplicas", "message": "replicas should be smaller than or equal to maxReplicas."},
    ],
    "properties": {"minReplicas": {"type": "integer"}, "replicas": {"type": "integer"},
                   "maxReplicas": {"type": "integer"}},
    "required": ["minReplicas", "replicas", "maxReplicas"],
}}}


def msgs(causes):
    return [f"{c['field']}: {c['message']}" for c in causes]


def test_docs_example_rules():
    assert schema_violations(REPLICAS, P) == []
    ok = {"spec": {"minReplicas": 0, "replicas": 2, "maxReplicas": 3}}
    assert validate_custom_resource(ok, REPLICAS) == []
    bad = {"spec": {"minReplicas": 0, "replicas": 20, "maxReplicas": 10}}
    assert msgs(validate_custom_resource(bad, REPLICAS)) == [
        'spec: Invalid value: "object": replicas should be smaller than or equal to maxReplicas.']


def test_compile_error_words():
    s = {"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-validations": [
        {"rule": "self.a <= "}], "properties": {"a": {"type": "integer"}}}}}
    got = msgs(rule_violations(s, P))
    assert len(got) == 1
    assert got[0].startswith(
        f'{P}.properties[spec].x-kubernetes-validations[0].rule: Invalid value: apiextensions.ValidationRule'
        '{Rule:"self.a <= ", Message:"", MessageExpression:"", Reason:(*apiextensions.FieldValueErrorReason)(nil), '
        'FieldPath:"", OptionalOldSelf:(*bool)(nil)}: compilation failed: ERROR: <input>:1:')


def test_static_rule_field_checks():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}},
         "x-kubernetes-validations": [
             {"rule": " "},
             {"rule": "true", "reason": "Bogus"},
             {"rule": "true", "fieldPath": ".b"},
             {"rule": "self.a == 'x'", "optionalOldSelf": True},
         ]}}}
    got = msgs(schema_violations(s, P))
    base = f"{P}.properties[spec].x-kubernetes-validations"
    assert got == [
        f"{base}[0].rule: Required value: rule is not specified",
        f'{base}[1].reason: Unsupported value: "Bogus": supported values: "FieldValueDuplicate", '
        '"FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"',
        f'{base}[2].fieldPath: Invalid value: ".b": fieldPath must be a valid path',
    ]
    fixed = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}},
             "x-kubernetes-validations": [{"rule": "self.a == 'x'", "optionalOldSelf": True}]}}}
    assert msgs(schema_violations(fixed, P)) == [
        f"{base}[0].optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule"]


def test_transition_rule_immutable_field():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "name": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                                                 "message": "Value is immutable"}]}}}}}
    assert schema_violations(s, P) == []
    new = {"spec": {"name": "b"}}
    assert validate_rules(new, s) == []  # create: transition rules do not run
    assert validate_rules(new, s, {"spec": {"name": "b"}}) == []
    assert msgs(validate_rules(new, s, {"spec": {"name": "a"}})) == [
        'spec.name: Invalid value: "string": Value is immutable']
    assert validate_rules(new, s, {"spec": {}}) == []  # no old value to correlate


def test_transition_rules_in_map_lists_correlate_by_key():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"ports": {
        "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "port": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.port >= oldSelf.port", "message": "port may only grow"}]}}}}}}
    assert schema_violations(s, P) == []
    old = {"spec": {"ports": [{"name": "a", "port": 10}, {"name": "b", "port": 20}]}}
    new = {"spec": {"ports": [{"name": "b", "port": 5}, {"name": "a", "port": 11}, {"name": "c", "port": 1}]}}
    assert msgs(validate_rules(new, s, old)) == ['spec.ports[0]: Invalid value: "object": port may only grow']


def test_old_self_forbidden_where_uncorrelatable():
    s = {"type": "object", "properties": {"l": {"type": "array", "items": {
        "type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}}
    assert msgs(rule_violations(s, P)) == [
        f'{P}.properties[l].items.x-kubernetes-validations[0].rule: Invalid value: "self == oldSelf": oldSelf cannot '
        f"be used on the uncorrelatable portion of the schema within {P}.properties[l]"]
    atomic = {"type": "object", "properties": {"m": {"type": "object", "x-kubernetes-map-type": "atomic",
                                                     "properties": {"a": {"type": "string", "x-kubernetes-validations": [
                                                         {"rule": "self == oldSelf"}]}}}}}
    assert msgs(rule_violations(atomic, P)) == [
        f'{P}.properties[m].properties[a].x-kubernetes-validations[0].rule: Invalid value: "self == oldSelf": oldSelf '
        f"cannot be used on the uncorrelatable portion of the schema within {P}.properties[m]"]
    keyed = {"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map",
                                                    "x-kubernetes-list-map-keys": ["k"], "items": {
        "type": "object", "required": ["k"], "properties": {"k": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}}
    assert rule_violations(keyed, P) == []


def test_message_expression_reason_field_path_and_default_message():
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "a": {"type": "integer"}, "m": {"type": "object", "additionalProperties": {"type": "string"}}},
        "x-kubernetes-validations": [
            {"rule": "self.a > 1", "messageExpression": "'a is ' + string(self.a)"},
            {"rule": "self.a > 2", "reason": "FieldValueForbidden", "fieldPath": ".a", "message": "too small"},
            {"rule": "self.a > 3"},
            {"rule": "!('k' in self.m)", "fieldPath": ".m['k']", "reason": "FieldValueRequired", "message": "no k"},
        ]}}}
    assert schema_violations(s, P) == []
    got = msgs(validate_rules({"spec": {"a": 1, "m": {"k": "v"}}}, s))
    assert got == [
        'spec: Invalid value: "object": a is 1',
        "spec.a: Forbidden: too small",
        'spec: Invalid value: "object": failed rule: self.a > 3',
        "spec.m[k]: Required value: no k",
    ]


def test_runtime_errors_and_root_rules():
    s = {"type": "object", "x-kubernetes-validations": [{"rule": "self.spec.x > 0"}],
         "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
    assert msgs(validate_rules({"spec": {}}, s)) == [
        '<nil>: Invalid value: "object": no such key: x evaluating rule: self.spec.x > 0']
    assert msgs(validate_rules({"spec": {"x": 0}}, s)) == ['<nil>: Invalid value: "object": failed rule: self.spec.x > 0']


def test_type_errors_block_rules():
    bad = {"spec": {"minReplicas": "a", "replicas": 20, "maxReplicas": 10}}
    got = msgs(validate_custom_resource(bad, REPLICAS))
    assert got[-1] == ('<nil>: Invalid value: "null": some validation rules were not checked because the object was '
                       "invalid; correct the existing errors to complete validation")
    assert not any("maxReplicas." in m for m in got)


def test_cost_guard_refuses_unbounded_nested_comprehensions():
    def schema(bound: dict) -> dict:
        return {"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "l": {"type": "array", **bound, "items": {"type": "string"}}},
            "x-kubernetes-validations": [{"rule": "self.l.all(x, self.l.exists_one(y, x == y))",
                                          "message": "entries must be unique"}]}}}
    unbounded = msgs(rule_violations(schema({}), P))
    assert unbounded[0] == (f"{P}.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost "
                            "exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, "
                            "maxProperties, and maxLength where arrays, maps, and strings are declared)")
    assert f"{P}: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds " \
           "budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and " \
           "maxLength where arrays, maps, and strings are declared)" in unbounded
    assert rule_violations(schema({"maxItems": 32}), P) == []


def test_cost_guard_counts_enclosing_lists():
    rule = {"rule": "self.all(x, x.size() > 0)"}
    inner = {"type": "array", "items": {"type": "string"}, "x-kubernetes-validations": [rule]}
    bounded = {"type": "object", "properties": {"o": {"type": "array", "maxItems": 10, "items": {
        "type": "object", "properties": {"i": {**inner, "maxItems": 10}}}}}}
    assert rule_violations(bounded, P) == []
    unbounded = {"type": "object", "properties": {"o": {"type": "array", "items": {
        "type": "object", "properties": {"i": inner}}}}}
    assert any("estimated rule cost exceeds budget" in m for m in msgs(rule_violations(unbounded, P)))


def test_cost_error_factor_wording():
    assert "by factor of 1.200000x" in cost_error("estimated rule cost", 12, 10)
    assert "by factor of 2.5x" in cost_error("estimated rule cost", 25, 10)
    assert STATIC_RULE_COST_LIMIT == 10_000_000


def test_enum_and_too_many_also_block_rules():
    # As measured against kube-apiserver (gateway-api listeners, karpenter's amiFamily enum).
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "family": {"type": "string", "enum": ["AL2", "Bottlerocket"]},
        "l": {"type": "array", "maxItems": 1, "items": {"type": "string"}}},
        "x-kubernetes-validations": [{"rule": "false", "message": "never"}]}}}
    got = msgs(validate_custom_resource({"spec": {"family": "AL2023"}}, s))
    assert got == ['spec.family: Unsupported value: "AL2023": supported values: "AL2", "Bottlerocket"',
                   '<nil>: Invalid value: "null": some validation rules were not checked because the object was '
                   "invalid; correct the existing errors to complete validation"]
    got = msgs(validate_custom_resource({"spec": {"l": ["a", "b"]}}, s))
    assert got[0] == "spec.l: Too many: 2: must have at most 1 items" and "some validation rules" in got[1]
    assert msgs(validate_custom_resource({"spec": {"l": ["a"]}}, s)) == ['spec: Invalid value: "object": never']


def test_cluster_api_recorded_messages():
    # Recorded from kube-apiserver's CRD validation code as cluster-api's ClusterClass variables use it.
    p = "patch1.variables[cpu].schema.openAPIV3Schema"
    s = {"type": "object", "properties": {"nestedField": {"type": "integer", "default": 0,
                                                          "x-kubernetes-validations": [{"rule": "self >= 1"}]}}}
    assert msgs(schema_violations(s, p)) == [
        f'{p}.properties[nestedField].default: Invalid value: "integer": failed rule: self >= 1']
    p = "patch1.variables[anotherCPU].schema.openAPIV3Schema"
    s = {"type": "integer", "x-kubernetes-validations": [{
        "rule": "self >= 1", "messageExpression": "'Expected integer greater or equal to 1, got ' + this does not compile"}]}
    (got,) = msgs(rule_violations(s, p))
    assert got.startswith(
        f"{p}.x-kubernetes-validations[0].messageExpression: Invalid value: apiextensions.ValidationRule{{Rule:"
        "\"self >= 1\", Message:\"\", MessageExpression:\"'Expected integer greater or equal to 1, got ' + this does "
        "not compile\", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\"\", "
        "OptionalOldSelf:(*bool)(nil)}: messageExpression compilation failed: ERROR: <input>:1:55: Syntax error: "
        "mismatched input 'does' expecting ")
    # (cel-go lists what it expected as `<EOF>`; the shared engine's parser lists tokens: an engine difference.)
    assert got.endswith("\n | 'Expected integer greater or equal to 1, got ' + this does not compile\n"
                        " | ......................................................^")


def test_root_rules_see_only_name_and_generate_name_of_metadata():
    s = {"type": "object", "x-kubernetes-validations": [
        {"rule": "self.metadata.name.startsWith('web-')", "message": "name must start with web-"},
        {"rule": "!has(self.metadata.labels)", "message": "labels are not visible to rules"}],
         "properties": {"spec": {"type": "object"}}}
    obj = {"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "db-1", "labels": {"a": "b"}}, "spec": {}}
    assert msgs(validate_rules(obj, s)) == ['<nil>: Invalid value: "object": name must start with web-']
