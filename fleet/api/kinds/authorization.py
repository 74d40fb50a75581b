"""`authorization.k8s.io/v1` access reviews: SubjectAccessReview, SelfSubjectAccessReview,
LocalSubjectAccessReview and SelfSubjectRulesReview.

These kinds are questions, not objects: a client POSTs one and gets it back with
`status` filled in (`kubectl auth can-i`, webhooks and controllers asking "may X do
Y?").  Nothing is stored, so the only verb is `create`; fleet/auth/reviews.py
answers them.  They are registered here so that discovery lists them exactly as
kube-apiserver does (`kubectl api-resources`, client-go's REST mapper) and the
generic request pipeline routes and authorizes them like every other kind.

This module also owns their validation, in kube-apiserver's words and field paths
(pkg/apis/authorization/validation): exactly one of `resourceAttributes` /
`nonResourceAttributes`, a subject for (Local)SubjectAccessReview, the field and
label selector attributes, an empty `metadata`, and LocalSubjectAccessReview's
namespace rules.
"""

from __future__ import annotations

from typing import Any

from fleet.api import validation as v
from fleet.api.registry import KindInfo

Cause = dict[str, str]

GROUP = "authorization.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"

SUBJECT_ACCESS_REVIEW = "SubjectAccessReview"
SELF_SUBJECT_ACCESS_REVIEW = "SelfSubjectAccessReview"
LOCAL_SUBJECT_ACCESS_REVIEW = "LocalSubjectAccessReview"
SELF_SUBJECT_RULES_REVIEW = "SelfSubjectRulesReview"

_SELECTOR_OPERATORS_NEEDING_VALUES = ("In", "NotIn")
_SELECTOR_OPERATORS_WITHOUT_VALUES = ("Exists", "DoesNotExist")


# ---------------------------------------------------------------------------
# Validation (pkg/apis/authorization/validation/validation.go, 1.32)
# ---------------------------------------------------------------------------


def _attributes_errors(spec: dict[str, Any]) -> list[Cause]:
    """The union rule shared by every access review: exactly one of the two."""
    out: list[Cause] = []
    res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if res is not None and non is not None:
        out.append(v.invalid("spec.nonResourceAttributes", non,
                             "cannot be specified in combination with resourceAttributes"))
    if res is None and non is None:
        # kube-apiserver reports the (nil) nonResourceAttributes as the bad value: "null".
        out.append(v.invalid("spec.resourceAttributes", "null",
                             "exactly one of nonResourceAttributes or resourceAttributes must be specified"))
    return out


