"""The official Python client's typed and dynamic APIs over core/v1, apps/v1, batch/v1
and rbac against a real Fleet server: every kind through create, read, list (in a
namespace and across all), patch (a dict: strategic merge), replace (the read model
sent back), watch (kubernetes.watch.Watch) and delete — each answer deserialized into
the client's models, which refuse objects missing what kube-apiserver always sends —
then the same kinds through `kubernetes.dynamic.DynamicClient`.

Server-side apply goes through the dynamic client's `server_side_apply` too
(`test_dynamic_server_side_apply`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, config, dynamic, watch
from kubernetes.client.exceptions import ApiException

from tests.conftest import FleetServer
from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api_client(fleet_server: FleetServer) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield api


def pod_spec(restart: str = "Always") -> dict[str, Any]:
    return {"restartPolicy": restart, "containers": [{"name": "c", "image": "nginx:1.25"}]}


def template(labels: dict[str, str], restart: str = "Always") -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "spec": pod_spec(restart)}


@dataclass
class Kind:
    """One kind as the typed client names it: `{verb}_namespaced_{snake}` or `{verb}_{snake}`."""

    api: type
    snake: str
    body: Callable[[str], dict[str, Any]]
    namespaced: bool = True

    @property
    def id(self) -> str:
        return self.snake


def meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {"app": name}}


KINDS = [
    Kind(client.CoreV1Api, "pod", lambda n: {"apiVersion": "v1", "kind": "Pod", "metadata": meta(n),
                                              "spec": pod_spec()}),
    Kind(client.CoreV1Api, "service", lambda n: {"apiVersion": "v1", "kind": "Service", "metadata": meta(n),
                                                  "spec": {"selector": {"app": n}, "ports": [{"port": 80}]}}),
    Kind(client.CoreV1Api, "config_map", lambda n: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(n),
                                                     "data": {"k": "v"}}),
    Kind(client.CoreV1Api, "secret", lambda n: {"apiVersion": "v1", "kind": "Secret", "metadata": meta(n),
                                                 "stringData": {"k": "v"}}),
    Kind(client.CoreV1Api, "service_account", lambda n: {"apiVersion": "v1", "kind": "ServiceAccount",
                                                          "metadata": meta(n)}),
    Kind(client.CoreV1Api, "event", lambda n: {
        "apiVersion": "v1", "kind": "Event", "metadata": meta(n), "reason": "Tested", "message": "m",
        "type": "Normal", "involvedObject": {"kind": "ConfigMap", "name": "x", "apiVersion": "v1"},
        "source": {"component": "test"}}),
    Kind(client.CoreV1Api, "endpoints", lambda n: {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": meta(n),
        "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "ports": [{"port": 80}]}]}),
    Kind(client.CoreV1Api, "replication_controller", lambda n: {
        "apiVersion": "v1", "kind": "ReplicationController", "metadata": meta(n),
        "spec": {"replicas": 0, "selector": {"app": n}, "template": template({"app": n})}}),
    Kind(client.CoreV1Api, "pod_template", lambda n: {"apiVersion": "v1", "kind": "PodTemplate",
                                                       "metadata": meta(n), "template": template({"app": n})}),
    Kind(client.CoreV1Api, "limit_range", lambda n: {
        "apiVersion": "v1", "kind": "LimitRange", "metadata": meta(n),
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "500m"}}]}}),
    Kind(client.CoreV1Api, "resource_quota", lambda n: {"apiVersion": "v1", "kind": "ResourceQuota",
                                                         "metadata": meta(n), "spec": {"hard": {"pods": "10"}}}),
    Kind(client.CoreV1Api, "persistent_volume_claim", lambda n: {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(n),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    Kind(client.AppsV1Api, "deployment", lambda n: {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(n),
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": n}}, "template": template({"app": n})}}),
    Kind(client.AppsV1Api, "replica_set", lambda n: {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta(n),
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": n}}, "template": template({"app": n})}}),
    Kind(client.AppsV1Api, "stateful_set", lambda n: {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(n),
        "spec": {"replicas": 0, "serviceName": n, "selector": {"matchLabels": {"app": n}},
                 "template": template({"app": n})}}),
    Kind(client.AppsV1Api, "daemon_set", lambda n: {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta(n),
        "spec": {"selector": {"matchLabels": {"app": n}}, "template": template({"app": n})}}),
    Kind(client.BatchV1Api, "job", lambda n: {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(n),
        "spec": {"suspend": True, "template": template({"app": n}, "Never")}}),
    Kind(client.BatchV1Api, "cron_job", lambda n: {
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta(n),
        "spec": {"schedule": "0 0 1 1 *", "suspend": True,
                 "jobTemplate": {"spec": {"template": template({"app": n}, "Never")}}}}),
    Kind(client.RbacAuthorizationV1Api, "role", lambda n: {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(n),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
    Kind(client.RbacAuthorizationV1Api, "role_binding", lambda n: {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(n),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]}),
    Kind(client.RbacAuthorizationV1Api, "cluster_role", lambda n: {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(n),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}, namespaced=False),
    Kind(client.RbacAuthorizationV1Api, "cluster_role_binding", lambda n: {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta(n),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "Group", "name": "g", "apiGroup": "rbac.authorization.k8s.io"}]}, namespaced=False),
]


class Typed:
    """The typed methods of one kind, namespaced or not, behind one calling convention."""

    def __init__(self, api_client: client.ApiClient, kind: Kind, namespace: str) -> None:
        self.api = kind.api(api_client)
        self.kind, self.ns = kind, namespace

    def _m(self, verb: str) -> Any:
        infix = "namespaced_" if self.kind.namespaced else ""
        return getattr(self.api, f"{verb}_{infix}{self.kind.snake}")

    def _ns(self) -> tuple[str, ...]:
        return (self.ns,) if self.kind.namespaced else ()

    def create(self, body: Any) -> Any:
        return self._m("create")(*self._ns(), body)

    def read(self, name: str) -> Any:
        return self._m("read")(name, *self._ns())

    def list(self, **kw: Any) -> Any:
        if self.kind.namespaced:
            return self._m("list")(self.ns, **kw)
        return getattr(self.api, f"list_{self.kind.snake}")(**kw)

    def list_all(self, **kw: Any) -> Any:
        return getattr(self.api, f"list_{self.kind.snake}_for_all_namespaces")(**kw)

    def patch(self, name: str, body: Any) -> Any:
        return self._m("patch")(name, *self._ns(), body)

    def replace(self, name: str, body: Any) -> Any:
        return self._m("replace")(name, *self._ns(), body)

    def delete(self, name: str) -> Any:
        return self._m("delete")(name, *self._ns())


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])
def test_typed_crud(api_client: client.ApiClient, namespace: str, kind: Kind) -> None:
    t = Typed(api_client, kind, namespace)
    name = unique(kind.snake.replace("_", ""))
    made = t.create(kind.body(name))
    assert made.metadata.name == name and made.metadata.uid and made.metadata.resource_version
    got = t.read(name)
    assert got.metadata.uid == made.metadata.uid
    assert got.kind is None or got.kind == kind.body(name)["kind"]
    listed = t.list(label_selector=f"app={name}")
    assert [o.metadata.name for o in listed.items] == [name]
    assert listed.metadata.resource_version
    if kind.namespaced:
        everywhere = t.list_all(label_selector=f"app={name}")
        assert [(o.metadata.namespace, o.metadata.name) for o in everywhere.items] == [(namespace, name)]
    # A dict is sent as a strategic merge patch.
    patched = t.patch(name, {"metadata": {"labels": {"patched": "yes"}}})
    assert patched.metadata.labels == {"app": name, "patched": "yes"}
    # Replace with the model just read: everything the server sent must be accepted back
    # (a controller may write in between: 409, read again, as clients do).
    for _ in range(10):
        cur = t.read(name)
        cur.metadata.labels["replaced"] = "yes"
        try:
            replaced = t.replace(name, cur)
            break
        except ApiException as e:
            assert e.status == 409 and e.reason == "Conflict", e
    assert replaced.metadata.labels["replaced"] == "yes"
    assert int(replaced.metadata.resource_version) > int(cur.metadata.resource_version)
    t.delete(name)

    def gone() -> bool:
        try:
            t.read(name)
        except ApiException as e:
            # The reason phrase of the status line, which the client reports.
            assert (e.status, e.reason) == (404, "Not Found"), e
            return True
        return False
    wait_until(gone, timeout=20, what=f"{kind.snake} {name} deleted")


def test_namespace_and_node_reads(api_client: client.ApiClient) -> None:
    v1 = client.CoreV1Api(api_client)
    name = unique("surface")
    ns = v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    assert ns.status.phase == "Active" and ns.spec.finalizers == ["kubernetes"]
    assert v1.read_namespace_status(name).status.phase == "Active"
    cur = v1.read_namespace(name)
    cur.metadata.labels["x"] = "1"
    assert v1.replace_namespace(name, cur).metadata.labels["x"] == "1"
    assert name in {n.metadata.name for n in v1.list_namespace().items}
    v1.delete_namespace(name)
    nodes = v1.list_node()
    assert nodes.metadata.resource_version is not None
    for n in nodes.items:
        assert v1.read_node(n.metadata.name).metadata.uid == n.metadata.uid


def test_status_subresources(api_client: client.ApiClient, namespace: str) -> None:
    v1, apps, batch = (client.CoreV1Api(api_client), client.AppsV1Api(api_client),
                       client.BatchV1Api(api_client))
    svc = v1.create_namespaced_service(namespace, KINDS[1].body("svc"))
    assert svc.status.load_balancer is not None  # status.loadBalancer: {} as kube-apiserver sends it
    assert v1.read_namespaced_service_status("svc", namespace).metadata.name == "svc"
    apps.create_namespaced_daemon_set(namespace, [k for k in KINDS if k.snake == "daemon_set"][0].body("ds"))
    ds = apps.patch_namespaced_daemon_set_status("ds", namespace, {"status": {"numberReady": 0}})
    assert ds.status.number_ready == 0 and ds.status.desired_number_scheduled is not None
    st = apps.create_namespaced_stateful_set(namespace, [k for k in KINDS if k.snake == "stateful_set"][0]
                                             .body("st"))
    assert st.status.replicas == 0
    batch.create_namespaced_job(namespace, [k for k in KINDS if k.snake == "job"][0].body("job"))
    assert batch.read_namespaced_job_status("job", namespace).spec.suspend is True
    rq = v1.create_namespaced_resource_quota(namespace, [k for k in KINDS if k.snake == "resource_quota"][0]
                                             .body("rq"))
    assert v1.read_namespaced_resource_quota_status(rq.metadata.name, namespace).spec.hard == {"pods": "10"}


def test_deployment_scale_and_status(api_client: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment(namespace, KINDS[12].body("web"))
    scale = apps.read_namespaced_deployment_scale("web", namespace)
    assert (scale.kind, scale.spec.replicas, scale.status.replicas) == ("Scale", 0, 0)
    assert scale.status.selector == "app=web"
    scale = apps.patch_namespaced_deployment_scale("web", namespace, {"spec": {"replicas": 2}})
    assert scale.spec.replicas == 2
    assert apps.read_namespaced_deployment("web", namespace).spec.replicas == 2
    for _ in range(10):  # the deployment controller may write in between: 409, read again
        cur = apps.read_namespaced_deployment_scale("web", namespace)
        cur.spec.replicas = 0
        try:
            replaced = apps.replace_namespaced_deployment_scale("web", namespace, cur)
            break
        except ApiException as e:
            assert e.status == 409, e
    assert replaced.spec.replicas == 0
    status = apps.read_namespaced_deployment_status("web", namespace)
    assert status.metadata.name == "web"
    patched = apps.patch_namespaced_deployment_status("web", namespace, {"status": {"observedGeneration": 99}})
    assert patched.status.observed_generation == 99
    # The replication controller's scale, the same subresource on core/v1.
    v1 = client.CoreV1Api(api_client)
    v1.create_namespaced_replication_controller(namespace, KINDS[7].body("rc"))
    rc_scale = v1.patch_namespaced_replication_controller_scale("rc", namespace, {"spec": {"replicas": 0}})
    assert rc_scale.status.replicas == 0 and rc_scale.status.selector == "app=rc"


@pytest.mark.parametrize("kind", [k for k in KINDS if k.snake in ("config_map", "deployment", "job", "role")],
                         ids=lambda k: k.id)
def test_typed_watch(api_client: client.ApiClient, namespace: str, kind: Kind) -> None:
    t = Typed(api_client, kind, namespace)
    name = unique(kind.snake.replace("_", ""))
    rv = t.list().metadata.resource_version
    w = watch.Watch()
    seen: list[tuple[str, str]] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            time.sleep(0.3)
            t.create(kind.body(name))
            t.patch(name, {"metadata": {"labels": {"w": "1"}}})
            t.delete(name)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 30
    for ev in w.stream(t._m("list") if kind.namespaced else t.list, *t._ns(), resource_version=rv,
                       timeout_seconds=20):
        obj = ev["object"]
        if obj.metadata.name == name:
            seen.append((ev["type"], obj.metadata.labels.get("w", "")))
            if ev["type"] == "DELETED":
                w.stop()
        if time.monotonic() > deadline:
            w.stop()
    writer.join(timeout=10)
    assert not errors, errors
    assert seen[0] == ("ADDED", "") and ("MODIFIED", "1") in seen and seen[-1][0] == "DELETED", seen


# -- DynamicClient ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dyn(api_client: client.ApiClient) -> dynamic.DynamicClient:
    return dynamic.DynamicClient(api_client)


@pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])
def test_dynamic_crud(dyn: dynamic.DynamicClient, namespace: str, kind: Kind) -> None:
    name = unique("dyn" + kind.snake.replace("_", ""))
    body = kind.body(name)
    res = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    assert res.namespaced == kind.namespaced
    ns = {"namespace": namespace} if kind.namespaced else {}
    made = res.create(body=body, **ns)
    assert made.metadata.name == name and made.kind == body["kind"]
    got = res.get(name=name, **ns)
    assert got.metadata.uid == made.metadata.uid
    listed = res.get(label_selector=f"app={name}", **ns)
    assert listed.kind == body["kind"] + "List" and [i.metadata.name for i in listed.items] == [name]
    patched = res.patch(body={"metadata": {"labels": {"p": "1"}}}, name=name,
                        content_type="application/merge-patch+json", **ns)
    assert patched.metadata.labels.p == "1"
    for _ in range(10):  # a controller may write in between: 409, read again
        cur = res.get(name=name, **ns).to_dict()
        cur["metadata"]["labels"]["r"] = "1"
        try:
            replaced = res.replace(body=cur, **ns)
            break
        except dynamic.exceptions.ConflictError:
            continue
    assert replaced.metadata.labels.r == "1"
    res.delete(name=name, **ns)

    def gone() -> bool:
        try:
            res.get(name=name, **ns)
        except dynamic.exceptions.NotFoundError:
            return True
        return False
    wait_until(gone, timeout=20, what=f"{kind.snake} {name} deleted")


def test_dynamic_subresources_and_watch(dyn: dynamic.DynamicClient, namespace: str) -> None:
    deployments = dyn.resources.get(api_version="apps/v1", kind="Deployment")
    deployments.create(body=KINDS[12].body("dweb"), namespace=namespace)
    scale = deployments.subresources["scale"]
    assert scale.get(name="dweb", namespace=namespace).spec.replicas == 0
    scale.patch(body={"spec": {"replicas": 3}}, name="dweb", namespace=namespace,
                content_type="application/merge-patch+json")
    assert deployments.get(name="dweb", namespace=namespace).spec.replicas == 3
    status = deployments.subresources["status"]
    assert status.get(name="dweb", namespace=namespace).metadata.name == "dweb"
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    rv = cms.get(namespace=namespace).metadata.resourceVersion
    cms.create(body=KINDS[2].body("dw"), namespace=namespace)
    events = []
    for ev in cms.watch(namespace=namespace, resource_version=rv, timeout=10):
        events.append((ev["type"], ev["object"].metadata.name))
        if ev["object"].metadata.name == "dw":
            break
    assert events[-1] == ("ADDED", "dw")
    # Discovery as the dynamic client searches it: short names and kinds across groups.
    assert dyn.resources.get(short_names=["deploy"]).kind == "Deployment"
    assert {r.group_version for r in dyn.resources.search(kind="HorizontalPodAutoscaler")} >= {"autoscaling/v2"}


def test_dynamic_server_side_apply(dyn: dynamic.DynamicClient, namespace: str) -> None:
    # The dynamic client's server_side_apply: create-on-apply, then a second manager's
    # conflicting apply is a 409 until it forces; managedFields name both managers.
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1", "b": "1"}}
    got = cms.server_side_apply(body=body, name="ssa", namespace=namespace, field_manager="first")
    assert got.data.a == "1"
    assert [e.manager for e in got.metadata.managedFields] == ["first"]
    other = {**body, "data": {"a": "2"}}  # "first" keeps .data.b, so both stay recorded
    with pytest.raises(ApiException) as e:
        cms.server_side_apply(body=other, name="ssa", namespace=namespace, field_manager="second")
    assert e.value.status == 409
    assert "first" in e.value.body and ".data.a" in e.value.body
    got = cms.server_side_apply(body=other, name="ssa", namespace=namespace, field_manager="second",
                                force_conflicts=True)
    assert got.data.a == "2"
    assert {e.manager for e in got.metadata.managedFields} == {"first", "second"}


# -- what client-go's metadata client asks (controller-runtime's metadata-only informers) ------

METADATA_LIST_ACCEPT = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json")
METADATA_ACCEPT = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
                   "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json")


def test_metadata_only_list_and_watch(fleet_server: FleetServer, api_client: client.ApiClient,
                                      namespace: str) -> None:
    import json

    v1 = client.CoreV1Api(api_client)
    v1.create_namespaced_config_map(namespace, KINDS[2].body("meta1"))
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    with fleet_server.client() as c:
        r = c.get(path, params={"labelSelector": "app=meta1"}, headers={"Accept": METADATA_LIST_ACCEPT})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert (body["kind"], body["apiVersion"]) == ("PartialObjectMetadataList", "meta.k8s.io/v1")
        assert [i["metadata"]["name"] for i in body["items"]] == ["meta1"]
        assert all(set(i) == {"kind", "apiVersion", "metadata"} for i in body["items"])
        r = c.get(f"{path}/meta1", headers={"Accept": METADATA_ACCEPT})
        assert r.json()["kind"] == "PartialObjectMetadata" and "data" not in r.json()
        r = c.get(path, headers={"Accept": "text/html"})
        assert (r.status_code, r.reason_phrase, r.json()["reason"]) == (406, "Not Acceptable", "NotAcceptable")
        rv = body["metadata"]["resourceVersion"]
        with c.stream("GET", path, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "10",
                                           "labelSelector": "app=meta1"},
                      headers={"Accept": METADATA_ACCEPT}) as s:
            v1.patch_namespaced_config_map("meta1", namespace, {"data": {"k": "w"}})
            for line in s.iter_lines():
                ev = json.loads(line)
                assert ev["type"] == "MODIFIED"
                assert ev["object"]["kind"] == "PartialObjectMetadata"
                assert ev["object"]["metadata"]["name"] == "meta1" and "data" not in ev["object"]
                break


def test_create_namespaced_binding_like_a_custom_scheduler(api_client: client.ApiClient, namespace: str) -> None:
    # POST .../bindings, the call custom schedulers written with this client make. kube-apiserver
    # answers a Status, which the client cannot read as the V1Binding it declares (a known
    # client issue): schedulers pass _preload_content=False, as here.
    v1 = client.CoreV1Api(api_client)
    v1.create_namespaced_pod(namespace, KINDS[0].body("tobind"))
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "tobind"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    resp = v1.create_namespaced_binding(namespace, body, _preload_content=False)
    assert resp.status == 201
    assert v1.read_namespaced_pod("tobind", namespace).spec.node_name == "node-a"
