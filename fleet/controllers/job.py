"""Job controller: run pods to completion, count every finish exactly once.

What it does, as kube-controller-manager's job controller (1.31+ behaviour):

* **Pods.**  `parallelism` pods at a time, never more than the completions still
  missing (`completions` unset is the work-queue mode: once one pod succeeded no
  new pod starts and the Job completes when the rest have finished).  Indexed Jobs
  give each pod a completion index — `<job>-<index>-<rand>` names, the
  `batch.kubernetes.io/job-completion-index` annotation and label, hostname
  `<job>-<index>` and `JOB_COMPLETION_INDEX` read from that annotation through the
  downward API — and each index must succeed once.  Failed pods are replaced after
  an exponential back-off (10 s doubling, capped at 6 minutes), per Job or, with
  `backoffLimitPerIndex`, per index.
* **Counting with a finalizer.**  Every pod is created with the
  `batch.kubernetes.io/job-tracking` finalizer, so it cannot disappear before it
  is counted.  A finished pod is first written into
  `status.uncountedTerminatedPods` (Indexed successes straight into
  `completedIndexes`), then its finalizer is removed, then the uid moves from the
  uncounted list into `succeeded` / `failed`.  Every step is recorded before the
  next one starts, so a crash between any two loses nothing and counts nothing
  twice; every status write carries the resourceVersion it was computed from, so
  a stale cache can never write a stale count.
* **Ending.**  `backoffLimit`, `activeDeadlineSeconds`, `podFailurePolicy`
  (FailJob / FailIndex / Ignore / Count on exit codes and pod conditions) and
  `maxFailedIndexes` fail the Job; reaching its completions completes it.  As in
  Kubernetes 1.31, the decision is first written as an interim condition
  (`FailureTarget` / `SuccessCriteriaMet`), remaining pods are stopped, and
  `Failed` / `Complete` follow only when no pod is left terminating.
* **Suspend** deletes the active pods (not counted as failures: their finalizer
  is removed first) and sets `Suspended`; resuming restarts the deadline clock.
* **ttlSecondsAfterFinished** deletes the finished Job (propagation Background;
  the garbage collector removes its pods).

The decisions are pure functions — `assess` (what to create and delete),
`track` (what to count, which finalizers to remove), `settle` (moving counted
pods into the counters and finishing), in `job_plan.py`, over the rules of
`job_rules.py` (indexes, pod failure policy, back-off, the pod template) —
around a thin I/O loop in `JobController.reconcile` (this module).  Wall-clock times (startTime, deadlines, back-off
from pod finish times, TTL) come from an injectable `now`; waits are queue
delays on Trio's clock, so MockClock tests drive the whole controller.

Deviations from Kubernetes are listed in docs/compat.md ("Job and CronJob").
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from fleet.api import meta
from fleet.api.owners import adopt_patch, controller_of
from fleet.api.selectors import label_selector_from_dict
from fleet.client import JSON_PATCH, STRATEGIC_MERGE_PATCH, ApiException
from fleet.controllers.job_plan import (
    Assessment,
    IOResult,
    Observed,
    assess,
    finished_events,
    settle,
    track,
    ttl_remaining,
)
from fleet.controllers.job_rules import (
    POD_OWNER_INDEX,
    SLOW_START_INITIAL_BATCH,
    SYNC_BATCH_PERIOD,
    TRACKING_FINALIZER,
    Backoff,
    Event,
    Obj,
    _md,
    _uid,
    build_pod,
    has_tracking_finalizer,
    is_ready,
    is_terminated,
    job_finished,
    normalize_status,
)
from fleet.controllers.runtime import (
    Context,
    Expectations,
    QueueWorker,
    SharedInformer,
    WorkQueue,
    by_controller_uid,
    key_of,
    split_key,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# The controller


def _remove_finalizer_patch() -> Obj:
    return {"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}}


class JobController(QueueWorker):
    """Reconciles Jobs (and releases tracking finalizers of pods whose Job is gone)."""

    name = "job"
    workers = 3

    def __init__(self, *, now: Callable[[], _dt.datetime] = meta.utcnow,
                 batch_period: float = SYNC_BATCH_PERIOD) -> None:
        super().__init__()
        self.now = now
        self.batch_period = batch_period
        self.expectations = Expectations()
        self.orphans = WorkQueue()
        self._removing: dict[str, set[str]] = {}
        self._backoff: dict[str, Backoff] = {}

    # -- wiring -----------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.jobs: SharedInformer = ctx.informers.informer("batch/v1", "jobs")
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.pods.add_index(POD_OWNER_INDEX, by_controller_uid)
        self.jobs.add_handler(self._on_job)
        self.pods.add_handler(self._on_pod)

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(super().run, ctx)
            n.start_soon(self._orphan_worker)

    def _record(self, obj: Obj, events: Iterable[Event]) -> None:
        if self.ctx.events is None:
            return
        for type_, reason, message in events:
            self.ctx.events.record(obj, type_, reason, message)

    def _job_of(self, pod: Obj) -> Obj | None:
        ref = controller_of(pod)
        if not ref or ref.get("kind") != "Job":
            return None
        job = self.jobs.get(f"{_md(pod).get('namespace') or ''}/{ref.get('name')}")
        if job is None or _uid(job) != ref.get("uid"):
            return None
        return job

    def _on_job(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        job = new if new is not None else old
        if job is None:
            return
        key = key_of(job)
        if etype == "DELETED" or (new is not None and job_finished(new)):
            # Pods left holding our finalizer would never go away otherwise.
            for p in self.pods.by_index(POD_OWNER_INDEX, _uid(job)):
                if has_tracking_finalizer(p):
                    self.orphans.add(key_of(p))
        if etype == "MODIFIED" and old is not None and new is not None and \
                _md(old).get("generation") == _md(new).get("generation"):
            self.queue.add_after(key, self.batch_period)  # our own status writes
        else:
            self.queue.add(key)

    def _on_pod(self, etype: str, old: Obj | None, new: Obj | None) -> None:
        pod = new if new is not None else old
        if pod is None:
            return
        uid = _uid(pod)
        if etype == "MODIFIED" and old is not None and new is not None:
            if _md(old).get("resourceVersion") == _md(new).get("resourceVersion"):
                return
            old_ref, new_ref = controller_of(old), controller_of(new)
            if old_ref != new_ref and old_ref is not None:
                old_job = self._job_of(old)
                if old_job is not None:
                    self._observe_removal(key_of(old_job), uid, new)
                    self.queue.add_after(key_of(old_job), self.batch_period)
        job = self._job_of(pod)
        if job is None:
            if new is not None and has_tracking_finalizer(new):
                self.orphans.add(key_of(new))
            return
        key = key_of(job)
        if etype == "ADDED":
            if _md(pod).get("deletionTimestamp"):
                self.expectations.deletion_observed(key, uid)
            else:
                self.expectations.creation_observed(key)
        elif etype == "DELETED":
            self.expectations.deletion_observed(key, uid)
            self._observe_removal(key, uid, None)
        else:
            if _md(pod).get("deletionTimestamp"):
                self.expectations.deletion_observed(key, uid)
            self._observe_removal(key, uid, new)
        if job_finished(job) and new is not None and has_tracking_finalizer(new):
            self.orphans.add(key_of(new))
        self.queue.add_after(key, self.batch_period)

    def _observe_removal(self, key: str, uid: str, pod: Obj | None) -> None:
        if pod is None or not has_tracking_finalizer(pod):
            pending = self._removing.get(key)
            if pending is not None:
                pending.discard(uid)
                if not pending:
                    del self._removing[key]

    # -- reconcile --------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        try:
            return await self._sync(key)
        except ApiException as e:
            if e.code != 409:
                raise
            # Our copy of the Job was stale.  A newer version exists and its watch
            # event brings the Job back; a quiet look later covers the rest.
            log.debug("job %s: %s", key, e)
            return self.batch_period

    async def _sync(self, key: str) -> float | None:
        job = self.jobs.get(key)
        if job is None:
            self.expectations.forget(key)
            self._removing.pop(key, None)
            self._backoff.pop(key, None)
            return None
        if job_finished(job):
            self._backoff.pop(key, None)
            return await self._expire(job)
        if (job.get("spec") or {}).get("completionMode") not in (None, "NonIndexed", "Indexed"):
            self._record(job, [("Warning", "UnknownCompletionMode",
                                "Skipped Job sync because completion mode is unknown")])
            return None
        # Expectations first: a pod that appears after this point defers the decision.
        satisfied = self.expectations.satisfied(key)
        pods = await self._pods_for(job)
        now = self.now()
        a = assess(Observed(job=job, pods=pods, now=now, backoff=self._backoff.get(key, Backoff()),
                            removing=frozenset(self._removing.get(key, ())), satisfied=satisfied))
        io = await self._write_pods(key, job, a)
        t = track(a, io)
        status = normalize_status(t.status)
        current = job
        if status != normalize_status(job.get("status") or {}):
            current = await self._write_status(job, status)
            self._backoff[key] = a.backoff
        self._record(current, t.events)
        removed, remove_error = await self._remove_finalizers(key, t.remove_finalizers)
        settled, done = settle(t, t.tracked_uids - removed, self.now())
        settled = normalize_status(settled)
        if settled != normalize_status(current.get("status") or {}):
            current = await self._write_status(current, settled)
        if done and t.final is not None:
            self._record(current, finished_events(current, settled, t.final))
        if remove_error is not None:
            raise remove_error
        return a.requeue_after

    async def _pods_for(self, job: Obj) -> list[Obj]:
        pods = self.pods.by_index(POD_OWNER_INDEX, _uid(job))
        spec = job.get("spec") or {}
        if spec.get("manualSelector") is True and not _md(job).get("deletionTimestamp"):
            pods += await self._adopt(job, spec.get("selector"))
        return pods

    async def _adopt(self, job: Obj, selector: Any) -> list[Obj]:
        """Orphans matching a manual selector become this Job's (with our finalizer)."""
        try:
            sel = label_selector_from_dict(selector)
        except Exception:  # noqa: BLE001 - validation refuses bad selectors; never adopt on one
            return []
        md = _md(job)
        adopted: list[Obj] = []
        for p in self.pods.list(md.get("namespace") or ""):
            pmd = _md(p)
            if controller_of(p) is not None or pmd.get("deletionTimestamp") or is_terminated(p):
                continue
            if not sel.matches(pmd.get("labels") or {}):
                continue
            ops = adopt_patch(p, job, api_version="batch/v1", kind="Job", finalizers=[TRACKING_FINALIZER])
            try:
                got = await self.ctx.client.patch("v1", "pods", pmd["name"], ops, JSON_PATCH,
                                                  pmd.get("namespace"))
            except ApiException as e:
                if e.code in (404, 409, 422):
                    continue
                raise
            adopted.append(got)
        return adopted

    async def _write_pods(self, key: str, job: Obj, a: Assessment) -> IOResult:
        io = IOResult()
        if a.delete:
            await self._delete_pods(key, job, a, io)
        if a.create:
            await self._create_pods(key, job, a, io)
        return io

    async def _delete_pods(self, key: str, job: Obj, a: Assessment, io: IOResult) -> None:
        uids = [_uid(p) for p in a.delete]
        if a.manage_called:
            self.expectations.expect_deletions(key, uids)
        untracked: set[str] = set()
        failures: list[Exception] = []

        async def one(pod: Obj) -> None:
            pmd = _md(pod)
            ns, name, uid = pmd.get("namespace"), pmd.get("name"), _uid(pod)
            try:
                if a.untrack_deleted and has_tracking_finalizer(pod):
                    await self.ctx.client.patch("v1", "pods", name, _remove_finalizer_patch(),
                                                STRATEGIC_MERGE_PATCH, ns)
                    untracked.add(uid)
                await self.ctx.client.delete("v1", "pods", name, ns,
                                             body={"apiVersion": "v1", "kind": "DeleteOptions",
                                                   "preconditions": {"uid": uid}})
            except ApiException as e:
                if a.manage_called:
                    self.expectations.deletion_observed(key, uid)
                if e.code != 404:
                    io.delete_failed = True
                    failures.append(e)
                    self._record(job, [("Warning", "FailedDelete", f"Error deleting: {e}")])
                    return
            io.deleted += 1
            if is_ready(pod):
                io.deleted_ready += 1
            self._record(job, [("Normal", "SuccessfulDelete", f"Deleted pod: {name}")])

        async with trio.open_nursery() as n:
            for p in a.delete:
                n.start_soon(one, p)
        io.untracked = frozenset(untracked)
        if failures:
            log.info("job %s: %d pod deletions failed: %s", key, len(failures), failures[0])

    async def _create_pods(self, key: str, job: Obj, a: Assessment, io: IOResult) -> None:
        """Create in slow-start batches (1, 2, 4, ...): if pods cannot be created
        (a quota, a bad template) one failure stops the rest instead of hundreds."""
        todo = list(a.create)
        self.expectations.expect_creations(key, len(todo))
        batch = min(len(todo), SLOW_START_INITIAL_BATCH)
        ns = _md(job).get("namespace")
        while todo:
            chunk, todo = todo[:batch], todo[batch:]
            errors: list[ApiException] = []

            async def one(index: int | None, errors: list[ApiException] = errors) -> None:
                body = build_pod(job, index, a.index_failures.get(index) if index is not None else None)
                try:
                    got = await self.ctx.client.create("v1", "pods", body, ns)
                except ApiException as e:
                    self.expectations.creation_failed(key)
                    errors.append(e)
                    if e.code in (403, 404) and "terminat" in str(e).lower():
                        return  # the namespace is going away: nothing to report
                    self._record(job, [("Warning", "FailedCreate", f"Error creating: {e}")])
                    return
                io.created += 1
                self._record(job, [("Normal", "SuccessfulCreate", f"Created pod: {_md(got).get('name')}")])

            async with trio.open_nursery() as n:
                for index in chunk:
                    n.start_soon(one, index)
            if errors:
                for _ in todo:  # never attempted: not expected either
                    self.expectations.creation_failed(key)
                log.info("job %s: pod creation failed: %s", key, errors[0])
                return
            batch = min(2 * batch, len(todo))

    async def _write_status(self, job: Obj, status: Obj) -> Obj:
        """PUT the status subresource, based on the revision we computed from (409 if stale)."""
        body = copy.deepcopy(job)
        body["status"] = status
        md = _md(job)
        return await self.ctx.client.replace("batch/v1", "jobs", md["name"], body, md.get("namespace"),
                                             subresource="status")

    async def _remove_finalizers(self, key: str, pods: Sequence[Obj]) -> tuple[set[str], Exception | None]:
        """Drop our finalizer from counted pods; returns the uids done (or already gone)."""
        if not pods:
            return set(), None
        pending = self._removing.setdefault(key, set())
        pending.update(_uid(p) for p in pods)
        done: set[str] = set()
        error: list[Exception] = []

        async def one(pod: Obj) -> None:
            pmd, uid = _md(pod), _uid(pod)
            try:
                await self.ctx.client.patch("v1", "pods", pmd["name"], _remove_finalizer_patch(),
                                            STRATEGIC_MERGE_PATCH, pmd.get("namespace"))
            except ApiException as e:
                pending.discard(uid)
                if e.code == 404:
                    done.add(uid)
                else:
                    error.append(e)
                return
            done.add(uid)

        async with trio.open_nursery() as n:
            for p in pods:
                n.start_soon(one, p)
        if not pending:
            self._removing.pop(key, None)
        return done, (error[0] if error else None)

    async def _expire(self, job: Obj) -> float | None:
        """ttlSecondsAfterFinished: delete the Job once its time is up."""
        left = ttl_remaining(job, self.now())
        if left is None:
            return None
        if left > 0:
            return left
        md = _md(job)
        try:
            # The cache may be behind an edit of the TTL: decide on a fresh copy.
            fresh = await self.ctx.client.get_object("batch/v1", "jobs", md["name"], md.get("namespace"))
        except ApiException as e:
            if e.code == 404:
                return None
            raise
        left = ttl_remaining(fresh, self.now())
        if left is None or _uid(fresh) != _uid(job):
            return None
        if left > 0:
            return left
        try:
            await self.ctx.client.delete(
                "batch/v1", "jobs", md["name"], md.get("namespace"),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                      "preconditions": {"uid": _uid(fresh)}})
        except ApiException as e:
            if e.code not in (404, 409):
                raise
        return None

    # -- pods whose Job is gone -------------------------------------------------------------
    async def _orphan_worker(self) -> None:
        while True:
            key = await self.orphans.get()
            try:
                await self._release_orphan(key)
            except Exception as e:  # noqa: BLE001 - keep going, retry with back-off
                log.info("job: releasing pod %s failed: %r", key, e)
                self.orphans.add_rate_limited(key)
            else:
                self.orphans.forget(key)
            finally:
                self.orphans.done(key)

    async def _release_orphan(self, key: str) -> None:
        """Remove our finalizer from a pod no live Job tracks any more."""
        pod = self.pods.get(key)
        if pod is None or not has_tracking_finalizer(pod):
            return
        ns, name = split_key(key)
        ref = controller_of(pod)
        if ref is not None:
            if ref.get("kind") != "Job" or ref.get("apiVersion") != "batch/v1":
                return  # someone else's pod: not ours to touch
            job = self.jobs.get(f"{ns}/{ref.get('name')}")
            if job is None:
                try:
                    job = await self.ctx.client.get_object("batch/v1", "jobs", str(ref.get("name")), ns)
                except ApiException as e:
                    if e.code != 404:
                        raise
            if job is not None and _uid(job) == ref.get("uid") and not job_finished(job):
                return  # alive: its own sync counts this pod
        try:
            await self.ctx.client.patch("v1", "pods", name, _remove_finalizer_patch(),
                                        STRATEGIC_MERGE_PATCH, ns)
        except ApiException as e:
            if e.code != 404:
                raise
