"""pods/binding and the status a Pod gets at creation, through the full in-process pipeline."""

from __future__ import annotations

import pytest

from fleet.api.kinds.pods import default_pod
from fleet.testing.apiserver import open_api

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str = "p", **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}], **spec}}


def binding(pod_name: str, node: str, **md: object) -> dict:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name, **md},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def test_bind_sets_node_and_condition_once(api):
    assert (await api.json("POST", PODS, pod()))[0] == 201
    code, body = await api.json("POST", f"{PODS}/p/binding", binding("p", "n1"))
    assert code == 201, body
    assert body["kind"] == "Status" and body["status"] == "Success"
    code, got = await api.json("GET", f"{PODS}/p")
    assert got["spec"]["nodeName"] == "n1"
    scheduled = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert len(scheduled) == 1 and scheduled[0]["status"] == "True"
    assert got["status"]["phase"] == "Pending"  # the rest of the status is kept

    code, body = await api.json("POST", f"{PODS}/p/binding", binding("p", "n2"))
    assert code == 409 and body["reason"] == "Conflict"
    assert 'pod p is already assigned to node "n1"' in body["message"]
    code, got = await api.json("GET", f"{PODS}/p")
    assert got["spec"]["nodeName"] == "n1"


async def test_bind_replaces_an_unschedulable_condition_and_copies_annotations(api):
    await api.json("POST", PODS, pod())
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
    code, _ = await api.json("PATCH", f"{PODS}/p/status", {"status": {"conditions": [cond]}},
                             content_type="application/strategic-merge-patch+json")
    assert code == 200
    code, _ = await api.json("POST", f"{PODS}/p/binding", binding("p", "n1", annotations={"a": "b"}))
    assert code == 201
    _, got = await api.json("GET", f"{PODS}/p")
    assert [c["status"] for c in got["status"]["conditions"] if c["type"] == "PodScheduled"] == ["True"]
    assert got["metadata"]["annotations"] == {"a": "b"}


@pytest.mark.parametrize(("body", "code"), [
    (binding("other", "n1"), 400),  # name must be the pod's
    ({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {}}, 422),
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, 400),
    (binding("p", "n1", uid="not-the-pods-uid"), 409),
])
async def test_bad_bindings(api, body, code):
    await api.json("POST", PODS, pod())
    got, status = await api.json("POST", f"{PODS}/p/binding", body)
    assert got == code, status
    _, p = await api.json("GET", f"{PODS}/p")
    assert "nodeName" not in p["spec"]


async def test_bind_missing_pod_is_404_and_dry_run_changes_nothing(api):
    code, _ = await api.json("POST", f"{PODS}/nope/binding", binding("nope", "n1"))
    assert code == 404
    await api.json("POST", PODS, pod())
    code, _ = await api.json("POST", f"{PODS}/p/binding", binding("p", "n1"), query={"dryRun": "All"})
    assert code == 201
    _, p = await api.json("GET", f"{PODS}/p")
    assert "nodeName" not in p["spec"]


async def test_binding_is_create_only_and_discovered(api):
    await api.json("POST", PODS, pod())
    for method in ("GET", "PUT", "PATCH"):
        code, _ = await api.json(method, f"{PODS}/p/binding", binding("p", "n1") if method != "GET" else None,
                                 content_type="application/merge-patch+json" if method == "PATCH"
                                 else "application/json")
        assert code == 405, method
    _, doc = await api.json("GET", "/api/v1")
    entry = next(r for r in doc["resources"] if r["name"] == "pods/binding")
    assert entry["verbs"] == ["create"] and entry["kind"] == "Binding"


async def test_created_pod_gets_pending_phase_and_qos_class(api):
    guaranteed = pod("g")
    guaranteed["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    burstable = pod("b")
    burstable["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
    sent_status = pod("s")
    sent_status["status"] = {"phase": "Running", "qosClass": "Guaranteed"}  # not the client's to set
    for obj, qos in ((pod("e"), "BestEffort"), (guaranteed, "Guaranteed"), (burstable, "Burstable"),
                     (sent_status, "BestEffort")):
        code, got = await api.json("POST", PODS, obj)
        assert code == 201, got
        assert got["status"] == {"phase": "Pending", "qosClass": qos}


def test_default_pod_keeps_an_existing_status():
    obj = pod()
    obj["status"] = {"phase": "Running"}
    default_pod(obj)
    assert obj["status"] == {"phase": "Running"}


async def test_the_bindings_collection_binds_the_named_pod(api):
    # POST /api/v1/namespaces/{ns}/bindings: kube-apiserver's other spelling of pods/binding
    # (the Python client's create_namespaced_binding, custom schedulers).
    await api.json("POST", PODS, pod("q"))
    bindings = "/api/v1/namespaces/default/bindings"
    code, body = await api.json("POST", bindings, binding("q", "n1"))
    assert code == 201 and body["status"] == "Success", body
    _, got = await api.json("GET", f"{PODS}/q")
    assert got["spec"]["nodeName"] == "n1"
    code, body = await api.json("POST", bindings, binding("q", "n2"))
    assert code == 409 and 'pod q is already assigned to node "n1"' in body["message"]
    code, body = await api.json("POST", bindings, binding("nope", "n1"))
    assert code == 404 and body["message"] == 'pods "nope" not found'
    code, body = await api.json("POST", bindings, {"apiVersion": "v1", "kind": "Binding", "metadata": {},
                                                   "target": {"kind": "Node", "name": "n1"}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.name"
    # Create only: nothing is listed or read there.
    code, _ = await api.json("GET", bindings)
    assert code == 405
    code, disc = await api.json("GET", "/api/v1")
    assert {"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding",
            "verbs": ["create"]}.items() <= next(r for r in disc["resources"] if r["name"] == "bindings").items()
