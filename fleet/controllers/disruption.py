"""Disruption controller: keeps every PodDisruptionBudget's status true to its pods.

kube-controller-manager's disruption controller (pkg/controller/disruption).
For each budget, from the pods its selector picks in its namespace:

* **expectedPods** — with an integer `minAvailable`, simply the number of
  selected pods; with `maxUnavailable` or a percentage, the sum of the scales
  of the pods' controllers (a Deployment's or StatefulSet's or bare
  ReplicaSet's `spec.replicas`, or any owner's `scale` subresource — a
  ReplicationController, a custom resource), so that pods missing *right now*
  count as unavailable rather than shrinking the base.  Such budgets need
  every selected pod to have a controller: a pod without one is reported
  (event `UnmanagedPods`) and left out; a controller that cannot be found
  fails the sync, which then leaves 0 disruptions allowed (fail safe).
* **desiredHealthy** — `minAvailable` (an integer, or the percentage of
  expectedPods rounded up), or expectedPods − `maxUnavailable` (rounded up).
* **currentHealthy** — selected pods that are Ready, not being deleted, and
  not in `disruptedPods` (evicted a moment ago, their deletion not seen yet).
* **disruptionsAllowed** = currentHealthy − desiredHealthy, never below 0, and
  0 while expectedPods is 0 (a budget over no pods must be safe the moment its
  first pods appear).
* **disruptedPods** — entries the eviction subresource wrote are dropped once
  the pod is seen terminating or gone, or after 2 minutes if it never was; the
  budget is looked at again when the oldest entry expires.
* the **DisruptionAllowed** condition: True/SufficientPods while disruptions
  are allowed, False/InsufficientPods otherwise (False/SyncFailed after an
  error), and `observedGeneration` — evictions wait for it (429) after a spec
  change.
* a pod left with `DisruptionTarget=True` for 2 minutes without being deleted (an
  eviction whose delete failed) gets the condition set back to False.

The decisions are pure functions (`scaled_value`, `expected_and_desired`,
`disrupted_pod_map`, `count_healthy`, `next_status`) tested table-driven; the
controller around them only reads informer caches, asks the API for the scale
of unusual controllers, and writes `status` with the revision it read (a
conflict with an eviction spending the budget is simply retried).

`unhealthyPodEvictionPolicy` is enforced where evictions are decided
(fleet/server/eviction.py): IfHealthyBudget lets a not-Ready pod go only when
the budget is met anyway, AlwaysAllow always lets it go.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from fleet.api import meta
from fleet.api.conditions import is_pod_ready, set_status_condition
from fleet.api.kinds.policy import (
    DISRUPTION_ALLOWED,
    INSUFFICIENT_PODS,
    SUFFICIENT_PODS,
    SYNC_FAILED,
)
from fleet.api.owners import controller_of
from fleet.api.selectors import selector_dict_matches
from fleet.client import STRATEGIC_MERGE_PATCH, ApiException
from fleet.controllers.runtime import (
    Context,
    QueueWorker,
    SharedInformer,
    WorkQueue,
    key_of,
    split_key,
)

log = logging.getLogger(__name__)

# A pod the eviction subresource recorded in disruptedPods is expected to be seen
# terminating within this time; after it, it counts as healthy again (DeletionTimeout).
DELETION_TIMEOUT = dt.timedelta(minutes=2)
# A DisruptionTarget condition no deletion followed is reset to False after this long.
STALE_DISRUPTION_TIMEOUT = dt.timedelta(minutes=2)

# After losing a write race, look again this much later (the informer catches up meanwhile).
CONFLICT_RETRY = 0.05

POLICY_V1 = "policy/v1"
PDBS = "poddisruptionbudgets"


class NoControllerError(Exception):
    """A selected pod's controller cannot be found (expectedPods is unknowable)."""


# ---------------------------------------------------------------------------------------
# The pure part


