"""The webhook admission plugins (fleet/admission/webhook.py) with the HTTPS call replaced.

The transport is a fake that answers per webhook name and records what it was sent, so
these tests cover ordering, patch chaining, reinvocation, parallel validation, the
failure policies, dry-run refusal, warnings and the Service resolution — the HTTPS
call itself is covered end to end in tests/e2e/test_admission_webhooks.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
import trio

from fleet.admission import collect_warnings
from fleet.admission.webhook import (
    MUTATING_PREFIX,
    MutatingWebhooks,
    ValidatingWebhooks,
    WebhookConfigCache,
    resolve_service,
)
from fleet.admission.webhook_review import CallError
from fleet.api import errors, meta
from fleet.api.registry import default_registry
from fleet.auth import Attributes, UserInfo
from fleet.store import open_store

USER = UserInfo("alice", groups=("devs",))
ATTRS = Attributes("create", "", "v1", "configmaps", "", "default", "cm")


def cm(**labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default",
                                                                  "labels": dict(labels)}}


def hook(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "clientConfig": {"url": f"https://{name}/"}, "sideEffects": "None",
            "failurePolicy": "Fail", "admissionReviewVersions": ["v1"],
            "rules": [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                       "scope": "*"}], **kw}


def cache_of(*hooks: dict[str, Any], cfg: str = "c") -> WebhookConfigCache:
    cache = WebhookConfigCache(MUTATING_PREFIX)
    cache.put({"metadata": {"name": cfg}, "webhooks": list(hooks)})
    return cache


def patch_label(key: str, value: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def answer(req: dict[str, Any]) -> dict[str, Any]:
        labels = req["object"]["metadata"].get("labels") or {}
        if labels.get(key) == value:
            return {"allowed": True}
        ops = [{"op": "add", "path": f"/metadata/labels/{key}", "value": value}]
        return {"allowed": True, "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    return answer


class FakeTransport:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, store: Any, hook: dict[str, Any], review: dict[str, Any]) -> bytes:
        name = hook["name"]
        self.calls.append((name, review["request"]))
        a = self.answers[name]
        if isinstance(a, Exception):
            raise a
        if a == "slow":
            await trio.sleep(0.05)
            a = {"allowed": True}
        resp = a(review["request"]) if callable(a) else dict(a)
        resp["uid"] = review["request"]["uid"]
        return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": resp}).encode()


def mutating(t: FakeTransport, *hooks: dict[str, Any]) -> MutatingWebhooks:
    return MutatingWebhooks(None, default_registry(), cache_of(*hooks), {}, call=t)  # type: ignore[arg-type]


def validating(t: FakeTransport, *hooks: dict[str, Any]) -> ValidatingWebhooks:
    return ValidatingWebhooks(None, default_registry(), cache_of(*hooks), {}, call=t)  # type: ignore[arg-type]


async def test_no_configuration_changes_nothing() -> None:
    t = FakeTransport({})
    p = MutatingWebhooks(None, default_registry(), WebhookConfigCache(MUTATING_PREFIX), {},  # type: ignore[arg-type]
                         call=t)
    obj = cm()
    assert await p.mutate(ATTRS, USER, obj, None) is obj and t.calls == []


async def test_mutating_in_order_each_seeing_the_previous_result() -> None:
    t = FakeTransport({"a.x.test": patch_label("a", "1"), "b.x.test": patch_label("b", "2")})
    out = await mutating(t, hook("a.x.test"), hook("b.x.test")).mutate(ATTRS, USER, cm(), None)
    assert out["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert [n for n, _ in t.calls] == ["a.x.test", "b.x.test"]
    assert t.calls[1][1]["object"]["metadata"]["labels"] == {"a": "1"}
    req = t.calls[0][1]
    assert req["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"} and req["operation"] == "CREATE"
    assert req["userInfo"] == {"username": "alice", "groups": ["devs"]}


async def test_reinvocation_if_needed() -> None:
    t = FakeTransport({"a.x.test": patch_label("a", "1"), "b.x.test": patch_label("b", "2")})
    await mutating(t, hook("a.x.test", reinvocationPolicy="IfNeeded"), hook("b.x.test")).mutate(
        ATTRS, USER, cm(), None)
    # b changed the object after a ran: a is called once more (and only once).
    assert [n for n, _ in t.calls] == ["a.x.test", "b.x.test", "a.x.test"]
    t2 = FakeTransport({"a.x.test": patch_label("a", "1"), "b.x.test": patch_label("b", "2")})
    await mutating(t2, hook("a.x.test", reinvocationPolicy="Never"), hook("b.x.test")).mutate(
        ATTRS, USER, cm(), None)
    assert [n for n, _ in t2.calls] == ["a.x.test", "b.x.test"]
    t3 = FakeTransport({"a.x.test": patch_label("a", "1"), "b.x.test": {"allowed": True}})
    await mutating(t3, hook("a.x.test", reinvocationPolicy="IfNeeded"), hook("b.x.test")).mutate(
        ATTRS, USER, cm(), None)
    assert [n for n, _ in t3.calls] == ["a.x.test", "b.x.test"]  # nothing changed after a


async def test_validating_in_parallel_first_refusal_in_order() -> None:
    t = FakeTransport({"a.x.test": "slow", "b.x.test": {"allowed": False, "status": {"message": "no b"}},
                       "c.x.test": {"allowed": False, "status": {"message": "no c"}}})
    p = validating(t, hook("a.x.test"), hook("b.x.test"), hook("c.x.test"))
    with trio.fail_after(0.5):
        with pytest.raises(errors.APIError) as e:
            await p.validate(ATTRS, USER, cm(), None)
    assert e.value.message == 'admission webhook "b.x.test" denied the request: no b'
    assert e.value.code == 400
    assert sorted(n for n, _ in t.calls) == ["a.x.test", "b.x.test", "c.x.test"]


async def test_failure_policies_and_warnings() -> None:
    t = FakeTransport({"f.x.test": CallError("context deadline exceeded"),
                       "i.x.test": CallError("connection refused"),
                       "w.x.test": {"allowed": True, "warnings": ["mind the gap"]}})
    with pytest.raises(errors.APIError) as e:
        await validating(t, hook("f.x.test")).validate(ATTRS, USER, cm(), None)
    assert e.value.code == 500
    assert e.value.message == ('Internal error occurred: failed calling webhook "f.x.test": '
                               "context deadline exceeded")
    with collect_warnings() as got:
        await validating(t, hook("i.x.test", failurePolicy="Ignore"), hook("w.x.test")).validate(
            ATTRS, USER, cm(), None)
    # Validating webhooks run in parallel: the warnings come in either order.
    assert sorted(got) == ['failed calling webhook "i.x.test": connection refused; the request was admitted '
                           "(failurePolicy Ignore)", "mind the gap"]


async def test_patch_from_validating_webhook_is_a_failure() -> None:
    t = FakeTransport({"v.x.test": patch_label("a", "1")})
    with pytest.raises(errors.APIError, match="validating webhooks may not return patches"):
        await validating(t, hook("v.x.test")).validate(ATTRS, USER, cm(), None)


async def test_patch_may_not_rename() -> None:
    def rename(req: dict[str, Any]) -> dict[str, Any]:
        ops = [{"op": "replace", "path": "/metadata/name", "value": "other"}]
        return {"allowed": True, "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    t = FakeTransport({"r.x.test": rename})
    with pytest.raises(errors.APIError, match="may not change metadata.name"):
        await mutating(t, hook("r.x.test")).mutate(ATTRS, USER, cm(), None)


async def test_dry_run_needs_side_effect_free_webhooks() -> None:
    attrs = Attributes("create", "", "v1", "configmaps", "", "default", "cm", True)
    t = FakeTransport({"s.x.test": {"allowed": True}, "n.x.test": {"allowed": True}})
    with pytest.raises(errors.APIError) as e:
        await validating(t, hook("s.x.test", sideEffects="Some")).validate(attrs, USER, cm(), None)
    assert (e.value.code, e.value.message) == (400, 'admission webhook "s.x.test" does not support dry run')
    assert t.calls == []
    await validating(t, hook("n.x.test", sideEffects="NoneOnDryRun")).validate(attrs, USER, cm(), None)
    assert t.calls[0][1]["dryRun"] is True


async def test_namespace_selector_reads_the_namespace_labels() -> None:
    t = FakeTransport({"n.x.test": {"allowed": False}})
    namespaces = {"default": {"metadata": {"name": "default", "labels": {"webhooks": "on"}}},
                  "other": {"metadata": {"name": "other"}}}
    p = ValidatingWebhooks(None, default_registry(),  # type: ignore[arg-type]
                           cache_of(hook("n.x.test", namespaceSelector={"matchLabels": {"webhooks": "on"}})),
                           namespaces, call=t)
    with pytest.raises(errors.APIError, match="denied the request without explanation"):
        await p.validate(ATTRS, USER, cm(), None)
    await p.validate(Attributes("create", "", "v1", "configmaps", "", "other", "cm"), USER, cm(), None)
    assert len(t.calls) == 1


async def test_resolve_service_to_an_endpoint(tmp_path: Any) -> None:
    async with open_store(tmp_path / "fleet.db", sync="NORMAL", compact_interval=0) as store:
        ref = {"namespace": "hooks", "name": "svc", "port": 443}
        with pytest.raises(CallError, match='service "svc" not found'):
            await resolve_service(store, ref)
        await store.create(meta.store_key("", "services", "hooks", "svc"), {
            "metadata": {"name": "svc", "namespace": "hooks"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}})
        with pytest.raises(CallError, match='endpoints "svc" not found'):
            await resolve_service(store, ref)
        await store.create(meta.store_key("", "endpoints", "hooks", "svc"), {
            "metadata": {"name": "svc", "namespace": "hooks"},
            "subsets": [{"notReadyAddresses": [{"ip": "10.0.0.9"}], "ports": [{"name": "https", "port": 8443}]},
                        {"addresses": [{"ip": "10.0.0.5"}], "ports": [{"name": "https", "port": 8443}]}]})
        assert await resolve_service(store, ref) == ("10.0.0.5", 8443)
        with pytest.raises(CallError, match="has no port 444"):
            await resolve_service(store, {**ref, "port": 444})


async def test_subresource_kinds_in_the_review() -> None:
    t = FakeTransport({"e.x.test": {"allowed": True}})
    h = hook("e.x.test", rules=[{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                 "resources": ["pods/eviction"], "scope": "*"}])
    attrs = Attributes("create", "", "v1", "pods", "eviction", "default", "p")
    await validating(t, h).validate(attrs, USER, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                  "metadata": {"name": "p"}}, None)
    req = t.calls[0][1]
    assert req["kind"] == {"group": "policy", "version": "v1", "kind": "Eviction"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert req["subResource"] == "eviction"


NOT_SYSTEM = {"name": "not-system", "expression": "!request.userInfo.username.startsWith('system:')"}


async def test_match_conditions_all_true_calls_any_false_skips() -> None:
    t = FakeTransport({"m.x.test": {"allowed": True}, "n.x.test": {"allowed": True}})
    p = validating(t, hook("m.x.test", matchConditions=[NOT_SYSTEM]),
                   hook("n.x.test", matchConditions=[
                       NOT_SYSTEM, {"name": "labelled", "expression": "has(object.metadata.labels.team)"}]))
    await p.validate(ATTRS, USER, cm(), None)
    assert [c[0] for c in t.calls] == ["m.x.test"]  # n: its second condition is false
    t.calls.clear()
    await p.validate(ATTRS, UserInfo("system:node:a"), cm(team="x"), None)
    assert t.calls == []  # the first condition is false for both


async def test_match_condition_sees_object_old_object_and_request() -> None:
    t = FakeTransport({"m.x.test": {"allowed": True}})
    cond = {"name": "scaled", "expression": "request.operation == 'UPDATE' && oldObject.metadata.labels.v != "
                                            "object.metadata.labels.v && request.userInfo.groups.exists(g, g == 'devs')"}
    p = validating(t, hook("m.x.test", matchConditions=[cond]))
    await p.validate(Attributes("update", "", "v1", "configmaps", "", "default", "cm"), USER, cm(v="2"), cm(v="1"))
    await p.validate(Attributes("update", "", "v1", "configmaps", "", "default", "cm"), USER, cm(v="1"), cm(v="1"))
    assert len(t.calls) == 1


async def test_match_condition_error_follows_failure_policy() -> None:
    err = {"name": "missing", "expression": "object.spec.nothing == 1"}  # ConfigMaps have no spec
    t = FakeTransport({"m.x.test": {"allowed": True}})
    with pytest.raises(errors.APIError) as ei:
        await validating(t, hook("m.x.test", matchConditions=[err])).validate(ATTRS, USER, cm(), None)
    assert ei.value.code == 500
    assert ei.value.message == ('Internal error occurred: failed calling webhook "m.x.test": failed to evaluate '
                                "match conditions: expression 'object.spec.nothing == 1' resulted in error: "
                                "no such key: spec")
    await validating(t, hook("m.x.test", failurePolicy="Ignore", matchConditions=[err])).validate(
        ATTRS, USER, cm(), None)
    assert t.calls == []
    # A false condition wins over an error: not called, not refused.
    await validating(t, hook("m.x.test", matchConditions=[err, {"name": "f", "expression": "false"}])).validate(
        ATTRS, USER, cm(), None)
    assert t.calls == []


async def test_mutating_webhook_match_conditions() -> None:
    t = FakeTransport({"m.x.test": patch_label("seen", "yes")})
    p = mutating(t, hook("m.x.test", matchConditions=[{"name": "opt-in",
                                                       "expression": "object.metadata.labels['inject'] == 'true'"}]))
    out = await p.mutate(ATTRS, USER, cm(inject="false"), None)
    assert "seen" not in out["metadata"]["labels"] and t.calls == []
    out = await p.mutate(ATTRS, USER, cm(inject="true"), None)
    assert out["metadata"]["labels"]["seen"] == "yes"


async def test_audit_annotations_prefixed_with_the_webhook_name() -> None:
    from types import SimpleNamespace

    from fleet.auth.audit import CURRENT

    ra = SimpleNamespace(annotations={})
    token = CURRENT.set(ra)  # type: ignore[arg-type]
    try:
        t = FakeTransport({"a.x.test": {"allowed": True, "auditAnnotations": {"decision": "ok"}}})
        await validating(t, hook("a.x.test")).validate(ATTRS, USER, cm(), None)
    finally:
        CURRENT.reset(token)
    assert ra.annotations == {"a.x.test/decision": "ok"}


async def test_malformed_stored_configurations_do_not_break_requests() -> None:
    cache = WebhookConfigCache(MUTATING_PREFIX)
    cache.put({"metadata": {"name": "a"}, "webhooks": 5})
    cache.put({"metadata": {"name": "b"}, "webhooks": [{"name": "b.x.test", "rules": [{"operations": ["*"],
                                                       "apiGroups": ["*"], "apiVersions": ["*"],
                                                       "resources": ["*"]}], "objectSelector": "oops"}]})
    t = FakeTransport({"c.x.test": {"allowed": True}})
    cache.put({"metadata": {"name": "c"}, "webhooks": [hook("c.x.test", clientConfig=None)]})
    p = ValidatingWebhooks(None, default_registry(), cache, {}, call=t)  # type: ignore[arg-type]
    await p.validate(ATTRS, USER, cm(), None)
    assert [n for n, _ in t.calls] == ["c.x.test"]


async def test_equivalent_match_for_hpas_through_the_registry() -> None:
    t = FakeTransport({"h.x.test": {"allowed": False, "status": {"message": "no"}}})
    h = hook("h.x.test", rules=[{"operations": ["CREATE"], "apiGroups": ["autoscaling"], "apiVersions": ["v1"],
                                 "resources": ["horizontalpodautoscalers"], "scope": "*"}])
    attrs = Attributes("create", "autoscaling", "v2", "horizontalpodautoscalers", "", "default", "h")
    with pytest.raises(errors.APIError, match="denied the request: no"):
        await validating(t, h).validate(attrs, USER, {"metadata": {"name": "h"}}, None)
    assert t.calls[0][1]["kind"] == {"group": "autoscaling", "version": "v2", "kind": "HorizontalPodAutoscaler"}
    await validating(t, {**h, "matchPolicy": "Exact"}).validate(attrs, USER, {"metadata": {"name": "h"}}, None)
    assert len(t.calls) == 1


async def test_match_condition_with_the_authorizer() -> None:
    from fleet.auth import Decision

    class Admins:
        def authorize(self, user: UserInfo, attrs: Attributes) -> Decision:
            return Decision(user.name == "root" and attrs.verb == "*", "")

    t = FakeTransport({"m.x.test": {"allowed": True}})
    h = hook("m.x.test", matchConditions=[{"name": "not-admins", "expression":
                                           "!authorizer.group('').resource('configmaps').check('*').allowed()"}])
    p = ValidatingWebhooks(None, default_registry(), cache_of(h), {}, call=t,  # type: ignore[arg-type]
                           authorizer=Admins())
    await p.validate(ATTRS, UserInfo("root"), cm(), None)
    assert t.calls == []  # admins skip the webhook
    await p.validate(ATTRS, USER, cm(), None)
    assert len(t.calls) == 1
