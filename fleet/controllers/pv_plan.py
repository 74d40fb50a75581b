"""The PersistentVolume controller's decisions, pure (kube-controller-manager's
`pv_controller.go`: syncClaim / syncVolume, bind, unbind, reclaim).

`plan_claim(claim, world)` and `plan_volume(volume, claim)` return a `Sync`: the
volume and the claim as they should be stored (None: leave as is), the Events to
record, and whether to look again.  The loop (`persistentvolume.py`) writes the
volume before the claim, each object's metadata/spec before its status, exactly as
the Kubernetes controller orders its updates, so that an interrupted bind is
finished by the next sync of either object.

* **Unbound claim, no volumeName**: a volume pre-bound to it, else the smallest
  Available volume that fits (`pvmatch.find_matching_volume`) is bound.  None:
  - a WaitForFirstConsumer claim without `volume.kubernetes.io/selected-node` is
    the scheduler's (Event WaitForFirstConsumer, or WaitForPodScheduled naming the
    pods that use it);
  - a class: `storageclass.storage.k8s.io "X" not found` (ProvisioningFailed), an
    in-tree `kubernetes.io/...` provisioner Fleet does not have (ProvisioningFailed
    `no volume plugin matched name: ...`), otherwise the claim is annotated
    `volume.kubernetes.io/storage-provisioner` (+ the beta name) with Event
    ExternalProvisioning — the provisioner loop takes it from there.  An Immediate
    claim of a node-local driver (Fleet's addition: there is no scheduler decision
    to wait for) also gets `volume.kubernetes.io/selected-node`: a Ready node whose
    CSINode lists the driver, most published capacity first;
  - no class: FailedBinding "no persistent volumes available for this claim and no
    storage class is set".
* **Claim with volumeName**: bound to that volume when it is free and fits (else
  VolumeMismatch), finished when the volume already points at it, FailedBinding
  when another claim holds it; Pending while the volume does not exist.
* **Bound claim** (bind-completed): re-bound when the volume lost its claimRef,
  Lost when the volume vanished or its volumeName was cleared, ClaimMisbound when
  the volume belongs to another claim.
* **Volume**: Available without claimRef (or pre-bound, uid not set yet); Bound
  when its claim points back; a claim gone → Released, then the reclaim policy:
  Retain keeps it, Delete is the provisioner's for dynamically provisioned
  volumes (`pv.kubernetes.io/provisioned-by`) and fails ("no deletable volume
  plugin matched", VolumeFailedDelete) for a static one; a volume the controller
  bound to a claim that went elsewhere is unbound.
* **Retroactive default class**: an unbound claim with no storageClassName at all
  gets the default class once one exists.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from fleet.api import pvmatch as pm
from fleet.storage.driver import Capabilities

Obj = Mapping[str, Any]

# Event reasons (pkg/controller/volume/events).
FAILED_BINDING = "FailedBinding"
VOLUME_MISMATCH = "VolumeMismatch"
PROVISIONING_FAILED = "ProvisioningFailed"
EXTERNAL_PROVISIONING = "ExternalProvisioning"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
WAIT_FOR_POD_SCHEDULED = "WaitForPodScheduled"
VOLUME_FAILED_DELETE = "VolumeFailedDelete"
CLAIM_LOST = "ClaimLost"
CLAIM_MISBOUND = "ClaimMisbound"
VOLUME_UNKNOWN_RECLAIM_POLICY = "VolumeUnknownReclaimPolicy"

NO_CLASS_MESSAGE = "no persistent volumes available for this claim and no storage class is set"
WAIT_MESSAGE = "waiting for first consumer to be created before binding"
NOT_DELETABLE = "no deletable volume plugin matched"
EXTERNAL_MESSAGE = ("Waiting for a volume to be created either by the external provisioner '{}' "
                    "or manually by the system administrator. If volume creation is delayed, please "
                    "verify that the provisioner is running and correctly registered.")
NO_NODE_MESSAGE = ("no Ready node runs the storage driver '{}' (a CSINode listing it) "
                   "with room for the claim; waiting")

# How often a claim still Pending is looked at again (the PV controller's resync period).
RESYNC = 15.0


@dataclass
class Sync:
    """What one sync decided.  `volume`/`claim` are whole objects to store (metadata,
    spec and status as they should be), None to leave the stored one alone."""

    volume: dict[str, Any] | None = None
    claim: dict[str, Any] | None = None
    # (on "claim" | "volume", type, reason, message)
    events: list[tuple[str, str, str, str]] = field(default_factory=list)
    requeue: float | None = None
    enqueue_claim: str | None = None  # "ns/name": sync this claim soon
    error: str | None = None          # an inconsistency to report and retry with back-off
    waiting_for_node: bool = False    # a node-local Immediate claim found no node yet


@dataclass
class World:
    """What a claim sync reads besides the claim: caches, as plain data."""

    volumes: Mapping[str, Obj] = field(default_factory=dict)          # by name
    classes: Mapping[str, Obj] = field(default_factory=dict)          # by name
    nodes: Sequence[Obj] = ()
    csinodes: Mapping[str, Obj] = field(default_factory=dict)         # by node name
    capacities: Sequence[Obj] = ()                                    # CSIStorageCapacity
    capabilities: Callable[[str], Capabilities | None] = lambda name: None
    unscheduled_pods: Sequence[str] = ()  # pods using the claim, not scheduled yet
    now: str = ""                          # RFC 3339, for lastPhaseTransitionTime


def _md(obj: Obj) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def _spec(obj: Obj) -> dict[str, Any]:
    s = obj.get("spec")
    return s if isinstance(s, dict) else {}


def _status(obj: Obj) -> dict[str, Any]:
    s = obj.get("status")
    return s if isinstance(s, dict) else {}


def _ann(obj: Obj) -> dict[str, Any]:
    a = _md(obj).get("annotations")
    return a if isinstance(a, dict) else {}


def _name(obj: Obj) -> str:
    return str(_md(obj).get("name") or "")


def claim_key(claim: Obj) -> str:
    return f"{_md(claim).get('namespace') or ''}/{_name(claim)}"


def claimref_key(pv: Obj) -> str:
    ref = _spec(pv).get("claimRef") or {}
    return f"{ref.get('namespace') or ''}/{ref.get('name') or ''}"


def _set_ann(obj: dict[str, Any], key: str, value: str) -> None:
    obj.setdefault("metadata", {}).setdefault("annotations", {})
    if obj["metadata"]["annotations"] is None:
        obj["metadata"]["annotations"] = {}
    obj["metadata"]["annotations"][key] = value


# ---------------------------------------------------------------------------------------
# Object edits (each returns a changed copy, or the same object when nothing changes)


def with_volume_phase(pv: Obj, phase: str, now: str, message: str = "") -> dict[str, Any]:
    """updateVolumePhase: nothing when the phase is already `phase`; otherwise the phase,
    the message (cleared when none) and lastPhaseTransitionTime."""
    out = copy.deepcopy(dict(pv))
    if not isinstance(out.get("status"), dict):
        out["status"] = {}
    st = out["status"]
    if st.get("phase") == phase:
        return out
    st["phase"] = phase
    if now:
        st["lastPhaseTransitionTime"] = now
    if message:
        st["message"] = message
    else:
        st.pop("message", None)
    return out


def with_claim_status(claim: Obj, phase: str, volume: Obj | None) -> dict[str, Any]:
    """updateClaimStatus: phase; Bound copies the volume's access modes, and its capacity
    only when the claim becomes Bound (a later difference is a resize in progress)."""
    out = copy.deepcopy(dict(claim))
    if not isinstance(out.get("status"), dict):
        out["status"] = {}
    st = out["status"]
    if volume is None:
        st.pop("accessModes", None)
        st.pop("capacity", None)
    else:
        modes = list(_spec(volume).get("accessModes") or [])
        if st.get("accessModes") != modes:
            st["accessModes"] = modes
        if st.get("phase") != phase:
            vcap = pm.volume_capacity(volume)
            ccap = pm.quantity((st.get("capacity") or {}).get("storage"))
            if ccap is None or vcap != ccap:
                st["capacity"] = dict(_spec(volume).get("capacity") or {})
    st["phase"] = phase
    return out


def bind_claim_to_volume(claim: Obj, pv: Obj) -> dict[str, Any]:
    """bindClaimToVolume: volumeName (bound-by-controller when we chose it), bind-completed."""
    out = copy.deepcopy(dict(claim))
    if _spec(claim).get("volumeName") != _name(pv):
        out.setdefault("spec", {})["volumeName"] = _name(pv)
        if pm.BOUND_BY_CONTROLLER not in _ann(claim):
            _set_ann(out, pm.BOUND_BY_CONTROLLER, "yes")
    if pm.BIND_COMPLETED not in _ann(claim):
        _set_ann(out, pm.BIND_COMPLETED, "yes")
    return out


def _changed(new: dict[str, Any], old: Obj) -> dict[str, Any] | None:
    return None if new == old else new


def bind(pv: Obj, claim: Obj, now: str) -> Sync:
    """ctrl.bind: the volume points at the claim and is Bound; the claim names the
    volume, is bind-completed and Bound with the volume's modes and capacity."""
    vol = with_volume_phase(pm.bind_volume_to_claim(pv, claim)[0], "Bound", now)
    clm = with_claim_status(bind_claim_to_volume(claim, vol), "Bound", vol)
    return Sync(volume=_changed(vol, pv), claim=_changed(clm, claim))