def scaled_value(value: int | str, total: int, *, round_up: bool = True) -> int:
    """intstr.GetScaledValueFromIntOrPercent: an integer as is, `N%` of `total`."""
    if isinstance(value, int):
        return value
    pct = int(value.rstrip("%"))
    exact = pct * total
    return -(-exact // 100) if round_up else exact // 100


def needs_scale(spec: Mapping[str, Any]) -> bool:
    """Whether expectedPods comes from the controllers' scale (else it is the pod count)."""
    return spec.get("maxUnavailable") is not None or isinstance(spec.get("minAvailable"), str)


def expected_and_desired(spec: Mapping[str, Any], pod_count: int, controller_scale: int) -> tuple[int, int]:
    """(expectedPods, desiredHealthy) per getExpectedPodCount."""
    max_unavailable, min_available = spec.get("maxUnavailable"), spec.get("minAvailable")
    if max_unavailable is not None:
        expected = controller_scale
        return expected, max(0, expected - scaled_value(max_unavailable, expected))
    if isinstance(min_available, int):
        return pod_count, min_available
    if isinstance(min_available, str):
        expected = controller_scale
        return expected, scaled_value(min_available, expected)
    return 0, 0  # neither set: the API allows it; nothing may be disrupted


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = meta.parse_rfc3339(value)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def disrupted_pod_map(recorded: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
                      now: dt.datetime) -> tuple[dict[str, str], dt.datetime | None]:
    """buildDisruptedPodMap: the entries still pending (pod present, not terminating, not
    expired), and when the earliest of them expires."""
    out: dict[str, str] = {}
    recheck: dt.datetime | None = None
    if not recorded:
        return out, None
    for pod in pods:
        md = pod.get("metadata") or {}
        if md.get("deletionTimestamp"):
            continue
        name = md.get("name", "")
        if name not in recorded:
            continue
        when = _time(recorded[name])
        if when is None:
            continue
        expires = when + DELETION_TIMEOUT
        if expires < now:
            log.info("pod %s/%s was expected to be deleted but it was not", md.get("namespace"), name)
            continue
        out[name] = recorded[name]
        if recheck is None or expires < recheck:
            recheck = expires
    return out, recheck


def count_healthy(pods: Iterable[Mapping[str, Any]], disrupted: Mapping[str, str], now: dt.datetime) -> int:
    """countHealthyPods: Ready, not terminating, not just evicted."""
    n = 0
    for pod in pods:
        md = pod.get("metadata") or {}
        if md.get("deletionTimestamp"):
            continue
        when = _time(disrupted.get(md.get("name", "")))
        if when is not None and when + DELETION_TIMEOUT > now:
            continue
        if is_pod_ready(pod):
            n += 1
    return n


def conditions_up_to_date(status: Mapping[str, Any]) -> bool:
    """pdbhelper.ConditionsAreUpToDate."""
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == DISRUPTION_ALLOWED:
            if c.get("observedGeneration") != status.get("observedGeneration"):
                return False
            if status.get("disruptionsAllowed", 0) > 0:
                return c.get("status") == "True" and c.get("reason") == SUFFICIENT_PODS
            return c.get("status") == "False"
    return False


def with_allowed_condition(status: dict[str, Any], now: str) -> dict[str, Any]:
    """pdbhelper.UpdateDisruptionAllowedCondition."""
    if status.get("disruptionsAllowed", 0) > 0:
        cond = ("True", SUFFICIENT_PODS)
    else:
        cond = ("False", INSUFFICIENT_PODS)
    status["conditions"] = set_status_condition(status.get("conditions"), DISRUPTION_ALLOWED, *cond, "", now,
                                                observed_generation=status.get("observedGeneration", 0))
    return status


@dataclass(frozen=True)
class Observed:
    """What one sync of a budget found."""

    current_healthy: int
    desired_healthy: int
    expected_pods: int
    disrupted_pods: dict[str, str]


def next_status(pdb: Mapping[str, Any], seen: Observed, now: str) -> dict[str, Any] | None:
    """updatePdbStatus: the status to write, or None when the stored one is current."""
    allowed = seen.current_healthy - seen.desired_healthy
    if seen.expected_pods <= 0 or allowed <= 0:
        allowed = 0
    status = pdb.get("status") or {}
    generation = (pdb.get("metadata") or {}).get("generation", 1)
    if (status.get("currentHealthy", 0) == seen.current_healthy
            and status.get("desiredHealthy", 0) == seen.desired_healthy
            and status.get("expectedPods", 0) == seen.expected_pods
            and status.get("disruptionsAllowed", 0) == allowed
            and (status.get("disruptedPods") or {}) == seen.disrupted_pods
            and status.get("observedGeneration") == generation
            and conditions_up_to_date(status)):
        return None
    new: dict[str, Any] = {
        "currentHealthy": seen.current_healthy, "desiredHealthy": seen.desired_healthy,
        "expectedPods": seen.expected_pods, "disruptionsAllowed": allowed,
        "observedGeneration": generation, "conditions": list(status.get("conditions") or []),
    }
    if seen.disrupted_pods:
        new["disruptedPods"] = dict(seen.disrupted_pods)
    return with_allowed_condition(new, now)


def fail_safe_status(pdb: Mapping[str, Any], why: str, now: str) -> dict[str, Any]:
    """failSafe: whatever went wrong, allow no disruption (and say why)."""
    status = copy.deepcopy(dict(pdb.get("status") or {}))
    status["disruptionsAllowed"] = 0
    status["conditions"] = set_status_condition(status.get("conditions"), DISRUPTION_ALLOWED, "False", SYNC_FAILED,
                                                why, now,
                                                observed_generation=status.get("observedGeneration", 0))
    return status


def stale_disruption_wait(pod: Mapping[str, Any], now: dt.datetime) -> float | None:
    """nonTerminatingPodHasStaleDisruptionCondition: seconds until a DisruptionTarget=True
    condition that no deletion followed (an eviction whose delete failed) is stale, 0 when it
    is; None for pods without such a condition, terminating or finished ones."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
        return None
    for c in (pod.get("status") or {}).get("conditions") or []:
        if not isinstance(c, Mapping) or c.get("type") != "DisruptionTarget":
            continue
        if c.get("status") != "True" or c.get("reason") == "TerminationByKubelet":
            return None
        since = _time(c.get("lastTransitionTime")) or now
        return max(0.0, (since + STALE_DISRUPTION_TIMEOUT - now).total_seconds())
    return None


def selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """policy/v1: a null selector selects nothing, an empty one every pod of the namespace."""
    sel = (pdb.get("spec") or {}).get("selector")
    if not isinstance(sel, dict):
        return False
    if (pdb.get("metadata") or {}).get("namespace") != (pod.get("metadata") or {}).get("namespace"):
        return False
    return selector_dict_matches(sel, (pod.get("metadata") or {}).get("labels") or {})


rfc3339 = meta.format_time


# ---------------------------------------------------------------------------------------
# The controller


def _replicas(obj: Mapping[str, Any]) -> int:
    n = (obj.get("spec") or {}).get("replicas")
    return n if isinstance(n, int) and not isinstance(n, bool) else 1


def _group_of(api_version: Any) -> str:
    return str(api_version or "").rpartition("/")[0]


class DisruptionController(QueueWorker):
    name = "disruption"
    workers = 2

    def __init__(self, *, now: Callable[[], dt.datetime] = meta.utcnow) -> None:
        super().__init__()
        self.now = now
        # Pods whose DisruptionTarget condition may go stale (keys "ns/name").
        self.stale = WorkQueue()

    def setup(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pdbs: SharedInformer = ctx.informers.informer(POLICY_V1, PDBS)
        self.pods: SharedInformer = ctx.informers.informer("v1", "pods")
        self.replicasets: SharedInformer = ctx.informers.informer("apps/v1", "replicasets")
        self.deployments: SharedInformer = ctx.informers.informer("apps/v1", "deployments")
        self.statefulsets: SharedInformer = ctx.informers.informer("apps/v1", "statefulsets")
        self.pdbs.add_handler(lambda t, old, new: self.enqueue(new if new is not None else old))
        self.pods.add_handler(self._on_pod)

    def _on_pod(self, etype: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None and (wait := stale_disruption_wait(new, self.now())) is not None:
            self.stale.add_after(key_of(new), wait)
        if not self.pdbs.synced.is_set():
            return  # budgets not listed yet: each will be synced when it is
        # Both the old and the new labels: a relabelled pod leaves one budget for another.
        for pod in (old, new):
            if pod is None:
                continue
            ns = (pod.get("metadata") or {}).get("namespace") or ""
            for pdb in self.pdbs.list(ns):
                if selects(pdb, pod):
                    self.queue.add(key_of(pdb))

    async def run(self, ctx: Context) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(self._stale_worker)
            await super().run(ctx)

    async def _stale_worker(self) -> None:
        while True:
            key = await self.stale.get()
            try:
                again = await self.reset_stale_condition(key)
            except Exception as e:  # noqa: BLE001 - keep going, retry later
                log.debug("disruption: resetting DisruptionTarget of %s failed: %r", key, e)
                self.stale.add_rate_limited(key)
            else:
                if again is not None:
                    self.stale.add_after(key, again)
                else:
                    self.stale.forget(key)
            finally:
                self.stale.done(key)

    async def reset_stale_condition(self, key: str) -> float | None:
        """syncStalePodDisruption: a pod marked for disruption that was not deleted within
        2 minutes gets DisruptionTarget=False (so a Job's podFailurePolicy, for one, does not
        read an old, failed eviction as the reason of a later failure)."""
        pod = self.pods.get(key)
        if pod is None:
            return None
        wait = stale_disruption_wait(pod, self.now())
        if wait is None:
            return None
        if wait > 0:
            return wait
        ns, name = split_key(key)
        patch = {"metadata": {"resourceVersion": pod["metadata"].get("resourceVersion")},
                 "status": {"conditions": [{"type": "DisruptionTarget", "status": "False",
                                            "lastTransitionTime": rfc3339(self.now())}]}}
        try:
            await self.ctx.client.patch("v1", "pods", name, patch, STRATEGIC_MERGE_PATCH, ns, subresource="status")
        except ApiException as e:
            if e.code == 404:
                return None
            if e.code == 409:
                return CONFLICT_RETRY
            raise
        return None

    # -- expectedPods from the controllers' scale -----------------------------------------
    async def _scale_of(self, ref: Mapping[str, Any], namespace: str) -> tuple[str, int] | None:
        """The finders of the Kubernetes controller, in its order: (controller uid, scale) or
        None when this owner is not a controller we can size."""
        kind, name, uid = ref.get("kind"), str(ref.get("name", "")), str(ref.get("uid", ""))
        group = _group_of(ref.get("apiVersion"))
        if kind == "ReplicaSet" and group in ("apps", "extensions"):
            rs = self.replicasets.get(f"{namespace}/{name}")
            if rs is None or rs["metadata"].get("uid") != uid:
                return None
            owner = controller_of(rs)
            if owner is None or owner.get("kind") != "Deployment":
                return uid, _replicas(rs)
            if _group_of(owner.get("apiVersion")) not in ("apps", "extensions"):
                return None
            dep = self.deployments.get(f"{namespace}/{owner.get('name', '')}")
            if dep is None or dep["metadata"].get("uid") != owner.get("uid"):
                return None
            return str(owner.get("uid")), _replicas(dep)
        if kind == "StatefulSet" and group == "apps":
            sts = self.statefulsets.get(f"{namespace}/{name}")
            if sts is None or sts["metadata"].get("uid") != uid:
                return None
            return uid, _replicas(sts)
        # ReplicationControllers, custom resources: whatever serves the scale subresource.
        client = self.ctx.client
        try:
            res = await client.resource_for_kind(str(ref.get("apiVersion", "")), str(kind))
        except ApiException:
            return None
        if "scale" not in res.subresources:
            raise NoControllerError(f"{res.group_resource} does not implement the scale subresource")
        try:
            scale = await client.get_object(res.api_version, res.name, name, namespace, subresource="scale")
        except ApiException as e:
            if e.code == 404:
                return None
            raise
        if (scale.get("metadata") or {}).get("uid") not in (None, uid):
            return None
        return uid, int((scale.get("spec") or {}).get("replicas") or 0)

    async def controller_scale(self, pods: list[dict[str, Any]]) -> tuple[int, list[str]]:
        """getExpectedScale: the sum of the scales of the pods' controllers, and the pods
        that have none."""
        scales: dict[str, int] = {}
        unmanaged: list[str] = []
        for pod in pods:
            ref = controller_of(pod)
            if ref is None:
                unmanaged.append(pod["metadata"]["name"])
                continue
            if str(ref.get("uid")) in scales:
                continue
            found = await self._scale_of(ref, pod["metadata"].get("namespace", ""))
            if found is None:
                raise NoControllerError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
            scales[found[0]] = found[1]
        return sum(scales.values()), unmanaged

    # -- sync ---------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        pdb = self.pdbs.get(key)
        if pdb is None:
            return None
        ns, _ = split_key(key)
        pods = [p for p in self.pods.list(ns) if selects(pdb, p)]
        spec = pdb.get("spec") or {}
        events = self.ctx.events
        now = self.now()
        if not pods and events is not None:
            events.record(pdb, "Normal", "NoPods", "No matching pods found")
        try:
            scale, unmanaged = (await self.controller_scale(pods)) if needs_scale(spec) else (0, [])
        except (NoControllerError, ApiException) as e:
            if events is not None:
                events.record(pdb, "Warning", "CalculateExpectedPodCountFailed",
                              f"Failed to calculate the number of expected pods: {e}")
            return await self._write(pdb, fail_safe_status(pdb, str(e), rfc3339(now)))
        if unmanaged and events is not None:
            events.record(pdb, "Warning", "UnmanagedPods",
                          f"Pods selected by this PodDisruptionBudget (selector: {spec.get('selector')}) were "
                          "found to be unmanaged. As a result, the status of the PDB cannot be calculated "
                          "correctly, which may result in undefined behavior. To account for these pods please "
                          'set ".spec.minAvailable" field of the PDB to an integer value.')
        expected, desired = expected_and_desired(spec, len(pods), scale)
        disrupted, recheck = disrupted_pod_map((pdb.get("status") or {}).get("disruptedPods"), pods, now)
        seen = Observed(count_healthy(pods, disrupted, now), desired, expected, disrupted)
        status = next_status(pdb, seen, rfc3339(now))
        if status is not None and (again := await self._write(pdb, status)) is not None:
            return again
        if recheck is not None:
            return max(0.0, (recheck - now).total_seconds()) + 0.5
        return None

    async def _write(self, pdb: dict[str, Any], status: dict[str, Any]) -> float | None:
        """Write status with the revision we read.  A conflict (an eviction spent the budget
        meanwhile) is routine: the sync is redone shortly, against the fresh budget the
        informer will have by then (the returned delay)."""
        md = pdb["metadata"]
        body = dict(pdb, status=status)
        try:
            await self.ctx.client.replace(POLICY_V1, PDBS, md["name"], body, md.get("namespace"),
                                          subresource="status")
        except ApiException as e:
            if e.code == 404:
                return None  # deleted meanwhile
            if e.code == 409:
                return CONFLICT_RETRY
            raise
        return None
