"""Validation of scheduling fields (affinity, tolerations, topology spread, priority) and of
PriorityClass, message for message as kube-apiserver words them
(pkg/apis/core/validation, pkg/apis/scheduling/validation)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.api import validation as v
from fleet.api.kinds.pod_validation import validate_pod_spec
from fleet.api.kinds.scheduling import PRIORITY_CLASS, system_priority_classes
from fleet.api.registry import default_registry
from fleet.server.tables import table

REG = default_registry()
QNAME = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
         "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
         "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def spec(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Always", **fields}


def msgs(s: dict[str, Any]) -> list[str]:
    """`field: message` lines, as they appear in the 422's message."""
    return [f"{c['field']}: {c['message']}" for c in validate_pod_spec(s)]


def node_affinity(**na: Any) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": na}}


def required_terms(*terms: Any) -> dict[str, Any]:
    return node_affinity(requiredDuringSchedulingIgnoredDuringExecution={"nodeSelectorTerms": list(terms)})


def expr(key: Any, op: Any, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


def anti(*terms: Any, preferred: list[Any] | None = None) -> dict[str, Any]:
    pa: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}
    if preferred is not None:
        pa["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"affinity": {"podAntiAffinity": pa}}


NA = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
NP = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
PA = "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
PP = "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
TS = "spec.topologySpreadConstraints"

GOOD = [
    required_terms({"matchExpressions": [expr("zone", "In", "a", "b"), expr("gpu", "Exists"),
                                         expr("cores", "Gt", "4")]},
                   {"matchFields": [expr("metadata.name", "In", "node-1")]}),
    node_affinity(preferredDuringSchedulingIgnoredDuringExecution=[
        {"weight": 1, "preference": {"matchExpressions": [expr("zone", "NotIn", "c")]}},
        {"weight": 100, "preference": {}}]),
    anti({"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"},
         preferred=[{"weight": 50, "podAffinityTerm": {"labelSelector": {"matchExpressions": [
             expr("app", "In", "web")]}, "topologyKey": "topology.kubernetes.io/zone",
             "namespaces": ["default"], "matchLabelKeys": ["pod-template-hash"]}}]),
    {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {}, "namespaceSelector": {}, "topologyKey": "zone"}]}}},
    {"tolerations": [{"operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoSchedule"},
                     {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                      "tolerationSeconds": 300}]},
    {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3,
         "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["pod-template-hash"],
         "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"},
        {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]},
    {"priority": 10, "preemptionPolicy": "Never", "priorityClassName": "high"},
]


@pytest.mark.parametrize("fields", GOOD)
def test_valid_scheduling_fields(fields):
    assert msgs(spec(**fields)) == []


