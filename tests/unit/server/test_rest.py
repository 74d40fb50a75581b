"""The generic REST handlers, driven in-process through the full pipeline."""

from __future__ import annotations

import json

import pytest

from fleet.testing.apiserver import open_api

CM = "/api/v1/namespaces/default/configmaps"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"


def cm(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"app": "x"}},
            "data": dict(data)}


def deploy(name: str = "web", replicas: int = 1) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox",
                                                       "env": [{"name": "A", "value": "1"}]}]}}},
    }


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def test_default_namespaces_exist(api):
    code, body = await api.json("GET", "/api/v1/namespaces")
    assert code == 200
    names = {i["metadata"]["name"] for i in body["items"]}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names
    assert body["kind"] == "NamespaceList"


async def test_anonymous_is_refused(api):
    code, body = await api.json("GET", CM, token=None)
    assert code == 401 and body["reason"] == "Unauthorized" and body["kind"] == "Status"
    code, body = await api.json("GET", CM, token="wrong")
    assert code == 401


async def test_create_get_update_conflict_delete(api):
    code, created = await api.json("POST", CM, cm("a", k="v"))
    assert code == 201
    md = created["metadata"]
    assert md["uid"] and md["creationTimestamp"] and md["resourceVersion"] and md["namespace"] == "default"
    code, body = await api.json("POST", CM, cm("a"))
    assert code == 409 and body["reason"] == "AlreadyExists"
    code, got = await api.json("GET", f"{CM}/a")
    assert code == 200 and got["data"] == {"k": "v"}
    stale = dict(got, data={"k": "v2"})
    code, updated = await api.json("PUT", f"{CM}/a", stale)
    assert code == 200 and updated["data"] == {"k": "v2"}
    code, body = await api.json("PUT", f"{CM}/a", dict(got, data={"k": "v3"}))
    assert code == 409 and body["reason"] == "Conflict"
    code, body = await api.json("DELETE", f"{CM}/a")
    assert code == 200
    code, body = await api.json("GET", f"{CM}/a")
    assert code == 404 and body["reason"] == "NotFound" and body["details"]["name"] == "a"
    assert body["message"] == 'configmaps "a" not found'


async def test_generate_name(api):
    body = cm("")
    body["metadata"] = {"generateName": "gen-"}
    code, created = await api.json("POST", CM, body)
    assert code == 201 and created["metadata"]["name"].startswith("gen-")
    assert len(created["metadata"]["name"]) == len("gen-") + 5


async def test_create_in_missing_or_terminating_namespace_is_refused(api):
    code, body = await api.json("POST", "/api/v1/namespaces/nope/configmaps", cm("a"))
    assert code == 404 and 'namespaces "nope" not found' in body["message"]
    code, _ = await api.json("POST", "/api/v1/namespaces",
                             {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})
    assert code == 201
    # Give the namespace content with a finalizer so it stays Terminating.
    held = cm("held")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    code, _ = await api.json("POST", "/api/v1/namespaces/gone/configmaps", held)
    assert code == 201
    code, ns = await api.json("DELETE", "/api/v1/namespaces/gone")
    assert code in (200, 202)
    code, ns = await api.json("GET", "/api/v1/namespaces/gone")
    assert code == 200 and ns["status"]["phase"] == "Terminating"
    code, body = await api.json("POST", "/api/v1/namespaces/gone/configmaps", cm("b"))
    assert code == 403 and "being terminated" in body["message"]
    # Release the finalizer: the namespace finalizer removes the content and the namespace.
    code, _ = await api.json("PATCH", "/api/v1/namespaces/gone/configmaps/held",
                             {"metadata": {"finalizers": None}},
                             content_type="application/merge-patch+json")
    assert code == 200
    import trio

    with trio.fail_after(10):
        while True:
            code, _ = await api.json("GET", "/api/v1/namespaces/gone")
            if code == 404:
                break
            await trio.sleep(0.05)


async def test_protected_namespace_cannot_be_deleted(api):
    code, body = await api.json("DELETE", "/api/v1/namespaces/default")
    assert code == 403


