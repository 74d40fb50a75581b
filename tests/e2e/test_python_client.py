"""The official `kubernetes` Python client, configured from the server's admin kubeconfig."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.conftest import FleetServer
from tests.e2e.helpers import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def api_client(fleet_server: FleetServer) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(fleet_server.kubeconfig), client_configuration=cfg)
    assert cfg.host.rstrip("/") == fleet_server.url
    with client.ApiClient(cfg) as api:
        yield api


@pytest.fixture
def v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


def cm_body(name: str, labels: dict[str, str] | None = None, **data: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        data=data or {"k": "v"},
    )


def deployment_body(name: str, containers: list[tuple[str, str]] | None = None,
                    replicas: int = 1) -> client.V1Deployment:
    containers = containers or [("app", "nginx:1.25")]
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": name}),
                spec=client.V1PodSpec(containers=[
                    client.V1Container(name=n, image=i, env=[client.V1EnvVar(name="E", value=n)])
                    for n, i in containers
                ]),
            ),
        ),
    )


def status_of(e: ApiException) -> dict[str, Any]:
    body = json.loads(e.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1", body
    assert body["status"] == "Failure" and body["code"] == e.status, body
    return body


# -- CRUD -------------------------------------------------------------------------------------


def test_configmap_crud(v1: client.CoreV1Api, namespace: str) -> None:
    created = v1.create_namespaced_config_map(namespace, cm_body("cfg", a="1"))
    assert created.metadata.uid and created.metadata.resource_version
    assert created.metadata.namespace == namespace

    got = v1.read_namespaced_config_map("cfg", namespace)
    assert got.data == {"a": "1"} and got.metadata.uid == created.metadata.uid

    got.data["b"] = "2"
    replaced = v1.replace_namespaced_config_map("cfg", namespace, got)
    assert replaced.data == {"a": "1", "b": "2"}
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)

    patched = v1.patch_namespaced_config_map("cfg", namespace, {"data": {"a": "one"}})
    assert patched.data == {"a": "one", "b": "2"}

    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_config_map(namespace, cm_body("cfg"))
    assert ei.value.status == 409 and status_of(ei.value)["reason"] == "AlreadyExists"

    # This client version returns the decoded body as a dict: a Status, or the deleted object.
    st = v1.delete_namespaced_config_map("cfg", namespace)
    assert (st["kind"] == "Status" and st["status"] == "Success") or (
        st["kind"] == "ConfigMap" and st["metadata"]["name"] == "cfg"), st
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_config_map("cfg", namespace)
    assert ei.value.status == 404


def test_secret_crud(v1: client.CoreV1Api, namespace: str) -> None:
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name="creds"),
        type="Opaque",
        data={"user": base64.b64encode(b"admin").decode()},
    )
    v1.create_namespaced_secret(namespace, body)
    got = v1.read_namespaced_secret("creds", namespace)
    assert base64.b64decode(got.data["user"]) == b"admin"
    assert got.type == "Opaque"

    got.data["pw"] = base64.b64encode(b"pa55").decode()
    v1.replace_namespaced_secret("creds", namespace, got)
    got = v1.read_namespaced_secret("creds", namespace)
    assert base64.b64decode(got.data["pw"]) == b"pa55"

    names = [s.metadata.name for s in v1.list_namespaced_secret(namespace).items]
    assert "creds" in names

    v1.delete_namespaced_secret("creds", namespace)
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_secret("creds", namespace)
    assert ei.value.status == 404


def test_deployment_crud(apps: client.AppsV1Api, namespace: str) -> None:
    created = apps.create_namespaced_deployment(namespace, deployment_body("d1", replicas=2))
    assert created.spec.replicas == 2
    assert created.metadata.generation == 1

    # Read-modify-replace races the Deployment controller's own writes (its status and
    # revision annotation), as on Kubernetes: a 409 means read again and retry.
    for _ in range(10):
        got = apps.read_namespaced_deployment("d1", namespace)
        got.spec.replicas = 4
        try:
            replaced = apps.replace_namespaced_deployment("d1", namespace, got)
            break
        except ApiException as e:
            if e.status != 409:
                raise
    assert replaced.spec.replicas == 4
    assert replaced.metadata.generation == 2

    scale = apps.read_namespaced_deployment_scale("d1", namespace)
    assert scale.spec.replicas == 4
    apps.patch_namespaced_deployment_scale("d1", namespace, {"spec": {"replicas": 1}})
    assert apps.read_namespaced_deployment("d1", namespace).spec.replicas == 1

    listed = apps.list_namespaced_deployment(namespace)
    assert [d.metadata.name for d in listed.items] == ["d1"]
    assert listed.metadata.resource_version

    apps.delete_namespaced_deployment("d1", namespace, propagation_policy="Background")
    with pytest.raises(ApiException) as ei:
        apps.read_namespaced_deployment("d1", namespace)
    assert ei.value.status == 404


def test_service_crud(v1: client.CoreV1Api, namespace: str) -> None:
    body = client.V1Service(
        metadata=client.V1ObjectMeta(name="svc", labels={"app": "svc"}),
        spec=client.V1ServiceSpec(
            selector={"app": "svc"},
            ports=[client.V1ServicePort(name="http", port=80, target_port=8080)],
        ),
    )
    created = v1.create_namespaced_service(namespace, body)
    assert created.spec.ports[0].port == 80
    assert created.spec.type == "ClusterIP"  # defaulted by the server

    patched = v1.patch_namespaced_service("svc", namespace, {
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}
    })
    # Strategic merge on Service ports merges by `port`.
    assert sorted(p.port for p in patched.spec.ports) == [80, 443]

    got = v1.read_namespaced_service("svc", namespace)
    got.metadata.labels["tier"] = "front"
    v1.replace_namespaced_service("svc", namespace, got)
    assert v1.read_namespaced_service("svc", namespace).metadata.labels == {"app": "svc", "tier": "front"}

    v1.delete_namespaced_service("svc", namespace)
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_service("svc", namespace)
    assert ei.value.status == 404


def test_namespace_crud(v1: client.CoreV1Api) -> None:
    name = f"pyns-{int(time.time() * 1000) % 10**8}"
    created = v1.create_namespace(client.V1Namespace(
        metadata=client.V1ObjectMeta(name=name, labels={"team": "py"})))
    assert created.metadata.name == name
    assert v1.read_namespace(name).status.phase == "Active"
    listed = v1.list_namespace(label_selector="team=py")
    assert name in [n.metadata.name for n in listed.items]

    v1.patch_namespace(name, {"metadata": {"labels": {"extra": "1"}}})
    # Like kube-apiserver, the server keeps the immutable kubernetes.io/metadata.name label.
    assert v1.read_namespace(name).metadata.labels == {
        "team": "py", "extra": "1", "kubernetes.io/metadata.name": name}

    v1.delete_namespace(name)

    def gone() -> bool:
        try:
            v1.read_namespace(name)
        except ApiException as e:
            return e.status == 404
        return False

    wait_until(gone, timeout=30, what=f"namespace {name} to be deleted")


# -- selectors -----------------------------------------------------------------------------


def test_list_label_and_field_selectors(v1: client.CoreV1Api, namespace: str) -> None:
    v1.create_namespaced_config_map(namespace, cm_body("a", {"env": "prod", "tier": "web"}))
    v1.create_namespaced_config_map(namespace, cm_body("b", {"env": "dev", "tier": "db"}))
    v1.create_namespaced_config_map(namespace, cm_body("c", {"env": "test"}))
    v1.create_namespaced_config_map(namespace, cm_body("d"))

    def names(**kw: str) -> list[str]:
        items = v1.list_namespaced_config_map(namespace, **kw).items
        return sorted(i.metadata.name for i in items if i.metadata.name in "abcd")

    assert names() == ["a", "b", "c", "d"]
    assert names(label_selector="env=prod") == ["a"]
    assert names(label_selector="env==prod") == ["a"]
    assert names(label_selector="env!=prod") == ["b", "c", "d"]
    assert names(label_selector="env in (prod,dev)") == ["a", "b"]
    assert names(label_selector="env notin (prod,dev)") == ["c", "d"]
    assert names(label_selector="tier") == ["a", "b"]
    assert names(label_selector="!tier") == ["c", "d"]
    assert names(label_selector="env,tier=db") == ["b"]
    assert names(field_selector="metadata.name=c") == ["c"]
    assert names(field_selector="metadata.name!=c") == ["a", "b", "d"]
    assert names(field_selector=f"metadata.namespace={namespace}") == ["a", "b", "c", "d"]
    assert names(label_selector="env", field_selector="metadata.name!=a") == ["b", "c"]

    # Across namespaces, the namespace field selector narrows the list.
    all_ns = v1.list_config_map_for_all_namespaces(field_selector=f"metadata.namespace={namespace}")
    assert sorted(i.metadata.name for i in all_ns.items if i.metadata.name in "abcd") == ["a", "b", "c", "d"]
    assert {i.metadata.namespace for i in all_ns.items} == {namespace}

    with pytest.raises(ApiException) as ei:
        v1.list_namespaced_config_map(namespace, label_selector="env in (prod")
    assert ei.value.status == 400


# -- watch ---------------------------------------------------------------------------------


def test_watch_added_modified_deleted_in_order(v1: client.CoreV1Api, namespace: str) -> None:
    rv = v1.list_namespaced_config_map(namespace).metadata.resource_version
    w = watch.Watch()
    seen: list[tuple[str, str, str, dict[str, str] | None]] = []
    errors: list[BaseException] = []

    def create_later() -> None:
        try:
            v1.create_namespaced_config_map(namespace, cm_body("watched", x="1"))
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    # The create races with the watch being set up; either way it is after `rv`, so the
    # watch must deliver it.  The update and the delete are made while the watch is open.
    writer = threading.Thread(target=create_later)
    writer.start()
    deadline = time.monotonic() + 30
    for ev in w.stream(v1.list_namespaced_config_map, namespace, resource_version=rv,
                       timeout_seconds=20):
        obj = ev["object"]
        seen.append((ev["type"], obj.metadata.name, obj.metadata.resource_version, obj.data))
        if ev["type"] == "ADDED" and obj.metadata.name == "watched":
            v1.patch_namespaced_config_map("watched", namespace, {"data": {"x": "2"}})
        elif ev["type"] == "MODIFIED" and obj.metadata.name == "watched":
            v1.delete_namespaced_config_map("watched", namespace)
        elif ev["type"] == "DELETED" and obj.metadata.name == "watched":
            w.stop()
        if time.monotonic() > deadline:
            w.stop()
    writer.join(timeout=10)
    assert not errors, errors
    types = [(t, n, d) for t, n, _, d in seen if n == "watched"]
    assert types == [("ADDED", "watched", {"x": "1"}), ("MODIFIED", "watched", {"x": "2"}),
                     ("DELETED", "watched", {"x": "2"})], seen
    rvs = [int(r) for _, n, r, _ in seen if n == "watched"]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3, rvs


def test_watch_from_old_resource_version_replays_history(v1: client.CoreV1Api, namespace: str) -> None:
    rv0 = v1.list_namespaced_config_map(namespace).metadata.resource_version
    for i in range(3):
        v1.create_namespaced_config_map(namespace, cm_body(f"h{i}"))
    v1.delete_namespaced_config_map("h1", namespace)
    w = watch.Watch()
    events = []
    for ev in w.stream(v1.list_namespaced_config_map, namespace, resource_version=rv0,
                       timeout_seconds=10):
        if ev["object"].metadata.name == "kube-root-ca.crt":
            continue  # published into every new namespace by the root CA publisher
        events.append((ev["type"], ev["object"].metadata.name))
        if len(events) == 4:
            w.stop()
    assert events == [("ADDED", "h0"), ("ADDED", "h1"), ("ADDED", "h2"), ("DELETED", "h1")]


# -- errors ----------------------------------------------------------------------------------


def test_replace_with_stale_resource_version_conflicts(v1: client.CoreV1Api, namespace: str) -> None:
    v1.create_namespaced_config_map(namespace, cm_body("cas", v="1"))
    stale = v1.read_namespaced_config_map("cas", namespace)
    fresh = v1.read_namespaced_config_map("cas", namespace)
    fresh.data = {"v": "2"}
    v1.replace_namespaced_config_map("cas", namespace, fresh)

    stale.data = {"v": "stale"}
    with pytest.raises(ApiException) as ei:
        v1.replace_namespaced_config_map("cas", namespace, stale)
    assert ei.value.status == 409
    st = status_of(ei.value)
    assert st["reason"] == "Conflict"
    assert "modified" in st["message"], st
    assert v1.read_namespaced_config_map("cas", namespace).data == {"v": "2"}

    # A delete with a stale resourceVersion precondition conflicts too.
    with pytest.raises(ApiException) as ei:
        v1.delete_namespaced_config_map(
            "cas", namespace,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=stale.metadata.resource_version)),
        )
    assert ei.value.status == 409
    assert v1.read_namespaced_config_map("cas", namespace).data == {"v": "2"}


def test_missing_object_is_404(v1: client.CoreV1Api, apps: client.AppsV1Api, namespace: str) -> None:
    with pytest.raises(ApiException) as ei:
        v1.read_namespaced_config_map("nope", namespace)
    assert ei.value.status == 404
    st = status_of(ei.value)
    assert st["reason"] == "NotFound"
    assert st["details"]["name"] == "nope" and st["details"]["kind"] == "configmaps"
    assert st["message"] == 'configmaps "nope" not found'

    with pytest.raises(ApiException) as ei:
        apps.delete_namespaced_deployment("nope", namespace)
    assert ei.value.status == 404
    st = status_of(ei.value)
    assert st["details"]["group"] == "apps"
    assert st["message"] == 'deployments.apps "nope" not found'


def test_invalid_object_is_422_with_causes(v1: client.CoreV1Api, apps: client.AppsV1Api,
                                           namespace: str) -> None:
    with pytest.raises(ApiException) as ei:
        v1.create_namespaced_config_map(namespace, cm_body("Not_Valid"))
    assert ei.value.status == 422
    st = status_of(ei.value)
    assert st["reason"] == "Invalid"
    assert 'ConfigMap "Not_Valid" is invalid' in st["message"], st
    causes = st["details"]["causes"]
    assert any(c["field"] == "metadata.name" for c in causes), causes

    bad = deployment_body("bad")
    bad.spec.selector = client.V1LabelSelector(match_labels={"app": "other"})
    with pytest.raises(ApiException) as ei:
        apps.create_namespaced_deployment(namespace, bad)
    assert ei.value.status == 422
    st = status_of(ei.value)
    assert st["details"]["kind"] == "Deployment" and st["details"]["name"] == "bad"
    assert any(c["field"] == "spec.template.metadata.labels" for c in st["details"]["causes"]), st

    bad = deployment_body("neg")
    bad.spec.replicas = -1
    with pytest.raises(ApiException) as ei:
        apps.create_namespaced_deployment(namespace, bad)
    assert ei.value.status == 422
    assert any(c["field"] == "spec.replicas" for c in status_of(ei.value)["details"]["causes"])

    names = [d.metadata.name for d in apps.list_namespaced_deployment(namespace).items]
    assert names == []
    assert "Not_Valid" not in [c.metadata.name for c in v1.list_namespaced_config_map(namespace).items]


# -- patch ---------------------------------------------------------------------------------


def test_typed_patch_is_strategic_merge(apps: client.AppsV1Api, namespace: str) -> None:
    apps.create_namespaced_deployment(
        namespace, deployment_body("sm", containers=[("a", "img-a:1"), ("b", "img-b:1")]))
    patched = apps.patch_namespaced_deployment("sm", namespace, {
        "spec": {"template": {"spec": {"containers": [{"name": "b", "image": "img-b:2"}]}}}
    })
    cs = {c.name: c for c in patched.spec.template.spec.containers}
    assert set(cs) == {"a", "b"}, "containers must merge by name, not be replaced"
    assert cs["a"].image == "img-a:1" and cs["b"].image == "img-b:2"
    assert cs["b"].env[0].value == "b"

    # A list body is sent as a JSON patch.
    patched = apps.patch_namespaced_deployment("sm", namespace, [
        {"op": "replace", "path": "/spec/replicas", "value": 3}])
    assert patched.spec.replicas == 3
    stored = apps.read_namespaced_deployment("sm", namespace)
    assert stored.spec.replicas == 3 and len(stored.spec.template.spec.containers) == 2


# -- pagination ------------------------------------------------------------------------------


def test_pagination_returns_every_item_once(v1: client.CoreV1Api, namespace: str) -> None:
    originals = {f"page-{i:03d}" for i in range(25)}
    for n in sorted(originals):
        v1.create_namespaced_config_map(namespace, cm_body(n))

    got: list[str] = []
    token = None
    pages = 0
    for _ in range(100):  # bounded: 25 items / 7 per page needs 4
        kw: dict[str, Any] = {"limit": 7}
        if token:
            kw["_continue"] = token
        page = v1.list_namespaced_config_map(namespace, **kw)
        pages += 1
        assert len(page.items) <= 7
        got.extend(i.metadata.name for i in page.items)
        # Writes between pages must not make anything appear twice or go missing.
        if pages == 1:
            v1.create_namespaced_config_map(namespace, cm_body("page-000a"))
            v1.create_namespaced_config_map(namespace, cm_body("page-999"))
        token = page.metadata._continue
        if not token:
            break
    else:
        raise AssertionError("pagination did not end")
    mine = [n for n in got if n in originals]
    assert sorted(mine) == sorted(originals)
    assert len(mine) == len(set(mine)), "an item came back twice"
    assert pages >= 4, f"limit=7 over 25 items should take at least 4 pages, took {pages}"
    assert len(got) == len(set(got))

    # A continue token that is not one the server issued is refused with 400... or 410.
    with pytest.raises(ApiException) as ei:
        v1.list_namespaced_config_map(namespace, limit=5, _continue="garbage!!")
    assert ei.value.status in (400, 410)


# -- concurrency -----------------------------------------------------------------------------


def test_concurrent_read_modify_write_loses_no_update(fleet_server: FleetServer, namespace: str) -> None:
    """Threads increment one counter with GET + PUT(resourceVersion), retrying on 409.

    Optimistic concurrency must make every successful PUT count: the final value equals the
    number of increments, and the store never answers "database is locked" or a 5xx.
    """
    path = f"/api/v1/namespaces/{namespace}/configmaps/counter"
    with fleet_server.client() as c:
        r = c.post(f"/api/v1/namespaces/{namespace}/configmaps",
                   json={"metadata": {"name": "counter"}, "data": {"n": "0"}})
        assert r.status_code == 201, r.text
    threads, per_thread = 6, 10
    conflicts = [0] * threads
    errors: list[str] = []

    def work(idx: int) -> None:
        with fleet_server.client() as c:
            done = 0
            for _ in range(per_thread * 50):  # bounded retries
                if done == per_thread:
                    return
                cur = c.get(path).json()
                cur["data"]["n"] = str(int(cur["data"]["n"]) + 1)
                r = c.put(path, json=cur)
                if r.status_code == 200:
                    done += 1
                elif r.status_code == 409:
                    conflicts[idx] += 1
                else:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    return
            errors.append(f"thread {idx} gave up after {per_thread * 50} attempts")

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert not errors, errors
    with fleet_server.client() as c:
        final = c.get(path).json()
    assert final["data"]["n"] == str(threads * per_thread), (final["data"], conflicts)