BAD = [
    # -- nodeAffinity
    (node_affinity(requiredDuringSchedulingIgnoredDuringExecution={"nodeSelectorTerms": []}),
     [f"{NA}.nodeSelectorTerms: Required value: must have at least one node selector term"]),
    (required_terms({"matchExpressions": [expr("zone", "In")]}),
     [f"{NA}.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified when "
      "`operator` is 'In' or 'NotIn'"]),
    (required_terms({"matchExpressions": [expr("zone", "Exists", "a")]}),
     [f"{NA}.nodeSelectorTerms[0].matchExpressions[0].values: Forbidden: may not be specified when "
      "`operator` is 'Exists' or 'DoesNotExist'"]),
    (required_terms({"matchExpressions": [expr("cores", "Gt", "1", "2")]}),
     [f"{NA}.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified single "
      "value when `operator` is 'Lt' or 'Gt'"]),
    (required_terms({"matchExpressions": [expr("zone", "Near", "a")]}),
     [f'{NA}.nodeSelectorTerms[0].matchExpressions[0].operator: Invalid value: "Near": not a valid '
      "selector operator"]),
    (required_terms({"matchExpressions": [{"operator": "Exists"}]}),
     [f'{NA}.nodeSelectorTerms[0].matchExpressions[0].key: Invalid value: "": name part must be non-empty',
      f'{NA}.nodeSelectorTerms[0].matchExpressions[0].key: Invalid value: "": {QNAME}']),
    (required_terms({"matchFields": [expr("spec.nodeName", "In", "n1")]}),
     [f'{NA}.nodeSelectorTerms[0].matchFields[0].key: Invalid value: "spec.nodeName": not a valid field '
      "selector key"]),
    (required_terms({"matchFields": [expr("metadata.name", "In", "a", "b")]}),
     [f"{NA}.nodeSelectorTerms[0].matchFields[0].values: Required value: must be only one value when "
      "`operator` is 'In' or 'NotIn' for node field selector"]),
    (node_affinity(preferredDuringSchedulingIgnoredDuringExecution=[{"weight": 0, "preference": {}},
                                                                    {"weight": 101, "preference": {}}]),
     [f"{NP}[0].weight: Invalid value: 0: must be in the range 1-100",
      f"{NP}[1].weight: Invalid value: 101: must be in the range 1-100"]),
    # -- pod (anti-)affinity
    (anti({"labelSelector": {"matchLabels": {"app": "web"}}}),
     [f"{PA}[0].topologyKey: Required value: can not be empty",
      f'{PA}[0].topologyKey: Invalid value: "": name part must be non-empty',
      f'{PA}[0].topologyKey: Invalid value: "": {QNAME}']),
    (anti({"labelSelector": {"matchExpressions": [expr("app", "Exists", "x")]}, "topologyKey": "zone"}),
     [f"{PA}[0].labelSelector.matchExpressions[0].values: Forbidden: may not be specified when "
      "`operator` is 'Exists' or 'DoesNotExist'"]),
    (anti({"topologyKey": "zone", "namespaces": ["Bad_NS"], "labelSelector": {}}),
     [f'{PA}[0].namespace: Invalid value: "Bad_NS": ' + v.DNS1123_LABEL_ERR]),
    (anti({"topologyKey": "zone", "matchLabelKeys": ["app"]}),
     [f"{PA}[0].matchLabelKeys: Forbidden: must not be specified when labelSelector is not set"]),
    (anti({"topologyKey": "zone", "labelSelector": {}, "matchLabelKeys": ["a"], "mismatchLabelKeys": ["a"]}),
     [f'{PA}[0].matchLabelKeys[0]: Invalid value: "a": exists in both matchLabelKeys and mismatchLabelKeys']),
    (anti(preferred=[{"weight": 200, "podAffinityTerm": {"topologyKey": "bad key!"}}]),
     [f"{PP}[0].weight: Invalid value: 200: must be in the range 1-100",
      f'{PP}[0].podAffinityTerm.topologyKey: Invalid value: "bad key!": {QNAME}']),
    # -- tolerations
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v", "effect": "NoSchedule"}]},
     ['spec.tolerations[0].operator: Invalid value: core.Toleration{Key:"k", Operator:"Exists", '
      'Value:"v", Effect:"NoSchedule", TolerationSeconds:(*int64)(nil)}: value must be empty when '
      "`operator` is 'Exists'"]),
    ({"tolerations": [{"value": "v"}]},
     ['spec.tolerations[0].operator: Invalid value: "": operator must be Exists when `key` is empty, '
      'which means "match all values and all keys"']),
    ({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]},
     ["spec.tolerations[0].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when "
      "`tolerationSeconds` is set"]),
    ({"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]},
     ["spec.tolerations[0].effect: Invalid value: \"\": effect must be 'NoExecute' when "
      "`tolerationSeconds` is set"]),
    ({"tolerations": [{"key": "k", "operator": "Matches"}]},
     ['spec.tolerations[0].operator: Unsupported value: "Matches": supported values: "Equal", "Exists"']),
    ({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoRun"}]},
     ['spec.tolerations[0].effect: Unsupported value: "NoRun": supported values: "NoSchedule", '
      '"PreferNoSchedule", "NoExecute"']),
    ({"tolerations": [{"key": "k", "value": "not valid!"}]},
     ['spec.tolerations[0].operator: Invalid value: "not valid!": ' + v.LABEL_VALUE_ERR]),
    ({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "5"}]},
     ['spec.tolerations[0].tolerationSeconds: Invalid value: "5": must be of type integer']),
    # -- topology spread
    ({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone",
                                     "whenUnsatisfiable": "DoNotSchedule"}]},
     [f"{TS}[0].maxSkew: Invalid value: 0: must be greater than zero"]),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]},
     [f"{TS}[0].topologyKey: Required value: can not be empty"]),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe",
                                     "minDomains": 1, "nodeAffinityPolicy": "Sometimes"}]},
     [f'{TS}[0].whenUnsatisfiable: Unsupported value: "Maybe": supported values: "DoNotSchedule", '
      '"ScheduleAnyway"',
      f"{TS}[0].minDomains: Invalid value: 1: can only use minDomains if whenUnsatisfiable=DoNotSchedule, "
      "not Maybe",
      f'{TS}[0].nodeAffinityPolicy: Unsupported value: "Sometimes": supported values: "Honor", "Ignore"']),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                     "minDomains": 0}]},
     [f"{TS}[0].minDomains: Invalid value: 0: must be greater than zero"]),
    ({"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
        {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
     [f'{TS}[0].{{topologyKey, whenUnsatisfiable}}: Duplicate value: "{{zone, DoNotSchedule}}"']),
    ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                     "labelSelector": {"matchLabels": {"app": "web"}},
                                     "matchLabelKeys": ["app"]}]},
     [f'{TS}[0].matchLabelKeys[0]: Invalid value: "app": exists in both matchLabelKeys and labelSelector']),
    # -- priority
    ({"preemptionPolicy": "Sometimes"},
     ['spec.preemptionPolicy: Unsupported value: "Sometimes": supported values: "PreemptLowerPriority", '
      '"Never"']),
    ({"priority": "high"}, ['spec.priority: Invalid value: "high": must be of type int32']),
    # -- wrong shapes are causes, never exceptions
    ({"affinity": "near"}, ['spec.affinity: Invalid value: "near": must be of type object']),
    ({"affinity": {"nodeAffinity": []}}, ["spec.affinity.nodeAffinity: Invalid value: []: must be of type object"]),
    ({"topologySpreadConstraints": {}}, ["spec.topologySpreadConstraints: Invalid value: {}: must be of type array"]),
]


