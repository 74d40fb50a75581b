"""Client-side apply: create with last-applied, three-way patches, conflicts."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fleet.client.apply import LAST_APPLIED, ApplyFailed, apply_object, last_applied_json

from .fakeapi import FakeAPI, status

DEPLOY_PATH = "/apis/apps/v1/namespaces/team/deployments/web"


def deployment(image: str = "nginx:1", replicas: int = 2, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web", **labels}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": image}]}}},
    }


def test_last_applied_json_drops_itself_and_is_compact() -> None:
    obj = {"kind": "ConfigMap", "apiVersion": "v1",
           "metadata": {"name": "x", "annotations": {LAST_APPLIED: "old"}}}
    assert last_applied_json(obj) == (
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"annotations":{},"name":"x"}}\n')


async def test_create_then_configure_then_unchanged() -> None:
    api = FakeAPI()
    async with api.client() as c:
        r1 = await apply_object(c, deployment(), "team")
        assert r1.action == "created" and r1.describe() == "deployment.apps/web created"
        post = api.requests[-1]
        assert post.method == "POST"
        assert post.url.params["fieldManager"] == "kubectl-client-side-apply"
        assert post.url.params["fieldValidation"] == "Strict"
        sent = json.loads(post.content)
        assert sent["metadata"]["namespace"] == "team"
        remembered = json.loads(sent["metadata"]["annotations"][LAST_APPLIED])
        assert remembered["spec"]["replicas"] == 2
        assert LAST_APPLIED not in remembered["metadata"]["annotations"]

        # someone else (a controller) adds a label and status; apply must keep them
        api.objects[DEPLOY_PATH]["metadata"]["labels"]["owner"] = "ctl"
        api.objects[DEPLOY_PATH]["status"] = {"replicas": 2}

        r2 = await apply_object(c, deployment(image="nginx:2", replicas=3), "team")
        assert r2.action == "configured"
        patch_req = api.requests[-1]
        assert patch_req.method == "PATCH"
        assert patch_req.headers["content-type"] == "application/strategic-merge-patch+json"
        patch = json.loads(patch_req.content)
        assert patch["spec"]["replicas"] == 3
        assert LAST_APPLIED in patch["metadata"]["annotations"]
        live = api.objects[DEPLOY_PATH]
        assert live["spec"]["template"]["spec"]["containers"] == [
            {"name": "web", "image": "nginx:2"}]
        assert live["metadata"]["labels"] == {"app": "web", "owner": "ctl"}
        assert live["status"] == {"replicas": 2}

        n = len(api.requests)
        r3 = await apply_object(c, deployment(image="nginx:2", replicas=3), "team")
        assert r3.action == "unchanged"
        assert [r.method for r in api.requests[n:]] == ["GET"]


async def test_removed_field_is_deleted_but_foreign_fields_stay() -> None:
    api = FakeAPI()
    async with api.client() as c:
        await apply_object(c, deployment(tier="fe"), "team")
        api.objects[DEPLOY_PATH]["metadata"]["labels"]["owner"] = "ctl"
        await apply_object(c, deployment(), "team")
    assert api.objects[DEPLOY_PATH]["metadata"]["labels"] == {"app": "web", "owner": "ctl"}


async def test_conflict_is_retried() -> None:
    api = FakeAPI()
    async with api.client() as c:
        await apply_object(c, deployment(), "team")
        api.fail_next("PATCH", DEPLOY_PATH,
                      httpx.Response(409, json=status(409, "Conflict", "modified")))
        result = await apply_object(c, deployment(replicas=5), "team")
    assert result.action == "configured"
    assert api.objects[DEPLOY_PATH]["spec"]["replicas"] == 5
    assert [r.method for r in api.requests[-4:]] == ["GET", "PATCH", "GET", "PATCH"]


async def test_custom_resources_get_merge_patch_and_cluster_scope_drops_namespace() -> None:
    api = FakeAPI()
    widget = {"apiVersion": "example.com/v2", "kind": "Widget",
              "metadata": {"name": "w"}, "spec": {"size": 1, "tags": ["a"]}}
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team",
                                                                  "namespace": "ignored"}}
    async with api.client() as c:
        await apply_object(c, widget, "default")
        await apply_object(c, {**widget, "spec": {"size": 2}}, "default")
        assert api.requests[-1].headers["content-type"] == "application/merge-patch+json"
        assert json.loads(api.requests[-1].content)["spec"] == {"size": 2, "tags": None}
        res = await apply_object(c, ns, "default")
    assert res.namespace is None
    assert api.requests[-1].url.path == "/api/v1/namespaces"
    assert "namespace" not in json.loads(api.requests[-1].content)["metadata"]


async def test_server_refusal_says_which_operation() -> None:
    api = FakeAPI()
    api.fail_next("POST", "/apis/apps/v1/namespaces/team/deployments",
                  httpx.Response(422, json=status(422, "Invalid", "spec.replicas: bad")))
    async with api.client() as c:
        with pytest.raises(ApplyFailed) as info:
            await apply_object(c, deployment(), "team")
    assert info.value.operation == "creating"
    assert info.value.error.reason == "Invalid"
