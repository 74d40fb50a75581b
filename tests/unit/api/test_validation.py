"""Validation: format checks and every built-in kind's validate(), table-driven.

Each bad case mutates a known-good object and must produce exactly the
expected (field path, reason) causes — no more, no fewer.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from typing import Any

import pytest

from fleet.api import validation as v
from fleet.api.registry import default_registry
from fleet.api.selectors import selector_dict_matches

REG = default_registry()


# ---------------------------------------------------------------------------
# Format checks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "ok"), [
    ("web", True), ("web-1", True), ("1abc", True), ("a" * 63, True),
    ("a" * 64, False), ("Web", False), ("web_1", False), ("-web", False), ("web-", False),
    ("web.example", False), ("", False),
])
def test_dns1123_label(name, ok):
    assert (v.is_dns1123_label(name) == []) is ok


@pytest.mark.parametrize(("name", "ok"), [
    ("web", True), ("web.example.com", True), ("a" * 253, True), ("a" * 254, False),
    ("Web_1", False), ("web..x", False), (".web", False), ("web.", False),
])
def test_dns1123_subdomain(name, ok):
    assert (v.is_dns1123_subdomain(name) == []) is ok


def test_subdomain_message_is_kube_apiserver_wording():
    assert v.is_dns1123_subdomain("Web_1") == [
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
        "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"]
    assert v.is_dns1123_label("A")[0].endswith(
        "(e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


@pytest.mark.parametrize(("key", "ok"), [
    ("app", True), ("App.Name_1", True), ("example.com/app", True), ("k8s.io/a-b", True),
    ("a" * 63, True), ("a" * 64, False), ("/app", False), ("example.com/", False),
    ("a/b/c", False), ("Example.com/app", False), ("-app", False), ("app-", False), ("", False),
    ("x" * 254 + "/a", False),
])
def test_label_keys(key, ok):
    assert (v.is_qualified_name(key) == []) is ok
    assert (v.validate_label_key(key) is None) is ok


@pytest.mark.parametrize(("value", "ok"), [
    ("", True), ("v1", True), ("V_1.2-x", True), ("a" * 63, True), ("a" * 64, False),
    ("-v", False), ("v-", False), ("a b", False), ("a/b", False),
])
def test_label_values(value, ok):
    assert (v.is_valid_label_value(value) == []) is ok
    assert (v.validate_label_value(value) is None) is ok


@pytest.mark.parametrize(("name", "ok"), [
    ("http", True), ("web-8080", True), ("a" * 15, True), ("a" * 16, False), ("8080", False),
    ("HTTP", False), ("we--b", False), ("-web", False), ("web_", False),
])
def test_port_names(name, ok):
    assert (v.is_valid_port_name(name) == []) is ok


@pytest.mark.parametrize(("name", "ok"), [
    ("PATH", True), ("my.env-name", True), ("_x", True), ("-x", True), ("1X", False),
    ("A B", False), ("A=B", False), ("", False),
])
def test_env_var_names(name, ok):
    assert (v.is_env_var_name(name) == []) is ok


@pytest.mark.parametrize(("key", "ok"), [
    ("key.name", True), ("KEY_NAME", True), ("a-b", True), (".hidden", True), ("a/b", False),
    (".", False), ("..", False), ("..x", False), ("", False), ("a b", False),
])
def test_config_keys(key, ok):
    assert (v.is_config_map_key(key) == []) is ok


def test_cause_shapes():
    assert v.required("spec.x") == {"field": "spec.x", "message": "Required value",
                                    "reason": "FieldValueRequired"}
    assert v.invalid("a", "Web_1", "bad")["message"] == 'Invalid value: "Web_1": bad'
    assert v.invalid("a", 70000, "bad")["message"] == "Invalid value: 70000: bad"
    assert v.not_supported("p", "X", ("A", "B"))["message"] == \
        'Unsupported value: "X": supported values: "A", "B"'
    assert v.duplicate("n", "web") == {"field": "n", "message": 'Duplicate value: "web"',
                                       "reason": "FieldValueDuplicate"}
    assert v.too_long("a", 10)["reason"] == "FieldValueTooLong"


def test_resources():
    assert v.validate_resources({"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}, "r") == []
    causes = v.validate_resources({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "r")
    assert causes == [v.invalid("r.requests[cpu]", "2", "must be less than or equal to cpu limit of 1")]
    causes = v.validate_resources({"requests": {"memory": "1KB"}}, "r")
    assert [(c["field"], c["reason"]) for c in causes] == [("r.requests[memory]", "FieldValueInvalid")]
    causes = v.validate_resources({"limits": {"cpu": "-1"}}, "r")
    assert [(c["field"], c["reason"]) for c in causes] == [("r.limits[cpu]", "FieldValueInvalid")]


def test_selector_matching():
    sel = {"matchLabels": {"app": "web"},
           "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                {"key": "canary", "operator": "DoesNotExist"}]}
    assert selector_dict_matches(sel, {"app": "web", "tier": "a"})
    assert not selector_dict_matches(sel, {"app": "web", "tier": "c"})
    assert not selector_dict_matches(sel, {"app": "web", "tier": "a", "canary": "1"})
    bad = {"matchExpressions": [{"key": "x", "operator": "In"}, {"key": "y", "operator": "Near"}]}
    assert [(c["field"], c["reason"]) for c in v.validate_label_selector(bad, "s")] == [
        ("s.matchExpressions[0].values", "FieldValueRequired"),
        ("s.matchExpressions[1].operator", "FieldValueInvalid"),
    ]


# ---------------------------------------------------------------------------
# Kind validation tables
# ---------------------------------------------------------------------------


def container(name: str = "web", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "nginx:1.25", **extra}


def pod_spec() -> dict[str, Any]:
    return {
        "containers": [container(
            ports=[{"containerPort": 80, "name": "http"}],
            env=[{"name": "MODE", "value": "prod"}],
            resources={"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1"}},
            volumeMounts=[{"name": "data", "mountPath": "/data"}],
            livenessProbe={"httpGet": {"port": "http"}},
        )],
        "initContainers": [container("init")],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }


def template(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {"app": "web"}}, "spec": pod_spec()}


def workload(kind: str, api: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template()}}


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


GOOD: dict[str, Callable[[], dict[str, Any]]] = {
    "Pod": lambda: {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                                 "annotations": {"example.com/note": "x"}},
                    "spec": pod_spec()},
    "Namespace": lambda: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}},
    "Node": lambda: {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1.example"},
                     "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}},
    "Service": lambda: {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
                        "spec": {"selector": {"app": "web"},
                                 "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                                           {"name": "https", "port": 443, "targetPort": 8443}]}},
    "Endpoints": lambda: {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "default"},
                          "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]},
    "ConfigMap": lambda: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
                          "data": {"app.conf": "x=1"}, "binaryData": {"blob": b64("\x00\x01")}},
    "Secret": lambda: {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"},
                       "data": {"password": b64("hunter2")}},
    "ServiceAccount": lambda: {"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": {"name": "builder", "namespace": "default"}},
    "Event": lambda: {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "default"},
                      "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
                      "reason": "Started", "message": "ok", "type": "Normal", "count": 1,
                      "firstTimestamp": "2024-01-01T00:00:00Z"},
    "events.k8s.io/Event": lambda: {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web.2", "namespace": "default"},
        "regarding": {"kind": "Pod", "name": "web", "namespace": "default"},
        "eventTime": "2024-01-01T00:00:00.000000Z", "reportingController": "fleet.io/agent",
        "reportingInstance": "node-1", "action": "Start", "reason": "Started", "type": "Normal",
        "note": "started"},
    "Lease": lambda: {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                      "metadata": {"name": "node-1", "namespace": "kube-node-lease"},
                      "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                               "renewTime": "2024-01-01T00:00:00.000000Z"}},
    "Deployment": lambda: workload("Deployment"),
    "ReplicaSet": lambda: workload("ReplicaSet"),
    "StatefulSet": lambda: {**workload("StatefulSet"),
                            "spec": {**workload("StatefulSet")["spec"], "serviceName": "web"}},
    "DaemonSet": lambda: workload("DaemonSet"),
    "Job": lambda: {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi", "namespace": "default"},
                    "spec": {"template": {"spec": {**pod_spec(), "restartPolicy": "Never"}}}},
    "CronJob": lambda: {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick", "namespace": "default"},
                        "spec": {"schedule": "*/5 * * * *", "timeZone": "Europe/Paris",
                                 "jobTemplate": {"spec": {"template": {"spec": {**pod_spec(), "restartPolicy": "OnFailure"}}}}}},
}


def kind_info(name: str):
    if name.startswith("events.k8s.io/"):
        return REG.by_kind("events.k8s.io/v1", "Event")
    return REG.kinds_named(name)[0] if name != "Event" else REG.by_kind("v1", "Event")


def run(kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    info = kind_info(kind)
    if info.default:
        info.default(obj)
    if old is not None and info.default:
        info.default(old)
    return [(c["field"], c["reason"]) for c in info.validate(obj, old)]


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_good_objects_have_no_causes(kind):
    assert run(kind, GOOD[kind]()) == []
    # Updating to itself is always allowed.
    assert run(kind, GOOD[kind](), GOOD[kind]()) == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Mutator: set a dotted path where `[n]` indexes lists; value DELETE removes the key."""
    def mutate(obj: dict[str, Any]) -> None:
        parts = path.replace("[", ".[").split(".")
        cur: Any = obj
        for p in parts[:-1]:
            cur = cur[int(p[1:-1])] if p.startswith("[") else cur.setdefault(p, {})
        last = parts[-1]
        if last.startswith("["):
            cur[int(last[1:-1])] = value
        elif value is DELETE:
            cur.pop(last, None)
        else:
            cur[last] = value
    return mutate


