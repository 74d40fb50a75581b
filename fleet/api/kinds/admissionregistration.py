"""`admissionregistration.k8s.io/v1`: webhook configurations and admission policies.

MutatingWebhookConfiguration and ValidatingWebhookConfiguration tell the API
server which HTTPS endpoints to ask about which writes (fleet/admission/webhook*.py
calls them).  Their defaulting and validation follow kube-apiserver's
(k8s.io/kubernetes/pkg/apis/admissionregistration/v1/defaults.go and
.../admissionregistration/validation/validation.go), with its messages: a bad
configuration is refused when it is written, not discovered on the first
request it would have intercepted.

ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding get their
structural checks, and every CEL expression (a policy's validations, their
messageExpressions, matchConditions, variables and auditAnnotations; a webhook's
matchConditions) must compile (fleet/cel), else the write is refused with
kube-apiserver's `compilation failed: ERROR: <input>:L:C: ...`.  The policies are
evaluated by fleet/admission/policy.py.  All four are cluster-scoped.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from fleet.api import validation as v
from fleet.api.kinds._common import NONE, col, table
from fleet.api.registry import KindInfo

Cause = dict[str, str]

GROUP = "admissionregistration.k8s.io"

FAILURE_POLICIES = ("Fail", "Ignore")
MATCH_POLICIES = ("Equivalent", "Exact")
REINVOCATION_POLICIES = ("IfNeeded", "Never")
# v1 accepts only the side-effect classes that make dry-run safe (Some/Unknown were v1beta1's).
SIDE_EFFECTS_V1 = ("None", "NoneOnDryRun")
OPERATIONS = ("*", "CONNECT", "CREATE", "DELETE", "UPDATE")
SCOPES = ("*", "Cluster", "Namespaced")
ADMISSION_REVIEW_VERSIONS = ("v1", "v1beta1")
VALIDATION_ACTIONS = ("Audit", "Deny", "Warn")
VALIDATION_REASONS = ("Forbidden", "Invalid", "RequestEntityTooLarge", "Unauthorized")
# The CEL variables of a policy's expressions, and of a webhook's matchConditions.
POLICY_VARIABLES = frozenset({"object", "oldObject", "request", "params", "namespaceObject", "variables",
                              "authorizer"})
WEBHOOK_VARIABLES = frozenset({"object", "oldObject", "request", "authorizer"})


# --------------------------------------------------------------------------- defaults

def default_webhook(hook: dict[str, Any], *, mutating: bool) -> None:
    """SetDefaults_ValidatingWebhook / SetDefaults_MutatingWebhook (v1)."""
    hook.setdefault("failurePolicy", "Fail")
    hook.setdefault("matchPolicy", "Equivalent")
    hook.setdefault("namespaceSelector", {})
    hook.setdefault("objectSelector", {})
    hook.setdefault("timeoutSeconds", 10)
    if mutating:
        hook.setdefault("reinvocationPolicy", "Never")
    for rule in hook.get("rules") or []:
        if isinstance(rule, dict):
            rule.setdefault("scope", "*")
    svc = (hook.get("clientConfig") or {}).get("service") if isinstance(hook.get("clientConfig"), dict) else None
    if isinstance(svc, dict):
        svc.setdefault("port", 443)


def _defaulter(mutating: bool) -> Any:
    def default(obj: dict[str, Any]) -> None:
        hooks = obj.get("webhooks")
        if isinstance(hooks, list):
            for h in hooks:
                if isinstance(h, dict):
                    default_webhook(h, mutating=mutating)
    return default


# --------------------------------------------------------------------------- validation

def _star_exclusive(values: list[Any], path: str, what: str) -> list[Cause]:
    if len(values) > 1 and "*" in values:
        return [v.invalid(path, values, f"if '*' is present, must not specify other {what}")]
    return []


def validate_resources(resources: Any, path: str) -> list[Cause]:
    """validateResources, statement for statement (its checks depend on the order of the
    list, as kube-apiserver's do): `*/*` alone, `*` only beside `*/x`, no `res/x` after
    `res/*`, no `x/sub` after `*/sub`."""
    if not isinstance(resources, list) or not resources:
        return [v.required(path, "")]
    out: list[Cause] = []
    with_wildcard_sub: set[str] = set()  # res/*
    sub_with_wildcard_res: set[str] = set()  # */sub
    has_double = has_single = has_plain = False
    for i, r in enumerate(resources):
        p = f"{path}[{i}]"
        if not isinstance(r, str) or r == "":
            out.append(v.required(p, ""))
            continue
        has_double = has_double or r == "*/*"
        has_single = has_single or r == "*"
        if "/" not in r:
            has_plain = r != "*"
            continue
        res, sub = r.split("/", 1)
        if res in with_wildcard_sub:
            out.append(v.invalid(p, r, f"if '{res}/*' is present, must not specify {r}"))
        if sub in sub_with_wildcard_res:
            out.append(v.invalid(p, r, f"if '*/{sub}' is present, must not specify {r}"))
        if sub == "*":
            with_wildcard_sub.add(res)
        if res == "*":
            sub_with_wildcard_res.add(sub)
    if len(resources) > 1 and has_double:
        out.append(v.invalid(path, resources, "if '*/*' is present, must not specify other resources"))
    if has_single and has_plain:
        out.append(v.invalid(path, resources, "if '*' is present, must not specify other resources without "
                                              "subresources"))
    return out


def validate_rule(rule: Any, path: str) -> list[Cause]:
    """RuleWithOperations: operations, apiGroups, apiVersions, resources, scope."""
    if not isinstance(rule, dict):
        return [v.type_invalid(path, rule, "object")]
    out: list[Cause] = []
    ops = rule.get("operations")
    if not isinstance(ops, list) or not ops:
        out.append(v.required(f"{path}.operations", ""))
    else:
        out += _star_exclusive(ops, f"{path}.operations", "operations")
        for i, op in enumerate(ops):
            if op not in OPERATIONS:
                out.append(v.not_supported(f"{path}.operations[{i}]", op, OPERATIONS))
    groups = rule.get("apiGroups")
    if not isinstance(groups, list) or not groups:
        out.append(v.required(f"{path}.apiGroups", ""))
    else:
        out += _star_exclusive(groups, f"{path}.apiGroups", "API groups")
    versions = rule.get("apiVersions")
    if not isinstance(versions, list) or not versions:
        out.append(v.required(f"{path}.apiVersions", ""))
    else:
        out += _star_exclusive(versions, f"{path}.apiVersions", "API versions")
        for i, ver in enumerate(versions):
            if ver == "":
                out.append(v.required(f"{path}.apiVersions[{i}]", ""))
    out += validate_resources(rule.get("resources"), f"{path}.resources")
    scope = rule.get("scope")
    if scope is not None and scope not in SCOPES:
        out.append(v.not_supported(f"{path}.scope", scope, SCOPES))
    return out


def validate_webhook_url(url: Any, path: str) -> list[Cause]:
    """webhook.ValidateWebhookURL(forceHttps=true), with its messages."""
    form = "; desired format: https://host[/path]"
    if not isinstance(url, str):
        return [v.type_invalid(path, url, "string")]
    try:
        u = urlsplit(url)
    except ValueError as e:
        return [v.required(path, f"url must be a valid URL: {e}{form}")]
    out: list[Cause] = []
    if u.scheme != "https":
        out.append(v.invalid(path, u.scheme, "'https' is the only allowed URL scheme" + form))
    if not u.netloc:
        out.append(v.invalid(path, u.netloc, "host must be provided" + form))
    if "@" in u.netloc:
        out.append(v.invalid(path, u.netloc.rsplit("@", 1)[0], "user information is not permitted in the URL"))
    if u.fragment:
        out.append(v.invalid(path, u.fragment, "fragments are not permitted in the URL"))
    if u.query:
        out.append(v.invalid(path, u.query, "query parameters are not permitted in the URL"))
    return out


def validate_service(svc: Any, path: str) -> list[Cause]:
    """webhook.ValidateWebhookService."""
    if not isinstance(svc, dict):
        return [v.type_invalid(path, svc, "object")]
    out: list[Cause] = []
    if not svc.get("name"):
        out.append(v.required(f"{path}.name", "service name is required"))
    if not svc.get("namespace"):
        out.append(v.required(f"{path}.namespace", "service namespace is required"))
    port = svc.get("port", 443)
    for msg in v.is_valid_port_num(port):
        out.append(v.invalid(f"{path}.port", port, f"port is not valid: {msg}"))
    p = svc.get("path")
    if p is None or p in ("", "/"):
        return out
    if not isinstance(p, str):
        return out + [v.type_invalid(f"{path}.path", p, "string")]
    if p == "//":
        return out + [v.invalid(f"{path}.path", p, "segment[0] may not be empty")]
    if not p.startswith("/"):
        out.append(v.invalid(f"{path}.path", p, "must start with a '/'"))
    steps = p[1:].removesuffix("/").split("/")
    for i, step in enumerate(steps):
        if step == "":
            out.append(v.invalid(f"{path}.path", p, f"segment[{i}] may not be empty"))
            continue
        for msg in v.is_dns1123_subdomain(step):
            out.append(v.invalid(f"{path}.path", p, f"segment[{i}]: {msg}"))
    return out


def validate_client_config(cc: Any, path: str) -> list[Cause]:
    if not isinstance(cc, dict):
        return [v.required(path, "exactly one of url or service is required")]
    has_url, has_svc = cc.get("url") is not None, cc.get("service") is not None
    if has_url == has_svc:
        return [v.required(path, "exactly one of url or service is required")]
    out = validate_webhook_url(cc["url"], f"{path}.url") if has_url else validate_service(cc["service"],
                                                                                            f"{path}.service")
    bundle = cc.get("caBundle")
    if bundle is not None and not isinstance(bundle, str):
        out.append(v.type_invalid(f"{path}.caBundle", bundle, "string"))
    return out


def validate_webhook(hook: Any, path: str, *, mutating: bool) -> list[Cause]:
    """validateValidatingWebhook / validateMutatingWebhook (v1 rules: sideEffects and
    admissionReviewVersions required)."""
    if not isinstance(hook, dict):
        return [v.type_invalid(path, hook, "object")]
    out: list[Cause] = []
    name = hook.get("name")
    if not isinstance(name, str) or not name:
        out.append(v.required(f"{path}.name", ""))
    else:
        problems = v.is_dns1123_subdomain(name)
        if not problems and len(name.split(".")) < 3:
            problems = ["should be a domain with at least three segments separated by dots"]
        for msg in problems:
            out.append(v.invalid(f"{path}.name", name, msg))
    for i, rule in enumerate(hook.get("rules") or []):
        out += validate_rule(rule, f"{path}.rules[{i}]")
    fp = hook.get("failurePolicy")
    if fp is not None and fp not in FAILURE_POLICIES:
        out.append(v.not_supported(f"{path}.failurePolicy", fp, FAILURE_POLICIES))
    mp = hook.get("matchPolicy")
    if mp is not None and mp not in MATCH_POLICIES:
        out.append(v.not_supported(f"{path}.matchPolicy", mp, MATCH_POLICIES))
    se = hook.get("sideEffects")
    if se is None:
        out.append(v.required(f"{path}.sideEffects", "must specify one of " + ", ".join(SIDE_EFFECTS_V1)))
    elif se not in SIDE_EFFECTS_V1:
        out.append(v.not_supported(f"{path}.sideEffects", se, SIDE_EFFECTS_V1))
    ts = hook.get("timeoutSeconds")
    if ts is not None and (v.as_int(ts) is None or not 1 <= ts <= 30):
        out.append(v.invalid(f"{path}.timeoutSeconds", ts, "the timeout value must be between 1 and 30 seconds"))
    versions = hook.get("admissionReviewVersions")
    vpath = f"{path}.admissionReviewVersions"
    if not isinstance(versions, list) or not versions:
        out.append(v.required(vpath, "must specify one of " + ", ".join(ADMISSION_REVIEW_VERSIONS)))
    else:
        seen: set[Any] = set()
        for i, ver in enumerate(versions):
            if not isinstance(ver, str) or not ver:
                out.append(v.required(f"{vpath}[{i}]", ""))
                continue
            if ver in seen:
                out.append(v.invalid(f"{vpath}[{i}]", ver, "duplicate version"))
            seen.add(ver)
        if not seen & set(ADMISSION_REVIEW_VERSIONS):
            out.append(v.invalid(vpath, versions, "must include at least one of "
                                 + ", ".join(ADMISSION_REVIEW_VERSIONS)))
    if mutating:
        rp = hook.get("reinvocationPolicy")
        if rp is not None and rp not in REINVOCATION_POLICIES:
            out.append(v.not_supported(f"{path}.reinvocationPolicy", rp, REINVOCATION_POLICIES))
    out += v.validate_label_selector(hook.get("namespaceSelector"), f"{path}.namespaceSelector")
    out += v.validate_label_selector(hook.get("objectSelector"), f"{path}.objectSelector")
    out += validate_client_config(hook.get("clientConfig"), f"{path}.clientConfig")
    conds = hook.get("matchConditions")
    if conds is not None:
        out += _validate_match_conditions(conds, f"{path}.matchConditions")
    return out


def compile_cause(expression: Any, path: str, variables: frozenset[str],
                  policy_variables: list[str] | None = None) -> list[Cause]:
    """A field error when `expression` does not compile (ValidateValidatingAdmissionPolicy's
    `compilation failed: ...`).  With `policy_variables` (the names a policy expression may
    read as `variables.<name>`), reading any other is `undefined field '<name>'`, as cel-go's
    type check finds it."""
    if not isinstance(expression, str) or not expression.strip():
        return []
    from fleet import cel  # imported on first use: celpy costs ~70 ms to import

    err = cel.compile_error(expression, variables)
    if err is None and policy_variables is not None:
        err = cel.undefined_field_error(cel.compile(expression, variables), "variables", policy_variables)
    return [v.invalid(path, expression, f"compilation failed: {err}")] if err else []


def _validate_match_conditions(conds: Any, path: str, variables: frozenset[str] = WEBHOOK_VARIABLES,
                               policy_variables: list[str] | None = None) -> list[Cause]:
    if not isinstance(conds, list):
        return [v.type_invalid(path, conds, "array")]
    out: list[Cause] = []
    if len(conds) > 64:
        out.append(v.too_many(path, len(conds), 64))
    names: set[str] = set()
    for i, c in enumerate(conds):
        p = f"{path}[{i}]"
        if not isinstance(c, dict):
            out.append(v.type_invalid(p, c, "object"))
            continue
        name = c.get("name")
        if not isinstance(name, str) or not name:
            out.append(v.required(f"{p}.name", ""))
        else:
            for msg in v.is_qualified_name(name):
                out.append(v.invalid(f"{p}.name", name, msg))
            if name in names:
                out.append(v.duplicate(f"{p}.name", name))
            names.add(name)
        if not isinstance(c.get("expression"), str) or not c.get("expression"):
            out.append(v.required(f"{p}.expression", ""))
        else:
            out += compile_cause(c["expression"], f"{p}.expression", variables, policy_variables)
    return out


def _validator(mutating: bool) -> Any:
    def validate(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
        out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
        hooks = obj.get("webhooks")
        if hooks is None:
            return out
        if not isinstance(hooks, list):
            return out + [v.type_invalid("webhooks", hooks, "array")]
        names: set[str] = set()
        for i, h in enumerate(hooks):
            out += validate_webhook(h, f"webhooks[{i}]", mutating=mutating)
            name = h.get("name") if isinstance(h, dict) else None
            if isinstance(name, str) and name:
                if name in names:
                    out.append(v.duplicate(f"webhooks[{i}].name", name))
                names.add(name)
        return out
    return validate


def validate_policy(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The structural part of ValidateValidatingAdmissionPolicy (expressions are not compiled yet)."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec", "")]
    fp = spec.get("failurePolicy")
    if fp is not None and fp not in FAILURE_POLICIES:
        out.append(v.not_supported("spec.failurePolicy", fp, FAILURE_POLICIES))
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        out.append(v.required("spec.validations", "validations or auditAnnotations must contain at least one item"))
    raw_vars = spec.get("variables")
    declared = [var["name"] for var in raw_vars if isinstance(var, dict) and isinstance(var.get("name"), str)] \
        if isinstance(raw_vars, list) else []
    for i, val in enumerate(spec.get("validations") or []):
        if not isinstance(val, dict) or not isinstance(val.get("expression"), str) or not val["expression"].strip():
            out.append(v.required(f"spec.validations[{i}].expression", ""))
            continue
        out += compile_cause(val["expression"], f"spec.validations[{i}].expression", POLICY_VARIABLES, declared)
        out += compile_cause(val.get("messageExpression"), f"spec.validations[{i}].messageExpression",
                             POLICY_VARIABLES, declared)
        reason = val.get("reason")
        if reason is not None and reason not in VALIDATION_REASONS:
            out.append(v.not_supported(f"spec.validations[{i}].reason", reason, VALIDATION_REASONS))
    if spec.get("matchConditions") is not None:
        out += _validate_match_conditions(spec["matchConditions"], "spec.matchConditions", POLICY_VARIABLES,
                                          declared)
    variables = spec.get("variables")
    for i, var in enumerate(variables if isinstance(variables, list) else []):
        if not isinstance(var, dict) or not isinstance(var.get("name"), str) or not var["name"]:
            out.append(v.required(f"spec.variables[{i}].name", ""))
            continue
        if not isinstance(var.get("expression"), str) or not var["expression"].strip():
            out.append(v.required(f"spec.variables[{i}].expression", ""))
            continue
        # A variable may read the variables declared before it.
        out += compile_cause(var["expression"], f"spec.variables[{i}].expression", POLICY_VARIABLES, declared[:i])
    anns = spec.get("auditAnnotations")
    for i, ann in enumerate(anns if isinstance(anns, list) else []):
        if not isinstance(ann, dict):
            continue
        if not isinstance(ann.get("valueExpression"), str) or not ann["valueExpression"].strip():
            out.append(v.required(f"spec.auditAnnotations[{i}].valueExpression", ""))
            continue
        out += compile_cause(ann["valueExpression"], f"spec.auditAnnotations[{i}].valueExpression",
                             POLICY_VARIABLES, declared)
    pk = spec.get("paramKind")
    if pk is not None and (not isinstance(pk, dict) or not pk.get("kind") or not pk.get("apiVersion")):
        out.append(v.required("spec.paramKind.kind" if isinstance(pk, dict) and not pk.get("kind")
                              else "spec.paramKind.apiVersion", ""))
    return out


def validate_policy_binding(obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The structural part of ValidateValidatingAdmissionPolicyBinding."""
    out = v.validate_object_meta(obj.get("metadata"), namespaced=False)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out + [v.required("spec", "")]
    if not spec.get("policyName"):
        out.append(v.required("spec.policyName", ""))
    actions = spec.get("validationActions")
    if not isinstance(actions, list) or not actions:
        out.append(v.required("spec.validationActions", "at least one validation action is required"))
    else:
        seen: set[Any] = set()
        for i, a in enumerate(actions):
            if a not in VALIDATION_ACTIONS:
                out.append(v.not_supported(f"spec.validationActions[{i}]", a, VALIDATION_ACTIONS))
            elif a in seen:
                out.append(v.duplicate(f"spec.validationActions[{i}]", a))
            seen.add(a)
        if "Deny" in seen and "Warn" in seen:
            out.append(v.invalid("spec.validationActions", actions,
                                 'must not contain both "Deny" and "Warn" (repetitive)'))
    return out


# --------------------------------------------------------------------------- kinds

def _webhook_count(o: dict[str, Any]) -> int:
    hooks = o.get("webhooks")
    return len(hooks) if isinstance(hooks, list) else 0


_WEBHOOKS_COL = col("Webhooks", _webhook_count, type="integer",
                    description="Webhooks indicates the number of webhooks in the configuration.")

MUTATING_WEBHOOK_CONFIGURATION = KindInfo(
    group=GROUP, version="v1", kind="MutatingWebhookConfiguration",
    plural="mutatingwebhookconfigurations", singular="mutatingwebhookconfiguration", namespaced=False,
    columns_override=table(_WEBHOOKS_COL),
    default=_defaulter(True), validate=_validator(True),
)

VALIDATING_WEBHOOK_CONFIGURATION = KindInfo(
    group=GROUP, version="v1", kind="ValidatingWebhookConfiguration",
    plural="validatingwebhookconfigurations", singular="validatingwebhookconfiguration", namespaced=False,
    columns_override=table(_WEBHOOKS_COL),
    default=_defaulter(False), validate=_validator(False),
)


def _param_kind(o: dict[str, Any]) -> str:
    pk = (o.get("spec") or {}).get("paramKind") if isinstance(o.get("spec"), dict) else None
    if not isinstance(pk, dict):
        return NONE
    return f"{pk.get('apiVersion', '')}/{pk.get('kind', '')}"


def _default_policy(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("failurePolicy", "Fail")


VALIDATING_ADMISSION_POLICY = KindInfo(
    group=GROUP, version="v1", kind="ValidatingAdmissionPolicy",
    plural="validatingadmissionpolicies", singular="validatingadmissionpolicy", namespaced=False,
    subresources=("status",),  # status.typeChecking, written by the (later) CEL type checker
    columns_override=table(
        col("Validations", lambda o: len((o.get("spec") or {}).get("validations") or []), type="integer",
            description="Validations indicates the number of validation rules in the policy."),
        col("ParamKind", _param_kind, description="ParamKind specifies the kind of resources used to "
                                                  "parameterize this policy"),
    ),
    default=_default_policy, validate=validate_policy,
)


def _param_ref(o: dict[str, Any]) -> str:
    ref = (o.get("spec") or {}).get("paramRef") if isinstance(o.get("spec"), dict) else None
    if not isinstance(ref, dict):
        return NONE
    name = ref.get("name") or "*"
    return f"{ref['namespace']}/{name}" if ref.get("namespace") else str(name)


VALIDATING_ADMISSION_POLICY_BINDING = KindInfo(
    group=GROUP, version="v1", kind="ValidatingAdmissionPolicyBinding",
    plural="validatingadmissionpolicybindings", singular="validatingadmissionpolicybinding", namespaced=False,
    columns_override=table(
        col("PolicyName", lambda o: (o.get("spec") or {}).get("policyName") or NONE,
            description="PolicyName references a ValidatingAdmissionPolicy name."),
        col("ParamRef", _param_ref, description="ParamRef specifies the parameter resource used to configure "
                                                "the admission control policy."),
    ),
    validate=validate_policy_binding,
)

KINDS = (MUTATING_WEBHOOK_CONFIGURATION, VALIDATING_WEBHOOK_CONFIGURATION, VALIDATING_ADMISSION_POLICY,
         VALIDATING_ADMISSION_POLICY_BINDING)
