"""The three endpoints controllers' loops against an in-memory API (no server).

`FakeAPI` stores objects and queues the watch events its writes cause; `flush()`
hands them to the informers.  Holding them back puts the controller's own writes "in
flight": the slice tracker must stop a second sync from creating slices again, and
events carrying its own writes must not queue the Service again, while someone
else's edit or deletion of a slice must."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import trio
import trio.testing

from fleet.client import ApiException
from fleet.controllers.endpoints import EndpointsController
from fleet.controllers.endpointslice import EndpointSliceController
from fleet.controllers.endpointslicemirroring import EndpointSliceMirroringController
from fleet.controllers.runtime import Context, InformerFactory
from tests.unit.controllers.endpoints_fixtures import NS, node, pod, service


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.informers: dict[str, Any] = {}
        self.pending: list[tuple[str, str, dict[str, Any]]] = []
        self.rv = itertools.count(100)
        self.names = itertools.count(1)
        self.writes: list[tuple[str, str, str]] = []

    def flush(self) -> None:
        for plural, etype, obj in self.pending:
            if plural in self.informers:
                self.informers[plural]._apply(etype, obj)
        self.pending.clear()

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        md = obj["metadata"]
        key = (plural, md.get("namespace") or "", md["name"])
        md.setdefault("uid", f"uid-{plural}-{md['name']}")
        md["resourceVersion"] = str(next(self.rv))
        etype = "MODIFIED" if key in self.objects else "ADDED"
        self.objects[key] = obj
        self.pending.append((plural, etype, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def remove(self, plural: str, ns: str, name: str) -> None:
        obj = self.objects.pop((plural, ns, name))
        self.pending.append((plural, "DELETED", obj))

    def of(self, plural: str) -> list[dict[str, Any]]:
        return [o for (p, _, _), o in self.objects.items() if p == plural]

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        md = obj["metadata"]
        if not md.get("name"):
            md["name"] = f"{md.pop('generateName')}{next(self.names):05d}"
        if (plural, namespace or "", md["name"]) in self.objects:
            raise ApiException({"code": 409, "reason": "AlreadyExists", "message": "exists"})
        md["namespace"] = namespace
        self.writes.append(("create", plural, md["name"]))
        return self.put(plural, obj)

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        cur = self.objects.get((plural, namespace or "", name))
        if cur is None:
            raise ApiException({"code": 404, "reason": "NotFound", "message": "not found"})
        if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise ApiException({"code": 409, "reason": "Conflict", "message": "changed"})
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = cur["metadata"]["uid"]
        self.writes.append(("update", plural, name))
        return self.put(plural, obj)

    async def delete(self, api_version: str, plural: str, name: str,
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        if (plural, namespace or "", name) not in self.objects:
            raise ApiException({"code": 404, "reason": "NotFound", "message": "not found"})
        self.writes.append(("delete", plural, name))
        self.remove(plural, namespace or "", name)
        return {}


def ctx_for(api: FakeAPI) -> Context:
    return Context(client=api, informers=InformerFactory(api))  # type: ignore[arg-type]


def wire(api: FakeAPI, ctx: Context) -> None:
    f = ctx.informers
    for plural, api_version in (("services", "v1"), ("pods", "v1"), ("nodes", "v1"), ("endpoints", "v1"),
                                ("endpointslices", "discovery.k8s.io/v1")):
        api.informers[plural] = f.informer(api_version, plural)
        api.informers[plural].synced.set()


def drain(ctl: Any) -> list[str]:
    keys = []
    while len(ctl.queue):
        key = ctl.queue._queue[ctl.queue._head]
        ctl.queue._head += 1
        ctl.queue._dirty.discard(key)
        keys.append(key)
    return keys


async def test_endpointslice_no_duplicates_while_writes_in_flight(autojump_clock: Any) -> None:
    api = FakeAPI()
    ctx = ctx_for(api)
    ctl = EndpointSliceController(max_endpoints_per_slice=2)
    ctl.setup(ctx)
    wire(api, ctx)
    api.put("nodes", node("n1"))
    api.put("services", service())
    for i in range(1, 6):
        api.put("pods", pod(f"p{i}", f"10.42.0.{i}"))
    api.flush()
    assert drain(ctl) == [f"{NS}/web"]
    await ctl.reconcile(f"{NS}/web")
    assert len(api.of("endpointslices")) == 3  # 2 + 2 + 1
    # The cache has not seen them yet: wait, do not create again.
    assert await ctl.reconcile(f"{NS}/web") is not None
    assert len(api.of("endpointslices")) == 3
    api.flush()
    assert drain(ctl) == []  # our own writes coming back queue nothing
    writes = len(api.writes)
    assert await ctl.reconcile(f"{NS}/web") is None
    assert len(api.writes) == writes  # nothing to do

    # A pod's readiness changes: its Service is queued, one slice updated.
    api.put("pods", pod("p3", "10.42.0.3", ready=False))
    api.flush()
    assert drain(ctl) == [f"{NS}/web"]
    await ctl.reconcile(f"{NS}/web")
    assert [w[0] for w in api.writes[writes:]] == ["update"]
    api.flush()
    drain(ctl)

    # Someone deletes one of our slices: the Service is queued and it comes back.
    victim = api.of("endpointslices")[0]["metadata"]["name"]
    api.remove("endpointslices", NS, victim)
    api.flush()
    assert drain(ctl) == [f"{NS}/web"]
    await ctl.reconcile(f"{NS}/web")
    api.flush()
    drain(ctl)
    addrs = sorted(e["addresses"][0] for s in api.of("endpointslices") for e in s["endpoints"])
    assert addrs == [f"10.42.0.{i}" for i in range(1, 6)]

    # The selector goes: the slices go.
    svc = copy.deepcopy(api.objects[("services", NS, "web")])
    del svc["spec"]["selector"]
    api.put("services", svc)
    api.flush()
    await ctl.reconcile(f"{NS}/web")
    assert api.of("endpointslices") == []


async def test_endpointslice_pod_on_unknown_node_then_node_arrives(autojump_clock: Any) -> None:
    api = FakeAPI()
    ctx = ctx_for(api)
    ctl = EndpointSliceController()
    ctl.setup(ctx)
    wire(api, ctx)
    api.put("services", service())
    api.put("pods", pod("a", "10.42.0.1", node="late"))
    api.flush()
    drain(ctl)
    assert await ctl.reconcile(f"{NS}/web") == 5.0  # look again later
    api.flush()
    api.put("nodes", node("late", "zone-z"))
    api.flush()
    assert drain(ctl) == [f"{NS}/web"]  # the node's arrival queues the Service
    await ctl.reconcile(f"{NS}/web")
    [s] = api.of("endpointslices")
    assert s["endpoints"][0]["zone"] == "zone-z"


async def test_endpoints_controller(autojump_clock: Any) -> None:
    api = FakeAPI()
    ctx = ctx_for(api)
    ctl = EndpointsController()
    ctl.setup(ctx)
    wire(api, ctx)
    api.put("services", service())
    api.put("pods", pod("a", "10.42.0.1"))
    api.put("services", service("manual", selector={}))
    api.put("endpoints", {"metadata": {"name": "manual", "namespace": NS},
                          "subsets": [{"addresses": [{"ip": "192.0.2.1"}]}]})
    api.put("endpoints", {"metadata": {"name": "orphan", "namespace": NS}})
    api.flush()
    drain(ctl)
    await ctl.reconcile(f"{NS}/web")
    await ctl.reconcile(f"{NS}/manual")
    api.flush()
    ep = api.objects[("endpoints", NS, "web")]
    assert ep["subsets"][0]["addresses"][0]["ip"] == "10.42.0.1"
    # The selector-less Service's Endpoints are left as they are.
    assert api.objects[("endpoints", NS, "manual")]["subsets"] == [{"addresses": [{"ip": "192.0.2.1"}]}]
    # Start-up finds the Endpoints without a Service and deletes them.
    async with trio.open_nursery() as n:
        n.start_soon(ctl.run, ctx)
        await trio.sleep(1)
        n.cancel_scope.cancel()
    assert ("endpoints", NS, "orphan") not in api.objects and ("endpoints", NS, "web") in api.objects
    api.flush()
    drain(ctl)
    # Deleted by hand: re-created.
    api.remove("endpoints", NS, "web")
    api.flush()
    assert drain(ctl) == [f"{NS}/web"]
    await ctl.reconcile(f"{NS}/web")
    assert ("endpoints", NS, "web") in api.objects
    # Service gone: its Endpoints go.
    api.remove("services", NS, "web")
    api.flush()
    await ctl.reconcile(f"{NS}/web")
    assert ("endpoints", NS, "web") not in api.objects


async def test_mirroring_controller(autojump_clock: Any) -> None:
    api = FakeAPI()
    ctx = ctx_for(api)
    ctl = EndpointSliceMirroringController()
    ctl.setup(ctx)
    wire(api, ctx)
    api.put("services", service("kube-dns", selector={}, cluster_ip="10.43.0.10"))
    api.put("endpoints", {"metadata": {"name": "kube-dns", "namespace": NS},
                          "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                                       "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}]})
    api.flush()
    assert drain(ctl) == [f"{NS}/kube-dns"]
    await ctl.reconcile(f"{NS}/kube-dns")
    assert await ctl.reconcile(f"{NS}/kube-dns") is not None  # own create not seen yet: wait
    api.flush()
    assert drain(ctl) == []
    [s] = api.of("endpointslices")
    assert s["endpoints"] == [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]
    # The Service gains a selector: mirrored slices go.
    svc = copy.deepcopy(api.objects[("services", NS, "kube-dns")])
    svc["spec"]["selector"] = {"k8s-app": "kube-dns"}
    api.put("services", svc)
    api.flush()
    assert drain(ctl) == [f"{NS}/kube-dns"]
    await ctl.reconcile(f"{NS}/kube-dns")
    assert api.of("endpointslices") == []


async def test_namespace_being_deleted_is_not_retried(autojump_clock: Any) -> None:
    api = FakeAPI()
    ctx = ctx_for(api)
    eps, slices = EndpointsController(), EndpointSliceController()
    eps.setup(ctx)
    slices.setup(ctx)
    wire(api, ctx)
    api.put("nodes", node("n1"))
    api.put("services", service())
    api.put("pods", pod("a", "10.42.0.1"))
    api.flush()

    async def refuse(*a: Any, **kw: Any) -> dict[str, Any]:
        raise ApiException({"code": 403, "reason": "Forbidden",
                            "message": f"unable to create new content in namespace {NS} because it is being terminated",
                            "details": {"causes": [{"reason": "NamespaceTerminating",
                                                    "message": f"namespace {NS} is being terminated"}]}})
    api.create = refuse  # type: ignore[method-assign]
    assert await eps.reconcile(f"{NS}/web") is None
    assert await slices.reconcile(f"{NS}/web") is None
    # Any other refusal is an error: retried with back-off by the queue worker.
    async def other(*a: Any, **kw: Any) -> dict[str, Any]:
        raise ApiException({"code": 403, "reason": "Forbidden", "message": "no"})
    api.create = other  # type: ignore[method-assign]
    with pytest.raises(ApiException):
        await eps.reconcile(f"{NS}/web")
    with pytest.raises(ApiException):
        await slices.reconcile(f"{NS}/web")
