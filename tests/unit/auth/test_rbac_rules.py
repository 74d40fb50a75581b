"""RBAC rule matching, covering and the resolver (fleet/auth/rbac.py), table-driven, with
hypothesis properties: a wildcard rule allows (and covers) everything its narrower
rules do; covering agrees with matching; resourceNames never match unnamed requests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.auth import Attributes, UserInfo, non_resource
from fleet.auth.rbac import (
    RBACAuthorizer,
    applies_to_user,
    breakdown_rule,
    compact_rules,
    compact_string,
    covers,
    escalation_message,
    rule_allows,
)


def rule(verbs: list[str], groups: list[str], resources: list[str], names: list[str] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"verbs": verbs, "apiGroups": groups, "resources": resources}
    if names:
        r["resourceNames"] = names
    return r


def req(verb: str, resource: str, group: str = "", *, sub: str = "", ns: str = "default", name: str = "") -> Attributes:
    return Attributes(verb, group, "v1", resource, sub, ns, name)


@pytest.mark.parametrize(("r", "attrs", "allowed"), [
    (rule(["get"], [""], ["pods"]), req("get", "pods"), True),
    (rule(["get"], [""], ["pods"]), req("list", "pods"), False),
    (rule(["*"], [""], ["pods"]), req("deletecollection", "pods"), True),
    (rule(["get"], ["apps"], ["pods"]), req("get", "pods"), False),
    (rule(["get"], ["*"], ["deployments"]), req("get", "deployments", "apps"), True),
    (rule(["get"], [""], ["*"]), req("get", "secrets"), True),
    # Subresources: `pods` does not cover `pods/log`, nor `pods/log` the pod.
    (rule(["get"], [""], ["pods"]), req("get", "pods", sub="log", name="p"), False),
    (rule(["get"], [""], ["pods/log"]), req("get", "pods", sub="log", name="p"), True),
    (rule(["get"], [""], ["pods/log"]), req("get", "pods", name="p"), False),
    (rule(["get"], [""], ["*/log"]), req("get", "pods", sub="log", name="p"), True),
    (rule(["get"], [""], ["*/log"]), req("get", "pods", name="p"), False),
    (rule(["get"], [""], ["*/status"]), req("get", "pods", sub="log", name="p"), False),
    (rule(["get"], [""], ["*"]), req("get", "pods", sub="log", name="p"), True),
    # resourceNames restrict by name; a request without a name never matches them.
    (rule(["get"], [""], ["configmaps"], ["a"]), req("get", "configmaps", name="a"), True),
    (rule(["get"], [""], ["configmaps"], ["a"]), req("get", "configmaps", name="b"), False),
    (rule(["list"], [""], ["configmaps"], ["a"]), req("list", "configmaps"), False),
    (rule(["create"], [""], ["configmaps"], ["a"]), req("create", "configmaps"), False),
    # Non-resource rules never match resource requests.
    ({"verbs": ["get"], "nonResourceURLs": ["*"]}, req("get", "pods"), False),
])
def test_rule_allows(r: dict[str, Any], attrs: Attributes, allowed: bool) -> None:
    assert rule_allows(attrs, r) is allowed


@pytest.mark.parametrize(("urls", "path", "allowed"), [
    (["/healthz"], "/healthz", True),
    (["/healthz"], "/healthz/etcd", False),
    (["/healthz/*"], "/healthz/etcd", True),
    (["/healthz*"], "/healthzzz", True),
    (["/apis/*"], "/apis", False),
    (["/apis/*"], "/apis/apps/v1", True),
    (["*"], "/anything", True),
    (["/version", "/version/"], "/version/", True),
])
def test_non_resource_urls(urls: list[str], path: str, allowed: bool) -> None:
    r = {"verbs": ["get"], "nonResourceURLs": urls}
    assert rule_allows(non_resource("get", path), r) is allowed
    assert rule_allows(non_resource("post", path), r) is False


@pytest.mark.parametrize(("subject", "user", "ns", "applies"), [
    ({"kind": "User", "name": "alice"}, UserInfo("alice"), "", True),
    ({"kind": "User", "name": "alice"}, UserInfo("bob", groups=("alice",)), "", False),
    ({"kind": "Group", "name": "devs"}, UserInfo("bob", groups=("devs",)), "", True),
    ({"kind": "ServiceAccount", "name": "robot", "namespace": "ci"},
     UserInfo("system:serviceaccount:ci:robot"), "", True),
    ({"kind": "ServiceAccount", "name": "robot", "namespace": "ci"},
     UserInfo("system:serviceaccount:other:robot"), "", False),
    # A RoleBinding's SA subject without namespace means the binding's namespace.
    ({"kind": "ServiceAccount", "name": "robot"}, UserInfo("system:serviceaccount:ci:robot"), "ci", True),
    ({"kind": "ServiceAccount", "name": "robot"}, UserInfo("system:serviceaccount:ci:robot"), "", False),
    ({"kind": "Other", "name": "alice"}, UserInfo("alice"), "", False),
])
def test_applies_to_user(subject: dict[str, Any], user: UserInfo, ns: str, applies: bool) -> None:
    assert applies_to_user(user, subject, ns) is applies


# ---------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------

VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "escalate"]
GROUPS = ["", "apps", "batch", "rbac.authorization.k8s.io"]
RESOURCES = ["pods", "secrets", "deployments", "roles"]
SUBS = ["", "log", "status", "scale"]
NAMES = ["", "a", "b"]

requests = st.builds(lambda v, g, r, s, n: req(v, r, g, sub=s, name=n), st.sampled_from(VERBS),
                     st.sampled_from(GROUPS), st.sampled_from(RESOURCES), st.sampled_from(SUBS),
                     st.sampled_from(NAMES))
resource_items = st.one_of(st.sampled_from(RESOURCES),
                           st.builds(lambda r, s: f"{r}/{s}", st.sampled_from(RESOURCES), st.sampled_from(SUBS[1:])),
                           st.builds(lambda s: f"*/{s}", st.sampled_from(SUBS[1:])))
rules = st.builds(lambda v, g, r, n: rule(v, g, r, n),
                  st.lists(st.sampled_from(VERBS), min_size=1, max_size=3),
                  st.lists(st.sampled_from(GROUPS), min_size=1, max_size=2),
                  st.lists(resource_items, min_size=1, max_size=3),
                  st.lists(st.sampled_from(NAMES[1:]), max_size=2))


def widen(r: dict[str, Any], field: str) -> dict[str, Any]:
    out = dict(r)
    key = {"verbs": "verbs", "groups": "apiGroups", "resources": "resources"}.get(field)
    if key is not None:
        out[key] = ["*"]
    else:
        out.pop("resourceNames", None)
    return out


@given(rules, requests, st.sampled_from(["verbs", "groups", "resources", "names"]))
@settings(max_examples=200)
def test_wildcard_allows_what_narrower_allows(r: dict[str, Any], attrs: Attributes, field: str) -> None:
    if rule_allows(attrs, r):
        assert rule_allows(attrs, widen(r, field))


@given(rules, st.sampled_from(["verbs", "groups", "resources", "names"]))
@settings(max_examples=150)
def test_wildcard_covers_narrower(r: dict[str, Any], field: str) -> None:
    assert covers([widen(r, field)], [r])[0]
    assert covers([r], [r])[0]


@given(st.lists(rules, max_size=3), rules, requests)
@settings(max_examples=200)
def test_covering_implies_allowing(owner: list[dict[str, Any]], servant: dict[str, Any], attrs: Attributes) -> None:
    """If the owner's rules cover the servant's, every request the servant's rule
    allows is allowed by some owner rule (escalation checks are sound)."""
    if covers(owner, [servant])[0] and rule_allows(attrs, servant):
        assert any(rule_allows(attrs, o) for o in owner)


@given(rules, requests)
@settings(max_examples=150)
def test_breakdown_preserves_meaning(r: dict[str, Any], attrs: Attributes) -> None:
    assert rule_allows(attrs, r) == any(rule_allows(attrs, a) for a in breakdown_rule(r))


@given(rules)
def test_unnamed_requests_never_match_resource_names(r: dict[str, Any]) -> None:
    if r.get("resourceNames"):
        for verb in r["verbs"]:
            for group in r["apiGroups"]:
                for res in r["resources"]:
                    resource, _, sub = res.partition("/")
                    assert not rule_allows(req(verb, resource, group, sub=sub), r)


# ---------------------------------------------------------------------------
# Covering details and messages.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("owner", "servant", "ok"), [
    ([rule(["get"], [""], ["pods"])], [rule(["get"], [""], ["pods"], ["a"])], True),
    ([rule(["get"], [""], ["pods"], ["a"])], [rule(["get"], [""], ["pods"])], False),
    ([rule(["get"], [""], ["pods"], ["a", "b"])], [rule(["get"], [""], ["pods"], ["b"])], True),
    ([rule(["get"], [""], ["*/log"])], [rule(["get"], [""], ["pods/log"])], True),
    ([rule(["get"], [""], ["*/log"])], [rule(["get"], [""], ["pods"])], False),
    ([{"verbs": ["get"], "nonResourceURLs": ["/api/*"]}], [{"verbs": ["get"], "nonResourceURLs": ["/api/v1"]}], True),
    ([{"verbs": ["get"], "nonResourceURLs": ["/api"]}], [{"verbs": ["get"], "nonResourceURLs": ["/api/v1"]}], False),
    ([rule(["get", "list"], [""], ["pods"]), rule(["watch"], [""], ["pods"])],
     [rule(["get", "list", "watch"], [""], ["pods"])], True),
])
def test_covers(owner: list[dict[str, Any]], servant: list[dict[str, Any]], ok: bool) -> None:
    assert covers(owner, servant)[0] is ok


def test_escalation_message_compacts_missing_rules() -> None:
    _, missing = covers([rule(["get"], [""], ["pods"])],
                        [rule(["get", "list", "delete"], [""], ["pods", "secrets"]),
                         {"verbs": ["get"], "nonResourceURLs": ["/metrics"]}])
    assert [compact_string(r) for r in compact_rules(missing)] == [
        '{NonResourceURLs:["/metrics"], Verbs:["get"]}',
        '{APIGroups:[""], Resources:["pods"], Verbs:["list" "delete"]}',
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list" "delete"]}',
    ]
    msg = escalation_message(UserInfo("alice", groups=("devs", "system:authenticated")), missing, [])
    assert msg == (
        'user "alice" (groups=["devs" "system:authenticated"]) is attempting to grant RBAC permissions not '
        'currently held:\n'
        '{APIGroups:[""], Resources:["pods"], Verbs:["list" "delete"]}\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list" "delete"]}\n'
        '{NonResourceURLs:["/metrics"], Verbs:["get"]}')


# ---------------------------------------------------------------------------
# The resolver and authorizer over filled caches.
# ---------------------------------------------------------------------------


def authorizer(*objs: dict[str, Any]) -> RBACAuthorizer:
    a = RBACAuthorizer()
    caches = {"Role": a.roles, "ClusterRole": a.cluster_roles, "RoleBinding": a.role_bindings,
              "ClusterRoleBinding": a.cluster_role_bindings}
    for o in objs:
        caches[o["kind"]].put(o)
    for c in caches.values():
        c.synced = True
    return a


def obj(kind: str, name: str, ns: str | None = None, **fields: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if ns:
        md["namespace"] = ns
    return {"kind": kind, "metadata": md, **fields}


def ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


ALICE = UserInfo("alice", groups=("devs", "system:authenticated"))


def test_authorizer_bindings() -> None:
    a = authorizer(
        obj("ClusterRole", "reader", rules=[rule(["get", "list"], [""], ["pods"])]),
        obj("Role", "cm", "team", rules=[rule(["*"], [""], ["configmaps"])]),
        obj("RoleBinding", "b1", "team", roleRef=ref("ClusterRole", "reader"),
            subjects=[{"kind": "Group", "name": "devs"}]),
        obj("RoleBinding", "b2", "team", roleRef=ref("Role", "cm"), subjects=[{"kind": "User", "name": "alice"}]),
        obj("ClusterRoleBinding", "c1", roleRef=ref("ClusterRole", "reader"),
            subjects=[{"kind": "ServiceAccount", "name": "robot", "namespace": "ci"}]),
    )
    d = a.authorize(ALICE, req("list", "pods", ns="team"))
    assert d.allowed and d.reason == 'RBAC: allowed by RoleBinding "b1/team" of ClusterRole "reader" to Group "devs"'
    assert a.authorize(ALICE, req("delete", "configmaps", ns="team", name="x")).allowed
    # A RoleBinding grants only in its namespace.
    d = a.authorize(ALICE, req("list", "pods", ns="other"))
    assert not d.allowed and d.no_opinion and d.reason == ""
    assert not a.authorize(ALICE, req("list", "pods", ns="")).allowed
    robot = UserInfo("system:serviceaccount:ci:robot")
    assert a.authorize(robot, req("get", "pods", ns="anywhere", name="p")).allowed
    assert a.authorize(robot, req("list", "pods", ns="")).allowed


def test_missing_role_is_the_denial_reason() -> None:
    a = authorizer(obj("ClusterRoleBinding", "c", roleRef=ref("ClusterRole", "gone"),
                       subjects=[{"kind": "User", "name": "alice"}]))
    d = a.authorize(ALICE, req("get", "pods", ns=""))
    assert not d.allowed and d.no_opinion
    assert d.reason == 'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found'


def test_rules_for() -> None:
    a = authorizer(
        obj("ClusterRole", "mixed", rules=[rule(["get"], [""], ["pods"], ["p"]),
                                           {"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]),
        obj("ClusterRoleBinding", "c", roleRef=ref("ClusterRole", "mixed"),
            subjects=[{"kind": "Group", "name": "system:authenticated"}]),
        obj("RoleBinding", "r", "ns1", roleRef=ref("Role", "missing"), subjects=[{"kind": "User", "name": "alice"}]),
    )
    got = a.rules_for(ALICE, "ns1")
    assert got.resource_rules == [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                                   "resourceNames": ["p"]}]
    assert got.non_resource_rules == [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]
    assert not got.incomplete
    assert got.error == 'role.rbac.authorization.k8s.io "missing" not found'
    assert a.rules_for(UserInfo("nobody"), "ns1").resource_rules == []


def test_remembered_decisions_follow_changes() -> None:
    a = authorizer(obj("ClusterRole", "reader", rules=[rule(["get"], [""], ["pods"])]))
    attrs = req("get", "pods", name="p")
    assert not a.authorize(ALICE, attrs).allowed
    crb = obj("ClusterRoleBinding", "c", roleRef=ref("ClusterRole", "reader"),
              subjects=[{"kind": "User", "name": "alice"}])
    a.cluster_role_bindings.put(crb)
    assert a.authorize(ALICE, attrs).allowed
    # The role losing the rule, then the binding going, are seen at once too.
    a.cluster_roles.put(obj("ClusterRole", "reader", rules=[rule(["list"], [""], ["pods"])]))
    assert not a.authorize(ALICE, attrs).allowed
    assert a.authorize(ALICE, req("list", "pods")).allowed
    a.cluster_role_bindings.drop(crb)
    assert not a.authorize(ALICE, req("list", "pods")).allowed
    # Another user with the same name but other groups is decided on its own.
    assert a.authorize(UserInfo("bob", groups=("devs",)), attrs).allowed is False
