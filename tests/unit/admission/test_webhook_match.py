"""Which webhooks a request calls (fleet/admission/webhook_match.py), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.admission.webhook_match import Request, hooks_of, rule_matches, webhook_matches


def req(op: str = "CREATE", group: str = "", version: str = "v1", resource: str = "pods", sub: str = "",
        namespace: str = "default", namespaced: bool = True, labels: dict[str, str] | None = None,
        old_labels: dict[str, str] | None = None, ns_labels: dict[str, str] | None = None,
        with_old: bool = False) -> Request:
    obj = {"metadata": {"name": "x", "labels": labels or {}}}
    old = {"metadata": {"name": "x", "labels": old_labels or {}}} if with_old or old_labels else None
    return Request(op, group, version, resource, sub, namespace, namespaced, obj, old, ns_labels or {})


def rule(ops: list[str] | None = None, groups: list[str] | None = None, versions: list[str] | None = None,
         resources: list[str] | None = None, scope: str = "*") -> dict[str, Any]:
    return {"operations": ops or ["*"], "apiGroups": groups or ["*"], "apiVersions": versions or ["*"],
            "resources": resources or ["*"], "scope": scope}


@pytest.mark.parametrize(("r", "request_", "want"), [
    (rule(ops=["CREATE"]), req(op="CREATE"), True),
    (rule(ops=["CREATE"]), req(op="UPDATE"), False),
    (rule(ops=["UPDATE", "DELETE"]), req(op="DELETE"), True),
    (rule(groups=["apps"]), req(group=""), False),
    (rule(groups=["", "apps"]), req(group="apps", resource="deployments"), True),
    (rule(versions=["v1beta1"]), req(), False),
    (rule(resources=["pods"]), req(), True),
    (rule(resources=["pods"]), req(sub="status"), False),
    (rule(resources=["pods/status"]), req(sub="status"), True),
    (rule(resources=["pods/status"]), req(), False),
    (rule(resources=["pods/*"]), req(sub="eviction"), True),
    (rule(resources=["pods/*"]), req(), False),
    (rule(resources=["*/status"]), req(resource="deployments", sub="status"), True),
    (rule(resources=["*/status"]), req(resource="deployments", sub="scale"), False),
    (rule(resources=["*"]), req(sub="status"), False),
    (rule(resources=["*/*"]), req(sub="status"), True),
    (rule(resources=["*/*"]), req(), True),
    (rule(resources=["configmaps"]), req(), False),
    (rule(scope="Namespaced"), req(), True),
    (rule(scope="Namespaced"), req(resource="nodes", namespace="", namespaced=False), False),
    (rule(scope="Cluster"), req(resource="nodes", namespace="", namespaced=False), True),
    (rule(scope="Cluster"), req(), False),
    (rule(scope="Cluster"), req(resource="namespaces", namespace="", namespaced=False), True),
])
def test_rules(r: dict[str, Any], request_: Request, want: bool) -> None:
    assert rule_matches(r, request_) is want


def hook(**kw: Any) -> dict[str, Any]:
    return {"name": "a.b.c", "rules": [rule()], **kw}


SEL = {"matchLabels": {"team": "a"}}


@pytest.mark.parametrize(("h", "request_", "want"), [
    (hook(), req(), True),
    (hook(namespaceSelector=SEL), req(ns_labels={"team": "a"}), True),
    (hook(namespaceSelector=SEL), req(ns_labels={"team": "b"}), False),
    (hook(namespaceSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}),
     req(ns_labels={"skip": "1"}), False),
    # A Namespace is judged by its own labels.
    (hook(namespaceSelector=SEL), req(resource="namespaces", namespace="", namespaced=False,
                                      labels={"team": "a"}), True),
    (hook(namespaceSelector=SEL), req(resource="namespaces", namespace="", namespaced=False,
                                      labels={"team": "b"}), False),
    # Other cluster-scoped objects are never filtered by namespaceSelector.
    (hook(namespaceSelector=SEL), req(resource="nodes", namespace="", namespaced=False), True),
    (hook(objectSelector=SEL), req(labels={"team": "a"}), True),
    (hook(objectSelector=SEL), req(labels={"team": "b"}), False),
    # Old or new labels: an update removing the label still matches.
    (hook(objectSelector=SEL), req(op="UPDATE", labels={}, old_labels={"team": "a"}), True),
    (hook(rules=[rule(ops=["DELETE"])]), req(), False),
    (hook(rules=[]), req(), False),
    # Webhook configurations are never sent to webhooks.
    (hook(), req(group="admissionregistration.k8s.io", resource="validatingwebhookconfigurations",
                 namespace="", namespaced=False), False),
])
def test_webhook_matches(h: dict[str, Any], request_: Request, want: bool) -> None:
    assert webhook_matches(h, request_) is want


def test_hooks_in_configuration_name_order_then_listed_order() -> None:
    cfgs = [{"metadata": {"name": "b"}, "webhooks": [{"name": "b1"}, {"name": "b2"}]},
            {"metadata": {"name": "a"}, "webhooks": [{"name": "a1"}]}]
    assert [(c, h["name"]) for c, h in hooks_of(cfgs)] == [("a", "a1"), ("b", "b1"), ("b", "b2")]


def test_match_policy_equivalent_uses_the_other_served_versions() -> None:
    hpa = Request("CREATE", "autoscaling", "v2", "horizontalpodautoscalers", "", "default", True,
                  {"metadata": {}}, None, {}, frozenset({"v1", "v2"}))
    v1_rule = rule(groups=["autoscaling"], versions=["v1"], resources=["horizontalpodautoscalers"])
    assert webhook_matches(hook(rules=[v1_rule]), hpa)  # matchPolicy defaults to Equivalent
    assert webhook_matches(hook(rules=[v1_rule], matchPolicy="Equivalent"), hpa)
    assert not webhook_matches(hook(rules=[v1_rule], matchPolicy="Exact"), hpa)
    # A version Fleet does not serve is no equivalent.
    beta = rule(groups=["autoscaling"], versions=["v2beta2"], resources=["horizontalpodautoscalers"])
    assert not webhook_matches(hook(rules=[beta]), hpa)
