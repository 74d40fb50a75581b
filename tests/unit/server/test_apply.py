"""Server-side apply and managedFields tracking, through the in-process API (fleet/server/apply.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import yaml

from fleet.server.apply import prefix_from_user_agent
from fleet.testing.apiserver import open_api

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSONP = "application/json-patch+json"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
CM = "/api/v1/namespaces/default/configmaps"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def deploy(name: str = "web", replicas: int = 1, image: str = "busybox", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, **extra},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": image}]}}},
    }


def cm(name: str = "cfg", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": dict(data)}


def entries(obj: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """managedFields by (manager, operation, subresource)."""
    return {(e["manager"], e["operation"], e.get("subresource", "")): e
            for e in obj["metadata"].get("managedFields") or []}


def owns(obj: dict[str, Any], manager: str, operation: str, *path: str, subresource: str = "") -> bool:
    node = entries(obj)[(manager, operation, subresource)]["fieldsV1"]
    for p in path:
        if p not in node:
            return False
        node = node[p]
    return True


@pytest.fixture
async def api(tmp_path):  # type: ignore[no-untyped-def]
    async with open_api(tmp_path) as a:
        yield a


async def apply(api, url: str, body: Any, manager: str | None = "mgr", **query: str) -> tuple[int, Any]:  # type: ignore[no-untyped-def]
    q = dict(query)
    if manager is not None:
        q["fieldManager"] = manager
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await api.json("PATCH", url, raw, content_type=APPLY, query=q)


# -- PatchOptions and the body -----------------------------------------------------------------------

async def test_apply_needs_a_field_manager(api) -> None:  # type: ignore[no-untyped-def]
    code, st = await apply(api, f"{DEPLOY}/web", deploy(), manager=None)
    assert code == 422 and st["reason"] == "Invalid"
    assert st["message"] == ('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                             'is required for apply patch')
    assert st["details"]["causes"] == [{"reason": "FieldValueRequired", "field": "fieldManager",
                                        "message": "Required value: is required for apply patch"}]
    code, _ = await api.json("GET", f"{DEPLOY}/web")
    assert code == 404


async def test_force_is_only_for_apply(api) -> None:  # type: ignore[no-untyped-def]
    await api.json("POST", CM, cm(a="1"))
    code, st = await api.json("PATCH", f"{CM}/cfg", {"data": {"a": "2"}}, content_type=MERGE,
                              query={"force": "true"})
    assert code == 422
    assert st["message"] == ('PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified '
                             'for non-apply patch')


@pytest.mark.parametrize(("body", "message"), [
    ({**cm(), "apiVersion": "v2"}, "invalid object type: /v2, Kind=ConfigMap"),
    ({**cm(), "kind": "Secret"}, "invalid object type: /v1, Kind=Secret"),
    ({"data": {"a": "1"}}, "invalid object type: /, Kind="),
    (cm("other"), "the name of the object (other) does not match the name on the URL (cfg)"),
    ({**cm(), "metadata": {"name": "cfg", "namespace": "kube-system"}},
     "the namespace of the object (kube-system) does not match the namespace on the URL (default)"),
    ({**cm(), "metadata": {"name": "cfg", "managedFields": []}}, "metadata.managedFields must be nil"),
])
async def test_apply_body_must_match_the_url(api, body: dict[str, Any], message: str) -> None:  # type: ignore[no-untyped-def]
    for exists in (False, True):
        if exists:
            await api.json("POST", CM, cm(a="1"))
        code, st = await apply(api, f"{CM}/cfg", body)
        assert code == 400 and st["reason"] == "BadRequest" and st["message"] == message, st


async def test_bad_yaml_is_400(api) -> None:  # type: ignore[no-untyped-def]
    code, st = await apply(api, f"{CM}/cfg", b"a: [")
    assert code == 400 and st["message"].startswith("error decoding YAML")
    code, st = await apply(api, f"{CM}/cfg", b"- 1\n- 2\n")
    assert code == 400 and st["message"].startswith("error decoding YAML")


# -- apply -------------------------------------------------------------------------------------------

async def test_apply_creates_then_updates_and_removes_what_it_stops_applying(api) -> None:  # type: ignore[no-untyped-def]
    body = yaml.safe_dump(cm(a="1", b="2")).encode()
    code, obj = await apply(api, f"{CM}/cfg", body)  # a YAML body
    assert code == 201 and obj["data"] == {"a": "1", "b": "2"}
    assert list(entries(obj)) == [("mgr", "Apply", "")]
    # An Apply entry owns what the configuration sets (kube's ToFieldSet: no "." for a map).
    assert entries(obj)[("mgr", "Apply", "")]["fieldsV1"] == {"f:data": {"f:a": {}, "f:b": {}}}
    assert obj["metadata"]["uid"] and obj["metadata"]["resourceVersion"]
    code, obj = await apply(api, f"{CM}/cfg", cm(a="1"))
    assert code == 200 and obj["data"] == {"a": "1"}
    # Another manager's field survives this manager's omission of it.
    code, obj = await api.json("PATCH", f"{CM}/cfg", {"data": {"c": "3"}}, content_type=MERGE,
                               query={"fieldManager": "editor"})
    assert code == 200 and owns(obj, "editor", "Update", "f:data", "f:c")
    code, obj = await apply(api, f"{CM}/cfg", cm(a="9"))
    assert code == 200 and obj["data"] == {"a": "9", "c": "3"}
    code, got = await api.json("GET", f"{CM}/cfg")
    assert got == obj


async def test_two_managers_conflict_then_force_takes_ownership(api) -> None:  # type: ignore[no-untyped-def]
    code, _ = await apply(api, f"{DEPLOY}/web", deploy(replicas=2), manager="a")
    assert code == 201
    rev = api.store.current_revision()
    code, st = await apply(api, f"{DEPLOY}/web", deploy(replicas=3), manager="b")
    assert code == 409 and st["reason"] == "Conflict" and st["status"] == "Failure"
    assert st["message"] == 'Apply failed with 1 conflict: conflict with "a": .spec.replicas'
    assert st["details"]["causes"] == [{"reason": "FieldManagerConflict", "message": 'conflict with "a"',
                                        "field": ".spec.replicas"}]
    assert api.store.current_revision() == rev
    # Agreeing on a value is no conflict: both own it.
    code, obj = await apply(api, f"{DEPLOY}/web", deploy(replicas=2), manager="b")
    assert code == 200 and owns(obj, "a", "Apply", "f:spec", "f:replicas")
    assert owns(obj, "b", "Apply", "f:spec", "f:replicas")
    code, obj = await apply(api, f"{DEPLOY}/web", deploy(replicas=3), manager="b", force="true")
    assert code == 200 and obj["spec"]["replicas"] == 3
    assert owns(obj, "b", "Apply", "f:spec", "f:replicas")
    assert not owns(obj, "a", "Apply", "f:spec", "f:replicas")
    assert owns(obj, "a", "Apply", "f:spec", "f:template")  # the rest stays shared


async def test_conflict_with_an_updater_names_its_api_version(api) -> None:  # type: ignore[no-untyped-def]
    code, _ = await api.json("POST", DEPLOY, deploy(), query={"fieldManager": "kubectl-create"})
    assert code == 201
    code, st = await apply(api, f"{DEPLOY}/web", deploy(replicas=5, image="nginx"), manager="a")
    assert code == 409
    assert {c["field"] for c in st["details"]["causes"]} == {
        ".spec.replicas", '.spec.template.spec.containers[name="c"].image'}
    assert {c["message"] for c in st["details"]["causes"]} == {'conflict with "kubectl-create" using apps/v1'}
    assert st["message"].startswith("Apply failed with 2 conflicts: conflicts with \"kubectl-create\" using "
                                     "apps/v1:\n- ")


async def test_apply_dry_run_stores_nothing(api) -> None:  # type: ignore[no-untyped-def]
    rev = api.store.current_revision()
    code, obj = await apply(api, f"{CM}/cfg", cm(a="1"), dryRun="All")
    assert code == 201 and entries(obj) and api.store.current_revision() == rev
    code, _ = await api.json("GET", f"{CM}/cfg")
    assert code == 404
    await apply(api, f"{CM}/cfg", cm(a="1"))
    rev = api.store.current_revision()
    code, obj = await apply(api, f"{CM}/cfg", cm(a="2"), dryRun="All")
    assert code == 200 and obj["data"] == {"a": "2"} and api.store.current_revision() == rev


async def test_apply_resource_version_is_a_precondition(api) -> None:  # type: ignore[no-untyped-def]
    code, obj = await apply(api, f"{CM}/cfg", cm(a="1"))
    stale = cm(a="2")
    stale["metadata"]["resourceVersion"] = "1"
    code, st = await apply(api, f"{CM}/cfg", stale)
    assert code == 409 and st["reason"] == "Conflict"
    fresh = cm(a="2")
    fresh["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    code, obj = await apply(api, f"{CM}/cfg", fresh)
    assert code == 200 and obj["data"] == {"a": "2"}


async def test_apply_is_validated_and_defaulted(api) -> None:  # type: ignore[no-untyped-def]
    code, obj = await apply(api, f"{DEPLOY}/web", deploy())
    assert code == 201 and obj["spec"]["strategy"]["type"] == "RollingUpdate"
    # Defaults belong to nobody: the applier owns what it sent.
    assert not owns(obj, "mgr", "Apply", "f:spec", "f:strategy")
    bad = deploy(replicas=-1)
    code, st = await apply(api, f"{DEPLOY}/web", bad)
    assert code == 422 and st["reason"] == "Invalid"
    code, st = await apply(api, f"{DEPLOY}/other", deploy("other", replicas=-1))
    assert code == 422
    code, st = await apply(api, f"{DEPLOY}/web", deploy(unknown="x"), fieldValidation="Strict")
    assert code == 400 and 'unknown field "metadata.unknown"' in st["message"]


async def test_duplicate_keys_in_an_applied_list_are_refused(api) -> None:  # type: ignore[no-untyped-def]
    body = deploy()
    body["spec"]["template"]["spec"]["containers"].append({"name": "c", "image": "x"})
    code, st = await apply(api, f"{DEPLOY}/web", body)
    assert code == 422 and "failed to create typed patch object" in st["message"]


# -- subresources --------------------------------------------------------------------------------

async def test_status_subresource_apply_and_update_record_the_subresource(api) -> None:  # type: ignore[no-untyped-def]
    await apply(api, f"{DEPLOY}/web", deploy(replicas=2), manager="a")
    status_cfg = {**deploy(replicas=9), "status": {"replicas": 2, "readyReplicas": 1}}
    code, obj = await apply(api, f"{DEPLOY}/web/status", status_cfg, manager="ctl")
    # spec sent to /status is ignored: no conflict over .spec.replicas, nothing owned there
    assert code == 200 and obj["spec"]["replicas"] == 2 and obj["status"]["readyReplicas"] == 1
    e = entries(obj)[("ctl", "Apply", "status")]
    assert e["fieldsV1"] == {"f:status": {"f:readyReplicas": {}, "f:replicas": {}}}
    code, obj = await api.json("PATCH", f"{DEPLOY}/web/status", {"status": {"availableReplicas": 1}},
                               content_type=MERGE, headers={"user-agent": "fleet-controller-manager/0.1"})
    assert code == 200
    assert entries(obj)[("fleet-controller-manager", "Update", "status")]["fieldsV1"] == {
        "f:status": {"f:availableReplicas": {}}}
    # The main resource cannot own status.
    code, obj = await apply(api, f"{DEPLOY}/web", {**deploy(replicas=2), "status": {"replicas": 7}}, manager="a")
    assert code == 200 and obj["status"]["replicas"] == 2 and not owns(obj, "a", "Apply", "f:status")


async def test_scale_subresource_apply_and_update(api) -> None:  # type: ignore[no-untyped-def]
    await apply(api, f"{DEPLOY}/web", deploy(replicas=2), manager="a")
    code, st = await apply(api, f"{DEPLOY}/web/scale", {"apiVersion": "autoscaling/v1", "kind": "Scale",
                                                         "metadata": {"name": "web"}, "spec": {"replicas": 4}},
                           manager="hpa")
    assert code == 409 and st["details"]["causes"][0]["field"] == ".spec.replicas"
    code, scale = await apply(api, f"{DEPLOY}/web/scale", {"apiVersion": "autoscaling/v1", "kind": "Scale",
                                                            "metadata": {"name": "web"}, "spec": {"replicas": 4}},
                              manager="hpa", force="true")
    assert code == 200 and scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4
    _, obj = await api.json("GET", f"{DEPLOY}/web")
    assert obj["spec"]["replicas"] == 4
    assert entries(obj)[("hpa", "Apply", "scale")]["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    assert not owns(obj, "a", "Apply", "f:spec", "f:replicas")
    code, _ = await api.json("PATCH", f"{DEPLOY}/web/scale", {"spec": {"replicas": 5}}, content_type=MERGE,
                             query={"fieldManager": "kubectl-scale"})
    assert code == 200
    _, obj = await api.json("GET", f"{DEPLOY}/web")
    assert entries(obj)[("kubectl-scale", "Update", "scale")]["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    code, st = await apply(api, f"{DEPLOY}/web/scale", deploy(), manager="hpa")
    assert code == 400 and st["message"] == "invalid object type: apps/v1, Kind=Deployment"
    code, _ = await apply(api, f"{DEPLOY}/missing/scale", {"apiVersion": "autoscaling/v1", "kind": "Scale",
                                                          "spec": {"replicas": 1}})
    assert code == 404


# -- update tracking -------------------------------------------------------------------------------

async def test_every_write_is_tracked_with_the_writers_name(api) -> None:  # type: ignore[no-untyped-def]
    code, obj = await api.json("POST", CM, cm(a="1"), headers={"user-agent": "kubectl/v1.32.0 (linux/amd64)"})
    assert code == 201
    e = entries(obj)[("kubectl", "Update", "")]
    assert e["apiVersion"] == "v1" and e["fieldsType"] == "FieldsV1" and e["time"]
    assert e["fieldsV1"] == {"f:data": {".": {}, "f:a": {}}}
    obj["data"]["b"] = "2"
    code, obj = await api.json("PUT", f"{CM}/cfg", obj, query={"fieldManager": "kubectl-edit"})
    assert code == 200 and entries(obj)[("kubectl-edit", "Update", "")]["fieldsV1"] == {"f:data": {"f:b": {}}}
    code, obj = await api.json("PATCH", f"{CM}/cfg", [{"op": "add", "path": "/metadata/labels",
                                                       "value": {"x": "y"}}], content_type=JSONP,
                                headers={"user-agent": "fleet-controller-manager/0.1 (linux)"})
    assert code == 200 and owns(obj, "fleet-controller-manager", "Update", "f:metadata", "f:labels", "f:x")
    # A write that changes nothing leaves managedFields alone.
    before = obj["metadata"]["managedFields"]
    code, obj = await api.json("PATCH", f"{CM}/cfg", {"data": {"a": "1"}}, content_type=MERGE,
                               query={"fieldManager": "noop"})
    assert code == 200 and obj["metadata"]["managedFields"] == before


async def test_create_honours_sent_managed_fields_and_update_can_reset_them(api) -> None:  # type: ignore[no-untyped-def]
    body = cm(a="1")
    body["metadata"]["managedFields"] = [{"manager": "old-tool", "operation": "Update", "apiVersion": "v1",
                                          "fieldsType": "FieldsV1",
                                          "fieldsV1": {"f:data": {"f:a": {}, "f:gone": {}}}}]
    code, obj = await api.json("POST", CM, body, query={"fieldManager": "creator"})
    assert code == 201 and set(entries(obj)) == {("old-tool", "Update", ""), ("creator", "Update", "")}
    assert owns(obj, "creator", "Update", "f:data", "f:a")  # the create wrote it: the creator has it now
    assert entries(obj)[("old-tool", "Update", "")]["fieldsV1"] == {"f:data": {"f:gone": {}}}
    obj["metadata"]["managedFields"] = [{}]
    code, obj = await api.json("PUT", f"{CM}/cfg", obj, query={"fieldManager": "x"})
    assert code == 200 and "managedFields" not in obj["metadata"]
    # Untracked now, until it is applied.
    code, obj = await api.json("PATCH", f"{CM}/cfg", {"data": {"z": "1"}}, content_type=MERGE)
    assert "managedFields" not in obj["metadata"]
    code, obj = await apply(api, f"{CM}/cfg", cm(a="2"), manager="a")
    assert code == 409 and obj["details"]["causes"][0]["message"] == 'conflict with "before-first-apply" using v1'


async def test_bad_managed_fields_are_refused_on_write(api) -> None:  # type: ignore[no-untyped-def]
    body = cm(a="1")
    body["metadata"]["managedFields"] = [{"manager": "m", "operation": "Steal", "apiVersion": "v1",
                                          "fieldsType": "FieldsV1", "fieldsV1": {}}]
    code, st = await api.json("POST", CM, body)
    assert code == 422 and "metadata.managedFields[0].operation" in st["message"]


# -- client-side apply, then server-side -------------------------------------------------------------

async def test_client_side_apply_upgrade_path(api) -> None:  # type: ignore[no-untyped-def]
    first = deploy(replicas=2)
    first["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(first)}
    code, _ = await api.json("POST", DEPLOY, first, query={"fieldManager": "kubectl-client-side-apply"})
    assert code == 201
    # Another applier conflicts with kubectl's client-side apply ...
    code, st = await apply(api, f"{DEPLOY}/web", deploy(replicas=3), manager="helm")
    assert code == 409 and 'conflict with "kubectl-client-side-apply" using apps/v1' in st["message"]
    # ... kubectl itself (`kubectl apply --server-side`) takes over what its last-applied
    # configuration still says, and keeps the annotation in step.
    code, obj = await apply(api, f"{DEPLOY}/web", deploy(replicas=3), manager="kubectl")
    assert code == 200 and obj["spec"]["replicas"] == 3
    assert owns(obj, "kubectl", "Apply", "f:spec", "f:replicas")
    assert json.loads(obj["metadata"]["annotations"][LAST_APPLIED])["spec"]["replicas"] == 3
    # A field someone else changed since is still a conflict for kubectl.
    code, _ = await api.json("PATCH", f"{DEPLOY}/web", {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "nginx"}]}}}}, content_type=MERGE, query={"fieldManager": "kubectl-edit"})
    code, st = await apply(api, f"{DEPLOY}/web", deploy(replicas=3, image="redis"), manager="kubectl")
    assert code == 409 and 'conflict with "kubectl-edit" using apps/v1' in st["message"]


def test_manager_from_user_agent() -> None:
    assert prefix_from_user_agent("kubectl/v1.32.0 (linux/amd64) kubernetes/abc") == "kubectl"
    assert prefix_from_user_agent("kube-controller-manager/v1.32.0") == "kube-controller-manager"
    assert prefix_from_user_agent("") == ""
    assert prefix_from_user_agent("a\x00b\nc/x") == "abc"
    assert prefix_from_user_agent("é" * 100) == "é" * 64


async def test_kubectl_managed_fields_migration_patch(api) -> None:  # type: ignore[no-untyped-def]
    """kubectl's csaupgrade: a JSON patch replacing managedFields, the resourceVersion replaced as a precondition."""
    code, obj = await api.json("POST", CM, cm(a="1"), query={"fieldManager": "kubectl-client-side-apply"})
    rv = obj["metadata"]["resourceVersion"]
    migrated = [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}]
    code, st = await api.json("PATCH", f"{CM}/cfg", [
        {"op": "replace", "path": "/metadata/managedFields", "value": migrated},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}], content_type=JSONP,
        query={"fieldManager": "kubectl"})
    assert code == 409 and st["reason"] == "Conflict"
    code, obj = await api.json("PATCH", f"{CM}/cfg", [
        {"op": "replace", "path": "/metadata/managedFields", "value": migrated},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": rv}], content_type=JSONP,
        query={"fieldManager": "kubectl"})
    assert code == 200 and obj["metadata"]["managedFields"] == migrated


async def test_an_apply_that_creates_needs_create_permission(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fleet.auth import UserInfo
    from fleet.server.security import SecurityConfig

    carol = UserInfo("carol", groups=("system:authenticated",))
    async with open_api(tmp_path, namespace_controller=False, security=SecurityConfig(),
                        tokens={"carol-token": carol}) as api:
        code, body = await api.json("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "patcher"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]})
        assert code == 201, body
        code, body = await api.json("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "patcher"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patcher"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]})
        assert code == 201, body
        # Patch alone is enough to apply to an existing object (polled: RBAC reads a watch-fed cache).
        await api.json("POST", CM, cm("existing", a="0"))
        raw = json.dumps(cm("existing", a="1")).encode()
        with trio.fail_after(10):
            while True:
                code, obj = await api.json("PATCH", f"{CM}/existing", raw, content_type=APPLY,
                                           query={"fieldManager": "c", "force": "true"}, token="carol-token")
                if code != 403:
                    break
                await trio.sleep(0.05)
        assert code == 200 and obj["data"] == {"a": "1"}
        code, st = await api.json("PATCH", f"{CM}/cfg", json.dumps(cm(a="1")).encode(), content_type=APPLY,
                                  query={"fieldManager": "c"}, token="carol-token")
        assert code == 403 and st["message"] == ('configmaps "cfg" is forbidden: User "carol" cannot create '
                                                 'resource "configmaps" in API group "" in the namespace "default"')
        code, _ = await api.json("GET", f"{CM}/cfg")
        assert code == 404


async def test_badly_typed_apply_is_422_before_defaulting(api) -> None:  # type: ignore[no-untyped-def]
    for url in (f"{DEPLOY}/web", f"{DEPLOY}/web"):  # a create, then (after a good apply) an update
        body = deploy()
        body["spec"]["replicas"] = "many"
        body["spec"]["template"]["spec"]["containers"] = {"name": "c"}
        code, st = await apply(api, url, body)
        assert code == 422 and st["reason"] == "Invalid", st
        assert {c["field"] for c in st["details"]["causes"]} >= {"spec.replicas"}
        await apply(api, url, deploy())


@pytest.mark.parametrize("metadata", [None, {"name": "cfg", "labels": None}, {"name": "cfg", "annotations": {}}])
async def test_null_and_empty_metadata_in_an_applied_configuration(api, metadata: Any) -> None:  # type: ignore[no-untyped-def]
    await api.json("POST", CM, cm(a="1"))
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"b": "2"}}
    code, obj = await apply(api, f"{CM}/cfg", body)
    assert code == 200 and obj["data"] == {"a": "1", "b": "2"}, obj


