"""The storage controllers' loops against an in-memory API (no server): informers fed
from the fake's writes, the queue drained by hand.  The fake keeps Kubernetes' status
subresource split (a PUT of the object keeps the stored status, a PUT of /status
changes only the status) and resourceVersion conflicts, so the loops' write order
and their double checks are exercised."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import trio
import trio.testing

from fleet.api import pvmatch as pm
from fleet.client import ApiException
from fleet.controllers.attachdetach import AttachDetachController, attachment_name
from fleet.controllers.ephemeral import EphemeralVolumeController
from fleet.controllers.persistentvolume import PersistentVolumeController
from fleet.controllers.runtime import Context, InformerFactory
from fleet.controllers.volumeprotection import PVCProtectionController, PVProtectionController
from fleet.storage.driver import Capabilities

NS = "default"
STATUS_SUBRESOURCE = {"persistentvolumes", "persistentvolumeclaims", "pods", "nodes"}


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def _err(code: int) -> ApiException:
    return ApiException({"code": code, "reason": str(code), "message": str(code)})


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.informers: dict[str, Any] = {}
        self.pending: list[tuple[str, str, dict[str, Any]]] = []
        self.rv = itertools.count(100)
        self.writes: list[tuple[str, str, str]] = []

    def flush(self) -> None:
        for plural, etype, obj in self.pending:
            if plural in self.informers:
                self.informers[plural]._apply(etype, copy.deepcopy(obj))
        self.pending.clear()

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        md = obj["metadata"]
        key = (plural, md.get("namespace") or "", md["name"])
        md.setdefault("uid", f"uid-{plural}-{md['name']}")
        md["resourceVersion"] = str(next(self.rv))
        etype = "MODIFIED" if key in self.objects else "ADDED"
        if md.get("deletionTimestamp") and not md.get("finalizers"):
            self.objects.pop(key, None)
            self.pending.append((plural, "DELETED", obj))
            return copy.deepcopy(obj)
        self.objects[key] = obj
        self.pending.append((plural, etype, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def get(self, plural: str, name: str, ns: str = "") -> dict[str, Any] | None:
        return self.objects.get((plural, ns, name))

    def of(self, plural: str) -> list[dict[str, Any]]:
        return [o for (p, _, _), o in self.objects.items() if p == plural]

    def mark_deleted(self, plural: str, name: str, ns: str = "") -> None:
        obj = copy.deepcopy(self.objects[(plural, ns, name)])
        obj["metadata"]["deletionTimestamp"] = "2026-12-03T07:00:00Z"
        self.put(plural, obj)

    def remove(self, plural: str, name: str, ns: str = "") -> None:
        obj = self.objects.pop((plural, ns, name))
        self.pending.append((plural, "DELETED", obj))

    # -- the client calls the controllers make ------------------------------------------
    async def get_object(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                         **kw: Any) -> dict[str, Any]:
        obj = self.get(plural, name, namespace or "")
        if obj is None:
            raise _err(404)
        return copy.deepcopy(obj)

    async def list(self, api_version: str, plural: str, namespace: str | None = None, **kw: Any) -> dict[str, Any]:
        return {"items": [copy.deepcopy(o) for (p, ns, _), o in self.objects.items()
                          if p == plural and (namespace is None or ns == namespace)]}

    async def create(self, api_version: str, plural: str, body: dict[str, Any], namespace: str | None = None,
                     **kw: Any) -> dict[str, Any]:
        md = body["metadata"]
        if (plural, namespace or "", md["name"]) in self.objects:
            raise _err(409)
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = namespace
        if plural in STATUS_SUBRESOURCE:
            obj.pop("status", None)
        self.writes.append(("create", plural, md["name"]))
        return self.put(plural, obj)

    async def replace(self, api_version: str, plural: str, name: str, body: dict[str, Any],
                      namespace: str | None = None, *, subresource: str | None = None, **kw: Any) -> dict[str, Any]:
        cur = self.get(plural, name, namespace or "")
        if cur is None:
            raise _err(404)
        if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise _err(409)
        if subresource == "status":
            obj = copy.deepcopy(cur)
            obj["status"] = copy.deepcopy(body.get("status"))
        else:
            obj = copy.deepcopy(body)
            obj["metadata"]["uid"] = cur["metadata"]["uid"]
            if plural in STATUS_SUBRESOURCE:
                obj["status"] = copy.deepcopy(cur.get("status"))
        self.writes.append((f"update{'/' + subresource if subresource else ''}", plural, name))
        return self.put(plural, obj)

    async def delete(self, api_version: str, plural: str, name: str, namespace: str | None = None,
                     **kw: Any) -> dict[str, Any]:
        if (plural, namespace or "", name) not in self.objects:
            raise _err(404)
        self.writes.append(("delete", plural, name))
        self.remove(plural, name, namespace or "")
        return {}


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.recorded.append((obj["metadata"]["name"], type_, reason, message))

    def reasons(self) -> list[str]:
        return [r[2] for r in self.recorded]


def start(ctl: Any) -> tuple[FakeAPI, Events]:
    api, events = FakeAPI(), Events()
    ctx = Context(client=api, informers=InformerFactory(api), events=events)  # type: ignore[arg-type]
    ctl.setup(ctx)
    for (_, plural, _), inf in ctx.informers._informers.items():
        api.informers[plural] = inf
        inf.synced.set()
    return api, events


async def settle(api: FakeAPI, ctl: Any, rounds: int = 20) -> list[str]:
    """Deliver the fake's events and reconcile every queued key until both are quiet."""
    done: list[str] = []
    for _ in range(rounds):
        api.flush()
        if not len(ctl.queue):
            return done
        while len(ctl.queue):
            key = ctl.queue._queue[ctl.queue._head]
            ctl.queue._head += 1
            ctl.queue._dirty.discard(key)
            done.append(key)
            await ctl.reconcile(key)
    raise AssertionError(f"did not settle: {done[-10:]}")


