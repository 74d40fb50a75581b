"""prune() and apply_defaults(): kube's pruning and structural defaulting."""

from __future__ import annotations

import copy

from fleet.api.crd import apply_defaults, prune, strict_decoding_message, unknown_field_warnings

PRESERVE = {"type": "object", "properties": {
    "spec": {"type": "object", "properties": {
        "known": {"type": "string"},
        "bag": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"strict": {"type": "object", "properties": {"a": {"type": "string"}}}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "any": {"type": "object", "additionalProperties": True},
        "template": {"type": "object", "x-kubernetes-embedded-resource": True,
                     "properties": {"spec": {"type": "object", "properties": {"x": {"type": "string"}}}}},
    }},
}}


def test_prune_unknown_fields_and_report_paths():
    obj = {"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "n", "labels": {"a": "b"}},
           "status": {"x": 1},
           "spec": {"known": "k", "foo": 1,
                    "bag": {"free": {"deep": 1}, "strict": {"a": "1", "b": 2}},
                    "items": [{"name": "a", "extra": True}],
                    "labels": {"k": "v"},
                    "any": {"x": {"y": [1]}},
                    "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "bogus": 1},
                                 "spec": {"x": "1", "y": 2}, "other": 1}}}
    pruned = prune(obj, PRESERVE)
    assert pruned == ["spec.bag.strict.b", "spec.foo", "spec.items[0].extra", "spec.template.other",
                      "spec.template.spec.y", "status"]
    assert obj["metadata"] == {"name": "n", "labels": {"a": "b"}}  # the root's metadata is the server's
    assert obj["spec"]["bag"] == {"free": {"deep": 1}, "strict": {"a": "1"}}
    assert obj["spec"]["any"] == {"x": {"y": [1]}}
    assert obj["spec"]["template"] == {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                       "spec": {"x": "1"}}


def test_prune_whole_root_preserved():
    s = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    obj = {"apiVersion": "a/v1", "kind": "K", "anything": {"goes": 1}}
    assert prune(obj, s) == [] and obj["anything"] == {"goes": 1}


def test_defaults_nested_missing_only(crontab):
    obj = {"spec": {"cronSpec": "* * * * *"}}
    apply_defaults(obj, crontab)
    assert obj == {"spec": {"cronSpec": "* * * * *", "replicas": 1}}
    obj = {"spec": {"replicas": 5}}
    assert apply_defaults(obj, crontab) == {"spec": {"replicas": 5}}
    s = {"type": "object", "properties": {"spec": {"type": "object", "default": {}, "properties": {
        "a": {"type": "object", "default": {}, "properties": {"b": {"type": "integer", "default": 7}}}}}}}
    assert apply_defaults({}, s) == {"spec": {"a": {"b": 7}}}


def test_defaults_and_nulls():
    s = {"type": "object", "properties": {
        "d": {"type": "string", "default": "x"},
        "n": {"type": "string", "nullable": True, "default": "y"},
        "z": {"type": "string"},
        "l": {"type": "array", "items": {"type": "string", "default": "i"}},
        "m": {"type": "object", "additionalProperties": {"type": "integer", "default": 3}},
    }}
    obj = {"d": None, "n": None, "z": None, "l": [None, "a"], "m": {"k": None}}
    apply_defaults(obj, s)
    assert obj == {"d": "x", "n": None, "l": ["i", "a"], "m": {"k": 3}}


def test_default_is_copied():
    s = {"type": "object", "properties": {"o": {"type": "object", "default": {"a": []},
                                                "properties": {"a": {"type": "array", "items": {"type": "string"}}}}}}
    before = copy.deepcopy(s)
    x = apply_defaults({}, s)
    x["o"]["a"].append("changed")
    assert s == before


def test_field_validation_words():
    # As kube-apiserver answers (recorded: NodeFeatureRule, DynamoGraphDeployment with map keys).
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"services": {
        "type": "object", "additionalProperties": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}}}}}
    obj = {"spec": {"services": {"DecodeWorker": {"subComponentType": "x"}, "PrefillWorker": {"subComponentType": "y"}}}}
    pruned = prune(obj, s)
    assert unknown_field_warnings(pruned) == ['unknown field "spec.services.DecodeWorker.subComponentType"',
                                              'unknown field "spec.services.PrefillWorker.subComponentType"']
    assert strict_decoding_message("DynamoGraphDeployment", "v1alpha1", pruned) == (
        'DynamoGraphDeployment in version "v1alpha1" cannot be handled as a DynamoGraphDeployment: strict decoding '
        'error: unknown field "spec.services.DecodeWorker.subComponentType", unknown field '
        '"spec.services.PrefillWorker.subComponentType"')
