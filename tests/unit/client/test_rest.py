"""The async client against an in-memory fake API (httpx.MockTransport)."""

from __future__ import annotations

import json

import httpx
import pytest

from fleet.client import ApiException

from .fakeapi import FakeAPI, status


async def test_crud_paths_headers_and_params() -> None:
    api = FakeAPI()
    async with api.client() as c:
        created = await c.create("v1", "configmaps",
                                 {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "cm"}, "data": {"a": "1"}},
                                 "ns1", params={"fieldManager": "me", "dryRun": None})
        assert created["metadata"]["uid"] == "uid-cm"
        got = await c.get_object("v1", "configmaps", "cm", "ns1")
        assert got["data"] == {"a": "1"}
        listed = await c.list("v1", "configmaps", "ns1", label_selector="a=b", limit=10)
        assert [o["metadata"]["name"] for o in listed["items"]] == ["cm"]
        patched = await c.patch("v1", "configmaps", "cm", {"data": {"b": "2"}},
                                namespace="ns1")
        assert patched["data"] == {"a": "1", "b": "2"}
        await c.delete("v1", "configmaps", "cm", "ns1",
                       body={"propagationPolicy": "Foreground"})
    post, get, lst, patch, delete = api.requests
    assert post.method == "POST" and post.url.path == "/api/v1/namespaces/ns1/configmaps"
    assert post.url.params["fieldManager"] == "me" and "dryRun" not in post.url.params
    assert post.headers["authorization"] == "Bearer secret"
    assert get.url.path == "/api/v1/namespaces/ns1/configmaps/cm"
    assert lst.url.params["labelSelector"] == "a=b" and lst.url.params["limit"] == "10"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert json.loads(delete.content) == {"propagationPolicy": "Foreground"}


async def test_errors_carry_status() -> None:
    api = FakeAPI()
    async with api.client() as c:
        with pytest.raises(ApiException) as info:
            await c.get_object("v1", "pods", "nope", "default")
        assert info.value.code == 404 and info.value.reason == "NotFound"
        assert str(info.value) == "/api/v1/namespaces/default/pods/nope not found"
        assert info.value.status["kind"] == "Status"

        api.fail_next("GET", "/api/v1/namespaces/default/pods/x",
                      httpx.Response(503, text="upstream down"))
        with pytest.raises(ApiException) as info:
            await c.get_object("v1", "pods", "x", "default")
        assert (info.value.code, info.value.reason) == (503, "ServiceUnavailable")
        assert str(info.value) == "upstream down"


async def test_discover_is_cached_and_resolves() -> None:
    api = FakeAPI()
    async with api.client() as c:
        res = await c.resolve("deploy")
        assert (res.group, res.name) == ("apps", "deployments")
        n = len(api.requests)
        assert (await c.resolve("po")).name == "pods"
        assert len(api.requests) == n  # cached
        widgets = [r for r in await c.discover() if r.name == "widgets"]
        assert [(r.version, r.preferred) for r in widgets] == [("v1", False), ("v2", True)]
        kind = await c.resource_for_kind("example.com/v1", "Widget")
        assert kind.version == "v1"
        with pytest.raises(ApiException, match='no matches for kind "Nope"'):
            await c.resource_for_kind("v1", "Nope")
        await c.discover(refresh=True)
        assert len(api.requests) > n


def lines(*events: dict) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def ev(kind: str, name: str, rv: str) -> dict:
    return {"type": kind, "object": {"kind": "Pod", "metadata": {"name": name,
                                                                 "resourceVersion": rv}}}


async def test_watch_reconnects_from_last_resource_version() -> None:
    api = FakeAPI()
    path = "/api/v1/namespaces/default/pods"
    api.fail_next("GET", path, httpx.Response(200, content=lines(ev("ADDED", "a", "5"))))
    api.fail_next("GET", path, httpx.Response(200, content=lines(
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}})))
    api.fail_next("GET", path, httpx.Response(200, content=lines(
        ev("MODIFIED", "a", "11"), ev("DELETED", "a", "12"))))
    api.fail_next("GET", path, httpx.Response(200, content=lines(
        {"type": "ERROR", "object": status(410, "Expired", "too old resource version")})))
    seen = []
    async with api.client() as c:
        with pytest.raises(ApiException) as info:
            async for event in c.watch("v1", "pods", "default", resource_version="3",
                                       label_selector="app=x"):
                seen.append((event["type"], event["object"]["metadata"]["resourceVersion"]))
    assert info.value.code == 410 and info.value.reason == "Expired"
    assert seen == [("ADDED", "5"), ("MODIFIED", "11"), ("DELETED", "12")]
    rvs = [r.url.params["resourceVersion"] for r in api.requests]
    assert rvs == ["3", "5", "9", "12"]
    assert all(r.url.params["watch"] == "1" for r in api.requests)
    assert all(r.url.params["labelSelector"] == "app=x" for r in api.requests)


async def test_watch_without_reconnect_ends_and_bookmarks_optional() -> None:
    api = FakeAPI()
    path = "/api/v1/pods"
    api.fail_next("GET", path, httpx.Response(200, content=lines(
        ev("ADDED", "a", "5"),
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}})))
    async with api.client() as c:
        got = [e["type"] async for e in c.watch("v1", "pods", reconnect=False, bookmarks=True)]
    assert got == ["ADDED", "BOOKMARK"]
    assert "resourceVersion" not in api.requests[0].url.params


async def test_watch_http_error_raises() -> None:
    api = FakeAPI()
    api.fail_next("GET", "/api/v1/pods",
                  httpx.Response(403, json=status(403, "Forbidden", "pods is forbidden")))
    async with api.client() as c:
        with pytest.raises(ApiException, match="pods is forbidden"):
            async for _ in c.watch("v1", "pods"):
                pass


async def test_list_all_follows_continue() -> None:
    api = FakeAPI()
    path = "/api/v1/namespaces/default/configmaps"
    api.fail_next("GET", path, httpx.Response(200, json={
        "kind": "ConfigMapList", "metadata": {"continue": "t1", "resourceVersion": "7"},
        "items": [{"metadata": {"name": "a"}}]}))
    api.fail_next("GET", path, httpx.Response(200, json={
        "kind": "ConfigMapList", "metadata": {"resourceVersion": "7"},
        "items": [{"metadata": {"name": "b"}}]}))
    async with api.client() as c:
        out = await c.list_all("v1", "configmaps", "default", page_size=1)
    assert [i["metadata"]["name"] for i in out["items"]] == ["a", "b"]
    assert "continue" not in out["metadata"]
    assert api.requests[1].url.params["continue"] == "t1"