def pv(name: str, cap: str = "10Gi", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": cap}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", **spec}}


def pvc(name: str = "data", req: str = "5Gi", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": req}}, **spec},
            "status": {"phase": "Pending"}}


def pod(name: str, *claims: str, node: str | None = "n1", ephemeral: tuple[str, ...] = ()) -> dict[str, Any]:
    vols: list[dict[str, Any]] = [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims]
    vols += [{"name": e, "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}} for e in ephemeral]
    spec: dict[str, Any] = {"volumes": vols, "containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec, "status": {"phase": "Running"}}


# ---------------------------------------------------------------------------------------
# persistentvolume-binder


async def test_binder_binds_releases_and_reports(autojump_clock: Any) -> None:
    ctl = PersistentVolumeController(capabilities=lambda name: None, now=lambda: "T")
    api, events = start(ctl)
    api.put("persistentvolumes", pv("small", "10Gi", storageClassName=""))
    api.put("persistentvolumes", pv("big", "50Gi", storageClassName=""))
    api.put("persistentvolumeclaims", pvc("data", storageClassName=""))
    await settle(api, ctl)
    claim = api.get("persistentvolumeclaims", "data", NS)
    small = api.get("persistentvolumes", "small")
    assert claim is not None and small is not None
    assert claim["spec"]["volumeName"] == "small"
    assert claim["status"] == {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}}
    assert claim["metadata"]["annotations"] == {pm.BIND_COMPLETED: "yes", pm.BOUND_BY_CONTROLLER: "yes"}
    assert small["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert small["status"]["phase"] == "Bound"
    assert api.get("persistentvolumes", "big")["status"]["phase"] == "Available"  # type: ignore[index]
    # Volume's spec before its status, then the claim's spec before its status.
    binds = [w for w in api.writes if w[2] in ("small", "data")]
    binds = binds[binds.index(("update", "persistentvolumes", "small")):]
    assert binds[:4] == [("update", "persistentvolumes", "small"), ("update/status", "persistentvolumes", "small"),
                         ("update", "persistentvolumeclaims", "data"),
                         ("update/status", "persistentvolumeclaims", "data")]
    assert events.recorded == []
    writes = len(api.writes)
    await ctl.reconcile(f"claim:{NS}/data")
    await ctl.reconcile("volume:/small")
    assert len(api.writes) == writes  # a settled binding writes nothing

    api.remove("persistentvolumeclaims", "data", NS)
    await settle(api, ctl)
    assert api.get("persistentvolumes", "small")["status"]["phase"] == "Released"  # type: ignore[index]


async def test_binder_hands_claims_to_provisioners_and_reports_why_not(autojump_clock: Any) -> None:
    ctl = PersistentVolumeController(capabilities=lambda name: None, now=lambda: "T")
    api, events = start(ctl)
    api.put("storageclasses", {"metadata": {"name": "nfs"}, "provisioner": "example.com/nfs"})
    api.put("persistentvolumeclaims", pvc("a", storageClassName="nfs"))
    api.put("persistentvolumeclaims", pvc("b", storageClassName="missing"))
    api.put("persistentvolumeclaims", pvc("c", storageClassName=""))
    await settle(api, ctl)
    a = api.get("persistentvolumeclaims", "a", NS)
    assert a is not None and a["metadata"]["annotations"] == {pm.STORAGE_PROVISIONER: "example.com/nfs",
                                                              pm.BETA_STORAGE_PROVISIONER: "example.com/nfs"}
    # (Each sync says it again, as Kubernetes does; the recorder counts repeats.)
    assert sorted({(n, r) for n, _, r, _ in events.recorded}) == [
        ("a", "ExternalProvisioning"), ("b", "ProvisioningFailed"), ("c", "FailedBinding")]

    # A provisioner's PV, pre-bound to the claim, is bound by the claim's sync.
    pre = pv("pvc-a", "5Gi", storageClassName="nfs",
             claimRef={"namespace": NS, "name": "a", "uid": a["metadata"]["uid"]})
    pre["metadata"]["annotations"] = {pm.PROVISIONED_BY: "example.com/nfs"}
    api.put("persistentvolumes", pre)
    await settle(api, ctl)
    a = api.get("persistentvolumeclaims", "a", NS)
    assert a is not None and a["status"]["phase"] == "Bound" and a["spec"]["volumeName"] == "pvc-a"
    assert api.get("persistentvolumes", "pvc-a")["status"]["phase"] == "Bound"  # type: ignore[index]

    # A static volume for "c" appears: its class's unbound claims are looked at again.
    api.put("persistentvolumes", pv("manual", "8Gi", storageClassName=""))
    await settle(api, ctl)
    assert api.get("persistentvolumeclaims", "c", NS)["spec"]["volumeName"] == "manual"  # type: ignore[index]


async def test_binder_checks_the_api_before_releasing(autojump_clock: Any) -> None:
    ctl = PersistentVolumeController(capabilities=lambda name: None, now=lambda: "T")
    api, _ = start(ctl)
    # The claim exists in the API but its event has not reached the informer yet.
    claim = api.put("persistentvolumeclaims", pvc("fresh", storageClassName=""))
    api.pending.clear()
    vol = pv("v", storageClassName="", claimRef={"namespace": NS, "name": "fresh", "uid": claim["metadata"]["uid"]})
    api.put("persistentvolumes", vol)
    api.flush()
    await ctl.reconcile("volume:/v")
    assert api.get("persistentvolumes", "v").get("status") is None  # type: ignore[union-attr]  # not Released


async def test_binder_picks_a_node_for_node_local_immediate_claims(autojump_clock: Any) -> None:
    caps = Capabilities(node_local=True)
    ctl = PersistentVolumeController(capabilities=lambda name: caps if name == "local.fleet.dev" else None,
                                     now=lambda: "T")
    api, events = start(ctl)
    api.put("storageclasses", {"metadata": {"name": "fast"}, "provisioner": "local.fleet.dev"})
    api.put("persistentvolumeclaims", pvc("db", storageClassName="fast"))
    await settle(api, ctl)
    assert set(events.reasons()) == {"ProvisioningFailed"}  # no node runs the driver yet
    db = api.get("persistentvolumeclaims", "db", NS)
    assert db is not None and pm.SELECTED_NODE not in db["metadata"]["annotations"]
    # A node registers and its CSINode lists the driver: the waiting claim gets it.
    api.put("nodes", {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    api.put("csinodes", {"metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "local.fleet.dev"}]}})
    await settle(api, ctl)
    db = api.get("persistentvolumeclaims", "db", NS)
    assert db is not None and db["metadata"]["annotations"][pm.SELECTED_NODE] == "n1"


# ---------------------------------------------------------------------------------------
# Protection


async def test_pvc_protection_waits_for_the_pod(autojump_clock: Any) -> None:
    ctl = PVCProtectionController()
    api, _ = start(ctl)
    claim = pvc("data")
    claim["metadata"]["finalizers"] = [pm.PVC_PROTECTION]
    api.put("persistentvolumeclaims", claim)
    api.put("pods", pod("web", "data"))
    await settle(api, ctl)
    api.mark_deleted("persistentvolumeclaims", "data", NS)
    await settle(api, ctl)
    assert api.get("persistentvolumeclaims", "data", NS) is not None  # in use: kept
    # The cache says the pod is gone, but the API still has a new user: kept.
    api.remove("pods", "web", NS)
    api.put("pods", pod("web2", "data"))
    api.flush()
    api.informers["pods"]._apply("DELETED", pod("web2", "data"))  # the cache lags behind
    await ctl.reconcile(f"{NS}/data")
    assert api.get("persistentvolumeclaims", "data", NS) is not None
    api.remove("pods", "web2", NS)
    await settle(api, ctl)
    await ctl.reconcile(f"{NS}/data")
    api.flush()
    assert api.get("persistentvolumeclaims", "data", NS) is None  # finalizer gone, claim deleted


async def test_pv_protection_waits_until_not_bound(autojump_clock: Any) -> None:
    ctl = PVProtectionController()
    api, _ = start(ctl)
    vol = pv("v")
    vol["metadata"]["finalizers"] = [pm.PV_PROTECTION]
    vol["status"] = {"phase": "Bound"}
    api.put("persistentvolumes", vol)
    api.mark_deleted("persistentvolumes", "v")
    await settle(api, ctl)
    assert api.get("persistentvolumes", "v") is not None
    cur = copy.deepcopy(api.get("persistentvolumes", "v"))
    assert cur is not None
    cur["status"] = {"phase": "Released"}
    api.put("persistentvolumes", cur)
    await settle(api, ctl)
    assert api.get("persistentvolumes", "v") is None


# ---------------------------------------------------------------------------------------
# Ephemeral volumes


async def test_ephemeral_claims_created_and_conflicts_reported(autojump_clock: Any) -> None:
    ctl = EphemeralVolumeController()
    api, events = start(ctl)
    api.put("pods", pod("web", ephemeral=("scratch",)))
    await settle(api, ctl)
    claim = api.get("persistentvolumeclaims", "web-scratch", NS)
    assert claim is not None
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-pods-web"
    assert claim["spec"]["resources"] == {"requests": {"storage": "1Gi"}}

    squatter = pvc("db-cache")
    api.put("persistentvolumeclaims", squatter)
    api.put("pods", pod("db", ephemeral=("cache",)))
    await settle(api, ctl)
    assert events.recorded == [("db", "Warning", "FailedBinding",
                                "ephemeral volume cache: PVC default/db-cache was not created for pod "
                                "default/db (pod is not owner)")]
    # The squatter goes: the pod is queued again and gets its own claim.
    api.remove("persistentvolumeclaims", "db-cache", NS)
    await settle(api, ctl)
    mine = api.get("persistentvolumeclaims", "db-cache", NS)
    assert mine is not None and mine["metadata"]["ownerReferences"][0]["name"] == "db"


# ---------------------------------------------------------------------------------------
# Attach/detach


async def test_attach_detach_follows_the_pods(autojump_clock: Any) -> None:
    ctl = AttachDetachController()
    api, _ = start(ctl)
    api.put("csidrivers", {"metadata": {"name": "blk.example"}, "spec": {"attachRequired": True}})
    api.put("persistentvolumes", pv("v", csi={"driver": "blk.example", "volumeHandle": "h1"}))
    claim = pvc("data", volumeName="v")
    claim["metadata"]["annotations"] = {pm.BIND_COMPLETED: "yes"}
    api.put("persistentvolumeclaims", claim)
    api.put("pods", pod("web", "data", node="n1"))
    await settle(api, ctl)
    name = attachment_name("h1", "blk.example", "n1")
    va = api.get("volumeattachments", name)
    assert va is not None and va["spec"] == {"attacher": "blk.example", "nodeName": "n1",
                                             "source": {"persistentVolumeName": "v"}}
    api.remove("pods", "web", NS)
    await settle(api, ctl)
    assert api.get("volumeattachments", name) is None


async def test_binder_survives_a_driver_whose_capabilities_fail(autojump_clock: Any) -> None:
    def broken(name: str) -> Capabilities | None:
        raise RuntimeError("plugin factory exploded")

    ctl = PersistentVolumeController(capabilities=broken, now=lambda: "T")
    api, events = start(ctl)
    api.put("storageclasses", {"metadata": {"name": "odd"}, "provisioner": "odd.example"})
    api.put("persistentvolumeclaims", pvc("x", storageClassName="odd"))
    await settle(api, ctl)
    x = api.get("persistentvolumeclaims", "x", NS)
    assert x is not None and x["metadata"]["annotations"][pm.STORAGE_PROVISIONER] == "odd.example"
    assert pm.SELECTED_NODE not in x["metadata"]["annotations"]
    assert set(events.reasons()) == {"ExternalProvisioning"}
