"""Built-in kinds: identity, name resolution, kubectl-style table cells, defaults."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from fleet.api.cron import CronError, parse_cron
from fleet.api.kinds import BUILTIN_KINDS, register_builtin
from fleet.api.kinds.pods import image_tag, qos_class
from fleet.api.registry import Registry, default_registry

REG = default_registry()

IDENTITY = [
    # group, version, kind, plural, singular, namespaced, shortNames, categories, subresources
    ("", "v1", "Namespace", "namespaces", "namespace", False, ("ns",), (), ("status", "finalize")),
    ("", "v1", "Pod", "pods", "pod", True, ("po",), ("all",),
     ("status", "binding", "log", "exec", "attach", "portforward", "eviction", "signal")),
    ("", "v1", "Node", "nodes", "node", False, ("no",), (), ("status", "drain", "schedulable")),
    ("", "v1", "Service", "services", "service", True, ("svc",), ("all",), ("status",)),
    ("", "v1", "Endpoints", "endpoints", "endpoints", True, ("ep",), (), ()),
    ("", "v1", "ConfigMap", "configmaps", "configmap", True, ("cm",), (), ()),
    ("", "v1", "PodTemplate", "podtemplates", "podtemplate", True, (), (), ()),
    ("", "v1", "ReplicationController", "replicationcontrollers", "replicationcontroller", True, ("rc",),
     ("all",), ("status", "scale")),
    ("apiregistration.k8s.io", "v1", "APIService", "apiservices", "apiservice", False, (), (), ("status",)),
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions",
     "customresourcedefinition", False, ("crd", "crds"), ("api-extensions",), ("status",)),
    ("", "v1", "Secret", "secrets", "secret", True, (), (), ()),
    ("", "v1", "ServiceAccount", "serviceaccounts", "serviceaccount", True, ("sa",), (), ("token",)),
    ("", "v1", "Binding", "bindings", "binding", True, (), (), ()),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", "persistentvolumeclaim", True, ("pvc",), (),
     ("status",)),
    ("", "v1", "Event", "events", "event", True, ("ev",), (), ()),
    ("events.k8s.io", "v1", "Event", "events", "event", True, ("ev",), (), ()),
    ("coordination.k8s.io", "v1", "Lease", "leases", "lease", True, (), (), ()),
    ("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", "priorityclass", False, ("pc",), (), ()),
    ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", "poddisruptionbudget", True, ("pdb",), (),
     ("status",)),
    ("", "v1", "ResourceQuota", "resourcequotas", "resourcequota", True, ("quota",), (), ("status",)),
    ("", "v1", "LimitRange", "limitranges", "limitrange", True, ("limits",), (), ()),
    ("apps", "v1", "Deployment", "deployments", "deployment", True, ("deploy",), ("all",), ("status", "scale")),
    ("apps", "v1", "ReplicaSet", "replicasets", "replicaset", True, ("rs",), ("all",), ("status", "scale")),
    ("apps", "v1", "StatefulSet", "statefulsets", "statefulset", True, ("sts",), ("all",), ("status", "scale")),
    ("apps", "v1", "DaemonSet", "daemonsets", "daemonset", True, ("ds",), ("all",), ("status",)),
    ("apps", "v1", "ControllerRevision", "controllerrevisions", "controllerrevision", True, (), (), ()),
    ("batch", "v1", "Job", "jobs", "job", True, (), ("all",), ("status",)),
    ("batch", "v1", "CronJob", "cronjobs", "cronjob", True, ("cj",), ("all",), ("status",)),
    ("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", "horizontalpodautoscaler",
     True, ("hpa",), ("all",), ("status",)),
    ("autoscaling", "v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers", "horizontalpodautoscaler",
     True, ("hpa",), ("all",), ("status",)),
    ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", "endpointslice", True, (), (), ()),
    ("networking.k8s.io", "v1", "IPAddress", "ipaddresses", "ipaddress", False, (), (), ()),
    ("networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs", "servicecidr", False, (), (), ("status",)),
    ("networking.k8s.io", "v1", "Ingress", "ingresses", "ingress", True, ("ing",), (), ("status",)),
    ("networking.k8s.io", "v1", "IngressClass", "ingressclasses", "ingressclass", False, (), (), ()),
    ("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", "networkpolicy", True, ("netpol",), (), ()),
    ("gateway.networking.k8s.io", "v1", "GatewayClass", "gatewayclasses", "gatewayclass", False, ("gc",),
     ("gateway-api",), ("status",)),
    ("gateway.networking.k8s.io", "v1", "Gateway", "gateways", "gateway", True, ("gtw",), ("gateway-api",),
     ("status",)),
    ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes", "httproute", True, (), ("gateway-api",),
     ("status",)),
    ("", "v1", "PersistentVolume", "persistentvolumes", "persistentvolume", False, ("pv",), (), ("status",)),
    ("storage.k8s.io", "v1", "StorageClass", "storageclasses", "storageclass", False, ("sc",), (), ()),
    ("storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments", "volumeattachment", False, (), (),
     ("status",)),
    ("storage.k8s.io", "v1", "CSIDriver", "csidrivers", "csidriver", False, (), (), ()),
    ("storage.k8s.io", "v1", "CSINode", "csinodes", "csinode", False, (), (), ()),
    ("storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities", "csistoragecapacity", True, (), (),
     ()),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", "role", True, (), (), ()),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", "clusterrole", False, (), (), ()),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", "rolebinding", True, (), (), ()),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding", False,
     (), (), ()),
    ("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests",
     "certificatesigningrequest", False, ("csr",), (), ("status", "approval")),
    # Served from memory (fleet/server/resource_metrics.py): get and list only, no singular name.
    ("metrics.k8s.io", "v1beta1", "NodeMetrics", "nodes", "", False, (), (), ()),
    ("metrics.k8s.io", "v1beta1", "PodMetrics", "pods", "", True, (), (), ()),
    # Access reviews (fleet/auth/reviews.py): questions, never stored; create only.
    ("authorization.k8s.io", "v1", "LocalSubjectAccessReview", "localsubjectaccessreviews",
     "localsubjectaccessreview", True, (), (), ()),
    ("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews",
     "selfsubjectaccessreview", False, (), (), ()),
    ("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews",
     "selfsubjectrulesreview", False, (), (), ()),
    ("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", "subjectaccessreview",
     False, (), (), ()),
    # Answered by the authentication stack, never stored (fleet/server/tokenapi.py): create only.
    ("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", "tokenreview", False, (), (), ()),
    ("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", "selfsubjectreview", False, (), (),
     ()),
    ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations",
     "mutatingwebhookconfiguration", False, (), (), ()),
    ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "validatingwebhookconfigurations",
     "validatingwebhookconfiguration", False, (), (), ()),
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies",
     "validatingadmissionpolicy", False, (), (), ("status",)),
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding",
     "validatingadmissionpolicybindings", "validatingadmissionpolicybinding", False, (), (), ()),
    # Fleet's own: the process-control consent object (fleet/api/kinds/processcontrol.py).
    ("fleet.dev", "v1", "ProcessControl", "processcontrols", "processcontrol", True, ("pctl",), (), ()),
]
READ_ONLY_GROUPS = ("metrics.k8s.io",)
CREATE_ONLY_GROUPS = ("authorization.k8s.io", "authentication.k8s.io")
# Create-only kinds of other groups, validated by the handler their POST runs
# (v1 Binding: pods/binding's).
CREATE_ONLY_KINDS = (("", "Binding"),)


@pytest.mark.parametrize("row", IDENTITY, ids=[f"{r[0]}/{r[2]}" for r in IDENTITY])
def test_identity(row):
    group, version, kind, plural, singular, namespaced, short, cats, subs = row
    info = REG.get(group, version, plural)
    assert info is not None
    assert (info.kind, info.singular, info.namespaced) == (kind, singular, namespaced)
    assert info.short_names == short
    assert info.categories == cats
    assert info.subresources == subs
    assert REG.by_kind(info.api_version, kind) is info
    assert info.default is None or callable(info.default)
    create_only = group in CREATE_ONLY_GROUPS or (group, kind) in CREATE_ONLY_KINDS
    assert callable(info.validate) or create_only
    assert info.scale is not None if "scale" in subs else info.scale is None
    if group in READ_ONLY_GROUPS:
        assert info.verbs == ("get", "list")
    elif create_only:
        assert info.verbs == ("create",)
    else:
        assert set(info.verbs) >= {"get", "list", "watch", "create", "update", "patch", "delete"}


def test_exactly_the_declared_kinds():
    assert len(BUILTIN_KINDS) == len(IDENTITY)
    reg = Registry()
    register_builtin(reg)
    assert len(list(reg.all())) == len(IDENTITY)
    assert reg.group_versions()[""] == ["v1"]
    assert REG.by_kind("events.k8s.io/v1", "Event").storage_group is None


@pytest.mark.parametrize(("typed", "group", "kind"), [
    (n, r[0], r[2]) for r in IDENTITY if r[0] not in ("events.k8s.io", *READ_ONLY_GROUPS)
    for n in (r[3], r[4], r[2], *r[6])
] + [("events.events.k8s.io", "events.k8s.io", "Event"), ("deployments.apps", "apps", "Deployment"),
     ("Pods", "", "Pod"), ("DEPLOY", "apps", "Deployment")])
def test_resolve(typed, group, kind):
    info = REG.resolve(typed)
    assert info is not None, typed
    assert (info.group, info.kind) == (group, kind)


def test_selectable_fields():
    pod = REG.resolve("pods")
    for f in ("spec.nodeName", "status.phase", "status.podIP", "metadata.name"):
        assert pod.field_selectable(f)
    assert not pod.field_selectable("spec.containers")
    assert REG.resolve("secrets").field_selectable("type")
    assert REG.resolve("nodes").field_selectable("spec.unschedulable")
    assert REG.resolve("namespaces").field_selectable("status.phase")
    assert REG.resolve("events").field_selectable("involvedObject.name")
    assert REG.resolve("replicasets").field_selectable("status.replicas")
    assert REG.resolve("jobs").field_selectable("status.successful")


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------

# Cells are computed against a pinned clock: the parametrized objects are built
# at import time, and a slow run must not turn "30s ago" into "41s ago".
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch):
    from fleet.api import meta

    monkeypatch.setattr(meta, "utcnow", lambda: NOW)


def ago(seconds: int) -> str:
    t = NOW - dt.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def row(resource: str, obj: dict[str, Any], wide: bool = False) -> dict[str, Any]:
    """{COLUMN NAME (as kubectl prints it): cell} for one object."""
    info = REG.resolve(resource)
    obj.setdefault("metadata", {}).setdefault("name", "x")
    obj["metadata"].setdefault("creationTimestamp", ago(300))
    return {c.name.upper(): c.value(obj) for c in info.table_columns() if wide or c.priority == 0}


def header(resource: str, wide: bool = False) -> list[str]:
    return [c.name.upper() for c in REG.resolve(resource).table_columns() if wide or c.priority == 0]


@pytest.mark.parametrize(("resource", "normal", "wide"), [
    ("pods", ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
     ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE", "READINESS GATES"]),
    ("deployments", ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"],
     ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]),
    ("replicasets", ["NAME", "DESIRED", "CURRENT", "READY", "AGE"],
     ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]),
    ("statefulsets", ["NAME", "READY", "AGE"], ["NAME", "READY", "AGE", "CONTAINERS", "IMAGES"]),
    ("daemonsets", ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE"],
     ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE",
      "CONTAINERS", "IMAGES", "SELECTOR"]),
    ("jobs", ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"],
     ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]),
    ("cronjobs", ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST SCHEDULE", "AGE"], None),
    ("services", ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"],
     ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]),
    ("endpoints", ["NAME", "ENDPOINTS", "AGE"], None),
    ("configmaps", ["NAME", "DATA", "AGE"], None),
    ("secrets", ["NAME", "TYPE", "DATA", "AGE"], None),
    ("serviceaccounts", ["NAME", "SECRETS", "AGE"], None),
    ("namespaces", ["NAME", "STATUS", "AGE"], None),
    ("nodes", ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
     ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE",
      "KERNEL-VERSION", "CONTAINER-RUNTIME"]),
    ("events", ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
     ["LAST SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE", "FIRST SEEN", "COUNT", "NAME"]),
    ("leases", ["NAME", "HOLDER", "AGE"], None),
])
def test_headers(resource, normal, wide):
    assert header(resource) == normal
    if wide is not None:
        assert header(resource, wide=True) == wide


def test_column_definitions_use_kubernetes_spelling_and_types():
    defs = {c.name: c.definition() for c in REG.resolve("rs").table_columns()}
    assert defs["Desired"]["type"] == "integer"
    assert defs["Name"]["format"] == "name"
    assert defs["Containers"]["priority"] == 1
    names = [c.name for c in REG.resolve("svc").table_columns()]
    assert names == ["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age", "Selector"]
    assert REG.resolve("cj").table_columns()[4].definition()["type"] == "integer"


def running(name: str, ready: bool = True, restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ready": ready, "restartCount": restarts,
            "state": {"running": {"startedAt": ago(100)}}, **extra}


def pod(containers: int = 1, init: int = 0, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"},
            "spec": {"containers": [{"name": f"c{i}", "image": "x"} for i in range(containers)],
                     "initContainers": [{"name": f"i{i}", "image": "x"} for i in range(init)]},
            "status": status}


@pytest.mark.parametrize(("obj", "ready", "status", "restarts"), [
    (pod(2, phase="Running", containerStatuses=[running("c0"), running("c1", ready=False)]),
     "1/2", "Running", "0"),
    (pod(1, phase="Running", containerStatuses=[{
        "name": "c0", "ready": False, "restartCount": 4,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(30)}}}]),
     "0/1", "CrashLoopBackOff", "4 (30s ago)"),
    (pod(1, init=1, phase="Pending", initContainerStatuses=[{
        "name": "i0", "ready": False, "restartCount": 0, "state": {"running": {}}}],
        containerStatuses=[{"name": "c0", "ready": False, "restartCount": 0,
                            "state": {"waiting": {"reason": "PodInitializing"}}}]),
     "0/1", "Init:0/1", "0"),
    (pod(1, init=1, phase="Pending", initContainerStatuses=[{
        "name": "i0", "restartCount": 2, "state": {"terminated": {"exitCode": 3}}}]),
     "0/1", "Init:ExitCode:3", "2"),
    (pod(1, init=1, phase="Pending", initContainerStatuses=[{
        "name": "i0", "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}]),
     "0/1", "Init:ImagePullBackOff", "0"),
    (pod(1, phase="Succeeded", containerStatuses=[{
        "name": "c0", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]),
     "0/1", "Completed", "0"),
    (pod(1, phase="Failed", containerStatuses=[{
        "name": "c0", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}}]),
     "0/1", "Signal:9", "0"),
    (pod(1), "0/1", "Pending", "0"),
    ({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, "0/1", "Pending", "0"),
    (pod(1, phase="Failed", reason="Evicted"), "0/1", "Evicted", "0"),
    (pod(1, phase="Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                          "reason": "SchedulingGated"}]), "0/1", "SchedulingGated", "0"),
])
def test_pod_cells(obj, ready, status, restarts):
    r = row("pods", obj)
    assert (r["READY"], r["STATUS"], r["RESTARTS"]) == (ready, status, restarts)


def test_pod_terminating_and_wide_cells():
    p = pod(1, phase="Running", containerStatuses=[running("c0")], podIP="10.1.0.5",
            podIPs=[{"ip": "10.1.0.5"}])
    p["metadata"]["deletionTimestamp"] = ago(1)
    p["spec"]["nodeName"] = "node-1"
    p["spec"]["readinessGates"] = [{"conditionType": "example.com/lb"}]
    p["status"]["conditions"] = [{"type": "example.com/lb", "status": "True"}]
    r = row("pods", p, wide=True)
    assert r["STATUS"] == "Terminating"
    assert (r["IP"], r["NODE"], r["NOMINATED NODE"], r["READINESS GATES"]) == \
        ("10.1.0.5", "node-1", "<none>", "1/1")
    # A finished pod being deleted keeps its final phase.
    done = pod(1, phase="Succeeded")
    done["metadata"]["deletionTimestamp"] = ago(1)
    assert row("pods", done)["STATUS"] == "Succeeded"


def test_pod_completed_container_beside_running_one():
    p = pod(2, phase="Running", containerStatuses=[
        running("c0"), {"name": "c1", "ready": False, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
        conditions=[{"type": "Ready", "status": "False"}])
    assert row("pods", p)["STATUS"] == "NotReady"


@pytest.mark.parametrize(("spec", "status", "ports", "cluster_ip", "external"), [
    ({"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": [{"port": 80, "protocol": "TCP"}]},
     {}, "80/TCP", "10.96.0.10", "<none>"),
    ({"type": "NodePort", "clusterIPs": ["10.96.0.11"],
      "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]},
     {}, "80:30080/TCP,53/UDP", "10.96.0.11", "<none>"),
    ({"type": "LoadBalancer", "clusterIP": "10.96.0.12", "ports": [{"port": 443, "nodePort": 31443, "protocol": "TCP"}]},
     {}, "443:31443/TCP", "10.96.0.12", "<pending>"),
    ({"type": "LoadBalancer", "clusterIP": "10.96.0.12", "ports": [{"port": 443, "protocol": "TCP"}]},
     {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}, "443/TCP", "10.96.0.12", "192.0.2.7"),
    ({"type": "ExternalName", "externalName": "db.example.com"}, {}, "<none>", "<none>", "db.example.com"),
    ({"type": "ClusterIP", "clusterIP": "None", "ports": [{"port": 5432, "protocol": "TCP"}]},
     {}, "5432/TCP", "None", "<none>"),
])
def test_service_cells(spec, status, ports, cluster_ip, external):
    r = row("svc", {"spec": {**spec, "selector": {"app": "db", "tier": "a"}}, "status": status}, wide=True)
    assert (r["TYPE"], r["PORT(S)"], r["CLUSTER-IP"], r["EXTERNAL-IP"]) == (spec["type"], ports, cluster_ip, external)
    assert r["SELECTOR"] == "app=db,tier=a"


def test_workload_cells():
    tmpl = {"spec": {"containers": [{"name": "web", "image": "nginx:1"}, {"name": "log", "image": "busybox"}],
                     "nodeSelector": {"disk": "ssd"}}}
    deploy = {"spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": tmpl},
              "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}
    r = row("deploy", deploy, wide=True)
    assert (r["READY"], r["UP-TO-DATE"], r["AVAILABLE"]) == ("2/3", 3, 2)
    assert (r["CONTAINERS"], r["IMAGES"], r["SELECTOR"]) == ("web,log", "nginx:1,busybox", "app=web")
    assert row("deploy", {"spec": {}})["READY"] == "0/0"
    rs = {"spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                                               "matchExpressions": [{"key": "env", "operator": "In",
                                                                     "values": ["prod", "dev"]}]},
                   "template": tmpl}, "status": {"replicas": 3, "readyReplicas": 1}}
    r = row("rs", rs, wide=True)
    assert (r["DESIRED"], r["CURRENT"], r["READY"]) == (3, 3, 1)
    assert r["SELECTOR"] == "app=web,env in (dev,prod)"
    assert row("sts", {"spec": {"replicas": 2, "template": tmpl}, "status": {"readyReplicas": 2}})["READY"] == "2/2"
    ds = {"spec": {"template": tmpl}, "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                                                 "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2}}
    r = row("ds", ds)
    assert [r[k] for k in ("DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR")] == \
        [3, 3, 2, 3, 2, "disk=ssd"]
    assert row("ds", {"spec": {}})["NODE SELECTOR"] == "<none>"


@pytest.mark.parametrize(("job", "status", "completions", "duration"), [
    ({"spec": {"completions": 3, "parallelism": 1},
      "status": {"succeeded": 1, "startTime": ago(125)}}, "Running", "1/3", "2m5s"),
    ({"spec": {"completions": 1},
      "status": {"succeeded": 1, "startTime": "2024-01-01T00:00:00Z", "completionTime": "2024-01-01T00:00:42Z",
                 "conditions": [{"type": "Complete", "status": "True"}]}}, "Complete", "1/1", "42s"),
    ({"spec": {"parallelism": 4}, "status": {"conditions": [{"type": "Failed", "status": "True"}]}},
     "Failed", "0/1 of 4", ""),
    ({"spec": {"completions": 2, "suspend": True},
      "status": {"conditions": [{"type": "Suspended", "status": "True"}]}}, "Suspended", "0/2", ""),
])
def test_job_cells(job, status, completions, duration):
    r = row("jobs", job)
    assert (r["STATUS"], r["COMPLETIONS"], r["DURATION"]) == (status, completions, duration)


def test_cronjob_cells():
    cj = {"spec": {"schedule": "*/5 * * * *", "suspend": False},
          "status": {"active": [{"name": "a"}], "lastScheduleTime": ago(60)}}
    r = row("cj", cj)
    assert [r[k] for k in ("SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST SCHEDULE")] == \
        ["*/5 * * * *", "<none>", "False", 1, "60s"]
    assert row("cj", {"spec": {"schedule": "@daily", "timeZone": "UTC"}})["LAST SCHEDULE"] == "<none>"


def test_core_cells():
    assert row("ep", {"subsets": [{"addresses": [{"ip": f"10.0.0.{i}"} for i in range(1, 5)],
                                   "ports": [{"port": 80}]}]})["ENDPOINTS"] == \
        "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 1 more..."
    assert row("ep", {})["ENDPOINTS"] == "<none>"
    assert row("cm", {"data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}})["DATA"] == 3
    r = row("secret", {"type": "Opaque", "data": {"a": "MQ=="}})
    assert (r["TYPE"], r["DATA"]) == ("Opaque", 1)
    assert row("sa", {"secrets": [{"name": "t"}]})["SECRETS"] == 1
    assert row("ns", {"status": {"phase": "Terminating"}})["STATUS"] == "Terminating"
    assert row("lease", {"spec": {"holderIdentity": "node-1"}})["HOLDER"] == "node-1"


@pytest.mark.parametrize(("conditions", "unschedulable", "expected"), [
    ([{"type": "Ready", "status": "True"}], False, "Ready"),
    ([{"type": "Ready", "status": "False"}], False, "NotReady"),
    ([{"type": "Ready", "status": "Unknown"}], True, "NotReady,SchedulingDisabled"),
    ([], False, "Unknown"),
    ([{"type": "Ready", "status": "True"}], True, "Ready,SchedulingDisabled"),
])
def test_node_status(conditions, unschedulable, expected):
    node = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "gpu"}},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": conditions, "nodeInfo": {"kubeletVersion": "v1.32.0-fleet", "osImage": "Debian"},
                       "addresses": [{"type": "InternalIP", "address": "192.168.1.5"}]}}
    r = row("nodes", node, wide=True)
    assert r["STATUS"] == expected
    assert (r["ROLES"], r["VERSION"], r["INTERNAL-IP"], r["EXTERNAL-IP"], r["OS-IMAGE"], r["KERNEL-VERSION"]) == \
        ("control-plane,gpu", "v1.32.0-fleet", "192.168.1.5", "<none>", "Debian", "<unknown>")
    assert row("nodes", {})["ROLES"] == "<none>"


def test_event_cells_for_both_versions():
    core = {"metadata": {"name": "web.1"}, "type": "Warning", "reason": "BackOff",
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{web}"},
            "message": " Back-off restarting \n", "source": {"component": "kubelet", "host": "node-1"},
            "firstTimestamp": ago(600), "lastTimestamp": ago(30), "count": 7}
    r = row("events", core, wide=True)
    assert [r[k] for k in ("LAST SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE",
                           "FIRST SEEN", "COUNT", "NAME")] == \
        ["30s", "Warning", "BackOff", "pod/web", "spec.containers{web}", "kubelet, node-1",
         "Back-off restarting", "10m", 7, "web.1"]
    new = {"metadata": {"name": "web.2"}, "type": "Normal", "reason": "Started",
           "regarding": {"kind": "Pod", "name": "web"}, "note": "started", "eventTime": "2024-01-01T00:00:00.000000Z",
           "reportingController": "fleet-agent", "reportingInstance": "node-2"}
    info = REG.by_kind("events.k8s.io/v1", "Event")
    cells = {c.name: c.value(new) for c in info.table_columns()}
    assert (cells["Object"], cells["Message"], cells["Source"], cells["Count"]) == \
        ("pod/web", "started", "fleet-agent, node-2", 1)
    assert cells["Last Seen"].endswith("d") or cells["Last Seen"].endswith("y")


# ---------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------

def defaulted(resource: str, obj: dict[str, Any]) -> dict[str, Any]:
    REG.resolve(resource).default(obj)
    return obj


@pytest.mark.parametrize(("image", "tag"), [
    ("nginx", "latest"), ("nginx:latest", "latest"), ("nginx:1.25", "1.25"),
    ("localhost:5000/nginx", "latest"), ("localhost:5000/nginx:2", "2"),
    ("nginx@sha256:abcd", ""), ("nginx:1@sha256:abcd", "1"),
])
def test_image_tag(image, tag):
    assert image_tag(image) == tag


def test_pod_defaults():
    p = defaulted("pods", {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "image": "nginx", "ports": [{"containerPort": 80}],
         "livenessProbe": {"httpGet": {"port": 80}}, "readinessProbe": {"tcpSocket": {"port": 80}},
         "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
        {"name": "b", "image": "nginx:1.25", "imagePullPolicy": "Never"},
        {"name": "c", "image": "nginx:1.25"}],
        "volumes": [{"name": "s", "secret": {"secretName": "s"}}]}})
    spec = p["spec"]
    assert {k: spec[k] for k in ("restartPolicy", "terminationGracePeriodSeconds", "dnsPolicy", "schedulerName",
                                 "securityContext", "enableServiceLinks", "serviceAccountName", "serviceAccount")} == {
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler", "securityContext": {}, "enableServiceLinks": True,
        "serviceAccountName": "default", "serviceAccount": "default"}
    a, b, c = spec["containers"]
    assert (a["imagePullPolicy"], b["imagePullPolicy"], c["imagePullPolicy"]) == ("Always", "Never", "IfNotPresent")
    assert a["terminationMessagePath"] == "/dev/termination-log"
    assert a["terminationMessagePolicy"] == "File"
    assert a["resources"] == {}
    assert a["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert a["livenessProbe"] == {"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1,
                                  "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
    assert a["readinessProbe"]["failureThreshold"] == 3
    assert a["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert spec["volumes"][0]["secret"]["defaultMode"] == 0o644
    # Explicit values win, and defaulting twice changes nothing.
    p2 = defaulted("pods", {"spec": {"restartPolicy": "Never", "serviceAccountName": "builder",
                                     "containers": [{"name": "a", "image": "x:1"}]}})
    assert (p2["spec"]["restartPolicy"], p2["spec"]["serviceAccount"]) == ("Never", "builder")
    import copy
    again = copy.deepcopy(p)
    defaulted("pods", again)
    assert again == p


def test_namespace_defaults():
    ns = defaulted("ns", {"metadata": {"name": "team-a"}})
    assert ns["spec"] == {"finalizers": ["kubernetes"]}
    assert ns["status"] == {"phase": "Active"}
    assert ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a"}
    # The namespace controller empties the finalizers; defaulting must not put them back.
    ns["spec"]["finalizers"] = []
    ns["status"]["phase"] = "Terminating"
    defaulted("ns", ns)
    assert (ns["spec"]["finalizers"], ns["status"]["phase"]) == ([], "Terminating")


def tmpl(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "a", "image": "a:1"}], **spec}}


def test_workload_defaults():
    dep = defaulted("deploy", {"spec": {"template": tmpl()}})["spec"]
    assert dep["replicas"] == 1
    assert dep["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}
    assert (dep["revisionHistoryLimit"], dep["progressDeadlineSeconds"]) == (10, 600)
    assert dep["template"]["spec"]["restartPolicy"] == "Always"
    assert dep["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    # Templates do not get a service account: that is Pod admission, not defaulting.
    assert "serviceAccountName" not in dep["template"]["spec"]
    recreate = defaulted("deploy", {"spec": {"strategy": {"type": "Recreate"}, "template": tmpl()}})
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}
    assert defaulted("rs", {"spec": {"template": tmpl()}})["spec"]["replicas"] == 1
    sts = defaulted("sts", {"spec": {"template": tmpl()}})["spec"]
    assert (sts["replicas"], sts["podManagementPolicy"], sts["revisionHistoryLimit"], sts["serviceName"]) == \
        (1, "OrderedReady", 10, "")
    assert sts["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    ds = defaulted("ds", {"spec": {"template": tmpl()}})["spec"]
    assert ds["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert ds["revisionHistoryLimit"] == 10


def test_job_defaults():
    job = defaulted("jobs", {"metadata": {"name": "pi", "uid": "u-1"}, "spec": {"template": tmpl()}})
    spec = job["spec"]
    assert {k: spec[k] for k in ("completions", "parallelism", "backoffLimit", "completionMode", "suspend")} == \
        {"completions": 1, "parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed", "suspend": False}
    assert "restartPolicy" not in spec["template"]["spec"]
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}}
    assert spec["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "pi"
    par = defaulted("jobs", {"spec": {"parallelism": 3, "template": tmpl()}})["spec"]
    assert par.get("completions") is None and par["parallelism"] == 3
    assert "selector" not in par  # no uid yet: nothing to select on
    manual = defaulted("jobs", {"metadata": {"uid": "u"}, "spec": {"manualSelector": True, "template": tmpl()}})
    assert "selector" not in manual["spec"]


def test_cronjob_defaults():
    cj = defaulted("cj", {"spec": {"schedule": "@hourly", "jobTemplate": {"spec": {"template": tmpl()}}}})["spec"]
    assert {k: cj[k] for k in ("concurrencyPolicy", "suspend", "successfulJobsHistoryLimit",
                               "failedJobsHistoryLimit")} == \
        {"concurrencyPolicy": "Allow", "suspend": False, "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1}
    assert cj["jobTemplate"]["spec"]["backoffLimit"] == 6
    assert "restartPolicy" not in cj["jobTemplate"]["spec"]["template"]["spec"]


def test_service_defaults():
    svc = defaulted("svc", {"spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP", "targetPort": "dns"}]}})
    spec = svc["spec"]
    assert (spec["type"], spec["sessionAffinity"], spec["internalTrafficPolicy"], spec["ipFamilyPolicy"]) == \
        ("ClusterIP", "None", "Cluster", "SingleStack")
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80},
                             {"port": 53, "protocol": "UDP", "targetPort": "dns"}]
    lb = defaulted("svc", {"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})["spec"]
    assert (lb["externalTrafficPolicy"], lb["allocateLoadBalancerNodePorts"]) == ("Cluster", True)
    ext = defaulted("svc", {"spec": {"type": "ExternalName", "externalName": "db.example.com"}})["spec"]
    assert "internalTrafficPolicy" not in ext


def test_secret_defaults_fold_string_data():
    s = defaulted("secret", {"data": {"a": base64.b64encode(b"1").decode()}, "stringData": {"b": "two"}})
    assert s["type"] == "Opaque"
    assert s["data"] == {"a": "MQ==", "b": base64.b64encode(b"two").decode()}
    assert "stringData" not in s
    assert defaulted("secret", {"type": "kubernetes.io/tls"})["type"] == "kubernetes.io/tls"


def test_qos_class():
    assert qos_class({"containers": [{"name": "a"}]}) == "BestEffort"
    assert qos_class({"containers": [{"resources": {"requests": {"cpu": "100m"}}}]}) == "Burstable"
    assert qos_class({"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}) == "Guaranteed"
    assert qos_class({"containers": [{"resources": {"requests": {"cpu": "500m"},
                                                    "limits": {"cpu": "1", "memory": "1Gi"}}}]}) == "Burstable"


@pytest.mark.parametrize(("expr", "field", "values"), [
    ("*/15 * * * *", "minutes", {0, 15, 30, 45}),
    ("0 9-17/4 * * *", "hours", {9, 13, 17}),
    ("0 0 1 jan,JUL *", "months", {1, 7}),
    ("0 0 * * mon-fri", "days_of_week", {1, 2, 3, 4, 5}),
    ("5/20 * * * *", "minutes", {5, 25, 45}),
    ("@weekly", "days_of_week", {0}),
])
def test_cron_parse(expr, field, values):
    assert getattr(parse_cron(expr), field) == values


@pytest.mark.parametrize(("expr", "message"), [
    ("* * * *", "expected exactly 5 fields, found 4: [* * * *]"),
    ("60 * * * *", "end of range (60) above maximum (59): 60"),
    ("0 0 0 * *", "beginning of range (0) below minimum (1): 0"),
    ("5-1 * * * *", "beginning of range (5) beyond end of range (1): 5-1"),
    ("*/0 * * * *", "step of range should be a positive number: */0"),
    ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
    ("@fortnightly", "unrecognized descriptor: @fortnightly"),
    ("x * * * *", "failed to parse int from x"),
])
def test_cron_errors(expr, message):
    with pytest.raises(CronError) as e:
        parse_cron(expr)
    assert str(e.value).startswith(message)


def test_cron_every():
    assert parse_cron("@every 1h30m").every == 5400
    with pytest.raises(CronError):
        parse_cron("@every soon")
