"""List and watch query parameters a client forged or mangled: answered as
kube-apiserver answers them (400 / 410 / 422 / 504), never a 500."""

from __future__ import annotations

import base64
import json

import pytest

from fleet.server.request_params import decode_continue, encode_continue
from fleet.testing.apiserver import open_api

CM = "/api/v1/namespaces/default/configmaps"
SECRETS = "/api/v1/namespaces/default/secrets"


def cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


def token(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        for n in ("a", "b", "c"):
            assert (await a.json("POST", CM, cm(n)))[0] == 201
        yield a


async def first_page(api) -> str:
    code, body = await api.json("GET", CM, query={"limit": "1"})
    assert code == 200 and body["metadata"]["continue"]
    return body["metadata"]["continue"]


@pytest.mark.parametrize("tok", [
    "not-a-token!!",
    "e30",  # {}
    token([1, 2]),
    token("x"),
    token({"v": "meta.k8s.io/v1", "rv": 5, "start": "a"}),  # a real Kubernetes token: foreign
    token({"v": "fleet/1", "rv": 0, "start": "/core/configmaps/default/a"}),
    token({"v": "fleet/1", "rv": -3, "start": "/core/configmaps/default/a"}),
    token({"v": "fleet/1", "rv": 2**63, "start": "/core/configmaps/default/a"}),  # was a 500 (int64 bind)
    token({"v": "fleet/1", "rv": 2**70, "start": "/core/configmaps/default/a"}),
    token({"v": "fleet/1", "rv": "7", "start": "/core/configmaps/default/a"}),
    token({"v": "fleet/1", "rv": True, "start": "/core/configmaps/default/a"}),
    token({"v": "fleet/1", "rv": 7, "start": ""}),
    token({"v": "fleet/1", "rv": 7, "start": ["x"]}),
    token({"v": "fleet/1", "rv": 7, "start": "/core/secrets/default/a"}),  # another kind's list
    token({"v": "fleet/1", "rv": 7, "start": "/core/configmaps/other/a"}),  # another namespace
    token({"v": "fleet/1", "rv": 7, "start": "/core/configmaps/default/"}),  # the prefix itself
    token({"v": "fleet/1", "rv": 10**12, "start": "/core/configmaps/default/a"}),  # a future revision
    base64.urlsafe_b64encode(b"[" * 5000).decode(),  # deeply nested JSON: RecursionError
])
async def test_forged_continue_is_bad_request(api, tok):
    code, body = await api.json("GET", CM, query={"limit": "1", "continue": tok})
    assert code == 400, body
    assert body["reason"] == "BadRequest" and body["message"].startswith("continue key is not valid")


async def test_continue_of_another_list_is_refused(api):
    tok = await first_page(api)
    code, body = await api.json("GET", SECRETS, query={"limit": "1", "continue": tok})
    assert code == 400 and body["message"].startswith("continue key is not valid")
    code, body = await api.json("GET", "/api/v1/namespaces/kube-system/configmaps",
                                query={"limit": "1", "continue": tok})
    assert code == 400
    # ... while the list it came from goes on.
    code, body = await api.json("GET", CM, query={"limit": "5", "continue": tok})
    assert code == 200 and [i["metadata"]["name"] for i in body["items"]] == ["b", "c"]


async def test_continue_at_a_compacted_revision_is_gone(api):
    tok = await first_page(api)
    for i in range(5):
        await api.json("POST", CM, cm(f"z{i}"))
    await api.store.compact(api.store.current_revision())
    code, body = await api.json("GET", CM, query={"limit": "1", "continue": tok})
    assert code == 410 and body["reason"] == "Expired"


async def test_continue_with_resource_version_is_bad_request(api):
    tok = await first_page(api)
    code, body = await api.json("GET", CM, query={"continue": tok, "resourceVersion": "5"})
    assert code == 400 and "not allowed when using continue" in body["message"]
    code, body = await api.json("GET", CM, query={"continue": tok, "resourceVersion": "0"})
    assert code == 200


@pytest.mark.parametrize("limit", [
    "x", "1.5", " 1", "1_0", "٣", "9223372036854775808", str(2**64), "9" * 5000, "-1",
])
async def test_bad_limit_is_bad_request(api, limit):
    code, body = await api.json("GET", CM, query={"limit": limit})
    assert code == 400 and body["reason"] == "BadRequest", body


async def test_largest_limit_lists_everything(api):
    code, body = await api.json("GET", CM, query={"limit": str(2**63 - 1)})
    assert code == 200 and len(body["items"]) == 3 and "continue" not in body["metadata"]


@pytest.mark.parametrize("query,code", [
    ({"resourceVersion": "abc"}, 400),
    ({"resourceVersion": "1e3"}, 400),
    ({"resourceVersion": str(2**64)}, 400),
    ({"resourceVersion": "9" * 5000}, 400),
    ({"resourceVersion": "-1"}, 400),
    ({"resourceVersion": str(2**64), "resourceVersionMatch": "Exact"}, 400),
    ({"resourceVersion": "5", "resourceVersionMatch": "Sometimes"}, 422),
    ({"resourceVersionMatch": "Exact"}, 422),
    ({"resourceVersion": "0", "resourceVersionMatch": "Exact"}, 422),
])
async def test_bad_resource_version(api, query, code):
    got, body = await api.json("GET", CM, query=query)
    assert got == code, body
    assert body["kind"] == "Status"


async def test_future_resource_version_is_too_large(api):
    future = str(api.store.current_revision() + 1000)
    code, body = await api.json("GET", CM, query={"resourceVersion": future, "resourceVersionMatch": "Exact"})
    assert code == 504 and body["reason"] == "Timeout"
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
    code, body = await api.json("GET", CM, query={"resourceVersion": str(2**63 - 1),
                                                  "resourceVersionMatch": "NotOlderThan"})
    assert code == 504 and body["message"].startswith("Too large resource version")


async def test_exact_resource_version_lists_then(api):
    rv = api.store.current_revision()
    await api.json("POST", CM, cm("d"))
    code, body = await api.json("GET", CM, query={"resourceVersion": str(rv), "resourceVersionMatch": "Exact"})
    assert code == 200 and len(body["items"]) == 3 and body["metadata"]["resourceVersion"] == str(rv)


@pytest.mark.parametrize("query", [
    {"timeoutSeconds": "nan"},
    {"timeoutSeconds": "inf"},
    {"timeoutSeconds": "1.5"},
    {"timeoutSeconds": str(2**63)},
    {"timeoutSeconds": "9" * 5000},
    {"resourceVersion": "abc"},
    {"resourceVersion": str(2**64)},
    {"resourceVersionMatch": "Exact", "sendInitialEvents": "true", "allowWatchBookmarks": "true"},
])
async def test_bad_watch_parameters(api, query):
    code, body = await api.json("GET", CM, query={"watch": "1", **query})
    assert code in (400, 422) and body["kind"] == "Status", body


def test_continue_round_trip_under_prefix():
    tok = encode_continue(42, "/core/pods/default/p-7")
    assert decode_continue(tok, "/core/pods/default/") == (42, "/core/pods/default/p-7")
    assert decode_continue(tok, "/core/pods/") == (42, "/core/pods/default/p-7")  # all namespaces
