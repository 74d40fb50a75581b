"""The provisioner's pure decisions, table by table (fleet/storage/provisioner_plan.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fleet.storage.driver import Capabilities, Code, CreateVolumeRequest, DriverError, Volume
from fleet.storage.provisioner_plan import (
    CONTROLLER_RESIZE_IN_PROGRESS,
    FS_RESIZE_PENDING,
    FS_RESIZE_PENDING_MESSAGE,
    PROVISIONER_FINALIZER,
    SLOW_RETRY_SECONDS,
    AttachAction,
    Place,
    Provision,
    Refuse,
    VolumeAction,
    Wait,
    attacher_finalizer,
    build_pv,
    capacity_keys,
    check_created,
    finalizers_patch,
    plan_attachment,
    plan_capacity,
    plan_claim,
    plan_resize,
    plan_volume,
    provision_failure,
    remove_selected_node_patch,
    resize_status,
)

DRV = "fake.fleet.test"
LOCAL = "local.fleet.test"
CENTRAL_CAPS = Capabilities(volume_modes=frozenset({"Filesystem", "Block"}), expansion="online",
                            attach_required=True)
LOCAL_CAPS = Capabilities(node_local=True, topology_keys=("kubernetes.io/hostname",),
                          capacity_tracking=True, expansion="online")
CENTRAL = {DRV: CENTRAL_CAPS}
NODE_LOCAL = {LOCAL: LOCAL_CAPS}
SERVER = Place()
NODE_A = Place("node-a", {"kubernetes.io/hostname": "node-a"})


def sc(name: str = "fast", provisioner: str = DRV, *, mode: str = "Immediate", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "volumeBindingMode": mode, **fields}


def claim(name: str = "data", *, provisioner: str | None = DRV, cls: str = "fast", node: str | None = None,
          size: str = "1Gi", mode: str | None = None, volume: str | None = None, phase: str = "Pending",
          beta: bool = False, **spec: Any) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if provisioner:
        ann["volume.beta.kubernetes.io/storage-provisioner" if beta
            else "volume.kubernetes.io/storage-provisioner"] = provisioner
    if node:
        ann["volume.kubernetes.io/selected-node"] = node
    s: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "storageClassName": cls,
                         "resources": {"requests": {"storage": size}}, **spec}
    if mode:
        s["volumeMode"] = mode
    if volume:
        s["volumeName"] = volume
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7",
                         "annotations": ann},
            "spec": s, "status": {"phase": phase}}


def deleted(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


CLASSES = {"fast": sc(), "wffc": sc("wffc", mode="WaitForFirstConsumer"),
           "local": sc("local", LOCAL, mode="WaitForFirstConsumer"), "other": sc("other", "else.example")}


# -- plan_claim ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,c,drivers,place,pv_exists,want", [
    ("no provisioner annotation", claim(provisioner=None), CENTRAL, SERVER, False, None),
    ("another driver's claim", claim(provisioner="else.example", cls="other"), CENTRAL, SERVER, False, None),
    ("already bound", claim(volume="pv-1"), CENTRAL, SERVER, False, None),
    ("being deleted", deleted(claim()), CENTRAL, SERVER, False, None),
    ("class missing: wait", claim(cls="gone"), CENTRAL, SERVER, False, Wait),
    ("class of another provisioner", claim(cls="other"), CENTRAL, SERVER, False, None),
    ("WaitForFirstConsumer without a node", claim(cls="wffc"), CENTRAL, SERVER, False, None),
    ("WaitForFirstConsumer with a node", claim(cls="wffc", node="node-a"), CENTRAL, SERVER, False, Provision),
    ("Immediate", claim(), CENTRAL, SERVER, False, Provision),
    ("beta annotation", claim(beta=True), CENTRAL, SERVER, False, Provision),
    ("PV already made", claim(), CENTRAL, SERVER, True, None),
    ("node-local: this node", claim(provisioner=LOCAL, cls="local", node="node-a"), NODE_LOCAL, NODE_A,
     False, Provision),
    ("node-local: another node", claim(provisioner=LOCAL, cls="local", node="node-b"), NODE_LOCAL, NODE_A,
     False, None),
    ("node-local: no node yet", claim(provisioner=LOCAL, cls="local"), NODE_LOCAL, NODE_A, False, None),
    ("Block on a Filesystem-only driver", claim(provisioner=LOCAL, cls="local", node="node-a", mode="Block"),
     NODE_LOCAL, NODE_A, False, Refuse),
])
def test_plan_claim(name: str, c: dict[str, Any], drivers: Any, place: Place, pv_exists: bool,
                    want: type | None) -> None:
    got = plan_claim(c, CLASSES, drivers, place, pv_exists=pv_exists)
    if want is None:
        assert got is None, name
    else:
        assert isinstance(got, want), (name, got)


def test_plan_claim_request_fields() -> None:
    c = claim(cls="wffc", node="node-a", size="1536Mi", mode="Block",
              accessModes=["ReadWriteOncePod"])
    c["spec"]["resources"]["limits"] = {"storage": "2Gi"}
    classes = {"wffc": sc("wffc", mode="WaitForFirstConsumer", parameters={"tier": "gold", "n": 3})}
    got = plan_claim(c, classes, CENTRAL, SERVER)
    assert isinstance(got, Provision)
    assert got.pv_name == "pvc-uid-data" and got.driver == DRV and got.class_name == "wffc"
    assert got.request == CreateVolumeRequest(
        name="pvc-uid-data", capacity_bytes=1536 * 2**20, limit_bytes=2 * 2**30,
        parameters={"tier": "gold", "n": "3"}, access_modes=("ReadWriteOncePod",), volume_mode="Block",
        node="node-a", claim_namespace="ns", claim_name="data")


def test_refuse_block_message() -> None:
    got = plan_claim(claim(provisioner=LOCAL, cls="local", node="node-a", mode="Block"), CLASSES,
                     NODE_LOCAL, NODE_A)
    assert got == Refuse(f"{LOCAL} does not support block volume provisioning")


def test_wait_names_the_class() -> None:
    assert plan_claim(claim(cls="gone"), CLASSES, CENTRAL, SERVER) == Wait(
        'storageclass.storage.k8s.io "gone" not found')


# -- the PV -------------------------------------------------------------------------------

def test_build_pv() -> None:
    c = claim(provisioner=LOCAL, cls="local", node="node-a")
    classes = {"local": sc("local", LOCAL, mode="WaitForFirstConsumer", reclaimPolicy="Retain",
                           mountOptions=["noatime"],
                           parameters={"csi.storage.k8s.io/fstype": "xfs"})}
    decision = plan_claim(c, classes, NODE_LOCAL, NODE_A)
    assert isinstance(decision, Provision)
    vol = Volume("vol-1", 2**30, {"kubernetes.io/hostname": "node-a"}, {"path": "/x"})
    assert build_pv(c, decision, vol) == {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pvc-uid-data", "annotations": {"pv.kubernetes.io/provisioned-by": LOCAL},
                     "finalizers": [PROVISIONER_FINALIZER]},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ns",
                         "name": "data", "uid": "uid-data", "resourceVersion": "7"},
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "local",
            "volumeMode": "Filesystem", "mountOptions": ["noatime"],
            "csi": {"driver": LOCAL, "volumeHandle": "vol-1", "fsType": "xfs",
                    "volumeAttributes": {"path": "/x"}},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}]}},
        }}


def test_build_pv_defaults() -> None:
    """Delete by default, no affinity for a volume reachable everywhere, the requested size
    when the driver reports none, no fsType for Block."""
    c = claim(mode="Block")
    decision = plan_claim(c, {"fast": sc(parameters={"csi.storage.k8s.io/fstype": "ext4"})}, CENTRAL, SERVER)
    assert isinstance(decision, Provision)
    pv = build_pv(c, decision, Volume("h", 0))
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert pv["spec"]["capacity"] == {"storage": "1Gi"}
    assert pv["spec"]["csi"] == {"driver": DRV, "volumeHandle": "h"}
    assert pv["spec"]["volumeMode"] == "Block"
    assert "nodeAffinity" not in pv["spec"] and "mountOptions" not in pv["spec"]


def test_check_created() -> None:
    req = CreateVolumeRequest(name="pvc-1", capacity_bytes=2048)
    assert check_created(Volume("v", 2048), req) is None
    assert check_created(Volume("v", 0), req) is None
    assert check_created(Volume("v", 1024), req) == "created volume capacity 1024 less than requested capacity 2048"


# -- failures -----------------------------------------------------------------------------

PREFIX = 'failed to provision volume with StorageClass "fast": '


@pytest.mark.parametrize("name,err,caps,node,reschedule,retry_after", [
    ("full node, selected: give the node back", DriverError(Code.RESOURCE_EXHAUSTED, "no room"),
     LOCAL_CAPS, "node-a", True, None),
    ("full, no node to give back: keep trying", DriverError(Code.RESOURCE_EXHAUSTED, "no room"),
     LOCAL_CAPS, None, False, None),
    ("central driver without topology cannot reschedule", DriverError(Code.RESOURCE_EXHAUSTED, "x"),
     CENTRAL_CAPS, "node-a", False, None),
    ("final error with a node: reschedule", DriverError(Code.INTERNAL, "boom"), LOCAL_CAPS, "node-a",
     True, None),
    ("transient: may be in progress", DriverError(Code.UNAVAILABLE, "busy"), LOCAL_CAPS, "node-a",
     False, None),
    ("infeasible: slow retry", DriverError(Code.INVALID_ARGUMENT, "bad param"), LOCAL_CAPS, "node-a",
     False, SLOW_RETRY_SECONDS),
    ("not a driver status", RuntimeError("bug"), LOCAL_CAPS, "node-a", False, None),
])
def test_provision_failure(name: str, err: BaseException, caps: Capabilities, node: str | None,
                           reschedule: bool, retry_after: float | None) -> None:
    f = provision_failure(err, "fast", caps, node)
    assert (f.reschedule, f.retry_after) == (reschedule, retry_after), name
    assert PREFIX in f.message


def test_failure_messages() -> None:
    assert provision_failure(DriverError(Code.RESOURCE_EXHAUSTED, "not enough space"), "fast",
                             LOCAL_CAPS, "n").message == (
        PREFIX + "rpc error: code = ResourceExhausted desc = not enough space")
    assert provision_failure(DriverError(Code.INVALID_ARGUMENT, "bad"), "fast", LOCAL_CAPS, None).message == (
        "Volume provisioning failed with infeasible error. Retries will be delayed. "
        + PREFIX + "rpc error: code = InvalidArgument desc = bad")


def test_patches_are_guarded_by_the_version() -> None:
    c = claim(node="node-a")
    assert remove_selected_node_patch(c) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "remove", "path": "/metadata/annotations/volume.kubernetes.io~1selected-node"}]
    assert finalizers_patch(c, ["a"])[1] == {"op": "add", "path": "/metadata/finalizers", "value": ["a"]}


# -- volumes ------------------------------------------------------------------------------

def pv(name: str = "pvc-1", *, driver: str = DRV, phase: str = "Bound", policy: str = "Delete",
       finalizers: list[str] | None = None, provisioned: bool = True, node: str | None = None,
       capacity: str = "1Gi", claim_name: str = "data") -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "resourceVersion": "3",
                          "annotations": {"pv.kubernetes.io/provisioned-by": driver} if provisioned else {}}
    if finalizers is not None:
        md["finalizers"] = finalizers
    spec: dict[str, Any] = {"capacity": {"storage": capacity}, "persistentVolumeReclaimPolicy": policy,
                            "csi": {"driver": driver, "volumeHandle": f"vol-{name}",
                                    "volumeAttributes": {"path": "/p"}},
                            "claimRef": {"namespace": "ns", "name": claim_name, "uid": f"uid-{claim_name}"},
                            "storageClassName": "fast"}
    if node:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": md, "spec": spec,
            "status": {"phase": phase}}


F = PROVISIONER_FINALIZER


@pytest.mark.parametrize("name,vol,drivers,place,want", [
    ("Released + Delete: delete", pv(phase="Released", finalizers=[F]), CENTRAL, SERVER,
     VolumeAction(delete=True)),
    ("Released + Retain: keep, drop our finalizer", pv(phase="Released", policy="Retain", finalizers=[F, "x"]),
     CENTRAL, SERVER, VolumeAction(finalizers=["x"])),
    ("Bound + Delete without finalizer: add it", pv(finalizers=["kubernetes.io/pv-protection"]), CENTRAL,
     SERVER, VolumeAction(finalizers=["kubernetes.io/pv-protection", F])),
    ("Bound with finalizer: nothing", pv(finalizers=[F]), CENTRAL, SERVER, None),
    ("another driver's volume", pv(driver="else.example", phase="Released"), CENTRAL, SERVER, None),
    ("static CSI volume is never deleted", pv(phase="Released", provisioned=False), CENTRAL, SERVER, None),
    ("deleted and our finalizer gone: done", deleted(pv(phase="Released", finalizers=["y"])), CENTRAL,
     SERVER, None),
    ("deleted, finalizer still there: delete", deleted(pv(phase="Released", finalizers=[F])), CENTRAL,
     SERVER, VolumeAction(delete=True)),
    ("node-local volume pinned here", pv(driver=LOCAL, phase="Released", node="node-a", finalizers=[F]),
     NODE_LOCAL, NODE_A, VolumeAction(delete=True)),
    ("node-local volume of another node", pv(driver=LOCAL, phase="Released", node="node-b"), NODE_LOCAL,
     NODE_A, None),
    ("Available: nothing yet", pv(phase="Available", finalizers=[F]), CENTRAL, SERVER, None),
])
def test_plan_volume(name: str, vol: dict[str, Any], drivers: Any, place: Place,
                     want: VolumeAction | None) -> None:
    assert plan_volume(vol, drivers, place) == want, name


# -- resizing -----------------------------------------------------------------------------

def bound(size: str = "2Gi", have: str = "1Gi", **kw: Any) -> dict[str, Any]:
    c = claim(size=size, volume="pvc-1", phase="Bound", **kw)
    c["status"]["capacity"] = {"storage": have}
    return c


EXPANDABLE = {"fast": sc(allowVolumeExpansion=True)}


@pytest.mark.parametrize("name,c,vol,classes,want", [
    ("grow", bound(), pv(), EXPANDABLE, 2 * 2**30),
    ("no growth asked", bound("1Gi"), pv(), EXPANDABLE, None),
    ("class does not allow", bound(), pv(), {"fast": sc()}, None),
    ("class gone", bound(), pv(), {}, None),
    ("not Bound yet", {**bound(), "status": {"phase": "Pending"}}, pv(), EXPANDABLE, None),
    ("PV missing", bound(), None, EXPANDABLE, None),
    ("another driver's PV", bound(), pv(driver="else.example"), EXPANDABLE, None),
    ("node finishing it", {**bound(), "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                                                "conditions": [{"type": FS_RESIZE_PENDING, "status": "True"}]}},
     pv(capacity="2Gi"), EXPANDABLE, None),
    ("PV grown but claim not told, no pending condition: redo (idempotent)", bound(), pv(capacity="2Gi"),
     EXPANDABLE, 2 * 2**30),
])
def test_plan_resize(name: str, c: dict[str, Any], vol: dict[str, Any] | None, classes: Any,
                     want: int | None) -> None:
    got = plan_resize(c, vol, classes, CENTRAL, SERVER)
    assert (got.capacity_bytes if got else None) == want, name
    if got:
        assert (got.driver, got.pv_name, got.volume_id, dict(got.context)) == (
            DRV, "pvc-1", "vol-pvc-1", {"path": "/p"})


def test_resize_status_stages() -> None:
    c = bound()
    started = resize_status(c, "started", "T1", size_bytes=2 * 2**30)["status"]
    assert started["allocatedResources"] == {"storage": "2Gi"}
    assert started["allocatedResourceStatuses"] == {"storage": CONTROLLER_RESIZE_IN_PROGRESS}
    assert [(x["type"], x["status"]) for x in started["conditions"]] == [("Resizing", "True")]
    c["status"].update(started)
    pending = resize_status(c, "node_pending", "T2", size_bytes=2 * 2**30)["status"]
    assert [(x["type"], x["message"]) for x in pending["conditions"]] == [
        (FS_RESIZE_PENDING, FS_RESIZE_PENDING_MESSAGE)]
    assert pending["allocatedResourceStatuses"] == {"storage": "NodeResizePending"}
    assert "capacity" not in pending
    done = resize_status(c, "done", "T3", size_bytes=2 * 2**30)["status"]
    assert done["capacity"] == {"storage": "2Gi"}
    assert done["conditions"] is None and done["allocatedResourceStatuses"] is None
    failed = resize_status(c, "failed", "T4", size_bytes=2 * 2**30, message="m", final=True)["status"]
    assert [(x["type"], x["message"]) for x in failed["conditions"]] == [("ControllerResizeError", "m")]
    assert failed["allocatedResourceStatuses"] == {"storage": "ControllerResizeInfeasible"}


# -- attaching ----------------------------------------------------------------------------

def test_attacher_finalizer() -> None:
    assert attacher_finalizer("hostpath.fleet.dev") == "external-attacher/hostpath-fleet-dev"
    assert attacher_finalizer("a/b.") == "external-attacher/a-b-X"


def va(*, finalizers: list[str] | None = None, attached: bool | None = None, node: str = "node-a",
       driver: str = DRV) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "csi-1", "resourceVersion": "4"},
                           "spec": {"attacher": driver, "nodeName": node,
                                    "source": {"persistentVolumeName": "pvc-1"}}}
    if finalizers is not None:
        obj["metadata"]["finalizers"] = finalizers
    if attached is not None:
        obj["status"] = {"attached": attached}
    return obj


AF = attacher_finalizer(DRV)


@pytest.mark.parametrize("name,obj,drivers,place,op", [
    ("new: finalizer first", va(), CENTRAL, SERVER, "add_finalizer"),
    ("then attach", va(finalizers=[AF]), CENTRAL, SERVER, "attach"),
    ("attached: nothing", va(finalizers=[AF], attached=True), CENTRAL, SERVER, None),
    ("deleted: detach", deleted(va(finalizers=[AF], attached=True)), CENTRAL, SERVER, "detach"),
    ("deleted, never finalized: nothing", deleted(va()), CENTRAL, SERVER, None),
    ("another attacher", va(driver="else.example"), CENTRAL, SERVER, None),
    ("driver needs no attach", va(driver=LOCAL), NODE_LOCAL, NODE_A, None),
    ("node instance, another node", va(node="node-b"), {DRV: CENTRAL_CAPS}, NODE_A, None),
])
def test_plan_attachment(name: str, obj: dict[str, Any], drivers: Any, place: Place, op: str | None) -> None:
    got = plan_attachment(obj, drivers, place)
    assert (got.op if got else None) == op, name
    if got:
        assert got == AttachAction(op, DRV, "node-a", "pvc-1")  # type: ignore[arg-type]


# -- capacity -----------------------------------------------------------------------------

def cap_obj(name: str, node: str, cls: str, capacity: str | None, *, managed_by: str = "external-provisioner-node-a",
            driver: str = LOCAL) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": "kube-system",
                                        "labels": {"csi.storage.k8s.io/drivername": driver,
                                                   "csi.storage.k8s.io/managed-by": managed_by}},
                           "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node}},
                           "storageClassName": cls}
    if capacity is not None:
        obj["capacity"] = capacity
    return obj


def test_capacity_keys() -> None:
    classes = [sc("b", LOCAL), sc("a", LOCAL), sc("x", DRV), deleted(sc("gone", LOCAL))]
    assert capacity_keys(LOCAL, classes, ["node-b", "node-a"]) == [
        ("node-a", "a"), ("node-a", "b"), ("node-b", "a"), ("node-b", "b")]


def test_plan_capacity() -> None:
    desired = {("node-a", "local"): 5 * 2**30, ("node-a", "fleet-local"): 2**30, ("node-a", "new"): None}
    existing = [
        cap_obj("csisc-1", "node-a", "local", "5Gi"),             # unchanged
        cap_obj("csisc-2", "node-a", "fleet-local", "3Gi"),       # changed
        cap_obj("csisc-3", "node-a", "fleet-local", "3Gi"),       # duplicate
        cap_obj("csisc-4", "node-a", "removed-class", "1Gi"),     # stale
        cap_obj("csisc-5", "node-b", "local", "1Gi", managed_by="external-provisioner-node-b"),  # not ours
        cap_obj("csisc-6", "node-a", "local", "1Gi", driver=DRV),                               # not ours
    ]
    plan = plan_capacity(LOCAL, NODE_A, desired, existing)
    assert [(o["metadata"]["name"], p) for o, p in plan.update] == [("csisc-2", {"capacity": "1Gi"})]
    assert sorted(o["metadata"]["name"] for o in plan.delete) == ["csisc-3", "csisc-4"]
    assert plan.create == [{
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
        "metadata": {"generateName": "csisc-", "namespace": "kube-system",
                     "labels": {"csi.storage.k8s.io/drivername": LOCAL,
                                "csi.storage.k8s.io/managed-by": "external-provisioner-node-a"}},
        "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": "node-a"}},
        "storageClassName": "new"}]


def test_plan_capacity_same_value_other_spelling_is_no_update() -> None:
    plan = plan_capacity(LOCAL, NODE_A, {("node-a", "local"): 2**30},
                         [cap_obj("c", "node-a", "local", "1024Mi")])
    assert (plan.create, plan.update, plan.delete) == ([], [], [])


def test_server_place_labels() -> None:
    assert SERVER.managed_by == "external-provisioner" and SERVER.host == "fleet-server"
    assert NODE_A.managed_by == "external-provisioner-node-a"
    assert SERVER.serves(CENTRAL_CAPS) and not SERVER.serves(LOCAL_CAPS)
    assert NODE_A.serves(LOCAL_CAPS) and not NODE_A.serves(CENTRAL_CAPS)
