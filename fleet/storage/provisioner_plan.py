"""The provisioner's decisions, pure: which claim gets a volume, what PV describes it,
what a driver failure means, which volume is deleted, resized, attached, and which
CSIStorageCapacity objects should exist.

Kubernetes splits this work over four sidecars beside each CSI driver —
external-provisioner (over sig-storage-lib-external-provisioner), external-resizer,
external-attacher and the provisioner's capacity publisher.  Fleet runs them as one
loop (`fleet.storage.provisioner`) per place: in the server for drivers whose volumes
can be made from anywhere, in each agent for `node_local` drivers (the
external-provisioner's distributed provisioning: only claims whose
`volume.kubernetes.io/selected-node` is that node, only PVs pinned to it).  What the
sidecars decide lives here as functions of the objects, so it is tested table by
table; the loop only reads the caches, calls the driver and writes.

The rules follow the sidecars' code:

- **Provision** (`plan_claim`, the library's shouldProvision + provisionClaimOperation):
  an unbound claim whose `volume.kubernetes.io/storage-provisioner` annotation names
  one of our drivers, whose class exists with that provisioner, and — for a
  WaitForFirstConsumer class — that has a selected node.  The PV is `pvc-<claim uid>`
  (the idempotency key), pre-bound by a claimRef with the claim's uid.
- **Failures** (`provision_failure`, external-provisioner's checkError): a
  RESOURCE_EXHAUSTED, or any error that cannot still be in progress, on a claim with
  a selected node "reschedules" — the annotation is removed so the scheduler picks
  again (the node was full or wrong); UNAVAILABLE / INTERNAL are retried with
  back-off; INVALID_ARGUMENT is "infeasible" and retried slowly.
- **Delete** (`plan_volume`): a Released PV with reclaim policy Delete provisioned by
  one of our drivers; the `external-provisioner.volume.kubernetes.io/finalizer` is
  added to Bound Delete volumes and removed from Retain ones.
- **Resize** (`plan_resize` + `resize_status`): external-resizer's conditions and
  allocatedResourceStatuses, Resizing → FileSystemResizePending (the node finishes)
  or straight to the new capacity.
- **Attach** (`plan_attachment`): external-attacher's VolumeAttachment handling.
- **Capacity** (`plan_capacity`): one CSIStorageCapacity per (node, StorageClass of
  the driver), labelled as the external-provisioner labels its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from fleet.api import conditions
from fleet.api.kinds.metrics import format_bytes
from fleet.api.pvmatch import (
    BETA_STORAGE_PROVISIONER,
    PROVISIONED_BY,
    SELECTED_NODE,
    STORAGE_PROVISIONER,
    WAIT_FOR_FIRST_CONSUMER,
    claim_class,
    claim_request,
    quantity,
    volume_capacity,
    volume_node_name,
)
from fleet.storage.driver import (
    NODE_TOPOLOGY_KEY,
    Capabilities,
    Code,
    CreateVolumeRequest,
    DriverError,
    Volume,
)

Obj = dict[str, Any]

# sig-storage-lib-external-provisioner's finalizerPV.
PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
# The StorageClass parameter the external-provisioner turns into PV spec.csi.fsType.
FSTYPE_PARAMETER = "csi.storage.k8s.io/fstype"
# CSIStorageCapacity objects: where they live and how an instance finds its own.
CAPACITY_NAMESPACE = "kube-system"
DRIVER_NAME_LABEL = "csi.storage.k8s.io/drivername"
MANAGED_BY_LABEL = "csi.storage.k8s.io/managed-by"
# PVC conditions and allocatedResourceStatuses (external-resizer, kubelet).
RESIZING = "Resizing"
FS_RESIZE_PENDING = "FileSystemResizePending"
CONTROLLER_RESIZE_ERROR = "ControllerResizeError"
FS_RESIZE_PENDING_MESSAGE = ("Waiting for user to (re-)start a pod to finish file system resize of "
                             "volume on node.")
CONTROLLER_RESIZE_IN_PROGRESS = "ControllerResizeInProgress"
CONTROLLER_RESIZE_INFEASIBLE = "ControllerResizeInfeasible"
NODE_RESIZE_PENDING = "NodeResizePending"
# How long an "infeasible" (INVALID_ARGUMENT) claim waits before the next attempt: the
# external-provisioner delays those instead of hammering the driver.
SLOW_RETRY_SECONDS = 300.0


def _d(obj: Any, *path: str) -> dict[str, Any]:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, dict) else {}


def _md(obj: Any) -> dict[str, Any]:
    return _d(obj, "metadata")


def claim_key(claim: Mapping[str, Any]) -> str:
    """klog.KObj: "namespace/name"."""
    md = _md(claim)
    return f"{md.get('namespace') or ''}/{md.get('name') or ''}"


def pv_name_for(claim: Mapping[str, Any]) -> str:
    """getProvisionedVolumeNameForClaim: "pvc-<claim uid>"."""
    return f"pvc-{_md(claim).get('uid') or ''}"


def to_bytes(value: Decimal | None) -> int | None:
    return None if value is None else int(math.ceil(value))


def rpc_error(e: BaseException) -> str:
    """How a driver error reads in an Event: as the gRPC error a CSI sidecar prints."""
    if isinstance(e, DriverError):
        return f"rpc error: code = {e.code.value} desc = {e.message}"
    return str(e) or type(e).__name__


# ---------------------------------------------------------------------------------------
# Where an instance runs


@dataclass(frozen=True)
class Place:
    """Who a provisioner instance is: the server (node_name None) or one node."""

    node_name: str | None = None
    node_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.node_name or "fleet-server"

    @property
    def managed_by(self) -> str:
        """The CSIStorageCapacity managed-by label value of this instance."""
        return f"external-provisioner-{self.node_name}" if self.node_name else "external-provisioner"

    def serves(self, caps: Capabilities) -> bool:
        """node_local drivers are served on their nodes, the others in the server."""
        return caps.node_local == (self.node_name is not None)

    def owns_volume(self, pv: Mapping[str, Any]) -> bool:
        """A node instance looks only at volumes pinned to its node."""
        return self.node_name is None or volume_node_name(pv) == self.node_name


def volume_driver(pv: Mapping[str, Any]) -> str:
    """The driver a PV belongs to: provisioned-by, else spec.csi.driver."""
    ann = _md(pv).get("annotations") or {}
    return str(ann.get(PROVISIONED_BY) or _d(pv, "spec", "csi").get("driver") or "")


# ---------------------------------------------------------------------------------------
# Provisioning


@dataclass(frozen=True)
class Provision:
    """Make a volume for the claim and the PV describing it."""

    driver: str
    class_name: str
    storage_class: Mapping[str, Any]
    request: CreateVolumeRequest
    pv_name: str


@dataclass(frozen=True)
class Refuse:
    """The claim cannot be provisioned as it is: a ProvisioningFailed event, no retry
    until the claim changes (canProvision)."""

    message: str


@dataclass(frozen=True)
class Wait:
    """Not yet (the class is missing): retry with back-off, no event."""

    why: str


ClaimDecision = Provision | Refuse | Wait | None


def claim_provisioner(claim: Mapping[str, Any]) -> str:
    ann = _md(claim).get("annotations") or {}
    return str(ann.get(STORAGE_PROVISIONER) or ann.get(BETA_STORAGE_PROVISIONER) or "")


def plan_claim(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]],
               drivers: Mapping[str, Capabilities], place: Place, *,
               pv_exists: bool = False) -> ClaimDecision:
    """What to do about `claim` (None: nothing, it is not ours or needs no volume)."""
    md, spec = _md(claim), _d(claim, "spec")
    if md.get("deletionTimestamp") or spec.get("volumeName"):
        return None
    driver = claim_provisioner(claim)
    caps = drivers.get(driver)
    if caps is None:
        return None
    name = claim_class(claim)
    sc = classes.get(name)
    if sc is None:
        return Wait(f'storageclass.storage.k8s.io "{name}" not found')
    if sc.get("provisioner") != driver:
        return None
    node = str((md.get("annotations") or {}).get(SELECTED_NODE) or "")
    if sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER and not node:
        return None
    if place.node_name is not None and node != place.node_name:
        return None  # distributed provisioning: the selected node's agent makes it
    if pv_exists:
        return None
    mode = str(spec.get("volumeMode") or "Filesystem")
    if mode not in caps.volume_modes:
        return Refuse(f"{driver} does not support block volume provisioning" if mode == "Block"
                      else f"{driver} does not support volume mode {mode}")
    size = to_bytes(claim_request(claim))
    if size is None:
        return Refuse("claim has no storage request")
    limit = to_bytes(quantity(_d(spec, "resources", "limits").get("storage")))
    params = {str(k): str(v) for k, v in (sc.get("parameters") or {}).items()}
    req = CreateVolumeRequest(
        name=pv_name_for(claim), capacity_bytes=size, limit_bytes=limit, parameters=params,
        access_modes=tuple(str(m) for m in spec.get("accessModes") or ["ReadWriteOnce"]),
        volume_mode="Block" if mode == "Block" else "Filesystem",
        node=node or None, claim_namespace=str(md.get("namespace") or ""),
        claim_name=str(md.get("name") or ""))
    return Provision(driver=driver, class_name=name, storage_class=sc, request=req,
                     pv_name=req.name)


def check_created(volume: Volume, req: CreateVolumeRequest) -> str | None:
    """external-provisioner refuses (and deletes) a volume smaller than asked."""
    if 0 < volume.capacity_bytes < req.capacity_bytes:
        return (f"created volume capacity {volume.capacity_bytes} less than requested capacity "
                f"{req.capacity_bytes}")
    return None


def node_affinity(topology: Mapping[str, str] | None) -> dict[str, Any] | None:
    """PV spec.nodeAffinity from a volume's accessible topology (one term, all keys)."""
    if not topology:
        return None
    exprs = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(topology.items())]
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}


