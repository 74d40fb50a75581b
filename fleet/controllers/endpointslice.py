"""The EndpointSlice controller (kube-controller-manager's `endpointslice`): keeps the
`discovery.k8s.io/v1` EndpointSlices of every Service with a selector true to the
pods it selects.  The decision is `endpointslice_plan.plan_slices`; this module is
the loop around it.

* Informers: Services, pods (by namespace), nodes (zones; pods on a node not seen yet
  wait for it), and EndpointSlices indexed by the Service of those this controller
  manages.
* A Service event queues the Service; a pod event queues the Services of its
  namespace that select its old or new labels, when something an endpoint is made of
  changed (`services_for_pod_change`); a node event — a new node or a new zone —
  queues the Services of its pods; an event on one of our slices that is not our own
  write (someone edited or deleted it) queues its Service (`SliceTracker`).
* A sync reads only the caches.  When the slice cache lags behind our own writes it
  waits for it (a short re-queue) rather than create duplicates.  Writes go out in
  the order create, update, delete; a failed one records a `FailedToUpdateEndpointSlices`
  Warning on the Service and the sync is retried with back-off.
* A Service that is gone, turned ExternalName or lost its selector has its slices
  deleted (the garbage collector would remove those of a deleted Service too, later;
  Kubernetes leaves the slices of a Service whose selector was removed, and a
  consumer would then see them beside the mirrored ones).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fleet.client import ApiException
from fleet.controllers.endpoints_util import (
    ENDPOINTSLICE_CONTROLLER,
    SliceTracker,
    TriggerTimeTracker,
    manages_endpoints,
    selects,
    services_for_pod_change,
    slice_index,
)
from fleet.controllers.endpointslice_plan import (
    DEFAULT_MAX_ENDPOINTS_PER_SLICE,
    SlicePlan,
    plan_slices,
)
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    by_node_name,
    key_of,
    namespace_terminating,
    split_key,
)

log = logging.getLogger(__name__)

DISCOVERY_V1 = "discovery.k8s.io/v1"
SLICES = "endpointslices"
SLICE_INDEX = "endpointslice-service"
NODE_INDEX = "node"
# How soon to look again when the slice cache has not caught up with our writes, or
# after losing a write race (Kubernetes' endpointSliceChangeMinSyncDelay is 1 s).
STALE_RETRY = 0.1
# A pod on a node not in the cache yet: look again (the node's ADDED event also does).
MISSING_NODE_RETRY = 5.0


class StaleCache(Exception):
    """A write found the stored object changed: the informer will bring the new one."""


async def apply_slice_plan(client: Any, tracker: SliceTracker, plan: SlicePlan, namespace: str) -> None:
    """Write a plan: creates, updates, deletes, each recorded in `tracker`.  A conflict
    (409) or a slice gone (404 on update) raises `StaleCache`; a slice already gone
    on delete is fine; a namespace being deleted refuses creates — nothing to do."""
    for body in plan.create:
        try:
            created = await client.create(DISCOVERY_V1, SLICES, body, namespace)
        except ApiException as e:
            if namespace_terminating(e):
                return
            raise
        tracker.update(created)
    for body in plan.update:
        body.setdefault("apiVersion", DISCOVERY_V1)
        body.setdefault("kind", "EndpointSlice")
        try:
            updated = await client.replace(DISCOVERY_V1, SLICES, body["metadata"]["name"], body, namespace)
        except ApiException as e:
            if e.code in (404, 409):
                raise StaleCache(str(e)) from e
            raise
        tracker.update(updated)
    for old in plan.delete:
        name = (old.get("metadata") or {}).get("name")
        try:
            await client.delete(DISCOVERY_V1, SLICES, name, namespace)
        except ApiException as e:
            if e.code != 404:
                raise
        tracker.expect_deletion(old)


class EndpointSliceController(QueueWorker):
    name = "endpointslice"
    kind = "Service"
    workers = 2

    def __init__(self, max_endpoints_per_slice: int = DEFAULT_MAX_ENDPOINTS_PER_SLICE) -> None:
        super().__init__()
        if not 1 <= max_endpoints_per_slice <= 1000:
            raise ValueError("max-endpoints-per-slice must be between 1 and 1000")
        self.max_per_slice = max_endpoints_per_slice
        self.tracker = SliceTracker()
        self.triggers = TriggerTimeTracker()

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.services: SharedInformer = ctx.informers.informer("v1", "services")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.nodes: SharedInformer = ctx.informers.informer("v1", "nodes")
        self.slices: SharedInformer = ctx.informers.informer(DISCOVERY_V1, SLICES)
        self.slices.add_index(SLICE_INDEX, slice_index(ENDPOINTSLICE_CONTROLLER))
        self.pods.add_index(NODE_INDEX, by_node_name)
        self.services.add_handler(lambda t, old, new: self.enqueue(new if new is not None else old))
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(self._on_node)
        self.slices.add_handler(self._on_slice)

    # -- events ---------------------------------------------------------------------------
    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        ns = ((pod or {}).get("metadata") or {}).get("namespace") or ""
        for svc in services_for_pod_change(self.services.list(ns), old, new):
            self.queue.add(key_of(svc))

    def _on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        if old is not None and _zone(old) == _zone(new):
            return
        for pod in self.pods.by_index(NODE_INDEX, (new.get("metadata") or {}).get("name") or ""):
            ns = (pod.get("metadata") or {}).get("namespace") or ""
            for svc in self.services.list(ns):
                if selects(svc, pod):
                    self.queue.add(key_of(svc))

    def _on_slice(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for key in self.tracker.keys_to_sync(ENDPOINTSLICE_CONTROLLER, old, new):
            self.queue.add(key)

    # -- sync -----------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        ns, _ = split_key(key)
        service = self.services.get(key)
        slices = [s for s in self.slices.by_index(SLICE_INDEX, key)
                  if not (s.get("metadata") or {}).get("deletionTimestamp")]
        if service is None or not manages_endpoints(service):
            if service is None:
                self.triggers.delete_service(key)
            if slices:
                await apply_slice_plan(self.ctx.client, self.tracker, SlicePlan(delete=slices), ns)
            elif service is None:
                self.tracker.delete_service(key)
            return None
        if self.tracker.stale(key, slices):
            return STALE_RETRY
        pods = [p for p in self.pods.list(ns) if selects(service, p)]
        trigger = self.triggers.compute(key, service, pods)
        nodes = {}
        for name in {str((p.get("spec") or {}).get("nodeName") or "") for p in pods} - {""}:
            if (node := self.nodes.get(f"/{name}")) is not None:
                nodes[name] = node
        plan = plan_slices(service, pods, nodes, slices, max_per_slice=self.max_per_slice,
                           trigger_time=trigger)
        if not plan.empty:
            try:
                await apply_slice_plan(self.ctx.client, self.tracker, plan, ns)
            except StaleCache:
                return STALE_RETRY
            except ApiException as e:
                if self.ctx.events is not None:
                    self.ctx.events.record(service, "Warning", "FailedToUpdateEndpointSlices",
                                           f"Error updating Endpoint Slices for Service {key}: {e}")
                raise
        if plan.skipped_pods:
            log.info("endpointslice: %s: pods %s are on nodes not known yet", key, ", ".join(plan.skipped_pods))
            return MISSING_NODE_RETRY
        return None


def _zone(node: Mapping[str, Any]) -> str | None:
    return ((node.get("metadata") or {}).get("labels") or {}).get("topology.kubernetes.io/zone")
