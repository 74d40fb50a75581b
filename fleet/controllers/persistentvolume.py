"""The PersistentVolume controller (kube-controller-manager's `persistentvolume-binder`):
binds claims to volumes, hands claims to provisioners, and moves volumes through
Available / Bound / Released / Failed.  The decisions are `pv_plan`; this module is
the loop around them.

* Informers: claims, volumes, StorageClasses, pods (indexed by the claims they use,
  for the WaitForPodScheduled message), nodes, CSINodes and CSIStorageCapacities
  (node choice for node-local Immediate claims).
* One queue, two kinds of keys: `claim:ns/name` and `volume:/name`.  A claim event
  queues the claim; a volume event queues the volume and the claim its claimRef
  names, and — for a volume that became available — the unbound claims of its class;
  a class event queues the unbound claims (of that class, or all when a default
  appeared); a node, CSINode or capacity event queues the claims waiting for a node.
  A claim still Pending is looked at again every 15 s (the controller's resync).
* A volume whose claim is not in the cache (or is there with another uid) is checked
  against the API before it is Released — a provisioner's or the scheduler's
  fresh binding must not be mistaken for a deleted claim.
* Writes: volume before claim, metadata/spec before status (`write_object`), each
  guarded by resourceVersion; a conflict re-queues the key shortly (the informer
  brings the newer object).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleet.api import pvmatch as pm
from fleet.client import ApiException
from fleet.controllers import volume_common as vc
from fleet.controllers.pv_plan import Sync, World, plan_claim, plan_volume
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, key_of
from fleet.storage import registry as storage_registry
from fleet.storage.driver import Capabilities

log = logging.getLogger(__name__)

CLAIM = "claim:"
VOLUME = "volume:"
CONFLICT_RETRY = 0.1


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PersistentVolumeController(QueueWorker):
    name = "persistentvolume-binder"
    kind = "PersistentVolumeClaim"
    workers = 2
    requires = (vc.PVS, vc.PVCS, vc.CLASSES, vc.PODS, vc.NODES, vc.CSINODES, vc.CAPACITIES)

    def __init__(self, capabilities: Callable[[str], Capabilities | None] | None = None,
                 now: Callable[[], str] = _now) -> None:
        super().__init__()
        self._capabilities = capabilities or storage_registry.capabilities
        self.now = now
        self.waiting_for_node: set[str] = set()

    def capabilities(self, driver: str) -> Capabilities | None:
        """The driver's capabilities; None when unknown or when the driver cannot say
        (a plugin whose factory fails is treated as an external provisioner)."""
        try:
            return self._capabilities(driver)
        except Exception:  # noqa: BLE001 - one broken plugin must not stop binding
            log.warning("storage driver %s: capabilities unavailable", driver, exc_info=True)
            return None

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        inf = ctx.informers.informer
        self.claims: SharedInformer = inf(*vc.PVCS)
        self.volumes: SharedInformer = inf(*vc.PVS)
        self.classes: SharedInformer = inf(*vc.CLASSES)
        self.pods: SharedInformer = inf(*vc.PODS)
        self.nodes: SharedInformer = inf(*vc.NODES)
        self.csinodes: SharedInformer = inf(*vc.CSINODES)
        self.capacities: SharedInformer = inf(*vc.CAPACITIES)
        self.pods.add_index(vc.POD_CLAIM_INDEX, vc.by_pod_claim)
        self.claims.add_handler(self._on_claim)
        self.volumes.add_handler(self._on_volume)
        self.classes.add_handler(self._on_class)
        for informer in (self.nodes, self.csinodes, self.capacities):
            informer.add_handler(self._on_topology)

    # -- events ---------------------------------------------------------------------------
    def _on_claim(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        if etype == "DELETED":
            self.waiting_for_node.discard(key_of(obj))
            # The volume it was bound to is Released now.
            name = (obj.get("spec") or {}).get("volumeName")
            if name:
                self.queue.add(f"{VOLUME}/{name}")
            return
        self.queue.add(CLAIM + key_of(obj))

    def _on_volume(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        if etype != "DELETED":
            self.queue.add(VOLUME + key_of(obj))
        ref = (obj.get("spec") or {}).get("claimRef")
        if ref:
            self.queue.add(f"{CLAIM}{ref.get('namespace') or ''}/{ref.get('name') or ''}")
        elif new is not None and etype != "DELETED" and _became_free(old, new):
            # A volume free for anyone: the unbound claims of its class may fit it now.
            self._queue_unbound(lambda c: pm.claim_class(c) == pm.volume_class(new))

    def _on_class(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        name = (obj.get("metadata") or {}).get("name")
        default = new is not None and pm.is_default_class(new)
        self._queue_unbound(lambda c: default or pm.claim_class(c) == name)

    def _on_topology(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for key in list(self.waiting_for_node):
            self.queue.add(CLAIM + key)

    def _queue_unbound(self, pick: Callable[[dict[str, Any]], bool]) -> None:
        for claim in self.claims.list():
            if pm.BIND_COMPLETED not in ((claim.get("metadata") or {}).get("annotations") or {}) and pick(claim):
                self.queue.add(CLAIM + key_of(claim))

    # -- sync -----------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        if key.startswith(CLAIM):
            return await self.sync_claim(key[len(CLAIM):])
        if key.startswith(VOLUME):
            return await self.sync_volume(key[len(VOLUME):])
        return None

    def world(self, claim: dict[str, Any]) -> World:
        ns = (claim.get("metadata") or {}).get("namespace") or ""
        unscheduled = [str(p["metadata"]["name"]) for p in self.pods.by_index(vc.POD_CLAIM_INDEX, key_of(claim))
                       if not (p.get("spec") or {}).get("nodeName") and not pm.pod_is_terminated(p)
                       and (p.get("metadata") or {}).get("namespace") == ns]
        return World(
            volumes={str(v["metadata"]["name"]): v for v in self.volumes.list()},
            classes={str(c["metadata"]["name"]): c for c in self.classes.list()},
            nodes=self.nodes.list(),
            csinodes={str(c["metadata"]["name"]): c for c in self.csinodes.list()},
            capacities=self.capacities.list(),
            capabilities=self.capabilities,
            unscheduled_pods=unscheduled,
            now=self.now())

    async def sync_claim(self, key: str) -> float | None:
        claim = self.claims.get(key)
        if claim is None:
            self.waiting_for_node.discard(key)
            return None
        sync = plan_claim(claim, self.world(claim))
        if sync.waiting_for_node:
            self.waiting_for_node.add(key)
        else:
            self.waiting_for_node.discard(key)
        return await self.apply(sync, claim=claim, volume=self._volume_of(sync))

    def _volume_of(self, sync: Sync) -> dict[str, Any] | None:
        if sync.volume is None:
            return None
        return self.volumes.get("/" + str(sync.volume["metadata"]["name"]))

    async def sync_volume(self, key: str) -> float | None:
        pv = self.volumes.get(key)
        if pv is None:
            return None
        claim = await self._claim_of(pv)
        sync = plan_volume(pv, claim, self.now())
        return await self.apply(sync, claim=claim, volume=pv)

    async def _claim_of(self, pv: dict[str, Any]) -> dict[str, Any] | None:
        ref = (pv.get("spec") or {}).get("claimRef")
        if not ref:
            return None
        ns, name = ref.get("namespace") or "", ref.get("name") or ""
        claim = self.claims.get(f"{ns}/{name}")
        stale = claim is None or (ref.get("uid") and claim["metadata"].get("uid") != ref.get("uid"))
        if stale and (pv.get("status") or {}).get("phase") not in ("Released", "Failed"):
            try:
                claim = await self.ctx.client.get_object(*vc.PVCS, name, ns)
            except ApiException as e:
                if e.code != 404:
                    raise
                claim = None
        return claim

    async def apply(self, sync: Sync, *, claim: dict[str, Any] | None,
                    volume: dict[str, Any] | None) -> float | None:
        """Write what the plan decided: the volume, then the claim; then the Events."""
        try:
            if sync.volume is not None and volume is not None:
                written = await vc.write_object(self.ctx.client, vc.PVS, volume, sync.volume)
                if written is not None:
                    volume = written
            if sync.claim is not None and claim is not None:
                written = await vc.write_object(self.ctx.client, vc.PVCS, claim, sync.claim)
                if written is not None:
                    claim = written
        except ApiException as e:
            if e.code == 409:
                return CONFLICT_RETRY
            raise
        events = self.ctx.events
        for target, type_, reason, message in sync.events:
            obj = claim if target == "claim" else volume
            if obj is not None and events is not None:
                events.record(obj, type_, reason, message)
        if sync.enqueue_claim:
            self.queue.add(CLAIM + sync.enqueue_claim)
        if sync.error:
            raise RuntimeError(sync.error)
        return sync.requeue


def _became_free(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """A new volume, or one that lost its claimRef or changed phase (e.g. to Available)."""
    if old is None:
        return True
    if (old.get("spec") or {}).get("claimRef"):
        return True
    return (old.get("status") or {}).get("phase") != (new.get("status") or {}).get("phase")


__all__ = ["PersistentVolumeController"]