def _requirement_values_errors(req: dict[str, Any], path: str) -> list[Cause]:
    op = req.get("operator")
    values = req.get("values") or []
    if op in _SELECTOR_OPERATORS_NEEDING_VALUES and not values:
        return [v.required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")]
    if op in _SELECTOR_OPERATORS_WITHOUT_VALUES and values:
        return [v.forbidden(f"{path}.values",
                            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")]
    # Unknown operators are allowed (AllowUnknownOperatorInRequirement): a newer
    # client may know operators this server does not.
    return []


def _selector_attributes_errors(sel: Any, path: str, *, label: bool) -> list[Cause]:
    if not isinstance(sel, dict):
        return []
    out: list[Cause] = []
    raw = sel.get("rawSelector") or ""
    reqs = sel.get("requirements") or []
    if raw and reqs:
        out.append(v.invalid(f"{path}.rawSelector", raw, "may not specified at the same time as requirements"))
    if not raw and not reqs:
        out.append(v.required(f"{path}.requirements",
                              f"when {path} is specified, requirements or rawSelector is required"))
    for i, req in enumerate(reqs if isinstance(reqs, list) else []):
        rp = f"{path}.requirements[{i}]"
        if not isinstance(req, dict):
            continue
        key = req.get("key") or ""
        if label:
            # metav1validation.ValidateLabelSelectorRequirement: the key is a label name.
            out.extend(v.validate_label_name(key, f"{rp}.key"))
        elif not key:
            out.append(v.required(f"{rp}.key", "must be specified"))
        out.extend(_requirement_values_errors(req, rp))
    return out


def _resource_attributes_errors(spec: dict[str, Any]) -> list[Cause]:
    res = spec.get("resourceAttributes")
    if not isinstance(res, dict):
        return []
    path = "spec.resourceAttributes"
    return (_selector_attributes_errors(res.get("fieldSelector"), f"{path}.fieldSelector", label=False)
            + _selector_attributes_errors(res.get("labelSelector"), f"{path}.labelSelector", label=True))


def _metadata_errors(md: dict[str, Any], *, keep_namespace: bool) -> list[Cause]:
    """The review's metadata must be empty (managedFields aside; a
    LocalSubjectAccessReview may name its namespace)."""
    rest = {k: val for k, val in md.items()
            if val not in (None, "", [], {}) and k != "managedFields"
            and not (keep_namespace and k == "namespace")}
    if not rest:
        return []
    detail = "must be empty except for namespace" if keep_namespace else "must be empty"
    return [v.invalid("metadata", md, detail)]


def validate_subject_access_review(obj: dict[str, Any]) -> list[Cause]:
    """ValidateSubjectAccessReview: one kind of attributes, a user or groups, empty metadata."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    out = _attributes_errors(spec)
    if not spec.get("user") and not spec.get("groups"):
        out.append(v.invalid("spec.user", spec.get("user") or "", "at least one of user or group must be specified"))
    out += _resource_attributes_errors(spec)
    out += _metadata_errors(obj.get("metadata") or {}, keep_namespace=False)
    return out


def validate_self_subject_access_review(obj: dict[str, Any]) -> list[Cause]:
    """ValidateSelfSubjectAccessReview: the subject is the requester, so no user check."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    out = _attributes_errors(spec) + _resource_attributes_errors(spec)
    out += _metadata_errors(obj.get("metadata") or {}, keep_namespace=False)
    return out


def validate_local_subject_access_review(obj: dict[str, Any]) -> list[Cause]:
    """ValidateLocalSubjectAccessReview: a SubjectAccessReview about its own namespace only."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    md = obj.get("metadata") or {}
    out = _attributes_errors(spec)
    if not spec.get("user") and not spec.get("groups"):
        out.append(v.invalid("spec.user", spec.get("user") or "", "at least one of user or group must be specified"))
    out += _resource_attributes_errors(spec)
    out += _metadata_errors(md, keep_namespace=True)
    res = spec.get("resourceAttributes")
    if isinstance(res, dict) and (res.get("namespace") or "") != (md.get("namespace") or ""):
        out.append(v.invalid("spec.resourceAttributes.namespace", res.get("namespace") or "",
                             "must match metadata.namespace"))
    if spec.get("nonResourceAttributes") is not None:
        out.append(v.invalid("spec.nonResourceAttributes", spec["nonResourceAttributes"],
                             "disallowed on this kind of request"))
    return out


def _never_stored(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """Never reached through the generic REST handlers (reviews.py answers these kinds);
    kept so every kind has a validator, which generic code may call."""
    return []


def _review(kind: str, plural: str, *, namespaced: bool = False) -> KindInfo:
    return KindInfo(group=GROUP, version=VERSION, kind=kind, plural=plural, singular=kind.lower(),
                    namespaced=namespaced, verbs=("create",), validate=_never_stored)


LOCAL_SUBJECT_ACCESS_REVIEWS = _review(LOCAL_SUBJECT_ACCESS_REVIEW, "localsubjectaccessreviews",
                                       namespaced=True)
SELF_SUBJECT_ACCESS_REVIEWS = _review(SELF_SUBJECT_ACCESS_REVIEW, "selfsubjectaccessreviews")
SELF_SUBJECT_RULES_REVIEWS = _review(SELF_SUBJECT_RULES_REVIEW, "selfsubjectrulesreviews")
SUBJECT_ACCESS_REVIEWS = _review(SUBJECT_ACCESS_REVIEW, "subjectaccessreviews")

# kube-apiserver lists a group's resources sorted by name.
KINDS = (LOCAL_SUBJECT_ACCESS_REVIEWS, SELF_SUBJECT_ACCESS_REVIEWS, SELF_SUBJECT_RULES_REVIEWS,
         SUBJECT_ACCESS_REVIEWS)

__all__ = [
    "API_VERSION", "GROUP", "KINDS", "LOCAL_SUBJECT_ACCESS_REVIEW", "LOCAL_SUBJECT_ACCESS_REVIEWS",
    "SELF_SUBJECT_ACCESS_REVIEW", "SELF_SUBJECT_ACCESS_REVIEWS", "SELF_SUBJECT_RULES_REVIEW",
    "SELF_SUBJECT_RULES_REVIEWS", "SUBJECT_ACCESS_REVIEW", "SUBJECT_ACCESS_REVIEWS", "VERSION",
    "validate_local_subject_access_review", "validate_self_subject_access_review",
    "validate_subject_access_review",
]
