"""PodDisruptionBudget, ResourceQuota and LimitRange: validation, defaulting and table cells."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.api.kinds.policy import POD_DISRUPTION_BUDGET, default_pdb, validate_pdb
from fleet.api.kinds.quota import (
    LIMIT_RANGE,
    RESOURCE_QUOTA,
    default_limit_range,
    validate_limit_range,
    validate_resource_quota,
)
from fleet.api.registry import default_registry

MD = {"name": "x", "namespace": "ns"}


def messages(causes: list[dict[str, str]]) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in causes]


def pdb(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": dict(MD),
            "spec": {"selector": {"matchLabels": {"app": "a"}}, **spec}}


@pytest.mark.parametrize(("spec", "want"), [
    ({"minAvailable": 2}, []),
    ({"minAvailable": "50%"}, []),
    ({"maxUnavailable": 0}, []),
    ({"maxUnavailable": "100%"}, []),
    ({}, []),  # neither: accepted, as by kube-apiserver (nothing may be disrupted)
    ({"minAvailable": 1, "maxUnavailable": 1},
     ['spec: Invalid value: {"maxUnavailable":1,"minAvailable":1}: minAvailable and maxUnavailable cannot '
      'be both set']),
    ({"minAvailable": -1}, ["spec.minAvailable: Invalid value: -1: must be greater than or equal to 0"]),
    ({"maxUnavailable": "150%"}, ['spec.maxUnavailable: Invalid value: "150%": must not be greater than 100%']),
    ({"minAvailable": "half"},
     ["spec.minAvailable: Invalid value: \"half\": a valid percent string must be a numeric string followed by "
      "an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')"]),
    ({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Never"},
     ['spec.unhealthyPodEvictionPolicy: Unsupported value: "Never": supported values: "IfHealthyBudget", '
      '"AlwaysAllow"']),
    ({"minAvailable": 1, "selector": "app=a"}, ['spec.selector: Invalid value: "app=a": must be of type object']),
])
def test_pdb_validation(spec: dict[str, Any], want: list[str]) -> None:
    assert messages(validate_pdb(pdb(**spec), None)) == want


def test_pdb_defaults_show_zero_counts_and_keep_the_controllers() -> None:
    obj = pdb(minAvailable=1)
    default_pdb(obj)
    assert obj["status"] == {"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}
    obj["status"] = {"disruptionsAllowed": 3, "observedGeneration": 2}
    default_pdb(obj)
    assert obj["status"]["disruptionsAllowed"] == 3 and obj["status"]["currentHealthy"] == 0


def test_pdb_table() -> None:
    cols = POD_DISRUPTION_BUDGET.table_columns()
    assert [c.name for c in cols] == ["Name", "Min Available", "Max Unavailable", "Allowed Disruptions", "Age"]
    obj = pdb(maxUnavailable="25%")
    obj["status"] = {"disruptionsAllowed": 1}
    assert [c.value(obj) for c in cols[1:4]] == ["N/A", "25%", 1]
    reg = default_registry()
    assert reg.resolve("pdb") is reg.get("policy", "v1", "poddisruptionbudgets")


def rq(hard: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": dict(MD), "spec": {"hard": hard, **spec}}


@pytest.mark.parametrize(("obj", "want"), [
    (rq({"pods": "10", "requests.cpu": "4", "limits.memory": "8Gi", "count/deployments.apps": 3,
         "example.com/foo": "1", "requests.example.com/gpu": "2", "services.nodeports": 0}), []),
    (rq({"pods": "1.5"}), ['spec.hard[pods]: Invalid value: "1.5": must be an integer']),
    (rq({"cpu": "-1"}), ['spec.hard[cpu]: Invalid value: "-1": must be greater than or equal to 0']),
    (rq({"gpus": "1"}), ['spec.hard[gpus]: Invalid value: "gpus": must be a standard resource for quota']),
    (rq({"cpu": "lots"}), ["spec.hard[cpu]: Invalid value: \"lots\": quantities must match the regular "
                           "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"]),
    (rq({"pods": "1", "requests.cpu": "1"}, scopes=["BestEffort"]),
     ['spec.hard[requests.cpu]: Invalid value: "requests.cpu": unsupported scope applied to resource']),
    (rq({"pods": "1"}, scopes=["Terminating", "NotTerminating"]),
     ['spec.scopes: Invalid value: ["Terminating","NotTerminating"]: conflicting scopes']),
    (rq({"pods": "1"}, scopes=["Sometimes"]),
     ['spec.scopes[0]: Unsupported value: "Sometimes": supported values: "Terminating", "NotTerminating", '
      '"BestEffort", "NotBestEffort", "PriorityClass", "CrossNamespacePodAffinity"']),
    (rq({"pods": "1"}, scopeSelector={"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In"}]}),
     ["spec.scopeSelector.matchExpressions[0].values: Required value: must be at least one value when "
      "`operator` is 'In' or 'NotIn' for scope selector"]),
])
def test_resource_quota_validation(obj: dict[str, Any], want: list[str]) -> None:
    assert messages(validate_resource_quota(obj, None)) == want


def test_quota_scopes_are_immutable() -> None:
    old = rq({"pods": "1"}, scopes=["BestEffort"])
    assert messages(validate_resource_quota(rq({"pods": "1"}), old)) == [
        "spec.scopes: Invalid value: null: field is immutable"]
    assert validate_resource_quota(rq({"pods": "5"}, scopes=["BestEffort"]), old) == []


def test_quota_table_splits_requests_and_limits() -> None:
    cols = RESOURCE_QUOTA.table_columns()
    assert [c.name for c in cols] == ["Name", "Age", "Request", "Limit"]
    obj = rq({})
    obj["status"] = {"hard": {"pods": "2", "requests.cpu": "1", "limits.memory": "1Gi", "limits.cpu": "2"},
                     "used": {"pods": "1", "requests.cpu": "0.5", "limits.memory": "512Mi"}}
    assert cols[2].value(obj) == "pods: 1/2, requests.cpu: 500m/1"
    assert cols[3].value(obj) == "limits.cpu: 0/2, limits.memory: 512Mi/1Gi"
    assert default_registry().resolve("quota").kind == "ResourceQuota"


def lr(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": dict(MD), "spec": {"limits": list(items)}}


@pytest.mark.parametrize(("obj", "want"), [
    (lr({"type": "Container", "max": {"cpu": "2"}, "min": {"cpu": "100m"}, "default": {"cpu": "1"},
         "defaultRequest": {"cpu": "500m"}, "maxLimitRequestRatio": {"cpu": "4"}},
        {"type": "Pod", "max": {"memory": "2Gi"}},
        {"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}}), []),
    (lr({"type": "Container", "max": {"cpu": "1"}, "min": {"cpu": "2"}}),
     ['spec.limits[0].min[cpu]: Invalid value: "2": min value 2 is greater than max value 1']),
    (lr({"type": "Container", "default": {"cpu": "2"}, "max": {"cpu": "1"}}),
     ['spec.limits[0].default[cpu]: Invalid value: "2": default value 2 is greater than max value 1']),
    (lr({"type": "Container", "defaultRequest": {"memory": "1Gi"}, "default": {"memory": "512Mi"}}),
     ['spec.limits[0].defaultRequest[memory]: Invalid value: "1Gi": default request value 1Gi is greater '
      'than default limit value 512Mi']),
    (lr({"type": "Container", "min": {"cpu": "500m"}, "defaultRequest": {"cpu": "100m"}}),
     ['spec.limits[0].defaultRequest[cpu]: Invalid value: "100m": min value 500m is greater than default '
      'request value 100m']),
    (lr({"type": "Container", "maxLimitRequestRatio": {"cpu": "0.5"}}),
     ['spec.limits[0].maxLimitRequestRatio[cpu]: Invalid value: "500m": ratio 500m is less than 1']),
    (lr({"type": "Container", "max": {"cpu": "2"}, "min": {"cpu": "1"}, "maxLimitRequestRatio": {"cpu": "3"}}),
     ['spec.limits[0].maxLimitRequestRatio[cpu]: Invalid value: "3": ratio 3 is greater than max/min = '
      '2.000000']),
    (lr({"type": "Pod", "default": {"cpu": "1"}}),
     ["spec.limits[0].default: Forbidden: may not be specified when `type` is 'Pod'"]),
    (lr({"type": "PersistentVolumeClaim", "max": {"cpu": "1"}}),
     ["spec.limits[0].limits: Required value: either minimum or maximum storage value is required, but "
      "neither was provided"]),
    (lr({"type": "Container"}, {"type": "Container"}),
     ['spec.limits[1].type: Duplicate value: "Container"']),
    (lr({"type": "Container", "max": {"cpu": "-1"}}),
     ['spec.limits[0].max[cpu]: Invalid value: "-1": must be greater than or equal to 0']),
])
def test_limit_range_validation(obj: dict[str, Any], want: list[str]) -> None:
    assert messages(validate_limit_range(obj, None)) == want


def test_limit_range_defaults_fill_container_defaults_from_bounds() -> None:
    obj = lr({"type": "Container", "max": {"cpu": "2", "memory": "1Gi"}, "default": {"memory": "512Mi"},
              "min": {"cpu": "100m", "ephemeral-storage": "1Gi"}},
             {"type": "Pod", "max": {"cpu": "4"}})
    default_limit_range(obj)
    container, pod = obj["spec"]["limits"]
    assert container["default"] == {"memory": "512Mi", "cpu": "2"}  # max becomes the default limit
    # the default limit becomes the default request; failing that, min does.
    assert container["defaultRequest"] == {"memory": "512Mi", "cpu": "2", "ephemeral-storage": "1Gi"}
    assert "default" not in pod
    assert validate_limit_range(obj, None) == []


def test_limit_range_table() -> None:
    obj = lr()
    obj["metadata"]["creationTimestamp"] = "2026-01-02T03:04:05Z"
    assert [(c.name, c.value(obj)) for c in LIMIT_RANGE.table_columns()] == [
        ("Name", "x"), ("Created At", "2026-01-02T03:04:05Z")]
    assert default_registry().resolve("limits").kind == "LimitRange"
