"""The EndpointSlice mirroring controller (kube-controller-manager's
`endpointslicemirroring`): hand-made `v1 Endpoints` of Services without a selector
become EndpointSlices — how the `kubernetes` and `kube-system/kube-dns` Services,
whose Endpoints the server writes, reach the node dataplane and DNS, which read
slices only.  The decision is `endpointslicemirroring_plan.plan_mirror`; this module
is the loop around it.  Keys are the Endpoints' (= the Service's) "ns/name".

* An Endpoints event queues it (when it is or was mirrorable); a Service event queues
  it when the Service appears or goes without a selector, or gains or loses one; an
  event on one of our slices that is not our own write queues its Endpoints.
* No Endpoints, Endpoints not to mirror, no Service or a Service with a selector: the
  mirrored slices are deleted.
* The slice cache lagging behind our own writes → look again shortly (`SliceTracker`).
  Addresses skipped (not IPs, or past the per-subset limit) are reported as Warning
  events on the Endpoints (`InvalidIPAddress`, `TooManyAddressesToMirror`).
"""

from __future__ import annotations

import logging
from typing import Any

from fleet.client import ApiException
from fleet.controllers.endpoints_util import (
    MIRRORING_CONTROLLER,
    SliceTracker,
    service_selector,
    slice_index,
)
from fleet.controllers.endpointslice import (
    DISCOVERY_V1,
    SLICES,
    STALE_RETRY,
    StaleCache,
    apply_slice_plan,
)
from fleet.controllers.endpointslice_plan import SlicePlan
from fleet.controllers.endpointslicemirroring_plan import (
    DEFAULT_MAX_ENDPOINTS_PER_SUBSET,
    plan_mirror,
    should_mirror,
)
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, split_key

log = logging.getLogger(__name__)

MIRROR_INDEX = "mirrored-service"


class EndpointSliceMirroringController(QueueWorker):
    name = "endpointslicemirroring"
    kind = "Endpoints"
    workers = 2

    def __init__(self, max_endpoints_per_subset: int = DEFAULT_MAX_ENDPOINTS_PER_SUBSET) -> None:
        super().__init__()
        self.max_per_subset = max_endpoints_per_subset
        self.tracker = SliceTracker()

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.services: SharedInformer = ctx.informers.informer("v1", "services")
        self.endpoints: SharedInformer = ctx.informers.informer("v1", "endpoints")
        self.slices: SharedInformer = ctx.informers.informer(DISCOVERY_V1, SLICES)
        self.slices.add_index(MIRROR_INDEX, slice_index(MIRRORING_CONTROLLER))
        self.services.add_handler(self._on_service)
        self.endpoints.add_handler(self._on_endpoints)
        self.slices.add_handler(self._on_slice)

    def _on_service(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if old is not None and new is not None:
            if (service_selector(old) is None) != (service_selector(new) is None):
                self.enqueue(new)
            return
        obj = new if new is not None else old
        if obj is not None and service_selector(obj) is None:
            self.enqueue(obj)

    def _on_endpoints(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if should_mirror(old) or should_mirror(new):
            self.enqueue(new if new is not None else old)

    def _on_slice(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for key in self.tracker.keys_to_sync(MIRRORING_CONTROLLER, old, new):
            self.queue.add(key)

    async def reconcile(self, key: str) -> float | None:
        ns, _ = split_key(key)
        slices = [s for s in self.slices.by_index(MIRROR_INDEX, key)
                  if not (s.get("metadata") or {}).get("deletionTimestamp")]
        endpoints = self.endpoints.get(key)
        service = self.services.get(key)
        if (endpoints is None or not should_mirror(endpoints) or service is None
                or service_selector(service) is not None):
            if slices:
                await apply_slice_plan(self.ctx.client, self.tracker, SlicePlan(delete=slices), ns)
            else:
                self.tracker.delete_service(key)
            return None
        if self.tracker.stale(key, slices):
            return STALE_RETRY
        plan = plan_mirror(endpoints, slices, max_per_subset=self.max_per_subset)
        if self.ctx.events is not None:
            for reason, message in plan.events:
                self.ctx.events.record(endpoints, "Warning", reason, message)
        if plan.empty:
            return None
        try:
            await apply_slice_plan(self.ctx.client, self.tracker, plan, ns)
        except StaleCache:
            return STALE_RETRY
        except ApiException as e:
            log.info("endpointslicemirroring: %s: %s", key, e)
            raise
        return None
