"""fleet.api.decode (bounded JSON/YAML decoding) and fleet.api.typecheck (typed objects)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.api import decode, schema, typecheck

# --------------------------------------------------------------------------- decode


@pytest.mark.parametrize(("body", "fragment"), [
    (b'{"a":NaN}', "NaN"),
    (b'{"a":-Infinity}', "-Infinity"),
    (b'{"a":1e400}', "overflows"),
    (b'{"a":' + b"9" * 25 + b"}", "64-bit integer"),
    (b'{"a":"\\ud800"}', "surrogate"),
    (b'{"\\udc00":1}', "surrogate"),
    (b'{"a":"\xc3"}', "invalid UTF-8"),
    (b"[" * 200 + b"]" * 200, "nested more than 128"),
    (b"[" * 100000 + b"]" * 100000, "nested more than 128"),
    (b'{"a":', "json parse error"),
    (b"", "json parse error"),
])
def test_json_refusals(body: bytes, fragment: str) -> None:
    with pytest.raises(decode.DecodeError) as e:
        decode.decode_json(body)
    assert fragment in str(e.value)


def test_json_accepts_plain_data_and_reports_duplicate_keys() -> None:
    d = decode.decode_json(b'\xef\xbb\xbf{"a":{"b":1,"b":2},"c":[1.5,true,null,"\\u00e9"],"a":{"b":3}}')
    assert d.value == {"a": {"b": 3}, "c": [1.5, True, None, "\u00e9"]}
    assert d.duplicates == ["a", "b"]
    assert decode.decode_json(b'{"n":-9223372036854775808}').value == {"n": -(2**63)}


def test_decoded_size_is_bounded_not_only_the_bytes() -> None:
    with pytest.raises(decode.TooLarge):
        decode.decode_json(b'{"a":"' + b"x" * 2000 + b'"}', max_bytes=1000)
    # 9 levels of 9 aliases: a few hundred bytes that would expand to ~10^9 nodes.
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "\n".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(9))
    with pytest.raises(decode.DecodeError, match="excessive aliasing"):
        decode.decode_yaml(bomb.encode())
    # A few aliases to one long string: few nodes, but a large decoded object.
    many = "s: &s " + "y" * 600 + "\nl: [" + ", ".join(["*s"] * 10) + "]\n"
    with pytest.raises(decode.TooLarge):
        decode.decode_yaml(many.encode(), max_bytes=5000)


@pytest.mark.parametrize(("body", "fragment"), [
    (b"a: &a [*a]\n", "cycle"),
    (b"m: &m {k: *m}\n", "cycle"),
    (b"a: !!binary aGk=\n", "not JSON"),
    (b"a: !!set {x, y}\n", "not JSON"),
    (b"!!python/object/apply:os.system [true]\n", "error converting YAML"),
    (b"a: \x00\n", "error converting YAML"),
    (b"a: " + b"[" * 3000 + b"]" * 3000, "nested"),
    (b"{[1, 2]: a}\n", "error converting YAML"),
])
def test_yaml_refusals(body: bytes, fragment: str) -> None:
    with pytest.raises(decode.DecodeError) as e:
        decode.decode_yaml(body)
    assert fragment in str(e.value)


def test_yaml_to_json_as_sigs_k8s_io_yaml() -> None:
    d = decode.decode_yaml(b"t: 2020-01-01T00:00:00Z\nd: 2020-01-01\n1: one\nx: &x {k: v}\ny: *x\n")
    assert d.value == {"t": "2020-01-01T00:00:00Z", "d": "2020-01-01", "1": "one",
                       "x": {"k": "v"}, "y": {"k": "v"}}
    assert decode.decode_yaml(b"").value is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_decode_error(raw: bytes) -> None:
    for fn in (decode.decode_json, decode.decode_yaml):
        try:
            d = fn(raw)
        except decode.DecodeError:
            continue
        json.dumps(d.value, allow_nan=False).encode("utf-8")  # plain, encodable JSON data


# --------------------------------------------------------------------------- typecheck


def pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                                     "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
                                     "livenessProbe": {"httpGet": {"port": "http"}}}]}}


def fields(report: typecheck.TypeReport) -> list[tuple[str, str]]:
    return [(c["field"], c["reason"]) for c in report.causes]


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("status", 5, [("status", "FieldValueTypeInvalid")]),
    ("spec", "x", [("spec", "FieldValueTypeInvalid")]),
    ("metadata.labels", ["a"], [("metadata.labels", "FieldValueTypeInvalid")]),
    ("metadata.labels.a", 5, [("metadata.labels[a]", "FieldValueTypeInvalid")]),
    ("metadata.ownerReferences", [{"uid": 5}], [("metadata.ownerReferences[0].uid", "FieldValueTypeInvalid")]),
    ("metadata.creationTimestamp", "yesterday", [("metadata.creationTimestamp", "FieldValueInvalid")]),
    ("spec.containers", [None], [("spec.containers[0]", "FieldValueTypeInvalid")]),
    ("spec.containers.0.image", 5, [("spec.containers[0].image", "FieldValueTypeInvalid")]),
    ("spec.containers.0.ports.0.containerPort", 2**31, [("spec.containers[0].ports[0].containerPort",
                                                         "FieldValueInvalid")]),
    ("spec.containers.0.ports.0.containerPort", "80", [("spec.containers[0].ports[0].containerPort",
                                                        "FieldValueTypeInvalid")]),
    ("spec.containers.0.ports.0.containerPort", 80.0, [("spec.containers[0].ports[0].containerPort",
                                                        "FieldValueTypeInvalid")]),
    ("spec.containers.0.ports.0.containerPort", True, [("spec.containers[0].ports[0].containerPort",
                                                        "FieldValueTypeInvalid")]),
    ("spec.containers.0.resources.limits.cpu", "lots", [("spec.containers[0].resources.limits[cpu]",
                                                         "FieldValueInvalid")]),
    ("spec.containers.0.resources.limits.cpu", True, [("spec.containers[0].resources.limits[cpu]",
                                                       "FieldValueTypeInvalid")]),
    ("spec.containers.0.livenessProbe.httpGet.port", 1.5, [("spec.containers[0].livenessProbe.httpGet.port",
                                                            "FieldValueTypeInvalid")]),
    ("spec.activeDeadlineSeconds", 2**40, []),  # int64
    ("spec.activeDeadlineSeconds", 2**63, [("spec.activeDeadlineSeconds", "FieldValueInvalid")]),
    ("spec.hostNetwork", "true", [("spec.hostNetwork", "FieldValueTypeInvalid")]),
    ("spec.volumes", [{"name": "v", "hostPath": 5}], [("spec.volumes[0].hostPath", "FieldValueTypeInvalid")]),
    ("spec.containers.0.resources.limits.cpu", 0.5, []),
    ("spec.containers.0.livenessProbe.httpGet.port", 8080, []),
])
def test_typed_fields(path: str, value, expected) -> None:
    obj = pod()
    cur = obj
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if p.isdigit() else cur.setdefault(p, {})
    cur[parts[-1]] = value
    assert fields(typecheck.check("V1Pod", obj)) == expected


def test_nulls_normalized_and_unknown_fields_pruned() -> None:
    obj = pod()
    obj["spec"]["affinity"] = None
    obj["spec"]["nodeName"] = None  # scalar nulls stay (Go's zero value on the way back)
    obj["metadata"]["annotations"] = {"a": None}
    obj["bogus"] = 1
    obj["spec"]["containers"][0]["alsoBogus"] = {"x": 1}
    r = typecheck.check("V1Pod", obj)
    assert r.causes == [] and sorted(r.unknown) == [".bogus", ".spec.containers[0].alsoBogus"]
    assert "affinity" not in obj["spec"] and obj["spec"]["nodeName"] is None
    assert obj["metadata"]["annotations"] == {"a": ""}
    assert "bogus" not in obj and "alsoBogus" not in obj["spec"]["containers"][0]
    kept = pod()
    assert typecheck.check("V1Pod", copy.deepcopy(kept), prune=False).unknown == []


def test_kinds_without_a_schema_still_get_their_metadata_checked() -> None:
    r = typecheck.check(None, {"metadata": {"name": 5, "labels": {"a": 1}}, "spec": "anything"})
    assert fields(r) == [("metadata.name", "FieldValueTypeInvalid"), ("metadata.labels[a]", "FieldValueTypeInvalid")]


def test_owner_references_must_be_complete() -> None:
    refs = [{"apiVersion": "v1", "kind": "", "name": "a", "uid": "u"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u2", "controller": True},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "s", "uid": "u3", "controller": True}]
    assert [c["field"] for c in typecheck.owner_reference_causes(refs)] == [
        "metadata.ownerReferences[0].kind", "metadata.ownerReferences"]


def _roots() -> list[str]:
    return sorted({r["type"] for r in schema._data()["roots"]})


@pytest.mark.parametrize("root", _roots())
def test_every_root_type_checks_an_empty_object(root: str) -> None:
    assert typecheck.check(root, {"metadata": {"name": "x"}}).causes == []
