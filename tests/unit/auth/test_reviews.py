"""authorization.k8s.io/v1 access reviews: validation in kube-apiserver's words, the pure
decisions, rule resolution, the protobuf bodies kubectl sends, discovery, and the four
kinds answered through the in-process API (fleet/auth/reviews.py)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from fleet.api import protobuf
from fleet.api.kinds import authorization as kinds
from fleet.api.registry import default_registry
from fleet.auth import SYSTEM_MASTERS, AllowAll, Attributes, Decision, UserInfo
from fleet.auth.reviews import (
    ALL_NON_RESOURCE_URLS_RULE,
    ALL_RESOURCES_RULE,
    AllowAllRules,
    RulesResult,
    UnionRuleResolver,
    aggregate_errors,
    resolvers_of,
    review_status,
    rules_status,
    spec_attributes,
    subject,
)
from fleet.server import discovery, security
from fleet.server.http import Req
from fleet.server.routes import Route
from fleet.store import open_store
from tests.unit.auth.fakes import ALICE, BASIC, Grant, GrantAuthorizer, make_authorizer, review_api

AV = "authorization.k8s.io/v1"
BASE = "/apis/authorization.k8s.io/v1"

# What kubectl 1.32 POSTed for `kubectl auth can-i create pods` (namespace "default" from
# its kubeconfig) and `kubectl auth can-i --list -n ns`, captured with a recording server.
KUBECTL_CAN_I_CREATE_PODS = base64.b64decode(
    "azhzAAoyChdhdXRob3JpemF0aW9uLms4cy5pby92MRIXU2VsZlN1YmplY3RBY2Nlc3NSZXZpZXcSPwoQCgASABoAIgAq"
    "ADIAOABCABIhCh8KB2RlZmF1bHQSBmNyZWF0ZRoAIgAqBHBvZHMyADoAGggIABIAGgAgABoAIgA=")
KUBECTL_CAN_I_LIST_NS = base64.b64decode(
    "azhzAAoxChdhdXRob3JpemF0aW9uLms4cy5pby92MRIWU2VsZlN1YmplY3RSdWxlc1JldmlldxIeChAKABIAGgAiACoA"
    "MgA4AEIAEgQKAm5zGgQYACIAGgAiAA==")


def ssar(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": AV, "kind": "SelfSubjectAccessReview", "spec": spec}


def sar(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": AV, "kind": "SubjectAccessReview", "spec": spec}


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------


def messages(causes: list[dict[str, str]]) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in causes]


def test_sar_needs_exactly_one_kind_of_attributes_and_a_subject() -> None:
    assert messages(kinds.validate_subject_access_review(sar())) == [
        'spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or '
        "resourceAttributes must be specified",
        'spec.user: Invalid value: "": at least one of user or group must be specified',
    ]
    both = sar(user="me", resourceAttributes={}, nonResourceAttributes={"path": "/x", "verb": "get"})
    [msg] = messages(kinds.validate_subject_access_review(both))
    assert msg.startswith("spec.nonResourceAttributes: Invalid value: ")
    assert msg.endswith(": cannot be specified in combination with resourceAttributes")
    assert kinds.validate_subject_access_review(sar(groups=["g"], nonResourceAttributes={})) == []
    assert kinds.validate_subject_access_review(sar(user="me", resourceAttributes={})) == []


def test_self_review_has_no_subject_check_but_the_same_union_rule() -> None:
    assert kinds.validate_self_subject_access_review(ssar(resourceAttributes={})) == []
    assert messages(kinds.validate_self_subject_access_review(ssar())) == [
        'spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or '
        "resourceAttributes must be specified"]


@pytest.mark.parametrize(("selector", "expected"), [
    ({"fieldSelector": {"rawSelector": "foo", "requirements": [{"key": "k", "operator": "Exists"}]}},
     'spec.resourceAttributes.fieldSelector.rawSelector: Invalid value: "foo": may not specified at the '
     "same time as requirements"),
    ({"fieldSelector": {}},
     "spec.resourceAttributes.fieldSelector.requirements: Required value: when "
     "spec.resourceAttributes.fieldSelector is specified, requirements or rawSelector is required"),
    ({"fieldSelector": {"requirements": [{"key": ""}]}},
     "spec.resourceAttributes.fieldSelector.requirements[0].key: Required value: must be specified"),
    ({"fieldSelector": {"requirements": [{"key": "k", "operator": "In", "values": []}]}},
     "spec.resourceAttributes.fieldSelector.requirements[0].values: Required value: must be specified "
     "when `operator` is 'In' or 'NotIn'"),
    ({"labelSelector": {"requirements": [{"key": "k", "operator": "Exists", "values": ["v"]}]}},
     "spec.resourceAttributes.labelSelector.requirements[0].values: Forbidden: may not be specified when "
     "`operator` is 'Exists' or 'DoesNotExist'"),
    ({"labelSelector": {"requirements": [{"key": "()foo", "operator": "Exists"}]}},
     'spec.resourceAttributes.labelSelector.requirements[0].key: Invalid value: "()foo": name part must '
     "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
     "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
     "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"),
])
def test_selector_attributes(selector: dict[str, Any], expected: str) -> None:
    review = sar(user="me", resourceAttributes={"verb": "list", "resource": "pods", **selector})
    assert messages(kinds.validate_subject_access_review(review)) == [expected]


def test_unknown_selector_operators_are_allowed() -> None:
    review = sar(user="me", resourceAttributes={
        "fieldSelector": {"requirements": [{"key": "k", "operator": "Fancy", "values": ["v"]}]}})
    assert kinds.validate_subject_access_review(review) == []


def test_metadata_must_be_empty() -> None:
    review = {**sar(user="me", resourceAttributes={}), "metadata": {"name": "x"}}
    [msg] = messages(kinds.validate_subject_access_review(review))
    assert msg.startswith("metadata: Invalid value: ") and msg.endswith(": must be empty")
    assert kinds.validate_subject_access_review(
        {**sar(user="me", resourceAttributes={}), "metadata": {"managedFields": [{"manager": "m"}]}}) == []


def test_local_review_namespace_rules() -> None:
    def lsar(md: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {"apiVersion": AV, "kind": "LocalSubjectAccessReview", "metadata": md, "spec": spec}

    ok = lsar({"namespace": "a"}, user="u", resourceAttributes={"namespace": "a", "verb": "get"})
    assert kinds.validate_local_subject_access_review(ok) == []
    assert messages(kinds.validate_local_subject_access_review(
        lsar({"namespace": "a"}, user="u", resourceAttributes={"namespace": "b"}))) == [
        'spec.resourceAttributes.namespace: Invalid value: "b": must match metadata.namespace']
    [msg] = messages(kinds.validate_local_subject_access_review(
        lsar({"namespace": "a", "name": "x"}, user="u", resourceAttributes={"namespace": "a"})))
    assert msg.endswith(": must be empty except for namespace")
    [msg] = messages(kinds.validate_local_subject_access_review(
        lsar({"namespace": "a"}, user="u", nonResourceAttributes={"path": "/x", "verb": "get"})))
    assert msg.startswith("spec.nonResourceAttributes: Invalid value: ")
    assert msg.endswith(": disallowed on this kind of request")


# ---------------------------------------------------------------------------
# Pure decisions
# ---------------------------------------------------------------------------


def test_spec_attributes() -> None:
    a = spec_attributes({"resourceAttributes": {"verb": "get", "resource": "deployments", "group": "apps",
                                                "subresource": "scale", "namespace": "n", "name": "d"}})
    assert a == Attributes("get", "apps", "*", "deployments", "scale", "n", "d")
    assert spec_attributes({"resourceAttributes": {"version": "v1"}}).version == "v1"
    n = spec_attributes({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}})
    assert (n.resource_request, n.path, n.verb) == (False, "/healthz", "get")


def test_subject_is_taken_as_given() -> None:
    u = subject({"user": "bob", "groups": ["g"], "uid": "1", "extra": {"scopes": ["a", "b"]}})
    assert u == UserInfo("bob", "1", ("g",), {"scopes": ["a", "b"]})
    assert subject({"groups": ["g"]}).groups == ("g",)  # no system:authenticated added


def test_review_status_distinguishes_deny_from_no_opinion() -> None:
    assert review_status(Decision(True, "rbac says yes")) == {"allowed": True, "reason": "rbac says yes"}
    assert review_status(Decision(False, "nope")) == {"allowed": False, "denied": True, "reason": "nope"}
    assert review_status(Decision(False, no_opinion=True)) == {"allowed": False}


def test_union_rule_resolver_joins_and_gives_masters_the_star_rules_once() -> None:
    class Fixed:
        def __init__(self, result: RulesResult) -> None:
            self.result = result

        def rules_for(self, user: UserInfo, namespace: str) -> RulesResult:
            return self.result

    a = Fixed(RulesResult([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}], [], False, "x broke"))
    b = Fixed(RulesResult([], [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}], True, "y broke"))
    got = UnionRuleResolver(a, b).rules_for(UserInfo("u"), "ns")
    assert got == RulesResult([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}],
                              [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}], True, "[x broke, y broke]")

    admin = UserInfo("admin", groups=(SYSTEM_MASTERS,))
    got = UnionRuleResolver(a).rules_for(admin, "ns")
    assert got.resource_rules[0] == ALL_RESOURCES_RULE and len(got.resource_rules) == 2
    assert got.non_resource_rules == [ALL_NON_RESOURCE_URLS_RULE]
    # Already granted (RBAC's cluster-admin binding): not repeated.
    star = Fixed(RulesResult([{**ALL_RESOURCES_RULE, "resourceNames": []}], [dict(ALL_NON_RESOURCE_URLS_RULE)]))
    got = UnionRuleResolver(star).rules_for(admin, "ns")
    assert len(got.resource_rules) == 1 and len(got.non_resource_rules) == 1
    assert UnionRuleResolver(a, masters=False).rules_for(admin, "ns").non_resource_rules == []


def test_rules_status_shape() -> None:
    status = rules_status(RulesResult([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                                        "resourceNames": []}], [], False, ""))
    assert status == {"resourceRules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}],
                      "nonResourceRules": [], "incomplete": False}
    assert rules_status(RulesResult(incomplete=True, error="e"))["evaluationError"] == "e"
    assert rules_status(AllowAllRules().rules_for(UserInfo("x"), "n")) == {
        "resourceRules": [ALL_RESOURCES_RULE], "nonResourceRules": [ALL_NON_RESOURCE_URLS_RULE],
        "incomplete": False}


def test_aggregate_errors_and_resolvers_of() -> None:
    assert aggregate_errors([]) == "" and aggregate_errors(["a"]) == "a"
    authz = make_authorizer()
    assert resolvers_of([AllowAll(), authz]) == [authz]


# ---------------------------------------------------------------------------
# Wire formats and discovery
# ---------------------------------------------------------------------------


def test_kubectl_protobuf_bodies_decode() -> None:
    assert protobuf.decode_body(KUBECTL_CAN_I_CREATE_PODS) == {
        "apiVersion": AV, "kind": "SelfSubjectAccessReview", "metadata": {},
        "spec": {"resourceAttributes": {"namespace": "default", "verb": "create", "resource": "pods"}},
        "status": {}}
    assert protobuf.decode_body(KUBECTL_CAN_I_LIST_NS) == {
        "apiVersion": AV, "kind": "SelfSubjectRulesReview", "metadata": {}, "spec": {"namespace": "ns"},
        "status": {}}


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _ld(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def test_subject_access_review_protobuf_with_extra_groups_and_selectors() -> None:
    ra = (_ld(1, b"ns") + _ld(2, b"list") + _ld(5, b"pods")
          + _ld(8, _ld(2, _ld(1, b"spec.nodeName") + _ld(2, b"In") + _ld(3, b"n1")))
          + _ld(9, _ld(1, b"app=web")))
    extra = _ld(1, b"scopes") + _ld(2, _ld(1, b"a") + _ld(1, b"b"))
    spec = _ld(1, ra) + _ld(3, b"bob") + _ld(4, b"g1") + _ld(4, b"g2") + _ld(5, extra) + _ld(6, b"uid-1")
    unknown = _ld(1, b"authorization.k8s.io/v1") + _ld(2, b"SubjectAccessReview")
    body = protobuf.MAGIC + _ld(1, unknown) + _ld(2, _ld(1, b"") + _ld(2, spec))
    assert protobuf.decode_body(body) == {
        "apiVersion": AV, "kind": "SubjectAccessReview", "metadata": {},
        "spec": {"resourceAttributes": {
            "namespace": "ns", "verb": "list", "resource": "pods",
            "fieldSelector": {"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["n1"]}]},
            "labelSelector": {"rawSelector": "app=web"}},
            "user": "bob", "groups": ["g1", "g2"], "extra": {"scopes": ["a", "b"]}, "uid": "uid-1"}}


def test_discovery_lists_the_reviews_as_kube_apiserver() -> None:
    doc = discovery.api_resource_list(default_registry(), "authorization.k8s.io", "v1")
    assert doc is not None
    assert doc["resources"] == [
        {"name": "localsubjectaccessreviews", "singularName": "localsubjectaccessreview", "namespaced": True,
         "kind": "LocalSubjectAccessReview", "verbs": ["create"]},
        {"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview", "namespaced": False,
         "kind": "SelfSubjectAccessReview", "verbs": ["create"]},
        {"name": "selfsubjectrulesreviews", "singularName": "selfsubjectrulesreview", "namespaced": False,
         "kind": "SelfSubjectRulesReview", "verbs": ["create"]},
        {"name": "subjectaccessreviews", "singularName": "subjectaccessreview", "namespaced": False,
         "kind": "SubjectAccessReview", "verbs": ["create"]},
    ]


# ---------------------------------------------------------------------------
# Through the API
# ---------------------------------------------------------------------------


async def test_self_subject_access_review(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        async def can_i(token: str, **attrs: Any) -> dict[str, Any]:
            status, body = await api.json("POST", f"{BASE}/selfsubjectaccessreviews",
                                          ssar(resourceAttributes=attrs), token=token)
            assert status == 201, body
            assert body["kind"] == "SelfSubjectAccessReview" and body["apiVersion"] == AV
            assert body["metadata"] == {"creationTimestamp": None}
            assert body["spec"] == {"resourceAttributes": attrs}
            return body["status"]

        assert await can_i("alice-token", verb="create", resource="pods", namespace="team-a") == {
            "allowed": True, "reason": "granted by the test authorizer"}
        assert await can_i("alice-token", verb="create", resource="pods", namespace="team-b") == {
            "allowed": False}
        assert await can_i("alice-token", verb="delete", resource="pods", namespace="team-a") == {
            "allowed": False, "denied": True, "reason": "denied by the test authorizer"}
        # Through her group.
        assert (await can_i("alice-token", verb="get", group="apps", resource="deployments"))["allowed"]
        assert (await can_i("bob-token", verb="list", resource="pods", namespace="x"))["allowed"]
        assert (await can_i("test-token", verb="*", group="*", resource="*"))["allowed"]  # system:masters

        status, body = await api.json("POST", f"{BASE}/selfsubjectaccessreviews",
                                      ssar(nonResourceAttributes={"path": "/healthz", "verb": "get"}),
                                      token="alice-token")
        assert (status, body["status"]["allowed"]) == (201, True)


async def test_kubectl_protobuf_review_through_the_api(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        ct = protobuf.MEDIA_TYPE
        status, body = await api.json("POST", f"{BASE}/selfsubjectaccessreviews", KUBECTL_CAN_I_CREATE_PODS,
                                      token="alice-token", content_type=ct)
        assert (status, body["status"]) == (201, {"allowed": False})
        status, body = await api.json("POST", f"{BASE}/selfsubjectaccessreviews", KUBECTL_CAN_I_CREATE_PODS,
                                      content_type=ct)
        assert (status, body["status"]) == (201, {"allowed": True})


async def test_subject_access_review_and_validation_errors(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        review = sar(user="bob", groups=["viewers"], resourceAttributes={"verb": "get", "resource": "pods"})
        status, body = await api.json("POST", f"{BASE}/subjectaccessreviews", review)
        assert (status, body["status"]["allowed"]) == (201, True)
        assert body["spec"]["user"] == "bob"
        # "What if bob were in no group": the subject is taken as given.
        review = sar(user="bob", resourceAttributes={"verb": "get", "resource": "pods"})
        status, body = await api.json("POST", f"{BASE}/subjectaccessreviews", review)
        assert (status, body["status"]) == (201, {"allowed": False})
        # A namespace in a cluster-scoped review's metadata is dropped, not refused.
        review = {**sar(user="bob", groups=["viewers"], resourceAttributes={"verb": "get", "resource": "pods"}),
                  "metadata": {"namespace": "ignored"}}
        status, body = await api.json("POST", f"{BASE}/subjectaccessreviews", review)
        assert (status, body["metadata"]) == (201, {"creationTimestamp": None})

        status, body = await api.json("POST", f"{BASE}/subjectaccessreviews", sar())
        assert status == 422
        assert body["reason"] == "Invalid"
        assert body["message"] == (
            '.authorization.k8s.io "" is invalid: [spec.resourceAttributes: Invalid value: "null": exactly one '
            "of nonResourceAttributes or resourceAttributes must be specified, spec.user: Invalid value: \"\": "
            "at least one of user or group must be specified]")
        assert body["details"] == {"group": "authorization.k8s.io", "causes": [
            {"reason": "FieldValueInvalid", "field": "spec.resourceAttributes",
             "message": 'Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes '
                        "must be specified"},
            {"reason": "FieldValueInvalid", "field": "spec.user",
             "message": 'Invalid value: "": at least one of user or group must be specified'}]}

        # Alice may ask about herself, not about others.
        status, body = await api.json("POST", f"{BASE}/subjectaccessreviews", sar(user="x", resourceAttributes={}),
                                      token="alice-token")
        assert status == 403
        assert body["message"] == ('subjectaccessreviews.authorization.k8s.io is forbidden: User "alice" cannot '
                                   'create resource "subjectaccessreviews" in API group "authorization.k8s.io" '
                                   "at the cluster scope")
        # Wrong kind in the body; only create exists.
        status, body = await api.json("POST", f"{BASE}/subjectaccessreviews",
                                      {"apiVersion": AV, "kind": "SelfSubjectAccessReview", "spec": {}})
        assert (status, body["message"]) == (400, "the kind in the data (SelfSubjectAccessReview) does not "
                                                  "match the expected kind (SubjectAccessReview)")
        status, _ = await api.json("GET", f"{BASE}/subjectaccessreviews")
        assert status == 405


async def test_local_subject_access_review(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        def lsar(md: dict[str, Any], **spec: Any) -> dict[str, Any]:
            return {"apiVersion": AV, "kind": "LocalSubjectAccessReview", "metadata": md, "spec": spec}

        path = f"{BASE}/namespaces/team-a/localsubjectaccessreviews"
        review = lsar({}, user="alice", groups=["devs"],
                      resourceAttributes={"namespace": "team-a", "verb": "list", "resource": "pods"})
        status, body = await api.json("POST", path, review)
        assert (status, body["status"]["allowed"]) == (201, True)
        assert body["metadata"] == {"namespace": "team-a", "creationTimestamp": None}

        status, body = await api.json("POST", path, lsar({"namespace": "other"}, user="alice",
                                                         resourceAttributes={"namespace": "other"}))
        assert (status, body["message"]) == (400, "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
        status, body = await api.json("POST", path, lsar({}, user="alice", resourceAttributes={"namespace": "b"}))
        assert status == 422
        assert body["message"] == ('.authorization.k8s.io "" is invalid: spec.resourceAttributes.namespace: '
                                   'Invalid value: "b": must match metadata.namespace')
        # Not cluster-scoped.
        status, body = await api.json("POST", f"{BASE}/localsubjectaccessreviews", review)
        assert (status, body["message"]) == (400, "namespace is required on this type: ")
        status, _ = await api.json("POST", f"{BASE}/namespaces/team-a/subjectaccessreviews", review)
        assert status == 404


async def test_self_subject_rules_review(tmp_path: Path) -> None:
    async with review_api(tmp_path) as api:
        def srr(namespace: str | None) -> dict[str, Any]:
            spec = {} if namespace is None else {"namespace": namespace}
            return {"apiVersion": AV, "kind": "SelfSubjectRulesReview", "spec": spec}

        status, body = await api.json("POST", f"{BASE}/selfsubjectrulesreviews", srr("team-a"), token="alice-token")
        assert status == 201
        assert body["metadata"] == {"creationTimestamp": None} and body["spec"] == {}
        st = body["status"]
        assert st["incomplete"] is False and "evaluationError" not in st
        assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]} in st["resourceRules"]
        assert {"verbs": ["get"], "apiGroups": ["apps"], "resources": ["deployments"]} in st["resourceRules"]
        assert {"verbs": ["get"], "nonResourceURLs": ["/healthz"]} in st["nonResourceRules"]
        assert ALL_RESOURCES_RULE not in st["resourceRules"]

        status, body = await api.json("POST", f"{BASE}/selfsubjectrulesreviews", srr("team-b"), token="alice-token")
        assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]} not in \
            body["status"]["resourceRules"]

        # system:masters: the `*` rules first, then what system:authenticated is granted.
        status, body = await api.json("POST", f"{BASE}/selfsubjectrulesreviews", srr("ns"))
        assert body["status"]["resourceRules"] == [ALL_RESOURCES_RULE] + [g.rule()[1] for g in BASIC[:2]]
        assert body["status"]["nonResourceRules"] == [ALL_NON_RESOURCE_URLS_RULE, BASIC[2].rule()[1]]

        status, body = await api.json("POST", f"{BASE}/selfsubjectrulesreviews", srr(None), token="alice-token")
        assert (status, body["message"]) == (400, "no namespace on request")

        status, body = await api.json("POST", f"{BASE}/selfsubjectrulesreviews", KUBECTL_CAN_I_LIST_NS,
                                      token="bob-token", content_type=protobuf.MEDIA_TYPE)
        assert status == 201
        assert {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]} in \
            body["status"]["resourceRules"]


async def test_a_refusing_grant_table_denies_the_review_itself(tmp_path: Path) -> None:
    # Without the basic-user grant, asking is itself forbidden (kube's 403 on the review).
    authz = GrantAuthorizer(grants={"alice": [Grant(("get",), "", "pods")]})
    async with review_api(tmp_path, authz) as api:
        status, body = await api.json("POST", f"{BASE}/selfsubjectaccessreviews",
                                      ssar(resourceAttributes={"verb": "get", "resource": "pods"}),
                                      token="alice-token")
        assert status == 403
        assert json.dumps(body).count("selfsubjectaccessreviews") >= 1
        assert ALICE.name in body["message"]


@pytest.mark.parametrize("mode", ["AlwaysAllow", "RBAC"])
async def test_security_build_wires_the_review_handlers(tmp_path: Path, mode: str) -> None:
    async with open_store(tmp_path / "fleet.db") as store:
        sec = await security.build(security.SecurityConfig(authorization_mode=mode), data_dir=tmp_path,
                                   store=store, registry=default_registry(), admin_token="t")
    keys = {k for k in sec.handlers if k[0] == "authorization.k8s.io"}
    assert keys == {("authorization.k8s.io", "v1", p, "") for p in (
        "subjectaccessreviews", "selfsubjectaccessreviews", "localsubjectaccessreviews", "selfsubjectrulesreviews")}
    info = default_registry().get("authorization.k8s.io", "v1", "selfsubjectrulesreviews")
    assert info is not None
    body = json.dumps({"apiVersion": AV, "kind": "SelfSubjectRulesReview", "spec": {"namespace": "n"}}).encode()
    handler = sec.handlers[("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "")]
    bob = UserInfo("bob", groups=("system:authenticated",))
    req = Req("POST", f"{BASE}/selfsubjectrulesreviews", {}, {"content-type": "application/json"}, body)
    resp = await handler(req, Route("authorization.k8s.io", "v1", "selfsubjectrulesreviews"), "create", bob, info)
    status = json.loads(resp.body)["status"]
    if mode == "AlwaysAllow":  # everyone may do everything
        assert status["resourceRules"] == [ALL_RESOURCES_RULE]
    else:  # masters bypass only (until the RBAC authorizer joins the union): bob may do nothing
        assert status["resourceRules"] == [] and status["nonResourceRules"] == []
    admin = UserInfo("system:admin", groups=(SYSTEM_MASTERS, "system:authenticated"))
    resp = await handler(req, Route("authorization.k8s.io", "v1", "selfsubjectrulesreviews"), "create", admin, info)
    assert json.loads(resp.body)["status"]["resourceRules"][0] == ALL_RESOURCES_RULE
