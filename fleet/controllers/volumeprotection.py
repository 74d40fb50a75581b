"""The pvc-protection and pv-protection controllers (StorageObjectInUseProtection's
controller half; the admission plugin adds the finalizers on create).

* **pvc-protection**: a claim being deleted keeps `kubernetes.io/pvc-protection`
  while a pod uses it — a pod scheduled to a node (the kubelet refuses to start a
  pod whose claim is being deleted, so an unscheduled pod cannot start using it),
  not terminated (Succeeded/Failed) and not shut down (deleted with a zero grace
  period), whose volumes name the claim (`persistentVolumeClaim.claimName`, or
  `<pod>-<volume>` for an ephemeral volume whose claim the pod controls).  Kubernetes
  also counts Succeeded/Failed pods that still exist; Fleet lets their claims go.  The cache answers first; before the
  finalizer goes, the pods of the namespace are listed from the API (the cache may
  not have the pod that was created a moment ago), as Kubernetes' askAPIServer.
* **pv-protection**: a volume being deleted keeps `kubernetes.io/pv-protection`
  while it is Bound.

Pod events queue the deleting claims the pod uses (its deletion or termination may
free them).  The finalizer is removed with a PUT guarded by resourceVersion.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from fleet.api import pvmatch as pm
from fleet.api.owners import controller_of
from fleet.client import ApiException
from fleet.controllers import volume_common as vc
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, key_of, split_key

Obj = Mapping[str, Any]
CONFLICT_RETRY = 0.1


def _md(obj: Obj) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def pod_uses_claim(pod: Obj, claim: Obj) -> bool:
    """podUsesPVC, with terminated pods not counting: a `persistentVolumeClaim` volume
    naming the claim, or an ephemeral volume whose `<pod>-<volume>` claim it is and
    which the pod controls (ephemeral.VolumeIsForPod)."""
    if _md(pod).get("namespace") != _md(claim).get("namespace"):
        return False
    if not (pod.get("spec") or {}).get("nodeName") or pm.pod_is_terminated(pod):
        return False
    name = str(_md(claim).get("name") or "")
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(vol, Mapping):
            continue
        pvc = vol.get("persistentVolumeClaim")
        if isinstance(pvc, Mapping) and pvc.get("claimName") == name:
            return True
        if (isinstance(vol.get("ephemeral"), Mapping)
                and pm.ephemeral_claim_name(str(_md(pod).get("name")), str(vol.get("name"))) == name):
            ref = controller_of(claim)  # type: ignore[arg-type]
            if ref is not None and ref.get("uid") == _md(pod).get("uid"):
                return True
    return False


def users(claim: Obj, pods: Iterable[Obj]) -> list[str]:
    """Names of the pods that keep `claim` from going."""
    return sorted(str(_md(p).get("name") or "") for p in pods if pod_uses_claim(p, claim))


def claim_finalizer_removable(claim: Obj, pods: Iterable[Obj]) -> bool:
    """The claim is being deleted, carries the finalizer, and no pod uses it."""
    md = _md(claim)
    return (bool(md.get("deletionTimestamp")) and pm.PVC_PROTECTION in (md.get("finalizers") or [])
            and not users(claim, pods))


def volume_finalizer_removable(pv: Obj) -> bool:
    """The volume is being deleted, carries the finalizer, and is not Bound."""
    md = _md(pv)
    return (bool(md.get("deletionTimestamp")) and pm.PV_PROTECTION in (md.get("finalizers") or [])
            and (pv.get("status") or {}).get("phase") != "Bound")


def without_finalizer(obj: Obj, finalizer: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["metadata"]["finalizers"] = [f for f in out["metadata"].get("finalizers") or [] if f != finalizer]
    return out


async def remove_finalizer(client: Any, resource: tuple[str, str], obj: Obj, finalizer: str) -> float | None:
    md = _md(obj)
    try:
        await client.replace(*resource, str(md.get("name")), without_finalizer(obj, finalizer),
                             md.get("namespace") or None)
    except ApiException as e:
        if e.code == 409:
            return CONFLICT_RETRY
        if e.code != 404:
            raise
    return None


class PVCProtectionController(QueueWorker):
    name = "pvc-protection"
    kind = "PersistentVolumeClaim"
    workers = 2
    requires = (vc.PVCS, vc.PODS)

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.claims: SharedInformer = ctx.informers.informer(*vc.PVCS)
        self.pods: SharedInformer = ctx.informers.informer(*vc.PODS)
        self.pods.add_index(vc.POD_CLAIM_INDEX, vc.by_pod_claim)
        self.claims.add_handler(self._on_claim)
        self.pods.add_handler(self._on_pod)

    def _on_claim(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and _md(new).get("deletionTimestamp"):
            self.queue.add(key_of(new))

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for pod in (old, new):
            if pod is None:
                continue
            for key in vc.by_pod_claim(pod):
                claim = self.claims.get(key)
                if claim is not None and _md(claim).get("deletionTimestamp"):
                    self.queue.add(key)

    async def reconcile(self, key: str) -> float | None:
        claim = self.claims.get(key)
        if claim is None:
            return None
        if not claim_finalizer_removable(claim, self.pods.by_index(vc.POD_CLAIM_INDEX, key)):
            return None
        ns, _ = split_key(key)
        live = await self.ctx.client.list(*vc.PODS, ns)
        if users(claim, live.get("items") or []):
            return None  # the cache was behind; the pod's events bring us back
        return await remove_finalizer(self.ctx.client, vc.PVCS, claim, pm.PVC_PROTECTION)


class PVProtectionController(QueueWorker):
    name = "pv-protection"
    kind = "PersistentVolume"
    workers = 1
    requires = (vc.PVS,)

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.volumes: SharedInformer = ctx.informers.informer(*vc.PVS)
        self.volumes.add_handler(self._on_volume)

    def _on_volume(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and _md(new).get("deletionTimestamp"):
            self.queue.add(key_of(new))

    async def reconcile(self, key: str) -> float | None:
        pv = self.volumes.get(key)
        if pv is None or not volume_finalizer_removable(pv):
            return None
        return await remove_finalizer(self.ctx.client, vc.PVS, pv, pm.PV_PROTECTION)


__all__ = ["PVCProtectionController", "PVProtectionController", "claim_finalizer_removable",
           "pod_uses_claim", "users", "volume_finalizer_removable", "without_finalizer"]