def _pending(claim: Obj, sync: Sync | None = None) -> Sync:
    out = sync or Sync()
    new = with_claim_status(claim, "Pending", None)
    out.claim = _changed(new, claim)
    if out.requeue is None:
        out.requeue = RESYNC
    return out


# ---------------------------------------------------------------------------------------
# Claims


def retroactive_default_class(claim: Obj, classes: Mapping[str, Obj]) -> str | None:
    """The default class an unbound claim with no storageClassName at all (nil, not "")
    should get, or None (RetroactiveDefaultStorageClass)."""
    if "storageClassName" in _spec(claim) and _spec(claim).get("storageClassName") is not None:
        return None
    if pm.BETA_STORAGE_CLASS in _ann(claim) or _spec(claim).get("volumeName"):
        return None
    sc = pm.default_class(classes.values())
    return _name(sc) if sc is not None else None


def plan_claim(claim: Obj, world: World) -> Sync:
    """syncClaim."""
    if pm.BIND_COMPLETED not in _ann(claim):
        default = retroactive_default_class(claim, world.classes)
        if default is not None:
            out = copy.deepcopy(dict(claim))
            out.setdefault("spec", {})["storageClassName"] = default
            # The claim is written first; the next sync (its update event) binds it.
            return Sync(claim=out)
        return _sync_unbound_claim(claim, world)
    return _sync_bound_claim(claim, world)


