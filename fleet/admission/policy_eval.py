"""ValidatingAdmissionPolicy decisions: pure functions over a policy, a binding, a request.

The counterpart of kube-apiserver's k8s.io/apiserver/pkg/admission/plugin/policy
(`generic/policy_matcher.go`, `matching/matching.go`, `validating/validator.go`,
`validating/dispatcher.go`), with their messages, and no I/O: policy.py fetches
the objects and calls these.

- matching: the policy's `matchConstraints` (resourceRules with resourceNames,
  excludeResourceRules, namespaceSelector, objectSelector, matchPolicy) and, when
  set, the binding's `matchResources` narrowing it — the same rule and selector
  decisions as webhooks (webhook_match.py);
- params: which object(s) a binding's `paramRef` names (name or selector;
  namespace from the ref, else the request's for a namespaced paramKind);
- evaluation: `matchConditions` (any false: the policy does not apply), then each
  validation; a false one fails with its `messageExpression`'s result, else its
  `message`, else `failed expression: <expression>`; an evaluation error is a
  failure `expression '<expression>' resulted in error: <why>` under
  failurePolicy Fail and nothing under Ignore (so is a misconfiguration);
- misconfigurations (a missing param, an unknown paramKind) and auditAnnotation
  errors refuse the request under failurePolicy Fail whatever the binding's
  actions (kube-apiserver's `addConfigError`);
- actions: a binding's failures are denied (`ValidatingAdmissionPolicy 'P' with
  binding 'B' denied request: M`, with the validation's `reason`, Invalid by
  default, as kube-apiserver), warned (`Validation failed for
  ValidatingAdmissionPolicy 'P' with binding 'B': M`) and/or audited (the
  `validation.policy.admission.k8s.io/validation_failure` annotation);
- `auditAnnotations`: `<policy>/<key>` = the valueExpression's string (null or
  blank: none; distinct values from several bindings or params joined by ", ").

Variables are lazy (`variables.<name>` evaluates on first use, once per
evaluation).  `authorizer` asks the server's authorizer (fleet/cel/authz.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from fleet import cel
from fleet.admission.webhook_match import (
    Request,
    exempt,
    namespace_selector_matches,
    object_selector_matches,
    rule_matches,
)
from fleet.admission.webhook_review import build_review
from fleet.api.kinds.admissionregistration import POLICY_VARIABLES
from fleet.api.selectors import selector_dict_matches
from fleet.auth import Attributes, UserInfo
from fleet.cel.authz import Authz, request_resource

VALIDATION_FAILURE_ANNOTATION = "validation.policy.admission.k8s.io/validation_failure"
# Validation.reason → HTTP code (dispatcher.go reasonToCode).
REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}
DEFAULT_REASON = "Invalid"


# --------------------------------------------------------------------------- matching

def _name(obj: dict[str, Any] | None) -> str:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return str(md.get("name") or "") if isinstance(md, dict) else ""


def _named_rule_matches(rule: dict[str, Any], req: Request, name: str, *, equivalent: bool) -> bool:
    if not rule_matches(rule, req, equivalent=equivalent):
        return False
    names = rule.get("resourceNames")
    return not names or name in names


def resources_match(mr: dict[str, Any], req: Request, name: str, *, require_rules: bool) -> bool:
    """One MatchResources against the request (matching.Matcher): a resource rule matches,
    no exclude rule does, and both selectors hold.  `require_rules` False (a binding's
    narrowing) lets an absent resourceRules match every resource."""
    equivalent = mr.get("matchPolicy", "Equivalent") != "Exact"
    rules = mr.get("resourceRules")
    rules = [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []
    if rules or require_rules:
        if not any(_named_rule_matches(r, req, name, equivalent=equivalent) for r in rules):
            return False
    excludes = mr.get("excludeResourceRules")
    for r in excludes if isinstance(excludes, list) else []:
        if isinstance(r, dict) and _named_rule_matches(r, req, name, equivalent=equivalent):
            return False
    return namespace_selector_matches(mr, req) and object_selector_matches(mr, req)


def binding_applies(policy: dict[str, Any], binding: dict[str, Any], req: Request) -> bool:
    """Does this (policy, binding) pair judge the request?  Policies and bindings
    themselves (and webhook configurations) are never judged, as in kube-apiserver."""
    if exempt(req):
        return False
    name = _name(req.obj if req.obj is not None else req.old)
    spec = policy.get("spec") if isinstance(policy.get("spec"), dict) else {}
    constraints = spec.get("matchConstraints")
    if not isinstance(constraints, dict) or not resources_match(constraints, req, name, require_rules=True):
        return False
    bspec = binding.get("spec") if isinstance(binding.get("spec"), dict) else {}
    narrowing = bspec.get("matchResources")
    return not isinstance(narrowing, dict) or resources_match(narrowing, req, name, require_rules=False)


# --------------------------------------------------------------------------- params

class ConfigError(Exception):
    """A misconfigured policy or binding; failurePolicy decides (message is kube's)."""


@dataclass(frozen=True)
class ParamLookup:
    """Which params a binding names: one object by name, or those matching a selector."""

    namespace: str | None  # None: cluster-scoped paramKind
    name: str | None
    selector: dict[str, Any] | None
    allow_missing: bool  # parameterNotFoundAction Allow


def param_lookup(binding: dict[str, Any], req: Request, param_namespaced: bool) -> ParamLookup:
    """The binding's paramRef resolved against the request (raises ConfigError)."""
    spec = binding.get("spec") if isinstance(binding.get("spec"), dict) else {}
    ref = spec.get("paramRef")
    if not isinstance(ref, dict):
        raise ConfigError("failed to configure binding: paramRef is required when paramKind is set")
    ns: str | None = None
    if param_namespaced:
        ns = ref.get("namespace") or req.namespace
        if not ns:
            raise ConfigError("failed to configure binding: cannot use a namespaced paramKind without a "
                              "paramRef namespace for a cluster-scoped request")
    name = ref.get("name") or None
    selector = ref.get("selector") if name is None else None
    return ParamLookup(ns, name, selector if isinstance(selector, dict) else {},
                       ref.get("parameterNotFoundAction") == "Allow")


def select_params(lookup: ParamLookup, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The params among `candidates` (the paramKind's objects in lookup.namespace) that
    the lookup names; raises ConfigError when none and the action is Deny."""
    if lookup.name is not None:
        found = [o for o in candidates if _name(o) == lookup.name]
    else:
        found = [o for o in candidates if selector_dict_matches(lookup.selector or {}, _labels(o))]
    found.sort(key=_name)
    if not found and not lookup.allow_missing:
        raise ConfigError("failed to configure binding: no params found for policy binding with `Deny` "
                          "parameterNotFoundAction")
    return found


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    md = obj.get("metadata")
    labels = md.get("labels") if isinstance(md, dict) else None
    return labels if isinstance(labels, dict) else {}


# --------------------------------------------------------------------------- evaluation

@dataclass
class Failure:
    """One failed validation (or an error handled as one under failurePolicy Fail)."""

    message: str
    reason: str = DEFAULT_REASON
    index: int = 0


@dataclass
class Evaluation:
    """What one (policy, binding, param) evaluation found: failures (judged by the
    binding's validationActions), audit annotation errors (denied outright under
    failurePolicy Fail, as kube-apiserver) and audit annotations (key → value)."""

    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


def _compile(expression: Any, extra: frozenset[str] = frozenset()) -> cel.Program:
    if not isinstance(expression, str):
        raise cel.CompileError("expression must be a string")
    return cel.compile(expression, POLICY_VARIABLES | extra)


def _eval(expression: Any, activation: Mapping[str, Any]) -> Any:
    """Compile (cached) and evaluate; raises cel.CompileError / cel.EvalError."""
    return cel.evaluate(_compile(expression), activation)


def request_variable(attrs: Attributes, user: UserInfo, kind: dict[str, str], req: Request,
                     obj: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any]:
    """CEL's `request`: the AdmissionRequest a webhook would be sent, without uid and objects."""
    review = build_review(uid="", kind=kind, resource={"group": attrs.group, "version": attrs.version,
                                                       "resource": attrs.resource},
                          subresource=attrs.subresource, name=attrs.name or _name(obj) or _name(old),
                          namespace=attrs.namespace, operation=req.operation, user=user,
                          obj=None, old=None, dry_run=attrs.dry_run)
    out: dict[str, Any] = review["request"]
    for k in ("uid", "object", "oldObject"):
        out.pop(k, None)
    return out


def request_activation(*, obj: dict[str, Any] | None, old: dict[str, Any] | None, request: dict[str, Any],
                       namespace_object: dict[str, Any] | None, authorizer: Any = None) -> dict[str, Any]:
    """The per-request part of the activation as CEL values (converted once per request,
    shared by every policy judging it).  `authorizer` is a `fleet.cel.authz.Authz` (None:
    checks answer errored(), "no authorizer is configured")."""
    act = cel.to_activation({"object": obj, "oldObject": old, "request": request,
                             "namespaceObject": namespace_object})
    act["authorizer"] = authorizer if authorizer is not None else Authz(None, UserInfo(""))
    return act


def authorizer_for(check: Any, user: UserInfo, attrs: Attributes) -> Authz:
    """CEL's `authorizer` for a request: `check` is the server's Authorizer.authorize."""
    return Authz(check, user, request_resource(attrs.group, attrs.resource, attrs.subresource,
                                               attrs.namespace, attrs.name))


def policy_activation(base: dict[str, Any], params: dict[str, Any] | None,
                      variables: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy's activation: the request's, its `params` and its lazy `variables`."""
    act = dict(base)
    act["params"] = cel.to_cel(params)
    thunks: dict[str, Callable[[], Any]] = {}
    for v in variables:
        if isinstance(v, dict) and isinstance(v.get("name"), str):
            thunks[v["name"]] = _variable_thunk(v["name"], v.get("expression"), act)
    act["variables"] = cel.LazyMap(thunks)
    return act


def build_activation(*, obj: dict[str, Any] | None, old: dict[str, Any] | None, request: dict[str, Any],
                     params: dict[str, Any] | None, namespace_object: dict[str, Any] | None,
                     variables: list[dict[str, Any]]) -> dict[str, Any]:
    """The CEL activation of a policy: object, oldObject, request, params,
    namespaceObject, and the lazy `variables` map."""
    base = request_activation(obj=obj, old=old, request=request, namespace_object=namespace_object)
    return policy_activation(base, params, variables)


def _variable_thunk(name: str, expression: Any, act: dict[str, Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return _eval(expression, act)
        except (cel.CompileError, cel.EvalError) as e:
            # An error value: an expression reading the variable fails with it.
            return CELEvalError(f"composited variable \"{name}\" fails to evaluate: {e}", ValueError, ())
    return run


def _bool(value: Any, expression: str) -> bool:
    if isinstance(value, (bool, celtypes.BoolType)):
        return bool(value)
    raise cel.EvalError(f"expression '{expression}' resulted in error: expected boolean value, got "
                        f"{type(value).__name__.removesuffix('Type').lower()}")


def match_conditions_hold(conditions: Any, activation: Mapping[str, Any],
                          variables: frozenset[str] = POLICY_VARIABLES) -> bool:
    """All matchConditions true → True; any false → False; an error (no false) raises
    cel.EvalError with kube's words (matchconditions/matcher.go)."""
    errors: list[str] = []
    for c in conditions if isinstance(conditions, list) else []:
        if not isinstance(c, dict):
            continue
        expr = c.get("expression")
        try:
            if not isinstance(expr, str):
                raise cel.CompileError("expression must be a string")
            if not _bool(cel.evaluate(cel.compile(expr, variables), activation), expr):
                return False
        except (cel.EvalError, cel.CompileError) as e:
            text = str(e)
            errors.append(text if text.startswith("expression '") else
                          f"expression '{expr}' resulted in error: {text}")
    if errors:
        raise cel.EvalError("; ".join(errors))
    return True


def _message(validation: dict[str, Any], activation: Mapping[str, Any]) -> str:
    """messageExpression's string, else message, else `failed expression: <expression>`."""
    mexpr = validation.get("messageExpression")
    if isinstance(mexpr, str) and mexpr:
        try:
            out = _eval(mexpr, activation)
            if isinstance(out, str) and out.strip() and "\n" not in out.strip() and len(out) <= 5120:
                return str(out).strip()
        except (cel.EvalError, cel.CompileError):
            pass  # kube falls back to the static message
    msg = validation.get("message")
    if isinstance(msg, str) and msg.strip():
        return msg.strip()
    return f"failed expression: {str(validation.get('expression', '')).strip()}"


def evaluate(policy: dict[str, Any], activation: Mapping[str, Any]) -> Evaluation | None:
    """Evaluate a policy's validations and audit annotations over one activation.  None:
    its matchConditions exclude the request.  Errors are failures under failurePolicy
    Fail, ignored under Ignore."""
    spec = policy.get("spec") if isinstance(policy.get("spec"), dict) else {}
    fail = spec.get("failurePolicy", "Fail") != "Ignore"
    out = Evaluation()
    if spec.get("matchConditions"):
        try:
            if not match_conditions_hold(spec["matchConditions"], activation):
                return None
        except cel.EvalError as e:
            if fail:
                out.failures.append(Failure(str(e)))
            return out
    for i, val in enumerate(spec.get("validations") or []):
        if not isinstance(val, dict):
            continue
        expr = str(val.get("expression", ""))
        try:
            ok = _bool(_eval(expr, activation), expr)
        except cel.EvalError as e:
            if fail:
                text = str(e)
                if not text.startswith("expression '"):
                    text = f"expression '{expr}' resulted in error: {text}"
                out.failures.append(Failure(text, DEFAULT_REASON, i))
            continue
        except cel.CompileError as e:  # stored before compile checks existed
            if fail:
                out.failures.append(Failure(f"compilation error: {e}", DEFAULT_REASON, i))
            continue
        if not ok:
            reason = val.get("reason") if val.get("reason") in REASON_CODES else DEFAULT_REASON
            out.failures.append(Failure(_message(val, activation), str(reason), i))
    name = _name(policy)
    for ann in spec.get("auditAnnotations") or []:
        if not isinstance(ann, dict) or not isinstance(ann.get("key"), str):
            continue
        vexpr = ann.get("valueExpression")
        try:
            value = _eval(vexpr, activation)
        except (cel.EvalError, cel.CompileError) as e:
            if fail:
                out.errors.append(f"expression '{vexpr}' resulted in error: {e}")
            continue
        if value is None:
            continue
        if not isinstance(value, str):
            if fail:
                kind = type(value).__name__.removesuffix("Type").lower()
                out.errors.append(f"valueExpression '{vexpr}' resulted in unsupported return type: {kind}. "
                                  "Return type must be either string or null.")
            continue
        if value.strip():
            out.annotations[f"{name}/{ann['key']}"] = str(value).strip()[:10 * 1024]
    return out


# --------------------------------------------------------------------------- actions

@dataclass
class Verdict:
    """The outcome of every binding for one request."""

    denial: tuple[str, str] | None = None  # (message, reason) of the first denial
    warnings: list[str] = field(default_factory=list)
    audit_failures: list[dict[str, Any]] = field(default_factory=list)
    # `<policy>/<key>` → values from its bindings and params, distinct, in order.
    annotations: dict[str, list[str]] = field(default_factory=dict)

    def add_annotations(self, annotations: dict[str, str]) -> None:
        for k, val in annotations.items():
            values = self.annotations.setdefault(k, [])
            if val not in values:
                values.append(val)

    def annotation_values(self) -> dict[str, str]:
        """Several distinct values of one key are joined with ", " (kube's collector)."""
        return {k: ", ".join(vals) for k, vals in self.annotations.items()}

    def audit_value(self) -> str | None:
        """The validation_failure annotation's value: kube-apiserver writes a one-element
        JSON list per failure and an audit annotation keeps its first value, so the first
        audited failure is what the event carries."""
        return json.dumps(self.audit_failures[:1], separators=(",", ":")) if self.audit_failures else None

    def deny(self, policy: str, binding: str, message: str, reason: str = DEFAULT_REASON) -> None:
        """A denial outside the binding's actions (a misconfiguration, an audit annotation
        error under failurePolicy Fail); the first one wins."""
        if self.denial is None:
            self.denial = (deny_message(policy, binding, message), reason)


def deny_message(policy: str, binding: str, message: str) -> str:
    return f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"


def warn_message(policy: str, binding: str, message: str) -> str:
    return f"Validation failed for ValidatingAdmissionPolicy '{policy}' with binding '{binding}': {message}"


def apply_actions(verdict: Verdict, policy: str, binding: dict[str, Any], failures: list[Failure]) -> None:
    """Record `failures` of one binding in `verdict` according to its validationActions."""
    bname = _name(binding)
    spec = binding.get("spec") if isinstance(binding.get("spec"), dict) else {}
    actions = [a for a in spec.get("validationActions") or [] if isinstance(a, str)]
    for f in failures:
        if "Deny" in actions and verdict.denial is None:
            verdict.denial = (deny_message(policy, bname, f.message), f.reason)
        if "Warn" in actions:
            w = warn_message(policy, bname, f.message)
            if w not in verdict.warnings:
                verdict.warnings.append(w)
        if "Audit" in actions:
            verdict.audit_failures.append({"message": f.message, "policy": policy, "binding": bname,
                                           "expressionIndex": f.index, "validationActions": actions})


def reason_code(reason: str) -> int:
    return REASON_CODES.get(reason, 422)
