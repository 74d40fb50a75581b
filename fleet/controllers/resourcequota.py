"""ResourceQuota controller: recompute each quota's `status` from the objects it counts.

kube-controller-manager's resourcequota controller (pkg/controller/resourcequota).
Admission charges a quota when an object is created (fleet/admission/
resourcequota.py) but never gives anything back; this controller does, by
counting again:

* `status.hard` mirrors `spec.hard` — a quota only takes effect once this is
  written, so a new quota or a changed limit is synced at once;
* `status.used` holds, for every resource in `hard`, the sum over the objects
  of the namespace that the quota's scopes select, by the same evaluators
  admission uses (fleet/api/quota.py): pods from the shared pod informer,
  anything else (services, secrets, `count/deployments.apps`...) from an
  informer this controller starts the first time a quota asks for it.

When it recounts (`reconcile`):

* a quota appears, or its `spec.hard` no longer matches `status.hard`;
* **replenishment** — an object a quota counts is deleted, a pod finishes
  (Succeeded/Failed frees its compute) or starts terminating, a service
  changes type: the quotas of that namespace counting that resource;
* every `resync_period` (kube-controller-manager's --resource-quota-sync-period,
  5 minutes), all quotas — this is what returns a charge whose object was in
  the end not stored.

A quota's own charges by admission (status.used only) do not trigger a
recount, as in Kubernetes: recounting from an informer while creates are in
flight could briefly under-count what admission has just charged.  The status
is written with the revision it was computed from, so a recount that raced
with an admission charge conflicts and is redone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from fleet.api import quota as q
from fleet.client import ApiException
from fleet.controllers.runtime import Context, QueueWorker, SharedInformer, key_of, split_key

log = logging.getLogger(__name__)

RESYNC_PERIOD = 300.0
INFORMER_SYNC_TIMEOUT = 30.0
CONFLICT_RETRY = 0.05


def _hard(quota: dict[str, Any], where: str) -> dict[str, Any]:
    return ((quota.get(where) or {}).get("hard")) or {}


def needs_sync(quota: dict[str, Any]) -> bool:
    """The quota has never been counted, or its limits changed since."""
    status = quota.get("status") or {}
    if status.get("hard") is None or status.get("used") is None:
        return True
    return not q.equals(q.parse_list(_hard(quota, "spec")), q.parse_list(_hard(quota, "status")))


def next_status(quota: dict[str, Any], usage: q.ResourceList) -> dict[str, Any] | None:
    """syncResourceQuota's decision: the status to write (hard from spec, used recounted
    where we could count, previous values kept elsewhere, masked to hard), or None
    when the stored status is current."""
    hard = q.parse_list(_hard(quota, "spec"))
    status = quota.get("status") or {}
    old_used = q.parse_list(status.get("used"))
    used = q.mask({**old_used, **usage}, hard)
    if (status.get("hard") is not None and status.get("used") is not None
            and q.equals(hard, q.parse_list(status.get("hard"))) and q.equals(used, old_used)):
        return None
    return {"hard": q.to_json(hard), "used": q.to_json(used)}


def pod_charge_changed(old: dict[str, Any] | None, new: dict[str, Any] | None, now: float) -> bool:
    """A pod update that changes what it costs (finished, or its deletion began)."""
    if old is None or new is None:
        return True
    if q.pod_is_terminal_for_quota(old, now) != q.pod_is_terminal_for_quota(new, now):
        return True
    return bool((new.get("metadata") or {}).get("deletionTimestamp")) != bool(
        (old.get("metadata") or {}).get("deletionTimestamp"))


class ResourceQuotaController(QueueWorker):
    name = "resourcequota"
    workers = 2

    def __init__(self, *, resync_period: float = RESYNC_PERIOD, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.resync_period = resync_period
        self.clock = clock
        # Informers started on demand for what quotas count, by (group, resource).
        self._counted: dict[tuple[str, str], SharedInformer] = {}
        self._nursery: trio.Nursery | None = None

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.quotas: SharedInformer = ctx.informers.informer("v1", "resourcequotas")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.quotas.add_handler(self._on_quota)
        self.pods.add_handler(self._on_pod)

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            self._nursery = n
            n.start_soon(self._resync)
            await super().run(ctx)

    async def _resync(self) -> None:
        while True:
            await trio.sleep(self.resync_period)
            for quota in self.quotas.list():
                self.enqueue(quota)

    # -- what triggers a recount ----------------------------------------------------------
    def _on_quota(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and (etype == "ADDED" or needs_sync(new) or old is None
                                or (old.get("spec") or {}) != (new.get("spec") or {})):
            self.enqueue(new)
        # A quota counting quotas changes with every quota created or deleted.
        obj = new if new is not None else old
        if obj is not None and etype in ("ADDED", "DELETED"):
            self.replenish(obj["metadata"].get("namespace", ""), "", q.QUOTAS, skip=key_of(obj))

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "ADDED":
            return  # admission charged it already
        if etype == "DELETED" or pod_charge_changed(old, new, self.clock()):
            pod = new if new is not None else old
            assert pod is not None
            self.replenish(pod["metadata"].get("namespace", ""), "", q.PODS)

    def _on_counted(self, group: str, resource: str) -> Callable[[str, Any, Any], None]:
        def handler(etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            if etype == "ADDED":
                return
            if etype == "MODIFIED" and (resource != q.SERVICES or (
                    ((old or {}).get("spec") or {}).get("type") == ((new or {}).get("spec") or {}).get("type"))):
                return
            obj = new if new is not None else old
            if obj is not None:
                self.replenish(obj["metadata"].get("namespace", ""), group, resource)
        return handler

    def replenish(self, namespace: str, group: str, resource: str, *, skip: str = "") -> None:
        """Recount the namespace's quotas that count this resource."""
        if not self.quotas.synced.is_set():
            return  # quotas not listed yet: each will be counted when it is
        evaluator = q.evaluator_for(group, resource)
        for quota in self.quotas.list(namespace):
            if key_of(quota) != skip and evaluator.matching_resources(_hard(quota, "spec")):
                self.enqueue(quota)

    # -- counting -----------------------------------------------------------------------
    async def _objects(self, namespace: str, group: str, resource: str) -> list[dict[str, Any]] | None:
        """The namespace's objects of a resource, or None when the server does not serve it."""
        if (group, resource) == ("", q.PODS):
            return self.pods.list(namespace)
        if (group, resource) == ("", q.QUOTAS):
            return self.quotas.list(namespace)
        inf = self._counted.get((group, resource))
        if inf is None:
            api_version = await self._api_version(group, resource)
            if api_version is None:
                return None
            inf = SharedInformer(self.ctx.client, api_version, resource, component="controller-manager")
            inf.add_handler(self._on_counted(group, resource))
            self._counted[(group, resource)] = inf
            assert self._nursery is not None
            self._nursery.start_soon(inf.run)
        with trio.fail_after(INFORMER_SYNC_TIMEOUT):
            await inf.wait_synced()
        return inf.list(namespace)

    async def _api_version(self, group: str, resource: str) -> str | None:
        for res in await self.ctx.client.discover():
            if res.group == group and res.name == resource and res.preferred and res.namespaced \
                    and res.has_verb("list") and res.has_verb("watch"):
                return res.api_version
        # A resource added after our discovery was cached (a new CRD): look again.
        for res in await self.ctx.client.discover(refresh=True):
            if res.group == group and res.name == resource and res.preferred and res.namespaced:
                return res.api_version
        return None

    async def usage(self, quota: dict[str, Any]) -> q.ResourceList:
        """CalculateUsage: every resource of spec.hard some evaluator can count."""
        ns = quota["metadata"].get("namespace", "")
        targets: set[tuple[str, str]] = set()
        for name in _hard(quota, "spec"):
            target = q.resources_for_quota_name(name)
            if target is not None:
                targets.add(target)
        now = self.clock()
        out: q.ResourceList = {}
        for group, resource in sorted(targets):
            objects = await self._objects(ns, group, resource)
            if objects is None:
                continue
            out.update(q.calculate_usage(q.evaluator_for(group, resource), quota, objects, now))
        return out

    async def reconcile(self, key: str) -> float | None:
        quota = self.quotas.get(key)
        if quota is None:
            return None
        status = next_status(quota, await self.usage(quota))
        if status is None:
            return None
        ns, name = split_key(key)
        try:
            await self.ctx.client.replace("v1", "resourcequotas", name, dict(quota, status=status), ns,
                                          subresource="status")
        except ApiException as e:
            if e.code == 404:
                return None
            if e.code == 409:
                # Admission charged the quota meanwhile: recount against the fresh one, which
                # the informer will have by then.
                return CONFLICT_RETRY
            raise
        return None
