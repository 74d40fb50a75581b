"""root-ca-cert-publisher: the pure plan, then the loop over a fake API.

The fake API stores ConfigMaps and feeds the informers the events its writes cause,
as a server's watch would; tests delete or tamper with the ConfigMap and rotate the
bundle to see the controller put it back.  Real (short) time, not a MockClock: the
bundle is read in a worker thread, which an autojumping clock does not wait for.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import trio

from fleet.client import ApiException
from fleet.controllers.manager import default_controllers
from fleet.controllers.rootcacertpublisher import (
    CONFIGMAP_NAME,
    DESCRIPTION,
    DESCRIPTION_ANNOTATION,
    RootCACertPublisher,
    RootCAPublisherConfig,
    plan,
)
from fleet.controllers.runtime import Context, InformerFactory

CA1 = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n"
CA2 = CA1 + "-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----\n"


async def eventually(check: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.01)


def ns(name: str = "team", *, terminating: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
                           "status": {"phase": "Terminating" if terminating else "Active"}}
    return obj


def cm(namespace: str = "team", data: dict[str, str] | None = None,
       annotations: dict[str, str] | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": CONFIGMAP_NAME, "namespace": namespace, "resourceVersion": "7"}
    if annotations is not None:
        md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "data": data or {"ca.crt": CA1}}


# -- plan ----------------------------------------------------------------------------------


def test_plan_creates_with_kubes_shape():
    action = plan(ns(), None, CA1)
    assert action.verb == "create"
    assert action.body == {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "kube-root-ca.crt", "namespace": "team",
                                        "annotations": {"kubernetes.io/description": DESCRIPTION}},
                           "data": {"ca.crt": CA1}}
    assert DESCRIPTION.startswith("Contains a CA bundle that can be used to verify the kube-apiserver")


@pytest.mark.parametrize("namespace, configmap, ca, want", [
    (ns(), cm(annotations={DESCRIPTION_ANNOTATION: DESCRIPTION}), CA1, ""),
    (ns(), cm(annotations={DESCRIPTION_ANNOTATION: DESCRIPTION}), CA2, "update"),
    (ns(), cm(), CA1, "update"),  # the description annotation is missing
    (ns(), cm(data={"ca.crt": CA1, "extra": "x"}, annotations={DESCRIPTION_ANNOTATION: "d"}), CA1, "update"),
    (ns(terminating=True), None, CA1, ""),
    (None, None, CA1, ""),
    (ns(), None, "", ""),  # nothing to publish
])
def test_plan_table(namespace, configmap, ca, want):
    assert plan(namespace, configmap, ca).verb == want


def test_plan_update_keeps_other_metadata_and_sets_exact_data():
    old = cm(data={"ca.crt": "old", "junk": "x"}, annotations={"owner": "me"})
    old["metadata"]["labels"] = {"a": "b"}
    action = plan(ns(), old, CA2)
    assert action.verb == "update" and action.body is not None
    assert action.body["data"] == {"ca.crt": CA2}
    assert action.body["metadata"]["annotations"] == {"owner": "me", DESCRIPTION_ANNOTATION: DESCRIPTION}
    assert action.body["metadata"]["labels"] == {"a": "b"}
    assert action.body["metadata"]["resourceVersion"] == "7"  # optimistic concurrency
    assert old["data"] == {"ca.crt": "old", "junk": "x"}  # the cache's copy untouched


def test_in_the_default_controllers():
    assert "root-ca-cert-publisher" in [c.name for c in default_controllers()]


# -- the loop --------------------------------------------------------------------------------


class FakeAPI:
    def __init__(self) -> None:
        self.configmaps: dict[str, dict[str, Any]] = {}
        self.informers: dict[str, Any] = {}
        self.rv = itertools.count(10)
        self.writes: list[tuple[str, str]] = []

    def emit(self, plural: str, etype: str, obj: dict[str, Any]) -> None:
        self.informers[plural]._apply(etype, copy.deepcopy(obj))

    async def list(self, api_version: str, plural: str, namespace: str | None = None, **kw: Any) -> Any:
        raise AssertionError("informers are fed by the test")

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        assert plural == "configmaps"
        if namespace in self.configmaps:
            raise ApiException({"reason": "AlreadyExists", "message": "exists"}, 409)
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self.configmaps[namespace or ""] = obj
        self.writes.append(("create", namespace or ""))
        self.emit("configmaps", "ADDED", obj)
        return obj

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        cur = self.configmaps.get(namespace or "")
        if cur is None:
            raise ApiException({"reason": "NotFound", "message": "not found"}, 404)
        if cur["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiException({"reason": "Conflict", "message": "conflict"}, 409)
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self.configmaps[namespace or ""] = obj
        self.writes.append(("update", namespace or ""))
        self.emit("configmaps", "MODIFIED", obj)
        return obj

    # What someone else does.
    def delete(self, namespace: str) -> None:
        obj = self.configmaps.pop(namespace)
        self.emit("configmaps", "DELETED", obj)

    def tamper(self, namespace: str, data: dict[str, str]) -> None:
        obj = copy.deepcopy(self.configmaps[namespace])
        obj["data"] = data
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self.configmaps[namespace] = obj
        self.emit("configmaps", "MODIFIED", obj)


async def test_publishes_repairs_and_follows_rotation() -> None:
    bundle = {"pem": CA1.encode()}
    api = FakeAPI()
    ctl = RootCACertPublisher(RootCAPublisherConfig(ca_bundle=lambda: bundle["pem"], poll_interval=0.2))
    ctl.setup(Context(client=api, informers=InformerFactory(api)))  # type: ignore[arg-type]
    api.informers = {"namespaces": ctl.namespaces, "configmaps": ctl.configmaps}
    for inf in api.informers.values():
        inf.synced.set()
    async with trio.open_nursery() as n:
        n.start_soon(ctl.run, ctl.ctx)
        for name in ("default", "team"):
            api.emit("namespaces", "ADDED", ns(name))
        api.emit("namespaces", "ADDED", ns("going", terminating=True))
        await eventually(lambda: sorted(api.configmaps) == ["default", "team"])
        assert all(c["data"] == {"ca.crt": CA1} for c in api.configmaps.values())
        assert api.configmaps["team"]["metadata"]["annotations"] == {DESCRIPTION_ANNOTATION: DESCRIPTION}

        # Deleted → re-created; changed by someone → put back.
        api.delete("team")
        await eventually(lambda: "team" in api.configmaps)
        assert api.configmaps["team"]["data"] == {"ca.crt": CA1}
        api.tamper("default", {"ca.crt": "forged"})
        await eventually(lambda: api.configmaps["default"]["data"] == {"ca.crt": CA1})

        # Nothing changes → no writes.
        before = len(api.writes)
        await trio.sleep(0.7)  # a few polls of the same bundle
        assert len(api.writes) == before

        # The bundle rotates (old + new CA) → every namespace updated at the next poll.
        bundle["pem"] = CA2.encode()
        await eventually(lambda: all(c["data"] == {"ca.crt": CA2} for c in api.configmaps.values()))
        assert sorted(api.writes[before:]) == [("update", "default"), ("update", "team")]
        n.cancel_scope.cancel()


async def test_without_a_bundle_publishes_nothing() -> None:
    api = FakeAPI()
    ctl = RootCACertPublisher(RootCAPublisherConfig(ca_bundle=None))
    ctl.setup(Context(client=api, informers=InformerFactory(api)))  # type: ignore[arg-type]
    api.informers = {"namespaces": ctl.namespaces, "configmaps": ctl.configmaps}
    async with trio.open_nursery() as n:
        n.start_soon(ctl.run, ctl.ctx)
        api.emit("namespaces", "ADDED", ns("team"))
        await trio.sleep(0.3)
        assert api.configmaps == {} and ctl.queue.metrics.processed >= 1
        n.cancel_scope.cancel()


def test_server_ca_bundle_reads_the_pki_file_else_the_fallback(tmp_path: Any) -> None:
    from fleet.server.run import server_ca_bundle

    assert server_ca_bundle(tmp_path, b"from-client") == b"from-client"
    assert server_ca_bundle(tmp_path, None) == b""
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "ca.crt").write_text(CA2)  # old + new CA during a rotation
    assert server_ca_bundle(tmp_path, b"from-client") == CA2.encode()
