"""The ephemeral volume controller (kube-controller-manager's `ephemeral-volume`): a
claim per generic ephemeral volume of a pod.

For each pod volume with `ephemeral.volumeClaimTemplate` the claim `<pod>-<volume>`
is created in the pod's namespace, controlled by the pod (ownerReference with
`controller` and `blockOwnerDeletion`, so the garbage collector deletes it with the
pod), with the template's labels, annotations and spec.  A claim of that name that
the pod does not control is not touched: the pod gets a Warning FailedBinding
Event ("ephemeral volume V: PVC ns/name was not created for pod ns/pod (pod is not
owner)") and stays unable to start until that claim is gone — its deletion queues
the pod again.  Pods being deleted are left alone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api import pvmatch as pm
from fleet.api.owners import controller_of
from fleet.client import ApiException
from fleet.controllers import volume_common as vc
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    key_of,
    namespace_terminating,
)

Obj = Mapping[str, Any]
FAILED_BINDING = "FailedBinding"


def _md(obj: Obj) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def claim_for(pod: Obj, volume: Obj) -> dict[str, Any]:
    """The claim an ephemeral volume asks for."""
    tmpl = (volume.get("ephemeral") or {}).get("volumeClaimTemplate") or {}
    tmd = tmpl.get("metadata") or {}
    md: dict[str, Any] = {
        "name": pm.ephemeral_claim_name(str(_md(pod).get("name")), str(volume.get("name"))),
        "namespace": _md(pod).get("namespace"),
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": _md(pod).get("name"),
                             "uid": _md(pod).get("uid"), "controller": True, "blockOwnerDeletion": True}],
    }
    if tmd.get("labels"):
        md["labels"] = dict(tmd["labels"])
    if tmd.get("annotations"):
        md["annotations"] = dict(tmd["annotations"])
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": md,
            "spec": copy.deepcopy(tmpl.get("spec") or {})}


def is_for_pod(pod: Obj, claim: Obj) -> str:
    """ephemeral.VolumeIsForPod: "" when the pod controls the claim, else why not."""
    ref = controller_of(claim)  # type: ignore[arg-type]
    if _md(claim).get("namespace") == _md(pod).get("namespace") and ref and ref.get("uid") == _md(pod).get("uid"):
        return ""
    return (f"PVC {_md(claim).get('namespace')}/{_md(claim).get('name')} was not created for pod "
            f"{_md(pod).get('namespace')}/{_md(pod).get('name')} (pod is not owner)")


@dataclass
class EphemeralPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    # (volume name, message) for claims in the way
    conflicts: list[tuple[str, str]] = field(default_factory=list)


def plan(pod: Obj, claims: Mapping[str, Obj]) -> EphemeralPlan:
    """What to do for `pod`, given the claims of its namespace by name."""
    out = EphemeralPlan()
    if _md(pod).get("deletionTimestamp"):
        return out
    for vol in (pod.get("spec") or {}).get("volumes") or []:
        if not isinstance(vol, Mapping) or not isinstance(vol.get("ephemeral"), Mapping):
            continue
        name = pm.ephemeral_claim_name(str(_md(pod).get("name")), str(vol.get("name")))
        existing = claims.get(name)
        if existing is None:
            out.create.append(claim_for(pod, vol))
        elif why := is_for_pod(pod, existing):
            out.conflicts.append((str(vol.get("name")), why))
    return out


def has_ephemeral(pod: Obj) -> bool:
    return any(isinstance(v, Mapping) and isinstance(v.get("ephemeral"), Mapping)
               for v in (pod.get("spec") or {}).get("volumes") or [])


class EphemeralVolumeController(QueueWorker):
    name = "ephemeral-volume"
    kind = "Pod"
    workers = 2
    requires = (vc.PVCS, vc.PODS)

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.claims: SharedInformer = ctx.informers.informer(*vc.PVCS)
        self.pods: SharedInformer = ctx.informers.informer(*vc.PODS)
        self.pods.add_index(vc.POD_CLAIM_INDEX, vc.by_pod_claim)
        self.pods.add_handler(self._on_pod)
        self.claims.add_handler(self._on_claim)

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and has_ephemeral(new):
            self.queue.add(key_of(new))

    def _on_claim(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "DELETED" and old is not None:
            for pod in self.pods.by_index(vc.POD_CLAIM_INDEX, key_of(old)):
                if has_ephemeral(pod):
                    self.queue.add(key_of(pod))

    async def reconcile(self, key: str) -> float | None:
        pod = self.pods.get(key)
        if pod is None:
            return None
        ns = str(_md(pod).get("namespace") or "")
        claims = {str(c["metadata"]["name"]): c for c in self.claims.list(ns)}
        p = plan(pod, claims)
        for vol, why in p.conflicts:
            if self.ctx.events is not None:
                self.ctx.events.record(pod, "Warning", FAILED_BINDING, f"ephemeral volume {vol}: {why}")
        for body in p.create:
            try:
                await self.ctx.client.create(*vc.PVCS, body, ns)
            except ApiException as e:
                if e.code == 409:
                    continue  # the cache was behind; the claim's event brings us back if needed
                if namespace_terminating(e):
                    return None
                if self.ctx.events is not None:
                    claim = str(body["metadata"]["name"])
                    vol = claim[len(str(_md(pod).get("name"))) + 1:]
                    self.ctx.events.record(pod, "Warning", FAILED_BINDING,
                                           f"ephemeral volume {vol}: create PVC {claim}: {e}")
                raise
        return None


__all__ = ["EphemeralPlan", "EphemeralVolumeController", "claim_for", "has_ephemeral", "is_for_pod", "plan"]
