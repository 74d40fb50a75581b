"""The Node pieces of the security assembly (fleet/server/security.py) and the request
name a list/watch gets from `fieldSelector=metadata.name=...` (fleet/server/requestinfo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from fleet.api.registry import default_registry
from fleet.auth import ADMIN, Attributes, Credentials, UserInfo
from fleet.auth.node import NodeAuthorizer
from fleet.server.http import Req
from fleet.server.requestinfo import request_name
from fleet.server.routes import Route
from fleet.server.security import SecurityConfig, build
from fleet.store import open_store

NODE_A = UserInfo("system:node:a", groups=("system:nodes",))


async def test_node_mode_puts_the_node_authorizer_after_the_masters_bypass(tmp_path: Path) -> None:
    async with open_store(tmp_path / "fleet.db") as store:
        await store.create("/core/pods/default/p", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "a", "containers": [], "volumes": [{"name": "s", "secret": {"secretName": "s"}}]}})
        sec = await build(SecurityConfig(authorization_mode="Node"), data_dir=tmp_path, store=store,
                          registry=default_registry(), admin_token="admin-token")
        assert [type(a).__name__ for a in sec.authorizer.authorizers] == ["MastersBypass", "NodeAuthorizer"]  # type: ignore[attr-defined]
        graph_task = dict(sec.tasks)["node-authorizer-graph"]
        secret = Attributes("get", "", "v1", "secrets", "", "default", "s")
        async with trio.open_nursery() as n:
            await n.start(graph_task)  # started = the graph has listed pods, volumes, attachments
            assert sec.authorizer.authorize(NODE_A, secret).allowed
            d = sec.authorizer.authorize(UserInfo("system:node:b", groups=("system:nodes",)), secret)
            assert (d.allowed, d.reason) == (False, "no relationship found between node 'b' and this object")
            assert sec.authorizer.authorize(ADMIN, secret).allowed
            # Someone who is neither: denied, with no reason from the Node authorizer.
            d = sec.authorizer.authorize(UserInfo("alice"), secret)
            assert (d.allowed, d.reason) == (False, "")
            # The graph follows the store.
            await store.delete("/core/pods/default/p")
            with trio.fail_after(5):
                while sec.authorizer.authorize(NODE_A, secret).allowed:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()
        assert await sec.authenticator.authenticate(Credentials({"authorization": "Bearer admin-token"})) is not None


@pytest.mark.parametrize("mode", ["AlwaysAllow", "RBAC"])
async def test_no_node_authorizer_unless_asked(tmp_path: Path, mode: str) -> None:
    async with open_store(tmp_path / "fleet.db") as store:
        sec = await build(SecurityConfig(authorization_mode=mode), data_dir=tmp_path, store=store,
                          registry=default_registry(), admin_token="t")
        assert not any(isinstance(a, NodeAuthorizer) for a in getattr(sec.authorizer, "authorizers", []))
        assert "node-authorizer-graph" not in dict(sec.tasks)


def req(query: dict[str, str]) -> Req:
    return Req("GET", "/api/v1/namespaces/default/secrets", query, {})


@pytest.mark.parametrize(("route", "verb", "query", "name"), [
    (Route("", "v1", "secrets", "default", "x"), "get", {}, "x"),
    (Route("", "v1", "secrets", "default"), "list", {"fieldSelector": "metadata.name=x"}, "x"),
    (Route("", "v1", "secrets", "default"), "watch", {"fieldSelector": "metadata.name==x,type=Opaque"}, "x"),
    (Route("", "v1", "secrets", "default"), "list", {"fieldSelector": "metadata.name!=x"}, ""),
    (Route("", "v1", "secrets", "default"), "list", {"fieldSelector": "metadata.namespace=default"}, ""),
    (Route("", "v1", "secrets", "default"), "list", {"fieldSelector": "=broken"}, ""),
    (Route("", "v1", "secrets", "default"), "list", {"fieldSelector": "metadata.name=.."}, ""),
    (Route("", "v1", "secrets", "default"), "list", {}, ""),
    (Route("", "v1", "secrets", "default"), "deletecollection", {"fieldSelector": "metadata.name=x"}, ""),
])
def test_request_name(route: Route, verb: str, query: dict[str, str], name: str) -> None:
    assert request_name(route, verb, req(query)) == name
