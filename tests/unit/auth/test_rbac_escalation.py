"""Escalation prevention (fleet/auth/escalation.py): roles only with held permissions or
`escalate`, bindings only with the role's permissions or `bind`, masters exempt,
aggregationRule only with full authority, GC-only updates never checked."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api import errors
from fleet.auth import ADMIN, Attributes, MastersBypass, UnionAuthorizer, UserInfo
from fleet.auth.escalation import RBACEscalation, only_gc_fields_changed
from tests.unit.auth.test_rbac_rules import authorizer, obj, ref, rule

G = "rbac.authorization.k8s.io"
DAVE = UserInfo("dave", groups=("system:authenticated",))


def plugin(*objs: dict[str, Any]) -> RBACEscalation:
    rbac = authorizer(*objs)
    return RBACEscalation(UnionAuthorizer(MastersBypass(), rbac), rbac)


def write(resource: str, verb: str = "create", ns: str = "default") -> Attributes:
    return Attributes(verb, G, "v1", resource, "", ns, "")


def role(name: str, *rules: dict[str, Any], ns: str = "default") -> dict[str, Any]:
    return {"kind": "Role", "metadata": {"name": name, "namespace": ns}, "rules": list(rules)}


# dave: pods get/list in default, via a RoleBinding to a ClusterRole.
BASE = (
    obj("ClusterRole", "pod-reader", rules=[rule(["get", "list"], [""], ["pods"])]),
    obj("RoleBinding", "dave", "default", roleRef=ref("ClusterRole", "pod-reader"),
        subjects=[{"kind": "User", "name": "dave"}]),
    obj("ClusterRole", "secret-admin", rules=[rule(["*"], [""], ["secrets"])]),
)


def test_role_within_held_permissions() -> None:
    p = plugin(*BASE)
    p.check(write("roles"), DAVE, role("r", rule(["get"], [""], ["pods"])), None)


def test_role_beyond_held_permissions() -> None:
    p = plugin(*BASE)
    with pytest.raises(errors.Forbidden) as e:
        p.check(write("roles"), DAVE, role("r", rule(["get", "delete"], [""], ["pods", "secrets"])), None)
    assert e.value.args[0] == (
        'roles.rbac.authorization.k8s.io "r" is forbidden: user "dave" (groups=["system:authenticated"]) is '
        'attempting to grant RBAC permissions not currently held:\n'
        '{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "delete"]}')
    # Held in default, not in another namespace.
    with pytest.raises(errors.Forbidden):
        p.check(write("roles", ns="other"), DAVE, role("r", rule(["get"], [""], ["pods"]), ns="other"), None)


def test_escalate_verb_allows_any_role() -> None:
    p = plugin(*BASE, obj("ClusterRole", "esc", rules=[rule(["escalate"], [G], ["roles"])]),
               obj("RoleBinding", "esc", "default", roleRef=ref("ClusterRole", "esc"),
                   subjects=[{"kind": "User", "name": "dave"}]))
    p.check(write("roles"), DAVE, role("r", rule(["*"], ["*"], ["*"])), None)
    # ... in that namespace only.
    with pytest.raises(errors.Forbidden):
        p.check(write("roles", ns="other"), DAVE, role("r", rule(["*"], ["*"], ["*"]), ns="other"), None)


def test_masters_and_gc_only_updates_pass() -> None:
    p = plugin(*BASE)
    big = role("r", rule(["*"], ["*"], ["*"]))
    p.check(write("roles"), ADMIN, big, None)
    old = role("r", rule(["*"], ["*"], ["*"]))
    new = role("r", rule(["*"], ["*"], ["*"]))
    new["metadata"]["finalizers"] = ["x"]
    assert only_gc_fields_changed(new, old)
    p.check(write("roles", "update"), DAVE, new, old)
    changed = role("r", rule(["*"], ["*"], ["*"]))
    changed["metadata"]["labels"] = {"a": "b"}
    with pytest.raises(errors.Forbidden):
        p.check(write("roles", "update"), DAVE, changed, old)


def test_aggregation_rule_needs_full_authority() -> None:
    p = plugin(*BASE)
    cr = {"kind": "ClusterRole", "metadata": {"name": "agg"}, "rules": [],
          "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}}
    with pytest.raises(errors.Forbidden) as e:
        p.check(write("clusterroles", ns=""), DAVE, cr, None)
    assert e.value.args[0] == ('clusterroles.rbac.authorization.k8s.io "agg" is forbidden: must have cluster-admin '
                               'privileges to use the aggregationRule')
    p.check(write("clusterroles", ns=""), ADMIN, cr, None)
    # `escalate` on clusterroles skips every check (as kube-apiserver's storage does).
    p = plugin(*BASE, obj("ClusterRole", "esc", rules=[rule(["escalate"], [G], ["clusterroles"])]),
               obj("ClusterRoleBinding", "esc", roleRef=ref("ClusterRole", "esc"),
                   subjects=[{"kind": "User", "name": "dave"}]))
    p.check(write("clusterroles", ns=""), DAVE, cr, None)


def binding(role_kind: str, name: str, ns: str = "default") -> dict[str, Any]:
    return {"kind": "RoleBinding", "metadata": {"name": "b", "namespace": ns}, "roleRef": ref(role_kind, name),
            "subjects": [{"kind": "User", "name": "eve"}]}


def test_binding_needs_held_permissions_or_bind() -> None:
    p = plugin(*BASE)
    p.check(write("rolebindings"), DAVE, binding("ClusterRole", "pod-reader"), None)
    with pytest.raises(errors.Forbidden) as e:
        p.check(write("rolebindings"), DAVE, binding("ClusterRole", "secret-admin"), None)
    assert e.value.args[0].startswith('rolebindings.rbac.authorization.k8s.io "b" is forbidden: user "dave"')
    with pytest.raises(errors.NotFound) as nf:
        p.check(write("rolebindings"), DAVE, binding("Role", "nope"), None)
    assert nf.value.args[0] == 'role.rbac.authorization.k8s.io "nope" not found'

    # `bind` on that role by name, in that namespace.
    p = plugin(*BASE, obj("ClusterRole", "binder", rules=[rule(["bind"], [G], ["clusterroles"], ["secret-admin"])]),
               obj("RoleBinding", "binder", "default", roleRef=ref("ClusterRole", "binder"),
                   subjects=[{"kind": "User", "name": "dave"}]))
    p.check(write("rolebindings"), DAVE, binding("ClusterRole", "secret-admin"), None)
    with pytest.raises(errors.Forbidden):
        p.check(write("rolebindings", ns="other"), DAVE, binding("ClusterRole", "secret-admin", "other"), None)


def test_other_writes_are_not_checked() -> None:
    p = plugin()
    p.check(Attributes("create", "", "v1", "pods", "", "default", ""), DAVE, {"metadata": {"name": "x"}}, None)
    p.check(write("roles", "delete"), DAVE, None, role("r"))
