"""Deployment controller: the thin I/O loop around the rollout decision.

As kube-controller-manager's deployment controller.  What one pass does — claim,
scale, roll (RollingUpdate / Recreate), history, status — is decided by the pure
`plan(deployment, replicasets, pods, now=...)` in `fleet/controllers/deployment_plan.py`
(its docstring tells the whole pass; its arithmetic and conditions are
`fleet/controllers/deployment_util.py`).  This module owns only what touches the
cluster: the informers and their event handlers, the reads a pass decides from,
the writes of a plan (adoption guarded by a fresh read, ReplicaSet creates and
whole-object replaces, annotation and status patches, deletes with a uid
precondition), and `_Writes`, which holds a pass back until the informer has
caught up with this controller's own last writes.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from typing import Any

from fleet.api import owners
from fleet.client import JSON_PATCH, MERGE_PATCH, ApiException
from fleet.controllers.deployment_plan import DeploymentPlan, failed_create_status, plan
from fleet.controllers.deployment_util import API_VERSION, KIND, RS_CREATE_ERROR, Obj, is_rolling
from fleet.controllers.replicaset import (
    CONTROLLER_INDEX,
    meta,
    selects,
    status_patch,
)
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    by_controller_uid,
    key_of,
)

log = logging.getLogger(__name__)


def _rv(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(meta(obj or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class _Writes:
    """ReplicaSet versions this controller wrote, per Deployment: until the informer
    shows at least those, a pass would decide from an older picture than its own
    last write (and its writes would only meet conflicts)."""

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._w: dict[str, tuple[float, dict[str, int]]] = {}

    def wrote(self, key: str, name: str, rv: int) -> None:
        names = self._w.get(key, (0.0, {}))[1]
        names[name] = max(rv, names.get(name, 0))
        self._w[key] = (time.monotonic(), names)

    def observed(self, key: str, name: str, rv: int | None) -> None:
        """The informer showed `name` at `rv` (None: deleted)."""
        entry = self._w.get(key)
        if entry is None or name not in entry[1]:
            return
        if rv is None or rv >= entry[1][name]:
            entry[1].pop(name)
            if not entry[1]:
                self._w.pop(key, None)

    def seen(self, key: str, cache: SharedInformer, namespace: str) -> bool:
        entry = self._w.get(key)
        if entry is None:
            return True
        at, names = entry
        for name, rv in list(names.items()):
            cached = cache.get(f"{namespace}/{name}")
            if cached is not None and _rv(cached) >= rv:
                names.pop(name)
        if not names or time.monotonic() - at > self.ttl:
            self._w.pop(key, None)
            return True
        return False

    def forget(self, key: str) -> None:
        self._w.pop(key, None)


class DeploymentController(QueueWorker):
    name = "deployment"
    workers = 4

    def __init__(self) -> None:
        super().__init__()
        self.writes = _Writes()

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.deployments: SharedInformer = ctx.informers.informer("apps/v1", "deployments")
        self.replicasets: SharedInformer = ctx.informers.informer("apps/v1", "replicasets")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.replicasets.add_index(CONTROLLER_INDEX, by_controller_uid)
        self.pods.add_index(CONTROLLER_INDEX, by_controller_uid)
        self.deployments.add_handler(self._on_deployment)
        self.replicasets.add_handler(self._on_replicaset)
        self.pods.add_handler(self._on_pod)

    # -- events -----------------------------------------------------------------------------
    def _on_deployment(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        if etype == "DELETED" and old is not None:
            self.writes.forget(key_of(old))
            self.enqueue(old)
        else:
            self.enqueue(new)

    def _owner(self, obj: Mapping[str, Any]) -> Obj | None:
        ref = owners.controller_of(obj)
        if ref is None or ref.get("kind") != "Deployment":
            return None
        d = self.deployments.get(f"{meta(obj).get('namespace') or ''}/{ref.get('name')}")
        if d is None or meta(d).get("uid") != ref.get("uid"):
            return None
        return d

    def _enqueue_selecting(self, rs: Mapping[str, Any]) -> None:
        for d in self.deployments.list(str(meta(rs).get("namespace") or "")):
            if selects(d, rs):
                self.enqueue(d)

    def _on_replicaset(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        for obj in (old, new):
            if obj is None:
                continue
            d = self._owner(obj)
            if d is not None:
                self.writes.observed(key_of(d), str(meta(obj).get("name")),
                                     None if etype == "DELETED" else _rv(obj))
                self.enqueue(d)
            elif owners.controller_of(obj) is None and (etype != "MODIFIED" or obj is new):
                self._enqueue_selecting(obj)

    def _on_pod(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        # Only Recreate waits on pods (for the old ones to be gone).
        if etype != "DELETED" or old is None:
            return
        ref = owners.controller_of(old)
        if ref is None or ref.get("kind") != "ReplicaSet":
            return
        rs = self.replicasets.get(f"{meta(old).get('namespace') or ''}/{ref.get('name')}")
        d = self._owner(rs) if rs is not None else None
        if d is not None and not is_rolling(d):
            self.enqueue(d)

    # -- one pass ---------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        d = self.deployments.get(key)
        if d is None:
            self.writes.forget(key)
            return None
        ns = str(meta(d).get("namespace") or "")
        if not self.writes.seen(key, self.replicasets, ns):
            return 1.0  # the informer's update event comes first, normally
        rses = self.replicasets.list(ns)
        pods: list[Obj] = []
        if not is_rolling(d):
            for rs in self.replicasets.by_index(CONTROLLER_INDEX, str(meta(d).get("uid"))):
                pods.extend(self.pods.by_index(CONTROLLER_INDEX, str(meta(rs).get("uid"))))
        now = time.time()
        p = plan(d, rses, pods, now=now)
        client = self.ctx.client
        if (p.adopt or p.release) and not await self._claim(d, p):
            return 0.05  # the plan counted on ReplicaSets that did not change hands
        if p.create is not None:
            rs = p.create.rs
            body = copy.deepcopy(rs)
            body["metadata"].pop("creationTimestamp", None)
            try:
                created = await client.create("apps/v1", "replicasets", body, ns)
            except ApiException as e:
                if e.code == 409:
                    return 0.5  # our cache is behind (or a collision): decide again
                msg = f'Failed to create new replica set "{meta(rs).get("name")}": {e}'
                self.ctx.events.record(d, "Warning", RS_CREATE_ERROR, msg)
                st = failed_create_status(d, msg, now)
                if st is not None:
                    await self._write_status(d, st)
                raise
            self.writes.wrote(key, str(meta(created).get("name")), _rv(created))
        for etype, reason, message in p.events:  # the new ReplicaSet's first scale
            self.ctx.events.record(d, etype, reason, message)
        for w in p.update:
            try:
                stored = await client.replace("apps/v1", "replicasets", meta(w.rs)["name"], w.rs, ns)
            except ApiException as e:
                if e.code in (404, 409):
                    return 0.2  # changed under us: decide again from the fresh picture
                raise
            self.writes.wrote(key, str(meta(stored).get("name")), _rv(stored))
            if w.event:
                self.ctx.events.record(d, "Normal", "ScalingReplicaSet", w.event)
        if p.annotations:
            try:
                await client.patch("apps/v1", "deployments", meta(d)["name"],
                                   {"metadata": {"annotations": p.annotations}}, MERGE_PATCH, ns)
            except ApiException as e:
                if e.code != 404:
                    raise
        for rs in p.delete:
            try:
                await client.delete("apps/v1", "replicasets", meta(rs)["name"], ns,
                                    body={"preconditions": {"uid": meta(rs).get("uid")}})
            except ApiException as e:
                if e.code not in (404, 409):
                    raise
        if p.status is not None:
            await self._write_status(d, p.status)
        return p.requeue_after

    async def _write_status(self, d: Obj, status: Obj) -> None:
        patch = status_patch(d.get("status"), status)
        if patch is None:
            return
        try:
            await self.ctx.client.patch("apps/v1", "deployments", meta(d)["name"], {"status": patch},
                                        MERGE_PATCH, meta(d).get("namespace"), subresource="status")
        except ApiException as e:
            if e.code != 404:
                raise

    async def _claim(self, d: Obj, p: DeploymentPlan) -> bool:
        """Adopt (after a fresh read says the Deployment is still there and not being
        deleted) and release ReplicaSets, each write conditional on what we saw.
        False when any of it did not happen."""
        md = meta(d)
        client = self.ctx.client
        if p.adopt:
            try:
                fresh = await client.get_object("apps/v1", "deployments", md["name"], md.get("namespace"))
            except ApiException as e:
                if e.code == 404:
                    return False
                raise
            if meta(fresh).get("uid") != md.get("uid") or meta(fresh).get("deletionTimestamp"):
                return False
        patches = [*((rs, owners.adopt_patch(rs, d, api_version=API_VERSION, kind=KIND))
                     for rs in p.adopt),
                   *((rs, owners.release_patch(rs, d)) for rs in p.release)]
        for rs, ops in patches:
            try:
                await client.patch("apps/v1", "replicasets", meta(rs)["name"], ops, JSON_PATCH,
                                   md.get("namespace"))
            except ApiException as e:
                if e.code not in (404, 409, 422):
                    raise
                return False  # not what we saw: the informer's event brings a fresh pass
        return True
