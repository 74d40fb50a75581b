"""InterPodAffinity: place pods relative to other pods — together (affinity) or apart (anti-affinity).

A PodAffinityTerm names pods (a labelSelector over the term's namespaces)
and a `topologyKey`; "the same domain" means nodes with the same value of
that node label.  Semantics are kube-scheduler's:

Filter (required terms), in this order:
1. the pod's required affinity: for every term, the node must carry the
   topology key and its domain must hold a pod matching *all* the pod's
   terms.  Exception, so the first replica of a self-affine workload can
   start: if no pod anywhere matches and the pod matches its own terms, any
   node with the topology keys will do.  Unresolvable — "node(s) didn't
   match pod affinity rules";
2. the pod's required anti-affinity: no pod matching a term may sit in the
   node's domain of that term — "node(s) didn't match pod anti-affinity rules";
3. symmetry: no *existing* pod's required anti-affinity term may match the
   incoming pod while that pod sits in the node's domain of the term —
   "node(s) didn't satisfy existing pods anti-affinity rules".
   (2 and 3 are Unschedulable: preempting the offending pod resolves them.)

Score (preferred terms, and symmetry): every existing pod matching one of
the pod's preferred affinity terms adds the term's weight to its domain
(anti-affinity subtracts it); every existing pod whose preferred terms match
the incoming pod does the same with its own weights, and its *required*
affinity terms add `hardPodAffinityWeight` (default 1).  A node's score is
the sum over its domains, min-max normalized to 0..100.

Namespaces: a term applies to its `namespaces`, plus the namespaces whose
labels match `namespaceSelector` (`{}`: all namespaces); with neither, the
pod's own namespace.  The incoming pod's namespaceSelector is resolved
against the snapshot's namespaces; an existing pod's is matched against the
incoming pod's namespace labels.  `matchLabelKeys` / `mismatchLabelKeys`
are honoured (see `snapshot.merge_label_keys`).

Performance: nothing here walks the pods.  The incoming pod's terms are
answered by `Snapshot.match_count` (incremental per-domain counts), and the
existing pods' terms come grouped by identical term (`Snapshot.term_groups`),
so a cycle costs O(distinct terms) plus a few dict lookups per node.  A pod
without affinity, when no bound pod has anti-affinity against it, skips the
filter entirely; scoring is skipped unless some bound pod or the pod itself
has preferences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleet.scheduler.affinity import (
    PREFERRED_AFFINITY,
    PREFERRED_ANTI_AFFINITY,
    REQUIRED_AFFINITY,
    REQUIRED_ANTI_AFFINITY,
    AffinityTerm,
    PodAffinity,
    pod_affinity,
)
from fleet.scheduler.framework import (
    MAX_NODE_SCORE,
    Code,
    CycleState,
    PodCountingExtensions,
    Status,
)
from fleet.scheduler.plugins._cycle import DEFERRED, cycle_snapshot, resolve_deferred
from fleet.scheduler.podinfo import pod_labels
from fleet.scheduler.snapshot import Clause, NodeInfo, Snapshot

ERR_REASON_AFFINITY_RULES_NOT_MATCH = "node(s) didn't match pod affinity rules"
ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH = "node(s) didn't match pod anti-affinity rules"
ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH = "node(s) didn't satisfy existing pods anti-affinity rules"

DEFAULT_HARD_POD_AFFINITY_WEIGHT = 1

Counts = Mapping[str, int]

# Statuses are immutable: built once, not per node.
_SUCCESS = Status.success()
_AFFINITY = Status.unschedulable(ERR_REASON_AFFINITY_RULES_NOT_MATCH, unresolvable=True)
_ANTI = Status.unschedulable(ERR_REASON_ANTI_AFFINITY_RULES_NOT_MATCH)
_EXISTING = Status.unschedulable(ERR_REASON_EXISTING_ANTI_AFFINITY_RULES_NOT_MATCH)


def term_clause(term: AffinityTerm, snap: Snapshot) -> Clause:
    """The incoming pod's term as a query: its namespaceSelector resolved to namespace names.

    `{}` selects every namespace (None); otherwise the names it selects now
    join the term's explicit namespaces, as kube-scheduler merges them.
    """
    ns_selector = term.namespace_selector
    if ns_selector.nothing:
        return term.namespaces, term.selector
    if ns_selector.empty():
        return None, term.selector
    return term.namespaces | snap.namespaces_matching(ns_selector), term.selector


def clause_matches(clause: Clause, namespace: str, labels: Mapping[str, str]) -> bool:
    namespaces, selector = clause
    return (namespaces is None or namespace in namespaces) and selector.matches(labels)  # type: ignore[arg-type]


def _identity(pod: dict[str, Any]) -> tuple[str, dict[str, str]]:
    return str((pod.get("metadata") or {}).get("namespace") or ""), pod_labels(pod)


class _FilterState:
    """What the filter checks per node, each entry a (topology key, domain -> count) pair."""

    __slots__ = ("affinity", "affinity_clauses", "affinity_any", "self_match", "anti", "anti_clauses",
                 "existing", "namespace_labels", "owned")

    def __init__(self) -> None:
        self.affinity: list[tuple[str, Counts]] = []
        self.affinity_clauses: tuple[Clause, ...] = ()
        self.affinity_any = False  # some existing pod matches all affinity terms
        self.self_match = False  # the pod matches all its own affinity terms
        self.anti: list[tuple[str, Counts]] = []
        self.anti_clauses: list[Clause] = []
        self.existing: list[tuple[str, Counts]] = []
        self.namespace_labels: dict[str, str] | None = None
        self.owned = False  # counts copied, safe to mutate (preemption)

    def own(self) -> None:
        """Copy shared counts before mutating them; merge existing pods' terms per topology key."""
        if self.owned:
            return
        self.affinity = [(k, dict(c)) for k, c in self.affinity]
        self.anti = [(k, dict(c)) for k, c in self.anti]
        merged: dict[str, dict[str, int]] = {}
        for k, c in self.existing:
            into = merged.setdefault(k, {})
            for v, n in c.items():
                into[v] = into.get(v, 0) + n
        self.existing = list(merged.items())
        self.owned = True


