"""The provisioner loop: Fleet's external-provisioner, -resizer, -attacher and capacity
publisher, driving storage drivers (`fleet.storage.driver`) from the API's objects.

One `Provisioner` serves a set of drivers at one place (`Place`):

* in the server, the drivers whose volumes can be made from anywhere
  (`capabilities.node_local` False).  It is a controller of the controller manager
  (`server_provisioner`, added by `fleet.server.run`): it shares the manager's
  PVC / PV / StorageClass informers with the PV controller, is supervised and
  restarted like every controller, and — once there are several servers — runs only
  on the leader, so two servers never make two volumes for one claim (the
  external-provisioner's leader election);
* in each agent, the `node_local` drivers (`run_node_provisioner`, started by
  `fleet.agent.run` on real nodes): only claims whose selected node is this node and
  only PVs pinned to it — the external-provisioner's distributed provisioning,
  because only that node can create the directory or image file.

    claims informer ──▶ claim queue ──▶ sync_claim: plan_claim → create_volume → PV
                                                    plan_resize → controller_expand
    PV informer ──────▶ volume queue ─▶ sync_volume: plan_volume → delete_volume → PV gone
    VolumeAttachments ▶ attach queue ─▶ sync_attachment: controller_(un)publish
    classes / nodes / a period / our own writes ─▶ capacity loop: get_capacity →
                                                   CSIStorageCapacity objects

Every decision is a pure function of `fleet.storage.provisioner_plan`; this module
reads the caches, calls the driver, writes objects and Events, and retries with the
WorkQueue's per-key exponential back-off (a failed reconcile raises `RetryLater`).
Events carry the sidecars' words and sources: `<driver>_<host>` for provisioning
(Provisioning, ProvisioningSucceeded, ProvisioningFailed, VolumeFailedDelete) and
`external-resizer <driver>` for resizing (Resizing, VolumeResizeFailed,
FileSystemResizeRequired, VolumeResizeSuccessful).

No half-made volume: a PV that cannot be created after create_volume (a few quick
attempts) makes the loop delete the volume again, as the library's volume store does.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.api import meta
from fleet.api.kinds.metrics import format_bytes
from fleet.client import JSON_PATCH, MERGE_PATCH, ApiException, Client
from fleet.client.events import NORMAL, WARNING, EventRecorder
from fleet.controllers.runtime import Context, InformerFactory, QueueWorker, SharedInformer
from fleet.storage import registry
from fleet.storage.driver import Driver, DriverEnv, DriverError
from fleet.storage.provisioner_plan import (
    CAPACITY_NAMESPACE,
    PROVISIONER_FINALIZER,
    AttachAction,
    Provision,
    Refuse,
    Wait,
    attach_error,
    attacher_finalizer,
    build_pv,
    capacity_keys,
    check_created,
    claim_key,
    claim_provisioner,
    finalizers_patch,
    plan_attachment,
    plan_capacity,
    plan_claim,
    plan_resize,
    plan_volume,
    provision_failure,
    pv_name_for,
    remove_selected_node_patch,
    resize_status,
    rpc_error,
    volume_driver,
)
from fleet.storage.provisioner_plan import Place as Place

log = logging.getLogger(__name__)

Obj = dict[str, Any]
STORAGE = "storage.k8s.io/v1"
# The external-provisioner's --capacity-poll-interval default.
CAPACITY_PERIOD = 60.0
# Quick attempts at creating the PV object of a volume just made (the library's
# volume store retries with back-off before deleting the volume again).
PV_CREATE_ATTEMPTS = 5
PV_CREATE_BACKOFF = 0.1
NET_ERRORS = (ApiException, httpx.HTTPError, OSError)


class RetryLater(Exception):
    """A reconcile that must be tried again with back-off (the event is already out)."""


def _with_kind(obj: Obj, api_version: str, kind: str) -> Obj:
    """Informer items may lack kind/apiVersion; an Event's involvedObject needs them."""
    return obj if obj.get("kind") else {"apiVersion": api_version, "kind": kind, **obj}


