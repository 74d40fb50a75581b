"""The garbage collector's workers against the real API pipeline, in process.

The collector's graph is fed from a store watch (what its list+watch monitors
see over HTTP) and its live reads and writes go through `APIServer.handle`, so
the REST delete path (deletion.py), the store's finalizer protocol and the
collector's decisions are exercised together without sockets.  Chains are
built from plain objects (ConfigMaps owning ConfigMaps, a PriorityClass owning
a namespaced object) so no other controller is involved.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from fleet.api.registry import default_registry
from fleet.client import ApiException, APIResource
from fleet.client.discovery import resource_path
from fleet.controllers.garbagecollector import GarbageCollector
from fleet.controllers.garbagecollector_graph import FOREGROUND_FINALIZER
from fleet.controllers.runtime import Context
from fleet.store import DELETED
from fleet.testing.apiserver import InProcessAPI, open_api

NS = "default"
CM = f"/api/v1/namespaces/{NS}/configmaps"
TIMEOUT = 20.0  # generous: the machine is shared


class InProcessClient:
    """The few `fleet.client.Client` calls the collector's workers make, over InProcessAPI."""

    def __init__(self, api: InProcessAPI) -> None:
        self.api = api

    async def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        code, out = await self.api.json(method, path, body, content_type=content_type)
        if code >= 400:
            raise ApiException(out, code)
        return out

    async def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                         **_: Any) -> dict[str, Any]:
        return await self._call("GET", resource_path(api_version, plural, namespace, name))

    async def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None, *,
                     body: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        return await self._call("DELETE", resource_path(api_version, plural, namespace, name), body)

    async def patch(self, api_version: str, plural: str, name: str, patch: Any, content_type: str,
                    namespace: str | None = None, **_: Any) -> dict[str, Any]:
        return await self._call("PATCH", resource_path(api_version, plural, namespace, name), patch, content_type)


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorded.append((obj["metadata"]["name"], type_, reason, message))


def served_kinds() -> dict[tuple[str, str], APIResource]:
    return {(i.group, i.kind): APIResource(name=i.plural, singular_name=i.singular, namespaced=i.namespaced,
                                           kind=i.kind, group=i.group, version=i.version, verbs=i.verbs)
            for i in default_registry().all()}


@asynccontextmanager
async def collector(api: InProcessAPI) -> AsyncIterator[GarbageCollector]:
    gc = GarbageCollector()
    gc._reset()
    gc.ctx = Context(client=InProcessClient(api), informers=None, events=Events())  # type: ignore[arg-type]
    gc.kinds = served_kinds()
    watch = await api.store.watch("/", from_revision=api.store.current_revision())

    async def feed() -> None:
        async for ev in watch:
            if ev.type == DELETED:
                gc.graph.remove(ev.obj["metadata"]["uid"])
            else:
                gc.graph.observe(ev.obj)

    async with trio.open_nursery() as n:
        n.start_soon(feed)
        for _ in range(2):
            n.start_soon(gc._worker, gc.delete_queue, gc.attempt_to_delete)
        n.start_soon(gc._worker, gc.orphan_queue, gc.attempt_to_orphan)
        yield gc
        n.cancel_scope.cancel()


@pytest.fixture
async def api(tmp_path):
    async with open_api(tmp_path) as a:
        yield a


async def eventually(check: Callable[[], Any], what: str) -> None:
    with trio.move_on_after(TIMEOUT):
        while True:
            if await check():
                return
            await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def ref(owner: dict[str, Any], block: bool = True) -> dict[str, Any]:
    r = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
         "uid": owner["metadata"]["uid"]}
    if block:
        r["blockOwnerDeletion"] = True
    return r


async def make_cm(api: InProcessAPI, name: str, *owners: dict[str, Any], finalizers: list[str] = (),
                  namespace: str = NS) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name}
    if owners:
        md["ownerReferences"] = list(owners)
    if finalizers:
        md["finalizers"] = list(finalizers)
    code, out = await api.json("POST", f"/api/v1/namespaces/{namespace}/configmaps",
                               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md})
    assert code == 201, out
    return out


async def get_cm(api: InProcessAPI, name: str) -> dict[str, Any] | None:
    code, out = await api.json("GET", f"{CM}/{name}")
    return out if code == 200 else None


