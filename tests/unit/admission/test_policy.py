"""ValidatingAdmissionPolicy: the decisions (policy_eval.py) and the plugin (policy.py)
over in-memory caches and a real store for params."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from fleet.admission import collect_warnings
from fleet.admission import policy_eval as pe
from fleet.admission.policy import ParamCaches, ValidatingAdmissionPolicy
from fleet.admission.webhook_match import Request
from fleet.api import errors, meta
from fleet.api.kinds.admissionregistration import (
    VALIDATING_ADMISSION_POLICY,
    VALIDATING_WEBHOOK_CONFIGURATION,
)
from fleet.api.registry import default_registry
from fleet.auth import Attributes, UserInfo
from fleet.store import open_store

USER = UserInfo("alice", groups=("devs",))
CREATE = Attributes("create", "apps", "v1", "deployments", "", "default", "web")
RULES = [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
          "resources": ["deployments"]}]


def deploy(replicas: int = 3, name: str = "web", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "labels": dict(labels)},
            "spec": {"replicas": replicas}}


def policy(name: str = "p", **spec: Any) -> dict[str, Any]:
    spec.setdefault("matchConstraints", {"resourceRules": RULES})
    spec.setdefault("validations", [{"expression": "object.spec.replicas <= 5"}])
    return {"metadata": {"name": name}, "spec": spec}


def binding(name: str = "b", policy_name: str = "p", actions: tuple[str, ...] = ("Deny",),
            **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"policyName": policy_name, "validationActions": list(actions),
                                                 **spec}}


def req(obj: dict[str, Any] | None, old: dict[str, Any] | None = None, op: str = "CREATE",
        ns_labels: dict[str, str] | None = None) -> Request:
    return Request(op, "apps", "v1", "deployments", "", "default", True, obj, old, ns_labels or {},
                   frozenset({"v1"}))


def plugin(policies: list[dict[str, Any]], bindings: list[dict[str, Any]], store: Any = None,
           namespaces: dict[str, Any] | None = None) -> ValidatingAdmissionPolicy:
    return ValidatingAdmissionPolicy(store, default_registry(), {p["metadata"]["name"]: p for p in policies},
                                     {b["metadata"]["name"]: b for b in bindings},
                                     namespaces if namespaces is not None else {}, ParamCaches())


@contextmanager
def audit() -> Iterator[dict[str, str]]:
    from fleet.auth.audit import CURRENT

    ra = SimpleNamespace(annotations={})
    token = CURRENT.set(ra)  # type: ignore[arg-type]
    try:
        yield ra.annotations
    finally:
        CURRENT.reset(token)


# --------------------------------------------------------------------------- matching

def test_match_constraints_rules_excludes_names_and_selectors() -> None:
    b = binding()
    assert pe.binding_applies(policy(), b, req(deploy()))
    assert not pe.binding_applies(policy(), b, req(None, deploy(), op="DELETE"))  # not in operations
    p = policy(matchConstraints={"resourceRules": RULES, "excludeResourceRules": [
        {**RULES[0], "resourceNames": ["web"]}]})
    assert not pe.binding_applies(p, b, req(deploy()))
    assert pe.binding_applies(p, b, req(deploy(name="api")))
    p = policy(matchConstraints={"resourceRules": [{**RULES[0], "resourceNames": ["api"]}]})
    assert not pe.binding_applies(p, b, req(deploy()))
    p = policy(matchConstraints={"resourceRules": RULES, "objectSelector": {"matchLabels": {"tier": "web"}},
                                 "namespaceSelector": {"matchLabels": {"env": "prod"}}})
    assert not pe.binding_applies(p, b, req(deploy(tier="web"), ns_labels={"env": "dev"}))
    assert not pe.binding_applies(p, b, req(deploy(), ns_labels={"env": "prod"}))
    assert pe.binding_applies(p, b, req(deploy(tier="web"), ns_labels={"env": "prod"}))
    # A policy without matchConstraints matches nothing; policies are never judged.
    assert not pe.binding_applies({"metadata": {"name": "p"}, "spec": {}}, b, req(deploy()))
    exempt = Request("CREATE", "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "", "",
                     False, {}, None, None)
    star = policy(matchConstraints={"resourceRules": [{"operations": ["*"], "apiGroups": ["*"],
                                                       "apiVersions": ["*"], "resources": ["*"]}]})
    assert not pe.binding_applies(star, b, exempt)


def test_binding_match_resources_narrows() -> None:
    b = binding(matchResources={"namespaceSelector": {"matchLabels": {"env": "prod"}}})
    assert pe.binding_applies(policy(), b, req(deploy(), ns_labels={"env": "prod"}))
    assert not pe.binding_applies(policy(), b, req(deploy(), ns_labels={"env": "dev"}))
    b = binding(matchResources={"resourceRules": [{**RULES[0], "operations": ["UPDATE"]}]})
    assert not pe.binding_applies(policy(), b, req(deploy()))
    assert pe.binding_applies(policy(), b, req(deploy(), deploy(), op="UPDATE"))


# --------------------------------------------------------------------------- params

def test_param_lookup_and_selection() -> None:
    b = binding(paramRef={"name": "limits", "parameterNotFoundAction": "Deny"})
    lk = pe.param_lookup(b, req(deploy()), param_namespaced=True)
    assert (lk.namespace, lk.name, lk.allow_missing) == ("default", "limits", False)
    assert pe.param_lookup(binding(paramRef={"name": "x", "namespace": "cfg"}), req(deploy()), True).namespace == "cfg"
    assert pe.param_lookup(binding(paramRef={"name": "x"}), req(deploy()), False).namespace is None
    with pytest.raises(pe.ConfigError, match="^failed to configure binding: paramRef is required"):
        pe.param_lookup(binding(), req(deploy()), True)
    cluster = Request("CREATE", "", "v1", "nodes", "", "", False, {}, None, None)
    with pytest.raises(pe.ConfigError, match="namespaced paramKind"):
        pe.param_lookup(binding(paramRef={"name": "x"}), cluster, True)
    objs = [{"metadata": {"name": n, "labels": {"k": n}}} for n in ("b", "a", "c")]
    with pytest.raises(pe.ConfigError, match="^failed to configure binding: no params found for policy binding "
                                             "with `Deny` parameterNotFoundAction$"):
        pe.select_params(lk, objs)
    sel = pe.ParamLookup("default", None, {"matchExpressions": [{"key": "k", "operator": "In",
                                                                  "values": ["a", "c"]}]}, False)
    assert [o["metadata"]["name"] for o in pe.select_params(sel, objs)] == ["a", "c"]
    assert pe.select_params(pe.ParamLookup("default", "zz", None, True), objs) == []


# --------------------------------------------------------------------------- evaluation

def act(obj: dict[str, Any] | None, params: dict[str, Any] | None = None,
        variables: list[dict[str, Any]] | None = None, old: dict[str, Any] | None = None) -> dict[str, Any]:
    return pe.build_activation(obj=obj, old=old, request={"operation": "CREATE", "userInfo": {"username": "alice"}},
                               params=params, namespace_object={"metadata": {"name": "default"}},
                               variables=variables or [])


def test_messages_message_expression_and_default() -> None:
    p = policy(validations=[
        {"expression": "object.spec.replicas <= 1"},
        {"expression": "object.spec.replicas <= 2", "message": "too many"},
        {"expression": "object.spec.replicas <= 2", "message": "static",
         "messageExpression": "'replicas ' + string(object.spec.replicas) + ' > 2'"},
        {"expression": "object.spec.replicas <= 2", "message": "fallback", "messageExpression": "object.nope"},
        {"expression": "object.spec.replicas <= 2", "reason": "Forbidden"},
        {"expression": "object.spec.replicas >= 1"},
    ])
    out = pe.evaluate(p, act(deploy(3)))
    assert out is not None
    assert [(f.message, f.reason, f.index) for f in out.failures] == [
        ("failed expression: object.spec.replicas <= 1", "Invalid", 0),
        ("too many", "Invalid", 1),
        ("replicas 3 > 2", "Invalid", 2),
        ("fallback", "Invalid", 3),
        ("failed expression: object.spec.replicas <= 2", "Forbidden", 4)]


def test_errors_follow_failure_policy() -> None:
    p = policy(validations=[{"expression": "object.spec.paused == false"}, {"expression": "'a'"}])
    out = pe.evaluate(p, act(deploy()))
    assert out is not None and [f.message for f in out.failures] == [
        "expression 'object.spec.paused == false' resulted in error: no such key: paused",
        "expression ''a'' resulted in error: expected boolean value, got string"]
    out = pe.evaluate(policy(failurePolicy="Ignore", validations=p["spec"]["validations"]), act(deploy()))
    assert out is not None and out.failures == []


def test_match_conditions_params_variables_and_namespace_object() -> None:
    p = policy(
        matchConditions=[{"name": "not-alice", "expression": "request.userInfo.username != 'bob'"}],
        variables=[{"name": "limit", "expression": "int(params.data.maxReplicas)"},
                   {"name": "over", "expression": "object.spec.replicas > variables.limit"}],
        validations=[{"expression": "!variables.over", "messageExpression":
                      "'at most ' + string(variables.limit) + ' in ' + namespaceObject.metadata.name"}])
    params = {"data": {"maxReplicas": "2"}}
    out = pe.evaluate(p, act(deploy(3), params, p["spec"]["variables"]))
    assert out is not None and [f.message for f in out.failures] == ["at most 2 in default"]
    assert pe.evaluate(p, act(deploy(2), params, p["spec"]["variables"])).failures == []  # type: ignore[union-attr]
    skipped = policy(matchConditions=[{"name": "never", "expression": "false"}])
    assert pe.evaluate(skipped, act(deploy(9))) is None
    broken = policy(matchConditions=[{"name": "err", "expression": "object.nope"}])
    out = pe.evaluate(broken, act(deploy(9)))
    assert out is not None and out.failures[0].message == "expression 'object.nope' resulted in error: no such key: nope"
    # A variable's error reaches the expression that reads it.
    bad = policy(variables=[{"name": "x", "expression": "object.nope"}], validations=[{"expression": "variables.x"}])
    out = pe.evaluate(bad, act(deploy(), None, bad["spec"]["variables"]))
    assert out is not None and 'composited variable "x"' in out.failures[0].message


def test_audit_annotations() -> None:
    p = policy(validations=[], auditAnnotations=[
        {"key": "replicas", "valueExpression": "'replicas=' + string(object.spec.replicas)"},
        {"key": "none", "valueExpression": "null"}, {"key": "blank", "valueExpression": "'  '"},
        {"key": "int", "valueExpression": "1"}, {"key": "err", "valueExpression": "object.nope"}])
    out = pe.evaluate(p, act(deploy(4)))
    assert out is not None and out.annotations == {"p/replicas": "replicas=4"}
    assert out.failures == []
    assert out.errors == ["valueExpression '1' resulted in unsupported return type: int. Return type must be "
                          "either string or null.",
                          "expression 'object.nope' resulted in error: no such key: nope"]
    v = pe.Verdict()
    v.add_annotations({"p/k": "a"})
    v.add_annotations({"p/k": "b"})
    v.add_annotations({"p/k": "a"})
    assert v.annotation_values() == {"p/k": "a, b"}


def test_actions() -> None:
    v = pe.Verdict()
    fails = [pe.Failure("too many", "Forbidden", 0)]
    pe.apply_actions(v, "p", binding("warn", actions=("Warn", "Audit")), fails)
    pe.apply_actions(v, "p", binding("deny", actions=("Deny",)), fails)
    assert v.denial == ("ValidatingAdmissionPolicy 'p' with binding 'deny' denied request: too many", "Forbidden")
    assert v.warnings == ["Validation failed for ValidatingAdmissionPolicy 'p' with binding 'warn': too many"]
    assert v.audit_value() == ('[{"message":"too many","policy":"p","binding":"warn","expressionIndex":0,'
                               '"validationActions":["Warn","Audit"]}]')
    v.deny("p", "other", "failed to configure binding: x")
    assert v.denial[0].endswith("with binding 'deny' denied request: too many")  # the first denial wins
    assert [pe.reason_code(r) for r in ("Forbidden", "Invalid", "Unauthorized", "RequestEntityTooLarge")] == [
        403, 422, 401, 413]


# --------------------------------------------------------------------------- the plugin

async def test_plugin_denies_with_kube_message_and_code() -> None:
    p = plugin([policy(validations=[{"expression": "object.spec.replicas <= 5", "reason": "Forbidden"}])],
               [binding()])
    await p.validate(CREATE, USER, deploy(5), None)
    with pytest.raises(errors.APIError) as ei:
        await p.validate(CREATE, USER, deploy(6), None)
    assert ei.value.code == 403 and ei.value.reason == "Forbidden"
    assert ei.value.message == ('deployments.apps "web" is forbidden: ValidatingAdmissionPolicy \'p\' with binding '
                                "'b' denied request: failed expression: object.spec.replicas <= 5")
    # The default reason is Invalid (422), as kube-apiserver.
    with pytest.raises(errors.APIError) as ei:
        await plugin([policy()], [binding()]).validate(CREATE, USER, deploy(6), None)
    assert (ei.value.code, ei.value.reason) == (422, "Invalid")


async def test_plugin_warn_and_audit_do_not_refuse() -> None:
    p = plugin([policy(auditAnnotations=[{"key": "r", "valueExpression": "string(object.spec.replicas)"}])],
               [binding("w", actions=("Warn",)), binding("a", actions=("Audit",))])
    with collect_warnings() as warnings, audit() as annotations:
        await p.validate(CREATE, USER, deploy(9), None)
    assert warnings == ["Validation failed for ValidatingAdmissionPolicy 'p' with binding 'w': failed expression: "
                        "object.spec.replicas <= 5"]
    assert annotations["p/r"] == "9"
    assert json.loads(annotations[pe.VALIDATION_FAILURE_ANNOTATION])[0]["binding"] == "a"


async def test_plugin_ignores_unbound_and_unmatched() -> None:
    p = plugin([policy()], [binding(policy_name="missing")])
    await p.validate(CREATE, USER, deploy(9), None)
    p = plugin([policy()], [binding()])
    await p.validate(Attributes("create", "", "v1", "configmaps", "", "default", "c"), USER,
                     {"metadata": {"name": "c"}}, None)
    await p.validate(Attributes("get", "apps", "v1", "deployments", "", "default", "web"), USER, deploy(9), None)


async def test_plugin_config_errors_deny_whatever_the_actions(tmp_path: Any) -> None:
    unk = policy(paramKind={"apiVersion": "example.com/v1", "kind": "Nope"})
    p = plugin([unk], [binding(actions=("Warn",), paramRef={"name": "x"})])
    with pytest.raises(errors.APIError) as ei:
        await p.validate(CREATE, USER, deploy(1), None)
    assert ei.value.code == 422 and ei.value.message.endswith(
        "with binding 'b' denied request: failed to configure policy: failed to find resource referenced by "
        "paramKind: 'example.com/v1, Kind=Nope'")
    # An auditAnnotation error under Fail refuses even an Audit-only binding.
    bad = policy(validations=[], auditAnnotations=[{"key": "k", "valueExpression": "object.nope"}])
    with pytest.raises(errors.APIError, match="resulted in error: no such key: nope"):
        await plugin([bad], [binding(actions=("Audit",))]).validate(CREATE, USER, deploy(1), None)


async def test_plugin_params_from_the_store(tmp_path: Any) -> None:
    pol = policy(paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
                 validations=[{"expression": "object.spec.replicas <= int(params.data.max)",
                               "messageExpression": "'replicas must be <= ' + params.data.max"}])
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        p = plugin([pol], [binding(paramRef={"name": "limits", "parameterNotFoundAction": "Deny"})], store)
        with pytest.raises(errors.APIError, match="no params found for policy binding with `Deny`"):
            await p.validate(CREATE, USER, deploy(1), None)
        await store.create(meta.store_key("", "configmaps", "default", "limits"), {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "limits", "namespace": "default"},
            "data": {"max": "3"}})
        await p.validate(CREATE, USER, deploy(3), None)
        with pytest.raises(errors.APIError, match="denied request: replicas must be <= 3$"):
            await p.validate(CREATE, USER, deploy(4), None)
        # Allow: a missing param means the binding does not apply.
        p = plugin([pol], [binding(paramRef={"name": "other", "parameterNotFoundAction": "Allow"})], store)
        await p.validate(CREATE, USER, deploy(9), None)
        # failurePolicy Ignore: a missing param is no refusal either.
        ign = copy.deepcopy(pol)
        ign["spec"]["failurePolicy"] = "Ignore"
        await plugin([ign], [binding(paramRef={"name": "other"})], store).validate(CREATE, USER, deploy(9), None)
        # An unknown paramKind is a misconfiguration.
        unk = policy(paramKind={"apiVersion": "example.com/v1", "kind": "Nope"})
        with pytest.raises(errors.APIError, match="failed to find resource referenced by paramKind: "
                                                  "'example.com/v1, Kind=Nope'"):
            await plugin([unk], [binding(paramRef={"name": "x"})], store).validate(CREATE, USER, deploy(1), None)


# --------------------------------------------------------------------------- compile at creation

def causes(info: Any, obj: dict[str, Any]) -> dict[str, str]:
    if info.default:
        info.default(obj)
    return {c["field"]: c["message"] for c in info.validate(obj, None)}


def test_policy_expressions_compile_at_creation() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {
        "matchConstraints": {"resourceRules": RULES},
        "validations": [{"expression": "object.spec.replicas <", "messageExpression": "nope"},
                        {"expression": "true", "reason": "Teapot"}],
        "matchConditions": [{"name": "c", "expression": "request.foo("}],
        "variables": [{"name": "v", "expression": "self.x"}],
        "auditAnnotations": [{"key": "k", "valueExpression": "1 +"}]}}
    got = causes(VALIDATING_ADMISSION_POLICY, obj)
    assert got["spec.validations[0].expression"].startswith(
        'Invalid value: "object.spec.replicas <": compilation failed: ERROR: <input>:1:23: Syntax error: ')
    assert got["spec.validations[0].messageExpression"] == (
        "Invalid value: \"nope\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'nope' "
        "(in container '')\n | nope\n | ^")
    assert got["spec.validations[1].reason"].startswith('Unsupported value: "Teapot"')
    assert "compilation failed" in got["spec.matchConditions[0].expression"]
    assert "undeclared reference to 'self'" in got["spec.variables[0].expression"]
    assert "compilation failed" in got["spec.auditAnnotations[0].valueExpression"]
    ok = {"metadata": {"name": "p"}, "spec": {"matchConstraints": {"resourceRules": RULES},
                                              "variables": [{"name": "x", "expression": "true"}], "validations": [
        {"expression": "object.spec.replicas <= params.max && variables.x", "messageExpression": "'m'"}]}}
    assert causes(VALIDATING_ADMISSION_POLICY, ok) == {}


def test_undefined_policy_variables_do_not_compile() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {
        "matchConstraints": {"resourceRules": RULES},
        "variables": [{"name": "a", "expression": "variables.b"}, {"name": "b", "expression": "variables.a"}],
        "validations": [{"expression": "variables.limt > 1", "messageExpression": "string(variables.b)"}]}}
    got = causes(VALIDATING_ADMISSION_POLICY, obj)
    assert got == {
        "spec.variables[0].expression": "Invalid value: \"variables.b\": compilation failed: ERROR: <input>:1:10: "
                                        "undefined field 'b'\n | variables.b\n | .........^",
        "spec.validations[0].expression": "Invalid value: \"variables.limt > 1\": compilation failed: ERROR: "
                                          "<input>:1:10: undefined field 'limt'\n | variables.limt > 1\n | .........^"}


def test_webhook_match_conditions_compile_at_creation() -> None:
    hook = {"name": "h.example.com", "clientConfig": {"url": "https://127.0.0.1/"}, "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "rules": RULES,
            "matchConditions": [{"name": "ok", "expression": "request.userInfo.username != 'x'"},
                                {"name": "params", "expression": "params.x == 1"}]}
    got = causes(VALIDATING_WEBHOOK_CONFIGURATION, {"metadata": {"name": "c"}, "webhooks": [hook]})
    assert list(got) == ["webhooks[0].matchConditions[1].expression"]
    assert "undeclared reference to 'params'" in got["webhooks[0].matchConditions[1].expression"]


# --------------------------------------------------------------------------- authorizer

class FakeAuthorizer:
    """Allows alice to delete deployments in `default`, and service account ns/sa to list pods."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Attributes]] = []

    def authorize(self, user: UserInfo, attrs: Attributes) -> Any:
        from fleet.auth import Decision

        self.asked.append((user.name, attrs))
        if user.name == "alice" and attrs.verb == "delete" and attrs.resource == "deployments" \
                and attrs.namespace == "default":
            return Decision(True, "RBAC: allowed by RoleBinding")
        if user.name == "system:serviceaccount:ns:sa" and attrs.resource == "pods" and attrs.verb == "list":
            return Decision(True, "")
        if attrs.path == "/healthz":
            return Decision(True, "")
        return Decision(False, "nope")


