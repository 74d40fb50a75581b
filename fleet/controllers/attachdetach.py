"""The attach/detach controller (kube-controller-manager's `attachdetach`, CSI part):
a VolumeAttachment for every (volume, node) that must be attached, none for the
others.  The external-attacher half (VolumeAttachment → `controller_publish`, then
`status.attached`) is the provisioner loop's; the agent waits for `attached` before
staging.

* **Desired**: every pod that is scheduled (`spec.nodeName`) and not terminated,
  every claim its volumes use (`persistentVolumeClaim`, or the `<pod>-<volume>`
  claim of an ephemeral volume) that is bound, the claim's PersistentVolume when it
  is a CSI volume whose driver's CSIDriver object says `attachRequired: true`.
  (Kubernetes also attaches when a driver has no CSIDriver object at all; Fleet's
  server creates one for every registered driver, so a driver without one is
  treated as not needing attachment.)
* **Names**: `csi-<sha256(volumeHandle + driver + node)>` in hex — Kubernetes'
  `getAttachmentName(volName, csiDriverName, nodeName)`, so tools that look for
  the attachment by name find it; `pvmatch.attachment_name` is the one place it is
  computed (the agent uses it to find the attachment it waits for).
* **Detach**: an attachment whose (volume, node) is no longer desired is deleted —
  once the node no longer reports the volume in `status.volumesInUse`
  (`kubernetes.io/csi/<driver>^<volumeHandle>`, the kubelet's unique volume name),
  or right away when the node is gone.  Attachments for inline volumes (no
  `source.persistentVolumeName`) are not this controller's.

The controller recomputes the whole plan on any change (one key): attachments are
few and the computation is a pass over pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.api import pvmatch as pm
from fleet.api.pvmatch import attachment_name, unique_volume_name
from fleet.client import ApiException
from fleet.controllers import volume_common as vc
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer

Obj = Mapping[str, Any]
KEY = "all"


def _md(obj: Obj) -> dict[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def attach_required(driver: str, csidrivers: Mapping[str, Obj]) -> bool:
    cd = csidrivers.get(driver)
    return cd is not None and (cd.get("spec") or {}).get("attachRequired") is True


def attachment(pv: Obj, node: str) -> dict[str, Any]:
    csi = (pv.get("spec") or {}).get("csi") or {}
    driver, handle = str(csi.get("driver") or ""), str(csi.get("volumeHandle") or "")
    return {"apiVersion": vc.STORAGE, "kind": "VolumeAttachment",
            "metadata": {"name": attachment_name(handle, driver, node)},
            "spec": {"attacher": driver, "nodeName": node,
                     "source": {"persistentVolumeName": _md(pv).get("name")}},
            "status": {"attached": False}}


@dataclass
class AttachPlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)      # attachment names
    waiting: list[str] = field(default_factory=list)     # detach deferred: still in use on the node


def desired(pods: Iterable[Obj], claims: Mapping[str, Obj], volumes: Mapping[str, Obj],
            csidrivers: Mapping[str, Obj]) -> dict[str, dict[str, Any]]:
    """The attachments that should exist, by name.  `claims` by "ns/name", `volumes`
    and `csidrivers` by name."""
    out: dict[str, dict[str, Any]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or pm.pod_is_terminated(pod):
            continue
        ns = _md(pod).get("namespace") or ""
        for claim_name in pm.pod_claim_names(pod):
            claim = claims.get(f"{ns}/{claim_name}")
            if claim is None or not pm.is_claim_bound(claim):
                continue
            pv = volumes.get(str((claim.get("spec") or {}).get("volumeName")))
            csi = ((pv or {}).get("spec") or {}).get("csi") or {}
            if pv is None or not csi.get("driver") or not csi.get("volumeHandle"):
                continue
            if not attach_required(str(csi["driver"]), csidrivers):
                continue
            va = attachment(pv, str(node))
            out[va["metadata"]["name"]] = va
    return out


def plan(pods: Iterable[Obj], claims: Mapping[str, Obj], volumes: Mapping[str, Obj],
         csidrivers: Mapping[str, Obj], attachments: Iterable[Obj], nodes: Mapping[str, Obj]) -> AttachPlan:
    want = desired(pods, claims, volumes, csidrivers)
    out = AttachPlan()
    have: set[str] = set()
    for va in attachments:
        name = str(_md(va).get("name") or "")
        have.add(name)
        spec = va.get("spec") or {}
        pv_name = (spec.get("source") or {}).get("persistentVolumeName")
        if name in want or not pv_name or _md(va).get("deletionTimestamp"):
            continue
        node = nodes.get(str(spec.get("nodeName") or ""))
        pv = volumes.get(str(pv_name))
        csi = ((pv or {}).get("spec") or {}).get("csi") or {}
        if node is not None and csi:
            in_use = (node.get("status") or {}).get("volumesInUse") or []
            if unique_volume_name(str(csi.get("driver")), str(csi.get("volumeHandle"))) in in_use:
                out.waiting.append(name)
                continue
        out.delete.append(name)
    out.create = [va for name, va in sorted(want.items()) if name not in have]
    out.delete.sort()
    return out


class AttachDetachController(QueueWorker):
    name = "attachdetach"
    kind = "VolumeAttachment"
    workers = 1
    requires = (vc.PODS, vc.PVCS, vc.PVS, vc.NODES, vc.CSIDRIVERS, vc.ATTACHMENTS)

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        inf = ctx.informers.informer
        self.pods: SharedInformer = inf(*vc.PODS)
        self.claims: SharedInformer = inf(*vc.PVCS)
        self.volumes: SharedInformer = inf(*vc.PVS)
        self.nodes: SharedInformer = inf(*vc.NODES)
        self.csidrivers: SharedInformer = inf(*vc.CSIDRIVERS)
        self.attachments: SharedInformer = inf(*vc.ATTACHMENTS)
        for informer in (self.pods, self.claims, self.volumes, self.nodes, self.csidrivers, self.attachments):
            informer.add_handler(self._on_change)

    def _on_change(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        self.queue.add(KEY)

    async def reconcile(self, key: str) -> float | None:
        p = plan(self.pods.list(),
                 {f"{_md(c).get('namespace')}/{_md(c).get('name')}": c for c in self.claims.list()},
                 {str(_md(v).get("name")): v for v in self.volumes.list()},
                 {str(_md(d).get("name")): d for d in self.csidrivers.list()},
                 self.attachments.list(),
                 {str(_md(n).get("name")): n for n in self.nodes.list()})
        for body in p.create:
            try:
                await self.ctx.client.create(*vc.ATTACHMENTS, body)
            except ApiException as e:
                if e.code != 409:
                    raise
        for name in p.delete:
            try:
                await self.ctx.client.delete(*vc.ATTACHMENTS, name)
            except ApiException as e:
                if e.code != 404:
                    raise
        # A deferred detach is looked at again (the node's status update also queues it).
        return 10.0 if p.waiting else None


__all__ = ["AttachDetachController", "AttachPlan", "attach_required", "attachment", "attachment_name",
           "desired", "plan", "unique_volume_name"]
