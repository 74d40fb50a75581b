"""Per-kind strategies are data, not branches: KindInfo fields and the handler tables."""

from __future__ import annotations

import dataclasses

import pytest

from fleet.server.http import Resp
from fleet.testing.apiserver import open_api


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def test_status_on_create_is_the_kinds_strategy(api) -> None:
    code, node = await api.json("POST", "/api/v1/nodes", {"metadata": {"name": "n1"},
                                                          "status": {"capacity": {"cpu": "2"}}})
    assert code == 201 and node["status"]["capacity"] == {"cpu": "2"}
    code, cm = await api.json("POST", "/api/v1/namespaces/default/services", {
        "metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})
    assert code == 201 and not (cm.get("status") or {}).get("loadBalancer", {}).get("ingress")


async def test_delete_strategy_table_decides_the_delete(api) -> None:
    calls = []

    async def custom(info, route, old, opts, *, dry_run):  # type: ignore[no-untyped-def]
        calls.append(route.name)
        return Resp.json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})

    api.server.resources.delete_strategies[("", "configmaps")] = custom
    assert (await api.json("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "c"}}))[0] == 201
    assert (await api.json("DELETE", "/api/v1/namespaces/default/configmaps/c"))[0] == 200
    assert calls == ["c"]
    assert (await api.json("GET", "/api/v1/namespaces/default/configmaps/c"))[0] == 200  # custom kept it
    # The namespace strategy: a delete starts finalization (Terminating), not a removal.
    assert (await api.json("POST", "/api/v1/namespaces", {"metadata": {"name": "gone"}}))[0] == 201
    code, ns = await api.json("DELETE", "/api/v1/namespaces/gone")
    assert code == 200 and ns["status"]["phase"] == "Terminating"


async def test_create_subresource_table_dispatches_posts(api) -> None:
    assert set(api.server.resources.create_subresources) == {("", "pods", "binding"), ("", "pods", "eviction")}
    assert (await api.json("POST", "/api/v1/namespaces/default/pods", {
        "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}))[0] == 201
    code, _ = await api.json("POST", "/api/v1/namespaces/default/pods/p/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"name": "n1"}})
    assert code == 201
    assert (await api.json("GET", "/api/v1/namespaces/default/pods/p"))[1]["spec"]["nodeName"] == "n1"


async def test_resource_handler_table_serves_special_resources(api) -> None:
    table = api.server.resource_handlers
    assert ("", "v1", "nodes", "drain") in table and ("autoscaling", "v1", "horizontalpodautoscalers", "") in table
    assert ("metrics.k8s.io", "v1beta1", "pods", "") in table
    code, body = await api.json("GET", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")
    assert code == 200 and body["kind"] == "PodMetricsList"


async def test_graceful_delete_is_the_kinds_strategy(api) -> None:
    """KindInfo.delete_grace decides a graceful DELETE: a bound pod is only marked
    (its node finishes it); a kind given the same strategy behaves the same way."""
    assert (await api.json("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}}))[0] == 201
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                "terminationGracePeriodSeconds": 7}}
    assert (await api.json("POST", "/api/v1/namespaces/default/pods", pod))[0] == 201
    code, _ = await api.json("POST", "/api/v1/namespaces/default/pods/p/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}})
    assert code == 201
    assert (await api.json("DELETE", "/api/v1/namespaces/default/pods/p"))[0] == 200
    code, marked = await api.json("GET", "/api/v1/namespaces/default/pods/p")
    assert code == 200 and marked["metadata"]["deletionGracePeriodSeconds"] == 7

    # A ConfigMap has no such strategy: deleted at once.  Given one, it is marked.
    info = api.server.registry.get("", "v1", "configmaps")
    assert info.delete_grace is None
    for name in ("a", "b"):
        assert (await api.json("POST", "/api/v1/namespaces/default/configmaps",
                               {"metadata": {"name": name}}))[0] == 201
    assert (await api.json("DELETE", "/api/v1/namespaces/default/configmaps/a"))[0] == 200
    assert (await api.json("GET", "/api/v1/namespaces/default/configmaps/a"))[0] == 404
    api.server.registry.register(dataclasses.replace(info, delete_grace=lambda obj, requested: 5))
    assert (await api.json("DELETE", "/api/v1/namespaces/default/configmaps/b"))[0] == 200
    code, cm = await api.json("GET", "/api/v1/namespaces/default/configmaps/b")
    assert code == 200 and cm["metadata"]["deletionGracePeriodSeconds"] == 5


async def test_update_subresource_table_serves_namespace_finalize(tmp_path) -> None:
    # Without the namespace controller, so that only the subresource acts.
    async with open_api(tmp_path, namespace_controller=False) as api:
        assert set(api.server.resources.update_subresources) == {("", "namespaces", "finalize")}
        code, doc = await api.json("GET", "/api/v1")
        fin = next(r for r in doc["resources"] if r["name"] == "namespaces/finalize")
        assert fin["verbs"] == ["update"] and fin["kind"] == "Namespace"
        code, ns = await api.json("POST", "/api/v1/namespaces", {"metadata": {"name": "f"}})
        assert code == 201 and ns["spec"]["finalizers"] == ["kubernetes"]
        path = "/api/v1/namespaces/f/finalize"
        # Only spec.finalizers is taken from the body; the namespace stays while not deleted.
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "f", "labels": {"x": "y"}, "resourceVersion": ns["metadata"]["resourceVersion"]},
                "spec": {"finalizers": ["example.com/a"]}, "status": {"phase": "Terminating"}}
        code, out = await api.json("PUT", path, body)
        assert code == 200, out
        assert out["spec"]["finalizers"] == ["example.com/a"] and out["status"]["phase"] == "Active"
        assert "x" not in (out["metadata"].get("labels") or {})
        # The body's resourceVersion is a precondition.
        assert (await api.json("PUT", path, body))[0] == 409
        assert (await api.json("PUT", "/api/v1/namespaces/f/finalize", {"metadata": {"name": "g"}}))[0] == 400
        # Being deleted with metadata finalizers: a finalize to [] keeps it for their owner ...
        code, _ = await api.json("DELETE", "/api/v1/namespaces/f", {"propagationPolicy": "Foreground"})
        assert code == 200
        code, out = await api.json("PUT", path, {"metadata": {"name": "f"}, "spec": {"finalizers": []}})
        assert code == 200 and out["metadata"]["finalizers"] == ["foregroundDeletion"]
        assert (await api.json("GET", "/api/v1/namespaces/f"))[0] == 200
        # ... whose last finalizer's removal ends it.
        code, _ = await api.json("PATCH", "/api/v1/namespaces/f", {"metadata": {"finalizers": None}},
                                 content_type="application/merge-patch+json")
        assert code == 200
        assert (await api.json("GET", "/api/v1/namespaces/f"))[0] == 404
        # Being deleted with nothing else holding it: the finalize removes it.
        assert (await api.json("POST", "/api/v1/namespaces", {"metadata": {"name": "h"}}))[0] == 201
        assert (await api.json("DELETE", "/api/v1/namespaces/h"))[0] == 200
        code, out = await api.json("PUT", "/api/v1/namespaces/h/finalize",
                                   {"metadata": {"name": "h"}, "spec": {"finalizers": []}})
        assert code == 200 and out["metadata"]["name"] == "h"
        assert (await api.json("GET", "/api/v1/namespaces/h"))[0] == 404