async def test_plugin_authorizer_checks() -> None:
    authz = FakeAuthorizer()
    pol = policy(validations=[
        {"expression": "authorizer.group('apps').resource('deployments').namespace('default').check('delete')"
                       ".allowed()", "message": "may not delete"},
        {"expression": "authorizer.requestResource.check('delete').allowed()", "message": "request resource"},
        {"expression": "authorizer.serviceAccount('ns', 'sa').group('').resource('pods').check('list').allowed()"},
        {"expression": "authorizer.path('/healthz').check('get').allowed()"},
        {"expression": "authorizer.group('').resource('secrets').check('get').reason() == 'nope'"},
        {"expression": "!authorizer.group('').resource('secrets').check('get').errored()"},
    ])
    p = ValidatingAdmissionPolicy(None, default_registry(), {"p": pol}, {"b": binding()}, {}, ParamCaches(),
                                  authz)
    await p.validate(CREATE, USER, deploy(1), None)
    # The requestResource check carries the request's resource, namespace and name; version `*`.
    rr = [a for u, a in authz.asked if u == "alice" and a.name == "web"]
    assert rr and (rr[0].group, rr[0].version, rr[0].resource, rr[0].namespace) == ("apps", "*", "deployments",
                                                                                     "default")
    with pytest.raises(errors.APIError, match="denied request: may not delete$"):
        await p.validate(CREATE, UserInfo("bob"), deploy(1), None)


def test_authorizer_without_a_server_authorizer_errors() -> None:
    p = policy(validations=[{"expression": "authorizer.path('/x').check('get').errored() && "
                                           "authorizer.path('/x').check('get').error() == 'no authorizer is configured'"}])
    out = pe.evaluate(p, act(deploy()))
    assert out is not None and out.failures == []
