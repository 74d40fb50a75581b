"""The ReplicaSet controller's I/O loop against an in-memory API (MockClock, no server).

`FakeAPI` stores objects and queues the watch events its writes cause; `flush()`
hands them to the informers.  Holding them back is how the tests put the
controller's own writes "in flight": expectations must stop it from creating or
deleting a second time meanwhile.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import trio
import trio.testing

from fleet.api.patch import json_merge_patch, json_patch
from fleet.client import JSON_PATCH, ApiException
from fleet.controllers.replicaset import ReplicaSetController, rfc3339
from fleet.controllers.runtime import Context, InformerFactory


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.seen.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.seen]


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.informers: dict[str, Any] = {}
        self.pending: list[tuple[str, str, dict[str, Any]]] = []
        self.rv = itertools.count(100)
        self.uids = itertools.count(1)
        self.names = itertools.count(1)
        self.fail_creates_after: int | None = None
        self.creates = 0

    def _emit(self, plural: str, etype: str, obj: dict[str, Any]) -> None:
        self.pending.append((plural, etype, copy.deepcopy(obj)))

    def flush(self) -> None:
        for plural, etype, obj in self.pending:
            self.informers[plural]._apply(etype, obj)
        self.pending.clear()

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        md = obj["metadata"]
        md.setdefault("uid", f"uid-{next(self.uids)}")
        md["resourceVersion"] = str(next(self.rv))
        etype = "MODIFIED" if (plural, md.get("namespace", ""), md["name"]) in self.objects else "ADDED"
        self.objects[(plural, md.get("namespace", ""), md["name"])] = obj
        self._emit(plural, etype, obj)
        return copy.deepcopy(obj)

    async def create(self, api_version: str, plural: str, body: dict[str, Any],
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        await trio.sleep(0.01)
        if plural == "pods":
            self.creates += 1
            if self.fail_creates_after is not None and self.creates > self.fail_creates_after:
                raise ApiException({"code": 403, "reason": "Forbidden",
                                    "message": 'pods "x" is forbidden: exceeded quota: q, '
                                               "requested: pods=1, used: pods=2, limited: pods=2"})
        obj = copy.deepcopy(body)
        md = obj["metadata"]
        if not md.get("name"):
            md["name"] = f"{md.pop('generateName')}{next(self.names):05d}"
        md["namespace"] = namespace
        md["creationTimestamp"] = rfc3339(1_800_000_000)
        obj.setdefault("status", {"phase": "Pending"})
        return self.put(plural, obj)

    async def get_object(self, api_version: str, plural: str, name: str,
                         namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[(plural, namespace or "", name)])
        except KeyError:
            raise ApiException({"code": 404, "reason": "NotFound", "message": "not found"}) from None

    async def patch(self, api_version: str, plural: str, name: str, patch: Any, content_type: str,
                    namespace: str | None = None, *, subresource: str | None = None,
                    **kw: Any) -> dict[str, Any]:
        old = await self.get_object(api_version, plural, name, namespace)
        try:
            new = json_patch(old, patch) if content_type == JSON_PATCH else json_merge_patch(old, patch)
        except Exception as e:
            raise ApiException({"code": 422, "reason": "Invalid", "message": str(e)}) from None
        if subresource == "status":
            old["status"] = new.get("status")
            new = old
        return self.put(plural, new)

    async def delete(self, api_version: str, plural: str, name: str,
                     namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        obj = await self.get_object(api_version, plural, name, namespace)
        # Graceful deletion, as for a pod on a node: marked first, gone later.
        obj["metadata"]["deletionTimestamp"] = rfc3339(1_800_000_000)
        return self.put(plural, obj)


def replicaset(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": "ns", "generation": 1},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}


async def setup() -> tuple[FakeAPI, ReplicaSetController, Events]:
    api = FakeAPI()
    ctx = Context(client=api, informers=InformerFactory(api))  # type: ignore[arg-type]
    events = Events()
    ctx.events = events
    ctl = ReplicaSetController()
    ctl.setup(ctx)
    api.informers = {"replicasets": ctl.replicasets, "pods": ctl.pods}
    return api, ctl, events


def active_pods(api: FakeAPI) -> list[dict[str, Any]]:
    return [o for (plural, _, _), o in api.objects.items()
            if plural == "pods" and not o["metadata"].get("deletionTimestamp")]


async def test_creates_once_while_its_creations_are_in_flight(autojump_clock: Any) -> None:
    api, ctl, events = await setup()
    await api.create("apps/v1", "replicasets", replicaset(3), "ns")
    api.flush()
    await ctl.reconcile("ns/web")
    assert len(active_pods(api)) == 3
    assert events.reasons() == ["SuccessfulCreate"] * 3
    # The informer has not seen the new pods yet: another pass must not create more.
    await ctl.reconcile("ns/web")
    assert len(active_pods(api)) == 3
    api.flush()
    await ctl.reconcile("ns/web")
    assert len(active_pods(api)) == 3
    api.flush()
    rs = ctl.replicasets.get("ns/web")
    assert rs["status"]["replicas"] == 3 and rs["status"]["observedGeneration"] == 1
    pod = active_pods(api)[0]
    ref = pod["metadata"]["ownerReferences"][0]
    assert ref["controller"] and ref["blockOwnerDeletion"] and ref["uid"] == rs["metadata"]["uid"]
    assert pod["metadata"]["name"].startswith("web-")


async def test_deletes_once_and_replaces_terminating_pods_at_once(autojump_clock: Any) -> None:
    api, ctl, events = await setup()
    await api.create("apps/v1", "replicasets", replicaset(3), "ns")
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    api.objects[("replicasets", "ns", "web")]["spec"]["replicas"] = 1
    api.put("replicasets", api.objects[("replicasets", "ns", "web")])
    api.flush()
    await ctl.reconcile("ns/web")
    assert len(active_pods(api)) == 1
    assert events.reasons().count("SuccessfulDelete") == 2
    await ctl.reconcile("ns/web")  # deletions in flight: no more deleted, none created
    assert len(active_pods(api)) == 1 and events.reasons().count("SuccessfulDelete") == 2
    api.flush()
    # A pod marked for deletion by someone else is replaced without waiting for it to go.
    await api.delete("v1", "pods", active_pods(api)[0]["metadata"]["name"], "ns")
    api.flush()
    await ctl.reconcile("ns/web")
    assert len(active_pods(api)) == 1
    assert events.reasons().count("SuccessfulCreate") == 4


async def test_quota_failure_stops_slow_start_and_reports_it(autojump_clock: Any) -> None:
    api, ctl, events = await setup()
    api.fail_creates_after = 2
    await api.create("apps/v1", "replicasets", replicaset(10), "ns")
    api.flush()
    with pytest.raises(ApiException, match="exceeded quota"):
        await ctl.reconcile("ns/web")
    # Batches of 1 then 2: the second batch's failure stops it — 3 attempts, not 10.
    assert api.creates == 3
    assert events.reasons().count("SuccessfulCreate") == 2
    failed = [m for _, r, m in events.seen if r == "FailedCreate"]
    assert failed == ['Error creating: pods "x" is forbidden: exceeded quota: q, requested: pods=1, '
                      "used: pods=2, limited: pods=2"]
    api.flush()
    st = ctl.replicasets.get("ns/web")["status"]
    cond = st["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("ReplicaFailure", "True", "FailedCreate")
    assert "exceeded quota" in cond["message"]
    # The failed and never-tried creations are not expected: the next pass tries again.
    assert ctl.expectations.satisfied("ns/web")
    api.fail_creates_after = None
    await ctl.reconcile("ns/web")
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    assert len(active_pods(api)) == 10
    assert "conditions" not in ctl.replicasets.get("ns/web")["status"]


async def test_adopts_orphans_and_releases_strays(autojump_clock: Any) -> None:
    api, ctl, _ = await setup()
    await api.create("apps/v1", "replicasets", replicaset(2), "ns")
    orphan = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "orphan", "labels": {"app": "web"}}, "spec": {}}
    await api.create("v1", "pods", orphan, "ns")
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    pods = active_pods(api)
    assert len(pods) == 2
    adopted = api.objects[("pods", "ns", "orphan")]
    assert adopted["metadata"]["ownerReferences"][0]["name"] == "web"
    # A label change takes a pod out of the set: released, and replaced.
    stray = api.objects[("pods", "ns", "orphan")]
    stray["metadata"]["labels"] = {"app": "other"}
    api.put("pods", stray)
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    assert "ownerReferences" not in api.objects[("pods", "ns", "orphan")]["metadata"]
    assert len([p for p in active_pods(api) if p["metadata"]["labels"] == {"app": "web"}]) == 2


async def test_adoption_of_a_pod_changed_meanwhile_waits_for_a_fresh_read(autojump_clock: Any) -> None:
    api, ctl, _ = await setup()
    await api.create("apps/v1", "replicasets", replicaset(1), "ns")
    orphan = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "orphan", "labels": {"app": "web"}}, "spec": {}}
    await api.create("v1", "pods", orphan, "ns")
    api.flush()
    # Another controller takes the pod after our informer saw it as an orphan.
    taken = api.objects[("pods", "ns", "orphan")]
    taken["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rival",
                                             "uid": "uid-rival", "controller": True}]
    api.put("pods", taken)  # not flushed: the cache still has the orphan
    await ctl.reconcile("ns/web")
    refs = api.objects[("pods", "ns", "orphan")]["metadata"]["ownerReferences"]
    assert [r["uid"] for r in refs] == ["uid-rival"]  # the guarded patch failed: still the rival's
    assert len(active_pods(api)) == 1  # and nothing was created on counts that were wrong
    api.flush()
    await ctl.reconcile("ns/web")
    api.flush()
    ours = [p for p in active_pods(api) if p["metadata"]["name"] != "orphan"]
    assert len(ours) == 1 and ours[0]["metadata"]["ownerReferences"][0]["name"] == "web"
