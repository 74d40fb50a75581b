"""RBAC escalation prevention: nobody grants permissions they do not hold.

kube-apiserver checks this in the RBAC REST storage (pkg/registry/rbac/*/policybased);
Fleet runs the same checks as a validating admission plugin, first in the chain,
on creates and updates of the four RBAC kinds:

* **Role / ClusterRole**: allowed when the requester is in `system:masters`, or
  may `escalate` that role (`roles`/`clusterroles` in rbac.authorization.k8s.io,
  by name), or already holds every permission the role's rules grant (in the
  role's namespace; cluster-wide for a ClusterRole).  Setting or changing a
  ClusterRole's `aggregationRule` needs `*` on everything, since it can gather
  anything ("must have cluster-admin privileges to use the aggregationRule").
* **RoleBinding / ClusterRoleBinding**: allowed when the requester is in
  `system:masters`, or may `bind` the referenced role (checked in the binding's
  namespace, so `bind` can be delegated per namespace and per role name), or holds
  every permission of the referenced role.  A reference to a missing role is a 404.

Updates that touch only metadata the garbage collector manages (owner references,
finalizers) are never escalations.  Refusals are 403s in Kubernetes' words:
`roles.rbac.authorization.k8s.io "x" is forbidden: user "alice" (groups=[...]) is
attempting to grant RBAC permissions not currently held:` followed by the missing
rules, one per line.
"""

from __future__ import annotations

import copy
from typing import Any

from fleet.api import errors
from fleet.auth import SYSTEM_MASTERS, Attributes, Authorizer, UserInfo
from fleet.auth.rbac import FULL_AUTHORITY, GROUP, RBACAuthorizer, covers, escalation_message

ROLE_RESOURCES = ("roles", "clusterroles")
BINDING_RESOURCES = ("rolebindings", "clusterrolebindings")


def only_gc_fields_changed(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """IsOnlyMutatingGCFields: the objects differ in ownerReferences/finalizers at most."""
    a, b = copy.deepcopy(new), copy.deepcopy(old)
    for o in (a, b):
        md = o.get("metadata") if isinstance(o.get("metadata"), dict) else {}
        for f in ("ownerReferences", "finalizers", "resourceVersion", "managedFields", "generation"):
            md.pop(f, None)
    return a == b


class RBACEscalation:
    """The escalation check, as a validating admission plugin.

    `authorizer` is the server's whole authorizer (the union), asked about
    `escalate` / `bind`; `resolver` the RBAC authorizer, whose rules are what the
    requester holds."""

    name = "RBACEscalation"

    def __init__(self, authorizer: Authorizer, resolver: RBACAuthorizer) -> None:
        self.authorizer = authorizer
        self.resolver = resolver

    async def validate(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None) -> None:
        self.check(attrs, user, obj, old)

    def check(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any] | None,
              old: dict[str, Any] | None) -> None:
        """Raise Forbidden (or NotFound) when the write would escalate."""
        if attrs.group != GROUP or attrs.subresource or obj is None:
            return
        if attrs.verb not in ("create", "update", "patch"):
            return
        if attrs.resource not in ROLE_RESOURCES + BINDING_RESOURCES:
            return
        if SYSTEM_MASTERS in user.groups:
            return
        if old is not None and only_gc_fields_changed(obj, old):
            return
        name = (obj.get("metadata") or {}).get("name") or attrs.name
        qualified = f"{attrs.resource}.{GROUP}"
        if attrs.resource in ROLE_RESOURCES:
            self._check_role(attrs, user, obj, old, name, qualified)
        else:
            self._check_binding(attrs, user, obj, name, qualified)

    def _allowed(self, user: UserInfo, verb: str, resource: str, namespace: str, name: str) -> bool:
        d = self.authorizer.authorize(user, Attributes(verb, GROUP, "*", resource, "", namespace, name))
        return d.allowed

    def _confirm(self, user: UserInfo, namespace: str, rules: list[dict[str, Any]], name: str,
                 qualified: str, message: str | None = None) -> None:
        owner, errs = self.resolver.policy_rules_for(user, namespace)
        ok, missing = covers(owner, rules)
        if not ok:
            msg = message or escalation_message(user, missing, errs)
            raise errors.Forbidden(f'{qualified} "{name}" is forbidden: {msg}', name=name, group=GROUP,
                                   kind=qualified.split(".", 1)[0])

    def _check_role(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any], old: dict[str, Any] | None,
                    name: str, qualified: str) -> None:
        if self._allowed(user, "escalate", attrs.resource, attrs.namespace, name):
            return
        rules = [r for r in obj.get("rules") or [] if isinstance(r, dict)]
        self._confirm(user, attrs.namespace, rules, name, qualified)
        agg = obj.get("aggregationRule")
        if agg and (old is None or old.get("aggregationRule") != agg):
            self._confirm(user, attrs.namespace, list(FULL_AUTHORITY), name, qualified,
                          "must have cluster-admin privileges to use the aggregationRule")

    def _check_binding(self, attrs: Attributes, user: UserInfo, obj: dict[str, Any], name: str,
                       qualified: str) -> None:
        ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), dict) else {}
        assert isinstance(ref, dict)
        kind, role = ref.get("kind"), str(ref.get("name") or "")
        resource = {"ClusterRole": "clusterroles", "Role": "roles"}.get(str(kind))
        if resource is None:
            return  # validation refuses it
        if self._allowed(user, "bind", resource, attrs.namespace, role):
            return
        rules, err = self.resolver.role_ref_rules(ref, attrs.namespace)
        if err is not None:
            singular = "clusterroles" if kind == "ClusterRole" else "roles"
            raise errors.NotFound(err, name=role, group=GROUP, kind=singular)
        self._confirm(user, attrs.namespace, rules, name, qualified)


__all__ = ["RBACEscalation", "only_gc_fields_changed"]
