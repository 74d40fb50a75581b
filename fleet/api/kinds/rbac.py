"""`rbac.authorization.k8s.io/v1`: Role, ClusterRole, RoleBinding, ClusterRoleBinding.

The objects only: who may do what is decided by fleet/auth/rbac.py from them,
escalation prevention (a requester may grant only what it holds) is the
admission check there, and aggregated ClusterRoles are filled in by
fleet/controllers/clusterroleaggregation.py.

Defaulting, validation and tables follow kube-apiserver 1.32
(pkg/apis/rbac/v1/defaults.go, pkg/apis/rbac/validation, printers.go):

* a binding's `roleRef.apiGroup` and a User/Group subject's `apiGroup` default to
  `rbac.authorization.k8s.io`; a ServiceAccount subject's group is "";
* a rule needs verbs; a resource rule needs apiGroups and resources; a rule has
  either resources or nonResourceURLs, and nonResourceURLs only in a ClusterRole;
* `roleRef` never changes once a binding exists ("cannot change roleRef": delete
  and recreate, so a binding cannot be silently re-pointed at a bigger role);
* names are path segments (RBAC names may hold `:` — `system:node` — but no `/`).
"""

from __future__ import annotations

import json
from typing import Any

from fleet.api import meta
from fleet.api import validation as v
from fleet.api.errors import cause
from fleet.api.kinds._common import col, d, dicts, lst, table
from fleet.api.kinds.ingress import is_path_segment_name
from fleet.api.registry import NAME_COLUMN, Column, KindInfo

Cause = dict[str, str]

GROUP = "rbac.authorization.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
USER_KIND, GROUP_KIND, SERVICE_ACCOUNT_KIND = "User", "Group", "ServiceAccount"
AUTOUPDATE_ANNOTATION = "rbac.authorization.kubernetes.io/autoupdate"


# ---------------------------------------------------------------------------
# Defaulting.
# ---------------------------------------------------------------------------


def default_subject(subject: dict[str, Any]) -> None:
    """SetDefaults_Subject: User and Group subjects live in the RBAC group."""
    if not subject.get("apiGroup"):
        if subject.get("kind") in (USER_KIND, GROUP_KIND):
            subject["apiGroup"] = GROUP
        elif subject.get("kind") == SERVICE_ACCOUNT_KIND:
            subject["apiGroup"] = ""


def default_binding(obj: dict[str, Any]) -> None:
    ref = obj.get("roleRef")
    if isinstance(ref, dict) and not ref.get("apiGroup"):
        ref["apiGroup"] = GROUP
    for s in dicts(lst(obj, "subjects")):
        default_subject(s)


# ---------------------------------------------------------------------------
# Validation.
# ---------------------------------------------------------------------------


def _go_strings(values: list[str]) -> str:
    """Go's `%#v` of a []string, as field.Invalid prints a slice."""
    return "[]string{" + ", ".join(json.dumps(x) for x in values) + "}"


def _invalid_raw(path: str, rendered: str, detail: str) -> Cause:
    return cause(path, f"Invalid value: {rendered}: {detail}", "FieldValueInvalid")


def _strings(rule: dict[str, Any], key: str) -> list[str]:
    return [s for s in lst(rule, key) if isinstance(s, str)]


def validate_policy_rule(rule: dict[str, Any], namespaced: bool, path: str) -> list[Cause]:
    """ValidatePolicyRule (also used by types that embed a rule)."""
    out: list[Cause] = []
    if not _strings(rule, "verbs"):
        out.append(v.required(f"{path}.verbs", "verbs must contain at least one value"))
    urls = _strings(rule, "nonResourceURLs")
    if urls:
        if namespaced:
            out.append(_invalid_raw(f"{path}.nonResourceURLs", _go_strings(urls),
                                    "namespaced rules cannot apply to non-resource URLs"))
        if lst(rule, "apiGroups") or lst(rule, "resources") or lst(rule, "resourceNames"):
            out.append(_invalid_raw(f"{path}.nonResourceURLs", _go_strings(urls),
                                    "rules cannot apply to both regular resources and non-resource URLs"))
        return out
    if not lst(rule, "apiGroups"):
        out.append(v.required(f"{path}.apiGroups", "resource rules must supply at least one api group"))
    if not lst(rule, "resources"):
        out.append(v.required(f"{path}.resources", "resource rules must supply at least one resource"))
    return out