async def test_validation_is_422_with_causes_and_stores_nothing(api):
    bad = deploy("Bad_Name")
    bad["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    rev = api.store.current_revision()
    code, body = await api.json("POST", DEPLOY, bad)
    assert code == 422 and body["reason"] == "Invalid"
    fields = {c["field"] for c in body["details"]["causes"]}
    assert "metadata.name" in fields
    assert "is invalid" in body["message"]
    assert api.store.current_revision() == rev


@pytest.mark.parametrize("raw,ctype,code,reason", [
    (b"{not json", "application/json", 400, "BadRequest"),
    (b"[1,2]", "application/json", 400, "BadRequest"),
    (b"k8s\x00\x01", "application/vnd.kubernetes.protobuf", 400, "BadRequest"),
    (b"a: b", "text/plain", 415, "UnsupportedMediaType"),
])
async def test_malformed_bodies(api, raw, ctype, code, reason):
    rev = api.store.current_revision()
    resp = await api.call("POST", CM, raw, content_type=ctype)
    body = json.loads(resp.body)
    assert resp.status == code and body["reason"] == reason
    assert api.store.current_revision() == rev


async def test_wrong_api_version_and_unknown_kind(api):
    body = cm("a")
    body["apiVersion"] = "apps/v1"
    code, st = await api.json("POST", CM, body)
    assert code == 400 and "does not match the expected API version" in st["message"]
    code, st = await api.json("GET", "/api/v1/namespaces/default/widgets")
    assert code == 404


async def test_body_too_large(api):
    big = cm("big", k="x" * (4 * 1024 * 1024))
    code, st = await api.json("POST", CM, big)
    assert code == 413 and st["reason"] == "RequestEntityTooLarge"


async def test_field_validation_modes(api):
    body = cm("fv")
    body["spec"] = {"nope": 1}
    code, st = await api.json("POST", CM, body, query={"fieldValidation": "Strict"})
    assert code == 400 and 'unknown field "spec"' in st["message"]
    resp = await api.call("POST", CM, body, query={"fieldValidation": "Warn"})
    assert resp.status == 201 and "unknown field" in resp.headers["Warning"]
    code, st = await api.json("POST", CM, {**cm("fv2"), "spec": {}}, query={"fieldValidation": "Ignore"})
    assert code == 201
    code, st = await api.json("POST", CM, cm("fv3"), query={"fieldValidation": "Bogus"})
    assert code == 400


async def test_dry_run_changes_nothing(api):
    rev = api.store.current_revision()
    code, body = await api.json("POST", CM, cm("dry"), query={"dryRun": "All"})
    assert code == 201 and body["metadata"]["name"] == "dry"
    assert api.store.current_revision() == rev
    code, _ = await api.json("GET", f"{CM}/dry")
    assert code == 404


async def test_list_selectors_and_pagination(api):
    for i in range(7):
        c = cm(f"p{i}")
        c["metadata"]["labels"] = {"app": "x", "idx": str(i % 2)}
        assert (await api.json("POST", CM, c))[0] == 201
    code, body = await api.json("GET", CM, query={"labelSelector": "idx=1"})
    assert sorted(i["metadata"]["name"] for i in body["items"]) == ["p1", "p3", "p5"]
    code, body = await api.json("GET", CM, query={"labelSelector": "idx notin (1)"})
    assert len(body["items"]) == 4
    code, body = await api.json("GET", CM, query={"fieldSelector": "metadata.name=p2"})
    assert [i["metadata"]["name"] for i in body["items"]] == ["p2"]
    code, body = await api.json("GET", CM, query={"fieldSelector": "spec.bogus=1"})
    assert code == 400
    seen: list[str] = []
    cont = ""
    pages = 0
    while True:
        q = {"limit": "3"}
        if cont:
            q["continue"] = cont
        code, body = await api.json("GET", CM, query=q)
        assert code == 200
        pages += 1
        seen += [i["metadata"]["name"] for i in body["items"]]
        # A write between pages must not show up in a continued list.
        await api.json("POST", CM, cm(f"late{pages}"))
        cont = body["metadata"].get("continue", "")
        if not cont:
            break
    assert seen == [f"p{i}" for i in range(7)]
    assert pages == 3


async def test_cluster_wide_list(api):
    await api.json("POST", CM, cm("one"))
    code, body = await api.json("GET", "/api/v1/configmaps")
    assert code == 200 and any(i["metadata"]["name"] == "one" for i in body["items"])


async def test_table_response(api):
    await api.json("POST", DEPLOY, deploy("web", 3))
    code, body = await api.json("GET", DEPLOY, headers={
        "accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    assert code == 200 and body["kind"] == "Table"
    names = [c["name"] for c in body["columnDefinitions"]]
    assert names[0] == "Name" and names[-1] != "" and "Age" in names
    row = body["rows"][0]
    assert row["cells"][0] == "web"
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["labels"] == {"app": "web"}


async def test_patches(api):
    await api.json("POST", DEPLOY, deploy())
    url = f"{DEPLOY}/web"
    code, body = await api.json("PATCH", url, {"metadata": {"labels": {"tier": "fe"}}},
                                content_type="application/merge-patch+json")
    assert code == 200 and body["metadata"]["labels"] == {"app": "web", "tier": "fe"}
    code, body = await api.json("PATCH", url, {"spec": {"template": {"spec": {"containers": [
        {"name": "side", "image": "busybox"}]}}}}, content_type="application/strategic-merge-patch+json")
    assert code == 200
    # Kubernetes puts containers that only the patch has first.
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["side", "c"]
    gen = body["metadata"]["generation"]
    code, body = await api.json("PATCH", url, [{"op": "replace", "path": "/spec/replicas", "value": 4}],
                                content_type="application/json-patch+json")
    assert code == 200 and body["spec"]["replicas"] == 4 and body["metadata"]["generation"] == gen + 1
    rev = api.store.current_revision()
    code, st = await api.json("PATCH", url, [{"op": "test", "path": "/spec/replicas", "value": 9}],
                              content_type="application/json-patch+json")
    assert code == 422 and api.store.current_revision() == rev
    code, st = await api.json("PATCH", url, b"{broken", content_type="application/merge-patch+json")
    assert code == 400
    code, st = await api.json("PATCH", url, {"a": 1}, content_type="text/plain")
    assert code == 415


async def test_status_and_scale_subresources(api):
    await api.json("POST", DEPLOY, deploy())
    url = f"{DEPLOY}/web"
    # The main resource ignores status; the status subresource ignores spec.
    code, obj = await api.json("GET", url)
    obj["status"] = {"replicas": 7}
    code, obj = await api.json("PUT", url, obj)
    assert code == 200 and "replicas" not in (obj.get("status") or {})
    obj["status"] = {"replicas": 7}
    obj["spec"]["replicas"] = 9
    code, obj = await api.json("PUT", f"{url}/status", obj)
    assert code == 200 and obj["status"]["replicas"] == 7 and obj["spec"]["replicas"] == 1
    code, scale = await api.json("GET", f"{url}/scale")
    assert code == 200 and scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1
    assert scale["status"]["selector"] == "app=web"
    code, scale = await api.json("PATCH", f"{url}/scale", {"spec": {"replicas": 5}},
                                 content_type="application/merge-patch+json")
    assert code == 200 and scale["spec"]["replicas"] == 5
    code, obj = await api.json("GET", url)
    assert obj["spec"]["replicas"] == 5
    code, st = await api.json("PATCH", f"{url}/scale", {"spec": {"replicas": -1}},
                              content_type="application/merge-patch+json")
    assert code == 422
    code, _ = await api.json("GET", f"{CM}/x/scale")
    assert code == 404


async def test_finalizers_and_delete_preconditions(api):
    c = cm("fin")
    c["metadata"]["finalizers"] = ["example.com/x"]
    code, obj = await api.json("POST", CM, c)
    code, body = await api.json("DELETE", f"{CM}/fin", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                        "preconditions": {"uid": "wrong"}})
    assert code == 409
    code, body = await api.json("DELETE", f"{CM}/fin")
    assert code == 200 and body["metadata"]["deletionTimestamp"]
    code, body = await api.json("GET", f"{CM}/fin")
    assert code == 200
    code, body = await api.json("PATCH", f"{CM}/fin", {"metadata": {"finalizers": []}},
                                content_type="application/merge-patch+json")
    assert code == 200
    code, _ = await api.json("GET", f"{CM}/fin")
    assert code == 404


async def test_delete_collection(api):
    for i in range(3):
        await api.json("POST", CM, cm(f"dc{i}"))
    code, body = await api.json("DELETE", CM, query={"labelSelector": "app=x"})
    assert code == 200 and len(body["items"]) == 3
    code, body = await api.json("GET", CM)
    assert body["items"] == []


async def test_discovery_and_version(api):
    code, body = await api.json("GET", "/api")
    assert body["versions"] == ["v1"]
    code, body = await api.json("GET", "/apis")
    assert {"apps", "batch", "coordination.k8s.io", "events.k8s.io"} <= {g["name"] for g in body["groups"]}
    code, body = await api.json("GET", "/apis/apps/v1")
    names = {r["name"] for r in body["resources"]}
    assert {"deployments", "deployments/scale", "deployments/status"} <= names
    for r in body["resources"]:
        assert r["name"] and r["kind"] and r["verbs"] is not None and r["namespaced"] is not None
    code, body = await api.json("GET", "/version")
    assert body["major"] == "1" and body["gitVersion"].startswith("v1.")


async def test_openapi_v3_declares_field_validation(api):
    code, idx = await api.json("GET", "/openapi/v3")
    assert "api/v1" in idx["paths"] and "apis/apps/v1" in idx["paths"]
    code, doc = await api.json("GET", "/openapi/v3/apis/apps/v1")
    p = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert p["x-kubernetes-group-version-kind"] == {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert any(q["name"] == "fieldValidation" for q in p["parameters"])


async def test_aggregated_discovery(api):
    accept = ("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
              "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json")
    resp = await api.call("GET", "/apis", headers={"accept": accept})
    assert resp.content_type.startswith("application/json;g=apidiscovery.k8s.io;v=v2")
    body = json.loads(resp.body)
    assert body["kind"] == "APIGroupDiscoveryList"
    apps = next(i for i in body["items"] if i["metadata"]["name"] == "apps")
    deploy = next(r for r in apps["versions"][0]["resources"] if r["resource"] == "deployments")
    assert deploy["scope"] == "Namespaced" and deploy["shortNames"] == ["deploy"]
    assert {s["subresource"] for s in deploy["subresources"]} == {"status", "scale"}
    resp = await api.call("GET", "/api", headers={"accept": accept})
    core = json.loads(resp.body)["items"]
    assert [i["metadata"]["name"] for i in core] == [""]
    # Plain JSON still gets the legacy shape.
    code, legacy = await api.json("GET", "/api")
    assert legacy["kind"] == "APIVersions"
    # kubectl 1.26-1.27 ask apidiscovery.k8s.io/v2beta1 only; 1.32 serves it too.
    beta = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
    for path in ("/api", "/apis/"):
        resp = await api.call("GET", path, headers={"accept": beta})
        assert resp.content_type == "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        doc = json.loads(resp.body)
        assert (doc["kind"], doc["apiVersion"]) == ("APIGroupDiscoveryList", "apidiscovery.k8s.io/v2beta1")
        assert doc["items"]


async def test_job_selector_uses_the_stored_uid(api):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}}}
    code, body = await api.json("POST", "/apis/batch/v1/namespaces/default/jobs", job)
    assert code == 201, body
    uid = body["metadata"]["uid"]
    assert body["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"] == uid
    assert body["spec"]["template"]["metadata"]["labels"]["controller-uid"] == uid


