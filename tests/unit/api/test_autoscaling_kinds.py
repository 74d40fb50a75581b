"""autoscaling/v2 HorizontalPodAutoscaler and metrics.k8s.io: defaults, validation, tables,
and the wire formats (quantities, Go durations, simulated usage)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api.kinds import autoscaling, metrics
from fleet.api.registry import default_registry

REG = default_registry()
HPA = REG.get("autoscaling", "v2", "horizontalpodautoscalers")


def test_registration_and_discovery_names():
    assert HPA is not None and HPA.short_names == ("hpa",) and HPA.subresources == ("status",)
    assert REG.resolve("hpa") is HPA
    for plural, kind, namespaced in (("nodes", "NodeMetrics", False), ("pods", "PodMetrics", True)):
        info = REG.get("metrics.k8s.io", "v1beta1", plural)
        assert info is not None and info.kind == kind and info.namespaced is namespaced
        assert info.verbs == ("get", "list")
    # The core kinds still win name resolution.
    assert REG.resolve("pods").group == "" and REG.resolve("nodes").group == ""


# ---------------------------------------------------------------------------------------
# Formats


@pytest.mark.parametrize(("value", "exp", "want"), [
    (0, -9, "0"), (250_000_000, -9, "250m"), (2_000_000_000, -9, "2"), (1_234_567, -9, "1234567n"),
    (1500, -3, "1500m"), (104857600000, -3, "104857600"), (100_000_000_000, -3, "100M"),
    (1000, 0, "1k"), (7, 0, "7"),
])
def test_format_decimal(value, exp, want):
    assert metrics.format_decimal(value, exp) == want


@pytest.mark.parametrize(("value", "want"), [
    (0, "0"), (1000, "1k"), (1023, "1023"), (1024, "1Ki"), (1536, "1536"), (67108864, "64Mi"),
    (3 * 1024**3, "3Gi"), (1025 * 1024, "1025Ki"),
])
def test_format_bytes(value, want):
    assert metrics.format_bytes(value) == want


@pytest.mark.parametrize(("value", "want"), [
    ("0.5", "500m"), ("500m", "500m"), ("1024Mi", "1Gi"), ("100Mi", "100Mi"), ("1.5Gi", "1536Mi"),
    ("2000m", "2"), (3, "3"), ("1e3", "1k"), ("512", "512"), ("0.5Ki", "512"), ("bogus", "bogus"),
])
def test_canonical_quantity(value, want):
    assert metrics.canonical_quantity(value) == want


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (15, "15s"), (15.012, "15.012s"), (60, "1m0s"), (75.5, "1m15.5s"),
    (3600, "1h0m0s"), (0.5, "500ms"), (0.0015, "1.5ms"),
])
def test_durations_round_trip(seconds, text):
    assert metrics.format_duration(seconds) == text
    assert metrics.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "15", "s", "1x", "1m 2s"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        metrics.parse_duration(bad)


def sim_pod(ann: dict[str, str], containers: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": ann},
            "spec": {"containers": [{"name": f"c{i}"} for i in range(containers)]}}


@pytest.mark.parametrize(("ann", "n", "want"), [
    ({}, 1, [("c0", 0, 0)]),
    ({metrics.SIMULATE_CPU_ANNOTATION: "250m", metrics.SIMULATE_MEMORY_ANNOTATION: "64Mi"}, 1,
     [("c0", 250_000_000, 64 * 1024**2)]),
    ({metrics.SIMULATE_CPU_ANNOTATION: "1"}, 3,
     [("c0", 333_333_334, 0), ("c1", 333_333_333, 0), ("c2", 333_333_333, 0)]),
    ({metrics.SIMULATE_CPU_ANNOTATION: "lots"}, 1, [("c0", 0, 0)]),
    ({metrics.SIMULATE_CPU_ANNOTATION: "-1"}, 1, [("c0", 0, 0)]),
])
def test_simulated_usage(ann, n, want):
    assert metrics.simulated_usage(sim_pod(ann, n)) == want


def test_simulated_label_matches_the_simulator():
    from fleet.agent.simulate import SIMULATED_LABEL

    assert metrics.SIMULATED_NODE_LABEL == SIMULATED_LABEL


def test_metrics_objects_and_tables():
    node = {"metadata": {"name": "n1", "labels": {"zone": "a"}}}
    nm = metrics.node_metrics(node, 1_500_000_000, 2 * 1024**3, timestamp="T", window=15.0,
                              now="N")
    assert nm == {"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                  "metadata": {"name": "n1", "creationTimestamp": "N", "labels": {"zone": "a"}},
                  "timestamp": "T", "window": "15s", "usage": {"cpu": "1500m", "memory": "2Gi"}}
    pod = {"metadata": {"name": "p", "namespace": "ns"}}
    pm = metrics.pod_metrics(pod, [("a", 100_000_000, 1024), ("b", 50_000_000, 2048)],
                             timestamp="T", window=1.5, now="N")
    assert pm["containers"] == [{"name": "a", "usage": {"cpu": "100m", "memory": "1Ki"}},
                                {"name": "b", "usage": {"cpu": "50m", "memory": "2Ki"}}]
    cells = [c.value(pm) for c in metrics.POD_METRICS.table_columns()]
    assert cells == ["p", "150m", "3Ki", "1.5s"]


# ---------------------------------------------------------------------------------------
# HorizontalPodAutoscaler


def hpa(**spec: Any) -> dict[str, Any]:
    base = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "maxReplicas": 5}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "ns"}, "spec": {**base, **spec}}


def test_defaults_without_behavior():
    obj = hpa()
    HPA.default(obj)
    assert obj["spec"]["minReplicas"] == 1
    assert obj["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
    assert "behavior" not in obj["spec"]


def test_defaults_fill_a_partial_behavior():
    obj = hpa(behavior={"scaleDown": {"stabilizationWindowSeconds": 5}},
              metrics=[{"type": "Resource", "resource": {"name": "memory", "target": {
                  "type": "AverageValue", "averageValue": "0.5Gi"}}}])
    HPA.default(obj)
    b = obj["spec"]["behavior"]
    assert b["scaleUp"] == autoscaling.DEFAULT_SCALE_UP_RULES
    assert b["scaleDown"] == {"stabilizationWindowSeconds": 5, "selectPolicy": "Max",
                              "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}
    # Quantities come back canonical, as from kube-apiserver.
    assert obj["spec"]["metrics"][0]["resource"]["target"]["averageValue"] == "512Mi"
    # An empty behavior gets the defaults, and scale down has no window (the controller's).
    obj = hpa(behavior={})
    HPA.default(obj)
    assert "stabilizationWindowSeconds" not in obj["spec"]["behavior"]["scaleDown"]


def causes(obj: dict[str, Any]) -> list[tuple[str, str]]:
    HPA.default(obj)
    return [(c["field"], c["message"]) for c in HPA.validate(obj, None)]


def test_valid_hpa():
    assert causes(hpa(minReplicas=2, behavior={"scaleUp": {"policies": [
        {"type": "Pods", "value": 1, "periodSeconds": 60}]}})) == []


@pytest.mark.parametrize(("spec", "field", "fragment"), [
    ({"scaleTargetRef": {"name": "web"}}, "spec.scaleTargetRef.kind", "Required"),
    ({"scaleTargetRef": {"kind": "Deployment", "name": "a/b"}}, "spec.scaleTargetRef.name",
     "may not contain '/'"),
    ({"minReplicas": 0}, "spec.minReplicas", "must be greater than or equal to 1"),
    ({"maxReplicas": 0}, "spec.maxReplicas", "must be greater than 0"),
    ({"minReplicas": 4, "maxReplicas": 3}, "spec.maxReplicas",
     "must be greater than or equal to `minReplicas`"),
    ({"metrics": [{"type": "Bogus"}]}, "spec.metrics[0].type", "Unsupported value"),
    ({"metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 0}}}]},
     "spec.metrics[0].resource.target.averageUtilization", "must be greater than 0"),
    ({"metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization"}}}]},
     "spec.metrics[0].resource.target.averageUtilization", "Required"),
    ({"metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "AverageValue", "averageValue": "0"}}}]},
     "spec.metrics[0].resource.target.averageValue", "must be positive"),
    ({"metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 50, "averageValue": "1"}}}]},
     "spec.metrics[0].resource.target.averageValue", "may not set both"),
    ({"metrics": [{"type": "ContainerResource", "containerResource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 5}}}]},
     "spec.metrics[0].containerResource.container", "Required"),
    ({"metrics": [{"type": "Resource", "pods": {}}]}, "spec.metrics[0].pods",
     "must populate the given metric source only"),
    ({"behavior": {"scaleDown": {"stabilizationWindowSeconds": 3601}}},
     "spec.behavior.scaleDown.stabilizationWindowSeconds", "less than or equal to 3600"),
    ({"behavior": {"scaleUp": {"policies": []}}}, "spec.behavior.scaleUp.policies",
     "must specify at least one Policy"),
    ({"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 5}]}}},
     "spec.behavior.scaleUp.policies[0].value", "must be greater than zero"),
    ({"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1,
                                             "periodSeconds": 1801}]}}},
     "spec.behavior.scaleUp.policies[0].periodSeconds", "less than or equal to 1800"),
    ({"behavior": {"scaleUp": {"selectPolicy": "Sometimes"}}},
     "spec.behavior.scaleUp.selectPolicy", "Unsupported value"),
])
def test_invalid_hpa(spec, field, fragment):
    got = causes(hpa(**spec))
    assert any(f == field and fragment in m for f, m in got), got


def with_status(obj: dict[str, Any], current: list[dict[str, Any]]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["status"] = {"currentReplicas": 3, "currentMetrics": current}
    return obj


def cells(obj: dict[str, Any]) -> list[Any]:
    return [c.value(obj) for c in HPA.table_columns()][:-1]  # without AGE


def test_table_like_kubectl():
    obj = hpa(minReplicas=2, metrics=[
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 50}}},
        {"type": "Resource", "resource": {"name": "memory", "target": {
            "type": "AverageValue", "averageValue": "100Mi"}}}])
    assert [c.name for c in HPA.table_columns()] == [
        "Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas", "Age"]
    assert cells(obj) == ["web", "Deployment/web", "cpu: <unknown>/50%, memory: <unknown>/100Mi",
                          "2", 5, 0]
    obj = with_status(obj, [
        {"type": "Resource", "resource": {"name": "cpu", "current": {
            "averageUtilization": 45, "averageValue": "225m"}}},
        {"type": "Resource", "resource": {"name": "memory", "current": {
            "averageValue": "52428800"}}}])
    assert cells(obj)[2] == "cpu: 45%/50%, memory: 52428800/100Mi"
    assert cells(obj)[5] == 3
    three = hpa(metrics=[{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 50}}}] * 3)
    assert cells(three)[2].endswith(" + 1 more...")
    assert cells(hpa(metrics=[]))[2] == "<none>"
    no_min = hpa()
    assert cells(no_min)[3] == "<unset>"