def _meta_errors(obj: dict[str, Any], namespaced: bool) -> list[Cause]:
    return v.validate_object_meta(obj.get("metadata"), namespaced=namespaced, name_validator=is_path_segment_name)


def _rules_errors(obj: dict[str, Any], namespaced: bool) -> list[Cause]:
    out: list[Cause] = []
    for i, rule in enumerate(lst(obj, "rules")):
        if isinstance(rule, dict):
            out += validate_policy_rule(rule, namespaced, f"rules[{i}]")
    return out


def validate_role(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    return _meta_errors(obj, True) + _rules_errors(obj, True)


def validate_cluster_role(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    out = _meta_errors(obj, False) + _rules_errors(obj, False)
    agg = obj.get("aggregationRule")
    if isinstance(agg, dict):
        selectors = lst(agg, "clusterRoleSelectors")
        if not selectors:
            out.append(v.required("aggregationRule.clusterRoleSelectors",
                                  "at least one clusterRoleSelector required if aggregationRule is non-nil"))
        for i, sel in enumerate(selectors):
            out += v.validate_label_selector(sel, f"aggregationRule.clusterRoleSelectors[{i}]")
    return out


def validate_subject(subject: dict[str, Any], namespaced: bool, path: str) -> list[Cause]:
    """ValidateRoleBindingSubject."""
    out: list[Cause] = []
    name = subject.get("name")
    if not name:
        out.append(v.required(f"{path}.name"))
    kind, group = subject.get("kind"), subject.get("apiGroup") or ""
    if kind == SERVICE_ACCOUNT_KIND:
        if isinstance(name, str) and name:
            out += [v.invalid(f"{path}.name", name, m) for m in v.is_dns1123_subdomain(name)]
        if group:
            out.append(v.not_supported(f"{path}.apiGroup", group, [""]))
        if not namespaced and not subject.get("namespace"):
            out.append(v.required(f"{path}.namespace"))
    elif kind in (USER_KIND, GROUP_KIND):
        if group != GROUP:
            out.append(v.not_supported(f"{path}.apiGroup", group, [GROUP]))
    else:
        out.append(v.not_supported(f"{path}.kind", kind, [SERVICE_ACCOUNT_KIND, USER_KIND, GROUP_KIND]))
    return out


def _binding_errors(obj: dict[str, Any], old: dict[str, Any] | None, namespaced: bool) -> list[Cause]:
    out = _meta_errors(obj, namespaced)
    ref = d(obj, "roleRef")
    if ref.get("apiGroup") != GROUP:
        out.append(v.not_supported("roleRef.apiGroup", ref.get("apiGroup") or "", [GROUP]))
    kinds = ["Role", "ClusterRole"] if namespaced else ["ClusterRole"]
    if ref.get("kind") not in kinds:
        out.append(v.not_supported("roleRef.kind", ref.get("kind") or "", kinds))
    name = ref.get("name")
    if not name:
        out.append(v.required("roleRef.name"))
    elif isinstance(name, str):
        out += [v.invalid("roleRef.name", name, m) for m in is_path_segment_name(name)]
    for i, s in enumerate(lst(obj, "subjects")):
        if isinstance(s, dict):
            out += validate_subject(s, namespaced, f"subjects[{i}]")
    if old is not None and d(old, "roleRef") != ref:
        rendered = (f'rbac.RoleRef{{APIGroup:{json.dumps(str(ref.get("apiGroup") or ""))}, '
                    f'Kind:{json.dumps(str(ref.get("kind") or ""))}, Name:{json.dumps(str(ref.get("name") or ""))}}}')
        out.append(_invalid_raw("roleRef", rendered, "cannot change roleRef"))
    return out


def validate_role_binding(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    return _binding_errors(obj, old, True)


def validate_cluster_role_binding(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    return _binding_errors(obj, old, False)


# ---------------------------------------------------------------------------
# Tables (printers.go: printRole / printRoleBinding and the cluster variants).
# ---------------------------------------------------------------------------


def created_at(obj: dict[str, Any]) -> str:
    """`CreationTimestamp.UTC().Format(time.RFC3339)`."""
    t = meta.parse_time(d(obj, "metadata").get("creationTimestamp"))
    return t.strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else "0001-01-01T00:00:00Z"


def subjects_strings(obj: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """rbac.SubjectsStrings: users, groups and `namespace:name` service accounts."""
    users: list[str] = []
    groups: list[str] = []
    sas: list[str] = []
    for s in dicts(lst(obj, "subjects")):
        kind, name = s.get("kind"), str(s.get("name") or "")
        if kind == USER_KIND:
            users.append(name)
        elif kind == GROUP_KIND:
            groups.append(name)
        elif kind == SERVICE_ACCOUNT_KIND:
            sas.append(f"{s.get('namespace') or ''}:{name}")
    return users, groups, sas


ROLE_COLUMNS: tuple[Column, ...] = (
    NAME_COLUMN,
    col("Created At", created_at, type="date",
        description="CreationTimestamp is a timestamp representing the server time when this object was created."),
)
BINDING_COLUMNS = table(
    col("Role", lambda o: f"{d(o, 'roleRef').get('kind', '')}/{d(o, 'roleRef').get('name', '')}",
        description="RoleRef can reference a Role in the current namespace or a ClusterRole in the global "
        "namespace."),
    wide=(
        col("Users", lambda o: ", ".join(subjects_strings(o)[0]), priority=1, description="Users in the roleBinding"),
        col("Groups", lambda o: ", ".join(subjects_strings(o)[1]), priority=1,
            description="Groups in the roleBinding"),
        col("ServiceAccounts", lambda o: ", ".join(subjects_strings(o)[2]), priority=1,
            description="ServiceAccounts in the roleBinding"),
    ),
)

ROLE = KindInfo(group=GROUP, version=VERSION, kind="Role", plural="roles", singular="role", namespaced=True,
                columns_override=ROLE_COLUMNS, validate=validate_role)
CLUSTER_ROLE = KindInfo(group=GROUP, version=VERSION, kind="ClusterRole", plural="clusterroles",
                        singular="clusterrole", namespaced=False, columns_override=ROLE_COLUMNS,
                        validate=validate_cluster_role)
ROLE_BINDING = KindInfo(group=GROUP, version=VERSION, kind="RoleBinding", plural="rolebindings",
                        singular="rolebinding", namespaced=True, columns_override=BINDING_COLUMNS,
                        default=default_binding, validate=validate_role_binding)
CLUSTER_ROLE_BINDING = KindInfo(group=GROUP, version=VERSION, kind="ClusterRoleBinding",
                                plural="clusterrolebindings", singular="clusterrolebinding", namespaced=False,
                                columns_override=BINDING_COLUMNS, default=default_binding,
                                validate=validate_cluster_role_binding)

KINDS = (CLUSTER_ROLE_BINDING, CLUSTER_ROLE, ROLE_BINDING, ROLE)

__all__ = ["API_VERSION", "AUTOUPDATE_ANNOTATION", "CLUSTER_ROLE", "CLUSTER_ROLE_BINDING", "GROUP", "KINDS",
           "ROLE", "ROLE_BINDING", "created_at", "default_binding", "subjects_strings",
           "validate_policy_rule"]
