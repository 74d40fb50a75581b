"""Pod eviction: a graceful delete that asks the pod's disruption budget first.

`POST pods/{name}/eviction` (policy/v1 or policy/v1beta1 `Eviction`) is how
`kubectl drain`, Fleet's own drain (drain.py) and, later, preemption take a
pod away without breaking an application's availability promise.  The
request flow is kube-apiserver's `EvictionREST.Create`
(pkg/registry/core/pod/storage/eviction.go), and lives in
`ResourceAPI.evict_pod` (rest.py); this module holds the parts that do not
need the request: which pods may skip the budget check, the
`DisruptionTarget` condition an evicted pod carries, and the budget seam.

**The budget seam.**  `DisruptionBudgets.admit_eviction(pod)` is the one call
the eviction path makes before deleting.  It finds the
`policy/v1 PodDisruptionBudget`s selecting the pod and, with exactly one,
verifies and decrements `status.disruptionsAllowed` — or raises 429
TooManyRequests, which `kubectl drain` and Fleet's drain retry.  The kind is
declared in fleet/api/kinds/policy.py and its `status` is kept current by the
disruption controller (fleet/controllers/disruption.py); a server whose
registry lacks the kind (a test's) finds no budget and lets every eviction go.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from fleet.api import errors, meta
from fleet.api.conditions import is_pod_ready
from fleet.api.registry import Registry
from fleet.api.selectors import selector_dict_matches
from fleet.store import KeyNotFound, RevisionConflict, Store

log = logging.getLogger(__name__)

EVICTION_API_VERSIONS = ("policy/v1", "policy/v1beta1")
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"  # policyv1.DisruptionBudgetCause
TOO_MANY_REQUESTS_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
# policy/v1 PodDisruptionBudget.status.disruptedPods may not grow past this
# (evictions the budget controller has not confirmed yet).
MAX_DISRUPTED_POD_SIZE = 2000


# How often a budget write that lost a race is retried before the client is told 429.
BUDGET_CONFLICT_RETRIES = 8


class _BudgetConflict(Exception):
    """The budget changed between our read and our write."""


def can_ignore_budgets(pod: dict[str, Any]) -> bool:
    """canIgnorePDB: a pod that is finished, not yet running, or already going
    away causes no new disruption, so its eviction is a plain delete."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(pod["metadata"].get("deletionTimestamp"))


def add_disruption_target(pod: dict[str, Any]) -> None:
    """Mark the pod with the DisruptionTarget condition the Eviction API sets, so
    controllers (a Job's podFailurePolicy, for one) can tell an eviction from a crash."""
    status = pod.get("status")
    if not isinstance(status, dict):
        status = pod["status"] = {}
    conditions = [c for c in status.get("conditions") or []
                  if isinstance(c, dict) and c.get("type") != "DisruptionTarget"]
    conditions.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                       "lastTransitionTime": meta.now_rfc3339(), "reason": "EvictionByEvictionAPI",
                       "message": "Eviction API: evicting"})
    status["conditions"] = conditions


def too_many_requests(message: str, retry_after: int) -> errors.TooManyRequests:
    return errors.TooManyRequests(TOO_MANY_REQUESTS_MESSAGE, retry_after=retry_after,
                                  causes=[{"reason": DISRUPTION_BUDGET_CAUSE, "message": message}])