async def release(api: InProcessAPI, name: str) -> None:
    code, out = await api.json("PATCH", f"{CM}/{name}", {"metadata": {"finalizers": None}},
                               content_type="application/merge-patch+json")
    assert code == 200, out


def gone(api: InProcessAPI, *names: str) -> Callable[[], Any]:
    async def check() -> bool:
        return all([await get_cm(api, n) is None for n in names])
    return check


async def delete(api: InProcessAPI, name: str, policy: str | None = None) -> tuple[int, Any]:
    body = {"kind": "DeleteOptions", "apiVersion": "v1", **({"propagationPolicy": policy} if policy else {})}
    return await api.json("DELETE", f"{CM}/{name}", body)


async def test_background_deletes_dependents_down_the_chain(api):
    async with collector(api):
        a = await make_cm(api, "a")
        b = await make_cm(api, "b", ref(a))
        await make_cm(api, "c", ref(b))
        await make_cm(api, "other")
        code, _ = await delete(api, "a")
        assert code == 200
        await eventually(gone(api, "a", "b", "c"), "b and c to be collected")
        assert await get_cm(api, "other") is not None


async def test_foreground_keeps_the_owner_until_blocking_dependents_are_gone(api):
    async with collector(api):
        a = await make_cm(api, "a")
        b = await make_cm(api, "b", ref(a))
        await make_cm(api, "c", ref(b), finalizers=["example.com/hold"])
        await make_cm(api, "loose", ref(a, block=False), finalizers=["example.com/hold"])
        code, body = await delete(api, "a", "Foreground")
        assert code == 200 and body["metadata"]["finalizers"] == [FOREGROUND_FINALIZER]

        async def c_terminating() -> bool:
            c = await get_cm(api, "c")
            return bool(c and c["metadata"].get("deletionTimestamp"))
        await eventually(c_terminating, "c to be marked for deletion")
        # b waits for c in the foreground too, and a waits for b.
        b_now, a_now = await get_cm(api, "b"), await get_cm(api, "a")
        assert b_now and b_now["metadata"]["finalizers"] == [FOREGROUND_FINALIZER]
        assert a_now and a_now["metadata"]["deletionTimestamp"]
        await release(api, "c")
        # The non-blocking dependent does not hold a...
        await eventually(gone(api, "a", "b", "c"), "the chain to be gone")
        # ...but it was deleted all the same (it waits only for its own finalizer).
        loose = await get_cm(api, "loose")
        assert loose and loose["metadata"].get("deletionTimestamp")
        await release(api, "loose")


async def test_orphan_strips_references_and_keeps_dependents(api):
    async with collector(api):
        a = await make_cm(api, "a")
        other = await make_cm(api, "other")
        await make_cm(api, "b", ref(a))
        await make_cm(api, "c", ref(a), ref(other))
        code, body = await delete(api, "a", "Orphan")
        assert code == 200 and body["metadata"]["finalizers"] == ["orphan"]
        await eventually(gone(api, "a"), "a to be gone")
        b, c = await get_cm(api, "b"), await get_cm(api, "c")
        assert b is not None and "ownerReferences" not in b["metadata"]
        assert c is not None and [r["name"] for r in c["metadata"]["ownerReferences"]] == ["other"]


async def test_a_second_delete_turns_foreground_into_orphan(api):
    async with collector(api):
        a = await make_cm(api, "a")
        await make_cm(api, "b", ref(a), finalizers=["example.com/hold"])
        await delete(api, "a", "Foreground")

        async def b_terminating() -> bool:
            b = await get_cm(api, "b")
            return bool(b and b["metadata"].get("deletionTimestamp"))
        await eventually(b_terminating, "b to be marked")
        code, body = await delete(api, "a", "Orphan")
        assert code == 200 and body["metadata"]["finalizers"] == ["orphan"]
        await eventually(gone(api, "a"), "a to be gone")
        b = await get_cm(api, "b")
        assert b is not None and "ownerReferences" not in b["metadata"]
        await release(api, "b")


async def test_dependent_of_a_recreated_owner_is_collected(api):
    async with collector(api):
        old = await make_cm(api, "owner")
        code, _ = await delete(api, "owner", "Orphan")  # keep the dependents out of it for now
        await eventually(gone(api, "owner"), "the old owner to go")
        await make_cm(api, "owner")  # same name, new uid
        await make_cm(api, "dep", ref(old))  # still points at the old uid
        await eventually(gone(api, "dep"), "the dependent of the old owner to be collected")
        assert await get_cm(api, "owner") is not None