def build_pv(claim: Mapping[str, Any], decision: Provision, volume: Volume) -> Obj:
    """The PersistentVolume of a provisioned volume, pre-bound to its claim."""
    md, spec, sc = _md(claim), _d(claim, "spec"), decision.storage_class
    capacity = volume.capacity_bytes or decision.request.capacity_bytes
    csi: dict[str, Any] = {"driver": decision.driver, "volumeHandle": volume.volume_id}
    fs_type = str((sc.get("parameters") or {}).get(FSTYPE_PARAMETER) or "")
    if fs_type and decision.request.volume_mode == "Filesystem":
        csi["fsType"] = fs_type
    if volume.context:
        csi["volumeAttributes"] = {str(k): str(v) for k, v in volume.context.items()}
    pv_spec: dict[str, Any] = {
        "accessModes": list(decision.request.access_modes),
        "capacity": {"storage": format_bytes(capacity)},
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "namespace": md.get("namespace"), "name": md.get("name"),
                     "uid": md.get("uid"), "resourceVersion": md.get("resourceVersion")},
        "persistentVolumeReclaimPolicy": str(sc.get("reclaimPolicy") or "Delete"),
        "storageClassName": decision.class_name,
        "volumeMode": str(spec.get("volumeMode") or "Filesystem"),
        "csi": csi,
    }
    pv_spec["claimRef"] = {k: v for k, v in pv_spec["claimRef"].items() if v is not None}
    if sc.get("mountOptions"):
        pv_spec["mountOptions"] = [str(o) for o in sc["mountOptions"]]
    affinity = node_affinity(volume.accessible_topology)
    if affinity is not None:
        pv_spec["nodeAffinity"] = affinity
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": decision.pv_name,
                         "annotations": {PROVISIONED_BY: decision.driver},
                         "finalizers": [PROVISIONER_FINALIZER]},
            "spec": pv_spec}


