"""rbac.authorization.k8s.io/v1 kinds (fleet/api/kinds/rbac.py): defaulting, validation
with kube-apiserver's messages, tables, and kubectl's protobuf bodies."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api import protobuf
from fleet.api.kinds.rbac import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    ROLE,
    ROLE_BINDING,
    default_binding,
    validate_cluster_role,
    validate_cluster_role_binding,
    validate_role,
    validate_role_binding,
)
from fleet.api.registry import default_registry

G = "rbac.authorization.k8s.io"


def messages(causes: list[dict[str, str]]) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in causes]


def role(*rules: dict[str, Any], name: str = "r") -> dict[str, Any]:
    return {"kind": "Role", "metadata": {"name": name, "namespace": "ns"}, "rules": list(rules)}


@pytest.mark.parametrize(("rules", "want"), [
    ([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}], []),
    ([{"apiGroups": [""], "resources": ["pods"]}], ["rules[0].verbs: Required value: verbs must contain at least one value"]),
    ([{"verbs": ["get"], "resources": ["pods"]}],
     ["rules[0].apiGroups: Required value: resource rules must supply at least one api group"]),
    ([{"verbs": ["get"], "apiGroups": [""]}],
     ["rules[0].resources: Required value: resource rules must supply at least one resource"]),
    ([{"verbs": ["get"], "nonResourceURLs": ["/x"]}],
     ['rules[0].nonResourceURLs: Invalid value: []string{"/x"}: namespaced rules cannot apply to non-resource URLs']),
])
def test_role_rules(rules: list[dict[str, Any]], want: list[str]) -> None:
    assert messages(validate_role(role(*rules), None)) == want


def test_cluster_role_rules_and_aggregation() -> None:
    cr = {"metadata": {"name": "system:thing"},
          "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
                    {"verbs": ["get"], "nonResourceURLs": ["/x"], "resources": ["pods"]}]}
    assert messages(validate_cluster_role(cr, None)) == [
        'rules[1].nonResourceURLs: Invalid value: []string{"/x"}: rules cannot apply to both regular resources and '
        'non-resource URLs']
    assert messages(validate_cluster_role({"metadata": {"name": "a"}, "aggregationRule": {}}, None)) == [
        "aggregationRule.clusterRoleSelectors: Required value: at least one clusterRoleSelector required if "
        "aggregationRule is non-nil"]
    assert messages(validate_cluster_role({"metadata": {"name": "a/b"}}, None)) == [
        "metadata.name: Invalid value: \"a/b\": may not contain '/'"]


def rb(kind: str = "Role", *subjects: dict[str, Any], ns: str | None = "ns") -> dict[str, Any]:
    md: dict[str, Any] = {"name": "b"}
    if ns:
        md["namespace"] = ns
    obj = {"metadata": md, "roleRef": {"kind": kind, "name": "r"}, "subjects": list(subjects)}
    default_binding(obj)
    return obj


def test_binding_defaults() -> None:
    obj = rb("Role", {"kind": "User", "name": "a"}, {"kind": "Group", "name": "g"},
             {"kind": "ServiceAccount", "name": "s"})
    assert obj["roleRef"]["apiGroup"] == G
    assert [s.get("apiGroup") for s in obj["subjects"]] == [G, G, ""]
    assert validate_role_binding(obj, None) == []


@pytest.mark.parametrize(("obj", "validate", "want"), [
    (rb("Thing"), validate_role_binding, ['roleRef.kind: Unsupported value: "Thing": supported values: "Role", '
                                          '"ClusterRole"']),
    (rb("Role", ns=None), validate_cluster_role_binding,
     ['roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"']),
    (rb("ClusterRole", {"kind": "ServiceAccount", "name": "s"}, ns=None), validate_cluster_role_binding,
     ["subjects[0].namespace: Required value"]),
    (rb("Role", {"kind": "User", "name": "u", "apiGroup": "x"}), validate_role_binding,
     ['subjects[0].apiGroup: Unsupported value: "x": supported values: "rbac.authorization.k8s.io"']),
    (rb("Role", {"kind": "ServiceAccount", "name": "s", "apiGroup": "x"}), validate_role_binding,
     ['subjects[0].apiGroup: Unsupported value: "x": supported values: ""']),
    (rb("Role", {"kind": "Robot", "name": "s"}), validate_role_binding,
     ['subjects[0].kind: Unsupported value: "Robot": supported values: "ServiceAccount", "User", "Group"']),
    (rb("Role", {"kind": "User"}), validate_role_binding, ["subjects[0].name: Required value"]),
])
def test_binding_validation(obj: dict[str, Any], validate: Any, want: list[str]) -> None:
    assert messages(validate(obj, None)) == want


def test_role_ref_is_immutable() -> None:
    old = rb("Role")
    new = rb("ClusterRole")
    assert [c["message"].rsplit(": ", 1)[-1] for c in validate_role_binding(new, old)] == ["cannot change roleRef"]
    assert validate_role_binding(rb("Role"), old) == []


def test_tables() -> None:
    assert [c.name for c in ROLE.table_columns()] == ["Name", "Created At"]
    assert [c.name for c in CLUSTER_ROLE.table_columns()] == ["Name", "Created At"]
    cols = ROLE_BINDING.table_columns()
    assert [(c.name, c.priority) for c in cols] == [("Name", 0), ("Role", 0), ("Age", 0), ("Users", 1),
                                                    ("Groups", 1), ("ServiceAccounts", 1)]
    obj = rb("ClusterRole", {"kind": "User", "name": "a"}, {"kind": "User", "name": "b"},
             {"kind": "Group", "name": "g"}, {"kind": "ServiceAccount", "name": "s", "namespace": "n"})
    obj["metadata"]["creationTimestamp"] = "2024-05-01T10:00:00Z"
    assert [c.value(obj) for c in cols if c.name != "Age"] == ["b", "ClusterRole/r", "a, b", "g", "n:s"]
    assert ROLE.table_columns()[1].value(obj) == "2024-05-01T10:00:00Z"
    assert CLUSTER_ROLE_BINDING.table_columns() == cols


def test_registered() -> None:
    reg = default_registry()
    for plural, namespaced in (("roles", True), ("clusterroles", False), ("rolebindings", True),
                               ("clusterrolebindings", False)):
        info = reg.get(G, "v1", plural)
        assert info is not None and info.namespaced is namespaced
    assert reg.resolve("clusterrolebinding") is reg.get(G, "v1", "clusterrolebindings")


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def test_protobuf_bodies() -> None:
    """What `kubectl create clusterrole|rolebinding` POSTs decodes to the JSON shape."""
    rule = _field(1, b"get") + _field(2, b"") + _field(3, b"pods") + _field(4, b"p1")
    url_rule = _field(1, b"get") + _field(5, b"/logs/*")
    cr = _field(1, _field(1, b"reader")) + _field(2, rule) + _field(2, url_rule)
    body = protobuf.MAGIC + _field(1, _field(1, G.encode() + b"/v1") + _field(2, b"ClusterRole")) + _field(2, cr)
    obj = protobuf.decode_body(body)
    assert obj["metadata"] == {"name": "reader"}
    assert obj["rules"] == [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["p1"]},
                            {"verbs": ["get"], "nonResourceURLs": ["/logs/*"]}]
    ref = _field(1, G.encode()) + _field(2, b"Role") + _field(3, b"reader")
    subject = _field(1, b"ServiceAccount") + _field(3, b"robot") + _field(4, b"ci")
    binding = _field(1, _field(1, b"b") + _field(3, b"ns")) + _field(2, subject) + _field(3, ref)
    body = protobuf.MAGIC + _field(1, _field(1, G.encode() + b"/v1") + _field(2, b"RoleBinding")) + _field(2, binding)
    obj = protobuf.decode_body(body)
    assert obj["roleRef"] == {"apiGroup": G, "kind": "Role", "name": "reader"}
    assert obj["subjects"] == [{"kind": "ServiceAccount", "name": "robot", "namespace": "ci"}]
