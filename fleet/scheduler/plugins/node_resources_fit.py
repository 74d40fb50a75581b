"""NodeResourcesFit: the pod's requests must fit in what the node has left; prefer emptier nodes.

Filter: for every resource the pod requests (cpu, memory, ephemeral-storage,
extended resources), `allocatable - requested by bound pods >= pod request`,
and the node's `pods` allocatable must leave room for one more pod.  One
status carries every shortfall ("Insufficient cpu", "Insufficient memory"),
so the FailedScheduling message counts each.

Score: LeastAllocated over cpu and memory — the share of the node left free
after placing the pod, averaged — so pods spread over the emptier nodes.
Scoring uses the non-zero requests (100m cpu / 200Mi for a container without
requests), or a node of BestEffort pods would always look empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet.scheduler.framework import MAX_NODE_SCORE, CycleState, Status
from fleet.scheduler.snapshot import NodeInfo, Resources, pod_requests

TOO_MANY_PODS = "Too many pods"
SCORED_RESOURCES = ("cpu", "memory")


def insufficient(resource: str) -> str:
    return f"Insufficient {resource}"


def fit_reasons(requests: Resources, node: NodeInfo) -> list[str]:
    """Every reason the pod does not fit on the node (empty: it fits)."""
    reasons = []
    if len(node.pods) + 1 > node.allocatable.get("pods", 0):
        reasons.append(TOO_MANY_PODS)
    for resource in sorted(requests):
        want = requests[resource]
        if resource == "pods" or want <= 0:
            continue
        free = node.allocatable.get(resource, 0) - node.requested.get(resource, 0)
        if want > free:
            reasons.append(insufficient(resource))
    return reasons


def least_allocated(requested: Resources, allocatable: Resources) -> int:
    """Average over cpu and memory of the free share (0..100) after placement."""
    total = 0
    for resource in SCORED_RESOURCES:
        cap = allocatable.get(resource, 0)
        used = requested.get(resource, 0)
        if cap > 0 and used <= cap:
            total += (cap - used) * MAX_NODE_SCORE // cap
    return total // len(SCORED_RESOURCES)


class NodeResourcesFit:
    name = "NodeResourcesFit"
    _requests = "NodeResourcesFit/requests"
    _non_zero = "NodeResourcesFit/non-zero"

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        state.write(self._requests, pod_requests(pod))
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        reasons = fit_reasons(state.read(self._requests), node)
        return Status.unschedulable(*reasons) if reasons else Status.success()

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        state.write(self._non_zero, pod_requests(pod, non_zero=True))
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        want: Resources = state.read(self._non_zero)
        after = {r: node.non_zero_requested.get(r, 0) + want.get(r, 0) for r in SCORED_RESOURCES}
        return least_allocated(after, node.allocatable)