DELETE = object()
PC = "spec.containers[0]"
TC = "spec.template.spec.containers[0]"

BAD: list[tuple[str, str, Any, list[tuple[str, str]]]] = [
    # (kind, path to set, value, expected causes)
    ("Pod", "metadata.name", "Web_1", [("metadata.name", "FieldValueInvalid")]),
    ("Pod", "metadata.name", DELETE, [("metadata.name", "FieldValueRequired")]),
    ("Pod", "metadata.name", "a" * 254, [("metadata.name", "FieldValueInvalid")]),
    ("Pod", "metadata.labels", {"bad key!": "x"}, [("metadata.labels", "FieldValueInvalid")]),
    ("Pod", "metadata.labels", {"app": "-x"}, [("metadata.labels", "FieldValueInvalid")]),
    ("Pod", "metadata.annotations", {"big": "x" * (256 * 1024)}, [("metadata.annotations", "FieldValueTooLong")]),
    ("Pod", "metadata.annotations", {"a/b/c": "x"}, [("metadata.annotations", "FieldValueInvalid")]),
    ("Pod", "spec.containers", [], [("spec.containers", "FieldValueRequired")]),
    ("Pod", f"{PC}.name", "Web", [(f"{PC}.name", "FieldValueInvalid")]),
    ("Pod", f"{PC}.name", "init", [(f"{PC}.name", "FieldValueDuplicate")]),
    ("Pod", f"{PC}.name", DELETE, [(f"{PC}.name", "FieldValueRequired")]),
    ("Pod", f"{PC}.image", DELETE, [(f"{PC}.image", "FieldValueRequired")]),
    ("Pod", f"{PC}.ports[0].containerPort", 70000, [(f"{PC}.ports[0].containerPort", "FieldValueInvalid")]),
    ("Pod", f"{PC}.ports[0].containerPort", DELETE, [(f"{PC}.ports[0].containerPort", "FieldValueRequired")]),
    ("Pod", f"{PC}.ports[0].protocol", "HTTP", [(f"{PC}.ports[0].protocol", "FieldValueNotSupported")]),
    ("Pod", f"{PC}.ports[0].name", "this-name-is-too-long", [(f"{PC}.ports[0].name", "FieldValueInvalid")]),
    ("Pod", f"{PC}.ports", [{"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "http"}],
     [(f"{PC}.ports[1].name", "FieldValueDuplicate")]),
    ("Pod", f"{PC}.env[0].name", "1BAD", [(f"{PC}.env[0].name", "FieldValueInvalid")]),
    ("Pod", f"{PC}.env[0].name", DELETE, [(f"{PC}.env[0].name", "FieldValueRequired")]),
    ("Pod", "spec.volumes", [{"name": "data", "emptyDir": {}}, {"name": "data", "emptyDir": {}}],
     [("spec.volumes[1].name", "FieldValueDuplicate")]),
    ("Pod", "spec.volumes[0].name", "Data", [("spec.volumes[0].name", "FieldValueInvalid"),
                                             (f"{PC}.volumeMounts[0].name", "FieldValueNotFound")]),
    ("Pod", f"{PC}.volumeMounts[0].name", "missing", [(f"{PC}.volumeMounts[0].name", "FieldValueNotFound")]),
    ("Pod", "spec.restartPolicy", "Sometimes", [("spec.restartPolicy", "FieldValueNotSupported")]),
    ("Pod", f"{PC}.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
     [(f"{PC}.resources.requests[cpu]", "FieldValueInvalid")]),
    ("Pod", f"{PC}.resources", {"requests": {"memory": "lots"}},
     [(f"{PC}.resources.requests[memory]", "FieldValueInvalid")]),
    ("Pod", f"{PC}.livenessProbe", {"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}},
     [(f"{PC}.livenessProbe.tcpSocket", "FieldValueForbidden")]),
    ("Pod", f"{PC}.livenessProbe", {"periodSeconds": 5}, [(f"{PC}.livenessProbe", "FieldValueRequired")]),
    ("Pod", "spec.containers", "nope", [("spec.containers", "FieldValueInvalid")]),
    ("Namespace", "metadata.name", "team.a", [("metadata.name", "FieldValueInvalid")]),
    ("Namespace", "status.phase", "Gone", [("status.phase", "FieldValueNotSupported")]),
    ("Node", "spec.taints[0].effect", "Sometimes", [("spec.taints[0].effect", "FieldValueNotSupported")]),
    ("Node", "metadata.namespace", "default", [("metadata.namespace", "FieldValueForbidden")]),
    ("Service", "metadata.name", "1web", [("metadata.name", "FieldValueInvalid")]),
    ("Service", "spec.ports", DELETE, [("spec.ports", "FieldValueRequired")]),
    ("Service", "spec.ports[0].port", 0, [("spec.ports[0].port", "FieldValueInvalid")]),
    ("Service", "spec.ports[1].name", DELETE, [("spec.ports[1].name", "FieldValueRequired")]),
    ("Service", "spec.ports[1].name", "http", [("spec.ports[1].name", "FieldValueDuplicate")]),
    ("Service", "spec.type", "Magic", [("spec.type", "FieldValueNotSupported")]),
    ("Service", "spec.ports[0].nodePort", 30080, [("spec.ports[0].nodePort", "FieldValueForbidden")]),
    ("Endpoints", "subsets[0].addresses[0].ip", "not-an-ip", [("subsets[0].addresses[0].ip", "FieldValueInvalid")]),
    ("ConfigMap", "data", {"bad key": "x"}, [("data[bad key]", "FieldValueInvalid")]),
    ("ConfigMap", "data", {"big": "x" * (1024 * 1024 + 1)}, [("data", "FieldValueTooLong")]),
    ("ConfigMap", "binaryData", {"blob": "!!notbase64"}, [("binaryData[blob]", "FieldValueInvalid")]),
    ("Secret", "data", {"password": "not base64!"}, [("data[password]", "FieldValueInvalid")]),
    ("Secret", "data", {"a/b": b64("x")}, [("data[a/b]", "FieldValueInvalid")]),
    ("Secret", "type", "kubernetes.io/tls", [("data[tls.crt]", "FieldValueRequired"),
                                             ("data[tls.key]", "FieldValueRequired")]),
    ("ServiceAccount", "metadata.name", "Builder", [("metadata.name", "FieldValueInvalid")]),
    ("Event", "involvedObject.namespace", "other", [("involvedObject.namespace", "FieldValueInvalid")]),
    ("events.k8s.io/Event", "reportingController", DELETE, [("reportingController", "FieldValueRequired")]),
    ("events.k8s.io/Event", "type", "Fatal", [("type", "FieldValueNotSupported")]),
    ("events.k8s.io/Event", "eventTime", DELETE, [("eventTime", "FieldValueRequired")]),
    ("Lease", "spec.leaseDurationSeconds", 0, [("spec.leaseDurationSeconds", "FieldValueInvalid")]),
    ("Lease", "spec.leaseDurationSeconds", "40", [("spec.leaseDurationSeconds", "FieldValueInvalid")]),
    ("Lease", "spec.holderIdentity", 7, [("spec.holderIdentity", "FieldValueInvalid")]),
    ("Lease", "spec.renewTime", "yesterday", [("spec.renewTime", "FieldValueInvalid")]),
    ("Deployment", "spec.selector", DELETE, [("spec.selector", "FieldValueRequired")]),
    ("Deployment", "spec.selector", {"matchLabels": {"app": "other"}},
     [("spec.template.metadata.labels", "FieldValueInvalid")]),
    ("Deployment", "spec.replicas", -1, [("spec.replicas", "FieldValueInvalid")]),
    ("Deployment", f"{TC}.ports[0].containerPort", 0, [(f"{TC}.ports[0].containerPort", "FieldValueRequired")]),
    ("Deployment", "spec.template.spec.restartPolicy", "Never",
     [("spec.template.spec.restartPolicy", "FieldValueNotSupported")]),
    ("Deployment", "spec.strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}},
     [("spec.strategy.rollingUpdate.maxUnavailable", "FieldValueInvalid")]),
    ("Deployment", "spec.strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "lots"}},
     [("spec.strategy.rollingUpdate.maxSurge", "FieldValueInvalid")]),
    ("ReplicaSet", "spec.selector", {"matchLabels": {"app": "other"}},
     [("spec.template.metadata.labels", "FieldValueInvalid")]),
    ("ReplicaSet", f"{TC}.image", "", [(f"{TC}.image", "FieldValueRequired")]),
    ("StatefulSet", "spec.podManagementPolicy", "Random", [("spec.podManagementPolicy", "FieldValueNotSupported")]),
    ("DaemonSet", "spec.selector", {}, [("spec.selector", "FieldValueInvalid")]),
    ("Job", "spec.template.spec.restartPolicy", "Always",
     [("spec.template.spec.restartPolicy", "FieldValueNotSupported")]),
    ("Job", "spec.template.spec.restartPolicy", DELETE, [("spec.template.spec.restartPolicy", "FieldValueRequired")]),
    ("Job", "spec.backoffLimit", -1, [("spec.backoffLimit", "FieldValueInvalid")]),
    ("Job", "spec.completions", -2, [("spec.completions", "FieldValueInvalid")]),
    ("Job", "spec.parallelism", -1, [("spec.parallelism", "FieldValueInvalid")]),
    ("CronJob", "spec.schedule", DELETE, [("spec.schedule", "FieldValueRequired")]),
    ("CronJob", "spec.schedule", "every minute", [("spec.schedule", "FieldValueInvalid")]),
    ("CronJob", "spec.schedule", "61 * * * *", [("spec.schedule", "FieldValueInvalid")]),
    ("CronJob", "spec.schedule", "* * * *", [("spec.schedule", "FieldValueInvalid")]),
    ("CronJob", "spec.timeZone", "Mars/Olympus", [("spec.timeZone", "FieldValueInvalid")]),
    ("CronJob", "spec.jobTemplate.spec.template.spec.restartPolicy", "Always",
     [("spec.jobTemplate.spec.template.spec.restartPolicy", "FieldValueNotSupported")]),
]


@pytest.mark.parametrize(("kind", "path", "value", "expected"), BAD,
                         ids=[f"{k}:{p}" for k, p, _, _ in BAD])
def test_bad_field_yields_exact_causes(kind, path, value, expected):
    obj = GOOD[kind]()
    _set(path, value)(obj)
    assert sorted(run(kind, obj)) == sorted(expected)


@pytest.mark.parametrize("schedule", ["@hourly", "@daily", "@every 1h30m", "0 0 1 jan,jul mon-fri",
                                      "*/15 9-17 * * 1-5", "5 4 * * sun", "0 0 ? * *", "0 */2 1,15 * *"])
def test_valid_cron_schedules(schedule):
    obj = GOOD["CronJob"]()
    obj["spec"]["schedule"] = schedule
    assert run("CronJob", obj) == []


def test_messages_carry_kube_wording():
    obj = GOOD["Deployment"]()
    obj["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    info = kind_info("Deployment")
    info.default(obj)
    (c,) = info.validate(obj, None)
    assert c["message"] == 'Invalid value: {"app":"web"}: `selector` does not match template `labels`'
    obj = GOOD["Pod"]()
    obj["metadata"]["name"] = "Web_1"
    kind_info("Pod").default(obj)
    (c,) = kind_info("Pod").validate(obj, None)
    assert c["message"].startswith('Invalid value: "Web_1": a lowercase RFC 1123 subdomain must consist')
    obj = GOOD["CronJob"]()
    obj["spec"]["schedule"] = "* * * *"
    kind_info("CronJob").default(obj)
    (c,) = kind_info("CronJob").validate(obj, None)
    assert c["message"] == 'Invalid value: "* * * *": expected exactly 5 fields, found 4: [* * * *]'


def test_generate_name_replaces_name():
    obj = GOOD["Pod"]()
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "web-"
    assert run("Pod", obj) == []
    obj["metadata"]["generateName"] = "Web_"
    assert run("Pod", obj) == [("metadata.generateName", "FieldValueInvalid")]


# ---------------------------------------------------------------------------
# Updates
# ---------------------------------------------------------------------------

UPDATES: list[tuple[str, str, Any, list[tuple[str, str]]]] = [
    ("Deployment", "spec.selector", {"matchLabels": {"app": "web", "x": "y"}},
     [("spec.selector", "FieldValueInvalid"), ("spec.template.metadata.labels", "FieldValueInvalid")]),
    ("Deployment", "spec.replicas", 5, []),
    ("Deployment", f"{TC}.image", "nginx:1.26", []),
    ("ReplicaSet", "spec.selector", {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
     [("spec.selector", "FieldValueInvalid")]),
    ("StatefulSet", "spec.selector", {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
     [("spec.selector", "FieldValueInvalid")]),
    ("StatefulSet", "spec.serviceName", "other", [("spec", "FieldValueForbidden")]),
    ("StatefulSet", "spec.replicas", 3, []),
    ("DaemonSet", "spec.selector", {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
     [("spec.selector", "FieldValueInvalid")]),
    ("Job", "spec.template.spec.containers[0].image", "busybox", [("spec.template", "FieldValueInvalid")]),
    ("Job", "spec.selector", {"matchLabels": {"x": "y"}},
     [("spec.selector", "FieldValueInvalid"), ("spec.template.metadata.labels", "FieldValueInvalid"),
      ("spec.selector", "FieldValueInvalid")]),  # immutable, and not the generated one
    ("Service", "spec.clusterIP", "10.0.0.9", [("spec.clusterIP", "FieldValueInvalid")]),
    ("Service", "spec.clusterIP", "", []),
    ("Pod", f"{PC}.image", "nginx:1.26", []),
    ("Pod", f"{PC}.command", ["sh"], [("spec", "FieldValueForbidden")]),
    ("Pod", "spec.nodeName", "node-1", [("spec", "FieldValueForbidden")]),  # only pods/binding sets it
]


@pytest.mark.parametrize(("kind", "path", "value", "expected"), UPDATES,
                         ids=[f"{k}:{p}" for k, p, _, _ in UPDATES])
def test_updates(kind, path, value, expected):
    old = GOOD[kind]()
    if kind == "Service":
        old["spec"]["clusterIP"] = "10.0.0.5"
    if kind == "Job":
        old["metadata"]["uid"] = "u-1"
    info = kind_info(kind)
    if info.default:
        info.default(old)
    new = copy.deepcopy(old)
    _set(path, value)(new)
    assert sorted(run(kind, new, old)) == sorted(expected)


def test_pod_node_name_cannot_change_once_bound():
    old = GOOD["Pod"]()
    old["spec"]["nodeName"] = "node-1"
    new = copy.deepcopy(old)
    new["spec"]["nodeName"] = "node-2"
    assert run("Pod", new, old) == [("spec", "FieldValueForbidden")]


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
def test_immutable_contents(kind):
    old = GOOD[kind]()
    old["immutable"] = True
    new = copy.deepcopy(old)
    assert run(kind, new, old) == []
    new["data"] = {"other": b64("x")}
    assert run(kind, new, old) == [("data", "FieldValueForbidden")]
    new = copy.deepcopy(old)
    new["immutable"] = False
    assert run(kind, new, old) == [("immutable", "FieldValueForbidden")]
    # Without `immutable` on the old object, contents may change freely.
    old.pop("immutable")
    new = copy.deepcopy(old)
    new["data"] = {"other": b64("x")}
    assert run(kind, new, old) == []


def test_secret_type_is_immutable():
    old = GOOD["Secret"]()
    new = copy.deepcopy(old)
    new["type"] = "example.com/custom"
    assert run("Secret", new, old) == [("type", "FieldValueInvalid")]


def test_wrong_types_are_causes_not_crashes():
    for kind, factory in GOOD.items():
        obj = factory()
        obj["spec"] = ["not", "a", "dict"]
        obj["metadata"]["labels"] = "app=web"
        info = kind_info(kind)
        if info.default:
            info.default(obj)
        causes = info.validate(obj, None)
        assert ("metadata.labels", "FieldValueInvalid") in [(c["field"], c["reason"]) for c in causes]
