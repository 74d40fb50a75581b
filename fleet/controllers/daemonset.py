"""DaemonSet controller: one pod on every node that should run it, following nodes as they come and go.

As kube-controller-manager's daemonset controller:

* **Which nodes.** A node should run the daemon when the pod template fits it:
  `spec.nodeName` (if set) names it, `nodeSelector` and required node affinity
  match its labels (matchFields on `metadata.name`), and the pod tolerates its
  NoSchedule/NoExecute taints.  Before judging, the template gets the
  tolerations every DaemonSet pod gets — not-ready and unreachable NoExecute
  forever (a daemon must survive its node's trouble), disk-, memory- and
  pid-pressure and unschedulable NoSchedule (daemons run on cordoned nodes),
  network-unavailable NoSchedule for hostNetwork pods.  A pod already running
  on a node that only gained an untolerated NoSchedule taint may stay; an
  untolerated NoExecute taint (or a changed label) removes it.
* **Placement through the scheduler.** Pods are created with a required node
  affinity `matchFields metadata.name In [<node>]` (Kubernetes since 1.12), so
  the ordinary scheduler binds them — resources, ports and priorities are
  checked once, in one place.
* **Nodes coming and going.** Node events re-evaluate every DaemonSet: a
  joining node gets its pod, a node whose labels or taints no longer fit loses
  it; pods of a deleted node are removed by the pod garbage collector (node
  lifecycle controller), and unscheduled pods aimed at it by this controller.
  Failed daemon pods are deleted and re-created, with a per-node back-off so a
  node that keeps rejecting the pod is not hot-looped.
* **Updates.** Each template is a ControllerRevision; pods carry its hash in
  `controller-revision-hash`.  `RollingUpdate` with `maxSurge: 0` deletes old
  pods while at most `maxUnavailable` (int or %, rounded up) nodes lack an
  available up-to-date pod; with `maxSurge` > 0 it starts the new pod beside the
  old one (at most maxSurge at once) and deletes the old pod once the new one is
  available.  `OnDelete` waits for users to delete pods.
* **Status**: desired/current/misscheduled/ready/updated/available/unavailable
  counts and `observedGeneration` (only once the controller's own writes have
  been seen), which `kubectl rollout status daemonset/x` reads.

`plan_daemonset` is the pure decision (with `node_should_run` and the rest of
it, in `fleet/controllers/daemonset_plan.py`); this module is the I/O loop:
`DaemonSetController.reconcile` feeds it the caches, keeps the history and
applies it (creations in slow-start batches, as Kubernetes does, so a refusing
API is not flooded; failed pods replaced with a per-node back-off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from fleet.api import owners
from fleet.client import MERGE_PATCH, ApiException
from fleet.controllers import history, podstate
from fleet.controllers.daemonset_plan import (
    API_VERSION,
    HASH_LABEL,
    KIND,
    DaemonSetPlan,
    daemon_pod,
    plan_daemonset,
    status_changed,
)
from fleet.controllers.runtime import (
    OWNED_INDEX,
    Context,
    Expectations,
    QueueWorker,
    SharedInformer,
    claim_owned,
    controller_key,
    index_claimable,
    key_of,
    split_key,
)

log = logging.getLogger(__name__)

BURST_REPLICAS = 250  # creations/deletions per reconcile (kube-controller-manager's burstReplicas)
FAILED_BACKOFF_INITIAL, FAILED_BACKOFF_MAX = 1.0, 900.0
EXPECTATIONS_RECHECK = 5.0
WRITE_CONCURRENCY = 16  # pod creations/deletions in flight at once


async def slow_start(items: Sequence[Any], fn: Callable[[Any], Awaitable[None]], *,
                     concurrency: int = WRITE_CONCURRENCY) -> tuple[int, list[Exception]]:
    """Run fn over items in batches of 1, 2, 4, … concurrently; stop after a batch with errors.

    Returns (how many were attempted, the errors).  If the API refuses one
    create (a quota, a bad template) it will refuse the rest: one failed call,
    not a thousand (controller.slowStartBatch).  At most `concurrency` calls are
    in flight, so a thousand-node cluster does not flood the API server."""
    done = 0
    batch = 1
    errors: list[Exception] = []
    limiter = trio.CapacityLimiter(concurrency)
    while done < len(items) and not errors:
        chunk = items[done:done + batch]
        async with trio.open_nursery() as n:
            for item in chunk:
                n.start_soon(_collect, fn, item, errors, limiter)
        done += len(chunk)
        batch *= 2
    return done, errors


# ---------------------------------------------------------------------------------------
# The controller


@dataclass
class _Backoff:
    delay: float
    until: float


class DaemonSetController(QueueWorker):
    name = "daemonset"
    workers = 2

    def __init__(self) -> None:
        super().__init__()
        self.expectations = Expectations()
        self._failed_backoff: dict[str, _Backoff] = {}

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.sets: SharedInformer = ctx.informers.informer(API_VERSION, "daemonsets")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.nodes: SharedInformer = ctx.informers.informer("v1", "nodes")
        self.revisions: SharedInformer = ctx.informers.informer(API_VERSION, "controllerrevisions")
        for inf in (self.pods, self.revisions):
            index_claimable(inf)
        self.sets.add_handler(self._on_set)
        self.pods.add_handler(self._on_pod)
        self.nodes.add_handler(self._on_node)
        self.revisions.add_handler(self._on_revision)

    # -- event handlers ----------------------------------------------------------------------
    def _on_set(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new if new is not None else old
        if obj is None:
            return
        if etype == "DELETED":
            self.expectations.forget(key_of(obj))
            prefix = f"{podstate.uid_of(obj)}/"
            for bkey in [k for k in self._failed_backoff if k.startswith(prefix)]:
                del self._failed_backoff[bkey]
        self.queue.add(key_of(obj))

    @staticmethod
    def _owner_key(obj: Mapping[str, Any] | None) -> str | None:
        return controller_key(obj, API_VERSION, KIND)

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        pod = new if new is not None else old
        if pod is None:
            return
        key = self._owner_key(pod)
        if etype == "ADDED" and key:
            self.expectations.creation_observed(key)
        if key and (etype == "DELETED" or (podstate.is_terminating(pod)
                                          and not (old is not None and podstate.is_terminating(old)))):
            self.expectations.deletion_observed(key, podstate.uid_of(pod))
        for k in {key, self._owner_key(old)} - {None}:
            self.queue.add(k)  # type: ignore[arg-type]
        if key is None and etype != "DELETED" and not podstate.is_terminating(pod):
            ns = (pod.get("metadata") or {}).get("namespace") or ""
            labels = podstate.labels_of(pod)
            for ds in self.sets.list(ns):
                if podstate.selector_matches((ds.get("spec") or {}).get("selector"), labels):
                    self.queue.add(key_of(ds))

    @staticmethod
    def _fit_facts(node: Mapping[str, Any] | None) -> Any:
        """What of a node decides whether daemons run there (heartbeats do not)."""
        if node is None:
            return None
        spec = node.get("spec") or {}
        return (podstate.labels_of(node), spec.get("taints"), spec.get("unschedulable"))

    def _on_node(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if etype == "MODIFIED" and self._fit_facts(old) == self._fit_facts(new):
            return
        for ds in self.sets.list():
            self.queue.add(key_of(ds))

    def _on_revision(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for obj in (old, new):
            key = self._owner_key(obj)
            if key:
                self.queue.add(key)

    # -- reconcile ----------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        ds = self.sets.get(key)
        if ds is None:
            self.expectations.forget(key)
            return None
        selector = (ds.get("spec") or {}).get("selector")
        if not isinstance(selector, dict) or not podstate.uid_of(ds):
            return None
        if podstate.is_terminating(ds):
            # The garbage collector is removing its pods and history; nothing to keep up.
            return None
        ns, _ = split_key(key)
        revisions = await self._claim_revisions(ds, ns)
        current, old, collision = await self._construct_history(ds, revisions)
        hash_ = podstate.labels_of(current).get(HASH_LABEL) or podstate.name_of(current)
        pods = await self._claim_pods(ds, ns)
        act = self.expectations.satisfied(key)
        plan = plan_daemonset(ds, self.nodes.list(), pods, hash_, time.time(), act=act)
        again = plan.requeue_after
        try:
            if act:
                again = _min(again, await self._apply(key, ds, hash_, plan))
        finally:
            status = dict(plan.status)
            if collision != _int((ds.get("status") or {}).get("collisionCount")):
                status["collisionCount"] = collision
            await self._write_status(ds, status)
        if act:
            await self._cleanup_history(ds, old, pods)
        return again if act else _min(again, EXPECTATIONS_RECHECK)

    async def _claim_pods(self, ds: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        selector = (ds.get("spec") or {}).get("selector")
        return await claim_owned(
            self.ctx.client, self.pods, ds, ns,
            lambda p: podstate.selector_matches(selector, podstate.labels_of(p)),
            api_version=API_VERSION, kind=KIND, resource=("v1", "pods"))

    async def _claim_revisions(self, ds: dict[str, Any], ns: str) -> list[dict[str, Any]]:
        selector = (ds.get("spec") or {}).get("selector")
        return await claim_owned(
            self.ctx.client, self.revisions, ds, ns,
            lambda r: podstate.selector_matches(selector, podstate.labels_of(r)),
            api_version=API_VERSION, kind=KIND, resource=(API_VERSION, "controllerrevisions"),
            release=False)

    async def _construct_history(self, ds: dict[str, Any], revisions: list[dict[str, Any]]
                                 ) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
        """(current revision, older revisions, collisionCount) — constructHistory."""
        ns = (ds.get("metadata") or {}).get("namespace") or ""
        client = self.ctx.client
        data = history.template_patch(ds)
        collision = _int((ds.get("status") or {}).get("collisionCount"))
        current = [r for r in revisions if history.same_data(r, data)]
        old = [r for r in revisions if not history.same_data(r, data)]
        n = max((history.number(r) for r in old), default=0) + 1
        if not current:
            template = (ds.get("spec") or {}).get("template") or {}
            hash_ = history.hash_data(template, collision)
            body = history.build_revision(
                ds, owners.controller_ref(ds, api_version=API_VERSION, kind=KIND), data, n,
                name=history.revision_name(podstate.name_of(ds), hash_),
                labels={**((template.get("metadata") or {}).get("labels") or {}), HASH_LABEL: hash_},
                annotations=(ds.get("metadata") or {}).get("annotations"))
            try:
                return await client.create(API_VERSION, "controllerrevisions", body, ns), old, collision
            except ApiException as e:
                if e.code != 409:
                    raise
            existing = await client.get_object(API_VERSION, "controllerrevisions", body["metadata"]["name"], ns)
            if history.same_data(existing, data):
                return existing, old, collision
            await client.patch(API_VERSION, "daemonsets", podstate.name_of(ds),
                               {"status": {"collisionCount": collision + 1}}, MERGE_PATCH, ns,
                               subresource="status")
            raise RuntimeError(f"revision name {body['metadata']['name']} collides; collisionCount raised")
        keep = max(current, key=history.number)
        keep_hash = podstate.labels_of(keep).get(HASH_LABEL) or podstate.name_of(keep)
        for dup in current:
            if dup is keep:
                continue
            # Duplicates of the live template (a rollback raced a rollout): relabel their pods, drop them.
            dup_hash = podstate.labels_of(dup).get(HASH_LABEL)
            for pod in self.pods.by_index(OWNED_INDEX, podstate.uid_of(ds)):
                if dup_hash and podstate.labels_of(pod).get(HASH_LABEL) == dup_hash:
                    await client.patch("v1", "pods", podstate.name_of(pod),
                                       {"metadata": {"labels": {HASH_LABEL: keep_hash}}}, MERGE_PATCH, ns)
            try:
                await client.delete(API_VERSION, "controllerrevisions", podstate.name_of(dup), ns)
            except ApiException as e:
                if e.code != 404:
                    raise
        if history.number(keep) < n:
            keep = await client.patch(API_VERSION, "controllerrevisions", podstate.name_of(keep),
                                      {"revision": n}, MERGE_PATCH, ns)
        return keep, old, collision

    async def _apply(self, key: str, ds: dict[str, Any], hash_: str, plan: DaemonSetPlan) -> float | None:
        """Carry out the plan; returns when to look again for back-offs (None: no need)."""
        ns, name = split_key(key)
        client, events = self.ctx.client, self.ctx.events
        deletes = list(plan.delete)
        again: float | None = None
        now = trio.current_time()
        for node, pod in plan.failed:
            bkey = f"{podstate.uid_of(ds)}/{node}"
            b = self._failed_backoff.get(bkey)
            if b is not None and now < b.until:
                again = _min(again, b.until - now)
                continue
            # A node that has behaved for a long while starts over (client-go Backoff's GC).
            fresh = b is None or now - b.until > 2 * FAILED_BACKOFF_MAX
            delay = FAILED_BACKOFF_INITIAL if fresh or b is None else min(b.delay * 2, FAILED_BACKOFF_MAX)
            self._failed_backoff[bkey] = _Backoff(delay, now + delay)
            events.record(ds, "Warning", "FailedDaemonPod",
                          f"Found failed daemon pod {ns}/{podstate.name_of(pod)} on node {node}, will try to kill it")
            deletes.append(pod)
        for node, pod in plan.succeeded:
            events.record(ds, "Normal", "SucceededDaemonPod",
                          f"Found succeeded daemon pod {ns}/{podstate.name_of(pod)} on node {node}, "
                          "will try to delete it")
        create_on = plan.create_on[:BURST_REPLICAS]
        wanted = len(deletes)
        deletes = deletes[:BURST_REPLICAS]
        if create_on:
            self.expectations.expect_creations(key, len(create_on))
        if deletes:
            self.expectations.expect_deletions(key, [podstate.uid_of(p) for p in deletes])

        async def create(node: str) -> None:
            try:
                pod = await client.create("v1", "pods", daemon_pod(ds, hash_, node), ns)
            except BaseException as e:
                self.expectations.creation_failed(key)
                if isinstance(e, ApiException):
                    events.record(ds, "Warning", "FailedCreate", f"Error creating: {e}")
                raise
            events.record(ds, "Normal", "SuccessfulCreate", f"Created pod: {podstate.name_of(pod)}")

        attempted, errors = await slow_start(create_on, create)
        for _ in range(len(create_on) - attempted):
            self.expectations.creation_failed(key)  # never attempted: not to be waited for

        async def delete(pod: dict[str, Any]) -> None:
            pname, uid = podstate.name_of(pod), podstate.uid_of(pod)
            try:
                await client.delete("v1", "pods", pname, ns, body={"preconditions": {"uid": uid}})
            except BaseException as e:
                self.expectations.deletion_observed(key, uid)
                if isinstance(e, ApiException) and e.code in (404, 409):
                    return
                if isinstance(e, ApiException):
                    events.record(ds, "Warning", "FailedDelete", f"Error deleting: {e}")
                raise
            events.record(ds, "Normal", "SuccessfulDelete", f"Deleted pod: {pname}")

        limiter = trio.CapacityLimiter(WRITE_CONCURRENCY)
        async with trio.open_nursery() as n:
            for pod in deletes:
                n.start_soon(_collect, delete, pod, errors, limiter)
        if errors:
            raise errors[0]
        if len(plan.create_on) > len(create_on) or wanted > len(deletes):
            again = 0.0  # more than one burst's worth: continue at once
        log.debug("daemonset %s: created %d, deleted %d", name, len(create_on), len(deletes))
        return again

    async def _write_status(self, ds: dict[str, Any], status: dict[str, Any]) -> None:
        if not status_changed(ds, status):
            return
        ns = (ds.get("metadata") or {}).get("namespace") or ""
        try:
            await self.ctx.client.patch(API_VERSION, "daemonsets", podstate.name_of(ds), {"status": status},
                                        MERGE_PATCH, ns, subresource="status")
        except ApiException as e:
            if e.code != 404:
                raise

    async def _cleanup_history(self, ds: dict[str, Any], old: list[dict[str, Any]],
                               pods: list[dict[str, Any]]) -> None:
        limit = _int((ds.get("spec") or {}).get("revisionHistoryLimit"), 10)
        live_hashes = {podstate.labels_of(p).get(HASH_LABEL) for p in pods} - {None}
        live = {podstate.name_of(r) for r in old if podstate.labels_of(r).get(HASH_LABEL) in live_hashes}
        ns = (ds.get("metadata") or {}).get("namespace") or ""
        excess = len(old) - limit
        if excess <= 0:
            return
        for r in history.history_to_delete(old, live, 0)[:excess]:
            try:
                await self.ctx.client.delete(API_VERSION, "controllerrevisions", podstate.name_of(r), ns)
            except ApiException as e:
                if e.code != 404:
                    raise


async def _collect(fn: Callable[[Any], Awaitable[None]], item: Any, errors: list[Exception],
                   limiter: trio.CapacityLimiter) -> None:
    async with limiter:
        try:
            await fn(item)
        except Exception as e:  # noqa: BLE001 - reported together by the caller
            errors.append(e)


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