def _md(obj: Any) -> dict[str, Any]:
    md = obj.get("metadata") if isinstance(obj, dict) else None
    return md if isinstance(md, dict) else {}


class _Loop(QueueWorker):
    """A QueueWorker whose reconcile is one of the Provisioner's sync methods."""

    def __init__(self, name: str, kind: str, sync: Callable[[str], Any], workers: int) -> None:
        self.name = name
        self.kind = kind
        self.workers = workers
        super().__init__()
        self._sync = sync

    async def reconcile(self, key: str) -> float | None:
        return await self._sync(key)


class Provisioner:
    """The loop for `drivers` at `place` (a Controller: `setup(ctx)`, then `run(ctx)`)."""

    name = "storage-provisioner"

    def __init__(self, drivers: Mapping[str, Driver], place: Place, *,
                 capacity_period: float = CAPACITY_PERIOD, workers: int = 2,
                 pv_create_attempts: int = PV_CREATE_ATTEMPTS,
                 pv_create_backoff: float = PV_CREATE_BACKOFF) -> None:
        self.drivers = dict(drivers)
        self.caps = {name: d.capabilities for name, d in self.drivers.items()}
        self.place = place
        self.capacity_period = capacity_period
        self.pv_create_attempts = max(1, pv_create_attempts)
        self.pv_create_backoff = pv_create_backoff
        self.claim_loop = _Loop(f"{self.name}-claims", "PersistentVolumeClaim", self.sync_claim, workers)
        self.volume_loop = _Loop(f"{self.name}-volumes", "PersistentVolume", self.sync_volume, workers)
        self.attach_loop = _Loop(f"{self.name}-attachments", "VolumeAttachment", self.sync_attachment,
                                 workers)
        self._poke = trio.Event()
        self.capacity_refreshes = 0  # tests and logs read it
        self.recorders: dict[str, EventRecorder] = {}
        self.attachments: SharedInformer | None = None
        self.capacities: SharedInformer | None = None
        self.nodes: SharedInformer | None = None

    # -- wiring ------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        inf = ctx.informers
        self.claims = inf.informer("v1", "persistentvolumeclaims")
        self.volumes = inf.informer("v1", "persistentvolumes")
        self.classes = inf.informer(STORAGE, "storageclasses")
        self.claims.add_handler(self._on_claim)
        self.volumes.add_handler(self._on_volume)
        self.classes.add_handler(self._on_class)
        if any(c.attach_required for c in self.caps.values()):
            self.attachments = inf.informer(STORAGE, "volumeattachments")
            self.attachments.add_handler(self._on_attachment)
        if self.tracked_drivers():
            self.capacities = inf.informer(STORAGE, "csistoragecapacities")
            self.capacities.add_handler(self._on_capacity)
            if self.place.node_name is None:
                self.nodes = inf.informer("v1", "nodes")
                self.nodes.add_handler(self._on_node)
        for name in self.drivers:
            for component in self._components(name):
                if component not in self.recorders:
                    self.recorders[component] = EventRecorder(ctx.client, component,
                                                              host=self.place.node_name, senders=1)

    def _components(self, driver: str) -> tuple[str, str]:
        return f"{driver}_{self.place.host}", f"external-resizer {driver}"

    def _events(self, driver: str, *, resizer: bool = False) -> EventRecorder:
        return self.recorders[self._components(driver)[1 if resizer else 0]]

    def tracked_drivers(self) -> list[str]:
        return sorted(n for n, c in self.caps.items() if c.capacity_tracking)

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            for rec in self.recorders.values():
                await n.start(rec.run)
            n.start_soon(self.claim_loop.run, ctx)
            n.start_soon(self.volume_loop.run, ctx)
            if self.attachments is not None:
                n.start_soon(self.attach_loop.run, ctx)
            if self.capacities is not None:
                n.start_soon(self._capacity_loop)

    # -- informer handlers (synchronous: only enqueue) ------------------------------------
    def _on_claim(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        spec = new.get("spec") or {}
        if claim_provisioner(new) in self.caps or spec.get("volumeName"):
            self.claim_loop.queue.add(f"{_md(new).get('namespace') or ''}/{_md(new).get('name')}")

    def _on_volume(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            self.poke_capacity()
            return
        if volume_driver(new) not in self.caps:
            return
        self.volume_loop.queue.add(f"/{_md(new).get('name')}")
        ref = (new.get("spec") or {}).get("claimRef") or {}
        if isinstance(ref, dict) and ref.get("name"):
            # A resize waits for the PV too (its capacity, its binding).
            self.claim_loop.queue.add(f"{ref.get('namespace') or ''}/{ref['name']}")

    def _on_class(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        self.poke_capacity()
        if new is None or new.get("provisioner") not in self.caps:
            return
        for claim in self.claims.list():
            if not (claim.get("spec") or {}).get("volumeName") and claim_provisioner(claim) in self.caps:
                self.claim_loop.queue.add(f"{_md(claim).get('namespace') or ''}/{_md(claim).get('name')}")

    def _on_attachment(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.attach_loop.queue.add(f"/{_md(new).get('name')}")

    def _on_capacity(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if etype == "DELETED":
            self.poke_capacity()  # one of ours may have been deleted by hand

    def _on_node(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if etype != "MODIFIED":
            self.poke_capacity()

    def poke_capacity(self) -> None:
        """Refresh the CSIStorageCapacity objects soon (after a provision or delete)."""
        self._poke.set()

    def _class_map(self) -> dict[str, Obj]:
        return {str(_md(sc).get("name") or ""): sc for sc in self.classes.list()}

    # -- claims: provisioning and resizing -------------------------------------------------
    async def sync_claim(self, key: str) -> float | None:
        claim = self.claims.get(key)
        if claim is None:
            return None
        claim = _with_kind(claim, "v1", "PersistentVolumeClaim")
        if (claim.get("spec") or {}).get("volumeName"):
            return await self._sync_resize(claim)
        exists = self.volumes.get(f"/{pv_name_for(claim)}") is not None
        decision = plan_claim(claim, self._class_map(), self.caps, self.place, pv_exists=exists)
        if decision is None:
            return None
        if isinstance(decision, Wait):
            raise RetryLater(decision.why)
        if isinstance(decision, Refuse):
            self._events(claim_provisioner(claim)).record(claim, WARNING, "ProvisioningFailed",
                                                          decision.message)
            return None  # until the claim changes
        return await self._provision(claim, decision)

    async def _provision(self, claim: Obj, decision: Provision) -> float | None:
        events = self._events(decision.driver)
        driver = self.drivers[decision.driver]
        ckey = claim_key(claim)
        events.record(claim, NORMAL, "Provisioning",
                      f'External provisioner is provisioning volume for claim "{ckey}"')
        try:
            volume = await driver.create_volume(decision.request)
        except Exception as e:  # noqa: BLE001 - a driver failure is reported, then retried
            failure = provision_failure(e, decision.class_name, self.caps[decision.driver],
                                        decision.request.node)
            events.record(claim, WARNING, "ProvisioningFailed", failure.message)
            if not isinstance(e, DriverError):
                log.warning("provisioning %s: driver %s raised %r", ckey, decision.driver, e)
            if failure.reschedule:
                await self._unselect_node(claim)
                return None  # the scheduler picks a node again
            if failure.retry_after is not None:
                return failure.retry_after
            raise RetryLater(failure.message) from e
        too_small = check_created(volume, decision.request)
        if too_small is not None:
            await self._cleanup(claim, decision, volume.volume_id, volume.context, too_small,
                                announce=False)
            events.record(claim, WARNING, "ProvisioningFailed",
                          f'failed to provision volume with StorageClass "{decision.class_name}": '
                          f"{too_small}")
            raise RetryLater(too_small)
        pv = build_pv(claim, decision, volume)
        error: BaseException | None = None
        for attempt in range(self.pv_create_attempts):
            try:
                await self.ctx.client.create("v1", "persistentvolumes", pv)
                error = None
                break
            except ApiException as e:
                if e.code == 409:  # made by an earlier attempt: reuse it
                    error = None
                    break
                error = e
            except (httpx.HTTPError, OSError) as e:
                error = e
            if attempt + 1 < self.pv_create_attempts:
                await trio.sleep(self.pv_create_backoff * 2 ** attempt)
        if error is not None:
            await self._cleanup(claim, decision, volume.volume_id, volume.context, str(error))
            raise RetryLater(str(error))
        events.record(claim, NORMAL, "ProvisioningSucceeded",
                      f"Successfully provisioned volume {decision.pv_name}")
        self.poke_capacity()
        return None

    async def _cleanup(self, claim: Obj, decision: Provision, volume_id: str,
                       context: Mapping[str, str], why: str, *, announce: bool = True) -> None:
        """Delete a volume that has no PV (the library's StoreVolume failure path)."""
        events = self._events(decision.driver)
        ckey = claim_key(claim)
        if announce:
            events.record(claim, WARNING, "ProvisioningFailed",
                          f"Error creating provisioned PV object for claim {ckey}: {why}. "
                          "Deleting the volume.")
        last: BaseException | None = None
        for attempt in range(self.pv_create_attempts):
            try:
                await self.drivers[decision.driver].delete_volume(volume_id, context)
                return
            except Exception as e:  # noqa: BLE001 - retried, then reported
                last = e
            if attempt + 1 < self.pv_create_attempts:
                await trio.sleep(self.pv_create_backoff * 2 ** attempt)
        assert last is not None
        events.record(claim, WARNING, "ProvisioningCleanupFailed",
                      f"Error cleaning provisioned volume for claim {ckey}: {rpc_error(last)}. "
                      "Please delete manually.")

    async def _unselect_node(self, claim: Obj) -> None:
        md = _md(claim)
        try:
            await self.ctx.client.patch("v1", "persistentvolumeclaims", str(md.get("name")),
                                        remove_selected_node_patch(claim), JSON_PATCH,
                                        str(md.get("namespace") or ""))
        except ApiException as e:
            if e.code == 404:
                return
            raise RetryLater(f"delete annotation 'annSelectedNode' for PersistentVolumeClaim "
                             f'"{claim_key(claim)}": {e}') from e

    async def _sync_resize(self, claim: Obj) -> float | None:
        pv_name = str((claim.get("spec") or {}).get("volumeName") or "")
        pv = self.volumes.get(f"/{pv_name}")
        resize = plan_resize(claim, pv, self._class_map(), self.caps, self.place)
        if resize is None:
            return None
        events = self._events(resize.driver, resizer=True)
        md = _md(claim)
        name, ns = str(md.get("name")), str(md.get("namespace") or "")
        events.record(claim, NORMAL, "Resizing", f"External resizer is resizing volume {resize.pv_name}")
        claim = await self._patch_claim_status(
            claim, resize_status(claim, "started", meta.now_rfc3339(), size_bytes=resize.capacity_bytes))
        try:
            capacity, node_expand = await self.drivers[resize.driver].controller_expand(
                resize.volume_id, resize.capacity_bytes, resize.context)
        except Exception as e:  # noqa: BLE001 - reported, then retried
            message = (f'resize volume "{resize.pv_name}" by resizer "{resize.driver}" failed: '
                       f"{rpc_error(e)}")
            events.record(claim, WARNING, "VolumeResizeFailed", message)
            final = isinstance(e, DriverError) and e.code.final
            with contextlib.suppress(*NET_ERRORS):
                await self._patch_claim_status(claim, resize_status(
                    claim, "failed", meta.now_rfc3339(), size_bytes=resize.capacity_bytes,
                    message=message, final=final))
            raise RetryLater(message) from e
        capacity = max(int(capacity or 0), resize.capacity_bytes)
        await self.ctx.client.patch("v1", "persistentvolumes", resize.pv_name,
                                    {"spec": {"capacity": {"storage": format_bytes(capacity)}}},
                                    MERGE_PATCH)
        if node_expand:
            await self._patch_claim_status(claim, resize_status(
                claim, "node_pending", meta.now_rfc3339(), size_bytes=capacity))
            events.record(claim, NORMAL, "FileSystemResizeRequired",
                          "Require file system resize of volume on node")
        else:
            await self._patch_claim_status(claim, resize_status(
                claim, "done", meta.now_rfc3339(), size_bytes=capacity))
            events.record(claim, NORMAL, "VolumeResizeSuccessful", "Resize volume succeeded")
        log.info("resized %s/%s (%s) to %d bytes", ns, name, resize.pv_name, capacity)
        self.poke_capacity()
        return None

    async def _patch_claim_status(self, claim: Obj, patch: dict[str, Any]) -> Obj:
        md = _md(claim)
        out = await self.ctx.client.patch("v1", "persistentvolumeclaims", str(md.get("name")), patch,
                                          MERGE_PATCH, str(md.get("namespace") or ""),
                                          subresource="status")
        return _with_kind(out, "v1", "PersistentVolumeClaim") if isinstance(out, dict) else claim

    # -- volumes: finalizer upkeep and deletion --------------------------------------------
    async def sync_volume(self, key: str) -> float | None:
        pv = self.volumes.get(key)
        if pv is None:
            return None
        pv = _with_kind(pv, "v1", "PersistentVolume")
        action = plan_volume(pv, self.caps, self.place)
        if action is None:
            return None
        name = str(_md(pv).get("name"))
        if action.finalizers is not None and not action.delete:
            await self._set_finalizers("v1", "persistentvolumes", pv, action.finalizers)
            return None
        driver = volume_driver(pv)
        csi = (pv.get("spec") or {}).get("csi") or {}
        try:
            await self.drivers[driver].delete_volume(str(csi.get("volumeHandle") or ""),
                                                     dict(csi.get("volumeAttributes") or {}))
        except Exception as e:  # noqa: BLE001 - reported, then retried
            self._events(driver).record(pv, WARNING, "VolumeFailedDelete", rpc_error(e))
            raise RetryLater(rpc_error(e)) from e
        try:
            await self.ctx.client.delete("v1", "persistentvolumes", name)
        except ApiException as e:
            if e.code != 404:
                raise
        # The delete only marked it (finalizers): drop ours from the latest version.
        try:
            latest = await self.ctx.client.get_object("v1", "persistentvolumes", name)
        except ApiException as e:
            if e.code == 404:
                self.poke_capacity()
                return None
            raise
        fins = [f for f in _md(latest).get("finalizers") or [] if f != PROVISIONER_FINALIZER]
        if fins != list(_md(latest).get("finalizers") or []):
            await self._set_finalizers("v1", "persistentvolumes", latest, fins)
        self.poke_capacity()
        return None

    async def _set_finalizers(self, api_version: str, plural: str, obj: Obj, finalizers: list[str],
                              namespace: str | None = None) -> None:
        try:
            await self.ctx.client.patch(api_version, plural, str(_md(obj).get("name")),
                                        finalizers_patch(obj, finalizers), JSON_PATCH, namespace)
        except ApiException as e:
            if e.code == 404:
                return
            if e.code in (409, 422):  # changed meanwhile: its update event brings a new look
                raise RetryLater(str(e)) from e
            raise

    # -- VolumeAttachments ----------------------------------------------------------------
    async def sync_attachment(self, key: str) -> float | None:
        if self.attachments is None:
            return None
        va = self.attachments.get(key)
        if va is None:
            return None
        action = plan_attachment(va, self.caps, self.place)
        if action is None:
            return None
        fin = attacher_finalizer(action.driver)
        if action.op == "add_finalizer":
            await self._set_finalizers(STORAGE, "volumeattachments", va,
                                       [*(_md(va).get("finalizers") or []), fin])
            return None
        pv = self.volumes.get(f"/{action.pv_name}")
        if pv is None:
            if action.op == "detach":
                # Nothing left to detach against (the PV is gone): let the object go.
                log.warning("VolumeAttachment %s: PV %s is gone; removing the finalizer",
                            key, action.pv_name)
                await self._drop_attach_finalizer(va, fin)
                return None
            raise RetryLater(f'persistentvolume "{action.pv_name}" not found')
        return await self._attach_or_detach(va, pv, action, fin)

    async def _attach_or_detach(self, va: Obj, pv: Obj, action: AttachAction, fin: str) -> None:
        csi = (pv.get("spec") or {}).get("csi") or {}
        handle = str(csi.get("volumeHandle") or "")
        driver = self.drivers[action.driver]
        name = str(_md(va).get("name"))
        if action.op == "attach":
            try:
                published = await driver.controller_publish(handle, action.node,
                                                             dict(csi.get("volumeAttributes") or {}))
            except Exception as e:  # noqa: BLE001 - recorded in status, then retried
                with contextlib.suppress(*NET_ERRORS):
                    await self._patch_va_status(name, {"attachError": attach_error(
                        rpc_error(e), meta.now_rfc3339())})
                raise RetryLater(rpc_error(e)) from e
            await self._patch_va_status(name, {"attached": True,
                                               "attachmentMetadata": dict(published or {}) or None,
                                               "attachError": None})
            return None
        try:
            await driver.controller_unpublish(handle, action.node)
        except Exception as e:  # noqa: BLE001 - recorded in status, then retried
            with contextlib.suppress(*NET_ERRORS):
                await self._patch_va_status(name, {"detachError": attach_error(
                    rpc_error(e), meta.now_rfc3339())})
            raise RetryLater(rpc_error(e)) from e
        with contextlib.suppress(ApiException):
            await self._patch_va_status(name, {"attached": False, "attachmentMetadata": None,
                                               "detachError": None})
        await self._drop_attach_finalizer(va, fin)
        return None

    async def _drop_attach_finalizer(self, va: Obj, fin: str) -> None:
        try:
            latest = await self.ctx.client.get_object(STORAGE, "volumeattachments",
                                                      str(_md(va).get("name")))
        except ApiException as e:
            if e.code == 404:
                return
            raise
        fins = [f for f in _md(latest).get("finalizers") or [] if f != fin]
        if fins != list(_md(latest).get("finalizers") or []):
            await self._set_finalizers(STORAGE, "volumeattachments", latest, fins)

    async def _patch_va_status(self, name: str, status: dict[str, Any]) -> None:
        await self.ctx.client.patch(STORAGE, "volumeattachments", name, {"status": status},
                                    MERGE_PATCH, subresource="status")

    # -- capacity ---------------------------------------------------------------------------
    async def _capacity_loop(self) -> None:
        while True:
            self._poke = trio.Event()
            try:
                await self.refresh_capacity()
            except Exception as e:  # noqa: BLE001 - the next period tries again
                log.warning("storage capacity: refresh failed: %r", e)
            with trio.move_on_after(self.capacity_period):
                await self._poke.wait()

    def _capacity_nodes(self) -> list[str]:
        if self.place.node_name is not None:
            return [self.place.node_name]
        if self.nodes is None:
            return []
        return [str(_md(n).get("name")) for n in self.nodes.list() if not _md(n).get("deletionTimestamp")]

    async def refresh_capacity(self) -> None:
        """Publish get_capacity for every (node, class) of every tracking driver."""
        if self.capacities is None:
            return
        nodes = self._capacity_nodes()
        classes = self._class_map()
        for name in self.tracked_drivers():
            desired: dict[tuple[str, str], int | None] = {}
            for key in capacity_keys(name, classes.values(), nodes):
                params = {str(k): str(v) for k, v in (classes[key[1]].get("parameters") or {}).items()}
                try:
                    desired[key] = await self.drivers[name].get_capacity(params, key[0])
                except Exception as e:  # noqa: BLE001 - published as unknown
                    log.warning("storage capacity: %s on %s (class %s): %s", name, key[0], key[1],
                                rpc_error(e))
                    desired[key] = None
            plan = plan_capacity(name, self.place, desired, self.capacities.list(CAPACITY_NAMESPACE))
            client = self.ctx.client
            for obj in plan.create:
                await client.create(STORAGE, "csistoragecapacities", obj, CAPACITY_NAMESPACE)
            for obj, patch in plan.update:
                with contextlib.suppress(ApiException):
                    await client.patch(STORAGE, "csistoragecapacities", str(_md(obj).get("name")),
                                       patch, MERGE_PATCH, CAPACITY_NAMESPACE)
            for obj in plan.delete:
                with contextlib.suppress(ApiException):
                    await client.delete(STORAGE, "csistoragecapacities", str(_md(obj).get("name")),
                                        CAPACITY_NAMESPACE)
        self.capacity_refreshes += 1


# ---------------------------------------------------------------------------------------
# Building instances


def drivers_for(place: Place, env_for: Callable[[str], DriverEnv]) -> dict[str, Driver]:
    """An instance of every registered driver this place serves (node_local ones on a
    node, the others in the server).  A driver whose factory fails is logged and left
    out: one broken plugin must not stop the others."""
    out: dict[str, Driver] = {}
    driver: Driver | None
    for name in registry.names():
        env = env_for(name)
        made = not env.data_dir.exists()
        try:
            env.data_dir.mkdir(parents=True, exist_ok=True)
            driver = registry.create(name, env)
        except Exception:  # noqa: BLE001 - isolate one plugin
            log.exception("storage driver %s could not be created", name)
            driver = None
        if driver is not None and place.serves(driver.capabilities):
            out[name] = driver
        elif made:
            with contextlib.suppress(OSError):
                os.rmdir(env.data_dir)  # not served here: leave no empty directory
    return out


def server_provisioner(data_dir: Path, **kw: Any) -> Provisioner | None:
    """The server's instance (drivers that are not node_local, their data under
    `<server data dir>/storage/<driver>`), or None when there are none."""
    place = Place()
    drivers = drivers_for(place, lambda name: DriverEnv(data_dir=Path(data_dir) / "storage" / name))
    return Provisioner(drivers, place, **kw) if drivers else None


# What a provisioner reads: without these kinds there is nothing to provision for.
REQUIRED_RESOURCES = (("", "persistentvolumes"), ("storage.k8s.io", "storageclasses"))


async def wait_served(client: Client, *, period: float = 30.0) -> None:
    """Return once the server serves PersistentVolumes and StorageClasses (an agent may
    meet an older server: its informers would only log 404s)."""
    told = False
    while True:
        try:
            have = {(r.group, r.name) for r in await client.discover(refresh=True)}
            if all(k in have for k in REQUIRED_RESOURCES):
                return
        except NET_ERRORS as e:
            log.debug("storage provisioner: discovery failed: %r", e)
        if not told:
            log.info("storage provisioner: the server does not serve PersistentVolumes and "
                     "StorageClasses (yet); checking every %.0fs", period)
            told = True
        await trio.sleep(period)


async def run_node_provisioner(client: Client, *, node_name: str, node_labels: Mapping[str, str],
                               data_dir: Path, drivers: Mapping[str, Driver] | None = None,
                               task_status: trio.TaskStatus[Provisioner | None] = trio.TASK_STATUS_IGNORED,
                               **kw: Any) -> None:
    """A node's instance over `client`, with informers of its own: the node_local
    drivers — of `drivers` (the agent's own instances, shared with its volume manager),
    or else new instances with `DriverEnv(<agent data dir>/storage/<driver>, node,
    labels)`.  Returns at once (started with None) when no driver is node_local."""
    place = Place(node_name, dict(node_labels))
    if drivers is not None:
        served = {n: d for n, d in drivers.items() if place.serves(d.capabilities)}
    else:
        served = drivers_for(place, lambda name: DriverEnv(
            data_dir=Path(data_dir) / "storage" / name, node_name=node_name,
            node_labels=dict(node_labels)))
    if not served:
        task_status.started(None)
        return
    await wait_served(client)
    prov = Provisioner(served, place, **kw)
    ctx = Context(client=client, informers=InformerFactory(client, component="storage-provisioner"))
    prov.setup(ctx)
    async with trio.open_nursery() as n:
        await n.start(ctx.informers.run)
        task_status.started(prov)
        await prov.run(ctx)


__all__ = ["CAPACITY_PERIOD", "REQUIRED_RESOURCES", "Place", "Provisioner", "RetryLater", "drivers_for",
           "run_node_provisioner", "server_provisioner", "wait_served"]
