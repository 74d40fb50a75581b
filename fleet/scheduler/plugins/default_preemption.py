"""DefaultPreemption: when no node fits, find a node where evicting lower-priority pods would.

A post-filter (kube-scheduler's `defaultpreemption`), run only after a FitError:

1. A pod with `preemptionPolicy: Never` never preempts; nor does one already
   nominated to a node where lower-priority victims are still terminating (it
   waits for them instead of preempting again).
2. Candidate nodes are those that failed with a resolvable status
   (Unschedulable — not UnschedulableAndUnresolvable: no eviction fixes a
   wrong label or a cordon).  As in kube-scheduler, a dry run covers at least
   `min_candidate_nodes_absolute` (100) nodes or `min_candidate_nodes_percentage`
   (10%) of them, from a rotating offset, and stops there.
3. On each candidate, every pod of lower priority is removed from the snapshot;
   if the pod then passes the filters, victims are *reprieved* one by one,
   highest priority first: put back, and kept if the pod still fits.  What is
   left are the victims.
4. The node is picked by kube-scheduler's order: fewest PodDisruptionBudget
   violations (once budgets exist, via `pdb_violations`), lowest highest-victim
   priority, lowest sum of victim priorities, fewest victims, the most recently
   started highest-priority victims, then the first.

Pure: the snapshot is changed only temporarily and always restored; the I/O
loop deletes the victims and writes `status.nominatedNodeName`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.scheduler.framework import Code, Diagnosis, Nomination, Status, pod_priority
from fleet.scheduler.podinfo import pod_key
from fleet.scheduler.snapshot import NodeInfo, Snapshot

if TYPE_CHECKING:
    from fleet.scheduler.framework import Framework

# Counts budget violations the given victims would cause (PodDisruptionBudgets come
# with the controllers issue; until then nothing is counted).
PDBViolations = Callable[[Sequence[dict[str, Any]]], int]


def _terminating(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _start_time(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("startTime")
               or (pod.get("metadata") or {}).get("creationTimestamp") or "")


@dataclass
class Candidate:
    node: str
    victims: list[dict[str, Any]]
    pdb_violations: int = 0

    def sort_key(self) -> tuple[Any, ...]:
        prios = [pod_priority(v) for v in self.victims]
        highest = max(prios) if prios else -(2**31)
        # The most recently started of the highest-priority victims: later is better.
        latest = max((_start_time(v) for v in self.victims if pod_priority(v) == highest),
                     default="")
        # Shift priorities so negative ones still add up sensibly (as k8s does).
        total = sum(p + 2**31 for p in prios)
        return (self.pdb_violations, highest, total, len(self.victims), _Rev(latest))


class _Rev:
    """Reverses the order of a string inside a sort key (later timestamps first)."""

    __slots__ = ("s",)

    def __init__(self, s: str) -> None:
        self.s = s

    def __lt__(self, other: _Rev) -> bool:
        return self.s > other.s

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rev) and self.s == other.s


class DefaultPreemption:
    name = "DefaultPreemption"

    def __init__(self, *, min_candidate_nodes_percentage: int = 10,
                 min_candidate_nodes_absolute: int = 100,
                 pdb_violations: PDBViolations | None = None,
                 rng: random.Random | None = None) -> None:
        self.min_candidate_nodes_percentage = min_candidate_nodes_percentage
        self.min_candidate_nodes_absolute = min_candidate_nodes_absolute
        self.pdb_violations = pdb_violations
        self.rng = rng or random.Random()

    # -- the extension point ---------------------------------------------------------------
    def post_filter(self, framework: Framework, pod: dict[str, Any], snapshot: Snapshot,
                    diagnosis: Diagnosis) -> Nomination | None:
        if not self.eligible(pod, snapshot):
            return None
        prio = pod_priority(pod)
        potential = [n for n in snapshot.nodes()
                     if (st := diagnosis.node_statuses.get(n.name)) is not None
                     and st.code is Code.UNSCHEDULABLE]
        if not potential:
            return None
        limit = max(len(potential) * self.min_candidate_nodes_percentage // 100,
                    self.min_candidate_nodes_absolute)
        offset = self.rng.randrange(len(potential))
        candidates: list[Candidate] = []
        for i in range(len(potential)):
            node = potential[(offset + i) % len(potential)]
            victims = self.select_victims(framework, pod, prio, snapshot, node)
            if victims is None:
                continue
            c = Candidate(node.name, victims)
            if self.pdb_violations is not None:
                c.pdb_violations = self.pdb_violations(victims)
            candidates.append(c)
            if len(candidates) >= limit:
                break
        if not candidates:
            return None
        best = min(candidates, key=Candidate.sort_key)
        return Nomination(best.node, tuple(best.victims))

    def eligible(self, pod: dict[str, Any], snapshot: Snapshot) -> bool:
        """kube-scheduler's PodEligibleToPreemptOthers."""
        spec = pod.get("spec") or {}
        if spec.get("preemptionPolicy") == "Never":
            return False
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if nominated:
            info = snapshot.get(nominated)
            prio = pod_priority(pod)
            if info is not None and any(_terminating(p) and pod_priority(p) < prio
                                        for p in info.pods.values()):
                return False  # its earlier victims are still going: wait for them
        return True

    # -- the dry run on one node -----------------------------------------------------------
    def select_victims(self, framework: Framework, pod: dict[str, Any], prio: int,
                       snapshot: Snapshot, node: NodeInfo) -> list[dict[str, Any]] | None:
        """The fewest lower-priority pods whose removal lets `pod` fit on `node`, or None."""
        lower = [p for p in node.pods.values() if pod_priority(p) < prio and not _terminating(p)]
        if not lower:
            return None
        removed = {pod_key(p): p for p in lower}
        for key in removed:
            snapshot.remove_pod(key)
        try:
            if not self._fits(framework, pod, snapshot, node).ok:
                return None
            victims: list[dict[str, Any]] = []
            # Reprieve as many as possible, the most important first.
            for p in sorted(lower, key=lambda p: (-pod_priority(p), _start_time(p))):
                snapshot.set_pod(p)
                if self._fits(framework, pod, snapshot, node).ok:
                    removed.pop(pod_key(p))
                    continue
                snapshot.remove_pod(pod_key(p))
                victims.append(p)
            return victims
        finally:
            for p in removed.values():
                snapshot.set_pod(p)

    @staticmethod
    def _fits(framework: Framework, pod: dict[str, Any], snapshot: Snapshot,
              node: NodeInfo) -> Status:
        state, st = framework.run_pre_filters(pod, snapshot)
        return framework.run_filters(state, pod, node) if st.ok else st