def pod(name: str, node: str | None = None, grace: int | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


PODS = "/api/v1/namespaces/default/pods"


async def test_unscheduled_pod_is_deleted_at_once(api):
    await api.json("POST", PODS, pod("free"))
    code, _ = await api.json("DELETE", f"{PODS}/free")
    assert code == 200
    assert (await api.json("GET", f"{PODS}/free"))[0] == 404


async def test_running_pod_deletion_is_graceful(api):
    code, created = await api.json("POST", PODS, pod("bound", node="n1", grace=45))
    assert code == 201 and created["status"]["phase"] == "Pending"
    code, body = await api.json("DELETE", f"{PODS}/bound")
    assert code == 200
    assert body["metadata"]["deletionGracePeriodSeconds"] == 45 and body["metadata"]["deletionTimestamp"]
    code, still = await api.json("GET", f"{PODS}/bound")
    assert code == 200 and still["metadata"]["deletionTimestamp"]
    # A second delete does not restart the clock.
    code, again = await api.json("DELETE", f"{PODS}/bound", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                            "gracePeriodSeconds": 10})
    assert again["metadata"]["deletionGracePeriodSeconds"] == 45
    # The agent's final delete (grace 0, uid precondition) removes it.
    code, _ = await api.json("DELETE", f"{PODS}/bound", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                        "gracePeriodSeconds": 0,
                                                        "preconditions": {"uid": created["metadata"]["uid"]}})
    assert code == 200
    assert (await api.json("GET", f"{PODS}/bound"))[0] == 404


async def test_delete_options_grace_period_from_query(api):
    await api.json("POST", PODS, pod("q", node="n1"))
    code, body = await api.json("DELETE", f"{PODS}/q", query={"gracePeriodSeconds": "5"})
    assert body["metadata"]["deletionGracePeriodSeconds"] == 5
    code, _ = await api.json("DELETE", f"{PODS}/q", query={"gracePeriodSeconds": "0"})
    assert (await api.json("GET", f"{PODS}/q"))[0] == 404
