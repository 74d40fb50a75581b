"""Access reviews: the authorization.k8s.io/v1 questions "may this subject do that?".

Four kinds, each POSTed, answered and never stored (pkg/registry/authorization in
kube-apiserver):

* **SubjectAccessReview** (cluster-scoped): may the user/groups/uid/extra named in
  `spec` do what `spec.resourceAttributes` or `spec.nonResourceAttributes` describe?
* **LocalSubjectAccessReview** (namespaced): the same, about the path's namespace only.
* **SelfSubjectAccessReview**: the same question about the requester itself
  (`kubectl auth can-i create pods`; with `--as bob` the requester *is* bob, the
  impersonation stage having run first).
* **SelfSubjectRulesReview**: everything the requester may do in `spec.namespace`
  (`kubectl auth can-i --list`), from a `RuleResolver`.

Each review runs through the server's own authorizer (the union `--authorization-mode`
assembles, `system:masters` bypass included), so the answer is exactly what the same
request would get.  `status.allowed` is an allow; `status.denied` only an explicit deny
(an authorizer that *refused*, not one that had no opinion), as kube-apiserver reports.

The body goes through the generic pipeline's decoding steps (JSON, YAML or the
protobuf kubectl sends; apiVersion/kind check; fieldValidation; type check), then the
kind's validation (fleet/api/kinds/authorization.py) — 422 in kube-apiserver's words —
and the answer is the object back with its `status`, 201 Created.

Rules: `RuleResolver.rules_for(user, namespace) -> RulesResult` is what an authorizer
that can enumerate its grants implements (RBAC's RBACAuthorizer; AlwaysAllow's rules
are `*`).  `UnionRuleResolver` joins them as kube-apiserver's union does, and shows a
`system:masters` user the `*` rules cluster-admin's binding gives it in Kubernetes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from fleet.api import errors
from fleet.api.kinds import authorization as kinds
from fleet.api.registry import KindInfo
from fleet.auth import SYSTEM_MASTERS, Attributes, Authorizer, Decision, UserInfo, non_resource
from fleet.server.http import Req, Resp
from fleet.server.request_params import decode_request, warning_headers
from fleet.server.rest_base import ResourceBase
from fleet.server.routes import Route

Handler = Callable[[Req, Route, str, UserInfo, KindInfo], Awaitable[Resp]]

# The rules AlwaysAllow reports, and cluster-admin's (what a system:masters user sees).
ALL_RESOURCES_RULE: dict[str, list[str]] = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
ALL_NON_RESOURCE_URLS_RULE: dict[str, list[str]] = {"verbs": ["*"], "nonResourceURLs": ["*"]}


# ---------------------------------------------------------------------------
# Rule resolution (SelfSubjectRulesReview)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RulesResult:
    """What a subject may do in a namespace, in SelfSubjectRulesReview's JSON shapes:
    `resource_rules` are ResourceRule dicts (verbs, apiGroups, resources, resourceNames),
    `non_resource_rules` NonResourceRule dicts (verbs, nonResourceURLs).  `incomplete`:
    the list may miss grants (an authorizer could not enumerate them; `error` says why)."""

    resource_rules: list[dict[str, Any]] = field(default_factory=list)
    non_resource_rules: list[dict[str, Any]] = field(default_factory=list)
    incomplete: bool = False
    error: str = ""


class RuleResolver(Protocol):
    """An authorizer that can list what a user may do (kube's authorizer.RuleResolver).

    Any object with these four attributes is accepted as its result (the RBAC
    authorizer may return its own RulesResult class)."""

    def rules_for(self, user: UserInfo, namespace: str) -> RulesResult: ...


class AllowAllRules:
    """AlwaysAllow's rules: everything, everywhere."""

    def rules_for(self, user: UserInfo, namespace: str) -> RulesResult:
        return RulesResult([dict(ALL_RESOURCES_RULE)], [dict(ALL_NON_RESOURCE_URLS_RULE)])


def _normalized(rule: dict[str, Any]) -> dict[str, Any]:
    """A rule without its empty lists (their JSON form omits them), for comparison."""
    return {k: list(val) for k, val in rule.items() if val}


class UnionRuleResolver:
    """The resolvers' rules joined in order (kube's unionAuthzRulesHandler): rules
    concatenated, incomplete if any is, errors aggregated.

    A `system:masters` user also gets the `*` rules unless a resolver already reports
    them: in Kubernetes that group is bound to cluster-admin, which is what
    `kubectl auth can-i --list` shows for it; here the bypass authorizer grants it, so
    the rules are added (once: kubectl would print a duplicate as `[* *]`)."""

    def __init__(self, *resolvers: RuleResolver, masters: bool = True) -> None:
        self.resolvers = list(resolvers)
        self.masters = masters

    def rules_for(self, user: UserInfo, namespace: str) -> RulesResult:
        res: list[dict[str, Any]] = []
        non: list[dict[str, Any]] = []
        incomplete = False
        errs: list[str] = []
        for r in self.resolvers:
            got = r.rules_for(user, namespace)
            res.extend(got.resource_rules)
            non.extend(got.non_resource_rules)
            incomplete = incomplete or got.incomplete
            if got.error:
                errs.append(got.error)
        if self.masters and SYSTEM_MASTERS in user.groups:
            if _normalized(ALL_RESOURCES_RULE) not in [_normalized(r) for r in res]:
                res.insert(0, dict(ALL_RESOURCES_RULE))
            if _normalized(ALL_NON_RESOURCE_URLS_RULE) not in [_normalized(r) for r in non]:
                non.insert(0, dict(ALL_NON_RESOURCE_URLS_RULE))
        return RulesResult(res, non, incomplete, aggregate_errors(errs))


def aggregate_errors(errs: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error(): one message alone, several as `[a, b]`."""
    if not errs:
        return ""
    if len(errs) == 1:
        return errs[0]
    return "[" + ", ".join(errs) + "]"


def resolvers_of(authorizers: Iterable[Authorizer]) -> list[RuleResolver]:
    """The authorizers that can enumerate their rules (those with `rules_for`)."""
    return [cast(RuleResolver, a) for a in authorizers if callable(getattr(a, "rules_for", None))]


# ---------------------------------------------------------------------------
# Pure decisions: attributes in, status out
# ---------------------------------------------------------------------------


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def resource_attributes(ra: dict[str, Any]) -> Attributes:
    """authorizationutil.ResourceAttributesFrom: an empty version matches every version."""
    return Attributes(verb=_s(ra.get("verb")), group=_s(ra.get("group")),
                      version=_s(ra.get("version")) or "*", resource=_s(ra.get("resource")),
                      subresource=_s(ra.get("subresource")), namespace=_s(ra.get("namespace")),
                      name=_s(ra.get("name")))


def spec_attributes(spec: dict[str, Any]) -> Attributes:
    """The request a (validated) review spec describes."""
    ra = spec.get("resourceAttributes")
    if isinstance(ra, dict):
        return resource_attributes(ra)
    na = spec.get("nonResourceAttributes")
    na = na if isinstance(na, dict) else {}
    return non_resource(_s(na.get("verb")), _s(na.get("path")))


def subject(spec: dict[str, Any]) -> UserInfo:
    """The user a (Local)SubjectAccessReview asks about, exactly as given: no
    system:authenticated is added ("what if bob were in no group at all?")."""
    extra = spec.get("extra")
    extra = {k: [str(x) for x in val] for k, val in extra.items() if isinstance(val, list)} \
        if isinstance(extra, dict) else {}
    groups = tuple(g for g in spec.get("groups") or [] if isinstance(g, str))
    return UserInfo(_s(spec.get("user")), _s(spec.get("uid")), groups, extra)


def review_status(decision: Decision) -> dict[str, Any]:
    """SubjectAccessReviewStatus: `denied` only for an explicit deny (omitted when false,
    as are an empty reason and evaluationError)."""
    status: dict[str, Any] = {"allowed": decision.allowed}
    if not decision.allowed and not decision.no_opinion:
        status["denied"] = True
    if decision.reason:
        status["reason"] = decision.reason
    return status


def decide(authorizer: Authorizer, user: UserInfo, spec: dict[str, Any]) -> dict[str, Any]:
    """The status a review of `spec` for `user` gets."""
    return review_status(authorizer.authorize(user, spec_attributes(spec)))


def rules_status(result: Any) -> dict[str, Any]:
    """SubjectRulesReviewStatus from a RulesResult (lists never null, as kube answers)."""
    status: dict[str, Any] = {
        "resourceRules": [_normalized_rule(r, ("verbs", "apiGroups", "resources", "resourceNames"))
                          for r in result.resource_rules],
        "nonResourceRules": [_normalized_rule(r, ("verbs", "nonResourceURLs"))
                             for r in result.non_resource_rules],
        "incomplete": bool(result.incomplete),
    }
    if result.error:
        status["evaluationError"] = str(result.error)
    return status


def _normalized_rule(rule: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    # `verbs` is always present (no omitempty); the other lists are left out when empty.
    out: dict[str, Any] = {"verbs": list(rule.get("verbs") or [])}
    for k in keys[1:]:
        if rule.get(k):
            out[k] = list(rule[k])
    return out


def invalid(causes: list[dict[str, str]]) -> errors.APIError:
    """NewInvalid as the review REST handlers raise it: the decoded (internal) object
    carries no kind, so the message reads `.authorization.k8s.io "" is invalid: ...`."""
    err = errors.Invalid.for_object("", kinds.GROUP, "", causes)
    err.kind = None
    err.name = None
    return err


# ---------------------------------------------------------------------------
# The handlers (APIServer.resource_handlers entries)
# ---------------------------------------------------------------------------

# The generic pipeline's decoding steps (type/field checks); they hold no state.
_STEPS = ResourceBase()


def decode_review(req: Req, info: KindInfo) -> tuple[dict[str, Any], list[str]]:
    """The posted review as checked JSON, and fieldValidation warnings."""
    decoded = decode_request(req)
    obj = _STEPS.check_type(info, decoded.value)
    warnings = _STEPS.field_validation(info, obj, req, decoded.duplicates)
    _STEPS.type_check(info, obj)
    if not isinstance(obj.get("spec"), dict):
        obj["spec"] = {}
    return obj, warnings


def place_namespace(obj: dict[str, Any], namespace: str | None) -> None:
    """rest.EnsureObjectNamespaceMatchesRequestNamespace: a cluster-scoped review loses any
    namespace; a local one takes the path's, and may not name another (400)."""
    md = obj["metadata"]
    if namespace is None:
        md.pop("namespace", None)
        return
    given = md.get("namespace") or ""
    if given and given != namespace:
        raise errors.BadRequest("the namespace of the provided object does not match the namespace "
                                "sent on the request")
    md["namespace"] = namespace


def _answer(obj: dict[str, Any], status: dict[str, Any], warnings: list[str]) -> Resp:
    md = {k: val for k, val in obj["metadata"].items() if k != "managedFields"}
    md.setdefault("creationTimestamp", None)
    out = {"kind": obj["kind"], "apiVersion": obj["apiVersion"], "metadata": md, "spec": obj["spec"],
           "status": status}
    return Resp.json(201, out, warning_headers(warnings))


class AccessReviews:
    """Answers the four review kinds with `authorizer` (the server's) and `resolver`."""

    def __init__(self, authorizer: Authorizer, resolver: RuleResolver | None = None) -> None:
        self.authorizer = authorizer
        self.resolver = resolver

    def handlers(self) -> dict[tuple[str, str, str, str], Handler]:
        g, ver = kinds.GROUP, kinds.VERSION
        return {
            (g, ver, kinds.SUBJECT_ACCESS_REVIEWS.plural, ""): self.subject_access_review,
            (g, ver, kinds.SELF_SUBJECT_ACCESS_REVIEWS.plural, ""): self.self_subject_access_review,
            (g, ver, kinds.LOCAL_SUBJECT_ACCESS_REVIEWS.plural, ""): self.local_subject_access_review,
            (g, ver, kinds.SELF_SUBJECT_RULES_REVIEWS.plural, ""): self.self_subject_rules_review,
        }

    @staticmethod
    def _create_only(verb: str, info: KindInfo) -> None:
        if verb != "create":  # the generic pipeline refuses other verbs first; kept as a guard
            raise errors.MethodNotAllowed(f"{verb} is not supported on {info.plural}")

    async def subject_access_review(self, req: Req, route: Route, verb: str, user: UserInfo,
                                    info: KindInfo) -> Resp:
        self._create_only(verb, info)
        obj, warnings = decode_review(req, info)
        place_namespace(obj, None)
        causes = kinds.validate_subject_access_review(obj)
        if causes:
            raise invalid(causes)
        return _answer(obj, decide(self.authorizer, subject(obj["spec"]), obj["spec"]), warnings)

    async def local_subject_access_review(self, req: Req, route: Route, verb: str, user: UserInfo,
                                          info: KindInfo) -> Resp:
        self._create_only(verb, info)
        obj, warnings = decode_review(req, info)
        if not route.namespace:
            raise errors.BadRequest("namespace is required on this type: ")
        place_namespace(obj, route.namespace)
        causes = kinds.validate_local_subject_access_review(obj)
        if causes:
            raise invalid(causes)
        return _answer(obj, decide(self.authorizer, subject(obj["spec"]), obj["spec"]), warnings)

    async def self_subject_access_review(self, req: Req, route: Route, verb: str, user: UserInfo,
                                         info: KindInfo) -> Resp:
        self._create_only(verb, info)
        obj, warnings = decode_review(req, info)
        place_namespace(obj, None)
        causes = kinds.validate_self_subject_access_review(obj)
        if causes:
            raise invalid(causes)
        return _answer(obj, decide(self.authorizer, user, obj["spec"]), warnings)

    async def self_subject_rules_review(self, req: Req, route: Route, verb: str, user: UserInfo,
                                        info: KindInfo) -> Resp:
        self._create_only(verb, info)
        obj, warnings = decode_review(req, info)
        namespace = _s(obj["spec"].get("namespace"))
        if not namespace:
            raise errors.BadRequest("no namespace on request")
        if self.resolver is None:
            result = RulesResult(incomplete=True, error="no authorizer of this server can list rules")
        else:
            result = self.resolver.rules_for(user, namespace)
        # kube answers a new object: no metadata, an empty spec, the status.
        out = {"kind": obj["kind"], "apiVersion": obj["apiVersion"], "metadata": {"creationTimestamp": None},
               "spec": {}, "status": rules_status(result)}
        return Resp.json(201, out, warning_headers(warnings))


def handlers(authorizer: Authorizer, resolver: RuleResolver | None = None) -> dict[tuple[str, str, str, str],
                                                                                   Handler]:
    """The handlers for `Security.handlers`, keyed (group, version, plural, subresource)."""
    return AccessReviews(authorizer, resolver).handlers()


__all__ = [
    "ALL_NON_RESOURCE_URLS_RULE", "ALL_RESOURCES_RULE", "AccessReviews", "AllowAllRules", "RuleResolver",
    "RulesResult", "UnionRuleResolver", "aggregate_errors", "decide", "decode_review", "handlers", "invalid",
    "place_namespace", "resolvers_of", "resource_attributes", "review_status", "rules_status", "spec_attributes",
    "subject",
]
