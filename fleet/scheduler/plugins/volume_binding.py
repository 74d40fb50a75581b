"""VolumeBinding: pods whose volumes need PersistentVolumeClaims wait for usable claims.

This is the hook point for the storage work: today it checks what the
scheduler can know from claims alone, with kube-scheduler's wording, so
users see the messages they already know:

- a claim that does not exist: `persistentvolumeclaim "x" not found`
  (a generic ephemeral volume's claim, named `<pod>-<volume>`, gets
  "waiting for ephemeral volume controller to create the persistentvolumeclaim \"x\"",
  and one not owned by the pod "PVC ns/x was not created for pod ns/p (pod is not owner)");
- a claim being deleted, or Lost: refused;
- an unbound claim whose StorageClass binds immediately (or no class):
  "pod has unbound immediate PersistentVolumeClaims" — the PV controller
  binds it, and the pod is retried once the claim changes.

All are pre-filter rejections (the answer is the same for every node) and
unresolvable (evicting pods does not create claims).  Claims with
`volumeBindingMode: WaitForFirstConsumer` and bound claims pass: matching
PersistentVolumes to nodes (volume node affinity, topology-aware
provisioning) needs PV objects and arrives with the storage issue, as a
`filter` here.  A claim counts as bound when `spec.volumeName` is set and it
is Bound (status.phase) or carries the `pv.kubernetes.io/bind-completed`
annotation.

Until the snapshot has listed claims (`Snapshot.pvcs_synced`), a missing
claim proves nothing and the plugin stays out of the way.  Pods without
claims skip it.
"""

from __future__ import annotations

from typing import Any

from fleet.api.owners import is_controlled_by
from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.plugins._cycle import cycle_snapshot
from fleet.scheduler.snapshot import NodeInfo, Snapshot

UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


def not_found(name: str) -> str:
    return f'persistentvolumeclaim "{name}" not found'


def pod_claims(pod: dict[str, Any]) -> list[tuple[str, bool]]:
    """(claim name, is a generic ephemeral volume) for every claim-backed volume."""
    md = pod.get("metadata") or {}
    out = []
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(vol, dict):
            continue
        if isinstance(vol.get("persistentVolumeClaim"), dict):
            out.append((str(vol["persistentVolumeClaim"].get("claimName") or ""), False))
        elif isinstance(vol.get("ephemeral"), dict):
            out.append((f"{md.get('name', '')}-{vol.get('name', '')}", True))
    return out


def is_bound(pvc: dict[str, Any]) -> bool:
    if not (pvc.get("spec") or {}).get("volumeName"):
        return False
    annotations = (pvc.get("metadata") or {}).get("annotations") or {}
    return (pvc.get("status") or {}).get("phase") == "Bound" or BIND_COMPLETED in annotations


def delays_binding(pvc: dict[str, Any], snap: Snapshot) -> bool:
    """WaitForFirstConsumer class: binding waits for the scheduler (an unknown class binds immediately)."""
    spec = pvc.get("spec") or {}
    class_name = spec.get("storageClassName")
    if class_name is None:
        class_name = ((pvc.get("metadata") or {}).get("annotations") or {}).get(
            "volume.beta.kubernetes.io/storage-class")
    if not class_name:
        return False
    sc = snap.storage_class(str(class_name))
    return sc is not None and sc.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER


def _owned_by(pvc: dict[str, Any], pod: dict[str, Any]) -> bool:
    return is_controlled_by(pvc, str((pod.get("metadata") or {}).get("uid")))


def claim_problem(pod: dict[str, Any], snap: Snapshot) -> str | None:
    """Why the pod's claims keep it from being scheduled anywhere, or None."""
    md = pod.get("metadata") or {}
    ns, pod_name = str(md.get("namespace") or ""), str(md.get("name") or "")
    unbound_immediate = False
    for name, ephemeral in pod_claims(pod):
        pvc = snap.pvc(ns, name)
        if pvc is None:
            if ephemeral:
                return f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{name}"'
            return not_found(name)
        if (pvc.get("status") or {}).get("phase") == "Lost":
            volume = (pvc.get("spec") or {}).get("volumeName") or ""
            return f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{volume}"'
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            return f'persistentvolumeclaim "{name}" is being deleted'
        if ephemeral and not _owned_by(pvc, pod):
            return f"PVC {ns}/{name} was not created for pod {ns}/{pod_name} (pod is not owner)"
        if not is_bound(pvc) and not delays_binding(pvc, snap):
            unbound_immediate = True
    return UNBOUND_IMMEDIATE if unbound_immediate else None


class VolumeBinding:
    name = "VolumeBinding"

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        if not pod_claims(pod):
            return Status(Code.SKIP)
        snap = cycle_snapshot(state)
        if snap is None:
            return Status.success()  # judged per node in filter (Framework without state.snapshot)
        if not snap.pvcs_synced:
            return Status(Code.SKIP)
        problem = claim_problem(pod, snap)
        if problem is not None:
            return Status.unschedulable(problem, unresolvable=True)
        # Nothing per node can be checked until PersistentVolumes are known.
        return Status(Code.SKIP)

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        # Reached only when pre_filter could not see the snapshot.
        snap = node.snapshot
        if snap is None or not snap.pvcs_synced:
            return Status.success()
        problem = claim_problem(pod, snap)
        return Status.unschedulable(problem, unresolvable=True) if problem else Status.success()