@dataclass(frozen=True)
class Failure:
    """What a failed create_volume means: the ProvisioningFailed message, whether the
    selected node is given back to the scheduler, and when to try again."""

    message: str
    reschedule: bool = False
    retry_after: float | None = None  # None: back-off; a number: that many seconds


def provision_failure(err: BaseException, class_name: str, caps: Capabilities,
                      selected_node: str | None) -> Failure:
    """external-provisioner's error handling of CreateVolume (checkError)."""
    text = f'failed to provision volume with StorageClass "{class_name}": {rpc_error(err)}'
    if not isinstance(err, DriverError):
        # Not a driver status: the call may still be running somewhere; retry.
        return Failure(text)
    if err.code is Code.INVALID_ARGUMENT:
        return Failure("Volume provisioning failed with infeasible error. Retries will be delayed. "
                       + text, retry_after=SLOW_RETRY_SECONDS)
    may_reschedule = bool(selected_node) and (caps.node_local or bool(caps.topology_keys))
    if err.code in (Code.UNAVAILABLE,):
        return Failure(text)  # in progress / transient
    return Failure(text, reschedule=may_reschedule)


def remove_selected_node_patch(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch dropping the selected-node annotation of exactly this claim version."""
    return [{"op": "test", "path": "/metadata/resourceVersion",
             "value": _md(claim).get("resourceVersion")},
            {"op": "remove", "path": "/metadata/annotations/" + SELECTED_NODE.replace("/", "~1")}]


def finalizers_patch(obj: Mapping[str, Any], finalizers: Sequence[str]) -> list[dict[str, Any]]:
    """JSON patch setting metadata.finalizers, guarded by the version it was computed from."""
    return [{"op": "test", "path": "/metadata/resourceVersion",
             "value": _md(obj).get("resourceVersion")},
            {"op": "add", "path": "/metadata/finalizers", "value": list(finalizers)}]


# ---------------------------------------------------------------------------------------
# Deletion


@dataclass(frozen=True)
class VolumeAction:
    finalizers: list[str] | None = None   # set metadata.finalizers to this first
    delete: bool = False                  # delete_volume, then the PV


def plan_volume(pv: Mapping[str, Any], drivers: Mapping[str, Capabilities],
                place: Place) -> VolumeAction | None:
    """The library's syncVolume: finalizer upkeep, then shouldDelete."""
    driver = volume_driver(pv)
    if driver not in drivers or not place.owns_volume(pv):
        return None
    md, spec = _md(pv), _d(pv, "spec")
    policy = spec.get("persistentVolumeReclaimPolicy") or "Delete"
    phase = _d(pv, "status").get("phase")
    have = [str(f) for f in md.get("finalizers") or []]
    want = list(have)
    if policy == "Delete" and not md.get("deletionTimestamp") and phase == "Bound" \
            and PROVISIONER_FINALIZER not in want:
        want.append(PROVISIONER_FINALIZER)
    if policy in ("Retain", "Recycle") and PROVISIONER_FINALIZER in want:
        want.remove(PROVISIONER_FINALIZER)
    delete = (phase == "Released" and policy == "Delete"
              and not (md.get("deletionTimestamp") and PROVISIONER_FINALIZER not in have)
              and PROVISIONED_BY in (md.get("annotations") or {}))
    if want == have and not delete:
        return None
    return VolumeAction(finalizers=want if want != have else None, delete=delete)


# ---------------------------------------------------------------------------------------
# Resizing (external-resizer)


@dataclass(frozen=True)
class Resize:
    driver: str
    pv_name: str
    volume_id: str
    capacity_bytes: int
    context: Mapping[str, str]


def plan_resize(claim: Mapping[str, Any], pv: Mapping[str, Any] | None,
                classes: Mapping[str, Mapping[str, Any]], drivers: Mapping[str, Capabilities],
                place: Place) -> Resize | None:
    """A Bound claim asking more than it has, on a volume of ours whose class allows
    expansion, and not already waiting for the node (FileSystemResizePending)."""
    if pv is None or _d(claim, "status").get("phase") != "Bound":
        return None
    spec, status = _d(claim, "spec"), _d(claim, "status")
    if spec.get("volumeName") != _md(pv).get("name") or _md(claim).get("deletionTimestamp"):
        return None
    driver = str(_d(pv, "spec", "csi").get("driver") or "")
    if driver not in drivers or not place.owns_volume(pv):
        return None
    sc = classes.get(claim_class(claim))
    if sc is None or sc.get("allowVolumeExpansion") is not True:
        return None
    want = claim_request(claim)
    have = quantity(_d(status, "capacity").get("storage"))
    if want is None or (have is not None and want <= have):
        return None
    pv_cap = volume_capacity(pv)
    if pv_cap is not None and pv_cap >= want and \
            conditions.find(status.get("conditions"), FS_RESIZE_PENDING) is not None:
        return None  # the node finishes this one
    size = to_bytes(want)
    assert size is not None
    csi = _d(pv, "spec", "csi")
    return Resize(driver=driver, pv_name=str(_md(pv).get("name") or ""),
                  volume_id=str(csi.get("volumeHandle") or ""), capacity_bytes=size,
                  context={str(k): str(v) for k, v in (csi.get("volumeAttributes") or {}).items()})


ResizeStage = Literal["started", "failed", "node_pending", "done"]


def resize_status(claim: Mapping[str, Any], stage: ResizeStage, now: str, *,
                  size_bytes: int, message: str = "", final: bool = False) -> dict[str, Any]:
    """The claim's status merge patch at each step of a controller resize."""
    status = _d(claim, "status")
    conds: list[dict[str, Any]] = [dict(c) for c in status.get("conditions") or []
                                   if isinstance(c, dict)]
    keep = [c for c in conds if c.get("type") not in (RESIZING, FS_RESIZE_PENDING,
                                                      CONTROLLER_RESIZE_ERROR)]
    size = format_bytes(size_bytes)
    out: dict[str, Any] = {}
    if stage == "started":
        conds = conditions.set_status_condition(keep, RESIZING, "True", "", "", now)
        out = {"allocatedResources": {"storage": size},
               "allocatedResourceStatuses": {"storage": CONTROLLER_RESIZE_IN_PROGRESS}}
    elif stage == "failed":
        conds = conditions.set_status_condition(keep, CONTROLLER_RESIZE_ERROR, "True", "", message,
                                                now)
        out = {"allocatedResourceStatuses": {
            "storage": CONTROLLER_RESIZE_INFEASIBLE if final else CONTROLLER_RESIZE_IN_PROGRESS}}
    elif stage == "node_pending":
        conds = conditions.set_status_condition(keep, FS_RESIZE_PENDING, "True", "",
                                                FS_RESIZE_PENDING_MESSAGE, now)
        out = {"allocatedResources": {"storage": size},
               "allocatedResourceStatuses": {"storage": NODE_RESIZE_PENDING}}
    else:
        conds = keep
        out = {"capacity": {"storage": size}, "allocatedResources": {"storage": size},
               "allocatedResourceStatuses": None}
    for c in conds:
        c.setdefault("lastProbeTime", None)
        if not c.get("reason"):
            c.pop("reason", None)
        if not c.get("message"):
            c.pop("message", None)
    out["conditions"] = conds or None
    return {"status": out}


# ---------------------------------------------------------------------------------------
# Attaching (external-attacher)


def attacher_finalizer(driver: str) -> str:
    """external-attacher/<driver, every character outside [a-zA-Z0-9-] made '-'>."""
    name = re.sub(r"[^a-zA-Z0-9-]", "-", driver)
    if name.endswith("-"):
        name += "X"
    return f"external-attacher/{name}"


@dataclass(frozen=True)
class AttachAction:
    op: Literal["add_finalizer", "attach", "detach"]
    driver: str
    node: str
    pv_name: str


def plan_attachment(va: Mapping[str, Any], drivers: Mapping[str, Capabilities],
                    place: Place) -> AttachAction | None:
    """One step for a VolumeAttachment of ours: finalizer first, then attach; on
    deletion detach, then drop the finalizer."""
    spec, md = _d(va, "spec"), _md(va)
    driver = str(spec.get("attacher") or "")
    caps = drivers.get(driver)
    if caps is None or not caps.attach_required:
        return None
    node = str(spec.get("nodeName") or "")
    if place.node_name is not None and node != place.node_name:
        return None
    pv_name = str(_d(spec, "source").get("persistentVolumeName") or "")
    fin = attacher_finalizer(driver)
    has_fin = fin in (md.get("finalizers") or [])
    if md.get("deletionTimestamp"):
        # Detach (idempotent, so also after a failed or never-finished attach), then the
        # loop drops the finalizer.
        return AttachAction("detach", driver, node, pv_name) if has_fin else None
    if not has_fin:
        return AttachAction("add_finalizer", driver, node, pv_name)
    if _d(va, "status").get("attached") is True:
        return None
    return AttachAction("attach", driver, node, pv_name)


def attach_error(message: str, now: str) -> dict[str, Any]:
    return {"time": now, "message": message}


# ---------------------------------------------------------------------------------------
# Capacity (the external-provisioner's capacity controller)


CapacityKey = tuple[str, str]  # (node, StorageClass name)


def capacity_keys(driver: str, classes: Iterable[Mapping[str, Any]],
                  nodes: Iterable[str]) -> list[CapacityKey]:
    """Every (node, class) pair a driver's capacity is published for."""
    names = sorted(str(_md(sc).get("name") or "") for sc in classes
                   if sc.get("provisioner") == driver and not _md(sc).get("deletionTimestamp"))
    return [(node, name) for node in sorted(set(nodes)) for name in names if name]


def capacity_node(obj: Mapping[str, Any]) -> str:
    return str(_d(obj, "nodeTopology", "matchLabels").get(NODE_TOPOLOGY_KEY) or "")


def is_managed(obj: Mapping[str, Any], driver: str, place: Place) -> bool:
    labels = _md(obj).get("labels") or {}
    return labels.get(DRIVER_NAME_LABEL) == driver and labels.get(MANAGED_BY_LABEL) == place.managed_by


def new_capacity(driver: str, place: Place, key: CapacityKey, capacity: int | None) -> Obj:
    node, class_name = key
    obj: Obj = {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
                "metadata": {"generateName": "csisc-", "namespace": CAPACITY_NAMESPACE,
                             "labels": {DRIVER_NAME_LABEL: driver,
                                        MANAGED_BY_LABEL: place.managed_by}},
                "nodeTopology": {"matchLabels": {NODE_TOPOLOGY_KEY: node}},
                "storageClassName": class_name}
    if capacity is not None:
        obj["capacity"] = format_bytes(max(0, capacity))
    return obj


@dataclass
class CapacityPlan:
    create: list[Obj] = field(default_factory=list)
    update: list[tuple[Obj, dict[str, Any]]] = field(default_factory=list)  # (object, merge patch)
    delete: list[Obj] = field(default_factory=list)


def plan_capacity(driver: str, place: Place, desired: Mapping[CapacityKey, int | None],
                  existing: Iterable[Mapping[str, Any]]) -> CapacityPlan:
    """Create the missing objects, update the changed ones, delete the ones whose
    (node, class) is gone and duplicates; objects of other instances are left alone."""
    plan = CapacityPlan()
    seen: set[CapacityKey] = set()
    for obj in sorted(existing, key=lambda o: str(_md(o).get("name") or "")):
        if not is_managed(obj, driver, place):
            continue
        key = (capacity_node(obj), str(obj.get("storageClassName") or ""))
        if key not in desired or key in seen:
            plan.delete.append(dict(obj))
            continue
        seen.add(key)
        want = desired[key]
        text = format_bytes(max(0, want)) if want is not None else None
        have = obj.get("capacity")
        if (quantity(have) if have is not None else None) != (quantity(text) if text else None):
            plan.update.append((dict(obj), {"capacity": text}))
    for key in sorted(desired):
        if key not in seen:
            plan.create.append(new_capacity(driver, place, key, desired[key]))
    return plan


__all__ = [
    "CAPACITY_NAMESPACE", "CONTROLLER_RESIZE_ERROR", "DRIVER_NAME_LABEL", "FSTYPE_PARAMETER",
    "FS_RESIZE_PENDING", "FS_RESIZE_PENDING_MESSAGE", "MANAGED_BY_LABEL", "PROVISIONER_FINALIZER",
    "RESIZING", "AttachAction", "CapacityPlan", "Failure", "Place", "Provision", "Refuse", "Resize",
    "VolumeAction", "Wait", "attach_error", "attacher_finalizer", "build_pv", "capacity_keys",
    "check_created", "claim_key", "finalizers_patch", "plan_attachment", "plan_capacity",
    "plan_claim", "plan_resize", "plan_volume", "provision_failure", "pv_name_for",
    "remove_selected_node_patch", "resize_status", "rpc_error", "volume_driver",
]