WIDGET_SCHEMA = {
    "type": "object",
    "properties": {"spec": {"type": "object", "properties": {
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": {"type": "string"},
                                                             "port": {"type": "integer"}}}},
        "tags": {"type": "array", "items": {"type": "string"}},
    }}},
}


async def test_a_kind_with_an_openapi_schema_gets_its_list_semantics(api) -> None:  # type: ignore[no-untyped-def]
    """What a CRD's entry carries (`openapi_schema`): keyed lists merge per item, plain lists are atomic."""
    from fleet.api.registry import KindInfo

    api.server.registry.register(KindInfo("example.com", "v1", "Widget", "widgets", "widget",
                                          strategic_merge=False, openapi_schema=WIDGET_SCHEMA))
    url = "/apis/example.com/v1/namespaces/default/widgets/w"

    def widget(ports: list[dict[str, Any]], tags: list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"ports": ports}
        if tags is not None:
            spec["tags"] = tags
        return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}

    code, obj = await apply(api, url, widget([{"name": "a", "port": 1}], ["x"]), manager="one")
    assert code == 201, obj
    code, obj = await apply(api, url, widget([{"name": "b", "port": 2}]), manager="two")
    # Both items kept (with nothing shared, the configuration's items come first: the library's order).
    assert code == 200 and obj["spec"]["ports"] == [{"name": "b", "port": 2}, {"name": "a", "port": 1}]
    assert 'k:{"name":"b"}' in entries(obj)[("two", "Apply", "")]["fieldsV1"]["f:spec"]["f:ports"]
    code, st = await apply(api, url, widget([{"name": "b", "port": 2}], ["y"]), manager="two")
    assert code == 409 and st["details"]["causes"][0]["field"] == ".spec.tags"  # atomic: owned whole by "one"
    code, obj = await apply(api, url, widget([]), manager="one")  # "one" lets go of its item and tags
    assert code == 200 and obj["spec"] == {"ports": [{"name": "b", "port": 2}]}
