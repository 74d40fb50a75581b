"""Objects of the wrong shape already in the store (written before typed validation,
or by hand) never make a read, a list, a watch or a delete answer 5xx.

Written straight through the store, so they bypass the API's checks, then
read back through every generic path a client uses: get, list (with label
and field selectors, limits, Tables), scale, watch, delete and
deletecollection.  Each must answer, and the poisoned objects must stay
deletable.
"""

from __future__ import annotations

import json

import pytest
import trio

from fleet.api import meta
from fleet.testing.apiserver import open_api

NS = "default"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"

POISON = [
    # (group, plural, kind, apiVersion, fields besides metadata.name)
    ("", "pods", "Pod", "v1", {"status": 5}),
    ("", "pods", "Pod", "v1", {"spec": "x", "metadata": {"labels": 5, "annotations": [1]}}),
    ("", "pods", "Pod", "v1", {"spec": {"containers": 5, "nodeName": {"a": 1}}, "status": {"phase": [1]}}),
    ("", "pods", "Pod", "v1", {"metadata": {"ownerReferences": [{"kind": "", "name": 5}], "finalizers": 7}}),
    ("", "configmaps", "ConfigMap", "v1", {"data": 5, "metadata": {"labels": {"app": 5}}}),
    ("apps", "deployments", "Deployment", "apps/v1", {"spec": {"replicas": "abc", "template": 7,
                                                                "selector": 5}, "status": "x"}),
    ("apps", "replicasets", "ReplicaSet", "apps/v1", {"spec": 5}),
    ("", "services", "Service", "v1", {"spec": {"ports": 5, "selector": [1]}}),
    ("batch", "jobs", "Job", "batch/v1", {"spec": {"template": "t"}, "status": {"conditions": 5}}),
]

READS = [
    "", "?labelSelector=app%3Dx", "?labelSelector=app", "?labelSelector=app%20in%20(x,y)",
    "?labelSelector=!app", "?fieldSelector=metadata.name%3Dp0", "?fieldSelector=status.phase%3DRunning",
    "?fieldSelector=spec.nodeName%3Dn", "?limit=1", "?resourceVersion=0",
]


def _path(group: str, plural: str, name: str | None = None, ns: str = NS) -> str:
    base = f"/api/v1/namespaces/{ns}/{plural}" if not group else f"/apis/{group}/v1/namespaces/{ns}/{plural}"
    return base if name is None else f"{base}/{name}"


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        for i, (group, plural, kind, api_version, extra) in enumerate(POISON):
            md = {"name": f"p{i}", "namespace": NS, **(extra.get("metadata") or {})}
            obj = {"apiVersion": api_version, "kind": kind, **{k: v for k, v in extra.items() if k != "metadata"},
                   "metadata": md}
            await a.store.create(meta.store_key(group, plural, NS, md["name"]), obj)
        yield a


@pytest.mark.parametrize("query", READS)
async def test_lists_and_tables_answer(api, query: str) -> None:
    for group, plural in sorted({(g, p) for g, p, *_ in POISON}):
        for accept in ("application/json", TABLE):
            resp = await api.call("GET", _path(group, plural) + query.split("?")[0],
                                  query=dict(q.split("=", 1) for q in query[1:].split("&")) if query else None,
                                  headers={"accept": accept})
            assert resp.status < 500, (plural, query, accept, resp.body[:400])
            if resp.status == 200:
                json.loads(resp.body)


async def test_gets_scale_and_cluster_wide_lists_answer(api) -> None:
    for i, (group, plural, *_rest) in enumerate(POISON):
        for accept in ("application/json", TABLE):
            resp = await api.call("GET", _path(group, plural, f"p{i}"), headers={"accept": accept})
            assert resp.status < 500, (plural, resp.body[:400])
        if plural in ("deployments", "replicasets"):
            resp = await api.call("GET", _path(group, plural, f"p{i}") + "/scale")
            assert resp.status < 500, resp.body[:400]
    for path in ("/api/v1/pods", "/apis/apps/v1/deployments", "/api/v1/configmaps"):
        for q in ({}, {"labelSelector": "app=x"}, {"fieldSelector": "metadata.namespace=default"}):
            resp = await api.call("GET", path, query=q, headers={"accept": TABLE})
            assert resp.status < 500, (path, q, resp.body[:400])


async def test_watches_with_selectors_answer(api) -> None:
    for q in ({"labelSelector": "app=x"}, {"fieldSelector": "status.phase=Running"}, {}):
        with trio.move_on_after(5):
            resp = await api.call("GET", _path("", "pods"), query={"watch": "1", "resourceVersion": "1",
                                                                    "timeoutSeconds": "1", **q})
            assert resp.status < 500
            if not isinstance(resp.body, bytes):
                async for chunk in resp.body:
                    for line in chunk.splitlines():
                        json.loads(line)
                await resp.body.aclose()  # type: ignore[attr-defined]


async def test_poisoned_objects_can_be_deleted(api) -> None:
    code, _ = await api.json("DELETE", "/api/v1/namespaces/default/pods", query={"labelSelector": "app=x"})
    assert code < 500
    for i, (group, plural, *_rest) in enumerate(POISON):
        resp = await api.call("DELETE", _path(group, plural, f"p{i}"), query={"gracePeriodSeconds": "0"})
        assert resp.status in (200, 202), (plural, resp.body[:400])
        body = json.loads(resp.body)
        if body.get("metadata", {}).get("finalizers"):
            continue  # a finalizer of its own keeps it; that is not the API's to remove
        for _ in range(50):
            if (await api.call("GET", _path(group, plural, f"p{i}"))).status == 404:
                break
            await trio.sleep(0.05)
        else:
            raise AssertionError(f"{plural}/p{i} was not deleted")