class DisruptionBudgets:
    """The disruption-budget check of the eviction path (see the module docstring)."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    async def matching(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The PodDisruptionBudgets in the pod's namespace whose selector selects it.

        None when the kind is not registered.
        """
        info = self.registry.get("policy", "v1", "poddisruptionbudgets")
        if info is None:
            return []
        labels = pod["metadata"].get("labels") or {}
        res = await self.store.list(info.key(pod["metadata"].get("namespace")))
        out = []
        for pdb in res.items:
            sel = (pdb.get("spec") or {}).get("selector")
            # policy/v1: a null selector selects nothing, an empty one everything.
            if isinstance(sel, dict) and selector_dict_matches(sel, labels):
                out.append(pdb)
        return out

    async def admit_eviction(self, pod: dict[str, Any], *, dry_run: bool) -> None:
        """Allow the eviction of `pod` (decrementing its budget) or raise.

        The rules of EvictionREST.Create: more than one budget is an error; an
        unready pod may go without using up the budget when the budget is met
        anyway (or its policy is AlwaysAllow); otherwise the budget must allow
        one more disruption.
        """
        budgets = await self.matching(pod)
        if not budgets:
            return
        if len(budgets) > 1:
            raise errors.InternalError("This pod has more than one PodDisruptionBudget, which the "
                                       "eviction subresource does not support.")
        pdb = budgets[0]
        status = pdb.get("status") or {}
        if not is_pod_ready(pod):
            if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
                return
            current, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
            if current >= desired > 0:
                return
        # The disruption controller rewrites the budget's status whenever its pods change,
        # and concurrent evictions spend it: a lost race is retried against the fresh
        # budget (kube-apiserver's RetryOnConflict) instead of being a 429 at once.
        info = self.registry.get("policy", "v1", "poddisruptionbudgets")
        assert info is not None
        key = info.key(pdb["metadata"].get("namespace"), pdb["metadata"]["name"])
        for _attempt in range(BUDGET_CONFLICT_RETRIES):
            try:
                await self.check_and_decrement(pod, pdb, dry_run=dry_run)
                return
            except _BudgetConflict:
                try:
                    pdb = await self.store.get(key)
                except KeyNotFound:
                    return  # the budget went away: nothing left to protect
        raise too_many_requests(f"The disruption budget {pdb['metadata']['name']} is still being processed by "
                                "the server.", 10)

    async def check_and_decrement(self, pod: dict[str, Any], pdb: dict[str, Any], *, dry_run: bool) -> None:
        """checkAndDecrement: use one allowed disruption and record the pod in
        status.disruptedPods, so the budget controller does not count it as
        available while it terminates.  The write has the budget's revision as a
        precondition: two evictions racing for the last disruption cannot both win."""
        name = pdb["metadata"]["name"]
        status = dict(pdb.get("status") or {})
        if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            raise too_many_requests(f"The disruption budget {name} is still being processed by the server.", 10)
        allowed = status.get("disruptionsAllowed", 0)
        if allowed < 0:
            raise errors.Forbidden(f'poddisruptionbudget.policy "{name}" is forbidden: pdb disruptions '
                                   "allowed is negative", name=name, group="policy", kind="poddisruptionbudget")
        disrupted = dict(status.get("disruptedPods") or {})
        if len(disrupted) > MAX_DISRUPTED_POD_SIZE:
            raise errors.Forbidden(f'poddisruptionbudget.policy "{name}" is forbidden: DisruptedPods map too '
                                   "big - too many evictions not confirmed by PDB controller",
                                   name=name, group="policy", kind="poddisruptionbudget")
        if allowed == 0:
            raise too_many_requests(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} "
                                    f"healthy pods and has {status.get('currentHealthy', 0)} currently", 0)
        if dry_run:
            return
        status["disruptionsAllowed"] = allowed - 1
        if allowed - 1 == 0:
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
            conds.append({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                          "message": "", "observedGeneration": status.get("observedGeneration", 0),
                          "lastTransitionTime": meta.now_rfc3339()})
            status["conditions"] = conds
        now = meta.utcnow().replace(microsecond=0, tzinfo=datetime.UTC)
        disrupted[pod["metadata"]["name"]] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        status["disruptedPods"] = disrupted
        info = self.registry.get("policy", "v1", "poddisruptionbudgets")
        assert info is not None
        new = dict(pdb, status=status)
        try:
            await self.store.update(info.key(pdb["metadata"].get("namespace"), name), new,
                                    expected_revision=int(pdb["metadata"]["resourceVersion"]))
        except (RevisionConflict, KeyNotFound):
            # Someone else wrote the budget meanwhile: admit_eviction looks again.
            raise _BudgetConflict from None
