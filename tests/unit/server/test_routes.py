"""Path parsing of the generic REST layer (table-driven)."""

import pytest

from fleet.server.request_params import decode_continue, encode_continue
from fleet.server.routes import Route, parse_route


@pytest.mark.parametrize("path,expected", [
    ("/api/v1/pods", Route("", "v1", "pods")),
    ("/api/v1/namespaces", Route("", "v1", "namespaces")),
    ("/api/v1/namespaces/default", Route("", "v1", "namespaces", None, "default")),
    ("/api/v1/namespaces/x/status", Route("", "v1", "namespaces", None, "x", "status")),
    ("/api/v1/namespaces/x/finalize", Route("", "v1", "namespaces", None, "x", "finalize")),
    ("/api/v1/namespaces/default/pods", Route("", "v1", "pods", "default")),
    ("/api/v1/namespaces/default/pods/p1", Route("", "v1", "pods", "default", "p1")),
    ("/api/v1/namespaces/default/pods/p1/status", Route("", "v1", "pods", "default", "p1", "status")),
    ("/apis/apps/v1/namespaces/d/deployments/web/scale", Route("apps", "v1", "deployments", "d", "web", "scale")),
    ("/apis/apps/v1/deployments", Route("apps", "v1", "deployments")),
    ("/api/v1/nodes/n1", Route("", "v1", "nodes", None, "n1")),
    ("/api/v1/watch/pods", Route("", "v1", "pods", None, None, "", True)),
    ("/api/v1/watch/namespaces/default/pods", Route("", "v1", "pods", "default", None, "", True)),
    ("/api", None),
    ("/apis/apps", None),
    ("/api/v1/namespaces/default/pods/p1/status/extra", None),
    ("/other/v1/pods", None),
])
def test_parse_route(path, expected):
    assert parse_route([s for s in path.split("/") if s]) == expected


def test_continue_token_round_trip():
    tok = encode_continue(42, "/core/pods/default/p-7")
    assert decode_continue(tok) == (42, "/core/pods/default/p-7")


def test_continue_token_garbage_is_bad_request():
    from fleet.api.errors import BadRequest

    with pytest.raises(BadRequest):
        decode_continue("not-a-token!!")


@pytest.mark.parametrize("method,path,query,expected", [
    ("GET", "/api/v1/namespaces/d/configmaps/x", {}, ("get", "configmaps")),
    ("GET", "/api/v1/namespaces/d/configmaps", {}, ("list", "configmaps")),
    ("GET", "/api/v1/namespaces/d/configmaps", {"watch": "1"}, ("watch", "configmaps")),
    ("POST", "/api/v1/namespaces/d/configmaps", {}, ("create", "configmaps")),
    ("PATCH", "/apis/apps/v1/namespaces/d/deployments/w/scale", {}, ("patch", "deployments/scale")),
    ("DELETE", "/api/v1/namespaces/d/pods", {}, ("deletecollection", "pods")),
    ("GET", "/api/v1/watch/pods", {}, ("watch", "pods")),
    ("GET", "/version", {}, ("get", "version")),
])
def test_request_labels(method, path, query, expected):
    from fleet.server.http import Req
    from fleet.server.requestinfo import request_labels

    assert request_labels(Req(method, path, query, {})) == expected