def _sync_bound_claim(claim: Obj, world: World) -> Sync:
    name = _spec(claim).get("volumeName")
    if not name:
        return _lost(claim, CLAIM_LOST, "Bound claim has lost reference to PersistentVolume. "
                                        "Data on the volume is lost!")
    pv = world.volumes.get(str(name))
    if pv is None:
        return _lost(claim, CLAIM_LOST, "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
    ref = _spec(pv).get("claimRef")
    if not ref or ref.get("uid") == _md(claim).get("uid"):
        return bind(pv, claim, world.now)
    return _lost(claim, CLAIM_MISBOUND, "Two claims are bound to the same volume, this one is bound incorrectly")


def _lost(claim: Obj, reason: str, message: str) -> Sync:
    new = with_claim_status(claim, "Lost", None)
    if new == claim:
        return Sync()
    return Sync(claim=new, events=[("claim", "Warning", reason, message)])


def _sync_unbound_claim(claim: Obj, world: World) -> Sync:
    wanted = _spec(claim).get("volumeName")
    if not wanted:
        delay = pm.delays_binding(claim, world.classes)
        pv = pm.find_matching_volume(claim, world.volumes.values(), delay_binding=delay)
        if pv is not None:
            return bind(pv, claim, world.now)
        if delay and pm.SELECTED_NODE not in _ann(claim):
            return _pending(claim, Sync(events=[_wait_event(world.unscheduled_pods)]))
        if pm.claim_class(claim):
            return provision(claim, world)
        return _pending(claim, Sync(events=[("claim", "Normal", FAILED_BINDING, NO_CLASS_MESSAGE)]))
    pv = world.volumes.get(str(wanted))
    if pv is None:
        return _pending(claim)
    if not _spec(pv).get("claimRef"):
        why = mismatch(pv, claim)
        if why:
            return _pending(claim, Sync(events=[
                ("claim", "Warning", VOLUME_MISMATCH, f"Cannot bind to requested volume {wanted!r}: {why}")]))
        return bind(pv, claim, world.now)
    if pm.is_volume_bound_to_claim(pv, claim):
        return bind(pv, claim, world.now)
    msg = f"volume {wanted!r} already bound to a different claim."
    sync = Sync(events=[("claim", "Warning", FAILED_BINDING, msg)])
    if pm.BOUND_BY_CONTROLLER in _ann(claim):
        sync.error = (f"invalid binding of claim {claim_key(claim)!r} to volume {wanted!r}: "
                      f"volume already claimed by {claimref_key(pv)!r}")
        return sync
    return _pending(claim, sync)


def _wait_event(pods: Sequence[str]) -> tuple[str, str, str, str]:
    """emitEventForUnboundDelayBindingClaim."""
    if not pods:
        return ("claim", "Normal", WAIT_FOR_FIRST_CONSUMER, WAIT_MESSAGE)
    names = sorted(pods)
    if len(names) > 1:
        return ("claim", "Normal", WAIT_FOR_POD_SCHEDULED, f"waiting for pods {','.join(names)} to be scheduled")
    return ("claim", "Normal", WAIT_FOR_POD_SCHEDULED, f"waiting for pod {names[0]} to be scheduled")


def mismatch(pv: Obj, claim: Obj) -> str:
    """checkVolumeSatisfyClaim's message ("" when the volume satisfies the claim)."""
    want, have = pm.claim_request(claim), pm.volume_capacity(pv)
    if want is None or have is None or have < want:
        return "requested PV is too small"
    if pm.volume_class(pv) != pm.claim_class(claim):
        return "storageClassName does not match"
    if (_spec(pv).get("volumeMode") or "Filesystem") != (_spec(claim).get("volumeMode") or "Filesystem"):
        return "incompatible volumeMode"
    if not pm.access_modes_contain(_spec(pv).get("accessModes") or [], _spec(claim).get("accessModes") or []):
        return "incompatible accessMode"
    return ""


def provision(claim: Obj, world: World) -> Sync:
    """provisionClaim for an external (CSI-style) provisioner: annotate the claim so the
    provisioner takes it; a node-local Immediate claim also gets its node."""
    cls = pm.claim_class(claim)
    sc = world.classes.get(cls)
    if sc is None:
        return _pending(claim, Sync(events=[
            ("claim", "Warning", PROVISIONING_FAILED, f'storageclass.storage.k8s.io "{cls}" not found')]))
    provisioner = str(sc.get("provisioner") or "")
    if provisioner.startswith("kubernetes.io/"):
        return _pending(claim, Sync(events=[
            ("claim", "Warning", PROVISIONING_FAILED, f"no volume plugin matched name: {provisioner}")]))
    out = copy.deepcopy(dict(claim))
    ann = _ann(claim)
    if ann.get(pm.STORAGE_PROVISIONER) != provisioner or ann.get(pm.BETA_STORAGE_PROVISIONER) != provisioner:
        _set_ann(out, pm.STORAGE_PROVISIONER, provisioner)
        _set_ann(out, pm.BETA_STORAGE_PROVISIONER, provisioner)
    sync = Sync(events=[("claim", "Normal", EXTERNAL_PROVISIONING, EXTERNAL_MESSAGE.format(provisioner))])
    if pm.SELECTED_NODE not in ann and not pm.delays_binding(claim, world.classes):
        caps = world.capabilities(provisioner)
        if caps is not None and caps.node_local:
            node = select_node(provisioner, cls, pm.claim_request(claim), world.nodes, world.csinodes,
                               world.capacities, tracks_capacity=caps.capacity_tracking)
            if node is None:
                sync.events = [("claim", "Warning", PROVISIONING_FAILED, NO_NODE_MESSAGE.format(provisioner))]
                sync.waiting_for_node = True
            else:
                _set_ann(out, pm.SELECTED_NODE, node)
    new = with_claim_status(out, "Pending", None)
    sync.claim = _changed(new, claim)
    sync.requeue = RESYNC
    return sync


# ---------------------------------------------------------------------------------------
# Node selection for node-local Immediate claims


def node_ready(node: Obj) -> bool:
    if _spec(node).get("unschedulable"):
        return False
    for c in _status(node).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def node_capacity(node: Obj, class_name: str, capacities: Sequence[Obj]) -> Decimal | None:
    """The biggest volume CSIStorageCapacity objects of `class_name` allow on `node`
    (`pvmatch.capacity_limit`: maximumVolumeSize when set, else capacity), None when
    none is published for it."""
    labels = _md(node).get("labels") or {}
    best: Decimal | None = None
    for cap in capacities:
        if cap.get("storageClassName") != class_name or not pm.capacity_admits_node(cap, labels):
            continue
        room = pm.capacity_limit(cap)
        if room is not None:
            best = room if best is None else max(best, room)
    return best


def select_node(driver: str, class_name: str, request: Decimal | None, nodes: Sequence[Obj],
                csinodes: Mapping[str, Obj], capacities: Sequence[Obj], *,
                tracks_capacity: bool = False) -> str | None:
    """A Ready, schedulable node whose CSINode lists `driver`.  Nodes with published
    room for the request come first (most room first), then nodes with nothing
    published yet (unless the driver tracks capacity: then they do not qualify);
    nodes whose published room is too small never qualify.  Ties by name."""
    ranked: list[tuple[int, Decimal, str]] = []
    for node in nodes:
        name = _name(node)
        if not name or not node_ready(node) or not pm.csinode_has_driver(csinodes.get(name), driver):
            continue
        room = node_capacity(node, class_name, capacities)
        if room is None:
            if tracks_capacity:
                continue
            ranked.append((1, Decimal(0), name))
        elif request is None or room >= request:
            ranked.append((0, -room, name))
    return min(ranked)[2] if ranked else None


# ---------------------------------------------------------------------------------------
# Volumes


def plan_volume(pv: Obj, claim: Obj | None, now: str = "") -> Sync:
    """syncVolume.  `claim` is the claim the volume's claimRef names (by namespace and
    name, whatever its uid), None when it does not exist."""
    ref = _spec(pv).get("claimRef")
    if not ref:
        return Sync(volume=_changed(with_volume_phase(pv, "Available", now), pv))
    if not ref.get("uid"):
        # Pre-bound to a claim that has not bound yet: the claim's sync does it.
        return Sync(volume=_changed(with_volume_phase(pv, "Available", now), pv),
                    enqueue_claim=claimref_key(pv) if claim is not None else None)
    if claim is not None and _md(claim).get("uid") != ref.get("uid"):
        claim = None  # deleted, and another claim of that name created
    if claim is None:
        return _released(pv, now)
    cspec = _spec(claim)
    if not cspec.get("volumeName"):
        if (cspec.get("volumeMode") or "Filesystem") != (_spec(pv).get("volumeMode") or "Filesystem"):
            return Sync(events=[
                ("volume", "Warning", VOLUME_MISMATCH,
                 f"Cannot bind PersistentVolume to requested PersistentVolumeClaim {_name(claim)!r} "
                 "due to incompatible volumeMode."),
                ("claim", "Warning", VOLUME_MISMATCH,
                 f"Cannot bind PersistentVolume {_name(pv)!r} to requested PersistentVolumeClaim "
                 "due to incompatible volumeMode.")])
        return Sync(enqueue_claim=claim_key(claim))
    if cspec.get("volumeName") == _name(pv):
        return Sync(volume=_changed(with_volume_phase(pv, "Bound", now), pv))
    # The claim is bound to another volume.
    if pm.PROVISIONED_BY in _ann(pv) and _spec(pv).get("persistentVolumeReclaimPolicy") == "Delete":
        return _released(pv, now)
    return Sync(volume=_changed(unbind_volume(pv, now), pv))


def unbind_volume(pv: Obj, now: str) -> dict[str, Any]:
    """unbindVolume: a volume the controller bound loses its claimRef (and the
    annotation); one pre-bound by its creator keeps the claimRef without the uid."""
    out = copy.deepcopy(dict(pv))
    if pm.BOUND_BY_CONTROLLER in _ann(pv):
        out["spec"].pop("claimRef", None)
        out["metadata"]["annotations"].pop(pm.BOUND_BY_CONTROLLER, None)
    else:
        out["spec"]["claimRef"] = {k: v for k, v in out["spec"]["claimRef"].items() if k != "uid"}
    return with_volume_phase(out, "Available", now)


def _released(pv: Obj, now: str) -> Sync:
    """The claim is gone: Released (a Failed volume stays Failed), then reclaimVolume."""
    phase = _status(pv).get("phase")
    vol = dict(pv) if phase in ("Released", "Failed") else with_volume_phase(pv, "Released", now)
    sync = Sync()
    policy = _spec(pv).get("persistentVolumeReclaimPolicy") or "Retain"
    if policy == "Retain":
        pass
    elif policy == "Delete":
        if pm.PROVISIONED_BY not in _ann(pv) and phase != "Failed":
            # A static volume: Fleet has no in-tree deleter (Kubernetes' "find a
            # deletable plugin by spec" finds none for CSI and local volumes).
            vol = with_volume_phase(vol, "Failed", now, NOT_DELETABLE)
            sync.events.append(("volume", "Warning", VOLUME_FAILED_DELETE, NOT_DELETABLE))
        # Dynamically provisioned: the provisioner loop deletes the volume and the PV.
    elif phase != "Failed":
        msg = "Volume has unrecognized PersistentVolumeReclaimPolicy"
        vol = with_volume_phase(vol, "Failed", now, msg)
        sync.events.append(("volume", "Warning", VOLUME_UNKNOWN_RECLAIM_POLICY, msg))
    sync.volume = _changed(vol, pv)
    return sync


__all__ = ["RESYNC", "Sync", "World", "bind", "bind_claim_to_volume", "claim_key", "claimref_key", "mismatch", "node_capacity", "plan_claim", "plan_volume",
           "provision", "retroactive_default_class", "select_node", "unbind_volume", "with_claim_status",
           "with_volume_phase"]