class InterPodAffinity(PodCountingExtensions):
    name = "InterPodAffinity"
    _key = "InterPodAffinity/filter"
    _score_key = "InterPodAffinity/score"

    def __init__(self, *, hard_pod_affinity_weight: int = DEFAULT_HARD_POD_AFFINITY_WEIGHT,
                 ignore_preferred_terms_of_existing_pods: bool = False) -> None:
        if not 0 <= hard_pod_affinity_weight <= 100:
            raise ValueError(f"hardPodAffinityWeight must be in 0..100, not {hard_pod_affinity_weight}")
        self.hard_pod_affinity_weight = hard_pod_affinity_weight
        self.ignore_preferred_terms_of_existing_pods = ignore_preferred_terms_of_existing_pods

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> InterPodAffinity:
        """From InterPodAffinityArgs."""
        unknown = set(args) - {"hardPodAffinityWeight", "ignorePreferredTermsOfExistingPods"}
        if unknown:
            raise ValueError(f"unknown InterPodAffinity args: {sorted(unknown)}")
        return cls(hard_pod_affinity_weight=int(args.get("hardPodAffinityWeight",
                                                         DEFAULT_HARD_POD_AFFINITY_WEIGHT)),
                   ignore_preferred_terms_of_existing_pods=bool(args.get("ignorePreferredTermsOfExistingPods")))

    # -- filter ----------------------------------------------------------------------
    def pre_filter(self, state: CycleState, pod: dict[str, Any]) -> Status:
        try:
            aff = pod_affinity(pod, strict=True)
        except ValueError as e:
            return Status.unschedulable(f"parsing pod: {e}", unresolvable=True)
        snap = cycle_snapshot(state)
        if snap is None:
            state.write(self._key, (DEFERRED, aff))
            return Status.success()
        s = self._filter_state(pod, aff, snap)
        if s is None:
            return Status(Code.SKIP)
        state.write(self._key, s)
        return Status.success()

    def _filter_state(self, pod: dict[str, Any], aff: PodAffinity | None, snap: Snapshot) -> _FilterState | None:
        """The per-cycle counts, or None when nothing can reject any node."""
        ns, labels = _identity(pod)
        s = _FilterState()
        s.namespace_labels = snap.namespace_labels(ns)
        for group in snap.term_groups(REQUIRED_ANTI_AFFINITY):
            if group.counts and group.term.matches(ns, labels, s.namespace_labels):
                s.existing.append((group.term.topology_key, group.counts))
        if aff is not None and aff.required_affinity:
            s.affinity_clauses = tuple(term_clause(t, snap) for t in aff.required_affinity)
            mc = snap.match_count(s.affinity_clauses)
            s.affinity = [(t.topology_key, mc.topology(t.topology_key)) for t in aff.required_affinity]
            s.affinity_any = any(counts for _, counts in s.affinity)
            s.self_match = all(clause_matches(c, ns, labels) for c in s.affinity_clauses)
        if aff is not None:
            for t in aff.required_anti_affinity:
                clause = term_clause(t, snap)
                s.anti_clauses.append(clause)
                s.anti.append((t.topology_key, snap.match_count((clause,)).topology(t.topology_key)))
        if not s.existing and not s.affinity and not s.anti:
            return None
        return s

    def _state(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> _FilterState | None:
        return resolve_deferred(state, self._key, node,
                                lambda arg, snap: self._filter_state(pod, arg, snap), self.name)

    def filter(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> Status:
        s = state.read(self._key)
        if s.__class__ is not _FilterState:
            s = self._state(state, pod, node)
            if s is None:
                return _SUCCESS
        labels = node.labels
        if s.affinity:
            pods_exist = True
            for key, counts in s.affinity:
                value = labels.get(key)
                if value is None:
                    # Every topology key of the pod's affinity must exist on the node.
                    return _AFFINITY
                if counts.get(value, 0) <= 0:
                    pods_exist = False
            if not pods_exist and (s.affinity_any or not s.self_match):
                return _AFFINITY
        for key, counts in s.anti:
            value = labels.get(key)
            if value is not None and counts.get(value, 0) > 0:
                return _ANTI
        for key, counts in s.existing:
            value = labels.get(key)
            if value is not None and counts.get(value, 0) > 0:
                return _EXISTING
        return _SUCCESS

    def update_counts(self, state: CycleState, pod: dict[str, Any], other: dict[str, Any], node: NodeInfo,
                delta: int) -> None:
        if self.name in state.skip_filter:
            # Skipped this cycle: no pod had affinity terms.  Removing a pod (a
            # preemption victim) cannot add any; the dry runs that add pods build a
            # fresh CycleState through Framework.run_pre_filters instead.
            return
        s = self._state(state, pod, node)
        if s is None:
            return
        s.own()
        labels = node.labels
        ns, plabels = _identity(pod)
        other_ns, other_labels = _identity(other)

        def bump(entries: list[tuple[str, Counts]], i: int, key: str) -> None:
            value = labels.get(key)
            if value is not None:
                counts = entries[i][1]
                assert isinstance(counts, dict)
                counts[value] = counts.get(value, 0) + delta

        other_aff = pod_affinity(other)
        if other_aff is not None:
            for term in other_aff.required_anti_affinity:
                if term.matches(ns, plabels, s.namespace_labels) and term.topology_key in labels:
                    keys = [k for k, _ in s.existing]
                    if term.topology_key not in keys:
                        s.existing.append((term.topology_key, {}))
                        keys.append(term.topology_key)
                    bump(s.existing, keys.index(term.topology_key), term.topology_key)
        if s.affinity_clauses and all(clause_matches(c, other_ns, other_labels) for c in s.affinity_clauses):
            for i, (key, _) in enumerate(s.affinity):
                bump(s.affinity, i, key)
            s.affinity_any = any(v > 0 for _, counts in s.affinity for v in counts.values())
        for i, clause in enumerate(s.anti_clauses):
            if clause_matches(clause, other_ns, other_labels):
                bump(s.anti, i, s.anti[i][0])

    # -- score -----------------------------------------------------------------------
    def pre_score(self, state: CycleState, pod: dict[str, Any], nodes: Sequence[NodeInfo]) -> Status:
        snap = cycle_snapshot(state, nodes)
        if snap is None or not nodes:
            return Status(Code.SKIP)
        try:
            aff = pod_affinity(pod, strict=True)
        except ValueError:
            return Status(Code.SKIP)  # pre_filter already refused the pod
        has_preferences = aff is not None and bool(aff.preferred_affinity or aff.preferred_anti_affinity)
        if self.ignore_preferred_terms_of_existing_pods and not has_preferences:
            return Status(Code.SKIP)
        ns, labels = _identity(pod)
        ns_labels = snap.namespace_labels(ns)
        # (topology key, weight, domain -> count): a node scores weight * count
        # for each entry whose key it carries.
        parts: list[tuple[str, int, Counts]] = []
        if aff is not None:
            for sign, terms in ((1, aff.preferred_affinity), (-1, aff.preferred_anti_affinity)):
                for term, weight in terms:
                    counts = snap.match_count((term_clause(term, snap),)).topology(term.topology_key)
                    if counts and weight:
                        parts.append((term.topology_key, sign * weight, counts))
        existing: list[tuple[str, int]] = [(PREFERRED_AFFINITY, 1), (PREFERRED_ANTI_AFFINITY, -1)]
        if self.hard_pod_affinity_weight > 0:
            existing.append((REQUIRED_AFFINITY, 1))
        for kind, sign in existing:
            for group in snap.term_groups(kind):
                weight = self.hard_pod_affinity_weight if kind == REQUIRED_AFFINITY else group.weight
                if group.counts and weight and group.term.matches(ns, labels, ns_labels):
                    parts.append((group.term.topology_key, sign * weight, group.counts))
        if not parts:
            return Status(Code.SKIP)
        state.write(self._score_key, parts)
        return Status.success()

    def score(self, state: CycleState, pod: dict[str, Any], node: NodeInfo) -> int:
        parts: list[tuple[str, int, Counts]] = state.read(self._score_key)
        labels = node.labels
        total = 0
        for key, weight, counts in parts:
            value = labels.get(key)
            if value is not None:
                total += weight * counts.get(value, 0)
        return total

    def normalize_score(self, state: CycleState, pod: dict[str, Any], scores: dict[str, int]) -> None:
        if not scores:
            return
        lowest, highest = min(scores.values()), max(scores.values())
        spread = highest - lowest
        for name, v in scores.items():
            scores[name] = int(MAX_NODE_SCORE * ((v - lowest) / spread)) if spread > 0 else 0
