"""NodeAffinity (plugin name as in Kubernetes): nodeSelector, required and preferred node affinity.

Filter: a pod runs only on nodes whose labels match every `spec.nodeSelector`
entry and, when it has `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`,
at least one of its nodeSelectorTerms (the terms are ORed; inside a term the
matchExpressions and matchFields are ANDed).  `matchFields` supports the one
field Kubernetes does, `metadata.name`, with In/NotIn and a single value
(DaemonSet pods pin themselves this way).  A term that is empty or malformed
(unknown operator, In without values, Gt with a non-integer) matches no node,
exactly as upstream, rather than failing the pod.

Score: `preferredDuringSchedulingIgnoredDuringExecution` — a node earns the
weight of every preferred term it matches; the sums are normalized so the
best node scores 100.

Plugin args (NodeAffinityArgs): `addedAffinity` — a node affinity the
scheduler enforces on every pod of the profile, on top of the pod's own
(required: reason "node(s) didn't match scheduler-enforced node affinity";
preferred: added to the score).

The per-pod selector is compiled once in pre_filter / pre_score into tuples,
so the per-node work is a few dict lookups.  The matching itself is
`fleet.api.nodeaffinity`, which the DaemonSet controller shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleet.api.nodeaffinity import (
    CompiledTerm,
    RequiredNodeAffinity,
    preferred_terms,
    required_node_affinity,
    required_terms,
    term_matches,
)
from fleet.scheduler.framework import Code, CycleState, Status
from fleet.scheduler.plugins._scoring import default_normalize_score
from fleet.scheduler.snapshot import NodeInfo

ERR_REASON = "node(s) didn't match Pod's node affinity/selector"
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"


class NodeAffinity:
    name = "NodeAffinity"
    _key = "NodeAffinity/required"
    _score_key = "NodeAffinity/preferred"

    def __init__(self, *, added_affinity: Mapping[str, Any] | None = None) -> None:
        added = dict(added_affinity or {})
        terms = required_terms(added)
        self.added_required = None if terms is None else RequiredNodeAffinity({}, terms)
        self.added_preferred = preferred_terms(added)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> NodeAffinity:
        """From NodeAffinityArgs (`addedAffinity`)."""
        unknown = set(args) - {"addedAffinity"}
        if unknown:
            raise ValueError(f"unknown NodeAffinity args: {sorted(unknown)}")
        return cls(added_affinity=args.get("addedAffinity"))

    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        required = required_node_affinity(pod.get("spec") or {})
        if required is None and self.added_required is None:
            return Status(Code.SKIP)
        state.write(self._key, required)
        return Status.success()

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        if self.added_required is not None and not self.added_required.matches(node.labels, node.name):
            return Status.unschedulable(ERR_REASON_ENFORCED, unresolvable=True)
        required: RequiredNodeAffinity | None = state.read(self._key)
        if required is not None and not required.matches(node.labels, node.name):
            return Status.unschedulable(ERR_REASON, unresolvable=True)
        return Status.success()

    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        node_affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
        preferred = self.added_preferred + preferred_terms(node_affinity)
        if not preferred:
            return Status(Code.SKIP)
        state.write(self._score_key, preferred)
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        preferred: list[tuple[int, CompiledTerm]] = state.read(self._score_key)
        return sum(w for w, t in preferred if term_matches(t, node.labels, node.name))

    def normalize_score(self, state: CycleState, pod: dict[str, Any], scores: dict[str, int]) -> None:
        default_normalize_score(scores)
