"""Which webhooks a request must call: pure decisions over a webhook and a request.

kube-apiserver decides in k8s.io/apiserver/pkg/admission/plugin/webhook
(`predicates/rules`, `predicates/namespace`, `predicates/object`, `generic/webhook.go`);
this module is the same decision with no I/O, so it is tested exhaustively.

- rules: operations (create → CREATE, update/patch → UPDATE, delete → DELETE,
  connect subresources → CONNECT), apiGroups, apiVersions, resources with
  subresources (`pods` matches only the main resource, `pods/*` every subresource,
  `*/status` that subresource of everything, `*/*` all), scope (`Cluster`,
  `Namespaced`, `*`; a Namespace counts as cluster-scoped).
- namespaceSelector: the labels of the object's namespace; a Namespace is judged by
  its own labels; any other cluster-scoped object always matches.
- objectSelector: the new or the old object's labels (either one matching is enough).
- matchPolicy: `Exact` needs the rule to name the request's version; `Equivalent`
  (the default) also matches a rule naming another version Fleet serves of the same
  group/resource (HorizontalPodAutoscalers: autoscaling/v1 and v2).  Fleet stores and
  admits one version (v1 HPA writes are converted to v2 before admission), so the
  webhook is sent that version — labelled as such in `kind`/`resource` — where
  kube-apiserver would convert the object to the version the rule names.
- Webhook configurations and policies themselves are never sent to webhooks, as in
  kube-apiserver, so a broken webhook cannot lock the cluster out of removing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.api.selectors import selector_dict_matches

ADMISSIONREGISTRATION = "admissionregistration.k8s.io"
# Never intercepted (IsExemptAdmissionConfigurationResource).
EXEMPT_RESOURCES = frozenset({"mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                              "validatingadmissionpolicies", "validatingadmissionpolicybindings"})

OPERATION_OF_VERB = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE",
                     "deletecollection": "DELETE", "connect": "CONNECT"}


@dataclass(frozen=True)
class Request:
    """What the matcher needs to know about one admission request."""

    operation: str  # CREATE UPDATE DELETE CONNECT
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    namespaced: bool  # the resource's scope (a Namespace is cluster-scoped)
    obj: dict[str, Any] | None
    old: dict[str, Any] | None
    namespace_labels: dict[str, str] | None  # labels of `namespace`, None when unknown
    # Every version Fleet serves of this group/resource (matchPolicy Equivalent).
    served_versions: frozenset[str] = frozenset()


def _in(values: Any, value: str) -> bool:
    return isinstance(values, list) and ("*" in values or value in values)


def _resource_matches(resources: Any, resource: str, subresource: str) -> bool:
    if not isinstance(resources, list):
        return False
    for r in resources:
        if not isinstance(r, str):
            continue
        if r == "*/*":
            return True
        res, _, sub = r.partition("/")
        if res not in ("*", resource):
            continue
        if not subresource and not sub:
            return True
        if subresource and sub in ("*", subresource):
            return True
    return False


def rule_matches(rule: dict[str, Any], req: Request, *, equivalent: bool = False) -> bool:
    """One RuleWithOperations against the request (predicates/rules.Matcher); with
    `equivalent`, any served version of the resource satisfies apiVersions."""
    if not _in(rule.get("operations"), req.operation):
        return False
    if not _in(rule.get("apiGroups"), req.group):
        return False
    versions = {req.version} | (set(req.served_versions) if equivalent else set())
    if not any(_in(rule.get("apiVersions"), ver) for ver in versions):
        return False
    if not _resource_matches(rule.get("resources"), req.resource, req.subresource):
        return False
    scope = rule.get("scope") or "*"
    if scope == "Cluster":
        return not req.namespaced
    if scope == "Namespaced":
        return req.namespaced
    return True


def _labels(obj: dict[str, Any] | None) -> dict[str, str]:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    labels = md.get("labels") if isinstance(md, dict) else None
    return labels if isinstance(labels, dict) else {}


def namespace_selector_matches(hook: dict[str, Any], req: Request) -> bool:
    """predicates/namespace.MatchNamespaceSelector."""
    sel = hook.get("namespaceSelector") or {}
    if req.group == "" and req.resource == "namespaces":
        # A Namespace is judged by its own labels (the new object's, or the old on delete).
        return selector_dict_matches(sel, _labels(req.obj if req.obj is not None else req.old))
    if not req.namespaced or not req.namespace:
        return True  # other cluster-scoped objects are never filtered by namespace
    if not sel:
        return True
    return selector_dict_matches(sel, req.namespace_labels or {})


def object_selector_matches(hook: dict[str, Any], req: Request) -> bool:
    """predicates/object.MatchObjectSelector: the new or the old object's labels."""
    sel = hook.get("objectSelector") or {}
    if not sel:
        return True
    return ((req.obj is not None and selector_dict_matches(sel, _labels(req.obj)))
            or (req.old is not None and selector_dict_matches(sel, _labels(req.old))))


def exempt(req: Request) -> bool:
    return req.group == ADMISSIONREGISTRATION and req.resource in EXEMPT_RESOURCES


def webhook_matches(hook: dict[str, Any], req: Request) -> bool:
    """Should `hook` be called for `req`? (rules, then selectors; matchConditions are
    decided by the caller, after these, as kube-apiserver orders them)."""
    if exempt(req):
        return False
    rules = hook.get("rules")
    equivalent = hook.get("matchPolicy", "Equivalent") != "Exact"
    if not isinstance(rules, list) or not any(isinstance(r, dict) and rule_matches(r, req, equivalent=equivalent)
                                              for r in rules):
        return False
    return namespace_selector_matches(hook, req) and object_selector_matches(hook, req)


def hooks_of(configs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(configuration name, webhook) for every webhook, configurations sorted by name and
    webhooks in their listed order — kube-apiserver's calling order."""
    out: list[tuple[str, dict[str, Any]]] = []
    for cfg in sorted(configs, key=_config_name):
        hooks = cfg.get("webhooks")
        for h in hooks if isinstance(hooks, list) else []:
            if isinstance(h, dict):
                out.append((_config_name(cfg), h))
    return out


def _config_name(cfg: dict[str, Any]) -> str:
    md = cfg.get("metadata")
    return str(md.get("name", "")) if isinstance(md, dict) else ""
