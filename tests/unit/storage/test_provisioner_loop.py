"""The provisioner loop over an in-memory API and a fake driver, under MockClock.

What each test shows is what a cluster would show: the PV a claim gets, the
Events on the claim, the retries with back-off, the volume deleted again when its
PV cannot be made, the selected node given back on a full node, Released volumes
deleted, resizes, attachments and CSIStorageCapacity objects.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing

from fleet.storage.driver import Capabilities, Code, DriverError
from fleet.storage.provisioner import Place, Provisioner
from fleet.storage.provisioner_plan import PROVISIONER_FINALIZER, attacher_finalizer
from tests.unit.storage.fakes import FakeAPI, FakeDriver, api_error, stub_events

CENTRAL = "central.fleet.test"
LOCAL = "local.fleet.test"
STORAGE = "storage.k8s.io/v1"
CENTRAL_CAPS = Capabilities(expansion="online", attach_required=True)
LOCAL_CAPS = Capabilities(node_local=True, topology_keys=("kubernetes.io/hostname",),
                          capacity_tracking=True, expansion="online")


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def storage_class(name: str, provisioner: str, *, mode: str = "Immediate", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": STORAGE, "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": mode, "reclaimPolicy": "Delete", **fields}


def claim(name: str, provisioner: str, cls: str, *, node: str | None = None, size: str = "1Gi",
          mode: str = "Filesystem") -> dict[str, Any]:
    ann = {"volume.kubernetes.io/storage-provisioner": provisioner}
    if node:
        ann["volume.kubernetes.io/selected-node"] = node
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": ann},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": cls, "volumeMode": mode,
                     "resources": {"requests": {"storage": size}}},
            "status": {"phase": "Pending"}}


async def eventually(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    with trio.move_on_after(timeout):
        while True:
            got = check()
            if got:
                return got
            await trio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Rig:
    def __init__(self, api: FakeAPI, prov: Provisioner, driver: FakeDriver) -> None:
        self.api, self.prov, self.driver = api, prov, driver

    def pv(self, name: str) -> dict[str, Any] | None:
        return self.api.get("v1", "persistentvolumes", name)

    def claim(self, name: str) -> dict[str, Any] | None:
        return self.api.get("v1", "persistentvolumeclaims", name, "ns")


@pytest.fixture
async def central(autojump_clock: trio.testing.MockClock) -> AsyncIterator[Rig]:
    async for rig in _rig(FakeDriver(CENTRAL, CENTRAL_CAPS), Place(),
                          [storage_class("fast", CENTRAL, allowVolumeExpansion=True)]):
        yield rig


@pytest.fixture
async def local(autojump_clock: trio.testing.MockClock) -> AsyncIterator[Rig]:
    async for rig in _rig(FakeDriver(LOCAL, LOCAL_CAPS, free_bytes=4 * 2**30),
                          Place("node-a", {"kubernetes.io/hostname": "node-a"}),
                          [storage_class("local", LOCAL, mode="WaitForFirstConsumer")]):
        yield rig


async def _rig(driver: FakeDriver, place: Place, classes: list[dict[str, Any]]) -> AsyncIterator[Rig]:
    api = FakeAPI()
    for sc in classes:
        api.put(STORAGE, "storageclasses", sc)
    prov = Provisioner({driver.name: driver}, place, capacity_period=30.0, pv_create_backoff=0.1)
    prov.setup(api.ctx)
    stub_events(prov, api)
    api.start()
    async with trio.open_nursery() as n:
        n.start_soon(prov.run, api.ctx)
        yield Rig(api, prov, driver)
        n.cancel_scope.cancel()


# -- provisioning -------------------------------------------------------------------------

async def test_provisions_a_claim(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.api.put("v1", "persistentvolumeclaims", claim("data", CENTRAL, "fast", size="2Gi"))
    pv = await eventually(lambda: central.pv("pvc-uid-data"), "the PV")
    assert pv["spec"]["claimRef"]["uid"] == "uid-data"
    assert pv["spec"]["capacity"] == {"storage": "2Gi"}
    assert pv["spec"]["csi"]["driver"] == CENTRAL
    assert pv["spec"]["csi"]["volumeHandle"] == "vol-pvc-uid-data"
    assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == CENTRAL
    assert pv["metadata"]["finalizers"] == [PROVISIONER_FINALIZER]
    assert central.driver.volumes == {"pvc-uid-data": 2 * 2**30}
    await eventually(lambda: "ProvisioningSucceeded" in central.api.events.reasons("data"), "the event")
    assert central.api.events.reasons("data") == ["Provisioning", "ProvisioningSucceeded"]
    assert central.api.events.messages("Provisioning") == [
        'External provisioner is provisioning volume for claim "ns/data"']
    assert central.api.events.messages("ProvisioningSucceeded") == [
        "Successfully provisioned volume pvc-uid-data"]
    assert {c for c, *_ in central.api.events.items} == {f"{CENTRAL}_fleet-server"}
    # The PV exists: a later look at the claim makes nothing more.
    central.prov.claim_loop.queue.add("ns/data")
    await trio.sleep(1)
    assert central.driver.count("create_volume") == 1


async def test_claim_of_a_missing_class_waits_for_it(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.api.put("v1", "persistentvolumeclaims", claim("late", CENTRAL, "later"))
    await trio.sleep(5)
    assert central.pv("pvc-uid-late") is None and central.driver.count("create_volume") == 0
    central.api.put(STORAGE, "storageclasses", storage_class("later", CENTRAL))
    await eventually(lambda: central.pv("pvc-uid-late"), "the PV once the class exists")


async def test_node_instance_takes_only_its_node(local: Rig, autojump_clock: trio.testing.MockClock) -> None:
    local.api.put("v1", "persistentvolumeclaims", claim("mine", LOCAL, "local", node="node-a"))
    local.api.put("v1", "persistentvolumeclaims", claim("theirs", LOCAL, "local", node="node-b"))
    local.api.put("v1", "persistentvolumeclaims", claim("unscheduled", LOCAL, "local"))
    pv = await eventually(lambda: local.pv("pvc-uid-mine"), "the PV")
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}]
    await trio.sleep(5)
    assert local.pv("pvc-uid-theirs") is None and local.pv("pvc-uid-unscheduled") is None
    assert [c[1].name for c in local.driver.calls if c[0] == "create_volume"] == ["pvc-uid-mine"]


async def test_full_node_gives_the_selected_node_back(local: Rig, autojump_clock: trio.testing.MockClock) -> None:
    """A claim asking more than the node has: Pending, an event naming why, and the
    selected node removed so the scheduler picks another — never a crash."""
    local.api.put("v1", "persistentvolumeclaims", claim("huge", LOCAL, "local", node="node-a", size="100Gi"))
    await eventually(lambda: "volume.kubernetes.io/selected-node" not in
                     (local.claim("huge") or {})["metadata"]["annotations"], "the annotation removed")
    assert local.pv("pvc-uid-huge") is None and local.driver.volumes == {}
    assert local.api.events.messages("ProvisioningFailed") == [
        'failed to provision volume with StorageClass "local": rpc error: code = ResourceExhausted '
        "desc = not enough space on node: 107374182400 bytes asked, 4294967296 free"]
    assert local.claim("huge")["status"]["phase"] == "Pending"
    await trio.sleep(60)
    assert local.driver.count("create_volume") == 1  # no longer ours until a node is picked again


async def test_transient_failures_are_retried_with_back_off(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.driver.errors["create_volume"] = [DriverError(Code.UNAVAILABLE, "busy")] * 4
    start = trio.current_time()
    central.api.put("v1", "persistentvolumeclaims", claim("data", CENTRAL, "fast"))
    await eventually(lambda: central.pv("pvc-uid-data"), "the PV after the retries")
    assert central.driver.count("create_volume") == 5
    # WorkQueue back-off: 5 ms, 10 ms, 20 ms, 40 ms between the attempts.
    assert trio.current_time() - start >= 0.075
    assert central.api.events.reasons("data").count("ProvisioningFailed") == 4
    assert central.api.events.reasons("data")[-1] == "ProvisioningSucceeded"


async def test_pv_that_cannot_be_created_deletes_the_volume(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    """Never a half-made volume: the volume goes again, then the next try succeeds."""
    central.api.fail[("create", "persistentvolumes")] = [api_error(500, "etcd is sad")] * 5
    central.api.put("v1", "persistentvolumeclaims", claim("data", CENTRAL, "fast"))
    await eventually(lambda: central.driver.count("delete_volume") == 1, "the volume deleted")
    assert central.api.events.messages("ProvisioningFailed")[0] == (
        "Error creating provisioned PV object for claim ns/data: etcd is sad. Deleting the volume.")
    pv = await eventually(lambda: central.pv("pvc-uid-data"), "the PV on the next attempt")
    assert central.driver.volumes == {"pvc-uid-data": 2**30}
    assert pv["spec"]["csi"]["volumeHandle"] == "vol-pvc-uid-data"


async def test_refused_claim_gets_one_event(local: Rig, autojump_clock: trio.testing.MockClock) -> None:
    local.api.put("v1", "persistentvolumeclaims", claim("blk", LOCAL, "local", node="node-a", mode="Block"))
    await eventually(lambda: local.api.events.reasons("blk"), "the event")
    await trio.sleep(30)
    assert local.api.events.messages("ProvisioningFailed") == [
        f"{LOCAL} does not support block volume provisioning"]
    assert local.driver.count("create_volume") == 0


# -- deletion -----------------------------------------------------------------------------

def released(name: str, driver: str, *, policy: str = "Delete", node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": policy,
                            "csi": {"driver": driver, "volumeHandle": f"vol-{name}"},
                            "claimRef": {"namespace": "ns", "name": "gone", "uid": "uid-gone"},
                            "storageClassName": "fast"}
    if node:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": driver},
                         "finalizers": ["kubernetes.io/pv-protection", PROVISIONER_FINALIZER]},
            "spec": spec, "status": {"phase": "Released"}}


async def test_released_volume_is_deleted(local: Rig, autojump_clock: trio.testing.MockClock) -> None:
    local.driver.volumes["pvc-x"] = 2**30
    local.api.put("v1", "persistentvolumes", released("pvc-x", LOCAL, node="node-a"))
    local.api.put("v1", "persistentvolumes", released("pvc-elsewhere", LOCAL, node="node-b"))
    await eventually(lambda: local.driver.count("delete_volume") == 1, "delete_volume")
    pv = await eventually(lambda: local.pv("pvc-x"), "the PV")
    # Ours is off; the protection finalizer (the PV controller's) holds it until it lets go.
    await eventually(lambda: PROVISIONER_FINALIZER not in local.pv("pvc-x")["metadata"]["finalizers"],
                     "our finalizer removed")
    assert pv["metadata"].get("deletionTimestamp")
    assert local.driver.volumes == {}
    await trio.sleep(5)
    assert local.pv("pvc-elsewhere") is not None and local.driver.count("delete_volume") == 1


async def test_failed_delete_is_reported_and_retried(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.driver.errors["delete_volume"] = [DriverError(Code.INTERNAL, "disk busy")] * 2
    pv = released("pvc-y", CENTRAL)
    pv["metadata"]["finalizers"] = [PROVISIONER_FINALIZER]
    central.api.put("v1", "persistentvolumes", pv)
    await eventually(lambda: central.pv("pvc-y") is None, "the PV gone")
    assert central.driver.count("delete_volume") == 3
    assert central.api.events.messages("VolumeFailedDelete") == [
        "rpc error: code = Internal desc = disk busy"] * 2


async def test_retained_volume_is_kept(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.api.put("v1", "persistentvolumes", released("pvc-z", CENTRAL, policy="Retain"))
    await eventually(lambda: PROVISIONER_FINALIZER not in central.pv("pvc-z")["metadata"]["finalizers"],
                     "our finalizer off a Retain volume")
    await trio.sleep(5)
    assert central.pv("pvc-z") is not None and central.driver.count("delete_volume") == 0


# -- resizing -----------------------------------------------------------------------------

async def _bound_claim(rig: Rig, size: str) -> None:
    c = claim("grow", CENTRAL, "fast")
    rig.api.put("v1", "persistentvolumeclaims", c)
    pv = await eventually(lambda: rig.pv("pvc-uid-grow"), "the PV")
    pv["status"] = {"phase": "Bound"}
    rig.api.put("v1", "persistentvolumes", pv)
    c = rig.claim("grow")
    assert c is not None
    c["spec"]["volumeName"] = "pvc-uid-grow"
    c["status"] = {"phase": "Bound", "capacity": {"storage": "1Gi"}}
    rig.api.put("v1", "persistentvolumeclaims", c)
    await trio.sleep(1)
    assert rig.driver.count("controller_expand") == 0
    c = copy.deepcopy(rig.claim("grow"))
    c["spec"]["resources"]["requests"]["storage"] = size
    rig.api.put("v1", "persistentvolumeclaims", c)


async def test_resize_waits_for_the_node(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    await _bound_claim(central, "3Gi")
    await eventually(lambda: central.pv("pvc-uid-grow")["spec"]["capacity"]["storage"] == "3Gi", "PV grown")
    c = await eventually(lambda: (x := central.claim("grow")) and
                         any(k["type"] == "FileSystemResizePending" for k in x["status"].get("conditions") or [])
                         and x, "FileSystemResizePending")
    assert c["status"]["capacity"] == {"storage": "1Gi"}  # the node finishes it
    assert c["status"]["allocatedResources"] == {"storage": "3Gi"}
    assert c["status"]["allocatedResourceStatuses"] == {"storage": "NodeResizePending"}
    events = [(comp, r) for comp, n, _, r, _ in central.api.events.items if n == "grow" and "resizer" in comp]
    assert events == [(f"external-resizer {CENTRAL}", "Resizing"),
                      (f"external-resizer {CENTRAL}", "FileSystemResizeRequired")]
    assert central.api.events.messages("Resizing") == ["External resizer is resizing volume pvc-uid-grow"]
    await trio.sleep(5)
    assert central.driver.count("controller_expand") == 1


async def test_resize_without_node_step_finishes_the_claim(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.driver.node_expansion = False
    central.driver.errors["controller_expand"] = [DriverError(Code.UNAVAILABLE, "try later")]
    await _bound_claim(central, "2Gi")
    c = await eventually(lambda: (x := central.claim("grow")) and
                         x["status"].get("capacity") == {"storage": "2Gi"} and x, "capacity 2Gi")
    assert not c["status"].get("conditions") and not c["status"].get("allocatedResourceStatuses")
    assert central.api.events.messages("VolumeResizeFailed") == [
        'resize volume "pvc-uid-grow" by resizer "central.fleet.test" failed: '
        "rpc error: code = Unavailable desc = try later"]
    assert central.api.events.reasons("grow")[-1] == "VolumeResizeSuccessful"
    assert central.driver.count("controller_expand") == 2


# -- attaching ----------------------------------------------------------------------------

async def test_attach_and_detach(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.api.put("v1", "persistentvolumeclaims", claim("data", CENTRAL, "fast"))
    await eventually(lambda: central.pv("pvc-uid-data"), "the PV")
    central.api.put(STORAGE, "volumeattachments", {
        "apiVersion": STORAGE, "kind": "VolumeAttachment", "metadata": {"name": "csi-abc"},
        "spec": {"attacher": CENTRAL, "nodeName": "node-a", "source": {"persistentVolumeName": "pvc-uid-data"}}})
    va = await eventually(lambda: (x := central.api.get(STORAGE, "volumeattachments", "csi-abc")) and
                          (x.get("status") or {}).get("attached") and x, "attached")
    assert va["metadata"]["finalizers"] == [attacher_finalizer(CENTRAL)]
    assert va["status"]["attachmentMetadata"] == {"device": "/dev/fake0"}
    assert central.driver.published == {("vol-pvc-uid-data", "node-a"): {"device": "/dev/fake0"}}
    await central.api.delete(STORAGE, "volumeattachments", "csi-abc")
    await eventually(lambda: central.api.get(STORAGE, "volumeattachments", "csi-abc") is None, "VA gone")
    assert central.driver.published == {}


async def test_attach_error_is_recorded_then_retried(central: Rig, autojump_clock: trio.testing.MockClock) -> None:
    central.api.put("v1", "persistentvolumeclaims", claim("data", CENTRAL, "fast"))
    await eventually(lambda: central.pv("pvc-uid-data"), "the PV")
    central.driver.errors["controller_publish"] = [DriverError(Code.UNAVAILABLE, "controller down")]
    central.api.put(STORAGE, "volumeattachments", {
        "metadata": {"name": "csi-e"},
        "spec": {"attacher": CENTRAL, "nodeName": "node-a", "source": {"persistentVolumeName": "pvc-uid-data"}}})
    await eventually(lambda: ((central.api.get(STORAGE, "volumeattachments", "csi-e") or {}).get("status") or {})
                     .get("attached"), "attached after the retry")
    va = central.api.get(STORAGE, "volumeattachments", "csi-e")
    assert va is not None and va["status"].get("attachError") is None
    assert central.driver.count("controller_publish") == 2


# -- capacity -----------------------------------------------------------------------------

def _capacities(rig: Rig) -> dict[tuple[str, str], str | None]:
    return {(o["nodeTopology"]["matchLabels"]["kubernetes.io/hostname"], o["storageClassName"]): o.get("capacity")
            for o in rig.api.bucket(STORAGE, "csistoragecapacities").values()}


async def test_capacity_is_published_and_follows_provisioning(local: Rig, autojump_clock: trio.testing.MockClock) -> None:
    await eventually(lambda: _capacities(local) == {("node-a", "local"): "4Gi"}, "the first object")
    obj = next(iter(local.api.bucket(STORAGE, "csistoragecapacities").values()))
    assert obj["metadata"]["namespace"] == "kube-system"
    assert obj["metadata"]["labels"] == {"csi.storage.k8s.io/drivername": LOCAL,
                                         "csi.storage.k8s.io/managed-by": "external-provisioner-node-a"}
    local.api.put("v1", "persistentvolumeclaims", claim("mine", LOCAL, "local", node="node-a"))
    # Refreshed after the provision, well before the 30 s period.
    start = trio.current_time()
    await eventually(lambda: _capacities(local) == {("node-a", "local"): "3Gi"}, "refreshed")
    assert trio.current_time() - start < 30
    # A second class of the driver gets its own object; a deleted class loses it.
    local.api.put(STORAGE, "storageclasses", storage_class("local-xfs", LOCAL, mode="WaitForFirstConsumer"))
    await eventually(lambda: set(_capacities(local)) == {("node-a", "local"), ("node-a", "local-xfs")}, "two")
    await local.api.delete(STORAGE, "storageclasses", "local-xfs")
    await eventually(lambda: set(_capacities(local)) == {("node-a", "local")}, "one again")
    # And the period refreshes what changed behind our back.
    local.driver.free_bytes = 2**30
    await eventually(lambda: _capacities(local) == {("node-a", "local"): "1Gi"}, "periodic refresh", timeout=40)
