"""NodeResourcesBalancedAllocation: prefer nodes whose resources stay evenly used.

A node with 90% of its cpu and 10% of its memory requested strands the
memory: no cpu-hungry pod will fit to use it.  This plugin scores the
balance after placing the pod: `(1 - std deviation of the requested
fractions) * 100`, over cpu and memory by default (NodeResourcesBalancedAllocationArgs
`resources`).  Fractions are capped at 1, and with exactly two resources the
standard deviation is simply half their difference, as upstream.

Unlike NodeResourcesFit's score it uses the pods' real requests (no non-zero
defaults), and it skips BestEffort pods altogether — scoring them by balance
would pile them all onto the same node (kubernetes#129138).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.scheduler.framework import MAX_NODE_SCORE, Code, CycleState, Status
from fleet.scheduler.plugins.node_resources_fit import (
    DEFAULT_RESOURCES,
    ResourceSpec,
    is_scalar_resource,
    parse_resources,
)
from fleet.scheduler.podinfo import pod_requests
from fleet.scheduler.snapshot import NodeInfo


def balanced_score(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    """(1 - std deviation of requested/allocatable fractions) * 100; resources with no allocatable skipped."""
    return _score_fractions([min(req / alloc, 1.0) for req, alloc in zip(requested, allocatable, strict=True)
                             if alloc])


def _score_fractions(fractions: list[float]) -> int:
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)


class NodeResourcesBalancedAllocation:
    name = "NodeResourcesBalancedAllocation"
    _key = "NodeResourcesBalancedAllocation/requests"

    def __init__(self, *, resources: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.resources: tuple[ResourceSpec, ...] = (
            parse_resources(list(resources)) if resources is not None else DEFAULT_RESOURCES)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> NodeResourcesBalancedAllocation:
        unknown = set(args) - {"resources"}
        if unknown:
            raise ValueError(f"unknown NodeResourcesBalancedAllocation args: {sorted(unknown)}")
        return cls(resources=args.get("resources"))

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        want = pod_requests(pod)
        requests = [(r.name, want.get(r.name, 0)) for r in self.resources]
        if not any(n for _, n in requests):
            return Status(Code.SKIP)
        # An extended resource the pod does not request stays out of the balance.
        state.write(self._key, [(name, n) for name, n in requests if n or not is_scalar_resource(name)])
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        want: list[tuple[str, int]] = state.read(self._key)
        allocatable, requested = node.allocatable, node.requested
        if len(want) == 2:
            # The default (cpu, memory), unrolled: this runs for every feasible node.
            (r1, n1), (r2, n2) = want
            a1, a2 = allocatable.get(r1, 0), allocatable.get(r2, 0)
            if a1 and a2:
                f1 = min((requested.get(r1, 0) + n1) / a1, 1.0)
                f2 = min((requested.get(r2, 0) + n2) / a2, 1.0)
                return int((1 - abs(f1 - f2) / 2) * MAX_NODE_SCORE)
        fractions = []
        for name, n in want:
            alloc = allocatable.get(name, 0)
            if alloc:
                fractions.append(min((requested.get(name, 0) + n) / alloc, 1.0))
        return _score_fractions(fractions)
