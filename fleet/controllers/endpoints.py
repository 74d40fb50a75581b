"""The Endpoints controller (kube-controller-manager's `endpoint`): the legacy
`v1 Endpoints` of every Service with a selector, named like the Service.  The
decision is `endpoints_plan.plan_endpoints`; this module is the loop around it.

* Informers: Services, pods (by namespace), Endpoints.  A Service event queues it; a
  pod event queues the Services that select its old or new labels when something an
  address is made of changed; an Endpoints deletion queues its Service (a Service
  that still exists gets them back).
* Endpoints of a Service without a selector are the user's (or the server's, for
  `kubernetes` and `kube-system/kube-dns`): never touched.  Endpoints of a Service
  that is gone are deleted — at start-up too, for Services deleted while the
  controller was not running (checkLeftoverEndpoints), leader-election locks aside.
* A write that fails records `FailedToCreateEndpoint` / `FailedToUpdateEndpoint`
  on the Endpoints and is retried with back-off; a conflict is retried shortly.
"""

from __future__ import annotations

import logging
from typing import Any

from fleet.client import ApiException
from fleet.controllers.endpoints_plan import plan_endpoints
from fleet.controllers.endpoints_util import (
    LEADER_ANNOTATION,
    TriggerTimeTracker,
    manages_endpoints,
    selects,
    services_for_pod_change,
)
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    key_of,
    namespace_terminating,
    split_key,
)

log = logging.getLogger(__name__)

CONFLICT_RETRY = 0.1


class EndpointsController(QueueWorker):
    name = "endpoint"
    kind = "Service"
    workers = 2

    def __init__(self) -> None:
        super().__init__()
        self.triggers = TriggerTimeTracker()

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.services: SharedInformer = ctx.informers.informer("v1", "services")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.endpoints: SharedInformer = ctx.informers.informer("v1", "endpoints")
        self.services.add_handler(lambda t, old, new: self.enqueue(new if new is not None else old))
        self.pods.add_handler(self._on_pod)
        self.endpoints.add_handler(self._on_endpoints)

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        ns = ((pod or {}).get("metadata") or {}).get("namespace") or ""
        for svc in services_for_pod_change(self.services.list(ns), old, new):
            self.queue.add(key_of(svc))

    def _on_endpoints(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None and old is not None:
            self.queue.add(key_of(old))

    async def run(self, ctx: Context) -> None:
        await self.services.wait_synced()
        await self.endpoints.wait_synced()
        # checkLeftoverEndpoints: Endpoints whose Service went away while we were down.
        for ep in self.endpoints.list():
            if LEADER_ANNOTATION not in ((ep.get("metadata") or {}).get("annotations") or {}):
                if self.services.get(key_of(ep)) is None:
                    self.queue.add(key_of(ep))
        await super().run(ctx)

    async def reconcile(self, key: str) -> float | None:
        ns, name = split_key(key)
        service = self.services.get(key)
        client = self.ctx.client
        if service is None:
            self.triggers.delete_service(key)
            current = self.endpoints.get(key)
            if current is not None and LEADER_ANNOTATION in ((current.get("metadata") or {}).get("annotations") or {}):
                return None
            try:
                await client.delete("v1", "endpoints", name, ns)
            except ApiException as e:
                if e.code != 404:
                    raise
            return None
        if not manages_endpoints(service):
            return None
        pods = [p for p in self.pods.list(ns) if selects(service, p)]
        trigger = self.triggers.compute(key, service, pods)
        current = self.endpoints.get(key)
        body = plan_endpoints(service, pods, current, trigger_time=trigger)
        if body is None:
            return None
        try:
            if current is None:
                await client.create("v1", "endpoints", body, ns)
            else:
                await client.replace("v1", "endpoints", name, body, ns)
        except ApiException as e:
            if e.code == 409 or (e.code == 404 and current is not None):
                return CONFLICT_RETRY  # the cache is behind: the informer brings the stored one
            if namespace_terminating(e):
                return None
            if self.ctx.events is not None:
                reason, verb = (("FailedToCreateEndpoint", "create") if current is None
                                else ("FailedToUpdateEndpoint", "update"))
                self.ctx.events.record(body, "Warning", reason,
                                       f"Failed to {verb} endpoint for service {key}: {e}")
            raise
        return None