@pytest.mark.parametrize(("fields", "want"), BAD)
def test_invalid_scheduling_fields_exact_messages(fields, want):
    assert msgs(spec(**fields)) == want


def test_templates_are_validated_too():
    dep = REG.get("apps", "v1", "deployments")
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}},
                                 "spec": spec(tolerations=[{"value": "v"}])}}}
    dep.default(obj)
    fields = [c["field"] for c in dep.validate(obj, None)]
    assert fields == ["spec.template.spec.tolerations[0].operator"]


# -- PriorityClass -----------------------------------------------------------------------


def pc(name: str = "high", **fields: Any) -> dict[str, Any]:
    obj = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, **fields}
    PRIORITY_CLASS.default(obj)
    return obj


def pc_msgs(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in PRIORITY_CLASS.validate(obj, old)]


def test_priority_class_defaults():
    assert pc() == {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"},
                    "value": 0, "preemptionPolicy": "PreemptLowerPriority"}
    assert pc(preemptionPolicy="Never")["preemptionPolicy"] == "Never"


@pytest.mark.parametrize(("obj", "want"), [
    (pc(value=1000, globalDefault=True, description="d"), []),
    (pc(value=-10), []),
    (pc(value=1_000_000_001),
     ["value: Forbidden: maximum allowed value of a user defined priority is 1000000000"]),
    (pc(value=2**31), ["value: Invalid value: 2147483648: must be of type int32"]),
    (pc(value="1"), ['value: Invalid value: "1": must be of type int32']),
    (pc(preemptionPolicy="Sometimes"),
     ['preemptionPolicy: Unsupported value: "Sometimes": supported values: "PreemptLowerPriority", "Never"']),
    (pc("system-mine", value=5),
     ["metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use "
      "only. error: system-mine is not a known system priority class"]),
    (pc("system-node-critical", value=5),
     ["metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use "
      "only. error: value of system-node-critical PriorityClass must be 2000001000"]),
    (pc("system-node-critical", value=2000001000, globalDefault=True),
     ["metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use "
      "only. error: globalDefault of system-node-critical PriorityClass must be false"]),
    (pc("Bad_Name"), ['metadata.name: Invalid value: "Bad_Name": ' + v.DNS1123_SUBDOMAIN_ERR]),
])
def test_priority_class_validation(obj, want):
    assert pc_msgs(obj) == want


def test_system_classes_are_valid():
    for obj in system_priority_classes():
        PRIORITY_CLASS.default(obj)
        assert pc_msgs(obj) == []


def test_value_and_preemption_policy_are_immutable():
    old = pc(value=10)
    assert pc_msgs(pc(value=10, description="now described", globalDefault=True), old) == []
    assert pc_msgs(pc(value=11), old) == ["value: Forbidden: may not be changed in an update."]
    assert pc_msgs(pc(value=10, preemptionPolicy="Never"), old) == [
        'preemptionPolicy: Invalid value: "Never": field is immutable']


def test_priority_class_table_is_kubectls():
    obj = pc(value=1000, globalDefault=True)
    obj["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    t = table(PRIORITY_CLASS, [copy.deepcopy(obj)], resource_version="1")
    assert [(c["name"], c["type"], c["priority"]) for c in t["columnDefinitions"]] == [
        ("Name", "string", 0), ("Value", "integer", 0), ("Global-Default", "boolean", 0),
        ("Age", "string", 0), ("PreemptionPolicy", "string", 0)]
    cells = t["rows"][0]["cells"]
    assert cells[:3] == ["high", 1000, True] and cells[4] == "PreemptLowerPriority"
    assert REG.resolve("pc") is REG.get("scheduling.k8s.io", "v1", "priorityclasses")