async def test_dangling_reference_removed_when_another_owner_lives(api):
    async with collector(api):
        a = await make_cm(api, "a")
        keep = await make_cm(api, "keep")
        await make_cm(api, "both", ref(a), ref(keep))
        await delete(api, "a")

        async def only_keep() -> bool:
            both = await get_cm(api, "both")
            assert both is not None
            return [r["name"] for r in both["metadata"].get("ownerReferences") or []] == ["keep"]
        await eventually(only_keep, "the dangling reference to be removed")


async def test_cluster_scoped_owner_of_namespaced_dependent(api):
    async with collector(api):
        code, pc = await api.json("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "gc-owner"},
            "value": 10})
        assert code == 201, pc
        await make_cm(api, "dep", ref(pc))
        await trio.sleep(0.3)
        assert await get_cm(api, "dep") is not None  # the owner lives
        code, _ = await api.json("DELETE", "/apis/scheduling.k8s.io/v1/priorityclasses/gc-owner")
        assert code == 200
        await eventually(gone(api, "dep"), "the dependent of the cluster-scoped owner")


async def test_namespaced_owner_of_cluster_scoped_dependent_is_ignored(api):
    async with collector(api) as gc:
        owner = await make_cm(api, "owner")
        code, pc = await api.json("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": "invalid-dep", "ownerReferences": [ref(owner)]}, "value": 10})
        assert code == 201, pc
        await delete(api, "owner")
        events = gc.ctx.events

        async def reported() -> bool:
            return any(e[2] == "OwnerRefInvalidNamespace" for e in events.recorded)
        await eventually(reported, "the OwnerRefInvalidNamespace event")
        code, _ = await api.json("GET", "/apis/scheduling.k8s.io/v1/priorityclasses/invalid-dep")
        assert code == 200
        name, type_, _, message = events.recorded[0]
        assert (name, type_) == ("invalid-dep", "Warning")
        assert message.startswith("ownerRef [v1/ConfigMap, namespace: , name: owner, uid: ")


async def test_owner_that_never_existed(api):
    async with collector(api):
        await make_cm(api, "dep", {"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost",
                                   "uid": "0b0e3c3e-0000-4000-8000-000000000000"})
        await eventually(gone(api, "dep"), "a dependent of a never-existing owner to be collected")


async def test_events_are_not_garbage_collected_kinds(api):
    # Events take no part: a Foreground delete of an Event gets no GC finalizer.
    code, ev = await api.json("POST", f"/api/v1/namespaces/{NS}/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": NS}, "reason": "R", "message": "m"})
    assert code == 201, ev
    code, _ = await api.json("DELETE", f"/api/v1/namespaces/{NS}/events/e",
                             {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})
    assert code == 200
    code, _ = await api.json("GET", f"/api/v1/namespaces/{NS}/events/e")
    assert code == 404


async def test_foreground_namespace_deletion_waits_for_its_content(api):
    async with collector(api):
        code, _ = await api.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                "metadata": {"name": "fgns"}})
        assert code == 201
        await make_cm(api, "held", finalizers=["example.com/hold"], namespace="fgns")
        code, body = await api.json("DELETE", "/api/v1/namespaces/fgns", {"propagationPolicy": "Foreground"})
        assert code == 200 and body["metadata"]["finalizers"] == [FOREGROUND_FINALIZER]
        path = "/api/v1/namespaces/fgns/configmaps/held"

        async def held_marked() -> bool:
            code, held = await api.json("GET", path)
            return code == 200 and bool(held["metadata"].get("deletionTimestamp"))
        await eventually(held_marked, "the content to be marked")
        await trio.sleep(1.5)  # the collector must not finish the namespace while content remains
        code, ns = await api.json("GET", "/api/v1/namespaces/fgns")
        assert code == 200 and ns["status"]["phase"] == "Terminating"
        assert ns["metadata"]["finalizers"] == [FOREGROUND_FINALIZER] and ns["spec"]["finalizers"] == ["kubernetes"]
        code, _ = await api.json("PATCH", path, {"metadata": {"finalizers": None}},
                                 content_type="application/merge-patch+json")
        assert code == 200

        async def ns_gone() -> bool:
            return (await api.json("GET", "/api/v1/namespaces/fgns"))[0] == 404
        await eventually(ns_gone, "the namespace to be gone")
