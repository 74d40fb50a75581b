"""Request paths: split on the raw path, then decoded per segment (fleet/server/paths.py).

Splitting the already-decoded path let `.../configmaps/%2F` address the whole
collection (a DELETE emptied the namespace) and collapsed `//`.
"""

from __future__ import annotations

import pytest

from fleet.api.errors import BadRequest
from fleet.server.http import Req, split_raw_path
from fleet.server.paths import node_proxy_route, resource_route, route_segments
from fleet.server.routes import Route
from fleet.testing.apiserver import open_api

CM = "/api/v1/namespaces/default/configmaps"


@pytest.mark.parametrize("raw,expected", [
    ("/", [""]),
    ("/api", ["api"]),
    ("/api/", ["api", ""]),
    ("/api//v1", ["api", "", "v1"]),
    ("/api/v1/namespaces/default/configmaps/%2F", ["api", "v1", "namespaces", "default", "configmaps", "/"]),
    ("/a/b%2Fc/d", ["a", "b/c", "d"]),
    ("/a/%2e%2E", ["a", ".."]),
    ("/a/caf%C3%A9", ["a", "café"]),
    ("/a/%25", ["a", "%"]),
    ("/a/%FF", ["a", "\ufffd"]),  # not UTF-8: a name no object can have
])
def test_split_raw_path(raw, expected):
    assert split_raw_path(raw) == expected
    assert split_raw_path(raw.encode()) == expected


@pytest.mark.parametrize("raw,expected", [
    ("/", []),
    ("/api/v1/pods/", ["api", "v1", "pods"]),  # one trailing slash is ignored
    ("/api/v1//pods", None),  # never collapsed
    ("//api/v1/pods", None),
    ("/api/v1/pods//", None),
])
def test_route_segments(raw, expected):
    assert route_segments(split_raw_path(raw)) == expected


@pytest.mark.parametrize("raw,expected", [
    (CM, Route("", "v1", "configmaps", "default")),
    (CM + "/", Route("", "v1", "configmaps", "default")),
    (CM + "/a", Route("", "v1", "configmaps", "default", "a")),
    (CM + "/a%2Db", Route("", "v1", "configmaps", "default", "a-b")),  # an encoded but valid name
    (CM + "//", None),
    (CM + "//x", None),
    ("/api/v1/namespaces//configmaps", None),
])
def test_resource_route(raw, expected):
    assert resource_route(route_segments(split_raw_path(raw))) == expected


@pytest.mark.parametrize("raw,message", [
    (CM + "/%2F", """invalid resource name "/": [may not contain '/']"""),
    (CM + "/a%2Fb", """invalid resource name "a/b": [may not contain '/']"""),
    (CM + "/.", "invalid resource name \".\": [may not be '.']"),
    (CM + "/..", "invalid resource name \"..\": [may not be '..']"),
    (CM + "/%2E%2E", "invalid resource name \"..\": [may not be '..']"),
    (CM + "/a%25b", """invalid resource name "a%b": [may not contain '%']"""),
    (CM + "/%2F%25", """invalid resource name "/%": [may not contain '/' may not contain '%']"""),
    (CM + "/%2F/status", """invalid resource name "/": [may not contain '/']"""),
    ("/api/v1/namespaces/%2F/configmaps", """invalid namespace name "/": [may not contain '/']"""),
    ("/api/v1/namespaces/..", "invalid resource name \"..\": [may not be '..']"),
])
def test_impossible_names_are_bad_requests(raw, message):
    with pytest.raises(BadRequest) as e:
        resource_route(route_segments(split_raw_path(raw)))
    assert e.value.status()["message"] == message


@pytest.mark.parametrize("raw,expected", [
    ("/api/v1/nodes/n1/proxy", ("n1", "/")),
    ("/api/v1/nodes/n1/proxy/", ("n1", "/")),
    ("/api/v1/nodes/n1/proxy/images/import", ("n1", "/images/import")),
    ("/api/v1/nodes/n1/proxy/a/b/", ("n1", "/a/b/")),
    ("/api/v1/nodes/n1/proxy/a//b", ("n1", "/a//b")),  # the tail is the agent's, as sent
    ("/api/v1/nodes/n1/proxy/a%20b", ("n1", "/a b")),  # decoded; the relay re-quotes it
    ("/api/v1/nodes/n1", None),
    ("/api/v1/nodes/n1/status", None),
    ("/api/v1/nodes/n1/proxyx", None),
    ("/api/v1/nodes//proxy", None),
    ("/api/v1/namespaces/default/pods/p/proxy", None),
])
def test_node_proxy_route(raw, expected):
    assert node_proxy_route(split_raw_path(raw)) == expected


def test_node_proxy_bad_node_name():
    with pytest.raises(BadRequest):
        node_proxy_route(split_raw_path("/api/v1/nodes/%2E%2E/proxy/x"))


def test_req_splits_its_path_when_built_without_segments():
    assert Req("GET", CM + "/%2F", {}, {}).segments[-1] == "/"
    assert Req("GET", "/x", {}, {}, segments=["y"]).segments == ["y"]


# ----------------------------------------------------------- through the pipeline
@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


def cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


async def test_delete_of_encoded_slash_deletes_nothing(api):
    for n in ("a", "b", "c"):
        code, _ = await api.json("POST", CM, cm(n))
        assert code == 201
    for path in (CM + "/%2F", CM + "/%2f", CM + "/..", CM + "/%2E"):
        code, body = await api.json("DELETE", path)
        assert code == 400 and body["reason"] == "BadRequest", (path, body)
    code, body = await api.json("DELETE", CM + "//")
    assert code == 404 and body["reason"] == "NotFound"
    code, body = await api.json("GET", CM)
    assert sorted(i["metadata"]["name"] for i in body["items"]) == ["a", "b", "c"]
    # A trailing slash still names the collection, an encoded valid name the object.
    code, body = await api.json("GET", CM + "/")
    assert code == 200 and len(body["items"]) == 3
    code, body = await api.json("GET", CM + "/%61")
    assert code == 200 and body["metadata"]["name"] == "a"


async def test_empty_segments_are_not_routes(api):
    for path in ("//api/v1/namespaces", "/api//v1/namespaces", "/api/v1//namespaces/default"):
        code, body = await api.json("GET", path)
        assert code == 404, (path, body)
    code, _ = await api.json("GET", "/version/")
    assert code == 200


def test_request_labels_never_raise():
    from fleet.server.requestinfo import request_labels

    assert request_labels(Req("DELETE", CM + "/%2F", {}, {})) == ("delete", "api")
    assert request_labels(Req("GET", "/api/v1/nodes/%2E%2E/proxy/x", {}, {}))[0] == "get"
